"""gateway/budgets.py: scopes, limits, thresholds, and periods cut at midnight in a zone."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from gateway.budgets import (
    EPOCH,
    FOREVER,
    Period,
    Scope,
    ScopeKind,
    crossed,
    parse_alerts,
    parse_limit,
    parse_scope,
    period_bounds,
)
from gateway.errors import InvalidRequest

PARIS = ZoneInfo("Europe/Paris")


def test_scopes_parse_tenant_key_and_interaction() -> None:
    assert parse_scope("tenant:acme") == Scope(ScopeKind.TENANT, "acme")
    assert parse_scope("key:key_12") == Scope(ScopeKind.KEY, "key_12")
    assert parse_scope("interaction:acme") == Scope(ScopeKind.INTERACTION, "acme")
    assert parse_scope("interaction:acme").tenant_name == "acme"
    assert parse_scope("key:key_12").tenant_name is None


@pytest.mark.parametrize("text", ["user:acme/bob", "tag:acme/team=search"])
def test_user_and_tag_scopes_parse_and_are_refused_until_attribution(text: str) -> None:
    with pytest.raises(InvalidRequest, match="come with attribution"):
        parse_scope(text)


@pytest.mark.parametrize("text", ["acme", "tenant:", "org:acme", "user:acme", "tag:acme/team"])
def test_malformed_scopes_are_400s(text: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_scope(text)
    assert raised.value.status == 400 and raised.value.param == "scope"


def test_rate_limits_take_tenants_and_keys_only() -> None:
    with pytest.raises(InvalidRequest, match="one of tenant:, key:"):
        parse_scope("interaction:acme", allowed=(ScopeKind.TENANT, ScopeKind.KEY))


def test_limits_are_non_negative_nano_dollar_decimals() -> None:
    assert parse_limit("0") == Decimal(0)
    assert parse_limit("12.000000001") == Decimal("12.000000001")
    for bad in ("-1", "1e-10", "abc", "NaN", "Infinity"):
        with pytest.raises(InvalidRequest):
            parse_limit(bad)


def test_alert_thresholds_are_sorted_shares_of_the_limit() -> None:
    assert parse_alerts("1.0, 0.5,0.8") == (Decimal("0.5"), Decimal("0.8"), Decimal("1.0"))
    for bad in ("0", "1.5", "x"):
        with pytest.raises(InvalidRequest):
            parse_alerts(bad)


def test_a_threshold_is_crossed_once_spend_reaches_it() -> None:
    limit, alerts = Decimal(10), (Decimal("0.5"), Decimal("0.8"), Decimal("1.0"))
    assert crossed(alerts, limit, Decimal("4.9"), Decimal("5")) == (Decimal("0.5"),)
    assert crossed(alerts, limit, Decimal("5"), Decimal("7.9")) == ()
    assert crossed(alerts, limit, Decimal("4"), Decimal("10")) == alerts
    assert crossed(alerts, Decimal(0), Decimal(0), Decimal(0)) == ()


def test_days_turn_over_at_midnight_in_the_zone() -> None:
    at = datetime(2026, 12, 1, 22, 59, 59, tzinfo=UTC)  # 23:59:59 in Paris (UTC+1)
    assert period_bounds(Period.DAY, PARIS, at) == (
        datetime(2026, 11, 30, 23, tzinfo=UTC),
        datetime(2026, 12, 1, 23, tzinfo=UTC),
    )
    after = datetime(2026, 12, 1, 23, tzinfo=UTC)  # midnight in Paris: the next day
    assert period_bounds(Period.DAY, PARIS, after)[0] == datetime(2026, 12, 1, 23, tzinfo=UTC)
    assert period_bounds(Period.DAY, ZoneInfo("UTC"), at)[0] == datetime(2026, 12, 1, tzinfo=UTC)


def test_a_dst_day_is_23_hours_long() -> None:
    start, end = period_bounds(Period.DAY, PARIS, datetime(2026, 3, 29, 12, tzinfo=UTC))
    assert (start, end) == (
        datetime(2026, 3, 28, 23, tzinfo=UTC),
        datetime(2026, 3, 29, 22, tzinfo=UTC),
    )


def test_weeks_start_on_monday_and_months_on_the_first() -> None:
    at = datetime(2026, 12, 3, 12, tzinfo=UTC)  # a Thursday
    utc = ZoneInfo("UTC")
    assert period_bounds(Period.WEEK, utc, at) == (
        datetime(2026, 11, 30, tzinfo=UTC),
        datetime(2026, 12, 7, tzinfo=UTC),
    )
    assert period_bounds(Period.MONTH, utc, at) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert period_bounds(Period.MONTH, PARIS, datetime(2026, 2, 28, 23, 30, tzinfo=UTC)) == (
        datetime(2026, 2, 28, 23, tzinfo=UTC),
        datetime(2026, 3, 31, 22, tzinfo=UTC),
    )
    assert period_bounds(Period.TOTAL, utc, at) == (EPOCH, FOREVER)
