"""Two ways to fill the journal's disk under a running gateway.

We run as root, so file permissions would not stop a write. ``FileSizeLimit`` lowers the
gateway's RLIMIT_FSIZE (``prlimit``; Python ignores SIGXFSZ, so a write past it fails with
EFBIG, and one that crosses it is cut short). ``SmallFilesystem`` puts the journal on a
tmpfs of its own and fills it with a file (ENOSPC, the real thing); it needs the right to
mount, which a container may not have, and skips without it.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from gateway.accounting.journal import segments


class FileSizeLimit:
    """The gateway may not grow its journal's segment past its current size, nearly."""

    def __init__(self, tmp: Path) -> None:
        self.journal_dir = tmp / "journal"

    def fill(self, gateway_pid: int) -> None:
        # A few hundred bytes of room: the next groups are cut short mid-record.
        size = max(p.stat().st_size for p in segments(self.journal_dir))
        _limit_file_size(gateway_pid, size + 700)

    def free(self, gateway_pid: int) -> None:
        _limit_file_size(gateway_pid, "unlimited")

    def close(self) -> None:
        pass


def _limit_file_size(pid: int, limit: int | str) -> None:
    """Set the soft limit only: raising a hard limit again needs CAP_SYS_RESOURCE."""
    subprocess.run(["prlimit", "--pid", str(pid), f"--fsize={limit}:unlimited"], check=True)


class SmallFilesystem:
    """An 8 MiB tmpfs for the journal; a filler file takes every free page."""

    def __init__(self, tmp: Path) -> None:
        self.mountpoint = tmp / "journal-fs"
        self.mountpoint.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(self.mountpoint)],
            capture_output=True,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode()}")
        self.journal_dir = self.mountpoint / "journal"
        self.filler = self.mountpoint / "filler"

    def fill(self, gateway_pid: int) -> None:
        # Whole pages go; the journal's last page keeps its free tail, so the next group
        # fills that and is cut short mid-record.
        with open(self.filler, "wb", buffering=0) as handle:
            for size in (1 << 16, 1 << 12, 1):
                with contextlib.suppress(OSError):
                    while True:
                        handle.write(b"\0" * size)

    def free(self, gateway_pid: int) -> None:
        self.filler.unlink()

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
