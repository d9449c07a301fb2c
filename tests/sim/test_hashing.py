"""Block hashing as vLLM does it: chained sha256 over pickled (parent, tokens, extra keys)."""

from __future__ import annotations

import hashlib
import pickle

import pytest

from gateway.tools.sim.hashing import NONE_HASH, block_hashes, extend_hashes

# Computed by vLLM 0.32 itself (kv_cache_utils.hash_block_tokens with sha256, no seed).
FIRST_BLOCK_0123 = "9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd"


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(15)), 16)) == 0
    assert len(block_hashes(list(range(16)), 16)) == 1
    assert len(block_hashes(list(range(47)), 16)) == 2
    assert block_hashes([], 16) == []


def test_same_tokens_give_same_hashes_and_a_partial_tail_does_not_matter() -> None:
    tokens = list(range(100, 140))
    assert block_hashes(tokens, 16) == block_hashes(tokens[:32], 16)
    assert block_hashes(tokens, 16) == block_hashes(tuple(tokens), 16)


def test_hashes_follow_vllms_formula_from_a_fixed_root() -> None:
    tokens = list(range(8))
    first = hashlib.sha256(pickle.dumps((NONE_HASH, (0, 1, 2, 3), None), protocol=5)).digest()
    second = hashlib.sha256(pickle.dumps((first, (4, 5, 6, 7), None), protocol=5)).digest()
    assert block_hashes(tokens, 4) == [first, second]
    # vLLM 0.32's root when PYTHONHASHSEED is unset: stable across processes and runs.
    assert hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest() == NONE_HASH
    assert first.hex() == FIRST_BLOCK_0123


def test_salt_goes_into_the_first_block_only_and_changes_the_whole_chain() -> None:
    tokens = list(range(12))
    plain = block_hashes(tokens, 4)
    salted = block_hashes(tokens, 4, cache_salt="tenant-a")
    first = hashlib.sha256(
        pickle.dumps((NONE_HASH, (0, 1, 2, 3), (("cache_salt", "tenant-a"),)), protocol=5)
    ).digest()
    second = hashlib.sha256(pickle.dumps((first, (4, 5, 6, 7), None), protocol=5)).digest()
    assert salted[:2] == [first, second]
    assert all(p != s for p, s in zip(plain, salted, strict=True))
    assert set(salted).isdisjoint(block_hashes(tokens, 4, cache_salt="tenant-b"))


def test_an_empty_salt_is_no_salt() -> None:
    assert block_hashes(list(range(8)), 4, cache_salt="") == block_hashes(list(range(8)), 4)


def test_extending_a_chain_hashes_only_the_new_blocks_the_same_way() -> None:
    tokens = list(range(20))
    head = block_hashes(tokens[:9], 4, cache_salt="s")
    assert extend_hashes(head, tokens, 4, "s") == block_hashes(tokens, 4, cache_salt="s")


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1, 2, 3], 0)
