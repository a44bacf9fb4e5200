"""One stream on one node at run time: `StreamHandle`, the API the stream queue type, the stream protocol
and stream replication build on.

Owns: the writer of a stream's log (storage/stream_log.py) on the event loop, its group syncs, the commit
point, publisher deduplication and consumer offset tracking (kept in the log: queues/stream/tracking.py),
retention, and `StreamReader`, which reads committed chunks from the files.

The API (all on the event loop's thread):

    handle = await StreamHandle.open(fs, directory, options=StreamOptions(...), clock=clock)
    appended = handle.append([entry, ...], publisher=b"ref", publishing_ids=[1, 2, ...],
                             filter_values=[b"eu", None, ...])
        appended.stored / appended.duplicates   publishing ids written / already seen for `ref`
        appended.first_offset, .last_offset     the offsets the stored entries got (-1 if none)
        await appended.settled                  committed (single node: after the fdatasync;
                                                with replication: once a majority has the chunk)
    handle.store_offset(b"consumer", 42)      -> Appended (a TRACKING_DELTA chunk; settles like a write)
    handle.store_offsets([(b"c", 42), ...])   -> Appended (several in one TRACKING_DELTA chunk)
    handle.query_offset(b"consumer")          -> int | None
    handle.query_publisher_sequence(b"ref")   -> int (0: never seen, as the stream protocol answers)
    reader = handle.reader(OffsetSpec.first())
        reader.next_chunk()   -> ReadChunk | None   (None: nothing committed past it yet)
        reader.close()        releases the one segment file it keeps open (its owner, when it goes)
        ReadChunk: .header, .raw (the chunk's bytes as on disk), .records() -> (offset, bytes) from
                   the reader's start offset on
    remove = handle.on_commit(callback)       callback() after the commit point moves (wake readers)
    handle.first_offset / .next_offset / .committed_chunk_id / .committed_offset / .last_chunk_id
    await handle.close(); await handle.delete()

For replication (the narrow hook, docs/streams.md): `auto_commit` (True on a single node: the commit point
follows the local fdatasync), `on_durable` (callbacks told each chunk id made durable locally), `commit()`
(move the commit point), `epoch` (stamped on new chunks), `accept_chunk(raw)` (a follower appends a chunk
exactly as the leader wrote it) and `reader(..., committed_only=False)` (the leader ships what it wrote).

Rules:
- `append` writes one chunk at once (to the page cache) and returns; the fdatasync runs in groups (one
  asked per loop turn at most) on the stream's **writer thread** (writer.py: one OS thread per stream,
  started at its first sync and gone when idle), never on the loop, so the loop goes on reading and
  delivering while the disk syncs; requests made while a sync runs are merged into the next. Measured
  against a sync on the loop (the earlier rule, while the last sync took under 10 ms), in the same
  minutes, this branch published 1.1-1.5x as fast over AMQP 0-9-1 at 16 B and 1.0-1.2x at 1 kB
  (docs/BENCHMARKS.md, "Streams over AMQP 0-9-1, fifth pass").
  The segment write and the chunk's CRC stay on the loop (a few per cent of its time at 16 B).
- Readers see only committed chunks; a reader holds its position, never the log (bounded memory).
- A publishing id at or below the last one stored for its publisher reference is a duplicate: not
  written again, answered in `duplicates` (osiris's deduplication; survives restarts through the log).
- Retention runs after every segment roll and on `apply_retention()` (the queue type's timer).
- A storage failure fails the handle: pending and later appends get the error; it is reopened by restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hutch.queues.stream import chunk as ck
from hutch.queues.stream import tracking as trk
from hutch.queues.stream.offset_spec import OffsetSpec, SpecKind
from hutch.queues.stream.retention import Retention, segments_to_drop
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.stream.writer import WriterThread, sync_together
from hutch.storage.errors import StorageError
from hutch.storage.fs import FileHandle, FileSystem
from hutch.storage.stream_log import (
    DEFAULT_MAX_SEGMENT_SIZE_BYTES,
    DEFAULT_MAX_SEGMENT_SIZE_CHUNKS,
    FILE_HEADER_SIZE,
    MAX_POSITION,
    ChunkCursor,
    StreamLog,
    StreamLogOptions,
)

log = logging.getLogger("hutch.stream")


@dataclass
class StreamOptions:
    max_segment_size_bytes: int = DEFAULT_MAX_SEGMENT_SIZE_BYTES
    max_segment_size_chunks: int = DEFAULT_MAX_SEGMENT_SIZE_CHUNKS
    retention: Retention = field(default_factory=Retention)
    filter_size_bytes: int = ck.DEFAULT_FILTER_SIZE


@dataclass
class Appended:
    """The answer to one append. `settled` resolves once the chunk is committed (or fails with the
    storage error); with nothing stored (all duplicates) it is resolved already."""

    stored: list[int]
    duplicates: list[int]
    chunk_id: int  # -1: no chunk written
    first_offset: int
    last_offset: int
    settled: asyncio.Future[None]


@dataclass
class ReadChunk:
    header: ck.Header
    raw: bytes
    start: int  # the reader's first wanted offset within this chunk (the chunk id, or later)

    def records(self) -> Iterator[tuple[int, bytes]]:
        """(offset, record) of the chunk's records from `start` on (USER chunks only)."""
        if self.header.chunk_type != ck.USER:
            return
        for offset, record in ck.iter_records(self.raw):
            if offset >= self.start:
                yield offset, record


