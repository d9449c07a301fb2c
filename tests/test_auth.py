"""Keys and cache salts."""

import asyncio
import hmac
from typing import Any

import pytest

from gateway.auth import (
    KeyRing,
    Principal,
    admin_token_matches,
    bearer_token,
    cache_salt,
    hash_key,
    new_key,
)
from gateway.errors import AuthenticationFailed, KeysUnavailable

ALICE = Principal("ten_a", "alice", "key_a", "tenant:ten_a")


class Keys:
    """A database of keys: ``load`` is what KeyRing calls (counted)."""

    def __init__(self) -> None:
        self.active: dict[str, Principal] = {}
        self.loads = 0
        self.fail = False

    def load(self) -> tuple[int, dict[str, Principal]]:
        self.loads += 1
        if self.fail:
            raise RuntimeError("database down")
        return self.loads, dict(self.active)


async def test_known_keys_need_no_database_and_unknown_ones_are_401() -> None:
    keys, key = Keys(), new_key()
    keys.active[hash_key(key)] = ALICE
    ring = KeyRing(keys.load)
    await ring.refresh()
    assert await ring.authenticate(f"Bearer {key}") == ALICE
    assert keys.loads == 1
    with pytest.raises(AuthenticationFailed):
        await ring.authenticate("Bearer kvg-unknown")


async def test_a_key_created_just_after_a_refresh_works_at_once() -> None:
    keys, key = Keys(), new_key()
    ring = KeyRing(keys.load)
    await ring.refresh()  # the periodic refresh ran a moment ago
    keys.active[hash_key(key)] = ALICE  # the key is created now
    assert await ring.authenticate(f"Bearer {key}") == ALICE


async def test_a_flood_of_unknown_keys_shares_refreshes() -> None:
    keys = Keys()
    ring = KeyRing(keys.load)
    await ring.refresh()
    results = await asyncio.gather(
        *(ring.authenticate(f"Bearer kvg-bad-{n}") for n in range(200)), return_exceptions=True
    )
    assert all(isinstance(r, AuthenticationFailed) for r in results)
    assert keys.loads <= 3


async def test_an_unreachable_database_gives_unknown_keys_a_503_at_once_and_known_ones_pass() -> (
    None
):
    """Never a 401 for a key that cannot be checked: a client would drop a valid key."""
    keys, known = Keys(), new_key()
    keys.active[hash_key(known)] = ALICE
    ring = KeyRing(keys.load)
    await ring.refresh()
    keys.fail = True
    with pytest.raises(KeysUnavailable) as refused:
        await asyncio.wait_for(ring.authenticate("Bearer kvg-new"), timeout=2)
    assert refused.value.status == 503 and refused.value.code == "keys_unavailable"
    assert "cannot be checked until the database is reachable again" in refused.value.message
    assert await ring.authenticate(f"Bearer {known}") == ALICE


def test_revoking_locally_forgets_the_key_at_once() -> None:
    keys, key = Keys(), new_key()
    keys.active[hash_key(key)] = ALICE
    ring = KeyRing(keys.load)
    asyncio.run(ring.refresh())
    ring.revoke_local("key_a")
    assert len(ring) == 0


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic abc", "kvg-x"])
def test_malformed_authorization_headers_are_401(header: str | None) -> None:
    with pytest.raises(AuthenticationFailed):
        bearer_token(header)


def test_admin_token_comparison() -> None:
    assert admin_token_matches("s3cret-token", "Bearer s3cret-token")
    assert not admin_token_matches("s3cret-token", "Bearer s3cret-tokeN")
    assert not admin_token_matches("s3cret-token", None)


def test_cache_salts_separate_tenants_and_fold_client_salts_under_the_tenant() -> None:
    a, b = cache_salt("k", "tenant:a"), cache_salt("k", "tenant:b")
    assert a != b and len(a) == 64
    assert cache_salt("k", "tenant:a", "x") not in (a, "x", cache_salt("k", "tenant:b", "x"))
    assert cache_salt("other-secret", "tenant:a") != a
    # Parts are length-prefixed: no (scope, client salt) pair spells another.
    assert cache_salt("k", "tenant:a", "b") != cache_salt("k", "tenant:a\x1fb")
    assert cache_salt("k", "tenant:a", "1:b") != cache_salt("k", "tenant:a1:b")
    assert cache_salt("k", "tenant:a") == a  # stable


def test_keys_are_random_and_hashes_are_sha256_hex() -> None:
    assert new_key() != new_key() and new_key().startswith("kvg-")
    import hashlib

    assert hash_key("kvg-x") == hashlib.sha256(b"kvg-x").hexdigest()


class LookupLog(dict[str, Principal]):
    """A key map that notes what it is asked for."""

    def __init__(self, items: dict[str, Principal]) -> None:
        super().__init__(items)
        self.asked: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.append(key)
        return super().get(key, default)


@pytest.mark.parametrize("offered", ["right", "last-char", "first-char", "unrelated"])
async def test_a_key_is_found_by_its_sha256_and_never_compared_itself(offered: str) -> None:
    """Constant time by construction: the offered key is hashed, and only its digest is
    looked up, so how much of a real key a wrong one shares changes nothing in the work
    done; no plain key is held to compare against."""
    key = new_key()
    keys = LookupLog({hash_key(key): ALICE})
    ring = KeyRing(lambda: (1, keys))
    await ring.refresh()
    candidate = {
        "right": key,
        "last-char": key[:-1] + ("A" if key[-1] != "A" else "B"),
        "first-char": ("x" if key[0] != "x" else "y") + key[1:],
        "unrelated": new_key(),
    }[offered]
    keys.asked.clear()
    try:
        found: Principal | None = await ring.authenticate(f"Bearer {candidate}")
    except AuthenticationFailed:
        found = None
    assert found == (ALICE if offered == "right" else None)
    assert set(keys.asked) == {hash_key(candidate)}
    assert list(keys) == [hash_key(key)] and key not in repr(ring.__dict__)


def test_the_admin_token_is_compared_with_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant time: hmac.compare_digest, on the whole token, every time."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def noting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", noting)
    assert admin_token_matches("s3cret-token", "Bearer s3cret-token")
    assert not admin_token_matches("s3cret-token", "Bearer s3cret-tokeX")
    assert not admin_token_matches("s3cret-token", "Bearer x")
    assert compared == [
        (b"s3cret-token", b"s3cret-token"),
        (b"s3cret-tokeX", b"s3cret-token"),
        (b"x", b"s3cret-token"),
    ]
