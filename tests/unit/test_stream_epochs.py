"""storage/stream_epochs.py on the in-memory file system: a log's extent with its epoch offsets read
from the index files, cutting a closed log at a chunk boundary (also across segments, and after a power
cut in the middle), and emptying it; StreamLog.open recovers each result."""

from __future__ import annotations

import pytest

from hutch.cluster.stream_tail import Tail
from hutch.queues.stream import chunk as ck
from hutch.storage.memfs import MemoryFS
from hutch.storage.stream_epochs import (
    COMMIT_FILE_MAX_BYTES,
    CommitFile,
    empty_files,
    extent,
    read_commit,
    truncate_files,
)
from hutch.storage.stream_log import StreamLog, StreamLogOptions

D = "/s"


def _log(fs: MemoryFS, first: int = 0) -> StreamLog:
    return StreamLog.open(fs, D, ck.FORMAT, StreamLogOptions(max_segment_size_chunks=3), first)


def _append(slog: StreamLog, epoch: int, records: int) -> int:
    chunk_id = slog.next_offset
    raw = ck.encode([b"r%d" % i for i in range(records)], timestamp=1, epoch=epoch, chunk_id=chunk_id)
    info = ck.FORMAT.info(raw[:ck.HEADER_SIZE])
    if slog.would_roll(len(raw)):
        slog.roll()
    slog.append(raw, info)
    return chunk_id


def _build(fs: MemoryFS) -> list[int]:
    """Chunks (epoch, records): (1,2) (1,1) (1,3) | (2,1) (3,2) (3,1) | (3,2): ids 0 2 3 | 6 7 9 | 10."""
    slog = _log(fs)
    ids = [_append(slog, e, n) for e, n in [(1, 2), (1, 1), (1, 3), (2, 1), (3, 2), (3, 1), (3, 2)]]
    slog.sync()
    slog.close()
    return ids


def test_extent_reads_epoch_offsets_across_segments() -> None:
    fs = MemoryFS()
    assert _build(fs) == [0, 2, 3, 6, 7, 9, 10]
    slog = _log(fs)
    assert len(slog.segments) == 3
    assert Tail(*extent(slog)).check() == Tail(0, 12, ((1, 6), (2, 7), (3, 12)))
    slog.close()
    fs2 = MemoryFS()
    empty = _log(fs2, first=40)
    assert extent(empty) == (40, 40, ())


@pytest.mark.parametrize(("cut", "expect"), [
    (12, Tail(0, 12, ((1, 6), (2, 7), (3, 12)))),
    (10, Tail(0, 10, ((1, 6), (2, 7), (3, 10)))),   # the whole last segment goes
    (7, Tail(0, 7, ((1, 6), (2, 7)))),               # mid-segment
    (6, Tail(0, 6, ((1, 6),))),                      # a segment's first chunk: the segment goes
    (0, Tail(0, 0, ())),                             # everything
])
def test_truncate_keeps_a_prefix(cut: int, expect: Tail) -> None:
    fs = MemoryFS()
    _build(fs)
    truncate_files(fs, D, cut)
    slog = _log(fs)
    assert Tail(*extent(slog)) == expect
    assert slog.recovery.dropped_chunks == 0
    _append(slog, 9, 1)                              # and the log goes on from there
    assert slog.next_offset == cut + 1
    slog.close()


def test_truncate_refuses_a_non_boundary() -> None:
    fs = MemoryFS()
    _build(fs)
    with pytest.raises(ValueError, match="not a chunk boundary"):
        truncate_files(fs, D, 4)


def test_a_power_cut_during_truncation_leaves_a_prefix() -> None:
    for keep in range(4):
        fs = MemoryFS(seed=keep)
        _build(fs)
        fs.fsync_dir(D)
        truncate_files(fs, D, 3)
        fs.crash(dir_ops_kept=keep)
        slog = _log(fs)
        tail = Tail(*extent(slog)).check()
        assert tail.next in (3, 6, 7, 10, 12)
        assert tail.clipped(3) == Tail(0, 3, ((1, 3),))
        slog.close()


def test_empty_files_then_open_at_another_offset() -> None:
    fs = MemoryFS()
    _build(fs)
    empty_files(fs, D)
    slog = _log(fs, first=25)
    assert extent(slog) == (25, 25, ())
    assert _append(slog, 4, 1) == 25
    slog.close()


def test_the_commit_file_keeps_the_last_whole_point_and_stays_bounded() -> None:
    fs = MemoryFS()
    fs.make_dirs("/s")
    assert read_commit(fs, "/s") == 0                       # none yet
    cf = CommitFile(fs, "/s")
    for v in (3, 7, 12):
        cf.record(v)
    assert read_commit(fs, "/s") == 12
    cf.close()
    fs.open_append("/s/commit").write(b"\x00\x00\x00\x00\x00")  # a torn record after the last
    assert read_commit(fs, "/s") == 12                       # the last whole one
    cf = CommitFile(fs, "/s")                                # reopened out of step: emptied
    assert read_commit(fs, "/s") == 0
    for v in range(1, 20_000):
        cf.record(v)
    assert read_commit(fs, "/s") == 19_999
    assert fs.size("/s/commit") <= COMMIT_FILE_MAX_BYTES
    cf.close()
    data = bytearray(fs.read("/s/commit"))
    data[-1] ^= 0xFF                                         # a damaged record reads as none
    fs.delete("/s/commit")
    fs.open_append("/s/commit").write(bytes(data))
    assert read_commit(fs, "/s") == 0
