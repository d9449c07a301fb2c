"""Where each stored response lives: a bounded map of Responses API response ids to the
replica that served them.

vLLM keeps a response (``store``, with ``VLLM_ENABLE_RESPONSES_API_STORE``) in the memory
of the replica that served it, so a follow-up naming it in ``previous_response_id`` can
only be answered there. The gateway remembers the replica of the latest responses (least
recently used forgotten first); a follow-up goes to that replica and nowhere else, and
when the replica is gone (down, or no longer in the deployment) the client is told so
with a 404 rather than another replica's "not found" or, worse, an answer without the
conversation it continues. An id the gateway does not know (forgotten, or served through
another gateway) is routed as any request is; the replica answers for it.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_SIZE = 100_000


class ResponseHomes:
    """Response id -> the replica URL that holds it, for the latest ``size`` responses."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, replica: str) -> None:
        """``response_id`` was served (and stored) by ``replica``."""
        self._homes[response_id] = replica
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.size:
            self._homes.popitem(last=False)

    def home_of(self, response_id: str) -> str | None:
        """The replica holding ``response_id``, if the gateway remembers it."""
        home = self._homes.get(response_id)
        if home is not None:
            self._homes.move_to_end(response_id)
        return home
