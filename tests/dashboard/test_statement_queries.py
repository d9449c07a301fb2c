"""Statements (the billing API's and the dashboard's download, the same bytes) read the
lines the writer keeps (migration 0019) and the hourly cells; split by end user or tag they
count each line's completed interactions by grouping, not with count(DISTINCT), reading
the tenant's rows through ``ix_requests_tenant_started``.

The counts are checked against the count(DISTINCT) they replaced, on the dashboard
benchmark's seeded workload: retried interactions, agent tasks of several completed calls
under one interaction id (some across days), unpriced and failed attempts, tags."""

from __future__ import annotations

from collections import Counter
from datetime import date
from typing import Any

from sqlalchemy import case, distinct, event, func, select

from benchmarks import dashboard as bench
from gateway import billing
from gateway.accounting.store import insert_records
from gateway.db import statements
from gateway.db.models import RequestRow, TenantRow
from gateway.db.session import make_engine, session_factory
from tests.test_dashboard_load import varied

RECORDS = 3_000
START, END = date(2026, 10, 2), date(2026, 10, 31)


def load(url: str) -> str:
    """The seeded workload in ``url``; the tenant with the most attempts."""
    records = [varied(r, n) for n, r in enumerate(bench.workload(RECORDS))]
    engine = make_engine(url)
    for start in range(0, len(records), 500):
        insert_records(engine, records[start : start + 500])
    engine.dispose()
    return Counter(r.tenant_id for r in records).most_common(1)[0][0]


def interaction() -> Any:
    return RequestRow.tenant_id + ":" + RequestRow.interaction_id


def test_line_and_period_counts_equal_count_distinct(database_url: str) -> None:
    tenant = load(database_url)
    engine = make_engine(database_url)
    lower, upper = statements.day_bounds(START, END)
    completed = RequestRow.status == statements.COMPLETED
    with session_factory(engine)() as session:
        for grouping in (None, statements.Grouping(), statements.Grouping(tag="team")):
            key = [
                statements._day(session),
                RequestRow.model,
                RequestRow.endpoint,
                RequestRow.price_id,
                RequestRow.rate_class,
                RequestRow.usage_source,
            ]
            if grouping is not None:
                key.append(grouping.column())
            reference = select(
                *key,
                func.count(distinct(case((completed, interaction())))),
                func.count(case((completed, 1))),
            ).where(
                RequestRow.tenant_id == tenant,
                RequestRow.started_at >= lower,
                RequestRow.started_at < upper,
            )
            expected = {
                tuple(row[:-2]): row[-2] for row in session.execute(reference.group_by(*key))
            }
            attempts = {
                tuple(row[:-2]): row[-1] for row in session.execute(reference.group_by(*key))
            }
            lines = statements.statement_lines(
                session, tenant_id=tenant, start=START, end=END, grouping=grouping
            )
            found = {
                (
                    line.day,
                    line.model,
                    line.endpoint,
                    line.price_id,
                    line.rate_class,
                    line.usage_source,
                    *(() if grouping is None else (line.group,)),
                ): line.completed_interactions
                for line in lines
            }
            assert found == expected, grouping
            # The distinct count matters here: some line has several completed attempts
            # of one interaction.
            assert any(attempts[k] > n for k, n in expected.items()), grouping
            if grouping is None:
                per_line = sum(found.values())
                # The writer's lines (statement_lines, statement_cells) are these, to the
                # nano-unit and the interaction.
                rolled = statements.rolled_lines(session, tenant_id=tenant, start=START, end=END)
                assert rolled == lines
        for tenant_id in (tenant, None):
            where = [RequestRow.started_at >= lower, RequestRow.started_at < upper]
            if tenant_id is not None:
                where.append(RequestRow.tenant_id == tenant_id)
            priced = completed & RequestRow.price_id.is_not(None)
            counts = session.execute(
                select(
                    func.count(distinct(case((completed, interaction())))),
                    func.count(distinct(case((priced, interaction())))),
                ).where(*where)
            ).one()
            period = statements.period_completed(
                session, tenant_id=tenant_id, lower=lower, upper=upper
            )
            assert (period.interactions, period.priced) == tuple(counts)
            if tenant_id is not None:  # and so are the hourly cells' counts
                assert (
                    statements.rolled_completed(
                        session, tenant_id=tenant_id, lower=lower, upper=upper
                    )
                    == period
                )
            if tenant_id is not None:
                period_of_tenant = period.interactions
            assert 0 < period.priced < period.interactions  # some completed unpriced alone
        # Some interaction spans lines (days, models): the period counts it once.
        assert period_of_tenant < per_line
    engine.dispose()


def test_a_statement_reads_the_writers_lines_not_the_requests(database_url: str) -> None:
    """A plain statement reads no request (its lines and counts are the writer's, 0019);
    one split by end user reads the tenant's requests of the period through
    ``ix_requests_tenant_started`` (planner costs set aside: on so small a table it would
    rather read the heap)."""
    tenant = load(database_url)
    engine = make_engine(database_url)
    sent: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def keep(_c: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM requests" in statement:
            sent.append((statement, params))

    with session_factory(engine)() as session:
        row = session.get(TenantRow, tenant) or TenantRow(id=tenant, name=tenant)
        built = billing.build_statement(session, tenant=row, start=START, end=END)
        assert built.lines and not sent
        grouped = billing.build_statement(
            session, tenant=row, start=START, end=END, group_by="end_user"
        )
    event.remove(engine, "before_cursor_execute", keep)
    assert grouped.lines and len(sent) == 2  # the lines' sums, their completed interactions
    if not database_url.startswith("postgresql"):
        engine.dispose()
        return
    with engine.connect() as connection:
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        for statement, params in sent:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + statement, params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
            assert "using ix_requests_tenant_started" in plan, plan
    engine.dispose()
