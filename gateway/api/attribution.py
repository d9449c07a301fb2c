"""Cost attribution at the edge: who a request was for (its end user) and its tags.

- The end user is OpenAI's ``user`` member, or Anthropic's ``metadata.user_id`` on the
  Messages endpoints: 1 to 256 printable characters (an empty string names nobody). It is
  still sent upstream, as the client sent it.
- Tags come from the ``X-Kvgate-Tags: key=value,key=value`` header and from OpenAI's
  ``metadata`` object (every member but ``interaction_id``, which names the interaction;
  Anthropic's ``metadata`` holds no tags);
  where both name a key, the header's value wins. At most 10 tags; keys and values are
  1 to 64 printable characters, keys without ``=``, ``,``, ``"`` or a backslash, values without
  ``,`` (both as the header writes them, trimmed); metadata values are strings, as in
  OpenAI's API. Anything beyond is a 400 naming the header or the member.

End users and tags are tenant data: stored on the tenant's records and shown only in that
tenant's statements and dashboard pages.
"""

from __future__ import annotations

from typing import Any

from gateway.db.models import MAX_END_USER, TAG_KEY
from gateway.errors import InvalidRequest

MAX_TAGS = 10
MAX_TAG_CHARS = 64
TAGS_HEADER = "X-Kvgate-Tags"
# metadata members that are not tags: kvgate's own.
NOT_TAGS = frozenset({"interaction_id"})


def end_user_of(user: Any, param: str = "user") -> str | None:
    """The end user the body names (OpenAI's ``user``, Anthropic's ``metadata.user_id``),
    checked; None when it names none."""
    if user is None or user == "":
        return None
    if not isinstance(user, str) or len(user) > MAX_END_USER or not user.isprintable():
        raise InvalidRequest(
            f"'{param}' must be at most {MAX_END_USER} printable characters", param=param
        )
    return user


def _checked(key: str, value: Any, where: str) -> tuple[str, str]:
    if not TAG_KEY.fullmatch(key) or not key.isprintable() or key != key.strip():
        raise InvalidRequest(
            f"tag key {key[:80]!r} must be 1 to {MAX_TAG_CHARS} printable characters "
            """without '=', ',', '"' or '\\'""",
            param=where,
        )
    if not isinstance(value, str):
        raise InvalidRequest(f"tag '{key}' must have a string value", param=where)
    value = value.strip()
    if not value or len(value) > MAX_TAG_CHARS or not value.isprintable() or "," in value:
        raise InvalidRequest(
            f"tag '{key}' must have a value of 1 to {MAX_TAG_CHARS} printable characters "
            "without ','",
            param=where,
        )
    return key, value


def _header_tags(header: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in header.split(","):
        if not item.strip():
            continue
        key, equals, value = item.partition("=")
        if not equals:
            raise InvalidRequest(
                f"{TAGS_HEADER} must be key=value pairs separated by ',' (got {item[:80]!r})",
                param=TAGS_HEADER,
            )
        key, value = _checked(key.strip(), value, TAGS_HEADER)
        if key in tags:
            raise InvalidRequest(f"tag '{key}' is given twice", param=TAGS_HEADER)
        tags[key] = value
    return tags


def tags_of(header: str | None, metadata: Any) -> tuple[tuple[str, str], ...]:
    """The request's tags, sorted by key: ``metadata``'s, then the header's over them."""
    tags: dict[str, str] = {}
    if isinstance(metadata, dict):
        for key, value in metadata.items():
            if key not in NOT_TAGS:
                tags.__setitem__(*_checked(key, value, f"metadata.{key}"[:100]))
    if header is not None:
        tags.update(_header_tags(header))
    if len(tags) > MAX_TAGS:
        raise InvalidRequest(
            f"a request has at most {MAX_TAGS} tags ({len(tags)} given)",
            param=TAGS_HEADER if header is not None else "metadata",
        )
    return tuple(sorted(tags.items()))
