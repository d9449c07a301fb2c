"""Workers of one gateway share routing knowledge (gateway/routing/peers.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.routing.fleet import Fleet
from gateway.routing.fleet_config import FleetConfig
from gateway.routing.inputs import ChatPrompt
from gateway.routing.peers import PLACED, PeerLink, decode, encode
from gateway.routing.placement import Route

REPLICAS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003")
CONFIG = FleetConfig(name="m", replicas=REPLICAS)


def conversation(n: int, turns: int) -> ChatPrompt:
    messages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"conversation {n} turn {turn} " * 40})
        messages.append({"role": "assistant", "content": f"answer {turn} " * 20})
    return ChatPrompt(messages[:-1])


def route(fleet: Fleet, prompt: ChatPrompt, request_id: str) -> Route:
    return fleet.route(prompt, cache_salt="tenant", request_id=request_id, interaction_id="i")


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for a peer's message to be applied (a deadline, not a count of naps: a busy
    machine takes longer over each)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("peer message not applied in time")
        await asyncio.sleep(0.005)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[tuple[Fleet, Fleet]]:
    fleets = (Fleet(CONFIG), Fleet(CONFIG))
    links = []
    for fleet, name in zip(fleets, ("a", "b"), strict=True):

        def apply(kind, deployment, replica, hashes, reported, predicted, fleet=fleet):  # type: ignore[no-untyped-def]
            fleet.apply_peer(kind, replica, hashes, reported, predicted)

        link = PeerLink(tmp_path, apply, name=name)
        link.open()
        fleet.peers = link
        links.append(link)
    for link in links:
        link.refresh()
    assert [link.peers for link in links] == [1, 1]
    yield fleets
    for link in links:
        link.close()


def test_a_message_round_trips() -> None:
    hashes = [0, 1, 2**64 - 1, 12345678901234567890]
    data = encode(PLACED, "model/é", "http://r:1", hashes, 7, 9)
    kind, deployment, replica, decoded, reported, predicted = decode(data)
    assert (kind, deployment, replica, list(decoded), reported, predicted) == (
        PLACED,
        "model/é",
        "http://r:1",
        hashes,
        7,
        9,
    )


async def test_the_second_turn_on_the_other_worker_goes_where_the_first_went(
    workers: tuple[Fleet, Fleet],
) -> None:
    a, b = workers
    for n in range(20):
        first = route(a, conversation(n, 1), f"req_{n}_1")
        placed = a.place(first)
        hashes = first.prompt.hashes
        await until(lambda: b.index.match_all(hashes) != {})  # noqa: B023 (awaited here)
        # The other worker saw the prompt too: its ceiling counts the repeat as cacheable.
        assert route(b, conversation(n, 1), "again").ceiling_blocks == len(first.prompt.hashes)
        second = route(b, conversation(n, 2), f"req_{n}_2")
        again = b.place(second)
        assert again.replica.url == placed.replica.url
        assert again.predicted_blocks == len(first.prompt.hashes)
        a.finish(placed)
        b.finish(again)


async def test_without_peers_the_other_worker_places_a_second_turn_blind(tmp_path: Path) -> None:
    """The failure the link prevents: an unlinked worker ties on a prefix it never saw."""
    a, b = Fleet(CONFIG), Fleet(CONFIG)
    moved = 0
    for n in range(20):
        placed = a.place(route(a, conversation(n, 1), f"req_{n}_1"))
        again = b.place(route(b, conversation(n, 2), f"req_{n}_2"))
        assert again.predicted_blocks == 0
        moved += again.replica.url != placed.replica.url
    assert moved > 0


async def test_an_eviction_one_worker_learns_is_learned_by_the_other(
    workers: tuple[Fleet, Fleet],
) -> None:
    a, b = workers
    first = route(a, conversation(1, 1), "req_1")
    a.finish(a.place(first))
    await until(lambda: b.index.match_all(first.prompt.hashes) != {})
    second = route(a, conversation(1, 2), "req_2")
    placement = a.place(second)
    assert placement.predicted_blocks == len(first.prompt.hashes)
    # The replica reports nothing cached: it evicted the prefix. Both workers forget it.
    a.learn(second, placement, cached_tokens=0, prompt_tokens=second.prompt.prompt_tokens)
    await until(lambda: b.index.match_all(first.prompt.hashes) == {})
    assert a.index.match_all(first.prompt.hashes) == {}


async def test_a_worker_that_starts_later_is_known_to_the_others_at_once(
    tmp_path: Path,
) -> None:
    first = PeerLink(tmp_path, lambda *_: None, name="first")
    first.open()
    later = PeerLink(tmp_path, lambda *_: None, name="later")
    later.open()  # says hello: the first worker looks again without waiting for its refresh
    try:
        await until(lambda: first.peers == 1)
        assert later.peers == 1
    finally:
        first.close()
        later.close()


async def test_a_dead_workers_socket_is_removed_and_not_sent_to(tmp_path: Path) -> None:
    stale = tmp_path / "999999999-worker.sock"  # no such process
    stale.touch()
    link = PeerLink(tmp_path, lambda *_: None, name="a")
    link.open()
    try:
        assert link.peers == 0 and not stale.exists()
        link.placed("m", REPLICAS[0], [1, 2, 3])
        assert link.sent == 0 and link.dropped == 0
    finally:
        link.close()
    assert not link.path.exists()
