"""What stream replication needs of a stream's files beyond appending: the log's extent with its epoch
offsets, cutting the log at a chunk boundary, and emptying it (osiris_log's `overview` and
`init_acceptor` truncation).

Owns `extent(log)` (read from the index files: 29 bytes per chunk, no chunk is read), the member's
**commit file** (`CommitFile`, `read_commit`), and
`truncate_files` / `empty_files`, which work on the files of a stream that is **closed**: the caller closes
its `StreamHandle`, cuts, and opens it again, so the recovery of `StreamLog.open` rebuilds every in-memory
figure (segments, tracking) from what is left, and nothing in memory can disagree with the files.

Rules:
- `truncate_files(fs, directory, next_offset)` keeps every chunk whose id is below `next_offset`, which
  must be the id of a chunk in the log or the log's end (a chunk boundary): the segment holding it is
  cut (segment and index, each synced by `fs.truncate`), later segments are deleted, and the directory
  is synced. A crash in between leaves a log recovery accepts (segments deleted from the newest first,
  so what is left is always a prefix).
- A replica never truncates below its commit point (stream_replica.py asserts it); truncation does not
  read commit points.
- The commit file (`commit` in the stream's directory) records the member's commit points as they grow,
  12 bytes each (u64 offset, u32 CRC-32 of it), appended and never synced: what a restart reads is a
  commit point the member once knew, or an older one, or 0 (a missing, torn or emptied file), each still
  true (committed chunks stay committed). It lets a restarted writer commit at once, carrying nothing
  (stream_replica.py, "No marker when there is nothing to commit"). Bounded: emptied past
  `COMMIT_FILE_MAX_BYTES` (a crash right then reads 0, which is safe).
"""

from __future__ import annotations

import struct
import zlib

from hutch.storage.fs import FileHandle, FileSystem
from hutch.storage.stream_log import (
    FILE_HEADER_SIZE,
    INDEX_RECORD,
    INDEX_RECORD_SIZE,
    StreamLog,
)


