"""The Responses API's and Anthropic's prompts as the chat messages vLLM renders them.

vLLM serves ``/v1/responses`` and ``/v1/messages`` by turning each request into chat
messages and rendering those with the model's chat template; routing hashes the same
messages, so a Responses or Messages prompt lands where its prefix is cached. What is
kept of vLLM's conversion (vllm/entrypoints/openai/responses/utils.py,
vllm/entrypoints/anthropic/serving.py):

    Responses   ``instructions`` as a leading system message; a string ``input`` as one user
                message; input items as messages (text parts joined, output messages as
                assistant text, function calls and their outputs as tool calls and tool
                messages)
    Anthropic   ``system`` (a string or text blocks, joined) as a leading system message;
                each message's text blocks as text parts (one block: a string); tool uses
                and results as tool calls and tool messages

Pure functions over JSON values (the shapes were checked at the edge); the simulated
replica renders its prompts with them too (gateway/tools/sim).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Message = dict[str, Any]
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def responses_messages(instructions: Any, input_: Any) -> list[Message]:
    """A Responses request's prompt as chat messages."""
    messages: list[Message] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
        return messages
    for item in input_ if isinstance(input_, list) else ():
        if isinstance(item, Mapping):
            _response_item(item, messages)
    return messages


def _response_item(item: Mapping[str, Any], messages: list[Message]) -> None:
    kind = item.get("type", "message")
    previous = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
        }
        if previous is not None:
            previous.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
        return
    if kind == "function_call_output":
        messages.append(
            {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
        )
        return
    role = item.get("role")
    if not isinstance(role, str):
        return
    content = item.get("content")
    if role == "assistant":
        text = content if isinstance(content, str) else _first_text(content)
        if previous is not None and previous.get("content") is None:
            previous["content"] = text
        else:
            messages.append({"role": "assistant", "content": text})
        return
    messages.append({"role": role, "content": _parts(content)})


def _first_text(content: Any) -> str | None:
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _parts(content: Any) -> Any:
    """Input content: a string as it is; parts with the Responses text types as text."""
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text")})
        else:
            parts.append(part)
    return parts


def responses_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The Responses API's flat function tools in the chat form a template reads."""
    if not isinstance(tools, list):
        return None
    functions = [t for t in tools if isinstance(t, Mapping) and t.get("type") == "function"]
    return _chat_tools(functions, "parameters")


def anthropic_messages(system: Any, messages: Any) -> list[Message]:
    """An Anthropic Messages request's prompt as chat messages."""
    converted: list[Message] = []
    system_text = _system_text(system)
    if system_text:
        converted.append({"role": "system", "content": system_text})
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, Mapping):
            _anthropic_message(message, converted)
    return converted


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        return ""
    return "".join(
        block["text"]
        for block in system
        if isinstance(block, Mapping)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and not block["text"].startswith("x-anthropic-billing-header")
    )


def _anthropic_message(message: Mapping[str, Any], converted: list[Message]) -> None:
    role, content = message.get("role"), message.get("content")
    if role == "system":
        text = _system_text(content)
        if text:
            converted.append({"role": "system", "content": text})
        return
    out: Message = {"role": role}
    if isinstance(content, str):
        out["content"] = content
        converted.append(out)
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, Sequence) else ():
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": _json(block.get("input"))},
                }
            )
        elif kind == "tool_result":
            converted.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _result_text(block.get("content")),
                }
            )
    if calls:
        out["tool_calls"] = calls
    if parts:
        out["content"] = parts[0]["text"] if len(parts) == 1 else parts
    if "content" in out or calls:
        converted.append(out)


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and "text" in b
        )
    return ""


def _json(value: Any) -> str:
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def anthropic_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic's tools (``name``, ``description``, ``input_schema``) in the chat form."""
    if not isinstance(tools, list):
        return None
    described = [
        t for t in tools if isinstance(t, Mapping) and isinstance(t.get("input_schema"), Mapping)
    ]
    return _chat_tools(described, "input_schema")


def _chat_tools(tools: list[Mapping[str, Any]], schema: str) -> list[dict[str, Any]] | None:
    """Tools in the chat form a template reads, their parameters' schema under ``schema``."""
    converted = [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description"),
                "parameters": tool.get(schema),
            },
        }
        for tool in tools
    ]
    return converted or None
