"""vLLM's prefix-cache block hashes, byte for byte (vLLM 0.32, ``vllm/v1/core/kv_cache_utils.py``).

A full block of ``block_size`` tokens is named ``H((parent, tokens, extra_keys))`` where
``H`` is the replica's ``prefix_caching_hash_algo``:

- ``sha256``: sha256 of ``pickle.dumps(value, protocol=HIGHEST_PROTOCOL)`` (5 on Python
  3.8+, pinned here so that a future protocol cannot change our hashes);
- ``sha256_cbor``: sha256 of ``cbor2.dumps(value, canonical=True)``;
- ``xxhash`` / ``xxhash_cbor``: xxh3-128 of the same serialisations.

``parent`` of the first block is ``NONE_HASH = H(seed)``, the seed being ``PYTHONHASHSEED``
when the replica runs with it set, else the fixed ``"vllm-none-hash"`` for the sha256
algorithms; the xxhash algorithms take a random per-process seed unless PYTHONHASHSEED is
set, so they can only be reproduced with a seed given here. ``tokens`` is a tuple of ints;
``extra_keys`` is ``None`` or a tuple of tagged keys, of which a gateway sees only the
salt: ``(("cache_salt", salt),)`` on the first block of a salted request (an empty salt is
no salt). KV events and this module name a block by the low 64 bits of its digest read
big-endian (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default).
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import xxhash

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_LOW64 = (1 << 64) - 1


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


def _cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


_DIGESTS: dict[str, Callable[[Any], bytes]] = {
    "sha256": lambda value: hashlib.sha256(_pickled(value)).digest(),
    "sha256_cbor": lambda value: hashlib.sha256(_cbor(value)).digest(),
    "xxhash": lambda value: xxhash.xxh3_128_digest(_pickled(value)),
    "xxhash_cbor": lambda value: xxhash.xxh3_128_digest(_cbor(value)),
}


class HashAlgoError(ValueError):
    """A hash algorithm that cannot be reproduced outside the replica."""


@dataclass(frozen=True, slots=True)
class BlockHashing:
    """One replica's block-hash function: algorithm and NONE_HASH seed."""

    algo: str = "sha256"
    # The replica's PYTHONHASHSEED, when it runs with one set.
    seed: str | None = None
    none_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.algo not in _DIGESTS:
            raise HashAlgoError(f"unknown prefix caching hash algo {self.algo!r}")
        if self.algo.startswith("xxhash") and self.seed is None:
            raise HashAlgoError(
                f"{self.algo} seeds every vLLM process at random unless PYTHONHASHSEED is "
                "set; give the replicas' PYTHONHASHSEED, or use sha256"
            )
        seed = DEFAULT_NONE_HASH_SEED if self.seed is None else self.seed
        object.__setattr__(self, "none_hash", _DIGESTS[self.algo](seed))

    def digest(self, parent: bytes | None, tokens: tuple[int, ...], extra_keys: Any) -> bytes:
        """The digest of one full block (vLLM's ``hash_block_tokens``)."""
        value = (parent or self.none_hash, tokens, extra_keys)
        return _DIGESTS[self.algo](value)

    def chain(
        self,
        token_ids: Sequence[int],
        block_size: int,
        cache_salt: str | None = None,
        *,
        known: Sequence[bytes] = (),
    ) -> list[bytes]:
        """Digests of the full blocks of ``token_ids``, head first, given the first ``known``."""
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        out = list(known)
        parent = out[-1] if out else None
        # Ids kept as machine words (`TokenIds`) become ints a block at a time, not all at once.
        words = isinstance(token_ids, array)
        tokens = token_ids if words or isinstance(token_ids, tuple) else tuple(token_ids)
        digest = _DIGESTS[self.algo]
        none_hash = self.none_hash
        for start in range(len(out) * block_size, len(tokens) - block_size + 1, block_size):
            extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
            block = tokens[start : start + block_size]
            parent = digest((parent or none_hash, tuple(block) if words else block, extra))
            out.append(parent)
        return out

    def keys(
        self, token_ids: Sequence[int], block_size: int, cache_salt: str | None = None
    ) -> list[int]:
        """The blocks' names as KV events carry them (low 64 bits, big-endian)."""
        return [external(d) for d in self.chain(token_ids, block_size, cache_salt)]


def external(digest: bytes) -> int:
    """A block digest as vLLM's KV events name it: its low 64 bits read big-endian."""
    return int.from_bytes(digest, "big") & _LOW64
