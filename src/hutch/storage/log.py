"""A segmented, append-only, checksummed log with group commit: the base of every durable stream in hutch.

Owns the segment files of one log directory: their names, their contents, rollover, recovery, and the
sequence numbers of entries. It knows nothing about what entries mean (the queue index, the message store
and the node's Raft WAL put their own records inside entries).

Model. Each entry gets the next sequence number (``seq``, from 1 unless told otherwise) when it is appended.
``append`` only adds to an in-memory *pending batch*. A sync takes the pending batch (up to
``max_batch_bytes``) and writes it as **one record** (records.py framing, type ``BATCH``) with **one
fdatasync**: group commit. ``synced_seq`` is the last seq known durable. Segment files are named by the seq
of their first entry (``00000000000000000001.seg``) and a new one starts when the next record would take the
current one past ``segment_max_bytes`` (a single oversized batch may exceed it).

Batch record payload (little-endian)::

    u8 version (1) | u64 first_seq | u32 count | count x u32 entry length | entry bytes, concatenated

Threading contract (the log itself starts no thread and does no asyncio)::

    job = log.begin_sync()     # loop thread: swaps the pending batch out; None when nothing is pending
    job.run()                  # any ONE thread (an executor): write + fdatasync; never raises StorageError
    seq = job.complete()       # loop thread, after run() returned: advances synced_seq, or raises the error

Between ``begin_sync`` and ``complete`` the loop thread may keep calling ``append`` (the entries join the
next batch), ``read_from`` and ``truncate_before``; ``run`` touches only the job's own bytes, the file handle
that the job owns until ``complete``, and the thread-safe FileSystem. At most one job is in flight:
``begin_sync`` raises while one is. That rule is also what the crash-safety argument needs (a record is
only ever written after every earlier record is durable; docs/storage.md). ``sync()`` does all three steps
inline for callers with no loop.

Failures: a failed write (ENOSPC, ...) is cleaned up in ``run`` (the file is cut back to where the job
started), and ``complete`` puts the entries back at the head of the pending batch and raises; the log stays
usable and a later sync retries. A failed fdatasync, or a failed clean-up, poisons the log: after EIO from
fdatasync the kernel may have dropped the dirty pages, so nothing in memory can be trusted; every later call
raises :class:`LogFailed` and the owner must reopen the log, which re-verifies the files.

Recovery (``SegmentedLog.open``): the last segment is read and verified; a torn tail is truncated (the
report says how many bytes were dropped), an empty last segment is deleted, damage followed by valid data
raises :class:`CorruptRecord`. Older segments are verified when read (or at open with ``verify_all``).
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hutch.storage import records
from hutch.storage.errors import CorruptRecord, LogFailed, StorageError
from hutch.storage.fs import Bytes, FileHandle, FileSystem

BATCH = 1
"""Record type of a batch of entries."""
BATCH_VERSION = 1
BATCH_HEAD = struct.Struct("<BQI")  # version, first_seq, count
RECORD_TYPES = frozenset({BATCH})
SEGMENT_SUFFIX = ".seg"
"""Segment files are ``<first seq, 20 digits>.seg``; the suffix names format version 1 of the framing."""
MAX_RECORD_PAYLOAD_BYTES = 256 * 1024 * 1024
"""A format constant, not an option: a reader must never take a valid old record for damage."""
_ENTRY_OVERHEAD = 4  # its u32 length in the batch
_NATIVE_LITTLE = sys.byteorder == "little"
_U32 = "I" if array("I").itemsize == 4 else "L"  # an array typecode of exactly 4 bytes


@dataclass(frozen=True)
class LogOptions:
    segment_max_bytes: int = 16 * 1024 * 1024
    """Start a new segment file before a record would take the current one past this size."""
    max_batch_bytes: int = 4 * 1024 * 1024
    """Most entry bytes (+4 per entry) one sync writes; the rest waits for the next sync."""
    max_entry_bytes: int = 128 * 1024 * 1024
    """Largest single entry ``append`` accepts."""
    verify_all_on_open: bool = False
    """Read and verify every segment at open, not only the last one."""

    def __post_init__(self) -> None:
        limit = MAX_RECORD_PAYLOAD_BYTES - BATCH_HEAD.size - _ENTRY_OVERHEAD
        if not 0 < self.max_batch_bytes <= limit or not 0 < self.max_entry_bytes <= limit:
            raise ValueError(f"max_batch_bytes and max_entry_bytes must be in 1..{limit}")
        if self.segment_max_bytes <= 0:
            raise ValueError("segment_max_bytes must be positive")


@dataclass
class Segment:
    first_seq: int
    path: str
    size: int  # Invariant: bytes written by completed syncs; always a record boundary
    last_seq: int  # first_seq - 1 while empty


@dataclass
class RecoveryReport:
    """What ``open`` found and did; log it at start-up."""

    segments: int = 0
    last_seq: int = 0
    torn_tail: records.TornTail | None = None
    torn_segment: str | None = None
    deleted_empty_segment: str | None = None
    ignored_files: list[str] = field(default_factory=list)


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    stem = name[: -len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


def encode_batch(first_seq: int, entries: list[bytes]) -> bytes:
    """The framed BATCH record holding ``entries`` numbered from ``first_seq``."""
    lengths = array(_U32, map(len, entries))
    if not _NATIVE_LITTLE:
        lengths.byteswap()
    head = BATCH_HEAD.pack(BATCH_VERSION, first_seq, len(entries))
    return b"".join(records.encode_parts(BATCH, [head, lengths.tobytes(), *entries]))


def decode_batch(record: records.Record, file: str) -> tuple[int, array[int], int]:
    """``(first_seq, entry lengths, offset of the first entry in the payload)`` of a BATCH record.

    The checksum already passed; a structure that still does not add up is reported as corruption.
    """
    payload = record.payload
    if len(payload) < BATCH_HEAD.size:
        raise CorruptRecord(file, record.offset, "batch shorter than its header")
    version, first_seq, count = BATCH_HEAD.unpack_from(payload)
    if version != BATCH_VERSION:
        raise CorruptRecord(file, record.offset, f"unknown batch version {version}")
    start = BATCH_HEAD.size + 4 * count
    if start > len(payload):
        raise CorruptRecord(file, record.offset, f"batch of {count} entries is cut short")
    lengths = array(_U32)
    lengths.frombytes(payload[BATCH_HEAD.size:start])
    if not _NATIVE_LITTLE:
        lengths.byteswap()
    if start + sum(lengths) != len(payload):
        raise CorruptRecord(file, record.offset, "batch entry lengths do not add up to its size")
    return first_seq, lengths, start


class SyncJob:
    """One group commit: a record to write and fdatasync. Made by ``SegmentedLog.begin_sync``."""

    def __init__(self, log: SegmentedLog, first_seq: int, entries: list[bytes], data: bytes,
                 path: str, new_segment: bool, handle: FileHandle | None, start_offset: int) -> None:
        self.first_seq = first_seq
        self.last_seq = first_seq + len(entries) - 1
        self.entries = entries
        self.data = data
        self.path = path
        self.new_segment = new_segment
        self.start_offset = start_offset
        self.error: StorageError | None = None
        self.fatal = False  # the error poisons the log
        self._log = log
        self._handle = handle  # Invariant: owned by this job from begin_sync until complete
        self._ran = False
        self._completed = False

    def run(self) -> None:
        """Write and fdatasync the batch. Thread-safe with respect to the log; call exactly once.

        Never raises for an IO failure: the outcome is kept for ``complete()``, which must always follow.
        """
        if self._ran:
            raise RuntimeError("SyncJob.run called twice")
        self._ran = True
        fs = self._log.fs
        wrote = False
        try:
            if self.new_segment:
                if self._handle is not None:
                    old, self._handle = self._handle, None
                    _close_quietly(old)  # everything in the old segment is already durable
                self._handle = fs.open_append(self.path)
            elif self._handle is None:  # e.g. after a failed sync that had to close it
                self._handle = fs.open_append(self.path)
            self._handle.write(self.data)
            wrote = True
            self._handle.sync()
            if self.new_segment:
                fs.fsync_dir(self._log.directory)  # the new file's name must survive a crash too
        except StorageError as exc:
            self.error = exc
            self.fatal = wrote or not self._clean_up()
        except Exception as exc:  # a bug below us: report it through complete(), and trust nothing after it
            self.error = StorageError("sync", self.path, None, f"unexpected {exc!r}")
            self.error.__cause__ = exc
            self.fatal = True

    def _clean_up(self) -> bool:
        """After a failed write: remove what part of it landed. False if that failed too."""
        fs = self._log.fs
        try:
            if self.new_segment:
                if self._handle is not None:
                    _close_quietly(self._handle)
                    self._handle = None
                if fs.exists(self.path):
                    fs.delete(self.path)
                    fs.fsync_dir(self._log.directory)
            else:
                fs.truncate(self.path, self.start_offset)
        except StorageError:
            return False
        return True

    def complete(self) -> int:
        """Apply the outcome on the loop thread: the new ``synced_seq``, or raise the job's error."""
        if not self._ran or self._completed:
            raise RuntimeError("SyncJob.complete must be called once, after run()")
        self._completed = True
        return self._log._complete(self, self._handle)


