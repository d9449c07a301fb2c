"""vLLM's default prefix-cache block hashing (vLLM 0.32, ``prefix_caching_hash_algo=sha256``).

A full block is named ``sha256(pickle.dumps((parent_hash, block_token_ids, extra_keys),
protocol=5))``; ``extra_keys`` is ``(("cache_salt", salt),)`` on the first block of a
salted request and ``None`` otherwise, so the salt changes every hash of the chain; the
first block's parent is ``NONE_HASH = sha256(pickle.dumps("vllm-none-hash"))``, as in every
vLLM process started without PYTHONHASHSEED. The arithmetic lives in
`gateway.routing.vllm_blocks`, shared with the gateway's exact mode, so a simulated
replica's blocks and KV events carry the very names a real replica's would.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.vllm_blocks import BlockHashing

_SHA256 = BlockHashing("sha256")
NONE_HASH = _SHA256.none_hash


def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids``, head first; a partial tail has none."""
    return _SHA256.chain(token_ids, block_size, cache_salt)


def extend_hashes(
    known: Sequence[bytes], token_ids: Sequence[int], block_size: int, cache_salt: str | None
) -> list[bytes]:
    """The chain of ``token_ids`` given the hashes of its first ``len(known)`` blocks.

    Lets a sequence that grew (a prompt plus its output) hash only its new blocks.
    """
    return _SHA256.chain(token_ids, block_size, cache_salt, known=known)
