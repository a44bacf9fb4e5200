"""A stream's files: segment files of chunks and one index file per segment (osiris's layout).

Owns: the directory of one stream (`<dir>/<first chunk id, 20 digits>.segment` and `.index`), appending
chunks with their index records, group syncs, rolling to a new segment, deleting whole old segments,
recovery after a crash (a torn last chunk is dropped by its CRC), and `ChunkCursor`, a reader that reads
chunks from the files one at a time (bounded memory whatever the stream's size).

The file formats are osiris's (rabbitmq/osiris, `osiris_log.erl`'s header comment), so a chunk on disk is
the bytes the stream protocol's Deliver carries and the bytes a replica ships:

    segment file: "OSIL" u32 version=1, then chunks back to back
    index file:   "OSII" u32 version=1, then 29-byte records, one per chunk, in chunk order:
                  chunk id u64 | timestamp i64 | epoch u64 | file position u32 | chunk type u8

What a chunk *is* (its 48-byte header, its CRC over the entry data) belongs to `hutch.queues.stream.chunk`;
this module reads chunks through the `ChunkFormat` it is given, so the storage package stays a leaf.

Rules:
- Appending writes the chunk and its index record; neither is durable until `sync()` returns. A chunk
  is *readable* by a `ChunkCursor` only up to the `limit` its owner passes (the committed chunk id): a
  cursor never reads past what the owner says is committed.
- A new segment is started before a chunk that would find the active one full (by bytes or chunk count);
  the old segment and index are synced and the directory entry of the new one made durable first.
- Retention deletes whole segments, oldest first, never the active (last) one (`delete_oldest`).
- Recovery (`StreamLog.open`): the last segment's index keeps only records whose chunk verifies; chunks
  after the last indexed one are verified by scanning forward and indexed; the first that does not verify
  (torn or corrupt) and everything after it is cut off, in both files. Earlier segments were synced
  whole before the next one was created, and are trusted (their index gives their extent).
- A new, empty stream opened with `durable=False` (a declare: `open(..., durable=False)`) writes its
  directory and first segment without a sync: they hold nothing a restart cannot rebuild (recovery makes
  a missing directory, segment or header again), so a declare costs no sync of its own (a super stream's
  128 partitions share their creation's one definitions sync). Their names are made durable by the first
  sync of data: `sync_handles` adds the directory and its parent to the files it hands out (`DirSync`),
  and `roll` syncs them first, so no chunk is ever answered durable in a file whose name is not.
- Invariant: chunk ids are contiguous: each chunk's id is the previous id plus its record count.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from hutch.storage.errors import StorageError
from hutch.storage.fs import Bytes, FileHandle, FileSystem, ReadHandle, open_read

SEGMENT_MAGIC = b"OSIL\x00\x00\x00\x01"
INDEX_MAGIC = b"OSII\x00\x00\x00\x01"
FILE_HEADER_SIZE = 8
INDEX_RECORD = struct.Struct(">QqQIB")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 29
assert INDEX_RECORD_SIZE == 29

DEFAULT_MAX_SEGMENT_SIZE_BYTES = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
DEFAULT_MAX_SEGMENT_SIZE_CHUNKS = 256_000
READ_AHEAD_BYTES = 256 * 1024  # what a reader reads at once (its memory: one block, or one larger chunk)
MAX_POSITION = (1 << 32) - 1  # index positions are u32: a segment never grows past 4 GiB


class ChunkInfo(NamedTuple):
    """What the files need to know of a chunk: where it sits in the offsets and how long it is."""

    chunk_id: int  # the offset of its first record
    timestamp: int  # ms
    epoch: int
    chunk_type: int
    num_records: int
    size: int  # header + filter + data + trailer, in bytes


class ChunkFormat(Protocol):
    """How the files read a chunk (implemented by hutch.queues.stream.chunk.FORMAT)."""

    header_size: int

    def info(self, header: bytes) -> ChunkInfo:
        """The chunk's info from its header bytes; ValueError if they are not a chunk header."""
        ...

    def verify(self, chunk: bytes) -> bool:
        """The whole chunk's bytes check (its CRC)."""
        ...


class IndexRecord(NamedTuple):
    chunk_id: int
    timestamp: int
    epoch: int
    position: int
    chunk_type: int


