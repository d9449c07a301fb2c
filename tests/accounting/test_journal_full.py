"""A journal on a full disk: a write cut short is taken back whole, and the recorder's
probe waits for room for records, not for one byte.

The disk is "full" through this process's own RLIMIT_FSIZE soft limit (Python ignores
SIGXFSZ, so a write past it fails with EFBIG, and one that crosses it is cut short).
"""

from __future__ import annotations

import asyncio
import errno
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.accounting.journal import Journal, JournalError, SyncMode, read_batch
from gateway.accounting.recorder import PROBE_LINE, Recorder
from gateway.db.session import make_engine
from tests.factories import record as make_record


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


async def test_the_probe_recovers_only_when_records_fit_again(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'kvgate.db'}")
    recorder = Recorder(engine=engine, journal_dir=tmp_path / "journal")
    recorder.journal.open()  # the journal alone: no writer, no database needed
    record = make_record()
    line = record.to_json()
    assert recorder.journal.path is not None
    room = recorder.journal.path.stat().st_size + len(line) // 2
    try:
        with file_size_limit(room):
            with pytest.raises(Exception, match="could not be kept"):
                await recorder.record(record)
            assert recorder.journal_healthy is False
            await asyncio.sleep(2.5)  # two probes: a byte would fit, a record does not
            assert recorder.journal_healthy is False
        await asyncio.sleep(1.5)
        assert recorder.journal_healthy is True
        await recorder.record(record)
    finally:
        if recorder._probe is not None:
            recorder._probe.cancel()
        recorder.journal.close()
        engine.dispose()
    assert recorder.journal.path.read_bytes() == PROBE_LINE + b"\n" + line + b"\n"
    lines, _ = read_batch(recorder.journal.path, 0, 10)
    assert lines == [line]  # the probe's blank line is skipped
