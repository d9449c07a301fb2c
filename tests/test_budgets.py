"""gateway/budgets.py: scopes, limits, thresholds, and periods cut at midnight in a zone."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from gateway.budgets import (
    EPOCH,
    FOREVER,
    Budget,
    Period,
    Rules,
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


def test_user_and_tag_scopes_name_their_tenant_and_what_requests_must_carry() -> None:
    user = parse_scope("user:acme/bob@example.com")
    assert (user.kind, user.tenant_name, user.end_user, user.tag) == (
        ScopeKind.USER,
        "acme",
        "bob@example.com",
        None,
    )
    tag = parse_scope("tag:acme/team=search=v2")  # a value may hold '=' (not a key)
    assert (tag.tenant_name, tag.tag, tag.end_user) == ("acme", ("team", "search=v2"), None)
    assert parse_scope("user:acme/a/b").end_user == "a/b"


def test_a_scope_matches_the_requests_carrying_its_end_user_or_tag() -> None:
    tags = (("project", "atlas"), ("team", "search"))
    assert parse_scope("user:acme/bob").matches("bob", ())
    assert not parse_scope("user:acme/bob").matches("bobby", tags)
    assert not parse_scope("user:acme/bob").matches(None, tags)
    assert parse_scope("tag:acme/team=search").matches(None, tags)
    assert not parse_scope("tag:acme/team=ads").matches("bob", tags)
    assert not parse_scope("tag:acme/search=team").matches(None, tags)
    assert parse_scope("tenant:acme").matches(None, ())
    assert parse_scope("interaction:acme").matches("bob", tags)


def test_rules_charge_every_matching_budget_of_the_tenant() -> None:
    def budget(scope: str, tenant: str = "ten_a", key: str | None = None) -> Budget:
        return Budget(scope, parse_scope(scope), tenant, Decimal(1), Period.DAY, key_id=key)

    rules = Rules(
        budgets=(
            budget("tenant:acme"),
            budget("key:key_1", key="key_1"),
            budget("user:acme/bob"),
            budget("tag:acme/team=search"),
            budget("tenant:other", tenant="ten_b"),
        )
    )

    def ids(key: str, user: str | None, tags: tuple[tuple[str, str], ...]) -> list[str]:
        return [b.id for b in rules.budgets_for("ten_a", key, user, tags)]

    assert ids("key_2", None, ()) == ["tenant:acme"]
    assert ids("key_1", "bob", (("team", "search"),)) == [
        "tenant:acme",
        "key:key_1",
        "user:acme/bob",
        "tag:acme/team=search",
    ]
    assert ids("key_2", "alice", (("team", "ads"),)) == ["tenant:acme"]


@pytest.mark.parametrize(
    "text",
    [
        "acme",
        "tenant:",
        "org:acme",
        "user:acme",
        "user:acme/",
        "user:/bob",
        "tag:acme/team",
        "tag:acme/=search",
        "tag:acme/team=",
        "tag:acme/te,am=search",
        "tag:acme/team=a,b",
        "tag:acme/" + "k" * 65 + "=v",
    ],
)
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
