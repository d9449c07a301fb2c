"""Prompt tokens as vLLM computes them, from the tiny model's tokenizer directory.

Equality with a real vLLM's own tokens is checked in tests/vllm (against /tokenize and
the KV events' token ids); here, the rendering rules themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.routing.inputs import ChatPrompt, TextPrompt
from gateway.routing.tokens import ChatTokenizer, TokenizerError, content_format
from tests.support.tiny_model import BOS, build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.load(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_chat_is_rendered_with_the_template_and_special_tokens(tokenizer: ChatTokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.render(ChatPrompt(messages)) == (
        f"{BOS}<|system|>\nBe brief.<|eot|>\n<|user|>\nHi<|eot|>\n<|assistant|>\n"
    )
    no_prompt = tokenizer.render(ChatPrompt(messages, add_generation_prompt=False))
    assert no_prompt == f"{BOS}<|system|>\nBe brief.<|eot|>\n<|user|>\nHi<|eot|>\n"


def test_chat_tokens_have_no_extra_bos_and_completions_get_one(tokenizer: ChatTokenizer) -> None:
    bos = tokenizer.tokenizer.token_to_id(BOS)
    chat = tokenizer.chat_tokens(ChatPrompt([{"role": "user", "content": "Hi"}]))
    assert chat[0] == bos and chat.count(bos) == 1
    completion = tokenizer.completion_tokens(TextPrompt("Hi"))
    assert completion == [bos, *tokenizer.encode("Hi", add_special_tokens=False)]
    assert tokenizer.completion_tokens(TextPrompt([5, 6, 7])) == [5, 6, 7]
    assert tokenizer.completion_tokens(TextPrompt([[5, 6], [7]])) == [5, 6]
    with pytest.raises(TokenizerError):
        tokenizer.completion_tokens(TextPrompt(3))  # type: ignore[arg-type]


def test_text_parts_are_joined_with_newlines_for_a_string_template(
    tokenizer: ChatTokenizer,
) -> None:
    parts = ChatPrompt(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    plain = ChatPrompt([{"role": "user", "content": "a\nb"}])
    assert tokenizer.content_format == "string"
    assert tokenizer.chat_tokens(parts) == tokenizer.chat_tokens(plain)


def test_a_grown_conversation_starts_with_its_history_tokens(tokenizer: ChatTokenizer) -> None:
    turn1 = [{"role": "user", "content": "Explain the cache."}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "It keeps blocks."},
        {"role": "user", "content": "Why?"},
    ]
    history = tokenizer.chat_tokens(ChatPrompt(turn1, add_generation_prompt=False))
    assert tokenizer.chat_tokens(ChatPrompt(turn2))[: len(history)] == history


def test_continue_final_message_leaves_the_last_message_open(tokenizer: ChatTokenizer) -> None:
    chat = ChatPrompt(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, wor"}],
        continue_final_message=True,
        add_generation_prompt=False,
    )
    assert tokenizer.render(chat) == f"{BOS}<|user|>\nHi<|eot|>\n<|assistant|>\nHello, wor"


def test_tool_call_arguments_reach_the_template_as_objects(tmp_path: Path) -> None:
    directory = build_tiny_model(tmp_path)
    template = "{% for m in messages %}{{ m.tool_calls[0].function.arguments.city }}{% endfor %}"
    loaded = ChatTokenizer.load(directory)
    custom = ChatTokenizer(loaded.tokenizer, template, loaded.special_tokens)
    call = {"type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}
    chat = ChatPrompt([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert custom.render(chat) == "Oslo"


def test_content_format_detects_templates_that_loop_over_parts() -> None:
    assert content_format("{% for m in messages %}{{ m['content'] }}{% endfor %}") == "string"
    looping = (
        "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"
    )
    assert content_format(looping) == "openai"
    assert content_format(looping.replace("m['content']", "m.content")) == "openai"


def test_a_template_that_fails_raises_a_tokenizer_error(tmp_path: Path) -> None:
    loaded = ChatTokenizer.load(build_tiny_model(tmp_path))
    custom = ChatTokenizer(
        loaded.tokenizer, "{{ raise_exception('no tools here') }}", loaded.special_tokens
    )
    with pytest.raises(TokenizerError, match="no tools here"):
        custom.chat_tokens(ChatPrompt([{"role": "user", "content": "Hi"}]))


def test_a_directory_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        ChatTokenizer.load(tmp_path)
