"""How long a simulated replica takes: shared by the live simulator and the offline replay.

Semantics, per replica:

- at most ``max_num_seqs`` sequences run at once; the rest wait in arrival order (FIFO);
- a running sequence first prefills its uncached prompt tokens, one prefill at a time in
  arrival order, taking ``uncached_tokens / prefill_tokens_per_s`` seconds;
- a cached block found in a lower tier (host memory, disk) is loaded instead of
  prefilled: ``cpu_block_ms`` / ``disk_block_ms`` per block, in the same queue as prefill
  (a transfer occupies the replica as the prefill it replaces would have);
- then each output token takes ``1 / decode_tokens_per_s`` seconds (a per-sequence rate:
  running sequences decode side by side, none slows the others).

A rate of 0 or infinity means instant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Large enough that no benchmark queues behind it, small enough for asyncio.Semaphore.
UNLIMITED_SEQS = 1 << 30
# Loading a block from a lower tier, per token of the block: an 8B model's KV is 128 KiB a
# token (a 512-token block 64 MiB), over PCIe 4.0 x16 at ~24 GB/s (2.7 ms for 512
# tokens) and from an NVMe drive at ~6 GB/s (11 ms).
HOST_MS_PER_TOKEN = 2.7 / 512
DISK_MS_PER_TOKEN = 11.0 / 512


def block_load_ms(given: float | None, per_token: float, block_tokens: int) -> float:
    """A block's load time from a lower tier: the one given, else per token x the block's."""
    return block_tokens * per_token if given is None else given


@dataclass(frozen=True, slots=True)
class TimingModel:
    """Prefill and decode rates and the concurrency limit of one replica."""

    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 40.0
    max_num_seqs: int = 64
    cpu_block_ms: float = 0.0  # loading one block from host memory
    disk_block_ms: float = 0.0  # loading one block from disk

    def __post_init__(self) -> None:
        if not self.prefill_tokens_per_s >= 0:
            raise ValueError("prefill_tokens_per_s must be 0 (instant) or positive")
        if not self.decode_tokens_per_s >= 0:
            raise ValueError("decode_tokens_per_s must be 0 (instant) or positive")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if not (self.cpu_block_ms >= 0 and self.disk_block_ms >= 0):
            raise ValueError("cpu_block_ms and disk_block_ms must be 0 or positive")

    @classmethod
    def zero(cls) -> TimingModel:
        """No delays and no queueing: for measuring the gateway's own overhead."""
        return cls(
            prefill_tokens_per_s=math.inf, decode_tokens_per_s=math.inf, max_num_seqs=UNLIMITED_SEQS
        )

    @property
    def instant_prefill(self) -> bool:
        """Whether prefill takes no time at all."""
        return _instant(self.prefill_tokens_per_s)

    @property
    def instant_decode(self) -> bool:
        """Whether output tokens take no time at all."""
        return _instant(self.decode_tokens_per_s)

    def prefill_seconds(self, uncached_tokens: int) -> float:
        """Seconds to prefill this many uncached prompt tokens."""
        if self.instant_prefill:
            return 0.0
        return uncached_tokens / self.prefill_tokens_per_s

    def fetch_seconds(self, blocks_by_tier: Sequence[int]) -> float:
        """Seconds to load cached blocks from the lower tiers; ``blocks_by_tier[0]`` (GPU
        memory) costs nothing, then host memory, then disk."""
        seconds = 0.0
        for tier, ms in ((1, self.cpu_block_ms), (2, self.disk_block_ms)):
            if tier < len(blocks_by_tier):
                seconds += blocks_by_tier[tier] * ms / 1000.0
        return seconds

    def decode_seconds(self, output_tokens: int) -> float:
        """Seconds to decode this many output tokens for one sequence."""
        if self.instant_decode:
            return 0.0
        return output_tokens / self.decode_tokens_per_s


def _instant(rate: float) -> bool:
    return rate == 0 or math.isinf(rate)
