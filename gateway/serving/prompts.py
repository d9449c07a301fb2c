"""A call's prompt as routing takes it: the plain value that gets hashed into blocks.

Routing never sees a `Call`; each wire is turned here into a `ChatPrompt` (what a chat
template renders) or a `TextPrompt` (a completions prompt). A wire added later (the
Responses API's instructions and input items, Anthropic's system and messages) becomes a
`ChatPrompt` the same way vLLM serves it: the instructions or system as a leading system
message, then the messages.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.routing.conversations import (
    anthropic_messages,
    anthropic_tools,
    responses_messages,
    responses_tools,
)
from gateway.routing.inputs import ChatPrompt, PromptInput, TextPrompt
from gateway.serving.calls import Call, Endpoint


def routing_prompt(call: Call) -> PromptInput:
    """The call's prompt, with the request fields vLLM's chat template reads."""
    body = call.body
    if call.endpoint is Endpoint.RESPONSES:
        return ChatPrompt(
            messages=responses_messages(body.get("instructions"), body["input"]),
            tools=responses_tools(body.get("tools")),
            chars=call.prompt_chars,
        )
    if call.endpoint.anthropic:
        return ChatPrompt(
            messages=anthropic_messages(body.get("system"), body["messages"]),
            tools=anthropic_tools(body.get("tools")),
            chars=call.prompt_chars,
        )
    if call.endpoint is Endpoint.EMBEDDINGS:
        return TextPrompt(
            prompt=body["input"],
            add_special_tokens=bool(body.get("add_special_tokens", True)),
            chars=call.prompt_chars,
        )
    if call.endpoint is Endpoint.CHAT:
        template_kwargs = body.get("chat_template_kwargs")
        return ChatPrompt(
            messages=body["messages"],
            tools=body.get("tools"),
            documents=body.get("documents"),
            template_kwargs=template_kwargs if isinstance(template_kwargs, Mapping) else None,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
            add_special_tokens=bool(body.get("add_special_tokens", False)),
            chars=call.prompt_chars,
        )
    return TextPrompt(
        prompt=body["prompt"],
        add_special_tokens=bool(body.get("add_special_tokens", True)),
        chars=call.prompt_chars,
    )
