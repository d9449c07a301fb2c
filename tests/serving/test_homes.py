"""Stored responses' replicas: the latest ones remembered, the least recently used forgotten."""

from __future__ import annotations

from gateway.serving.homes import ResponseHomes


def test_the_least_recently_used_response_is_forgotten_first() -> None:
    homes = ResponseHomes(size=2)
    homes.remember("resp_a", "http://r1")
    homes.remember("resp_b", "http://r2")
    assert homes.home_of("resp_a") == "http://r1"  # used: now the most recent
    homes.remember("resp_c", "http://r1")
    assert (homes.home_of("resp_b"), homes.home_of("resp_a"), len(homes)) == (None, "http://r1", 2)
    assert homes.home_of("resp_c") == "http://r1"
