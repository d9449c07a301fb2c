"""Keys, prices and tenants are served from memory: a steady stream of requests, on every
wire, streamed and not, makes no database round trip of its own. The only statements the
gateway's engine runs while they are served are the recorder's writes of their records
(issue 14 item 1: a price applies at once "with no database round trip per request").

Counted on the gateway's own engine (``before_cursor_execute``), with the thread each
statement ran on and the tables it names, on SQLite and Postgres.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any

from sqlalchemy import Engine, event

from tests.serving.conftest import CHAT, MESSAGES, Harness, chat

# What the recorder writes: each record's row, and the rollups kept in its transaction.
WRITER_TABLES = {
    "requests",
    "usage_hours",
    "replica_hours",
    "ttft_hours",
    "interactions",
    "interaction_cells",
    "deployment_hours",
    "break_hours",
    "statement_lines",
    "statement_cells",
}
# The tables a statement names (an upsert's "DO UPDATE SET" names none, nor does a
# function read FROM, such as the Postgres writer's json_populate_recordset).
TABLE = re.compile(r"\b(?:FROM|INTO|(?<!DO )UPDATE|JOIN)\s+\"?(\w+)\b\"?(?!\s*\()", re.IGNORECASE)
# A statement's own named subqueries (WITH name AS (...)), which are no tables.
CTE = re.compile(r"(?:\bWITH|,)\s+(\w+)\s+AS\s*\(", re.IGNORECASE)
ROUNDS = 8


class Statements:
    """Every statement an engine runs from now on: its tables and the thread it ran on."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tables: Counter[str] = Counter()
        self.threads: Counter[str] = Counter()
        self.inserts_of_requests = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        named = set(TABLE.findall(statement)) - set(CTE.findall(statement))
        self.tables.update(named)
        self.threads[threading.current_thread().name] += 1
        if statement.lstrip().upper().startswith("INSERT INTO REQUESTS"):
            self.inserts_of_requests += 1

    def close(self) -> None:
        """Stop counting."""
        event.remove(self.engine, "before_cursor_execute", self._seen)


async def test_steady_requests_on_every_wire_make_no_round_trip_but_their_records(
    harness: Harness,
) -> None:
    """Chat (whole and streamed), completions, Responses and Messages, eight rounds after
    one warm-up request each: nothing reads a key, a price or a tenant, nothing runs on the
    event loop's thread, and the recorder writes the records in batches."""
    url = await harness.sim()
    gateway = await harness.one(url)
    engine: Engine = gateway.app.state.engine
    bodies = [
        (CHAT, chat(max_tokens=3)),
        (CHAT, chat(max_tokens=3, stream=True)),
        ("/v1/completions", {"model": "m", "prompt": "The capital of France is", "max_tokens": 3}),
        ("/v1/responses", {"model": "m", "input": "What is 2 + 2?", "max_output_tokens": 3}),
        ("/v1/messages", {"model": "m", "max_tokens": 3, "messages": MESSAGES}),
    ]
    async with gateway.http(harness.tenant.key) as http:
        for path, body in bodies:  # warm-up: first uses, pools, the change check's state
            assert (await http.post(path, json=body)).status_code == 200
        await gateway.recorded()
        statements = Statements(engine)
        loop_thread = threading.current_thread().name
        try:
            for _ in range(ROUNDS):
                for path, body in bodies:
                    reply = await http.post(path, json=body)
                    assert reply.status_code == 200, reply.text
            await gateway.recorded()
        finally:
            statements.close()
    requests = ROUNDS * len(bodies)
    assert statements.threads[loop_thread] == 0, statements.threads
    assert set(statements.tables) <= WRITER_TABLES, statements.tables
    assert 1 <= statements.inserts_of_requests <= requests
    rows = await gateway.attempts()
    assert len(rows) == requests + len(bodies)
    assert {row.status for row in rows} == {"completed"}
