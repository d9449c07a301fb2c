"""A prompt of token ids kept compact: 32-bit words and the JSON text they came in.

As Python ints in a list, a token id costs 36 bytes (a 28-byte int object and a list slot)
for the 5 to 7 bytes it takes in JSON: a 3.9 MiB completions body of token ids grows to
five times its size once parsed, and several such bodies overlap in a busy gateway
(RELIABILITY.md, memory per large body). `TokenIds` holds them as an ``array('I')``
(vLLM's token ids fit in 32 bits; the edge checks each is at most ``2**32 - 1``) beside
the JSON text of the array, which is what the upstream is sent, spliced in unchanged.

It is a ``Sequence[int]``, so whatever reads a prompt of token ids reads it as before.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import overload

_WHITESPACE = b" \t\n\r"


class TokenIds(Sequence[int]):
    """Token ids as 32-bit words, with the JSON array they were read from."""

    __slots__ = ("ids", "json")

    def __init__(self, ids: array[int], json: bytes) -> None:
        self.ids = ids
        self.json = json  # ``[1, 2, 3]`` as the client wrote it: valid JSON, ints only

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        return self.ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.ids == other.ids
        if isinstance(other, list):
            return self.ids.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable contents, as a list's

    def __repr__(self) -> str:
        return f"TokenIds({len(self.ids)} ids)"

    def text(self) -> str:
        """The ids as decimal numbers joined by single spaces (``" ".join(map(str, ids))``),
        made from the JSON text: no string object per id."""
        return self.json[1:-1].translate(None, _WHITESPACE).replace(b",", b" ").decode("ascii")
