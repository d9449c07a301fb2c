"""API keys (stored hashed) to tenants, and each tenant's cache salt.

Keys are random 256-bit tokens, so a plain SHA-256 is the right stored form (as for
GitHub or Stripe tokens): it cannot be reversed, and the look-up by hash does not compare
secrets byte by byte. Active keys are held in memory (a ``Mirror``), so no known key waits
on the database. The directory (gateway/directory/) keeps that copy current: a key
created or revoked applies to every request that starts after the command or API call
returned (db/changes.py says how), on every worker and gateway sharing the database.
An unknown key still waits for a view loaded after it arrived (shared refreshes, at most
one every quarter second), for the case where no change notice reached this process.
When that look-up fails (the database is unreachable), an unknown key gets a 503 that
says so, never a 401 that would make a client drop a key that may be valid.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import AuthenticationFailed, KeysUnavailable
from gateway.mirror import Mirror

log = logging.getLogger("kvgate.auth")
KEY_PREFIX = "kvg-"
MISS_REFRESH_INTERVAL_S = 0.25
MISS_WAIT_S = 5.0  # the longest an unknown key waits for the database's answer


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant and the key they used."""

    tenant_id: str
    tenant_name: str
    api_key_id: str
    cache_scope: str
    # The tenant opted in to keeping the text around its prompts' prefix breaks.
    break_context: bool = False


Keys = dict[str, Principal]  # key hash -> who it authenticates


def new_key() -> str:
    """A new API key: the key prefix and 32 random bytes, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The key's SHA-256 hex digest: the form the database and the key ring keep."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str:
    """The key in ``Authorization: Bearer <key>``; AuthenticationFailed if none or malformed."""
    if not authorization:
        raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("malformed Authorization header: expected 'Bearer <key>'")
    return token.strip()


@functools.lru_cache(maxsize=4096)
def cache_salt(secret: str, scope: str, client_salt: str | None = None) -> str:
    """HMAC(server secret, tenant scope), with a client salt folded in underneath.

    The result never equals a client-chosen value and never matches across scopes, so a
    client cannot name its way into another tenant's cache. Kept for the tenants (and
    client salts) seen lately: the same inputs give the same salt, and an HMAC per request
    is measurable on the request path.
    """
    # Length-prefixed parts: no scope and client salt can spell another pair.
    parts = [scope] if client_salt is None else [scope, client_salt]
    message = "".join(f"{len(part)}:{part}" for part in parts)
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def admin_token_matches(expected: str, authorization: str | None) -> bool:
    """Constant-time comparison of an admin bearer token."""
    try:
        token = bearer_token(authorization)
    except AuthenticationFailed:
        return False
    return hmac.compare_digest(token.encode(), expected.encode())


def _nothing() -> None:
    return None


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


class KeyRing:
    """In-memory map of active key hashes to principals, loaded from the database."""

    def __init__(
        self, load: Callable[[], tuple[int, Keys]], *, fresh: Callable[[], None] = _nothing
    ) -> None:
        self.mirror: Mirror[Keys] = Mirror("keys", load, {})
        # The change check (SQLite: PRAGMA data_version) at the start of every request: it
        # reloads whatever changed (keys, prices), so the request's record is priced current.
        self._fresh = fresh
        self._started = 0.0  # when the refresh in flight (or the last) began
        self._fresh_since = -1.0  # when the refresh behind the current view began
        self._refreshing: asyncio.Task[None] | None = None
        self.reachable = True  # whether the last refresh reached the database

    def __len__(self) -> int:
        return len(self.mirror.value)

    async def refresh(self, *, checked: bool = False) -> None:
        """Reload the active keys (in a thread: the database is not on the event loop);
        ``checked``: the periodic one (see ``Mirror.reload_checked``)."""
        started = self._started = time.monotonic()
        try:
            await asyncio.to_thread(self.mirror.reload_checked if checked else self.mirror.reload)
        except Exception:
            self.reachable = False
            raise
        self.reachable = True
        self._fresh_since = max(self._fresh_since, started)

    async def _refresh_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.refresh()

    async def _view_since(self, moment: float) -> None:
        """Wait for a view loaded by a refresh that began after ``moment``.

        Misses share one refresh, at most one every MISS_REFRESH_INTERVAL_S: a flood of bad
        keys waits, it does not hammer the database.
        """
        deadline = moment + MISS_WAIT_S
        while self._fresh_since < moment:
            if self._refreshing is None or self._refreshing.done():
                delay = max(0.0, MISS_REFRESH_INTERVAL_S - (time.monotonic() - self._started))
                self._refreshing = asyncio.ensure_future(self._refresh_after(delay))
                # Its failure is reported to whoever waits; one nobody waits for any more
                # (they gave up at MISS_WAIT_S) is not an error to log again.
                self._refreshing.add_done_callback(_retrieved)
            try:
                await asyncio.wait_for(
                    asyncio.shield(self._refreshing), max(0.0, deadline - time.monotonic())
                )
            except Exception as exc:
                log.warning("API keys could not be reloaded (%s); unknown keys get a 503", exc)
                raise KeysUnavailable(
                    "this API key is not one the gateway knew when it lost its database, and "
                    "it cannot be checked until the database is reachable again; retry shortly"
                ) from None

    async def authenticate(self, authorization: str | None) -> Principal:
        """The key's principal; a key not mirrored yet is looked for again in a newer view."""
        arrived = time.monotonic()
        digest = hash_key(bearer_token(authorization))
        self._fresh()
        principal = self.mirror.value.get(digest)
        if principal is None:
            # A key created a moment ago: look again in a view newer than this request.
            await self._view_since(arrived)
            principal = self.mirror.value.get(digest)
        if principal is None:
            raise AuthenticationFailed("invalid or revoked API key")
        return principal

    def revoke_local(self, api_key_id: str) -> None:
        """Forget a key at once in this process (the database is the source of truth)."""
        self.mirror.replace(
            lambda keys: {h: p for h, p in keys.items() if p.api_key_id != api_key_id}
        )
