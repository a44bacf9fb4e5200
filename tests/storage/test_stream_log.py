"""A stream's files (storage/stream_log.py) through the runtime handle's chunk format, on MemoryFS:
appends, rolls, seeks, retention deletes and recovery after crashes with torn writes."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.queues.stream import chunk as ck
from hutch.storage.fs import RealFS
from hutch.storage.memfs import MemoryFS
from hutch.storage.stream_log import (
    FILE_HEADER_SIZE,
    READ_AHEAD_BYTES,
    ChunkCursor,
    StreamLog,
    StreamLogOptions,
)

D = "/data/stream"


def write(log: StreamLog, bodies: list[bytes], ts: int) -> bytes:
    raw = ck.encode(bodies, timestamp=ts, epoch=1, chunk_id=log.next_offset)
    if log.would_roll(len(raw)):
        log.roll()
        log.close_retired()
    log.append(raw, ck.FORMAT.info(raw[:ck.HEADER_SIZE]))
    return raw


def read_all(log: StreamLog) -> list[tuple[int, bytes]]:
    seg = log.segments[0]
    cursor = ChunkCursor(log, seg, FILE_HEADER_SIZE, seg.first_id)
    out: list[tuple[int, bytes]] = []
    while (got := cursor.next(log.last_chunk_id)) is not None:
        out.extend(ck.iter_records(got[1]))
    return out


def test_append_roll_seek_and_reopen() -> None:
    fs = MemoryFS()
    log = StreamLog.open(fs, D, ck.FORMAT, StreamLogOptions(max_segment_size_bytes=200))
    expect = []
    for i in range(30):
        bodies = [b"m%d-%d" % (i, j) for j in range(i % 3 + 1)]
        first = log.next_offset
        write(log, bodies, ts=1000 + i)
        expect.extend((first + j, b) for j, b in enumerate(bodies))
    log.sync()
    assert len(log.segments) > 3
    assert read_all(log) == expect
    for offset, _body in expect:
        found = log.locate(offset)
        assert found is not None
        seg, pos = found
        info = ck.FORMAT.info(log.read_at(seg, pos, ck.HEADER_SIZE))
        assert info.chunk_id <= offset < info.chunk_id + info.num_records
    assert log.locate(log.next_offset) is None
    found = log.locate_timestamp(1010)
    assert found is not None
    assert ck.FORMAT.info(log.read_at(found[0], found[1], ck.HEADER_SIZE)).timestamp == 1010
    assert log.locate_timestamp(5000) is None
    log.close()
    fs.crash(torn=False)
    again = StreamLog.open(fs, D, ck.FORMAT, StreamLogOptions(max_segment_size_bytes=200))
    assert read_all(again) == expect
    assert again.recovery.dropped_chunks == 0 and again.recovery.dropped_bytes == 0


def test_a_cursor_reads_chunks_larger_and_smaller_than_its_read_ahead_block() -> None:
    fs = MemoryFS()
    log = StreamLog.open(fs, D, ck.FORMAT, StreamLogOptions())
    rng = random.Random(7)
    big, expect = READ_AHEAD_BYTES + 1000, []
    for i in range(12):  # runs of large chunks (one header read each, no block) between small ones
        size = big if rng.random() < 0.6 else 100
        bodies = [bytes([i]) * size]
        expect.append((log.next_offset, bodies[0]))
        write(log, bodies, ts=i)
    assert read_all(log) == expect


def test_retention_deletes_whole_segments_and_cursors_move_on() -> None:
    fs = MemoryFS()
    log = StreamLog.open(fs, D, ck.FORMAT, StreamLogOptions(max_segment_size_bytes=150))
    for i in range(20):
        write(log, [b"x" * 20], ts=i)
    seg = log.segments[0]
    cursor = ChunkCursor(log, seg, FILE_HEADER_SIZE, seg.first_id)
    assert cursor.next(log.last_chunk_id) is not None
    n = len(log.segments)
    gone = log.delete_oldest(2)
    assert len(gone) == 2 and len(log.segments) == n - 2
    assert not fs.exists(gone[0].segment_path) and not fs.exists(gone[0].index_path)
    got = cursor.next(log.last_chunk_id)
    assert got is not None and got[0].chunk_id == log.first_offset and cursor.skipped == 1
    assert log.delete_oldest(100) and len(log.segments) == 1  # never the active one


def _open_segment_fds(directory: str) -> list[str]:
    """The segment files this process holds open for reading (Linux: /proc/self/fd and fdinfo; the
    writer's own append descriptor is write-only)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(directory) and target.endswith(".segment"):
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
                if flags & os.O_ACCMODE == os.O_RDONLY:
                    out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_cursor_on_real_files_keeps_one_descriptor_per_segment_and_closes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(tmp_path / "stream")
    log = StreamLog.open(RealFS(), directory, ck.FORMAT, StreamLogOptions(max_segment_size_bytes=3 * READ_AHEAD_BYTES))
    expect = []
    for i in range(40):  # about 4 read-ahead blocks per segment, 3 segments or so
        body = bytes([i]) * (READ_AHEAD_BYTES // 5)
        expect.append((log.next_offset, body))
        write(log, [body], ts=i)
    log.sync()
    assert len(log.segments) >= 3
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: int) -> int:
        if str(path).endswith(".segment") and not flags & os.O_WRONLY:
            opened.append(str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", counting_open)
    seg = log.segments[0]
    cursor = ChunkCursor(log, seg, FILE_HEADER_SIZE, seg.first_id)
    got: list[tuple[int, bytes]] = []
    while (chunk := cursor.next(log.last_chunk_id)) is not None:
        got.extend(ck.iter_records(chunk[1]))
        assert len(_open_segment_fds(directory)) == 1  # the one segment it reads
    assert got == expect
    assert sorted(opened) == sorted(s.segment_path for s in log.segments)  # each segment opened once
    cursor.close()
    assert _open_segment_fds(directory) == []
    log.close()


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_crash_keeps_every_synced_chunk_and_drops_a_torn_tail(seed: int, durable: bool) -> None:
    """`durable=False` (a stream created lazily): a crash before the first sync loses its unsynced files
    (the directory left empty, or a segment without its header); reopening makes them again."""
    rng = random.Random(seed)
    fs = MemoryFS(seed=seed)
    opts = StreamLogOptions(max_segment_size_bytes=rng.choice([120, 400, 10_000]))
    log = StreamLog.open(fs, D, ck.FORMAT, opts, durable=durable)
    synced: list[tuple[int, bytes]] = []
    written: list[tuple[int, bytes]] = []
    for i in range(rng.randint(1, 40)):
        bodies = [rng.randbytes(rng.randint(0, 30)) for _ in range(rng.randint(1, 4))]
        first = log.next_offset
        write(log, bodies, ts=i)
        written.extend((first + j, b) for j, b in enumerate(bodies))
        if rng.random() < 0.3:
            log.sync()
            synced = list(written)
    fs.crash(torn=True)
    again = StreamLog.open(fs, D, ck.FORMAT, opts)
    got = read_all(again)
    assert got == written[:len(got)]  # a prefix of what was written, in order
    assert len(got) >= len(synced)  # with everything synced in it
    # and the recovered log takes new chunks after it
    write(again, [b"after"], ts=99)
    again.sync()
    assert read_all(again)[-1] == (again.next_offset - 1, b"after")
    third = StreamLog.open(MemoryFS(), D, ck.FORMAT, opts)
    assert third.next_offset == 0


def test_flipped_byte_in_last_chunk_is_cut_off() -> None:
    fs = MemoryFS()
    log = StreamLog.open(fs, D, ck.FORMAT)
    write(log, [b"one"], ts=1)
    write(log, [b"two"], ts=2)
    log.sync()
    log.close()
    seg = log.segments[-1]
    fs.poke(seg.segment_path, fs.size(seg.segment_path) - 1)
    again = StreamLog.open(fs, D, ck.FORMAT)
    assert read_all(again) == [(0, b"one")]
    assert again.next_offset == 1


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=40),
       st.sampled_from([150, 400, 5000]), st.data())
