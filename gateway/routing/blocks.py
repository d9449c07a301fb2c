"""A prompt as a chain of salted block hashes: the keys the routing index is kept under.

vLLM names each full block of a prompt by a hash of (parent block hash, the block's
tokens, extra keys), with ``cache_salt`` folded into the first block. We keep that shape:
the chain starts from a root that mixes in the model and the tenant's cache salt, so two
tenants (or two models) never share a key, and each block's hash depends on every block
before it, so equal hashes mean equal prefixes and matching stops at the first miss.

Two modes, one seam (`Hasher`):

- token mode, when a deployment names a tokenizer: blocks are the replica's own token
  blocks, and predictions line up with vLLM's exactly. Deferred: loading a tokenizer on
  the request path is too slow for the hot path without care; a `Hasher` that tokenizes
  plugs in here without touching the index or the policy.
- text mode (`TextHasher`), otherwise: the rendered chat is cut into fixed-size chunks of
  characters. It only approximates token blocks, but it is prefix-preserving (a prompt
  that extends another shares all of its full chunks), which is all routing needs.

Hashing is xxh3-64 with the parent hash as the seed: one C call per block, ints only.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import xxhash

from gateway.routing.inputs import content_text

# About one vLLM block (16 tokens) of English text at ~4 characters per token; finer
# chunks cost hashing time (~0.3 ms for 128,000 characters at 64) for little routing gain.
DEFAULT_CHUNK_CHARS = 64

# Separators that ordinary chat text does not contain, so that message boundaries are
# part of the rendering and cannot be forged by content ("user" + "x" ≠ "userx").
_FIELD = "\x1f"
_RECORD = "\x1e"

_hash = xxhash.xxh3_64_intdigest


class Hasher(Protocol):
    """Turns a rendered prompt into its chain of block hashes under a root."""

    @property
    def block_tokens(self) -> int:
        """Tokens one block stands for (exact in token mode, estimated in text mode)."""
        ...

    def hashes(self, text: str, *, root: int) -> Sequence[int]:
        """The chained hashes of the prompt's full blocks, head first."""
        ...


@dataclass(frozen=True, slots=True)
class TextHasher:
    """Text mode: fixed-size chunks of characters stand in for token blocks."""

    chunk_chars: int = DEFAULT_CHUNK_CHARS
    chars_per_token: float = 4.0

    @property
    def block_tokens(self) -> int:
        """Tokens one chunk stands for (at least one)."""
        return max(1, round(self.chunk_chars / self.chars_per_token))

    def hashes(self, text: str, *, root: int) -> Sequence[int]:
        """The text's chain of chunk hashes, salted by ``root``."""
        return text_block_hashes(text, chunk_chars=self.chunk_chars, root=root)


def root_hash(model: str, cache_salt: str) -> int:
    """The seed of every chain: model and tenant cache salt, length-prefixed."""
    model_bytes = model.encode()
    salt_bytes = cache_salt.encode()
    # Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    payload = b"%d:%b%d:%b" % (len(model_bytes), model_bytes, len(salt_bytes), salt_bytes)
    return _hash(payload)


def text_block_hashes(text: str, *, chunk_chars: int, root: int) -> array[int]:
    """Chained hashes of the text's full chunks of ``chunk_chars`` characters.

    Kept as one array of 64-bit words, not a list of Python ints: a long prompt has a hash
    per 64 characters, and as objects they cost more than half the prompt again, and stay
    in the allocator's arenas after the request (RELIABILITY.md, memory per large body).
    """
    if chunk_chars < 1:
        raise ValueError("chunk_chars must be at least 1")
    out: array[int] = array("Q")
    append = out.append
    parent = root
    # Only full chunks, as vLLM caches only full blocks: a growing prompt keeps its hashes.
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        parent = _hash(text[start : start + chunk_chars].encode(), parent)
        append(parent)
    return out


def token_block_hashes(tokens: Sequence[int], *, block_tokens: int, root: int) -> list[int]:
    """Chained hashes of full blocks of token ids (the token-mode chain, given tokens)."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be at least 1")
    ids = array("I", tokens)
    data = memoryview(ids.tobytes())
    stride = block_tokens * ids.itemsize
    out: list[int] = []
    parent = root
    for start in range(0, len(data) - stride + 1, stride):
        parent = _hash(data[start : start + stride], parent)
        out.append(parent)
    return out


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable text of a chat for routing: roles, names and content, in order.

    Message *i*'s rendering depends only on message *i*, so a conversation that grows
    by appending messages keeps its rendered prefix. Content may be a string or a list
    of parts; text parts are kept verbatim, other parts by their stable JSON form.
    """
    pieces: list[str] = []
    for message in messages:
        pieces.append(str(message.get("role", "")))
        name = message.get("name")
        if name:
            pieces.append(_FIELD)
            pieces.append(str(name))
        pieces.append(_FIELD)
        pieces.append(content_text(message.get("content"), _part_text, ""))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            pieces.append(_FIELD)
            pieces.append(_stable_json(tool_calls))
        pieces.append(_RECORD)
    return "".join(pieces)


def _part_text(part: Any) -> str:
    """A text part verbatim; any other part by its stable JSON form."""
    if isinstance(part, Mapping) and part.get("type") == "text":
        return str(part.get("text", ""))
    return _stable_json(part)


def _stable_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