class StreamHandle:
    """One stream's log on this node, opened for writing. See the module docstring for the API."""

    def __init__(self, slog: StreamLog, options: StreamOptions, clock: Clock, tracking: trk.Tracking,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self.log = slog
        self.options = options
        self.clock = clock
        self.tracking = tracking
        self._the_loop = loop
        self.epoch = 1  # a stream of one node writes as osiris's first epoch; a replicated one sets its own
        self.auto_commit = True
        self.on_durable: list[Callable[[int], None]] = []
        # replication's hooks (runtime/queue_types/stream_replication/member.py): `gate()` raises when this
        # member may not write now (a replica, a writer being elected), `on_written(before)` is told of
        # every chunk this handle writes by itself (appends, offsets, a roll's snapshot)
        self.gate: Callable[[], None] | None = None
        self.on_written: Callable[[int], None] | None = None
        # and retention's: `retention_floor()` is the offset below which segments may go (the commit
        # point), `on_retained(first)` is told the new first offset after segments went
        self.retention_floor: Callable[[], int] | None = None
        self.on_retained: Callable[[int], None] | None = None
        self.committed_chunk_id = slog.last_chunk_id  # what is on disk at open was committed before
        self.durable_chunk_id = slog.last_chunk_id
        self._last_ts = slog.segments[-1].last_ts
        self._pending: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._listeners: list[Callable[[], None]] = []
        self._delete_listeners: list[Callable[[], None]] = []
        self._after_sync: list[Callable[[], None]] = []  # one-shot: told when the sync under way is answered
        self._sync_scheduled = False
        self._writer: WriterThread | None = None  # the stream's writer thread (writer.py), made at its first sync
        self._idle: asyncio.Future[None] | None = None  # resolved once the writer thread answered every request
        self._job: asyncio.Future[None] | None = None  # close()'s own sync, running in the executor
        self._closing: asyncio.Future[None] | None = None  # set by close(), resolved once the files are closed
        self.failed: BaseException | None = None
        self.closed = False
        self.chunks_written = 0
        self.syncs = 0
        self.last_sync_s = 0.0  # how long the writer thread's last fdatasync took

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the handle runs on (a handle opened before the loop ran takes it at first use)."""
        if self._the_loop is None:
            self._the_loop = asyncio.get_running_loop()
        return self._the_loop

    # -- opening ------------------------------------------------------------------------------------
    @classmethod
    async def open(cls, fs: FileSystem, directory: str, *, options: StreamOptions | None = None,
                   clock: Clock, first_offset: int = 0) -> StreamHandle:
        """Open (or create) the stream in `directory`: its files recovered and its tracking read back,
        in the executor (recovery reads the last segment)."""
        loop = asyncio.get_running_loop()
        opts = options or StreamOptions()
        slog, tracking = await loop.run_in_executor(None, _open_log, fs, directory, opts, first_offset)
        return cls(slog, opts, clock, tracking, loop)

    @classmethod
    def open_now(cls, fs: FileSystem, directory: str, *, options: StreamOptions | None = None,
                 clock: Clock, durable: bool = True) -> StreamHandle:
        """`open` on the calling thread (a declare, a restore at boot: recovery reads one segment's
        chunk headers). `durable=False` (a declare): a new stream's files are synced with its first data
        (storage/stream_log.py), so the declare itself costs no sync."""
        opts = options or StreamOptions()
        slog, tracking = _open_log(fs, directory, opts, 0, durable)
        return cls(slog, opts, clock, tracking, None)

    # -- offsets ------------------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        return self.log.first_offset

    @property
    def next_offset(self) -> int:
        """The offset the next record written gets."""
        return self.log.next_offset

    @property
    def last_chunk_id(self) -> int:
        return self.log.last_chunk_id

    @property
    def committed_offset(self) -> int:
        """The offset of the last committed record (-1: none)."""
        cid = self.committed_chunk_id
        if cid < 0:
            return -1
        if cid == self.log.last_chunk_id:
            return self.log.next_offset - 1
        found = self.log.locate(cid)
        if found is None:
            return cid
        seg, pos = found
        info = self.log.fmt.info(self.log.read_at(seg, pos, ck.HEADER_SIZE))
        return info.chunk_id + info.num_records - 1

    @property
    def segment_count(self) -> int:
        return len(self.log.segments)

    @property
    def size_bytes(self) -> int:
        return self.log.size_bytes

    # -- writing ------------------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.failed is not None:
            raise StorageError("append", self.log.directory, detail=f"the stream failed: {self.failed}")
        if self.closed:
            raise StorageError("append", self.log.directory, detail="the stream is closed")

    def _timestamp(self) -> int:
        self._last_ts = max(self._last_ts, self.clock.wall_ms())
        return self._last_ts

    def append(self, entries: Sequence[ck.Entry], *, publisher: bytes | None = None,
               publishing_ids: Sequence[int] | None = None,
               filter_values: Sequence[bytes | None] | None = None) -> Appended:
        """Write `entries` as one USER chunk (at most 65,535 entries). With `publisher` and
        `publishing_ids` (one per entry), entries whose id is at or below the publisher's last stored id
        are dropped as duplicates."""
        self._check_writable()
        if self.gate is not None:
            self.gate()
        ids: list[int] = list(publishing_ids or [])
        if publisher is not None and len(ids) != len(entries):
            raise ValueError("one publishing id per entry")
        values = list(filter_values) if filter_values is not None else None
        if values is not None and len(values) != len(entries):
            raise ValueError("one filter value (or None) per entry")
        keep = list(range(len(entries)))
        dups: list[int] = []
        if publisher is not None:
            last = self.tracking.sequence(publisher)
            keep, high = [], -1 if last is None else last
            for i, pid in enumerate(ids):
                if pid <= high:
                    dups.append(pid)
                else:
                    keep.append(i)
                    high = pid
        if not keep:
            done = self._loop.create_future()
            done.set_result(None)
            return Appended([], dups, -1, -1, -1, done)
        kept = [entries[i] for i in keep]
        trailer = b""
        if publisher is not None:
            trailer = trk.trailer_block(publisher, ids[keep[-1]])
        bits = ck.bloom([values[i] for i in keep], self.options.filter_size_bytes) if values else b""
        raw = self._write(kept, ck.USER, trailer, bits)
        header = ck.decode_header(raw)
        if publisher is not None:
            self.tracking.apply_trailer(trailer, header.chunk_id)
        fut = self._track_pending(header.chunk_id)
        return Appended([ids[i] for i in keep] if publisher is not None else [], dups, header.chunk_id,
                        header.chunk_id, header.next_offset - 1, fut)

    def append_encoded(self, data: Sequence[bytes], entries: int) -> Appended:
        """Write one USER chunk whose data section is the parts `data` joined, `entries` simple entries
        already framed (chunk.encode_entries' framing, as a stream-protocol publish carries them): no
        deduplication, no filter values (`append` for those)."""
        self._check_writable()
        if self.gate is not None:
            self.gate()
        self._write_data(data, entries, entries, ck.USER, b"", b"")
        chunk_id = self.log.last_chunk_id  # after the write: a roll may have put a tracking snapshot first
        assert self.log.next_offset == chunk_id + entries, "a chunk of simple entries: one record each"
        return Appended([], [], chunk_id, chunk_id, chunk_id + entries - 1, self._track_pending(chunk_id))

    def store_offset(self, reference: bytes, offset: int) -> Appended:
        """Store a consumer's offset (a TRACKING_DELTA chunk, committed like any chunk)."""
        return self.store_offsets([(reference, offset)])

    def store_offsets(self, offsets: Sequence[tuple[bytes, int]]) -> Appended:
        """Store consumers' offsets, (reference, offset) each, in one TRACKING_DELTA chunk (an entry
        each, applied in order: the last of a reference wins)."""
        assert offsets, "a tracking chunk of no offset"
        self._check_writable()
        if self.gate is not None:
            self.gate()
        blocks = [trk.offset_block(reference, offset) for reference, offset in offsets]
        raw = self._write(blocks, ck.TRACKING_DELTA, b"", b"")
        for block in blocks:
            self.tracking.apply(block)
        header = ck.decode_header(raw)
        return Appended([], [], header.chunk_id, header.chunk_id, header.chunk_id,
                        self._track_pending(header.chunk_id))

    def query_offset(self, reference: bytes) -> int | None:
        return self.tracking.offsets.get(reference)

    def query_publisher_sequence(self, reference: bytes) -> int:
        return self.tracking.sequence(reference) or 0

    def _write(self, entries: Sequence[ck.Entry], chunk_type: int, trailer: bytes, bits: bytes) -> bytes:
        """Encode and append one chunk, rolling first (with a tracking snapshot) when the segment is full."""
        data, records = ck.encode_entries(entries)
        return self._write_data((data,), len(entries), records, chunk_type, trailer, bits)

    def _write_data(self, data: Sequence[bytes], entries: int, records: int, chunk_type: int, trailer: bytes,
                    bits: bytes) -> bytes:
        """Append one chunk around an encoded data section (see `_write`)."""
        size = ck.HEADER_SIZE + len(bits) + sum(map(len, data)) + len(trailer)
        before = self.log.next_offset
        try:
            if self.log.would_roll(size):
                self.log.roll()
                self._after_roll()
            raw = ck.encode_data(data, entries=entries, records=records, chunk_type=chunk_type,
                                 timestamp=self._timestamp(), epoch=self.epoch, chunk_id=self.log.next_offset,
                                 trailer=trailer, filter_bits=bits)
            self.log.append(raw, self.log.fmt.info(raw[:ck.HEADER_SIZE]))
        except StorageError as exc:
            self._fail(exc)
            raise
        self.chunks_written += 1
        self._schedule_sync()
        if self.on_written is not None:
            self.on_written(before)
        return raw

    def _after_roll(self) -> None:
        """A new segment began: start it with a tracking snapshot, then apply retention."""
        if not self.tracking.is_empty():
            snap = self.tracking.snapshot()
            raw = ck.encode([snap], chunk_type=ck.TRACKING_SNAPSHOT, timestamp=self._timestamp(),
                            epoch=self.epoch, chunk_id=self.log.next_offset)
            self.log.append(raw, self.log.fmt.info(raw[:ck.HEADER_SIZE]))
        if not self._writer_pending():
            self.log.close_retired()
        self.apply_retention()

    def accept_chunk(self, raw: bytes) -> None:
        """A follower appends a chunk exactly as the leader wrote it (its id must be `next_offset`).

        Its segments roll where the leader's did: before a tracking snapshot (the leader writes one first
        in each new segment while there is tracking, and a writer one first in its epoch), so each
        segment opens with the tracking that recovery reads back from the last segment alone. By its own
        size rule it rolls only while there is no tracking to lose (the leader then rolls without a
        snapshot), or when the segment could not address the chunk otherwise."""
        self._check_writable()
        if not ck.verify(raw):
            raise ValueError("chunk does not verify (CRC or length)")
        header = ck.decode_header(raw)
        try:
            if self._follower_rolls(header.chunk_type, len(raw)):
                self.log.roll()
                if not self._writer_pending():
                    self.log.close_retired()
            self.log.append(raw, header.info())
        except StorageError as exc:
            self._fail(exc)
            raise
        _fold_tracking(self.tracking, raw)
        self._last_ts = max(self._last_ts, header.timestamp)
        self._schedule_sync()

    def _follower_rolls(self, chunk_type: int, size: int) -> bool:
        tail = self.log.segments[-1]
        if not tail.chunks:
            return False
        if chunk_type == ck.TRACKING_SNAPSHOT or tail.size + size > MAX_POSITION:
            return True
        return self.tracking.is_empty() and self.log.would_roll(size)

    def _track_pending(self, chunk_id: int) -> asyncio.Future[None]:
        fut = self._loop.create_future()
        self._pending.append((chunk_id, fut))
        return fut

    # -- syncing and committing ---------------------------------------------------------------------
    def _schedule_sync(self) -> None:
        if not self._sync_scheduled:
            self._sync_scheduled = True
            self._loop.call_soon(self._start_sync)

    def _start_sync(self) -> None:
        self._sync_scheduled = False
        if self.closed or self.failed is not None:
            return
        writer = self._writer
        handles = self.log.sync_handles()
        target = self.log.last_chunk_id
        if not handles:
            if writer is None or not writer.pending:  # (else the sync under way covers `target`)
                self._synced(target)
            return
        if writer is None:
            self._writer = writer = WriterThread(self._loop, self._sync_on_writer, self._sync_answered,
                                                 f"stream-writer {self.log.directory.rsplit('/', 1)[-1]}")
        writer.request(target, handles)

    def _sync_on_writer(self, handles: list[FileHandle]) -> None:
        """The writer thread's sync (timed: `last_sync_s`)."""
        started = time.perf_counter()
        try:
            sync_together(handles)
        finally:
            self.last_sync_s = time.perf_counter() - started

    def _sync_answered(self, seq: int, target: int, error: BaseException | None) -> None:
        """(On the loop) the writer thread synced up to `target` (or failed)."""
        writer = self._writer
        idle = writer is None or not writer.pending
        if idle:
            self.log.close_retired()
        if error is not None:
            self._fail(error)
        else:
            self._synced(target)
        if idle and self._idle is not None:
            if not self._idle.done():
                self._idle.set_result(None)
            self._idle = None
        self._run_after_sync()

    @property
    def syncing(self) -> bool:
        """A sync of the log is under way on the writer thread: a chunk written now waits for the next
        one (the stream protocol's publishers gather what arrives meanwhile into one chunk: `after_sync`)."""
        return self._writer_pending() and not self.closed and self.failed is None

    def after_sync(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once, when the writer thread answers its next sync (or the stream closes)."""
        self._after_sync.append(callback)

    def _run_after_sync(self) -> None:
        if self._after_sync:
            calls, self._after_sync = self._after_sync, []
            for fn in calls:
                fn()

    def _synced(self, chunk_id: int) -> None:
        self.syncs += 1
        if chunk_id <= self.durable_chunk_id:
            return
        self.durable_chunk_id = chunk_id
        for fn in list(self.on_durable):
            fn(chunk_id)
        if self.auto_commit:
            self.commit(chunk_id)

    def commit(self, chunk_id: int) -> None:
        """Move the commit point to `chunk_id` (the id of a chunk written here): settles the appends up
        to it and wakes readers. Never moves back."""
        if chunk_id <= self.committed_chunk_id:
            return
        self.committed_chunk_id = chunk_id
        pending = self._pending
        while pending and pending[0][0] <= chunk_id:
            _, fut = pending.popleft()
            if not fut.done():
                fut.set_result(None)
        for fn in list(self._listeners):
            fn()

    def on_commit(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` whenever the commit point moves; returns the function that removes it."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)
        return remove

    def on_delete(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once when the stream is deleted (by whatever path: the stream protocol,
        AMQP 0-9-1, management), before its files go."""
        self._delete_listeners.append(callback)

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            log.error("stream %s failed: %s", self.log.directory, exc)
        self.failed = exc
        while self._pending:
            _, fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(StorageError("append", self.log.directory, detail=f"stream write failed: {exc}"))

    # -- retention ----------------------------------------------------------------------------------
    def set_retention(self, retention: Retention) -> None:
        self.options.retention = retention
        self.apply_retention()

    def apply_retention(self) -> int:
        """Delete the whole segments the retention rule drops; returns how many went."""
        segs = self.log.segments
        drop = segments_to_drop([(s.size, s.last_ts) for s in segs], self.options.retention,
                                self.clock.wall_ms())
        if drop and self.retention_floor is not None:  # (replicated: only what is committed goes)
            floor = self.retention_floor()
            while drop and segs[drop - 1].next_offset > floor:
                drop -= 1
        if drop:
            self.log.delete_oldest(drop)
            if self.on_retained is not None:
                self.on_retained(self.log.first_offset)
            for fn in list(self._listeners):  # readers waiting in a deleted segment move on
                fn()
        return drop

    # -- reading ------------------------------------------------------------------------------------
    def reader(self, spec: OffsetSpec, *, committed_only: bool = True,
               include_tracking: bool = False) -> StreamReader:
        """A reader positioned by `spec` (queues/stream/offset_spec.py for the rules)."""
        slog = self.log
        start: int
        kind = spec.kind
        if kind is SpecKind.FIRST:
            start = slog.first_offset
        elif kind is SpecKind.NEXT:
            start = slog.next_offset
        elif kind is SpecKind.LAST:
            start = self._last_user_chunk()
        elif kind is SpecKind.OFFSET:
            start = min(max(spec.value, slog.first_offset), slog.next_offset)
        else:
            found = slog.locate_timestamp(spec.value)
            if found is None:
                start = slog.next_offset
            else:
                seg, pos = found
                start = slog.fmt.info(slog.read_at(seg, pos, ck.HEADER_SIZE)).chunk_id
        found = slog.locate(start)
        if found is None:  # at the end: wait at the tail
            seg = slog.segments[-1]
            cursor = ChunkCursor(slog, seg, seg.size, slog.next_offset)
        else:
            seg, pos = found
            cursor = ChunkCursor(slog, seg, pos, slog.fmt.info(slog.read_at(seg, pos, ck.HEADER_SIZE)).chunk_id)
        return StreamReader(self, cursor, start, committed_only, include_tracking)

    def _last_user_chunk(self) -> int:
        """The id of the last committed USER chunk (osiris's `last`), else the next offset."""
        slog = self.log
        for seg in reversed(slog.segments):
            for i in range(seg.chunks - 1, -1, -1):
                rec = slog.index_record(seg, i)
                if rec.chunk_id > self.committed_chunk_id:
                    continue
                if rec.chunk_type == ck.USER:
                    return rec.chunk_id
                if seg.chunks - i > 4096:  # bounded scan back through tracking chunks
                    return slog.next_offset
        return slog.next_offset

    # -- closing ------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Sync what was written and close the files. A second call (or a `delete`) made while a close is
        under way waits for it: the close's own sync runs in the executor on the files' descriptors."""
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return
        self._run_after_sync()  # what was gathered for the next chunk is written first: the close's sync covers it
        self.closed = True
        self._closing = done = self._loop.create_future()
        try:
            await self._quiesce()
            if self.failed is None:
                self._job = job = self._loop.run_in_executor(None, self.log.sync)
                try:
                    await asyncio.shield(job)
                except StorageError as exc:
                    self._fail(exc)
                finally:
                    await self._quiesce()
                    self._job = None
                if self.failed is None:
                    self._synced(self.log.last_chunk_id)
            self._stop_writer()
            self.log.close()
        finally:
            done.set_result(None)
        for _, fut in self._pending:  # (replicated: appends no majority committed are not confirmed)
            if not fut.done():
                fut.set_exception(StorageError("append", self.log.directory, detail="the stream was closed"))
        self._pending.clear()

    async def delete(self) -> None:
        """Close and delete the stream's files (after a close or a sync under way)."""
        self.closed = True
        self._run_after_sync()  # (refused: the stream is gone)
        listeners, self._delete_listeners = self._delete_listeners, []
        for fn in listeners:
            fn()
        for _, fut in self._pending:
            if not fut.done():
                fut.set_exception(StorageError("append", self.log.directory, detail="the stream was deleted"))
        self._pending.clear()
        if self._closing is not None:
            await asyncio.shield(self._closing)
        await self._quiesce()
        self._stop_writer()
        await self._loop.run_in_executor(None, self.log.destroy)

    def _writer_pending(self) -> bool:
        return self._writer is not None and self._writer.pending

    async def _quiesce(self) -> None:
        """Wait for the syncs under way (the writer thread's, close()'s in the executor): their
        descriptors are about to be closed."""
        while self._writer_pending():
            if self._idle is None:
                self._idle = self._loop.create_future()
            await asyncio.shield(self._idle)
        job = self._job
        if job is not None:
            await asyncio.wait([job])

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._writer.stop()
            self._writer = None


class StreamReader:
    """Reads committed chunks from the files, from its start offset on. Holds only its position.

    `next_chunk()` returns the next chunk (USER chunks only unless `include_tracking`), or None when it
    has read everything committed; `handle.on_commit` says when to try again. If retention deleted the
    segment it was in, it moves to the new first chunk (`moved` counts it)."""

    def __init__(self, handle: StreamHandle, cursor: ChunkCursor, start: int, committed_only: bool,
                 include_tracking: bool) -> None:
        self.handle = handle
        self.cursor = cursor
        self.start = start
        self.committed_only = committed_only
        self.include_tracking = include_tracking

    @property
    def next_offset(self) -> int:
        return max(self.cursor.next_id, self.start)

    @property
    def moved(self) -> int:
        return self.cursor.skipped

    def close(self) -> None:
        """Release the segment file the reader keeps open (its owner calls it when the reader goes; a
        reader used again reopens it)."""
        self.cursor.close()

    def next_chunk(self) -> ReadChunk | None:
        h = self.handle
        limit = h.committed_chunk_id if self.committed_only else h.log.last_chunk_id
        while True:
            skipped = self.cursor.skipped
            got = self.cursor.next(limit)
            if self.cursor.skipped != skipped:
                self.start = max(self.start, h.log.first_offset) if self.start >= h.log.first_offset \
                    else h.log.first_offset
            if got is None:
                return None
            _, raw = got
            header = ck.decode_header(raw)
            if header.chunk_type != ck.USER and not self.include_tracking:
                continue
            if header.next_offset <= self.start:
                continue
            return ReadChunk(header, raw, max(self.start, header.chunk_id))


def _fold_tracking(tracking: trk.Tracking, raw: bytes) -> None:
    """Apply a chunk's tracking (a snapshot replaces, a delta adds, a user chunk's trailer adds)."""
    header, _, data, trailer = ck.parts(raw)
    if header.chunk_type == ck.USER:
        if len(trailer):
            tracking.apply_trailer(trailer, header.chunk_id)
        return
    if header.chunk_type == ck.TRACKING_SNAPSHOT:
        tracking.sequences.clear()
        tracking.offsets.clear()
    for entry in ck.iter_entries(data):
        if isinstance(entry, bytes):
            tracking.apply(entry)


def _open_log(fs: FileSystem, directory: str, opts: StreamOptions,
              first_offset: int, durable: bool = True) -> tuple[StreamLog, trk.Tracking]:
    slog = StreamLog.open(fs, directory, ck.FORMAT,
                          StreamLogOptions(opts.max_segment_size_bytes, opts.max_segment_size_chunks),
                          first_offset, durable=durable)
    tracking = trk.Tracking()
    tail = slog.segments[-1]
    pos = FILE_HEADER_SIZE
    for _ in range(tail.chunks):  # the last segment holds (from its snapshot on) everything tracked
        header = ck.decode_header(slog.read_at(tail, pos, ck.HEADER_SIZE))
        if header.chunk_type == ck.USER:
            if header.trailer_size:
                tracking.apply_trailer(slog.read_at(tail, pos + header.size - header.trailer_size,
                                                    header.trailer_size), header.chunk_id)
        else:
            _fold_tracking(tracking, slog.read_at(tail, pos, header.size))
        pos += header.size
    return slog, tracking
