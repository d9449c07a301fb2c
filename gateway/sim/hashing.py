"""vLLM's default prefix-cache block hashing, reproduced byte for byte but for the root.

vLLM (v1, ``prefix_caching_hash_algo="sha256"``) names a full block by
``sha256(pickle.dumps((parent_hash, block_token_ids, extra_keys), protocol=5))``,
where ``extra_keys`` is ``(cache_salt,)`` for the first block of a salted request and
``None`` otherwise, so the salt changes every hash of the chain. vLLM's root
(``NONE_HASH``) is random per process unless PYTHONHASHSEED is set; ours is fixed so that
hashes are stable across processes and runs.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

NONE_HASH = hashlib.sha256(b"kvgate-sim").digest()


def hash_block(
    parent: bytes, token_ids: tuple[int, ...], extra_keys: tuple[str, ...] | None
) -> bytes:
    """The hash of one full block, chained to its parent's hash."""
    # vLLM pickles with HIGHEST_PROTOCOL, 5 on every Python it runs on; pinned so that a
    # future protocol cannot change our hashes.
    payload = pickle.dumps((parent, token_ids, extra_keys), protocol=5)
    return hashlib.sha256(payload).digest()


def block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None = None
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids``, head first; a partial tail has none."""
    return extend_hashes([], token_ids, block_size, cache_salt)


def extend_hashes(
    known: Sequence[bytes], token_ids: Sequence[int], block_size: int, cache_salt: str | None
) -> list[bytes]:
    """The chain of ``token_ids`` given the hashes of its first ``len(known)`` blocks.

    Lets a sequence that grew (a prompt plus its output) hash only its new blocks.
    """
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    out = list(known)
    parent = out[-1] if out else NONE_HASH
    # vLLM treats an empty salt as no salt; the salt belongs to the first block only.
    extra_keys: tuple[str, ...] | None = (cache_salt,) if cache_salt and not out else None
    tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
    for start in range(len(out) * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash_block(parent, tokens[start : start + block_size], extra_keys)
        out.append(parent)
        extra_keys = None
    return out
