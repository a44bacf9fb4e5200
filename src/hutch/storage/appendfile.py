"""Append-only files written in batches: the unit the queue index and the message store are made of.

Owns: one file, the entries appended to it since the last flush (kept in memory), and its sizes. Entries
are buffered by `add`; `flush` writes everything buffered as **one** framed record (records.py: length,
crc32, type), so a file is a sequence of checksummed batch records and a crash can tear at most the last
one. `sync` (fdatasync) may run in another thread; every other method belongs to the owner's thread.

File header: a new file starts with one plain record of type `FILE_HEADER_TYPE` whose payload is
``b"HUTCHAF1"`` + a random ``u32`` seed; every later record's crc32 starts from that seed (records.py).
Entries carry client bytes (message bodies); without the seed a body could hold a well-formed record that
recovery would take as evidence of damage in the middle of the file (refusing to start after an ordinary
torn write) or that salvage would resurrect. With it, a forged record must guess 32 random bits.

Entry framing inside a batch record's payload: ``u32 length`` then the entry bytes. `add` returns the
file offset at which the entry's bytes will sit once flushed, so a reader can later fetch one entry with a
single positioned read (the message store does; it checks its own per-entry checksum).

Rules:
- `size` counts flushed bytes only; `pending_bytes` the buffered entries (framing included).
- A file's directory entry is synced with its first fdatasync (a new file is durable only then).
- `needs_sync` is set by `add(..., durable=True)` and by every flush (data written but not yet known to be
  on disk); the group-commit driver clears it when it syncs the file.
- A failed write is rolled back: the file is truncated to its last good size and the batch stays
  buffered, so ENOSPC never leaves half a record behind.
"""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from hutch.storage import records
from hutch.storage.errors import CorruptRecord, StorageError
from hutch.storage.fs import FileHandle, FileSystem

ENTRY_LEN = struct.Struct("<I")
FILE_HEADER_TYPE = 0x7E
FILE_MAGIC = b"HUTCHAF1"
FILE_HEADER_BYTES = records.HEADER_BYTES + len(FILE_MAGIC) + 4
MAX_RECORD_PAYLOAD_BYTES = 0xFFFFFFFF  # a batch may be as large as the u32 length field allows


def file_header(seed: int) -> bytes:
    return records.encode(FILE_HEADER_TYPE, FILE_MAGIC + seed.to_bytes(4, "little"))


def read_seed(data: bytes | memoryview) -> int | None:
    """The seed in a file's header, or None when the header is missing or not whole (a file torn right
    after it was created holds nothing else)."""
    view = memoryview(data)
    if len(view) < FILE_HEADER_BYTES:
        return None
    problem, rtype, length = records.check_at(view, 0, 64, frozenset({FILE_HEADER_TYPE}))
    if problem or length != len(FILE_MAGIC) + 4 or bytes(view[9:17]) != FILE_MAGIC:
        return None
    return int.from_bytes(view[17:21], "little")


def scan_file(data: bytes, path: str, rtype: int) -> tuple[int, records.ScanResult]:
    """(seed, records after the header) of a whole append file. A missing or torn header with nothing
    valid after it is a torn file (empty, truncate to 0); a bad header followed by data is damage."""
    seed = read_seed(data)
    if seed is None:
        if not data:
            return 0, records.ScanResult([], 0)
        if len(data) < FILE_HEADER_BYTES + records.HEADER_BYTES:
            return 0, records.ScanResult([], 0, records.TornTail(0, "incomplete file header", len(data)))
        raise CorruptRecord(path, 0, "bad file header")
    result = records.scan(data, file=path, start=FILE_HEADER_BYTES, max_payload_bytes=MAX_RECORD_PAYLOAD_BYTES,
                          types=frozenset({rtype}), seed=seed)
    return seed, result


