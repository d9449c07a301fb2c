"""Where each stored response lives: written into the response's id.

vLLM keeps a response (``store``, with ``VLLM_ENABLE_RESPONSES_API_STORE``) in the memory
of the replica that served it, so a follow-up naming it in ``previous_response_id`` can
only be answered there. The id the gateway passes on is the replica's with a mark of that
replica, a short hash of its URL:

    resp_abc123   (the replica's)   ->   resp_abc123_r1f2e3d4c   (passed on)

(and then tagged for the tenant: gateway/api/response_ids.py). A follow-up goes to the
replica its id names and nowhere else, from any worker of any gateway sharing the
deployment's replicas, across restarts: nothing is kept. When that replica is gone (down,
or no longer in the deployment) the client is told so with a 404 rather than another
replica's "not found" or, worse, an answer without the conversation it continues. An id
without a mark (issued before ids were marked) is routed as any request is; the replica
answers for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

MARK = "_r"  # between the replica's id and the mark of the replica
HOME_CHARS = 8  # hex characters of the replica URL's hash
HEX = frozenset("0123456789abcdef")


def home_key(replica: str) -> str:
    """The mark of a replica: a hash of its URL."""
    return hashlib.blake2s(replica.encode(), digest_size=HOME_CHARS // 2).hexdigest()


def homed(response_id: str, replica: str) -> str:
    """The id to pass on for the replica's ``response_id``."""
    return f"{response_id}{MARK}{home_key(replica)}"


def renamed(body: dict[str, Any], replica: str, previous: tuple[str, str] | None) -> None:
    """A whole Response as passed on: its id marked with ``replica``, and the
    ``previous`` (replica's, marked) id it continues given back marked."""
    response_id = body.get("id")
    if isinstance(response_id, str):
        body["id"] = homed(response_id, replica)
    if previous is not None and body.get("previous_response_id") == previous[0]:
        body["previous_response_id"] = previous[1]


def split_home(response_id: str) -> tuple[str, str | None]:
    """(The replica's own id, the mark of its replica), or (the id, None) unmarked."""
    own, mark, key = response_id.rpartition(MARK)
    if not mark or not own or len(key) != HOME_CHARS or not set(key) <= HEX:
        return response_id, None
    return own, key


def home_of(key: str, replicas: Iterable[str]) -> str | None:
    """The replica of ``replicas`` (URLs) whose mark is ``key``; None if none is."""
    return next((url for url in replicas if home_key(url) == key), None)
