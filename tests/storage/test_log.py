"""The segmented log: group commit, rollover, truncation, recovery, faults, and the threading contract."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hutch.storage import records
from hutch.storage.errors import CorruptRecord, LogFailed, NoSpaceError, StorageError
from hutch.storage.fs import RealFS
from hutch.storage.log import LogOptions, SegmentedLog, encode_batch, segment_name
from hutch.storage.memfs import FaultyFS, MemoryFS

from .helpers import DIR, SMALL, entries, memory_log, open_log, read_all

# -- basics -----------------------------------------------------------------------------------------------


def test_append_sync_read_round_trip() -> None:
    fs, log = memory_log()
    assert log.append(entries(1, 3)) == 3
    assert log.append([]) == 3
    assert log.append([b""]) == 4
    assert (log.last_seq, log.synced_seq, log.pending_count) == (4, 0, 4)
    assert log.sync() == 4
    assert list(log.read_from(1)) == list(zip(range(1, 5), entries(1, 3) + [b""], strict=True))
    assert [seq for seq, _ in log.read_from(3)] == [3, 4]
    assert list(log.read_from(5)) == []


def test_first_seq_numbers_a_new_log() -> None:
    fs = MemoryFS()
    log = open_log(fs, first_seq=100)
    assert (log.first_seq, log.last_seq) == (100, 99)
    log.append(entries(0, 2))
    log.sync()
    assert [seq for seq, _ in log.read_from(100)] == [100, 101]
    log.close()
    assert open_log(fs).last_seq == 101  # the files now say where the log is


def test_one_fdatasync_per_batch() -> None:
    fs = MemoryFS()
    log = open_log(fs, LogOptions())
    for i in range(1000):
        log.append([b"m%d" % i])
    syncs_before = fs.stats.syncs
    job = log.begin_sync()
    assert job is not None and (job.first_seq, job.last_seq) == (1, 1000)
    job.run()
    assert job.complete() == 1000
    assert fs.stats.syncs - syncs_before == 1
    assert fs.stats.writes == 1
    assert log.begin_sync() is None


def test_max_batch_bytes_splits_a_large_backlog_into_several_syncs() -> None:
    fs, log = memory_log(options=LogOptions(max_batch_bytes=1000))
    log.append([b"x" * 96] * 50)  # 100 bytes each with the length prefix -> 10 per batch
    job = log.begin_sync()
    assert job is not None and job.last_seq == 10
    job.run()
    job.complete()
    assert log.sync() == 50
    assert read_all(log) == [b"x" * 96] * 50
    # An entry larger than a batch goes alone.
    log.append([b"y" * 5000, b"z"])
    job = log.begin_sync()
    assert job is not None and job.last_seq == job.first_seq
    job.run()
    job.complete()
    log.sync()
    assert read_all(log)[-2:] == [b"y" * 5000, b"z"]


def test_entry_size_limit() -> None:
    _, log = memory_log(options=LogOptions(max_entry_bytes=10))
    with pytest.raises(ValueError, match="max_entry_bytes"):
        log.append([b"ok", b"x" * 11])
    assert log.last_seq == 0  # all or nothing


def test_invalid_options() -> None:
    with pytest.raises(ValueError):
        LogOptions(max_batch_bytes=0)
    with pytest.raises(ValueError):
        LogOptions(max_entry_bytes=1 << 30)
    with pytest.raises(ValueError):
        LogOptions(segment_max_bytes=0)


# -- the threading contract -------------------------------------------------------------------------------


def test_appends_during_a_sync_join_the_next_batch() -> None:
    _, log = memory_log()
    log.append(entries(1, 2))
    job = log.begin_sync()
    assert job is not None
    log.append(entries(3, 2))  # while the job is "in flight"
    with pytest.raises(RuntimeError, match="in flight"):
        log.begin_sync()
    with pytest.raises(RuntimeError):
        job.complete()  # before run()
    assert read_all(log) == []
    assert read_all(log, include_unsynced=True) == entries(1, 4)
    job.run()
    assert log.synced_seq == 0  # only complete() advances it
    assert job.complete() == 2
    with pytest.raises(RuntimeError):
        job.complete()
    assert read_all(log) == entries(1, 2)
    assert log.sync() == 4
    assert read_all(log) == entries(1, 4)


def test_run_in_an_executor_thread_while_the_loop_thread_appends() -> None:
    fs = MemoryFS()
    log = open_log(fs, LogOptions(segment_max_bytes=4096, max_batch_bytes=2048))
    expected: list[bytes] = []
    jobs = 0
    with ThreadPoolExecutor(1) as pool:
        future = None
        job = None
        for i in range(300):
            batch = entries(10 * i, 10)
            log.append(batch)
            expected += batch
            if future is not None and future.done():
                future.result()
                assert job is not None
                job.complete()
                future = None
            if future is None and (job := log.begin_sync()) is not None:
                jobs += 1
                future = pool.submit(job.run)
            if i % 50 == 0:  # reads on the loop thread while a job may be writing
                assert read_all(log) == expected[: log.synced_seq]
        if future is not None:
            future.result()
            assert job is not None
            job.complete()
    log.sync()
    assert read_all(log) == expected
    assert len(log.segments()) > 1
    assert jobs > 1
    assert fs.stats.syncs < len(expected) / 5  # one fdatasync per job, never one per entry


# -- segments ---------------------------------------------------------------------------------------------


def test_rollover_names_segments_by_first_seq_and_respects_the_size_limit() -> None:
    fs, log = memory_log()
    for i in range(20):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    segs = log.segments()
    assert len(segs) > 3
    assert fs.list_dir(DIR) == [segment_name(s.first_seq) for s in segs]
    for a, b in zip(segs, segs[1:], strict=False):
        assert a.last_seq + 1 == b.first_seq
        assert a.size <= SMALL.segment_max_bytes
    assert all(fs.size(s.path) == s.size for s in segs)
    assert read_all(log) == entries(1, 100)


def test_truncate_before_deletes_whole_old_segments_only() -> None:
    fs, log = memory_log()
    for i in range(20):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    segs = log.segments()
    target = segs[2].first_seq + 1  # inside the third segment
    assert log.truncate_before(target) == 2
    assert log.first_seq == segs[2].first_seq
    assert [payload for _, payload in log.read_from(target)] == entries(target, 101 - target)
    with pytest.raises(ValueError, match="truncated"):
        list(log.read_from(segs[2].first_seq - 1))
    assert log.truncate_before(0) == 0
    assert log.truncate_before(10**9) == len(segs) - 3  # everything but the last segment
    assert log.segments()[0].path == segs[-1].path
    fs.crash()
    reopened = open_log(fs)
    assert reopened.first_seq == segs[-1].first_seq and reopened.last_seq == 100


def test_split_truncate_job_forgets_first_and_deletes_later() -> None:
    fs, log = memory_log()
    for i in range(10):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    first_path = log.segments()[0].path
    job = log.begin_truncate_before(log.segments()[1].first_seq)
    assert log.first_seq == log.segments()[0].first_seq != 1
    assert fs.exists(first_path)
    job.run()
    assert not fs.exists(first_path)


# -- reopening and crashes --------------------------------------------------------------------------------


def test_reopen_after_close_reads_everything_and_continues_numbering() -> None:
    fs, log = memory_log()
    log.append(entries(1, 30))
    log.sync()
    log.append(entries(31, 5))  # never synced: close drops it
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.append([b"x"])
    log = open_log(fs)
    assert log.recovery.torn_tail is None and log.recovery.last_seq == 30
    assert read_all(log) == entries(1, 30)
    assert log.append([b"next"]) == 31


def test_a_crash_loses_unsynced_entries_and_never_synced_ones() -> None:
    for seed in range(30):
        fs, log = memory_log(seed)
        log.append(entries(1, 40))
        log.sync()
        log.append(entries(41, 10))
        job = log.begin_sync()
        assert job is not None
        if seed % 2:
            job.run()  # written and synced but not completed: may or may not count, both are fine
        fs.crash()
        log = open_log(fs)
        got = read_all(log)
        assert got[:40] == entries(1, 40)
        assert got == entries(1, len(got))  # a prefix of what was appended, nothing else
        if seed % 2:
            assert len(got) >= job.last_seq  # its fdatasync returned: the batch is durable


def _write_unsynced_batch(fs: MemoryFS, log: SegmentedLog, batch: list[bytes]) -> bytes:
    """Put a batch in the last segment as a sync would, minus the fdatasync."""
    data = encode_batch(log.synced_seq + 1, batch)
    fs.open_append(log.segments()[-1].path).write(data)
    return data


def test_torn_last_record_at_every_byte_offset_recovers_to_the_previous_boundary() -> None:
    fs0, log0 = memory_log(options=LogOptions())
    log0.append(entries(1, 10))
    log0.sync()
    boundary = log0.segments()[-1].size
    record = encode_batch(11, entries(11, 3))
    for keep in range(len(record) + 1):
        fs, log = memory_log(options=LogOptions())
        log.append(entries(1, 10))
        log.sync()
        _write_unsynced_batch(fs, log, entries(11, 3))
        fs.crash(torn_bytes=keep)
        log = open_log(fs, LogOptions())
        path = log.segments()[-1].path
        if keep == len(record):
            assert read_all(log) == entries(1, 13)
            continue
        assert read_all(log) == entries(1, 10), keep
        assert fs.size(path) == boundary
        report = log.recovery
        assert (report.torn_tail is None) == (keep == 0)
        if keep:
            assert report.torn_tail is not None and report.torn_segment == path
            assert report.torn_tail.offset == boundary and report.torn_tail.dropped_bytes == keep
        log.append([b"after"])
        log.sync()
        assert read_all(open_log(fs, LogOptions())) == entries(1, 10) + [b"after"]


def test_out_of_order_persistence_of_the_unsynced_record_is_a_torn_tail() -> None:
    """A power cut may persist a later page of an unsynced write without an earlier one."""
    fs, log = memory_log(options=LogOptions())
    log.append(entries(1, 5))
    log.sync()
    record = _write_unsynced_batch(fs, log, entries(6, 50, size=64))
    path = log.segments()[-1].path
    fs.crash(torn_bytes=len(record))
    size = fs.size(path)
    for hole in range(size - len(record), size, 97):  # zero out one 512-byte "page" of it
        damaged = MemoryFS()
        damaged.make_dirs(DIR)
        data = bytearray(fs.read(path))
        data[hole:hole + 512] = bytes(len(data[hole:hole + 512]))
        h = damaged.open_append(path)
        h.write(bytes(data))
        h.sync()
        assert read_all(open_log(damaged, LogOptions())) == entries(1, 5)


def test_crash_during_rollover_deletes_the_empty_new_segment() -> None:
    fs, log = memory_log()
    log.append(entries(1, 20))
    log.sync()
    new_path = f"{DIR}/{segment_name(21)}"
    h = fs.open_append(new_path)
    fs.fsync_dir(DIR)
    h.write(encode_batch(21, entries(21, 2)))
    fs.crash(torn_bytes=5)
    log = open_log(fs)
    assert log.recovery.deleted_empty_segment == new_path
    assert not fs.exists(new_path)
    assert log.last_seq == 20
    log.append(entries(21, 2))
    log.sync()
    assert read_all(open_log(fs)) == entries(1, 22)


def test_only_segment_torn_away_keeps_its_numbering() -> None:
    fs = MemoryFS()
    fs.make_dirs(DIR)
    h = fs.open_append(f"{DIR}/{segment_name(500)}")
    fs.fsync_dir(DIR)
    h.write(b"\x05\x00")
    h.sync()
    log = open_log(fs)
    assert log.recovery.deleted_empty_segment is not None
    assert log.append([b"x"]) == 500


def test_bit_flip_in_the_middle_of_the_last_segment_raises_at_open() -> None:
    fs, log = memory_log(options=LogOptions())
    for i in range(5):
        log.append(entries(10 * i + 1, 10))
        log.sync()
    path = log.segments()[-1].path
    faulty = FaultyFS(fs, seed=1)
    first_records_end = records.scan(fs.read(path)).records[-1].offset
    for bit in range(0, first_records_end * 8, 37):
        fs.poke(path, bit // 8, 1 << (bit % 8))
        with pytest.raises(CorruptRecord) as info:
            open_log(faulty, LogOptions())
        assert info.value.file == path
        fs.poke(path, bit // 8, 1 << (bit % 8))  # repair
    assert read_all(open_log(fs, LogOptions())) == entries(1, 50)


def test_corruption_in_an_older_segment_raises_on_read_or_at_open_with_verify_all() -> None:
    fs, log = memory_log()
    for i in range(20):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    old = log.segments()[1]
    fs.poke(old.path, old.size // 2)
    log = open_log(fs)  # only the last segment is verified at open
    assert list(log.read_from(log.segments()[-1].first_seq))  # reads past the damage are fine
    with pytest.raises(CorruptRecord) as info:
        read_all(log)
    assert info.value.file == old.path
    with pytest.raises(CorruptRecord):
        open_log(fs, LogOptions(segment_max_bytes=256, max_batch_bytes=100, verify_all_on_open=True))


def test_a_segment_whose_contents_do_not_match_its_name_is_corrupt() -> None:
    fs, log = memory_log()
    for i in range(6):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    last = log.segments()[-1]
    fs.rename(last.path, f"{DIR}/{segment_name(last.first_seq + 1)}")
    with pytest.raises(CorruptRecord, match="expected"):
        open_log(fs)


def test_a_missing_middle_segment_is_reported_when_read() -> None:
    fs, log = memory_log()
    for i in range(20):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    fs.delete(log.segments()[2].path)
    with pytest.raises(CorruptRecord, match="next one starts"):
        read_all(open_log(fs))


def test_unknown_files_are_ignored_and_reported() -> None:
    fs, log = memory_log()
    log.append([b"x"])
    log.sync()
    fs.open_append(f"{DIR}/notes.txt")
    assert open_log(fs).recovery.ignored_files == ["notes.txt"]


# -- faults -----------------------------------------------------------------------------------------------


def test_enospc_is_a_clear_error_and_the_log_stays_consistent() -> None:
    inner, _ = memory_log()
    fs = FaultyFS(inner)
    log = open_log(fs)
    log.append(entries(1, 5))
    log.sync()
    size_before = log.segments()[-1].size
    fs.write_budget_bytes = 10
    log.append(entries(6, 3))
    with pytest.raises(NoSpaceError) as info:
        log.sync()
    assert "No space left on device" in str(info.value)
    assert log.synced_seq == 5 and log.pending_count == 3  # the batch is queued again
    assert inner.size(log.segments()[-1].path) == size_before  # the partial write was cut back
    assert read_all(log) == entries(1, 5)
    assert read_all(open_log(inner)) == entries(1, 5)  # what was synced is still readable after reopen
    fs.write_budget_bytes = None  # space freed: the retry writes the same seqs
    assert log.sync() == 8
    log.append(entries(9, 1))
    log.sync()
    assert read_all(open_log(inner)) == entries(1, 9)


def test_enospc_while_creating_a_new_segment_removes_it() -> None:
    inner, _ = memory_log()
    fs = FaultyFS(inner)
    log = open_log(fs)
    for i in range(7):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    files = inner.list_dir(DIR)
    fs.write_budget_bytes = 0
    while True:  # fill the current segment until a sync needs a new one
        log.append(entries(log.last_seq + 1, 5))
        try:
            log.sync()
        except NoSpaceError:
            break
    assert inner.list_dir(DIR) == files
    fs.write_budget_bytes = None
    log.sync()
    inner.crash()
    assert read_all(open_log(inner)) == entries(1, log.last_seq)


def test_eio_on_fdatasync_poisons_the_log_until_reopened() -> None:
    inner, _ = memory_log()
    fs = FaultyFS(inner)
    log = open_log(fs)
    log.append(entries(1, 5))
    log.sync()
    fs.fail_next_syncs = 1
    log.append(entries(6, 5))
    with pytest.raises(StorageError) as info:
        log.sync()
    assert info.value.op == "fdatasync"
    for call in (lambda: log.append([b"x"]), log.sync, lambda: read_all(log)):
        with pytest.raises(LogFailed):
            call()
    reopened = open_log(fs)  # the written batch is re-read, verified and synced now
    assert read_all(reopened) == entries(1, 10)
    inner.crash()
    assert read_all(open_log(inner)) == entries(1, 10)


def test_a_bit_flipped_by_a_read_is_detected_not_served() -> None:
    inner, log = memory_log()
    log.append(entries(1, 40))
    log.sync()
    for seed in range(20):
        log = open_log(inner)
        log.fs = FaultyFS(inner, seed=seed, read_bit_flip_rate=1.0)  # every read returns one flipped bit
        with pytest.raises(CorruptRecord):
            read_all(log)
    assert read_all(open_log(inner)) == entries(1, 40)


# -- RealFS -----------------------------------------------------------------------------------------------


def test_realfs_round_trip_rollover_and_reopen(tmp_path: Path) -> None:
    fs = RealFS()
    directory = str(tmp_path / "log")
    log = SegmentedLog.open(fs, directory, SMALL)
    for i in range(20):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    assert len(os.listdir(directory)) == len(log.segments()) > 3
    log.truncate_before(30)
    log.close()
    log = SegmentedLog.open(fs, directory, SMALL)
    assert [p for _, p in log.read_from(30)] == entries(30, 71)
    log.close()


def test_realfs_torn_tail_at_every_byte_offset(tmp_path: Path) -> None:
    fs = RealFS()
    directory = str(tmp_path / "log")
    log = SegmentedLog.open(fs, directory, LogOptions())
    log.append(entries(1, 3))
    log.sync()
    log.append(entries(4, 2))
    log.sync()
    path = log.segments()[-1].path
    log.close()
    full = Path(path).read_bytes()
    boundary = records.scan(full).records[-1].offset
    for cut in range(boundary, len(full)):
        case = tmp_path / f"cut{cut}"
        shutil.copytree(directory, case)
        os.truncate(case / segment_name(1), cut)
        log = SegmentedLog.open(fs, str(case), LogOptions())
        assert [p for _, p in log.read_from(1)] == entries(1, 3)
        assert os.path.getsize(case / segment_name(1)) == boundary
        log.close()


def test_an_unexpected_exception_in_run_reaches_complete_and_poisons_the_log() -> None:
    class Broken(MemoryFS):
        def open_append(self, path: str):  # type: ignore[no-untyped-def]
            raise ValueError("bug")

    fs = Broken()
    log = open_log(fs)
    log.append([b"x"])
    job = log.begin_sync()
    assert job is not None
    job.run()  # does not raise: the outcome waits for complete()
    with pytest.raises(StorageError, match="bug"):
        job.complete()
    with pytest.raises(LogFailed):
        log.append([b"y"])
