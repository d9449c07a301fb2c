"""A journal on a full disk: a write cut short is taken back whole.

The disk is "full" through this process's own RLIMIT_FSIZE soft limit (Python ignores
SIGXFSZ, so a write past it fails with EFBIG, and one that crosses it is cut short).
"""

from __future__ import annotations

import errno
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.accounting.journal import Journal, JournalError, SyncMode, read_batch


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize("sync", list(SyncMode))
async def test_a_write_cut_short_leaves_no_torn_line(tmp_path: Path, sync: SyncMode) -> None:
    journal = Journal(tmp_path, sync=sync)
    journal.open()
    assert journal.path is not None
    await journal.append(b'{"n": 1}')
    size = journal.path.stat().st_size
    with file_size_limit(size + 10), pytest.raises(JournalError) as failed:
        await journal.append(b'{"n": 2, "padding": "' + b"x" * 100 + b'"}')
    assert failed.value.errno == errno.EFBIG
    assert journal.path.stat().st_size == size  # the 10 bytes that fitted were taken back
    await journal.append(b'{"n": 3}')
    journal.close()
    lines, _ = read_batch(journal.path, 0, 10)
    assert lines == [b'{"n": 1}', b'{"n": 3}']
