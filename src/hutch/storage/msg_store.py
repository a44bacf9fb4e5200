"""The message store of one vhost: every large persistent message body, once, however many queues hold it.

Owns: one directory of store files (``00000001.rdq``, numbered in creation order, never reused while the
directory lives), the in-memory map ``msg_id -> (file, offset, length, refcount)``, the total and live bytes
of every file, message ids, garbage collection and compaction. The queue indexes own the references: they
say, through `write`/`incref`/`decref` and at restart `set_refs`, how many queue entries point at a message.
Design after RabbitMQ's ``rabbit_msg_store`` (docs/storage.md).

File format. A store file is a sequence of batch records (appendfile.py: one checksummed record of type
`STORE_RECORD_TYPE` per flush, framed as records.py says). Each entry of a batch is one message::

    u64 msg_id | u32 zlib.crc32(payload) | payload

A message's location is the file offset of its entry (what `AppendFile.add` returns), so `read` is one
positioned read that checks the entry's own crc: one message can be read without reading its record.

Rules:
- Writes go to the *current* file only; it rolls over (a new file) before an entry is added once its size
  plus buffered bytes reach `file_size_limit`. A new file is created and its name made durable
  (``fsync_dir``) when it becomes current, on the caller's thread, so that data synced into it survives a
  crash. Syncing the data is the sink's job (appendfile.SyncSink); the store never syncs a file itself.
- Message ids are ints from 1 (0 means "no store id" to the queue index), increasing; after a restart they
  continue above the highest id found in the files and the highest id `set_refs` was given, so an id a
  queue index still names is never given to another message.
- A message whose refcount reaches 0 is garbage: its bytes count against its file. A file other than the
  current one with no live message is deleted at once; one whose live bytes fall below half its entry bytes
  is compacted once: its live entries are appended to the current file (same ids, new locations) and it is
  deleted only after those copies are synced (``sink.after_sync``). A crash in between leaves both copies;
  recovery keeps the one in the newer file. A file with entries still buffered is looked at after its
  flush, never before.
- Recovery (`recover`) reads every file: a torn tail is truncated away and reported, in *any* file (one
  group commit can leave records of several files unsynced when the store rolled over in between), damage
  followed by a valid record raises :class:`CorruptRecord`, never skipped. What recovery keeps is synced
  first (the process may have died with written, unsynced data that a later power cut would lose).
  Recovered messages have no references until `set_refs`; until then they are neither garbage nor
  compacted, and their files are kept.
- `read` verifies the entry's id and crc; a mismatch raises :class:`CorruptRecord`: wrong bytes are never
  returned.

Not thread-safe: the owner's (loop) thread only. Memory per message: one dict entry and a list of four ints.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass, field

from hutch.storage import records
from hutch.storage.appendfile import AppendFile, SyncSink, iter_entries, scan_file
from hutch.storage.errors import CorruptRecord, StorageError
from hutch.storage.fs import FileSystem

log = logging.getLogger("hutch.storage.msg_store")

STORE_RECORD_TYPE = 0x21
"""Record type of a store batch record (queue index files use 0x31; the sink syncs store files first)."""
DEFAULT_FILE_SIZE_LIMIT = 16 * 1024 * 1024
"""RabbitMQ's ``msg_store_file_size_limit``."""
SUFFIX = ".rdq"
ENTRY_HEAD = struct.Struct("<QI")  # msg_id, crc32 of the payload
MAX_RECORD_PAYLOAD_BYTES = 0xFFFFFFFF
"""A batch record holds at most a file's worth of entries plus one message, of any size: accept any u32."""
_TYPES = frozenset({STORE_RECORD_TYPE})
_ENTRY_OVERHEAD = 4  # the u32 length of an entry inside its batch record

# Index entry: [file number, entry offset, entry length, refcount]. Lists, not objects: small, mutable.
_FILE, _OFFSET, _LENGTH, _REFS = 0, 1, 2, 3

# File states
_NORMAL = 0
_COMPACTING = 1  # live entries copied out; deleted once the copies are synced
_STUCK = 2  # compaction failed (damage or IO error); kept until its messages die


def file_name(number: int) -> str:
    return f"{number:08d}{SUFFIX}"


def parse_file_name(name: str) -> int | None:
    stem = name[:-len(SUFFIX)]
    if name.endswith(SUFFIX) and stem.isdigit() and stem.isascii():
        return int(stem)
    return None


@dataclass
class StoreRecovery:
    """What `MessageStore.recover` (and then `set_refs`) found and did."""

    files: int = 0
    messages: int = 0  # distinct message ids found
    duplicates: int = 0  # ids found twice (a compaction interrupted by a crash)
    torn_tails: list[tuple[str, records.TornTail]] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)
    garbage_messages: int = 0  # set_refs: recovered messages no queue refers to
    deleted_files: int = 0  # set_refs: files left with no live message