def _records(fs: FileSystem, index_path: str, count: int | None = None) -> list[tuple[int, int, int]]:
    """(chunk id, epoch, file position) of the index's records (`count` of them, or all in the file)."""
    size = fs.size(index_path) - FILE_HEADER_SIZE
    n = size // INDEX_RECORD_SIZE if count is None else count
    data = fs.read(index_path, FILE_HEADER_SIZE, n * INDEX_RECORD_SIZE)
    out = []
    for i in range(len(data) // INDEX_RECORD_SIZE):
        chunk_id, _ts, epoch, position, _type = INDEX_RECORD.unpack_from(data, i * INDEX_RECORD_SIZE)
        out.append((chunk_id, epoch, position))
    return out


def extent(log: StreamLog) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """(first offset, next offset, epoch offsets) of an open log: for each epoch, in order, the offset
    just past its last chunk (the `Tail` of hutch.cluster.stream_tail)."""
    epochs: list[tuple[int, int]] = []
    last_epoch = -1
    for seg in log.segments:
        for chunk_id, epoch, _pos in _records(log.fs, seg.index_path, seg.chunks):
            if epochs and last_epoch != epoch:
                epochs[-1] = (last_epoch, chunk_id)  # the previous epoch ends where this chunk starts
            if last_epoch != epoch:
                epochs.append((epoch, -1))
                last_epoch = epoch
    if epochs:
        epochs[-1] = (last_epoch, log.next_offset)
    return log.first_offset, log.next_offset, tuple(epochs)


def _segments(fs: FileSystem, directory: str) -> list[tuple[int, str]]:
    names = sorted(n for n in fs.list_dir(directory) if n.endswith(".segment"))
    return [(int(n[:-8]), f"{directory}/{n[:-8]}") for n in names]


def truncate_files(fs: FileSystem, directory: str, next_offset: int) -> int:
    """Cut the closed stream in `directory` so that its next chunk is `next_offset`; returns the number
    of chunks removed. ValueError if `next_offset` is not a chunk boundary of the log."""
    segments = _segments(fs, directory)
    if not segments:
        raise ValueError(f"no stream in {directory}")
    # check first, cut after: the offset must start a chunk of the segment holding it, or be where the
    # next segment starts (within the last segment, past its last chunk id, it is taken for the end)
    holder = max(i for i, (first_id, _) in enumerate(segments) if first_id <= next_offset or i == 0)
    ids = [r[0] for r in _records(fs, segments[holder][1] + ".index")]
    at_end = holder + 1 < len(segments) and segments[holder + 1][0] == next_offset
    past_last = holder + 1 == len(segments) and (not ids or next_offset > ids[-1])
    if next_offset not in ids and not at_end and not past_last:
        raise ValueError(f"offset {next_offset} is not a chunk boundary in {directory}")
    removed = 0
    # newest first, so a crash half-way leaves a prefix
    for first_id, base in reversed(segments):
        if first_id < next_offset or first_id == segments[0][0]:
            records = _records(fs, base + ".index")
            cut = next((i for i, r in enumerate(records) if r[0] >= next_offset), len(records))
            if cut < len(records):
                fs.truncate(base + ".segment", records[cut][2])
                fs.truncate(base + ".index", FILE_HEADER_SIZE + cut * INDEX_RECORD_SIZE)
                removed += len(records) - cut
            break
        removed += len(_records(fs, base + ".index"))
        for path in (base + ".index", base + ".segment"):
            if fs.exists(path):
                fs.delete(path)
    fs.fsync_dir(directory)
    return removed


def empty_files(fs: FileSystem, directory: str) -> None:
    """Delete every file of the closed stream in `directory` (a replica reset to start at another
    offset: `StreamHandle.open(..., first_offset=...)` then creates its first segment)."""
    if not fs.exists(directory):
        return
    for _, base in reversed(_segments(fs, directory)):
        for path in (base + ".index", base + ".segment"):
            if fs.exists(path):
                fs.delete(path)
    for name in fs.list_dir(directory):
        if name.endswith(".index"):
            fs.delete(f"{directory}/{name}")
    fs.fsync_dir(directory)


COMMIT_NAME = "commit"
_COMMIT_RECORD = struct.Struct(">QI")
COMMIT_FILE_MAX_BYTES = 64 << 10


def _commit_record(value: int) -> bytes:
    raw = value.to_bytes(8, "big")
    return _COMMIT_RECORD.pack(value, zlib.crc32(raw))


def read_commit(fs: FileSystem, directory: str) -> int:
    """The last commit point the directory's commit file holds whole and intact (0: none)."""
    path = f"{directory}/{COMMIT_NAME}"
    if not fs.exists(path):
        return 0
    whole = fs.size(path) // _COMMIT_RECORD.size
    if whole == 0:
        return 0
    data = fs.read(path, (whole - 1) * _COMMIT_RECORD.size, _COMMIT_RECORD.size)
    value, crc = _COMMIT_RECORD.unpack(data)
    return value if zlib.crc32(data[:8]) == crc else 0


class CommitFile:
    """Appends a member's commit points to `directory/commit` (module docstring). Not synced: a restart
    may read an older point, never a wrong one."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self.fs = fs
        self.path = f"{directory}/{COMMIT_NAME}"
        if fs.exists(self.path) and fs.size(self.path) % _COMMIT_RECORD.size:
            fs.truncate(self.path, 0)  # a torn record: what follows would be read out of step
        self._size = fs.size(self.path) if fs.exists(self.path) else 0
        self._fh: FileHandle | None = fs.open_append(self.path)

    def record(self, commit: int) -> None:
        fh = self._fh
        if fh is None:
            return
        if self._size + _COMMIT_RECORD.size > COMMIT_FILE_MAX_BYTES:
            fh.close()
            self.fs.truncate(self.path, 0)
            self._size = 0
            self._fh = fh = self.fs.open_append(self.path)
        fh.write(_commit_record(commit))
        self._size += _COMMIT_RECORD.size

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            fh.close()
