"""Keys and cache salts."""

import asyncio

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
from gateway.errors import AuthenticationFailed

ALICE = Principal("ten_a", "alice", "key_a", "tenant:ten_a")


class Keys:
    """A database of keys: ``load`` is what KeyRing calls (counted)."""

    def __init__(self) -> None:
        self.active: dict[str, Principal] = {}
        self.loads = 0
        self.fail = False

    def load(self) -> dict[str, Principal]:
        self.loads += 1
        if self.fail:
            raise RuntimeError("database down")
        return dict(self.active)


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


async def test_an_unreachable_database_refuses_unknown_keys_without_hanging() -> None:
    keys = Keys()
    ring = KeyRing(keys.load)
    await ring.refresh()
    keys.fail = True
    with pytest.raises(AuthenticationFailed):
        await asyncio.wait_for(ring.authenticate("Bearer kvg-new"), timeout=2)


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