class _File:
    __slots__ = ("number", "path", "append", "recovered_size", "total", "live", "state")

    def __init__(self, number: int, path: str, append: AppendFile | None, recovered_size: int = 0) -> None:
        self.number = number
        self.path = path
        self.append = append  # None for a file found at recovery (never appended to again)
        self.recovered_size = recovered_size
        self.total = 0  # bytes of every entry in the file (with their length prefix)
        self.live = 0  # bytes of the entries the index points at
        self.state = _NORMAL

    @property
    def flushed_size(self) -> int:
        return self.append.size if self.append is not None else self.recovered_size


class MessageStore:
    """A shared, refcounted, append-only store of message bodies. Call `recover` first, even when empty."""

    def __init__(self, fs: FileSystem, directory: str, sink: SyncSink,
                 file_size_limit: int = DEFAULT_FILE_SIZE_LIMIT) -> None:
        if file_size_limit < 1:
            raise ValueError("file_size_limit must be positive")
        self.fs = fs
        self.directory = directory
        self.sink = sink
        self.file_size_limit = file_size_limit
        self.recovery = StoreRecovery()
        self.compactions = 0  # files compacted (tests, management)
        self.compaction_failures = 0
        self._index: dict[int, list[int]] = {}
        self._files: dict[int, _File] = {}
        self._current: _File | None = None
        self._next_id = 1
        self._next_file = 1
        self._first_new_file = 1  # files numbered below were found at recovery
        self._recovered_below = 1  # ids below were found at recovery (their refs come from set_refs)
        self._recovered = False
        self._refs_known = False
        self._closed = False

    # -- recovery -------------------------------------------------------------------------------------
    def recover(self) -> StoreRecovery:
        """Read every store file and rebuild the index; new writes go to a new file after the last one."""
        if self._recovered or self._closed:
            raise RuntimeError("recover() runs once, on a new MessageStore")
        fs = self.fs
        fs.make_dirs(self.directory)
        report = self.recovery
        found: list[tuple[int, str]] = []
        for name in fs.list_dir(self.directory):
            number = parse_file_name(name)
            if number is None:
                report.ignored_files.append(name)
            else:
                found.append((number, os.path.join(self.directory, name)))
        found.sort()
        max_id = 0
        index = self._index
        for number, path in found:
            result = self._scan_file(path)
            f = self._files[number] = _File(number, path, None, result.valid_length)
            for msg_id, offset, length in _entries(path, result):
                cost = length + _ENTRY_OVERHEAD
                f.total += cost
                f.live += cost
                old = index.get(msg_id)
                if old is not None:  # keep the newer copy (files are read in creation order)
                    report.duplicates += 1
                    self._files[old[_FILE]].live -= old[_LENGTH] + _ENTRY_OVERHEAD
                index[msg_id] = [number, offset, length, 0]
                if msg_id > max_id:
                    max_id = msg_id
        report.files = len(found)
        report.messages = len(index)
        self._next_id = self._recovered_below = max_id + 1
        self._next_file = self._first_new_file = (found[-1][0] + 1) if found else 1
        if found:
            fs.fsync_dir(self.directory)
        self._recovered = True
        return report

    def _scan_file(self, path: str) -> records.ScanResult:
        _seed, result = scan_file(self.fs.read(path), path, STORE_RECORD_TYPE)
        torn = result.torn_tail
        if torn is not None:
            log.warning("message store %s: torn tail at offset %d (%s), %d bytes dropped", path, torn.offset,
                        torn.reason, torn.dropped_bytes)
            self.fs.truncate(path, result.valid_length)  # syncs the file too
            self.recovery.torn_tails.append((path, torn))
        else:
            # What recovery read may still be unsynced (the process died, not the machine): make it
            # durable before acting on it (deleting the other copy of a compacted message, say).
            handle = self.fs.open_append(path)
            try:
                handle.sync()
            finally:
                handle.close()
        return result

    def set_refs(self, refs: dict[int, int]) -> None:
        """The reference counts the queue indexes recovered (msg_id -> count), once, after `recover`.

        They are added to the counts of the messages found at recovery (0 unless incref'd since); the
        ones left at 0 are garbage. Ids the store does not hold are ignored (callers check `contains`), but
        new ids start above them. Then files with no live message are deleted and sparse ones compacted.
        """
        if not self._recovered or self._closed:
            raise RuntimeError("set_refs() needs a recovered, open store")
        if self._refs_known:
            raise RuntimeError("set_refs() runs once")
        self._refs_known = True
        below = self._recovered_below
        index = self._index
        dead: list[int] = []
        for msg_id, loc in index.items():
            if msg_id < below:
                n = loc[_REFS] + refs.get(msg_id, 0)
                if n > 0:
                    loc[_REFS] = n
                else:
                    dead.append(msg_id)
        for msg_id in dead:
            loc = index.pop(msg_id)
            self._files[loc[_FILE]].live -= loc[_LENGTH] + _ENTRY_OVERHEAD
        self.recovery.garbage_messages = len(dead)
        if refs:
            self._next_id = max(self._next_id, max(refs) + 1)
        recovered = [f for f in self._files.values() if f.number < self._first_new_file]
        for f in recovered:
            self._check_file(f)
        deleted = sum(f.number not in self._files for f in recovered)
        self.recovery.deleted_files = deleted
        if deleted:
            self.fs.fsync_dir(self.directory)  # garbage from before the restart stays gone

    # -- messages -------------------------------------------------------------------------------------
    def contains(self, msg_id: int) -> bool:
        return msg_id in self._index

    def write(self, payload: bytes, refs: int = 1, durable: bool = True) -> int:
        """Store `payload` once with `refs` references; returns its new msg_id.

        `durable`: a confirm waits for the sync (passed to the sink). Raises StorageError when a new file
        cannot be created (nothing is changed then).
        """
        self._check_open()
        if refs < 1:
            raise ValueError(f"a message is written with at least one reference, not {refs}")
        msg_id = self._next_id
        entry = ENTRY_HEAD.pack(msg_id, zlib.crc32(payload)) + payload
        f, offset = self._append(entry, durable)
        self._next_id = msg_id + 1
        self._index[msg_id] = [f.number, offset, len(entry), refs]
        return msg_id

    def incref(self, msg_id: int, n: int = 1) -> None:
        """`n` more references. Unknown id -> KeyError."""
        if n < 0:
            raise ValueError("incref by a negative count")
        self._index[msg_id][_REFS] += n

    def decref(self, msg_id: int, n: int = 1) -> None:
        """`n` references fewer; at 0 the message is garbage (see the module rules). Unknown id -> KeyError."""
        if n < 0:
            raise ValueError("decref by a negative count")
        loc = self._index[msg_id]
        left = loc[_REFS] - n
        if not self._refs_known and msg_id < self._recovered_below:
            loc[_REFS] = left  # set_refs adds the recovered count; nothing is garbage before it
            return
        if left > 0:
            loc[_REFS] = left
            return
        if left < 0:
            raise ValueError(f"message {msg_id} has {loc[_REFS]} references, cannot drop {n}")
        del self._index[msg_id]
        f = self._files[loc[_FILE]]
        f.live -= loc[_LENGTH] + _ENTRY_OVERHEAD
        self._check_file(f)

    def refcount(self, msg_id: int) -> int:
        return self._index[msg_id][_REFS]

    def read(self, msg_id: int) -> bytes:
        """The payload of a message, verified. Unknown id -> KeyError; damage -> CorruptRecord."""
        file_no, offset, length, _refs = self._index[msg_id]
        f = self._files[file_no]
        data = f.append.buffered_entry(offset, length) if f.append is not None else None
        if data is None:
            data = self.fs.read(f.path, offset, length)
        return _verify(f.path, offset, data, msg_id, length)

    # -- files ----------------------------------------------------------------------------------------
    def _append(self, entry: bytes, durable: bool) -> tuple[_File, int]:
        f = self._current
        if f is None or f.append is None or f.append.size + f.append.pending_bytes >= self.file_size_limit:
            f = self._roll()
        assert f.append is not None
        offset = f.append.add(entry, durable)
        cost = len(entry) + _ENTRY_OVERHEAD
        f.total += cost
        f.live += cost
        self.sink.touch(f.append, durable)
        return f, offset

    def _roll(self) -> _File:
        """Start a new current file (created now, its name made durable now)."""
        number = self._next_file
        path = os.path.join(self.directory, file_name(number))
        handle = self.fs.open_append(path)
        try:
            self.fs.fsync_dir(self.directory)
        except StorageError:
            handle.close()
            raise
        self._next_file = number + 1
        append = AppendFile(self.fs, path, STORE_RECORD_TYPE)
        append.handle = handle
        f = self._files[number] = _File(number, path, append)
        old, self._current = self._current, f
        if old is not None:
            if old.append is not None and old.append.dirty:
                self.sink.after_sync(lambda: self._recheck(old))
            else:
                self._check_file(old)
        return f

    def _recheck(self, f: _File) -> None:
        if self._files.get(f.number) is f:
            self._check_file(f)

    def _check_file(self, f: _File) -> None:
        """Delete or compact a non-current file when its live bytes say so."""
        if self._closed or f is self._current or f.state == _COMPACTING:
            return
        if not self._refs_known and f.number < self._first_new_file:
            return  # recovered messages have unknown refcounts until set_refs
        if f.append is not None and f.append.dirty:
            return  # looked at again after the flush (see _roll)
        if f.live <= 0:
            self._delete(f)
        elif f.state == _NORMAL and f.live * 2 < f.total:
            self._compact(f)

    def _delete(self, f: _File) -> None:
        del self._files[f.number]
        if f.append is not None:
            self.sink.retire(f.append, True)
            return
        try:
            if self.fs.exists(f.path):
                self.fs.delete(f.path)
        except StorageError as exc:
            log.warning("message store: cannot delete %s: %s", f.path, exc)

    def _compact(self, f: _File) -> None:
        f.state = _COMPACTING
        try:
            data = self.fs.read(f.path, 0, f.flushed_size)
            _seed, result = scan_file(data, f.path, STORE_RECORD_TYPE)
            if result.torn_tail is not None:  # bytes this store flushed earlier must be whole
                raise CorruptRecord(f.path, result.torn_tail.offset, result.torn_tail.reason)
            moves: list[tuple[list[int], bytes]] = []
            index = self._index
            for msg_id, offset, length in _entries(f.path, result):
                loc = index.get(msg_id)
                if loc is not None and loc[_FILE] == f.number and loc[_OFFSET] == offset:
                    entry = data[offset:offset + length]
                    _verify(f.path, offset, entry, msg_id, length)
                    moves.append((loc, entry))
        except StorageError as exc:
            f.state = _STUCK
            self.compaction_failures += 1
            log.error("message store: cannot compact %s, keeping it: %s", f.path, exc)
            return
        for loc, entry in moves:
            target, offset = self._append(entry, False)
            f.live -= len(entry) + _ENTRY_OVERHEAD
            loc[_FILE] = target.number
            loc[_OFFSET] = offset
        self.compactions += 1
        self.sink.after_sync(lambda: self._finish_compaction(f))

    def _finish_compaction(self, f: _File) -> None:
        if not self._closed and self._files.get(f.number) is f:
            self._delete(f)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("message store is closed")
        if not self._recovered:
            raise RuntimeError("call recover() before writing to a message store")

    def close(self) -> None:
        """Hand every open file back to the sink (closed, not synced: sync first to keep buffered writes)."""
        if self._closed:
            return
        self._closed = True
        self._current = None
        for f in self._files.values():
            if f.append is not None:
                self.sink.retire(f.append, False)

    # -- numbers --------------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages held (live, or recovered and waiting for `set_refs`)."""
        return len(self._index)

    @property
    def file_count(self) -> int:
        return len(self._files)

    @property
    def file_numbers(self) -> list[int]:
        return sorted(self._files)

    @property
    def bytes_on_disk(self) -> int:
        """Flushed bytes of every store file (what is buffered is not counted)."""
        return sum(f.flushed_size for f in self._files.values())

    @property
    def live_bytes(self) -> int:
        """Entry bytes of the messages held."""
        return sum(f.live for f in self._files.values())

    @property
    def next_id(self) -> int:
        return self._next_id


