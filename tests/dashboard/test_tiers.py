"""The routing page's cached-tokens-by-tier table: shown for replicas that reported tiers
(their shares of GPU memory, host memory and disk), absent where none did."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.accounting.store import insert_records
from gateway.db.session import make_engine
from tests.dashboard.conftest import World, open_app


def test_the_routing_page_shows_cached_tokens_by_tier_where_replicas_said_them(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, page="routing")
    # The replica table and its "All columns": no replica reported tiers, no tier table.
    assert len(app.dataframe) == 2
    routed = next(r for r in world.records if r.usage.cache_read_tokens == 800)
    tiered = replace(
        routed, request_id="req_tiered", cache_read_host_tokens=600, cache_read_disk_tokens=100
    )
    engine = make_engine(world.url)
    insert_records(engine, [tiered])
    engine.dispose()
    app = open_app(world.url, monkeypatch, page="routing")
    (row,) = app.dataframe[2].value.to_dict("records")
    assert (row["replica"], row["requests"], row["cached tokens"]) == ("http://r2", 1, 800)
    assert (row["GPU"], row["host memory"], row["disk"]) == ("12.5 %", "75.0 %", "12.5 %")
