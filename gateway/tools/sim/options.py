"""Command-line options that ``kvgate sim`` and ``kvgate replay`` share: the load time of
a block from a lower cache tier, whose default is scaled to each command's block size."""

from __future__ import annotations

from typing import Any

import typer

# What the defaults of ``timing.HOST_MS_PER_TOKEN`` and ``DISK_MS_PER_TOKEN`` stand for.
_TIERS = {
    "host memory": "an 8B model's KV over PCIe 4.0, 2.7 ms for 512 tokens",
    "disk": "from NVMe, 11 ms for 512 tokens",
}


def block_ms_option(tier: str, block_flag: str) -> Any:
    """The option of one block's load time from ``tier`` (host memory or disk), in ms."""
    return typer.Option(
        help=f"Loading one block from {tier}, in ms (default: {_TIERS[tier]}, scaled to "
        f"{block_flag}).",
        min=0,
    )
