"""The recorder: durable journal first, database in batches, replay after a crash."""

import asyncio
import os
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.accounting.journal import Journal, JournalError, SyncMode, segments
from gateway.accounting.recorder import Recorder, insert_records, wait_until
from gateway.db.migrate import upgrade
from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from gateway.usage import Usage
from tests.factories import record as make_record


def count_rows(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(RequestRow)) or 0)


async def test_concurrent_records_share_journal_writes(tmp_path: Path) -> None:
    journal = Journal(tmp_path, sync=SyncMode.ALWAYS)
    journal.open()
    writes = 0
    original = journal._write

    def counting(data: bytes) -> None:
        nonlocal writes
        writes += 1
        original(data)

    journal._write = counting  # type: ignore[method-assign]
    await asyncio.gather(*(journal.append(b'{"n": %d}' % n) for n in range(200)))
    journal.close()
    assert journal.path is not None
    lines = journal.path.read_bytes().splitlines()
    assert sorted(lines) == sorted(b'{"n": %d}' % n for n in range(200))
    assert writes < 20  # grouped, not one write per record


async def test_background_mode_returns_after_the_write_and_flushes_right_after(
    tmp_path: Path,
) -> None:
    """The record is in the file when append returns (a process crash cannot lose it), and
    the sync thread flushes it without the caller waiting."""
    journal = Journal(tmp_path, sync=SyncMode.BACKGROUND)
    journal.open()
    flushes = 0
    original = journal._sync_now

    def counting() -> None:
        nonlocal flushes
        flushes += 1
        original()

    journal._sync_now = counting  # type: ignore[method-assign]
    await journal.append(b'{"n": 1}')
    assert journal.path is not None and journal.path.read_bytes() == b'{"n": 1}\n'
    lag = 0.0
    for _ in range(1000):
        lag = journal.take_sync_lag()  # set once the flush has returned
        if lag:
            break
        await asyncio.sleep(0.005)
    assert flushes == 1 and 0 < lag < 1.0
    assert journal.take_sync_lag() == 0.0  # reset by the read
    journal.close()


async def test_background_flushes_at_most_once_per_window_however_many_records(
    tmp_path: Path,
) -> None:
    """The sync thread is woken by the first write after a flush only: 300 records written
    over about three windows cost a handful of flushes, not 300, and none waits longer
    than its window (plus the flush) to reach the disk."""
    journal = Journal(tmp_path, sync=SyncMode.BACKGROUND, sync_interval_s=0.05)
    journal.open()
    flushes = 0
    original = journal._sync_now

    def counting() -> None:
        nonlocal flushes
        flushes += 1
        original()

    journal._sync_now = counting  # type: ignore[method-assign]
    for n in range(300):
        await journal.append(b'{"n": %d}' % n)
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.2)  # the last window closes, and its flush runs
    lag = journal.take_sync_lag()
    journal.close()
    assert journal.path is not None
    assert journal.path.read_bytes().count(b"\n") == 300
    assert 2 <= flushes <= 12
    assert 0 < lag < 0.05 + 0.1


async def test_a_failed_background_flush_refuses_appends_until_a_flush_succeeds(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, sync=SyncMode.BACKGROUND)
    journal.open()

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    journal._sync_now = full_disk  # type: ignore[method-assign]
    await journal.append(b'{"n": 1}')
    for _ in range(1000):
        try:
            await journal.append(b'{"n": 2}')
        except JournalError as exc:
            assert exc.errno == 28 and "journal flush failed" in str(exc)
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError("the failed flush never reached append")
    with pytest.raises(JournalError):  # still full: still refused
        await journal.append(b'{"n": 3}')
    del journal._sync_now  # the disk takes flushes again
    await journal.append(b'{"n": 4}')
    journal.close()
    assert journal.path is not None
    lines = journal.path.read_bytes().splitlines()
    # Appends made before the failure was seen were written; the refused one was not.
    assert lines[0] == b'{"n": 1}' and lines[-1] == b'{"n": 4}' and b'{"n": 3}' not in lines


async def test_records_reach_the_database_and_the_journal_is_emptied(
    database_url: str, tmp_path: Path
) -> None:
    engine = make_engine(database_url)
    recorder = Recorder(engine=engine, journal_dir=tmp_path, flush_interval_s=0.02, batch_size=7)
    recorder.start()
    await asyncio.gather(*(recorder.record(make_record(f"req_{n}")) for n in range(50)))
    assert await asyncio.to_thread(wait_until, lambda: count_rows(engine) == 50, 10)
    await recorder.stop()
    assert recorder.stats.written == 50 and recorder.backlog == 0
    assert segments(tmp_path) == []
    engine.dispose()