class AppendFile:
    __slots__ = ("fs", "path", "rtype", "handle", "_buffer", "pending_bytes", "size", "needs_sync",
                 "durable_pending", "closed", "_new_entry", "seed", "_header", "__weakref__")

    def __init__(self, fs: FileSystem, path: str, rtype: int, size: int = 0, seed: int = 0) -> None:
        """A new file (`size` 0) gets a fresh seed and header; an existing one needs its `seed`."""
        self.fs = fs
        self.path = path
        self.rtype = rtype
        self.handle: FileHandle | None = None
        self._buffer: list[bytes] = []
        self.pending_bytes = 0
        self.size = size  # flushed bytes (a record boundary)
        self.needs_sync = False  # written (or to be written) data not yet fdatasync'd
        self.durable_pending = False  # buffered entries include one somebody waits to see synced
        self.closed = False
        self._new_entry = False  # the file was created: its directory entry needs a sync too
        if size == 0:
            seed = secrets.randbits(32) | 1
            self._header = file_header(seed)  # written with the first flush
        else:
            self._header = b""
        self.seed = seed

    def add(self, entry: bytes, durable: bool = False) -> int:
        """Buffer one entry; returns the offset its bytes will have in the file."""
        offset = self.size + len(self._header) + records.HEADER_BYTES + self.pending_bytes + 4
        self.put(entry, durable)
        return offset

    def put(self, entry: bytes, durable: bool = False) -> None:
        """Buffer one entry, for writers that do not need its offset (the queue index; `add` also
        returns it)."""
        buffer = self._buffer
        buffer.append(ENTRY_LEN.pack(len(entry)))
        buffer.append(entry)
        self.pending_bytes += 4 + len(entry)
        if durable:
            self.durable_pending = True

    @property
    def dirty(self) -> bool:
        return bool(self._buffer)

    def buffered_entries(self) -> list[bytes]:
        """The entries not flushed yet, in order (readers parse them after the file's records)."""
        return self._buffer[1::2]

    def buffered_entry(self, offset: int, length: int) -> bytes | None:
        """An entry still in the buffer (by the offset `add` returned), or None if already flushed."""
        if offset < self.size:
            return None
        pos = self.size + len(self._header) + records.HEADER_BYTES
        for i in range(0, len(self._buffer), 2):
            entry = self._buffer[i + 1]
            pos += 4
            if pos == offset:
                return entry[:length]
            pos += len(entry)
        return None

    def flush(self) -> bool:
        """Write the buffered entries as one record. Returns True when something was written."""
        if not self._buffer:
            return False
        if self.closed:
            raise StorageError("write", self.path, detail="file already closed")
        if self.handle is None:
            if self.size == 0 and not self.fs.exists(self.path):
                self._new_entry = True
            self.handle = self.fs.open_append(self.path)
        # one checksum over the joined batch: a batch of small entries would otherwise cost one crc32
        # call per part (two per entry)
        payload = b"".join(self._buffer)
        data = b"".join((self._header, records.header_for(self.rtype, payload, self.seed), payload))
        try:
            self.handle.write(data)
        except StorageError:
            self._roll_back()
            raise
        self.size += len(data)
        self._header = b""
        self._buffer = []
        self.pending_bytes = 0
        self.needs_sync = True
        self.durable_pending = False
        return True

    def _roll_back(self) -> None:
        try:
            self.fs.truncate(self.path, self.size)
        except StorageError:
            pass

    def sync(self) -> None:
        """fdatasync what was flushed (thread-safe with respect to the owner's later flushes)."""
        handle = self.handle
        if handle is not None:
            handle.sync()
            if self._new_entry:
                self.fs.fsync_dir(os.path.dirname(self.path))
                self._new_entry = False

    def release_handle(self) -> None:
        """Close the descriptor of an idle file (flushed and synced); the next flush opens it again."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()

    def close(self) -> None:
        self.closed = True
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()


def iter_entries(payload: memoryview) -> Iterator[memoryview]:
    """The entries of one batch record's payload, in order."""
    pos = 0
    end = len(payload)
    unpack = ENTRY_LEN.unpack_from
    while pos < end:
        (length,) = unpack(payload, pos)
        pos += 4
        if pos + length > end:
            raise ValueError(f"entry of {length} bytes runs past the end of its batch record")
        yield payload[pos:pos + length]
        pos += length


class SyncReceipt(Protocol):
    """What a publisher waits on (core/confirms.py's Receipt, seen structurally: storage imports no one)."""

    def settle(self, queue: Any) -> None: ...

    def reject(self, queue: Any, error: str | None = None) -> None: ...


class SyncSink(Protocol):
    """Where writers report files to flush and sync: the node's group-commit driver (runtime) or
    `ManualSink` (tests, offline tools)."""

    congested: bool  # the disk is behind what arrives: writers' publishers should pause

    def touch(self, file: AppendFile, durable: bool) -> None:
        """`file` has buffered entries; `durable`: a confirm waits for them to reach the disk."""

    def retire(self, file: AppendFile, delete: bool) -> None:
        """Close `file` (and delete it when `delete`) once no sync job still uses it."""

    def after_sync(self, fn: Callable[[], None]) -> None:
        """Run `fn` once everything touched so far is flushed and synced."""

    def confirm_after_sync(self, receipt: SyncReceipt, queue: Any) -> None:
        """`receipt.settle(queue)` once everything touched so far is on disk; `receipt.reject(queue,
        error)` if that cannot happen (storage failed). Never called back from inside this call."""


class ManualSink:
    """A synchronous SyncSink: nothing happens until `commit()` flushes and syncs every touched file."""

    def __init__(self) -> None:
        self.touched: dict[AppendFile, None] = {}
        self.callbacks: list[Callable[[], None]] = []
        self.receipts: list[tuple[SyncReceipt, Any]] = []
        self.commits = 0
        self.congested = False

    def touch(self, file: AppendFile, durable: bool) -> None:
        self.touched[file] = None

    def retire(self, file: AppendFile, delete: bool) -> None:
        self.touched.pop(file, None)
        file.close()
        if delete and file.fs.exists(file.path):
            file.fs.delete(file.path)

    def after_sync(self, fn: Callable[[], None]) -> None:
        self.callbacks.append(fn)

    def confirm_after_sync(self, receipt: SyncReceipt, queue: Any) -> None:
        self.receipts.append((receipt, queue))

    def commit(self) -> None:
        files = list(self.touched)
        self.touched.clear()
        for f in files:
            f.flush()
        for f in files:
            if f.needs_sync:
                f.sync()
                f.needs_sync = False
        self.commits += 1
        callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn()
        receipts, self.receipts = self.receipts, []
        for receipt, queue in receipts:
            receipt.settle(queue)
