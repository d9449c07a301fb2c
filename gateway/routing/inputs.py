"""What routing is given of a request's prompt, and what it asks of a tokenizer.

Routing never sees an API type: the request path turns each client wire into one of
these plain values, and routing hashes that.

- `ChatPrompt`: what a chat template renders (messages, tools, the template's options).
  The chat wires whose prompt a vLLM replica renders with the chat template map here:
  chat completions as they are; the Responses API's ``instructions`` and input items,
  and Anthropic's ``system`` and messages, as a leading system message and the messages
  that follow (that is how vLLM serves them).
- `TextPrompt`: a completions prompt, a string or token ids, used as it is.

A tokenizer is injected (built once at start, by the app): a model's own
(`gateway.routing.tokens.ChatTokenizer`) or the simulated replica's. `PromptTokenizer` is
all routing needs of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A chat as the replica's chat template renders it."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None = None
    documents: Sequence[Any] | None = None
    template_kwargs: Mapping[str, Any] | None = None  # vLLM's chat_template_kwargs
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    # Characters of text in the messages: decides whether hashing leaves the event loop.
    chars: int = 0


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """A completions prompt: a string, a list of strings, or token ids (or lists of them)."""

    prompt: str | Sequence[Any]
    add_special_tokens: bool = True
    chars: int = 0


PromptInput: TypeAlias = ChatPrompt | TextPrompt


def content_text(content: Any, part: Callable[[Any], str], separator: str) -> str:
    """A chat message's content as text: none is empty, a string is itself, and a list of
    content parts is each part's text (as ``part`` renders it) joined by ``separator``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return separator.join(map(part, content))


class PromptTokenizer(Protocol):
    """A prompt's token ids exactly as the replicas compute them.

    Either method raises ValueError (or KeyError, TypeError) for a prompt it cannot
    tokenize; routing then routes that request on load alone and the replica answers
    with its own error.
    """

    def chat_tokens(self, chat: ChatPrompt) -> list[int]:
        """The token ids of a chat, rendered with the replicas' chat template."""
        ...

    def completion_tokens(self, prompt: TextPrompt) -> Sequence[int]:
        """The token ids of a completions prompt (ids given as `TokenIds`: their words)."""
        ...