def _close_quietly(handle: FileHandle) -> None:
    try:
        handle.close()
    except StorageError:
        pass


class SegmentedLog:
    """An open log directory. Create with :meth:`open`. See the module docstring for the contract."""

    def __init__(self, fs: FileSystem, directory: str, options: LogOptions, segments: list[Segment],
                 handle: FileHandle | None, next_seq: int, report: RecoveryReport) -> None:
        self.fs = fs
        self.directory = directory
        self.options = options
        self.recovery = report
        self._segments = segments
        self._handle = handle  # of the last segment; None while a job owns it or before the first write
        self._next_seq = next_seq
        self._synced_seq = next_seq - 1  # Invariant: everything up to here is durable
        self._pending: list[bytes] = []
        self._job: SyncJob | None = None
        self._failed: StorageError | None = None
        self._closed = False

    # -- opening and recovery -----------------------------------------------------------------------
    @classmethod
    def open(cls, fs: FileSystem, directory: str, options: LogOptions | None = None, *,
             first_seq: int = 1) -> SegmentedLog:
        """Open (creating if needed) the log in ``directory`` and recover it.

        ``first_seq`` numbers the first entry of a log that has no segment yet; otherwise it is ignored.
        """
        options = options or LogOptions()
        fs.make_dirs(directory)
        report = RecoveryReport()
        found: list[tuple[int, str]] = []
        for name in fs.list_dir(directory):
            seq = parse_segment_name(name)
            if seq is None:
                report.ignored_files.append(name)
            else:
                found.append((seq, f"{directory}/{name}"))
        found.sort()
        segments = [Segment(seq, path, fs.size(path), nxt - 1)
                    for (seq, path), (nxt, _) in zip(found, found[1:], strict=False)]
        handle: FileHandle | None = None
        next_seq = first_seq
        if found:
            last = cls._recover_last(fs, directory, *found[-1], report)
            if last is None and not segments:
                next_seq = found[-1][0]  # the deleted segment was named by the next seq to write
            if last is not None:
                segments.append(last)
                handle = fs.open_append(last.path)
                try:
                    # What we just read may sit only in the page cache (after a failed sync, say), and
                    # its name too (a failed sync of a new segment): make both durable before trusting them.
                    handle.sync()
                    fs.fsync_dir(directory)
                except StorageError:
                    _close_quietly(handle)
                    raise
            if segments:
                next_seq = segments[-1].last_seq + 1
        log = cls(fs, directory, options, segments, handle, next_seq, report)
        if options.verify_all_on_open:
            for _ in log.read_from(log.first_seq):
                pass
        report.segments = len(segments)
        report.last_seq = next_seq - 1
        return log

    @staticmethod
    def _recover_last(fs: FileSystem, directory: str, first_seq: int, path: str,
                      report: RecoveryReport) -> Segment | None:
        data = fs.read(path)
        result = records.scan(data, file=path, max_payload_bytes=MAX_RECORD_PAYLOAD_BYTES, types=RECORD_TYPES)
        expected = first_seq
        for record in result.records:
            batch_first, lengths, _ = decode_batch(record, path)
            if batch_first != expected:
                raise CorruptRecord(path, record.offset, f"batch starts at seq {batch_first}, expected {expected}")
            expected += len(lengths)
        if result.torn_tail is not None:
            report.torn_tail = result.torn_tail
            report.torn_segment = path
            fs.truncate(path, result.valid_length)
        if result.valid_length == 0:
            # Created by a sync that never completed: nothing in it was ever acknowledged.
            fs.delete(path)
            fs.fsync_dir(directory)
            report.deleted_empty_segment = path
            return None
        return Segment(first_seq, path, result.valid_length, expected - 1)

    # -- state ----------------------------------------------------------------------------------------
    @property
    def first_seq(self) -> int:
        """The first seq still stored (entries before it were truncated)."""
        return self._segments[0].first_seq if self._segments else self._synced_seq + 1

    @property
    def last_seq(self) -> int:
        """The last seq appended (synced or not)."""
        return self._next_seq - 1

    @property
    def synced_seq(self) -> int:
        """The last seq known durable."""
        return self._synced_seq

    @property
    def pending_count(self) -> int:
        """Entries appended and not yet taken by a sync job."""
        return len(self._pending)

    @property
    def sync_in_flight(self) -> bool:
        return self._job is not None

    def segments(self) -> list[Segment]:
        return [Segment(s.first_seq, s.path, s.size, s.last_seq) for s in self._segments]

    # -- writing --------------------------------------------------------------------------------------
    def append(self, payloads: Iterable[Bytes]) -> int:
        """Add entries to the pending batch; returns the seq of the last one. No IO."""
        self._check_usable()
        limit = self.options.max_entry_bytes
        batch = [p if type(p) is bytes else bytes(p) for p in payloads]
        for p in batch:
            if len(p) > limit:
                raise ValueError(f"entry of {len(p)} bytes is over max_entry_bytes={limit}")
        self._pending.extend(batch)
        self._next_seq += len(batch)
        return self._next_seq - 1

    def begin_sync(self) -> SyncJob | None:
        """Take the pending batch (up to ``max_batch_bytes``) as a job to run; None if nothing is pending."""
        self._check_usable()
        if self._job is not None:
            raise RuntimeError("a sync job is already in flight; complete it first")
        if not self._pending:
            return None
        budget = self.options.max_batch_bytes
        taken = 0
        count = 0
        for entry in self._pending:
            cost = len(entry) + _ENTRY_OVERHEAD
            if count and taken + cost > budget:
                break
            taken += cost
            count += 1
        entries = self._pending[:count]
        del self._pending[:count]
        first_seq = self._synced_seq + 1
        data = encode_batch(first_seq, entries)
        active = self._segments[-1] if self._segments else None
        if active is None or (active.size > 0 and active.size + len(data) > self.options.segment_max_bytes):
            job = SyncJob(self, first_seq, entries, data, f"{self.directory}/{segment_name(first_seq)}",
                          True, self._handle, 0)
        else:
            job = SyncJob(self, first_seq, entries, data, active.path, False, self._handle, active.size)
        self._handle = None
        self._job = job
        return job

    def _complete(self, job: SyncJob, handle: FileHandle | None) -> int:
        self._job = None
        if job.error is not None:
            if job.fatal:
                if handle is not None:
                    _close_quietly(handle)
                self._failed = job.error
                raise job.error
            # Nothing of the batch is left on disk; its entries go back to the head of the queue.
            self._pending[:0] = job.entries
            if job.new_segment:
                self._handle = None  # the old segment's handle was closed; reopened on demand
            else:
                self._handle = handle
            raise job.error
        if job.new_segment:
            self._segments.append(Segment(job.first_seq, job.path, len(job.data), job.last_seq))
        else:
            active = self._segments[-1]
            active.size += len(job.data)
            active.last_seq = job.last_seq
        self._handle = handle
        assert job.last_seq >= self._synced_seq  # what was durable stays durable
        self._synced_seq = job.last_seq
        return self._synced_seq

    def sync(self) -> int:
        """Write and fdatasync everything appended so far, inline. Returns ``synced_seq``."""
        while (job := self.begin_sync()) is not None:
            job.run()
            job.complete()
        return self._synced_seq

    # -- reading --------------------------------------------------------------------------------------
    def read_from(self, seq: int, *, include_unsynced: bool = False) -> Iterator[tuple[int, bytes]]:
        """Yield ``(seq, entry)`` in order from ``seq`` up to ``synced_seq`` as of this call.

        With ``include_unsynced``, then the entries of the sync in flight and the pending batch. Reads
        segment files (IO); raises :class:`CorruptRecord` on damage. Segments deleted by a
        ``truncate_before`` while this iterator is open make it fail: truncate only below what is read.
        """
        self._check_usable()
        if seq < self.first_seq:
            raise ValueError(f"seq {seq} was truncated; the log starts at {self.first_seq}")
        segments = [(s.path, s.size, s.first_seq, s.last_seq) for s in self._segments]
        upto = self._synced_seq
        extra: list[bytes] = []
        if include_unsynced:
            extra = (self._job.entries if self._job else []) + self._pending
        return self._read(segments, seq, upto, extra)

    def _read(self, segments: list[tuple[str, int, int, int]], seq: int, upto: int,
              extra: list[bytes]) -> Iterator[tuple[int, bytes]]:
        firsts = [first for _, _, first, _ in segments]
        index = max(0, bisect.bisect_right(firsts, seq) - 1)
        for path, size, first, last in segments[index:]:
            if first > upto:
                break
            yield from self._read_segment(path, size, first, last, seq, upto)
        for i, entry in enumerate(extra, start=upto + 1):
            if i >= seq:
                yield i, entry

    def _read_segment(self, path: str, size: int, first: int, last: int, seq: int,
                      upto: int) -> Iterator[tuple[int, bytes]]:
        data = self.fs.read(path, 0, size)
        if len(data) < size:
            raise CorruptRecord(path, len(data), f"segment is {len(data)} bytes, {size} were synced")
        result = records.scan(data, file=path, max_payload_bytes=MAX_RECORD_PAYLOAD_BYTES, types=RECORD_TYPES)
        if result.torn_tail is not None:  # synced bytes must be whole: this is damage, not a torn write
            raise CorruptRecord(path, result.torn_tail.offset, result.torn_tail.reason)
        expected = first
        for record in result.records:
            batch_first, lengths, pos = decode_batch(record, path)
            if batch_first != expected:
                raise CorruptRecord(path, record.offset, f"batch starts at seq {batch_first}, expected {expected}")
            expected += len(lengths)
            if expected <= seq:
                pos += sum(lengths)
                continue
            payload = record.payload
            for i, length in enumerate(lengths, start=batch_first):
                if i > upto:
                    return
                if i >= seq:
                    yield i, bytes(payload[pos:pos + length])
                pos += length
        if expected - 1 != last:
            raise CorruptRecord(path, size, f"segment ends at seq {expected - 1}, the next one starts at {last + 1}")

    # -- truncation and closing -----------------------------------------------------------------------
    def truncate_before(self, seq: int) -> int:
        """Delete every segment whose entries are all below ``seq``; returns how many. Never the last one.

        Entries below ``seq`` that share a segment with ``seq`` stay. Does IO (unlink + one directory
        fsync) on the calling thread; the split form is ``begin_truncate_before(seq)`` + ``run()``.
        """
        job = self.begin_truncate_before(seq)
        job.run()
        return len(job.paths)

    def begin_truncate_before(self, seq: int) -> TruncateJob:
        """Forget the segments below ``seq`` now (no IO); the returned job deletes their files."""
        self._check_usable()
        count = 0
        while count + 1 < len(self._segments) and self._segments[count + 1].first_seq <= seq:
            count += 1
        gone = self._segments[:count]
        del self._segments[:count]
        return TruncateJob(self.fs, self.directory, [s.path for s in gone])

    def close(self) -> None:
        """Release the file handle. Does not sync: entries not yet synced are dropped."""
        if self._job is not None:
            raise RuntimeError("cannot close a log with a sync job in flight")
        if self._handle is not None:
            _close_quietly(self._handle)
            self._handle = None
        self._closed = True

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise LogFailed(self.directory, self._failed)
        if self._closed:
            raise StorageError("use", self.directory, None, "log is closed")


@dataclass
class TruncateJob:
    """Deletes segment files the log has already forgotten. ``run`` is thread-safe; oldest first."""

    fs: FileSystem
    directory: str
    paths: list[str]

    def run(self) -> None:
        # Oldest first, so a crash that keeps only some unlinks leaves a contiguous suffix of segments.
        for path in self.paths:
            self.fs.delete(path)
        if self.paths:
            self.fs.fsync_dir(self.directory)
