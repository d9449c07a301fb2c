"""Prefix breakers on the request path: the LRU of interactions, the measure at learn, the
other workers' turns, and the text kept for tenants that opted in (gateway.serving.breaks)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from gateway.routing.breaks import PrefixBreak
from gateway.routing.inputs import ChatPrompt, TextPrompt
from gateway.routing.prompts import Prompt
from gateway.serving.breaks import BreakWatch, common_prefix, interaction_key, readable
from gateway.usage import Usage, UsageSource


def prompt(hashes: Sequence[int], tokens: int, *, exact: bool = True) -> Prompt:
    return Prompt(list(hashes), tokens, 16, exact)


def reported(prompt_tokens: int, cached: int = 0) -> Usage:
    return Usage(uncached_tokens=prompt_tokens - cached, cache_read_tokens=cached, output_tokens=1)


class Peers:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list[int], int, int]] = []

    def turn(
        self, deployment: str, key: str, hashes: Sequence[int], prompt_tokens: int, block: int
    ) -> None:
        self.sent.append((deployment, key, list(hashes), prompt_tokens, block))


def test_a_request_is_measured_against_its_interactions_previous_one() -> None:
    watch = BreakWatch("m")
    key = interaction_key("t1", "chat")
    first = watch.arrive(key, prompt([1, 2, 3, 4], 70))
    assert first is not None and first.previous is None
    assert watch.measure(first, reported(72)) is None
    second = watch.arrive(key, prompt([1, 2, 7, 8, 9], 90))
    # Block 2 (token 32) differs: min(72 reported before, 90) - 32 = 40 tokens lost.
    assert watch.measure(second, reported(90)) == PrefixBreak(32, 40, False)
    third = watch.arrive(key, prompt([1, 2, 7, 8, 9, 10], 100))
    assert watch.measure(third, reported(100)) is None  # extends the second: no break


def test_interactions_of_two_tenants_with_the_same_id_are_two() -> None:
    watch = BreakWatch("m")
    watch.measure(watch.arrive(interaction_key("t1", "x"), prompt([1, 2, 3], 50)), reported(50))
    other = watch.arrive(interaction_key("t2", "x"), prompt([5, 6, 7], 50))
    assert other is not None and other.previous is None


def test_the_lru_keeps_the_interactions_seen_last() -> None:
    watch = BreakWatch("m", size=2)
    for name in ("a", "b", "c"):
        watch.arrive(name, prompt([1, 2], 40))
    assert len(watch) == 2
    assert watch.arrive("a", prompt([1, 2], 40)).previous is None  # type: ignore[union-attr]
    assert watch.arrive("c", prompt([1, 2], 40)).previous is not None  # type: ignore[union-attr]


def test_without_reported_usage_nothing_is_measured_nor_sent() -> None:
    watch, peers = BreakWatch("m"), Peers()
    watch.peers = peers
    watch.arrive("k", prompt([1, 2, 3], 50))
    second = watch.arrive("k", prompt([9, 2, 3], 50))
    assert watch.measure(second, Usage(uncached_tokens=50, source=UsageSource.ESTIMATED)) is None
    assert peers.sent == []


def test_other_workers_are_told_and_their_turns_become_predecessors() -> None:
    here, there, peers = BreakWatch("m"), BreakWatch("m"), Peers()
    here.peers = peers
    here.measure(here.arrive("k", prompt([1, 2, 3, 4], 64)), reported(66))
    assert peers.sent == [("m", "k", [1, 2, 3, 4], 66, 16)]
    there.from_peer(*peers.sent[0][1:])
    turn = there.arrive("k", prompt([1, 5, 6, 7, 8], 80))
    assert there.measure(turn, reported(80)) == PrefixBreak(16, 50, True)


def test_text_mode_offsets_follow_the_reported_prompt() -> None:
    watch = BreakWatch("m")
    watch.measure(watch.arrive("k", prompt([1, 2, 3, 4, 5], 80, exact=False)), reported(100))
    turn = watch.arrive("k", prompt([1, 2, 3, 9, 9], 80, exact=False))
    # Chunk 3 stands for token 48 of an estimated 80; the replica counted 100: token 60.
    assert watch.measure(turn, reported(100)) == PrefixBreak(60, 40, False)


def chat(system: str, user: str = "Hello") -> ChatPrompt:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return ChatPrompt(messages=messages, chars=len(system) + len(user))


def test_the_text_either_side_of_the_divergence_is_kept_for_tenants_that_opted_in() -> None:
    watch = BreakWatch("m")
    before = chat("2026-12-01T10:00:01Z You are a helpful assistant.")
    after = chat("2026-12-01T10:00:02Z You are a helpful assistant.")
    watch.measure(watch.arrive("k", prompt([1, 2, 3], 50), before), reported(50))
    found = watch.measure(watch.arrive("k", prompt([4, 5, 6], 50), after), reported(50))
    assert found is not None and found.context is not None
    assert orjson.loads(found.context) == {
        "offset": 26,
        "before": "system: 2026-12-01T10:00:0",
        "previous": "1Z You are a helpful assistant.\nuser: Hello\n",
        "current": "2Z You are a helpful assistant.\nuser: Hello\n",
    }
    # Without the prompt kept (a tenant that did not opt in): the break, no text.
    watch.arrive("k", prompt([7, 8, 9], 50))
    plain = watch.measure(watch.arrive("k", prompt([1, 2, 3], 50)), reported(50))
    assert plain == PrefixBreak(0, 50, True)


def test_kept_prompts_stay_within_their_character_budget() -> None:
    watch = BreakWatch("m", capture_chars=100)
    for name in ("a", "b", "c"):
        watch.arrive(name, prompt([1, 2], 40), chat("x" * 40))
    assert watch._captured_chars <= 100
    assert list(watch._captured) == ["b", "c"]


def test_context_is_48_characters_either_side() -> None:
    watch = BreakWatch("m")
    text = "a" * 100
    context = watch.context(TextPrompt(text + "X" + "b" * 100), TextPrompt(text + "Y" + "b" * 100))
    assert context is not None
    assert orjson.loads(context) == {
        "offset": 100,
        "before": "a" * 48,
        "previous": "X" + "b" * 47,
        "current": "Y" + "b" * 47,
    }


def test_common_prefix_and_readable_text() -> None:
    assert common_prefix("abcdef", "abcxef") == 3
    assert common_prefix("abc", "abcdef") == 3
    assert common_prefix("", "a") == 0
    assert readable(TextPrompt([1, 2, 3])) is None
    assert readable(TextPrompt(["ab", "cd"])) == "abcd"
