"""vLLM's block hashes reproduced: every expected value below was computed by vLLM 0.32's own
``kv_cache_utils.hash_block_tokens`` (NONE_HASH from ``init_none_hash``, no PYTHONHASHSEED)."""

from __future__ import annotations

import pytest

from gateway.routing.vllm_blocks import BlockHashing, HashAlgoError, external

SHA256 = {
    "none": "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
    "0123": "9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd",
    "4567": "1c9b6c0620e875631f1c5395ed56f2243aa113f88fc842f04fbb0654074b8d43",
    "salted": "d1c7a629516c3cead2e7b2fb9fcf92b08c51ce74187157b2a1befa4d0e8e628f",
}
SHA256_CBOR = {
    "none": "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
    "0123": "c49ab11fb576db6f376aef58c24f728a0ba1807e8cac5f940f1a5c4c20741898",
    "4567": "9d0a7c928c548f9aeea31ae98471cf515045a206851732ac14cb3083c18d40f9",
    "salted": "c670d8476066decdfaa59318bcc93ae0f38e3a40a1ea4ddf36ccddc0bf7da05f",
}


@pytest.mark.parametrize(("algo", "expected"), [("sha256", SHA256), ("sha256_cbor", SHA256_CBOR)])
def test_digests_equal_vllms_for_both_reproducible_algorithms(
    algo: str, expected: dict[str, str]
) -> None:
    hashing = BlockHashing(algo)
    assert hashing.none_hash.hex() == expected["none"]
    assert [d.hex() for d in hashing.chain(range(10), 4)] == [expected["0123"], expected["4567"]]
    salted = hashing.chain(range(8), 4, "tenant-a")
    assert salted[0].hex() == expected["salted"]
    # Only the first block carries the salt, but every later hash chains from it.
    assert salted[1] == hashing.digest(salted[0], (4, 5, 6, 7), None)
    assert salted[1].hex() != expected["4567"]


def test_event_keys_are_the_low_64_bits_big_endian_as_vllm_publishes_them() -> None:
    # vLLM's maybe_convert_block_hash of the salted sha256 block above.
    assert external(bytes.fromhex(SHA256["salted"])) == 11655028094545060495
    assert BlockHashing().keys(range(4), 4, "tenant-a") == [11655028094545060495]


def test_an_empty_salt_is_no_salt_and_a_partial_tail_has_no_hash() -> None:
    hashing = BlockHashing()
    assert hashing.chain(range(11), 4, "") == hashing.chain(range(8), 4)
    assert hashing.chain(range(3), 4) == []


def test_a_chain_can_be_extended_from_its_known_head() -> None:
    hashing = BlockHashing()
    head = hashing.chain(range(9), 4, "s")
    assert hashing.chain(range(20), 4, "s", known=head) == hashing.chain(range(20), 4, "s")


def test_a_pythonhashseed_changes_the_root_and_xxhash_needs_one() -> None:
    assert BlockHashing(seed="0").none_hash != BlockHashing().none_hash
    assert len(BlockHashing("xxhash", seed="0").none_hash) == 16
    with pytest.raises(HashAlgoError, match="PYTHONHASHSEED"):
        BlockHashing("xxhash")
    with pytest.raises(HashAlgoError, match="unknown"):
        BlockHashing("md5")
