"""The dashboard marks the days price corrections adjusted, on the overview and a tenant's
figures, and says nothing of corrections where there are none."""

from __future__ import annotations

from decimal import Decimal

import pytest
from streamlit.testing.v1 import AppTest

from gateway.db import adjustments
from gateway.db.session import transaction
from tests.dashboard.conftest import World, open_app
from tests.factories import JUL

NOTE = "Price corrections adjusted"


def notes(app: AppTest) -> list[str]:
    return [caption.value for caption in app.caption if NOTE in caption.value]


def correct_july(world: World) -> None:
    """JUL's input rate was 0.30, not 0.15; its cache-read and output rates were right."""
    with transaction(world.sessions) as session:
        fix = adjustments.correction(
            adjustments.entry(session, JUL.id),
            input=Decimal("0.30"),
            cache_read=Decimal("0.015"),
            cache_write=None,
            output=None,
            reason="input keyed in at half",
            by="ops",
        )
        adjustments.apply(session, fix)


def test_adjusted_days_are_listed_under_the_overview_and_a_tenants_charts(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert notes(open_app(world.url, monkeypatch)) == []
    correct_july(world)
    overview = open_app(world.url, monkeypatch)
    # JUL's uncached tokens on July 1: acme 500 + 333 + 100, bravo 10^6; × 0.15 per 1M more.
    assert notes(overview) == [
        ":material/edit_note: Price corrections adjusted 2026-07-01 (+USD 0.15013995) (UTC "
        "days). The figures and charts show the costs as recorded; statements show the "
        "adjustments as lines of their own."
    ]
    tenants = open_app(world.url, monkeypatch, page="tenants")
    tenants.selectbox(key="tenant").set_value(world.a).run()
    [acme] = notes(tenants)
    assert "adjusted 2026-07-01 (+USD 0.00013995) (UTC days)" in acme