async def test_a_dead_process_segment_is_replayed_once_and_a_torn_line_dropped(
    database_url: str, tmp_path: Path
) -> None:
    orphan = tmp_path / "999999-000001.jsonl"
    lines = [make_record(f"req_{n}").to_json() for n in range(10)]
    orphan.write_bytes(b"\n".join(lines) + b"\n" + lines[0][:40])  # torn by the crash
    engine = make_engine(database_url)
    insert_records(engine, [make_record("req_3")])  # already written before the crash
    recorder = Recorder(engine=engine, journal_dir=tmp_path, flush_interval_s=0.02)
    recorder.start()
    assert await asyncio.to_thread(wait_until, lambda: not orphan.exists(), 10)
    await recorder.stop()
    assert count_rows(engine) == 10
    assert recorder.stats.replayed == 10
    engine.dispose()


async def test_a_live_process_segment_is_left_alone(database_url: str, tmp_path: Path) -> None:
    other = Journal(tmp_path, sync=SyncMode.NEVER)
    other.open()  # holds the flock, like a live gateway worker
    await other.append(make_record("req_live").to_json())
    assert other.path is not None and other.path.name.startswith(f"{os.getpid()}-")
    assert other.path.name.startswith(other.prefix)
    # Pretend it belongs to another process: rename keeps the lock on the open file.
    foreign = tmp_path / "888888-000001.jsonl"
    other.path.rename(foreign)
    engine = make_engine(database_url)
    recorder = Recorder(engine=engine, journal_dir=tmp_path / "own", flush_interval_s=0.02)
    recorder.journal.directory = tmp_path
    recorder.start()
    await asyncio.sleep(0.3)
    assert foreign.exists() and count_rows(engine) == 0
    other.close()  # the process "dies": its lock goes
    assert await asyncio.to_thread(wait_until, lambda: count_rows(engine) == 1, 10)
    await recorder.stop()
    engine.dispose()


async def test_records_wait_in_the_journal_while_the_database_is_down(tmp_path: Path) -> None:
    database_dir = tmp_path / "db-not-there-yet"
    url = f"sqlite:///{database_dir / 'kvgate.db'}"
    engine = make_engine(url)
    recorder = Recorder(engine=engine, journal_dir=tmp_path / "journal", flush_interval_s=0.02)
    recorder.start()
    await asyncio.gather(*(recorder.record(make_record(f"req_{n}")) for n in range(20)))
    assert await asyncio.to_thread(wait_until, lambda: recorder.stats.db_errors > 0, 5)
    assert not recorder.stats.db_healthy and recorder.backlog == 20
    database_dir.mkdir()
    upgrade(url)  # the database comes back
    assert await asyncio.to_thread(wait_until, lambda: recorder.backlog == 0, 15)
    await recorder.stop()
    assert recorder.stats.db_healthy and count_rows(engine) == 20
    engine.dispose()


async def test_stop_leaves_what_it_could_not_write_for_the_next_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'kvgate.db'}"
    engine = make_engine(url)
    recorder = Recorder(engine=engine, journal_dir=tmp_path / "journal", flush_interval_s=0.02)
    recorder.start()
    await recorder.record(make_record("req_kept"))
    await recorder.stop(timeout_s=0.5)
    engine.dispose()
    assert [p.stat().st_size > 0 for p in segments(tmp_path / "journal")] == [True]
    (tmp_path / "missing").mkdir()
    upgrade(url)
    engine = make_engine(url)
    again = Recorder(engine=engine, journal_dir=tmp_path / "journal", flush_interval_s=0.02)
    again.start()
    assert await asyncio.to_thread(wait_until, lambda: count_rows(engine) == 1, 10)
    await again.stop()
    engine.dispose()


async def test_a_writer_process_drains_the_journal_and_stops_with_the_recorder(
    database_url: str, tmp_path: Path
) -> None:
    engine = make_engine(database_url)
    recorder = Recorder(
        engine=engine,
        journal_dir=tmp_path,
        flush_interval_s=0.02,
        batch_size=7,
        database_url=database_url,
        process=True,
    )
    recorder.start()
    await asyncio.gather(*(recorder.record(make_record(f"req_{n}")) for n in range(40)))
    # The writer counts a batch once its transaction has committed: wait for both.
    assert await asyncio.to_thread(
        wait_until, lambda: count_rows(engine) == 40 and recorder.stats.written == 40, 20
    )
    assert recorder.backlog == 0
    await recorder.record(make_record("req_last"))
    await recorder.stop()
    assert not recorder._worker.is_alive()  # type: ignore[union-attr]
    assert count_rows(engine) == 41  # the final pass drained what came last
    assert segments(tmp_path) == []
    engine.dispose()