@dataclass
class Segment:
    """One segment as the log keeps it in memory: a few numbers, never its chunks.

    Invariant: `chunks` index records are in the index file, the last of them for the chunk `last_id`
    which ends at byte `size` of the segment file."""

    base: str  # path without the extension
    first_id: int
    last_id: int = -1  # chunk id of the last chunk (-1: none yet)
    next_offset: int = 0  # last chunk id + its record count
    first_ts: int = 0
    last_ts: int = 0
    size: int = FILE_HEADER_SIZE
    chunks: int = 0

    @property
    def segment_path(self) -> str:
        return self.base + ".segment"

    @property
    def index_path(self) -> str:
        return self.base + ".index"


@dataclass
class RecoveryInfo:
    """What `StreamLog.open` found: the chunks and bytes it cut off the last segment."""

    segments: int = 0
    dropped_chunks: int = 0
    dropped_bytes: int = 0
    reindexed_chunks: int = 0


@dataclass
class StreamLogOptions:
    max_segment_size_bytes: int = DEFAULT_MAX_SEGMENT_SIZE_BYTES
    max_segment_size_chunks: int = DEFAULT_MAX_SEGMENT_SIZE_CHUNKS


def segment_base(directory: str, first_id: int) -> str:
    return f"{directory}/{first_id:020d}"


class DirSync:
    """A directory as a `FileHandle` whose `sync` is `fsync_dir`: how a lazily created stream's names
    join the file syncs of its first data sync (written nothing, closed nothing)."""

    __slots__ = ("path", "_fs")

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.path = path
        self._fs = fs

    def write(self, data: Bytes) -> None:
        raise StorageError("write", self.path, detail="a directory is not written")

    def sync(self) -> None:
        self._fs.fsync_dir(self.path)

    def close(self) -> None:
        return None