def test_seeks_find_the_chunk_a_scan_would_find(chunks: list[tuple[int, int]], segment_bytes: int,
                                                data: st.DataObject) -> None:
    """For any chunk sizes and segment size: locate(offset) gives the chunk holding the offset, and
    locate_timestamp(t) the first chunk stamped at or after t, as a linear scan of the chunks says."""
    log = StreamLog.open(MemoryFS(), D, ck.FORMAT, StreamLogOptions(max_segment_size_bytes=segment_bytes))
    model: list[tuple[int, int, int]] = []  # (chunk id, records, timestamp)
    ts = 0
    for records, step in chunks:
        ts += step
        model.append((log.next_offset, records, ts))
        write(log, [b"r"] * records, ts=ts)
    offset = data.draw(st.integers(0, log.next_offset + 2))
    found = log.locate(offset)
    holding = [cid for cid, n, _ in model if cid <= offset < cid + n]
    if holding:
        assert found is not None
        assert ck.FORMAT.info(log.read_at(found[0], found[1], ck.HEADER_SIZE)).chunk_id == holding[0]
    else:
        assert found is None
    when = data.draw(st.integers(0, ts + 1))
    found = log.locate_timestamp(when)
    later = [cid for cid, _, t in model if t >= when]
    if later:
        assert found is not None
        assert ck.FORMAT.info(log.read_at(found[0], found[1], ck.HEADER_SIZE)).chunk_id == later[0]
    else:
        assert found is None


def test_a_stream_created_lazily_syncs_nothing_until_its_first_data() -> None:
    """`durable=False` (a declare): the new directory and first segment are written without a sync; the
    first sync of data syncs them too (the directory and its parent), once."""
    fs = MemoryFS()
    fs.make_dirs("/data")
    log = StreamLog.open(fs, D, ck.FORMAT, durable=False)
    assert (fs.stats.syncs, fs.stats.dir_syncs) == (0, 0)
    write(log, [b"one"], ts=1)
    handles = log.sync_handles()
    assert [h.path for h in handles[2:]] == [D, "/data"]
    for h in handles:
        h.sync()
    assert fs.stats.dir_syncs == 2
    write(log, [b"two"], ts=2)
    assert [h.path for h in log.sync_handles()] == [log.segments[0].segment_path, log.segments[0].index_path]
    again = StreamLog.open(fs, D, ck.FORMAT, durable=False)  # it exists: opened as any other
    assert again._unsynced_dirs == []
