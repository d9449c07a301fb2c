"""Records survive their journal form exactly."""

from datetime import UTC, datetime
from decimal import Decimal

import orjson

from gateway.accounting.records import Record, Status
from gateway.usage import Usage, UsageSource
from pricing.cost import Cost


def make_record(request_id: str = "req_1", **overrides: object) -> Record:
    fields: dict[str, object] = dict(
        request_id=request_id,
        tenant_id="ten_a",
        api_key_id="key_a",
        interaction_id="int-1",
        model="m",
        deployment="m",
        upstream="http://127.0.0.1:1",
        started_at=datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC),
        ended_at=datetime(2026, 11, 29, 10, 0, 1, tzinfo=UTC),
        status=Status.COMPLETED,
        usage=Usage(176, 1024, 0, 30),
        price_id="m@2026-07-01T00:00:00Z",
        cost=Cost(
            Decimal("0.000026400"),
            Decimal("0.000015360"),
            Decimal("0.000000000"),
            Decimal("0.000013500"),
            Decimal("0.000193500"),
        ),
    )
    fields.update(overrides)
    return Record(**fields)  # type: ignore[arg-type]


def test_journal_line_round_trips_exactly() -> None:
    record = make_record(
        first_token_at=datetime(2026, 11, 29, 10, 0, 0, 500000, tzinfo=UTC),
        usage=Usage(5, 0, 0, 2, UsageSource.ESTIMATED),
        status=Status.CANCELLED,
        predicted_cached_tokens=16,
        ceiling_cached_tokens=32,
        ceiling_exact=False,
        error="x",
    )
    again = Record.from_json(record.to_json())
    assert again == record
    assert again.cost.total == record.cost.total
    assert b"\n" not in record.to_json()


def test_a_journal_line_written_before_the_ceiling_kind_reads_as_unknown() -> None:
    """Lines journaled by a gateway that did not keep ``ceiling_exact`` still replay."""
    line = orjson.loads(make_record(ceiling_cached_tokens=32).to_json())
    del line["ceiling_exact"]
    again = Record.from_json(orjson.dumps(line))
    assert (again.ceiling_cached_tokens, again.ceiling_exact) == (32, None)