class StreamLog:
    """The files of one stream, opened for writing (one writer per stream on a node)."""

    def __init__(self, fs: FileSystem, directory: str, fmt: ChunkFormat, options: StreamLogOptions) -> None:
        self.fs = fs
        self.directory = directory
        self.fmt = fmt
        self.options = options
        self.segments: list[Segment] = []
        self._seg_fd: FileHandle | None = None
        self._idx_fd: FileHandle | None = None
        self._unsynced = False
        # directories whose new entries are not durable yet (a stream created with durable=False): the
        # stream's own, then its parent's; synced with the first data
        self._unsynced_dirs: list[str] = []
        # handles of segments rolled away while a sync may still run on them: the owner closes them
        # (`close_retired`) once no sync job is in flight
        self.retired: list[FileHandle] = []
        self.recovery = RecoveryInfo()
        self.closed = False

    # -- opening and recovery ----------------------------------------------------------------------
    @classmethod
    def open(cls, fs: FileSystem, directory: str, fmt: ChunkFormat,
             options: StreamLogOptions | None = None, first_offset: int = 0, *,
             durable: bool = True) -> StreamLog:
        """Open (creating it if missing) and recover the stream in `directory`. `first_offset` is the
        chunk id of the first chunk of a new, empty log (a replica that starts past 0). `durable=False`
        (a new stream at offset 0 only): what is created is synced with the first data (module docstring)."""
        log = cls(fs, directory, fmt, options or StreamLogOptions())
        lazy = not durable and first_offset == 0 and not fs.exists(directory)
        fs.make_dirs(directory, durable=not lazy)
        if lazy:
            log._unsynced_dirs = [directory, directory.rsplit("/", 1)[0] or "/"]
        names = [n for n in fs.list_dir(directory) if n.endswith(".segment")]
        for index_name in [n for n in fs.list_dir(directory) if n.endswith(".index")]:
            if index_name[:-6] + ".segment" not in names:  # an index whose segment was never created
                fs.delete(f"{directory}/{index_name}")
        bases = [f"{directory}/{n[:-8]}" for n in sorted(names)]
        for i, base in enumerate(bases):
            seg = log._load_segment(base, last=i == len(bases) - 1)
            if seg.chunks == 0 and log.segments:
                # an empty segment after others: a roll that crashed before its first chunk was durable
                log._remove_files(seg)
                continue
            log.segments.append(seg)
        log.recovery.segments = len(log.segments)
        if not log.segments:
            log._create_segment(first_offset, durable=not lazy)
        log._open_tail()
        return log

    def _load_segment(self, base: str, last: bool) -> Segment:
        fs = self.fs
        seg = Segment(base, int(base.rsplit("/", 1)[1]))
        seg.next_offset = seg.first_id
        seg_size = fs.size(seg.segment_path)
        if seg_size < FILE_HEADER_SIZE or fs.read(seg.segment_path, 0, FILE_HEADER_SIZE) != SEGMENT_MAGIC:
            if not last:
                raise StorageError("open", seg.segment_path, detail="no valid segment header")
            self._rewrite_header(seg.segment_path, SEGMENT_MAGIC)
            seg_size = FILE_HEADER_SIZE
        if not fs.exists(seg.index_path) or fs.size(seg.index_path) < FILE_HEADER_SIZE or \
                fs.read(seg.index_path, 0, FILE_HEADER_SIZE) != INDEX_MAGIC:
            if not last:
                raise StorageError("open", seg.index_path, detail="no valid index header")
            self._rewrite_header(seg.index_path, INDEX_MAGIC)
        idx_size = fs.size(seg.index_path)
        records = (idx_size - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE
        good = records
        if last:
            # keep the longest prefix of index records whose chunks verify (checking from the end back)
            while good > 0:
                rec = self._index_record(seg, good - 1)
                if self._chunk_at(seg.segment_path, rec.position, seg_size) is not None:
                    break
                good -= 1
        if good < records or idx_size != FILE_HEADER_SIZE + records * INDEX_RECORD_SIZE:
            if not last:
                raise StorageError("open", seg.index_path, detail="a torn index in a segment that is not the last")
            fs.truncate(seg.index_path, FILE_HEADER_SIZE + good * INDEX_RECORD_SIZE)
        seg.chunks = good
        end = FILE_HEADER_SIZE
        if good:
            first = self._index_record(seg, 0)
            lastrec = self._index_record(seg, good - 1)
            info = self._info_at(seg.segment_path, lastrec.position)
            seg.first_ts, seg.last_ts = first.timestamp, lastrec.timestamp
            seg.last_id = lastrec.chunk_id
            seg.next_offset = info.chunk_id + info.num_records
            end = lastrec.position + info.size
        if last:
            end = self._scan_forward(seg, end, seg_size)
            if end < seg_size:
                self.recovery.dropped_bytes += seg_size - end
                fs.truncate(seg.segment_path, end)
        seg.size = end
        return seg

    def _scan_forward(self, seg: Segment, pos: int, seg_size: int) -> int:
        """Index the verified chunks after `pos` that the index lost; return where verified data ends."""
        fresh: list[bytes] = []
        while pos < seg_size:
            info = self._chunk_at(seg.segment_path, pos, seg_size)
            if info is None or info.chunk_id != (seg.next_offset if seg.chunks or fresh else seg.first_id):
                self.recovery.dropped_chunks += 1
                break
            fresh.append(INDEX_RECORD.pack(info.chunk_id, info.timestamp, info.epoch, pos, info.chunk_type))
            if not seg.chunks and len(fresh) == 1:
                seg.first_ts = info.timestamp
            seg.chunks += 1
            seg.last_id, seg.last_ts = info.chunk_id, info.timestamp
            seg.next_offset = info.chunk_id + info.num_records
            pos += info.size
        if fresh:
            self._append_synced(seg.index_path, b"".join(fresh))
            self.recovery.reindexed_chunks += len(fresh)
        return pos

    def _rewrite_header(self, path: str, magic: bytes) -> None:
        if self.fs.exists(path):
            self.fs.truncate(path, 0)
        self._append_synced(path, magic)

    def _append_synced(self, path: str, data: bytes) -> None:
        """Append `data` to `path` (created if missing) and fdatasync it."""
        fd = self.fs.open_append(path)
        try:
            fd.write(data)
            fd.sync()
        finally:
            fd.close()

    def _index_record(self, seg: Segment, i: int) -> IndexRecord:
        data = self.fs.read(seg.index_path, FILE_HEADER_SIZE + i * INDEX_RECORD_SIZE, INDEX_RECORD_SIZE)
        if len(data) != INDEX_RECORD_SIZE:
            raise StorageError("read", seg.index_path, detail=f"index record {i} is missing")
        return IndexRecord._make(INDEX_RECORD.unpack(data))

    def _info_at(self, path: str, pos: int) -> ChunkInfo:
        header = self.fs.read(path, pos, self.fmt.header_size)
        try:
            return self.fmt.info(header)
        except ValueError as exc:
            raise StorageError("read", path, detail=f"no chunk at byte {pos}: {exc}") from exc

    def _chunk_at(self, path: str, pos: int, file_size: int) -> ChunkInfo | None:
        """The chunk at `pos` if it is whole and verifies, else None."""
        if pos < FILE_HEADER_SIZE or pos + self.fmt.header_size > file_size:
            return None
        try:
            info = self.fmt.info(self.fs.read(path, pos, self.fmt.header_size))
        except ValueError:
            return None
        if pos + info.size > file_size or not self.fmt.verify(self.fs.read(path, pos, info.size)):
            return None
        return info

    def _create_segment(self, first_id: int, durable: bool = True) -> None:
        seg = Segment(segment_base(self.directory, first_id), first_id, next_offset=first_id)
        for path, magic in ((seg.index_path, INDEX_MAGIC), (seg.segment_path, SEGMENT_MAGIC)):
            if durable:
                self._append_synced(path, magic)
            else:  # synced by the first data sync, with the directory (`sync_handles`)
                fd = self.fs.open_append(path)
                try:
                    fd.write(magic)
                finally:
                    fd.close()
        if durable:
            self.fs.fsync_dir(self.directory)
        self.segments.append(seg)

    def _open_tail(self) -> None:
        tail = self.segments[-1]
        self._seg_fd = self.fs.open_append(tail.segment_path)
        self._idx_fd = self.fs.open_append(tail.index_path)

    def _remove_files(self, seg: Segment) -> None:
        for path in (seg.segment_path, seg.index_path):
            if self.fs.exists(path):
                self.fs.delete(path)
        self.fs.fsync_dir(self.directory)

    # -- reading the shape of the log ---------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        """The chunk id the next chunk gets."""
        return self.segments[-1].next_offset

    @property
    def first_offset(self) -> int:
        return self.segments[0].first_id

    @property
    def last_chunk_id(self) -> int:
        """The id of the last chunk written (-1: the log has none)."""
        for seg in reversed(self.segments):
            if seg.chunks:
                return seg.last_id
        return -1

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self.segments)

    def index_record(self, seg: Segment, i: int) -> IndexRecord:
        return self._index_record(seg, i)

    def segment_for(self, offset: int) -> int:
        """The position in `segments` of the segment holding `offset` (the last one past the end)."""
        lo, hi = 0, len(self.segments) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.segments[mid].first_id <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def locate(self, offset: int) -> tuple[Segment, int] | None:
        """The segment and file position of the chunk holding `offset` (a binary search of the index
        file, reading O(log n) records); None if no chunk holds it (before the first, after the last)."""
        if not self.segments or offset < self.first_offset or offset >= self.next_offset:
            return None
        seg = self.segments[self.segment_for(offset)]
        if not seg.chunks:
            return None
        lo, hi = 0, seg.chunks - 1
        while lo < hi:  # the last index record with chunk id <= offset
            mid = (lo + hi + 1) // 2
            if self._index_record(seg, mid).chunk_id <= offset:
                lo = mid
            else:
                hi = mid - 1
        return seg, self._index_record(seg, lo).position

    def locate_timestamp(self, timestamp_ms: int) -> tuple[Segment, int] | None:
        """The first chunk whose timestamp is at or after `timestamp_ms` (None: every chunk is older)."""
        for seg in self.segments:
            if not seg.chunks or seg.last_ts < timestamp_ms:
                continue
            lo, hi = 0, seg.chunks - 1
            while lo < hi:  # the first record with timestamp >= timestamp_ms
                mid = (lo + hi) // 2
                if self._index_record(seg, mid).timestamp >= timestamp_ms:
                    hi = mid
                else:
                    lo = mid + 1
            return seg, self._index_record(seg, lo).position
        return None

    def iter_chunks(self, seg: Segment) -> Iterator[tuple[int, ChunkInfo]]:
        """(position, info) of every chunk of a segment, reading headers only."""
        pos = FILE_HEADER_SIZE
        for _ in range(seg.chunks):
            info = self._info_at(seg.segment_path, pos)
            yield pos, info
            pos += info.size

    def read_at(self, seg: Segment, pos: int, length: int) -> bytes:
        return self.fs.read(seg.segment_path, pos, length)

    # -- writing ------------------------------------------------------------------------------------
    def would_roll(self, chunk_size: int) -> bool:
        """A chunk of `chunk_size` bytes appended now starts a new segment."""
        tail = self.segments[-1]
        opts = self.options
        return tail.chunks > 0 and (tail.size + chunk_size > opts.max_segment_size_bytes
                                    or tail.chunks >= opts.max_segment_size_chunks
                                    or tail.size + chunk_size > MAX_POSITION)

    def roll(self) -> None:
        """Sync the active segment, retire its handles and start a new segment at the next offset."""
        assert self._seg_fd is not None and self._idx_fd is not None
        self._seg_fd.sync()
        self._idx_fd.sync()
        self._sync_dirs()
        self.retired += (self._seg_fd, self._idx_fd)
        self._seg_fd = self._idx_fd = None
        self._create_segment(self.next_offset)
        self._open_tail()

    def append(self, chunk: Bytes, info: ChunkInfo) -> None:
        """Write one chunk (already encoded, `info` its header's) at the end of the active segment.
        The caller rolls first when `would_roll` says so (so it may write a tracking snapshot first)."""
        if self.closed:
            raise StorageError("append", self.directory, detail="the stream log is closed")
        tail = self.segments[-1]
        if info.chunk_id != tail.next_offset:
            raise ValueError(f"chunk {info.chunk_id} out of order: the log expects {tail.next_offset}")
        if len(chunk) != info.size:
            raise ValueError(f"chunk {info.chunk_id}: {len(chunk)} bytes but its header says {info.size}")
        assert self._seg_fd is not None and self._idx_fd is not None
        pos = tail.size
        self._seg_fd.write(chunk)
        self._idx_fd.write(INDEX_RECORD.pack(info.chunk_id, info.timestamp, info.epoch, pos, info.chunk_type))
        if not tail.chunks:
            tail.first_ts = info.timestamp
        tail.chunks += 1
        tail.size = pos + info.size
        tail.last_id, tail.last_ts = info.chunk_id, info.timestamp
        tail.next_offset = info.chunk_id + info.num_records
        self._unsynced = True

    def sync_handles(self) -> list[FileHandle]:
        """The handles a sync must fdatasync now (the active segment and index), or none when nothing was
        written since the last call. The sync itself (`sync_all`) may run on another thread."""
        if not self._unsynced or self._seg_fd is None or self._idx_fd is None:
            return []
        self._unsynced = False
        dirs: list[FileHandle] = [DirSync(self.fs, d) for d in self._unsynced_dirs]
        self._unsynced_dirs = []
        return [self._seg_fd, self._idx_fd, *dirs]

    def _sync_dirs(self) -> None:
        """Make the names of a lazily created stream durable now (on the calling thread)."""
        for d in self._unsynced_dirs:
            self.fs.fsync_dir(d)
        self._unsynced_dirs = []

    def sync(self) -> None:
        """fdatasync whatever was written (on the calling thread)."""
        sync_all(self.sync_handles())

    def close_retired(self) -> None:
        for fd in self.retired:
            fd.close()
        self.retired.clear()

    def delete_oldest(self, count: int) -> list[Segment]:
        """Delete the `count` oldest segments (never the active one); returns them."""
        count = min(count, len(self.segments) - 1)
        if count <= 0:
            return []
        gone, self.segments = self.segments[:count], self.segments[count:]
        for seg in gone:
            for path in (seg.segment_path, seg.index_path):
                if self.fs.exists(path):
                    self.fs.delete(path)
        self.fs.fsync_dir(self.directory)
        return gone

    def close(self) -> None:
        self.closed = True
        self.close_retired()
        for fd in (self._seg_fd, self._idx_fd):
            if fd is not None:
                fd.close()
        self._seg_fd = self._idx_fd = None

    def destroy(self) -> None:
        """Close and delete every file and the directory (already gone: nothing to do)."""
        self.close()
        if not self.fs.exists(self.directory):
            return
        for name in self.fs.list_dir(self.directory):
            self.fs.delete(f"{self.directory}/{name}")
        self.fs.fsync_dir(self.directory)
        self.fs.remove_dir(self.directory)