async def test_a_writer_process_waits_out_a_database_outage(tmp_path: Path) -> None:
    database_dir = tmp_path / "db-not-there-yet"
    url = f"sqlite:///{database_dir / 'kvgate.db'}"
    engine = make_engine(url)
    recorder = Recorder(
        engine=engine,
        journal_dir=tmp_path / "journal",
        flush_interval_s=0.02,
        database_url=url,
        process=True,
    )
    recorder.start()
    await asyncio.gather(*(recorder.record(make_record(f"req_{n}")) for n in range(20)))
    assert await asyncio.to_thread(wait_until, lambda: recorder.stats.db_errors > 0, 20)
    assert not recorder.stats.db_healthy and recorder.backlog == 20
    database_dir.mkdir()
    upgrade(url)
    assert await asyncio.to_thread(wait_until, lambda: recorder.backlog == 0, 20)
    await recorder.stop()
    assert recorder.stats.db_healthy and count_rows(engine) == 20
    engine.dispose()


async def test_a_writer_process_stops_on_repeated_sigterm(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM (from the gateway's death, and from a supervisor) never deadlocks the writer."""
    import signal as signals

    engine = make_engine(database_url)
    recorder = Recorder(
        engine=engine,
        journal_dir=tmp_path,
        flush_interval_s=0.05,
        database_url=database_url,
        process=True,
    )
    recorder.start()
    await recorder.record(make_record("req_term"))
    assert await asyncio.to_thread(wait_until, lambda: count_rows(engine) == 1, 20)
    worker = recorder._worker
    assert worker is not None and worker.pid is not None
    for _ in range(5):
        os.kill(worker.pid, signals.SIGTERM)
    await asyncio.to_thread(worker.join, 10)
    assert not worker.is_alive()
    recorder.journal.close()
    engine.dispose()


async def test_a_record_the_database_refuses_is_set_aside_and_the_rest_still_written(
    database_url: str, tmp_path: Path
) -> None:
    """A token count no integer column holds (Postgres: DataError; SQLite: OverflowError)
    must not stop the writer: the batch's other records are written, the refused one is kept
    in <journal>/rejected/ and counted, and the database is not reported down."""
    engine = make_engine(database_url)
    recorder = Recorder(engine=engine, journal_dir=tmp_path, flush_interval_s=0.02)
    recorder.start()
    huge = make_record("req_huge", usage=Usage(2**63, 0, 0, 1))
    await asyncio.gather(
        recorder.record(make_record("req_before")),
        recorder.record(huge),
        recorder.record(make_record("req_after")),
    )
    assert await asyncio.to_thread(wait_until, lambda: recorder.stats.rejected == 1, 10)
    await recorder.record(make_record("req_later"))
    assert await asyncio.to_thread(wait_until, lambda: count_rows(engine) == 3, 10)
    await recorder.stop()
    assert recorder.stats.db_healthy and recorder.backlog == 0
    [kept] = (tmp_path / "rejected").glob("*.jsonl")
    assert kept.read_bytes() == huge.to_json() + b"\n"
    with engine.connect() as connection:
        ids = set(connection.scalars(select(RequestRow.request_id)))
    assert ids == {"req_before", "req_after", "req_later"}
    engine.dispose()


def test_a_batch_keeps_every_value_exactly_and_skips_request_ids_already_there(
    database_url: str,
) -> None:
    """The batch insert (arrays on Postgres) round-trips text that array syntax would
    mangle, NULLs, money and times, and leaves a replayed request id's row alone."""
    engine = make_engine(database_url)
    nasty = "a \"quoted\" {brace}, comma\\backslash\nNULL 'single' é 🙂"
    first = make_record("req_a", error=nasty, interaction_id=nasty, finish_reason="stop")
    second = make_record("req_b")  # finish_reason, error, first_token_at: NULL
    insert_records(engine, [first, second])
    insert_records(engine, [make_record("req_a", error="a replay must not change the row")])
    with engine.connect() as connection:
        table = RequestRow.__table__
        rows = connection.execute(select(table).order_by(table.c.request_id)).all()
        got = [(r.request_id, r.error, r.interaction_id, r.finish_reason) for r in rows]
        b = rows[1]
    assert got == [("req_a", nasty, nasty, "stop"), ("req_b", None, "req_b", None)]
    assert b.first_token_at is None and b.started_at == second.started_at
    assert b.cost_total == Decimal("0.000055260") == second.cost.total
    assert (b.uncached_tokens, b.cache_read_tokens, b.output_tokens) == (176, 1024, 30)
    engine.dispose()
