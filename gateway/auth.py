"""API keys (stored hashed) to tenants, and each tenant's cache salt.

Keys are random 256-bit tokens, so a plain SHA-256 is the right stored form (as for
GitHub or Stripe tokens): it cannot be reversed, and the look-up by hash does not compare
secrets byte by byte. Active keys are held in memory and refreshed in the background, so
no known key waits on the database; an unknown key waits for a view loaded after it
arrived (shared refreshes, at most one every quarter second), so a key created a moment
ago works at once and a revoked one stops within KVGATE_KEY_REFRESH_S.
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

from gateway.errors import AuthenticationFailed

log = logging.getLogger("kvgate.auth")
KEY_PREFIX = "kvg-"
MISS_REFRESH_INTERVAL_S = 0.25


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant and the key they used."""

    tenant_id: str
    tenant_name: str
    api_key_id: str
    cache_scope: str


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str:
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


class KeyRing:
    """In-memory map of active key hashes to principals, refreshed from the database."""

    def __init__(self, load: Callable[[], dict[str, Principal]]) -> None:
        self._load = load
        self._keys: dict[str, Principal] = {}
        self._started = 0.0  # when the refresh in flight (or the last) began
        self._fresh_since = -1.0  # when the refresh behind the current view began
        self._refreshing: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._keys)

    async def refresh(self) -> None:
        """Reload the active keys (in a thread: the database is not on the event loop)."""
        started = self._started = time.monotonic()
        keys = await asyncio.to_thread(self._load)
        if started >= self._fresh_since:
            self._keys, self._fresh_since = keys, started

    async def _refresh_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.refresh()

    async def _view_since(self, moment: float) -> None:
        """Wait for a view loaded by a refresh that began after ``moment``.

        Misses share one refresh, at most one every MISS_REFRESH_INTERVAL_S: a flood of bad
        keys waits, it does not hammer the database.
        """
        while self._fresh_since < moment:
            if self._refreshing is None or self._refreshing.done():
                delay = max(0.0, MISS_REFRESH_INTERVAL_S - (time.monotonic() - self._started))
                self._refreshing = asyncio.ensure_future(self._refresh_after(delay))
            try:
                await asyncio.shield(self._refreshing)
            except Exception:
                log.warning("API keys could not be reloaded; unknown keys are refused")
                return

    async def authenticate(self, authorization: str | None) -> Principal:
        arrived = time.monotonic()
        digest = hash_key(bearer_token(authorization))
        principal = self._keys.get(digest)
        if principal is None:
            # A key created a moment ago: look again in a view newer than this request.
            await self._view_since(arrived)
            principal = self._keys.get(digest)
        if principal is None:
            raise AuthenticationFailed("invalid or revoked API key")
        return principal

    def revoke_local(self, api_key_id: str) -> None:
        """Forget a key at once in this process (the database is the source of truth)."""
        self._keys = {h: p for h, p in self._keys.items() if p.api_key_id != api_key_id}