def sync_all(handles: list[FileHandle]) -> None:
    """fdatasync each handle (the segment before its index: an index record never outlives its chunk
    for long, and recovery checks the index against the chunks anyway)."""
    for fd in handles:
        fd.sync()


class ChunkCursor:
    """Reads chunks one at a time from a `StreamLog`'s files, from a position on.

    Holds its position (segment, byte, next chunk id) and one read-ahead block of at most
    `READ_AHEAD_BYTES` (or one chunk, if larger): one file read serves the small chunks that follow,
    and memory stays bounded whatever the stream's size. Chunks never change once written, so a whole
    chunk in the block is the chunk. `next(limit)` returns the next chunk whose id is at most `limit`
    (the committed chunk id), or None. If retention deleted the segment it was in, it moves to the log's
    first chunk (`skipped` counts such moves).

    It keeps its current segment file open (`fs.open_read`: one descriptor on a real file system, not an
    open and a close per read-ahead block). Invariant: at most one open file per cursor, the segment it
    reads; it is closed when the cursor moves to another segment and by `close()` (the owner's, when the
    reader goes)."""

    __slots__ = ("log", "seg_first", "pos", "next_id", "skipped", "_block", "_block_pos", "_block_seg", "_large",
                 "_file", "_file_seg")

    def __init__(self, log: StreamLog, seg: Segment, pos: int, next_id: int) -> None:
        self.log = log
        self.seg_first = seg.first_id
        self.pos = pos
        self.next_id = next_id
        self.skipped = 0
        self._block = b""
        self._block_pos = 0
        self._block_seg = -1
        self._large = False  # the last chunk was larger than a read-ahead block
        self._file: ReadHandle | None = None
        self._file_seg = -1  # the first id of the segment `_file` reads

    def close(self) -> None:
        """Close the segment file the cursor keeps open (it reopens one if used again)."""
        if self._file is not None:
            self._file.close()
            self._file, self._file_seg = None, -1

    def _read(self, seg: Segment, pos: int, length: int, ahead: bool = True) -> bytes:
        """`length` bytes at `pos`, from the read-ahead block when it holds them (else read with a block
        of read-ahead, or, with `ahead` false, exactly)."""
        block, start = self._block, self._block_pos
        if self._block_seg == seg.first_id and start <= pos and pos + length <= start + len(block):
            return block[pos - start:pos - start + length]
        want = min(max(length, READ_AHEAD_BYTES), seg.size - pos) if ahead else length
        if self._file_seg != seg.first_id:
            self.close()
            self._file, self._file_seg = open_read(self.log.fs, seg.segment_path), seg.first_id
        assert self._file is not None
        self._block = block = self._file.pread(pos, max(want, length))
        self._block_pos, self._block_seg = pos, seg.first_id
        return block[:length]

    def _segment(self) -> Segment | None:
        segs = self.log.segments
        i = self.log.segment_for(self.seg_first)
        if segs[i].first_id != self.seg_first:
            # our segment is gone (retention): start again at the first chunk of the log
            self.skipped += 1
            self.close()
            seg = segs[0]
            self.seg_first, self.pos, self.next_id = seg.first_id, FILE_HEADER_SIZE, seg.first_id
            return seg
        return segs[i]

    def next(self, limit: int) -> tuple[ChunkInfo, bytes] | None:
        """The next chunk with id <= `limit` as (info, its bytes), or None."""
        seg = self._segment()
        while seg is not None:
            if self.next_id > limit:
                return None
            if self.pos < seg.size:
                try:
                    # after a large chunk the next is likely large too: read its header alone, not a block
                    # that the chunk's own read would read again
                    info = self.log.fmt.info(self._read(seg, self.pos, self.log.fmt.header_size, not self._large))
                except ValueError as exc:
                    raise StorageError("read", seg.segment_path, detail=f"no chunk at byte {self.pos}: {exc}") from exc
                data = self._read(seg, self.pos, info.size)
                self._large = info.size > READ_AHEAD_BYTES
                if len(data) != info.size:
                    raise StorageError("read", seg.segment_path, detail=f"chunk {info.chunk_id} is short")
                self.pos += info.size
                self.next_id = info.chunk_id + info.num_records
                return info, data
            # at the end of this segment: move to the next one, if there is one
            segs = self.log.segments
            i = self.log.segment_for(self.seg_first)
            if i + 1 >= len(segs):
                return None
            self.close()  # done with this segment's file
            seg = segs[i + 1]
            self.seg_first, self.pos = seg.first_id, FILE_HEADER_SIZE
        return None
