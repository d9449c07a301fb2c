"""The Responses API's and Anthropic's prompts become the chat messages vLLM renders."""

from __future__ import annotations

from gateway.routing.conversations import (
    anthropic_messages,
    anthropic_tools,
    responses_messages,
    responses_tools,
)


def test_responses_instructions_lead_and_a_string_input_is_one_user_message() -> None:
    assert responses_messages("Be brief.", "Hi.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
    ]
    assert responses_messages(None, "Hi.") == [{"role": "user", "content": "Hi."}]


def test_responses_items_as_vllm_converts_them() -> None:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"role": "developer", "content": "terse"},
    ]
    assert responses_messages("sys", items) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "Q"}]},
        {
            "role": "assistant",
            "content": "A",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "done", "tool_call_id": "c1"},
        {"role": "developer", "content": "terse"},
    ]
    assert responses_tools([{"type": "function", "name": "f", "parameters": {}}]) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {}}}
    ]
    assert responses_tools([{"type": "web_search"}]) is None


def test_anthropic_system_blocks_join_and_cache_control_is_not_prompt() -> None:
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: abc"},
        {"type": "text", "text": "One. ", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Two."},
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {}}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert anthropic_messages(system, messages) == [
        {"role": "system", "content": "One. Two."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert anthropic_tools(
        [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    ) == [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
        }
    ]
