"""A large completions body's token ids, read into `TokenIds` without a Python int each.

Parsed whole, 580,000 token ids in a 3.9 MiB body become 580,000 int objects, about five
times the body while they live and nine times while orjson builds them: the largest part
of a gateway's memory when such bodies arrive together (RELIABILITY.md, memory per large
body). So a body past ``LIFT_BYTES`` whose top-level ``prompt`` is an array of
non-negative integers has that array cut out of its bytes before the rest is parsed, and
read in slices into 32-bit words.

Nothing else changes: every case this fast path does not vouch for (a nested or second
``prompt`` member, strings, negative or overlong numbers, malformed JSON) is parsed the
ordinary way, so errors and edge cases are exactly those of the whole body's parse.
"""

from __future__ import annotations

import re
from array import array
from typing import Any

import orjson

from gateway.api.schemas import MAX_TOKEN_ID
from gateway.routing.token_ids import TokenIds

# Below this a body's ids cost little as ints, and the plain parse is the fastest way.
LIFT_BYTES = 256 * 1024
# One slice of the ids parsed at a time: about 9,000 ints alive at once.
SLICE_BYTES = 64 * 1024
_KEY = re.compile(rb'"prompt"\s*:\s*\[')
# Stands in for the array while the rest is parsed; a body holding it is parsed whole.
_STAND_IN = b'"\\u0000kvgate:token-ids"'
_STAND_IN_VALUE = "\x00kvgate:token-ids"
_ID_BYTES = b"0123456789, \t\n\r"
assert array("I").itemsize == 4 and MAX_TOKEN_ID == 2**32 - 1


def lift_token_ids(raw: bytes | bytearray) -> dict[str, Any] | None:
    """The body with its top-level ``prompt`` as `TokenIds`; None where it is not a large
    body of that shape, or anything about it is not plainly valid (parse it whole then)."""
    if len(raw) < LIFT_BYTES:
        return None
    found = _KEY.search(raw)
    if found is None:
        return None
    start = found.end() - 1
    end = raw.find(b"]", start)
    if end < 0 or _STAND_IN in raw:
        return None
    text = memoryview(raw)[start : end + 1].tobytes()
    ids = _ids(text)
    if ids is None:
        return None
    try:
        body = orjson.loads(b"".join((raw[:start], _STAND_IN, raw[end + 1 :])))
    except orjson.JSONDecodeError:
        return None
    # The stand-in occurs once: the effective top-level ``prompt`` holds it only if the
    # array cut out was that member's value.
    if not isinstance(body, dict) or body.get("prompt") != _STAND_IN_VALUE:
        return None
    body["prompt"] = TokenIds(ids, text)
    return body


def _ids(text: bytes) -> array[int] | None:
    """``[1, 2, ...]`` as 32-bit words; None unless it is a valid non-empty JSON array of
    integers from 0 to 2**32 - 1 (digits, commas and whitespace only)."""
    inner = text[1:-1]
    if inner.translate(None, _ID_BYTES):
        return None
    ids: array[int] = array("I")
    at, size = 0, len(inner)
    while at < size:
        cut = size if size - at <= SLICE_BYTES else inner.rfind(b",", at, at + SLICE_BYTES)
        if cut <= at:
            return None
        try:
            part = orjson.loads(b"[%b]" % inner[at:cut])
        except orjson.JSONDecodeError:
            return None
        if not part:  # between two commas, or after the last: not JSON
            return None
        try:
            ids.extend(part)
        except OverflowError:
            return None
        at = cut + 1  # a trailing comma is always in the last slice: refused there
    return ids if ids else None