def _entries(path: str, result: records.ScanResult) -> list[tuple[int, int, int]]:
    """``(msg_id, offset, length)`` of every entry in the scanned records of a store file."""
    out: list[tuple[int, int, int]] = []
    unpack = ENTRY_HEAD.unpack_from
    for rec in result.records:
        pos = rec.offset + records.HEADER_BYTES
        try:
            for entry in iter_entries(rec.payload):
                pos += _ENTRY_OVERHEAD
                if len(entry) < ENTRY_HEAD.size:
                    raise CorruptRecord(path, pos, f"entry of {len(entry)} bytes is shorter than its header")
                out.append((unpack(entry)[0], pos, len(entry)))
                pos += len(entry)
        except ValueError as exc:  # the record's checksum passed but its entries do not add up
            raise CorruptRecord(path, rec.offset, str(exc)) from exc
    return out


def _verify(path: str, offset: int, data: bytes, msg_id: int, length: int) -> bytes:
    """The payload of the entry `data` read at `offset`, after checking its length, id and crc."""
    if len(data) != length:
        raise CorruptRecord(path, offset, f"entry of message {msg_id} cut short ({len(data)} of {length} bytes)")
    found, crc = ENTRY_HEAD.unpack_from(data)
    if found != msg_id:
        raise CorruptRecord(path, offset, f"entry holds message {found}, expected {msg_id}")
    payload = data[ENTRY_HEAD.size:]
    if zlib.crc32(payload) != crc:
        raise CorruptRecord(path, offset, f"checksum mismatch in message {msg_id}")
    return payload
