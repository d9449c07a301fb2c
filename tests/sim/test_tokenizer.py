"""The stand-in tokenizer: deterministic, prefix-preserving, and its chat template."""

from __future__ import annotations

import pytest

from gateway.routing.sim_tokenizer import (
    VOCAB_SIZE,
    TemplateError,
    encode,
    piece_id,
    pieces,
    render_chat,
)


def test_same_text_gives_same_ids_and_ids_fit_the_vocabulary() -> None:
    text = "The quick brown fox jumps over the lazy dog.\n"
    assert encode(text) == encode(text)
    assert len(encode(text)) == 9
    assert all(0 <= token < VOCAB_SIZE for token in encode(text))


def test_ids_are_stable_across_processes() -> None:
    """CRC-32 of the piece, not Python's salted hash(): these values never change."""
    assert encode("hello world") == [3984718326 % VOCAB_SIZE, 980881731 % VOCAB_SIZE]
    assert piece_id("hello ") == 3984718326 % VOCAB_SIZE


def test_pieces_keep_trailing_whitespace_and_rebuild_the_text() -> None:
    text = "  lead\tand  trail \n"
    assert pieces(text) == ["  ", "lead\t", "and  ", "trail \n"]
    assert "".join(pieces(text)) == text


def test_text_ending_in_whitespace_is_a_token_prefix_of_its_continuation() -> None:
    head = "You are a helpful assistant.\n"
    assert encode(head + "Answer briefly.")[: len(encode(head))] == encode(head)


def test_non_ascii_text_is_tokenized_whole() -> None:
    assert pieces("naïve café ") == ["naïve ", "café "]


def test_chat_template_renders_roles_content_and_generation_prompt() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert render_chat(messages) == "<|system|>\nBe brief.\n<|user|>\na\nb\n<|assistant|>\n"
    assert render_chat(messages, add_generation_prompt=False) == (
        "<|system|>\nBe brief.\n<|user|>\na\nb\n"
    )


def test_assistant_message_without_content_renders_empty() -> None:
    assert render_chat([{"role": "assistant", "content": None}], add_generation_prompt=False) == (
        "<|assistant|>\n\n"
    )


def test_a_conversation_is_a_token_prefix_of_its_next_turn() -> None:
    turn1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "question one"}]
    turn2 = [*turn1, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "q2"}]
    history = encode(render_chat(turn1, add_generation_prompt=False))
    assert encode(render_chat(turn2))[: len(history)] == history


def test_an_answer_tokenizes_the_same_when_it_comes_back_as_history() -> None:
    """All but the answer's last piece line up, which is all vLLM ever caches."""
    turn1 = [{"role": "user", "content": "hi"}]
    answer = "cache block token"
    prompt = encode(render_chat(turn1))
    generated = [*prompt, piece_id("cache "), piece_id("block "), piece_id("token")]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "ok"}]
    assert encode(render_chat(turn2))[: len(generated) - 1] == generated[:-1]


@pytest.mark.parametrize(
    "message",
    [
        {"content": "no role"},
        {"role": "", "content": "empty role"},
        {"role": "user", "content": 5},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": [{"type": "text", "text": 3}]},
    ],
)
def test_template_refuses_malformed_messages(message: dict[str, object]) -> None:
    with pytest.raises(TemplateError):
        render_chat([message])
