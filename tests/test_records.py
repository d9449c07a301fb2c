"""Records survive their journal form exactly."""

from datetime import UTC, datetime

import orjson

from gateway.accounting.records import Record, Status
from gateway.usage import Usage, UsageSource
from tests.factories import record


def test_journal_line_round_trips_exactly() -> None:
    made = record(
        started_at=datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC),
        ttft_ms=376.544,
        usage=Usage(5, 0, 0, 2, UsageSource.ESTIMATED),
        status=Status.CANCELLED,
        predicted_cached_tokens=16,
        ceiling_cached_tokens=32,
        ceiling_exact=False,
        error="x",
    )
    again = Record.from_json(made.to_json())
    assert again == made
    assert again.cost.total == made.cost.total
    assert b"\n" not in made.to_json()


def test_a_journal_line_written_before_the_ceiling_kind_reads_as_unknown() -> None:
    """Lines journaled by a gateway that did not keep ``ceiling_exact`` still replay."""
    line = orjson.loads(record(ceiling_cached_tokens=32).to_json())
    del line["ceiling_exact"]
    again = Record.from_json(orjson.dumps(line))
    assert (again.ceiling_cached_tokens, again.ceiling_exact) == (32, None)


def test_the_span_facts_round_trip_and_an_older_line_without_them_reads_as_none() -> None:
    """operation, provider, response model and traceparent are journaled; a line written
    before they existed still replays, with None (and makes no span)."""
    made = record(
        operation="text_completion",
        provider="anthropic",
        response_model="claude-sonnet-4-5",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert Record.from_json(made.to_json()) == made
    line = orjson.loads(made.to_json())
    for name in ("operation", "provider", "response_model", "traceparent"):
        del line[name]
    again = Record.from_json(orjson.dumps(line))
    assert (again.operation, again.provider, again.response_model, again.traceparent) == (
        None,
        None,
        None,
        None,
    )
    assert again.request_id == made.request_id and again.cost == made.cost
