"""Cache tiers: where a replica keeps a cached block, and what a hit there is worth.

vLLM keeps prefix-cache blocks in GPU memory; its offloading connectors move them to
host memory and beyond, and every tier's KV events name it (``medium``: vLLM 0.32's
``MEDIUM_GPU`` "GPU", ``MEDIUM_CPU`` "CPU", ``MEDIUM_STORAGE`` "STORAGE"). Its metrics
name the same tiers as sources of cached tokens (``vllm:prompt_tokens_cached_by_source``
with ``source`` = "device", "host", "disk").

A block found in a slower tier still saves its prefill, but it costs a transfer: routing
credits a matched block with its tier's weight,

    weight = 1 - fetch time of one block from the tier / prefill time of one block

so a GPU block saves a block of prefill in full, a CPU block nearly so, a disk block
less. `TierWeights` holds a deployment's weights; the defaults were measured
(benchmarks/routing_tiers.py, results in benchmarks/README.md), and `weight` derives one
from a fetch and a prefill time, which is how replay sets them from its timing model.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU, CPU, STORAGE = "GPU", "CPU", "STORAGE"
MEDIA = (GPU, CPU, STORAGE)  # fastest first: the order blocks are offloaded in
# vLLM's CacheHitSource value for each medium (the metrics' ``source`` label).
SOURCES = {GPU: "device", CPU: "host", STORAGE: "disk"}


def medium_rank(medium: str | None) -> int:
    """0 for GPU (or an event that names no medium: vLLM's GPU cache), 1 CPU, 2 storage;
    an unknown medium ranks as storage (slowest known)."""
    if medium is None or medium == GPU:
        return 0
    if medium == CPU:
        return 1
    return 2


def weight(fetch_s: float, prefill_s: float) -> float:
    """A tier's weight from one block's fetch time and its prefill time (0 when fetching
    costs as much as recomputing, or more)."""
    if prefill_s <= 0:
        return 0.0
    return max(0.0, min(1.0, 1.0 - fetch_s / prefill_s))


@dataclass(frozen=True, slots=True)
class TierWeights:
    """What a matched block in each tier saves, as a share of its prefill."""

    # Measured with benchmarks/routing_tiers.py (see benchmarks/README.md): 0.947 and
    # 0.781-0.785 for 512-token blocks of an 8B model over PCIe 4.0 and from NVMe.
    cpu: float = 0.95
    storage: float = 0.78

    def __post_init__(self) -> None:
        for name in ("cpu", "storage"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"tier weight {name} must be within [0, 1], got {value}")

    def by_rank(self) -> tuple[float, float, float]:
        """Weights indexed by `medium_rank`."""
        return (1.0, self.cpu, self.storage)


DEFAULT_TIER_WEIGHTS = TierWeights()
