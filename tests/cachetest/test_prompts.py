"""Prompt texts and the partial-match arithmetic, checked against the simulated replica's
tokenizer and chat template (one piece per word, ``<|user|>\\n`` in front)."""

from __future__ import annotations

import pytest

from gateway.routing.sim_tokenizer import encode, render_chat
from gateway.tools.cachetest.partial import expected_cached, shared_words
from gateway.tools.cachetest.prompts import WORDS, PromptMaker


def chat_tokens(text: str) -> list[int]:
    return encode(render_chat([{"role": "user", "content": text}]))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_words_are_distinct_and_a_power_of_two() -> None:
    assert len(WORDS) == len(set(WORDS)) == 64


def test_a_prompt_is_one_token_per_word_plus_the_template() -> None:
    text = PromptMaker(7).text(3, 500)
    assert len(text.split()) == 500
    assert len(chat_tokens(text)) == 502  # "<|user|>\n", 500 words, "<|assistant|>\n"


def test_the_same_seed_and_number_give_the_same_text_and_others_differ() -> None:
    maker = PromptMaker(7)
    assert maker.text(3, 64) == PromptMaker(7).text(3, 64)
    assert maker.words(3, 8) != maker.words(4, 8)
    assert maker.words(3, 8) != PromptMaker(8).words(3, 8)


@pytest.mark.parametrize("shared", [0, 1, 100, 263, 499, 500])
def test_a_diverging_prompt_shares_exactly_the_words_asked_for(shared: int) -> None:
    maker = PromptMaker(11)
    base, probe = maker.text(5, 500), maker.diverging(5, 500, shared)
    assert len(probe.split()) == 500
    # The template's head, then exactly `shared` words in common.
    assert common_prefix(chat_tokens(base), chat_tokens(probe)) == (
        502 if shared == 500 else 1 + shared
    )


def test_the_divergence_moves_to_mid_block() -> None:
    assert [shared_words(k, 1024, 16) for k in (0, 25, 50, 75, 100)] == [0, 264, 520, 776, 1024]
    assert [shared_words(k, 1500, 32) for k in (10, 90)] == [144, 1360]
    # Never the whole prompt below 100%.
    assert shared_words(99, 40, 16) == 39


def test_expected_cached_tokens_are_full_blocks_of_the_shared_part() -> None:
    assert expected_cached(264, 1024, 1026, 16) == 256
    assert expected_cached(0, 1024, 1026, 16) == 0
    # Everything shared: every full block but the one holding the last prompt token.
    assert expected_cached(1024, 1024, 1026, 16) == 1024
    assert expected_cached(1024, 1024, 1025, 16) == 1024
    assert expected_cached(1024, 1024, 1024, 16) == 1008
