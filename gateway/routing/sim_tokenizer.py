"""A deterministic stand-in tokenizer and chat template: the simulated replica's.

It lives in routing because the gateway routes exactly in front of simulated replicas
(``tokenizer: kvgate-sim``); ``kvgate sim`` imports it from here (tools depend on the
service, never the reverse).

No vocabulary file and no download: text is cut into pieces (a run of non-space
characters with the ASCII whitespace that follows it) and each piece is named by its CRC-32
modulo a Llama-3-sized vocabulary. Stable across processes and Python versions.

Trailing whitespace sticks to the piece before it, so ``encode(a + b)`` starts with
``encode(a)`` whenever ``a`` ends in whitespace and ``b`` does not start with it. The chat
template is built on that: every message ends in a newline and the generation prompt ends
in a newline, so a conversation's tokens are a prefix of its continuation's tokens, and
an answer generated after ``<|assistant|>\\n`` tokenizes the same when it comes back as
history in the next turn (all but its last piece, which vLLM never caches anyway).

`SimTokenizer` is the same tokenizer as the gateway's router asks for one (a routing
`PromptTokenizer`): with ``tokenizer: kvgate-sim`` the app hands it to the fleet, so the
router's blocks are a simulated replica's blocks.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.routing.inputs import ChatPrompt, TextPrompt, content_text
from gateway.routing.token_ids import TokenIds

VOCAB_SIZE = 128_256
GENERATION_PROMPT = "<|assistant|>\n"

# Over UTF-8 bytes, which saves encoding each piece; only ASCII whitespace separates.
_PIECE = re.compile(rb"\S+\s*|\s+")


class TemplateError(ValueError):
    """A chat message the template cannot render (bad role or content shape)."""


def piece_id(piece: str) -> int:
    """The token id of one piece of text."""
    return zlib.crc32(piece.encode()) % VOCAB_SIZE


def pieces(text: str) -> list[str]:
    """The text cut into token pieces; joining them gives the text back."""
    return [piece.decode() for piece in _PIECE.findall(text.encode())]


def encode(text: str) -> list[int]:
    """Token ids of the text."""
    return [crc % VOCAB_SIZE for crc in map(zlib.crc32, _PIECE.findall(text.encode()))]


def render_chat(
    messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
) -> str:
    """A chat's prompt text: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``."""
    parts: list[str] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError("each message needs a non-empty string 'role'")
        parts.append(f"<|{role}|>\n{_content_text(message.get('content'))}\n")
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def _content_text(content: Any) -> str:
    if content is not None and not isinstance(content, str | list):
        raise TemplateError("message 'content' must be a string or a list of content parts")
    # vLLM joins text parts with newlines for string-format chat templates.
    return content_text(content, _part_text, "\n")


def _part_text(part: Any) -> str:
    if not isinstance(part, Mapping) or part.get("type") != "text":
        raise TemplateError("only content parts of type 'text' are supported")
    text = part.get("text")
    if not isinstance(text, str):
        raise TemplateError("a text content part needs a string 'text'")
    return text


class SimTokenizer:
    """The simulator's tokenizer for the gateway's router (a routing ``PromptTokenizer``)."""

    def chat_tokens(self, chat: ChatPrompt) -> list[int]:
        """A chat's token ids, as the simulated replica renders and encodes it."""
        return encode(render_chat(chat.messages))

    def completion_tokens(self, prompt: TextPrompt) -> Sequence[int]:
        """A completions prompt's token ids: text encoded, token ids as they are."""
        text = prompt.prompt
        if isinstance(text, str):
            return encode(text)
        if isinstance(text, TokenIds):
            return text.ids  # 32-bit words: no int object per id
        if text and isinstance(text[0], int):
            return [int(t) for t in text]
        return encode("".join(text))
