"""The classic queue index: one queue's messages on disk, in segment files of a fixed number of entries.

Owns: the directory of one queue (`<segno>.qix` files), which segment a seq belongs to, the live-entry
count of every segment, the store references (seq -> message store id) of the queue's large messages, and
the delivered watermark. The queue decides *what* goes to disk and when; this module decides *how*.

Layout: segment `n` holds the entries of seqs ``[n * E, (n + 1) * E)`` (E = `segment_entries`, 16384 by
default as in RabbitMQ). A segment file is a sequence of batch records (appendfile.py: one checksummed
record per flush); each entry of a batch starts with a type byte:

- ``PUB``  ``<BQBQI`` type, seq, flags, expiry (wall-clock ms, 0 = never), len(properties), then exchange
  and routing key as AMQP short strings
  (length byte + UTF-8), the encoded content properties and the body: a message embedded in the index (its
  serialized size, body + properties, is below `queue_index_embed_msgs_below`).
- ``REF``  ``<BQBQQI`` type, seq, flags, expiry, message store id, size: a larger message, written once to the
  vhost's message store (msg_store.py) however many queues it reaches.
- ``ACK``  type then ``u64`` seqs: those entries are gone (acked, rejected, purged).
- ``RET``  ``<BQI`` type, seq, count: the message has failed this many deliveries (delivery-limit queues:
  the count survives paging and restarts).
- ``DLV``  ``<BQ`` type, seq: every seq up to this one has been delivered at least once (so it is
  marked redelivered after a restart).

Rules:
- flags bit 0 = persistent. Persistent entries are written with ``durable=True`` (their confirm waits for
  the group commit); transient ones are in the index only because the queue paged them out, and entries
  written before the last restart that are not persistent are dead.
- A segment file is deleted once it holds no live entry and no more seqs can land in it.
- Recovery reads every segment: live = PUB/REF minus ACK (minus dead transients); a torn tail of a
  segment is truncated away, damage in the middle raises CorruptRecord (docs/storage.md).
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hutch.storage.appendfile import (
    FILE_HEADER_BYTES,
    AppendFile,
    SyncSink,
    iter_entries,
    read_seed,
    scan_file,
)
from hutch.storage.errors import CorruptRecord, StorageError
from hutch.storage.fs import FileSystem

if TYPE_CHECKING:
    from hutch.storage.msg_store import MessageStore

log = logging.getLogger("hutch.queue_index")

INDEX_RECORD_TYPE = 0x31
DEFAULT_SEGMENT_ENTRIES = 16384
DEFAULT_EMBED_BELOW = 4096
SUFFIX = ".qix"

PUB = 1
REF = 2
ACK = 3
DLV = 4
RET = 5

PERSISTENT = 1

PUB_HEAD = struct.Struct("<BQBQI")  # type, seq, flags, expires_at_ms (0: never), len(properties)
REF_HEAD = struct.Struct("<BQBQQI")  # type, seq, flags, expires_at_ms, store id, size
DLV_ENTRY = struct.Struct("<BQ")
RET_ENTRY = struct.Struct("<BQI")
MSG_HEAD = struct.Struct("<BBI")  # a stored message: len(exchange), len(routing key), len(properties)

class StorableMessage(Protocol):
    """What the index needs of a message (hutch.core.message.Message has it)."""

    exchange: str
    routing_key: str
    properties_raw: bytes
    body: bytes
    route_tail: bytes  # exchange and routing key as AMQP short strings
    store_id: int  # set by the index when the message goes to the store


# (seq, persistent, exchange, routing_key, properties_raw, body, store_id, expires_at_ms)
IndexedMessage = tuple[int, bool, str, str, bytes, bytes, int, int]


def encode_message(exchange: str, routing_key: str, properties_raw: bytes, body: bytes) -> bytes:
    """A message as the message store keeps it."""
    ex = exchange.encode()
    rk = routing_key.encode()
    return b"".join((MSG_HEAD.pack(len(ex), len(rk), len(properties_raw)), ex, rk, properties_raw, body))


def decode_message(data: bytes | memoryview) -> tuple[str, str, bytes, bytes]:
    exlen, rklen, plen = MSG_HEAD.unpack_from(data, 0)
    pos = MSG_HEAD.size
    exchange = bytes(data[pos:pos + exlen]).decode()
    pos += exlen
    routing_key = bytes(data[pos:pos + rklen]).decode()
    pos += rklen
    props = bytes(data[pos:pos + plen])
    return exchange, routing_key, props, bytes(data[pos + plen:])


def remove_queue_directory(fs: FileSystem, directory: str) -> bool:
    """Delete a queue's directory and its files, except copies `hutch-storage salvage` set aside
    (`.damaged-` in the name), which are never deleted; the directory stays while one is there.
    Returns whether the directory is gone."""
    kept = False
    for name in fs.list_dir(directory):
        if ".damaged-" in name:
            kept = True
            continue
        fs.delete(os.path.join(directory, name))
    if not kept:
        fs.remove_dir(directory)
    return not kept


def segment_name(segno: int) -> str:
    return f"{segno:08d}{SUFFIX}"


@dataclass
class IndexRecovery:
    """What `QueueIndex.recover` found."""

    live: int = 0  # live persistent entries
    live_bytes: int = 0  # their body bytes
    first_live_seq: int = 0  # 0 when none
    max_seq: int = 0  # highest seq ever written (new seqs continue after it)
    delivered_upto: int = 0
    refs: dict[int, int] = field(default_factory=dict)  # seq -> store id of live REF entries
    torn_tails: list[str] = field(default_factory=list)


class QueueIndex:
    """Not thread-safe: belongs to the loop thread (the sink syncs files from its executor)."""

    def __init__(self, fs: FileSystem, directory: str, sink: SyncSink, *,
                 store: MessageStore | None = None, segment_entries: int = DEFAULT_SEGMENT_ENTRIES,
                 embed_below: int = DEFAULT_EMBED_BELOW) -> None:
        self.fs = fs
        self.directory = directory
        self.sink = sink
        self.store = store
        self.segment_entries = segment_entries
        self.embed_below = embed_below
        self._files: dict[int, AppendFile] = {}
        self._live: dict[int, int] = {}  # segno -> live entries (written, not acked)
        self.refs: dict[int, int] = {}  # seq -> store id
        self.boot_seq = 0  # entries at or below it come from before the last restart
        self.max_seq = 0
        self.delivered_upto = 0
        self._delivered_written = 0
        self._scan_max = 0
        self.lost_on_read = 0  # entries dropped by read_from because their message could not be read
        self.last_returns: dict[int, int] = {}  # seq -> failed deliveries, of the last read_from
        self._scan_returns: dict[int, int] = {}
        self.deleted = False
        self.fs.make_dirs(directory)

    # -- writing --------------------------------------------------------------------------------------
    def _file(self, segno: int) -> AppendFile:
        f = self._files.get(segno)
        if f is None:
            path = os.path.join(self.directory, segment_name(segno))
            size = self.fs.size(path) if self.fs.exists(path) else 0
            seed = read_seed(self.fs.read(path, 0, FILE_HEADER_BYTES)) if size else None
            if size and seed is None:
                if size >= FILE_HEADER_BYTES:
                    raise CorruptRecord(path, 0, "bad file header")
                self.fs.truncate(path, 0)  # nothing but a torn header: start the file again
                size = 0
            f = self._files[segno] = AppendFile(self.fs, path, INDEX_RECORD_TYPE, size, seed or 0)
        return f

    def publish(self, seq: int, persistent: bool, msg: StorableMessage, expires_at_ms: int = 0) -> None:
        """Write one message. `persistent`: its confirm waits for the sync, and it survives a restart.
        A large message already in the store (`msg.store_id`, set by the first queue that stored it) gets
        one more reference instead of a second copy."""
        segno = seq // self.segment_entries
        f = self._files.get(segno) or self._file(segno)
        flags = PERSISTENT if persistent else 0
        props = msg.properties_raw
        body = msg.body
        store = self.store
        if len(body) + len(props) < self.embed_below or store is None:
            f.put(b"".join((PUB_HEAD.pack(PUB, seq, flags, expires_at_ms, len(props)), msg.route_tail, props, body)),
                  persistent)
        else:
            store_id = msg.store_id
            if store_id and store.contains(store_id):
                store.incref(store_id)
            else:
                store_id = msg.store_id = store.write(
                    encode_message(msg.exchange, msg.routing_key, props, body), durable=persistent)
            self.refs[seq] = store_id
            f.add(REF_HEAD.pack(REF, seq, flags, expires_at_ms, store_id, len(body) + len(props)), persistent)
        live = self._live
        live[segno] = live.get(segno, 0) + 1
        if seq > self.max_seq:
            self.max_seq = seq
        self.sink.touch(f, persistent)

    def ack(self, seqs: list[int]) -> None:
        """These entries are gone. Writes the delivered watermark too when it moved."""
        if self.deleted or not seqs:
            return
        E = self.segment_entries
        by_seg: dict[int, list[int]] = {}
        for s in seqs:
            by_seg.setdefault(s // E, []).append(s)
        refs = self.refs
        store = self.store
        if refs and store is not None:
            for s in seqs:
                store_id = refs.pop(s, 0)
                if store_id:
                    store.decref(store_id)
        self._write_delivered()
        for segno, group in by_seg.items():
            self._ack_segment(segno, group)

    def _ack_segment(self, segno: int, group: list[int]) -> None:
        f = self._file(segno)
        f.add(b"\x03" + array("Q", group).tobytes())
        n = self._live.get(segno, 0) - len(group)
        if n > 0:
            self._live[segno] = n
            self.sink.touch(f, False)
            return
        self._live.pop(segno, None)
        if (segno + 1) * self.segment_entries <= self.max_seq + 1 or segno * self.segment_entries > self.max_seq:
            self._drop_segment(segno)
        else:
            self.sink.touch(f, False)

    def _drop_segment(self, segno: int) -> None:
        f = self._files.pop(segno, None)
        if f is None:
            f = AppendFile(self.fs, os.path.join(self.directory, segment_name(segno)), INDEX_RECORD_TYPE)
        self.sink.retire(f, True)

    def record_returns(self, seq: int, count: int) -> None:
        """The message at `seq` has failed `count` deliveries (written only for delivery-limit queues)."""
        if self.deleted:
            return
        f = self._file(seq // self.segment_entries)
        f.add(RET_ENTRY.pack(RET, seq, min(count, 0xFFFFFFFF)))
        self.sink.touch(f, False)

    def mark_delivered(self, seq: int) -> None:
        """Every seq up to `seq` has been delivered (written with the next acks, or on close)."""
        if seq > self.delivered_upto:
            self.delivered_upto = seq

    def _write_delivered(self) -> None:
        upto = self.delivered_upto
        if upto > self._delivered_written:
            self._delivered_written = upto
            f = self._file(upto // self.segment_entries)
            f.add(DLV_ENTRY.pack(DLV, upto))
            self.sink.touch(f, False)

    def flush_delivered(self) -> None:
        if not self.deleted:
            self._write_delivered()

    # -- reading --------------------------------------------------------------------------------------
    def _scan_segment(self, segno: int) -> tuple[dict[int, tuple[int, int, memoryview]], int, bool]:
        """Live entries of one segment {seq: (type, flags, entry)} in file order, the highest DLV seen,
        and whether a torn tail was truncated away. `_scan_max` is left at the highest seq written."""
        f = self._files.get(segno)
        path = os.path.join(self.directory, segment_name(segno))
        # what is still buffered is parsed after the file's records, without flushing it early (a flush
        # ahead of the group commit could leave an unsynced record before a synced one)
        pending = [memoryview(e) for e in f.buffered_entries()] if f is not None else []
        if self.fs.exists(path):
            _seed, result = scan_file(self.fs.read(path), path, INDEX_RECORD_TYPE)
            batches = [iter_entries(rec.payload) for rec in result.records]
            torn = result.torn_tail is not None
            if torn:
                self.fs.truncate(path, result.valid_length)
                if f is not None:
                    f.size = result.valid_length
        elif not pending:
            return {}, 0, False
        else:
            batches, torn = [], False
        batches.append(iter(pending))
        entries: dict[int, tuple[int, int, memoryview]] = {}
        returns: dict[int, int] = {}
        delivered = 0
        boot = self.boot_seq
        top = 0
        try:
            for batch in batches:
                for entry in batch:
                    kind = entry[0]
                    if kind in (PUB, REF):
                        seq = int.from_bytes(entry[1:9], "little")
                        if seq > top:
                            top = seq
                        flags = entry[9]
                        if seq <= boot and not flags & PERSISTENT:
                            continue  # a transient message from before the restart
                        entries[seq] = (kind, flags, entry)
                    elif kind == ACK:
                        for seq in array("Q", bytes(entry[1:])):
                            entries.pop(seq, None)
                    elif kind == DLV:
                        seq = DLV_ENTRY.unpack(entry)[1]
                        if seq > delivered:
                            delivered = seq
                    elif kind == RET:
                        _t, seq, count = RET_ENTRY.unpack(entry)
                        returns[seq] = count
                    else:
                        raise CorruptRecord(path, 0, f"unknown queue index entry type {kind}")
        except (ValueError, IndexError, struct.error) as exc:
            raise CorruptRecord(path, 0, f"malformed queue index entry: {exc}") from exc
        self._scan_max = top
        self._scan_returns = {seq: n for seq, n in returns.items() if seq in entries}
        return entries, delivered, torn

    def read_from(self, seq: int) -> tuple[list[IndexedMessage], int]:
        """Live messages of the segment holding `seq`, from `seq` on, in seq order, and the first seq of
        the next segment."""
        segno = seq // self.segment_entries
        entries, _dlv, _torn = self._scan_segment(segno)
        self.last_returns = self._scan_returns
        out: list[IndexedMessage] = []
        lost: list[int] = []
        store = self.store
        for s in sorted(k for k in entries if k >= seq):
            kind, flags, entry = entries[s]
            if kind == PUB:
                _t, _s, _f, expires_at, plen = PUB_HEAD.unpack_from(entry, 0)
                pos = PUB_HEAD.size
                exlen = entry[pos]
                exchange = bytes(entry[pos + 1:pos + 1 + exlen]).decode()
                pos += 1 + exlen
                rklen = entry[pos]
                routing_key = bytes(entry[pos + 1:pos + 1 + rklen]).decode()
                pos += 1 + rklen
                props = bytes(entry[pos:pos + plen])
                out.append((s, bool(flags & PERSISTENT), exchange, routing_key, props, bytes(entry[pos + plen:]),
                            0, expires_at))
            else:
                _t, _s, _f, expires_at, store_id, _size = REF_HEAD.unpack_from(entry, 0)
                assert store is not None, "queue index holds store references but has no store"
                try:
                    exchange, routing_key, props, body = decode_message(store.read(store_id))
                except (StorageError, KeyError) as exc:
                    # never serve what does not verify: report it and drop the entry
                    log.error("queue index %s: message %d (store id %d) cannot be read and is dropped: %s",
                              self.directory, s, store_id, exc)
                    lost.append(s)
                    continue
                out.append((s, bool(flags & PERSISTENT), exchange, routing_key, props, body, store_id, expires_at))
        if lost:
            self.lost_on_read += len(lost)
            for s in lost:
                store_id = self.refs.pop(s, 0)
                if store_id and store is not None and store.contains(store_id):
                    store.decref(store_id)
            self.ack(lost)
        return out, (segno + 1) * self.segment_entries

    def ack_from(self, seq: int) -> int:
        """Ack every live entry at or after `seq` (a purge of the paged-out part of a queue)."""
        n = 0
        for segno in list(self.live_segments_from(seq)):
            entries, _dlv, _torn = self._scan_segment(segno)
            seqs = [s for s in entries if s >= seq]
            if seqs:
                self.ack(seqs)
                n += len(seqs)
        return n

    def segments(self) -> list[int]:
        """Segment numbers present on disk or open, ascending."""
        nums = set(self._files)
        for name in self.fs.list_dir(self.directory):
            if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
                nums.add(int(name[:-len(SUFFIX)]))
        return sorted(nums)

    def live_segments_from(self, seq: int) -> Iterator[int]:
        """Segments that may hold live entries at or after `seq`."""
        first = seq // self.segment_entries
        for segno in sorted(self._live):
            if segno >= first:
                yield segno

    # -- recovery -------------------------------------------------------------------------------------
    def recover(self) -> IndexRecovery:
        """Read every segment (before anything is written): live persistent entries and their refs."""
        found = IndexRecovery()
        max_seq = 0
        for segno in self.segments():
            path = os.path.join(self.directory, segment_name(segno))
            self.boot_seq = 1 << 62  # every entry predates this start: only persistent ones live
            entries, delivered, torn = self._scan_segment(segno)
            if torn:
                found.torn_tails.append(path)
            if delivered > found.delivered_upto:
                found.delivered_upto = delivered
            max_seq = max(max_seq, self._scan_max)
            if entries:
                self._live[segno] = len(entries)
                found.live += len(entries)
                low = min(entries)
                if not found.first_live_seq or low < found.first_live_seq:
                    found.first_live_seq = low
                for s, (kind, _flags, entry) in entries.items():
                    if kind == REF:
                        ref = REF_HEAD.unpack_from(entry, 0)
                        found.refs[s] = ref[4]
                        found.live_bytes += ref[5]
                    else:
                        exlen = entry[PUB_HEAD.size]
                        rklen = entry[PUB_HEAD.size + 1 + exlen]
                        found.live_bytes += (len(entry) - PUB_HEAD.size - 2 - exlen - rklen
                                             - PUB_HEAD.unpack_from(entry, 0)[4])
            else:
                # nothing live: the file can go; new seqs start above every seq it held (max_seq)
                self.fs.delete(path)
        found.max_seq = max(max_seq, found.delivered_upto)
        self.boot_seq = found.max_seq
        self.max_seq = found.max_seq
        self.refs = dict(found.refs)
        self.delivered_upto = self._delivered_written = found.delivered_upto
        return found

    # -- lifecycle ------------------------------------------------------------------------------------
    def delete(self) -> None:
        """The queue is deleted: drop every file and store reference, then the directory."""
        if self.deleted:
            return
        self.deleted = True
        store = self.store
        if store is not None:
            for store_id in self.refs.values():
                store.decref(store_id)
        self.refs.clear()
        for segno in self.segments():
            self._drop_segment(segno)  # unlinked now; handles close between sync jobs
        self._files.clear()
        self._live.clear()
        try:
            remove_queue_directory(self.fs, self.directory)
        except StorageError:
            pass

    def close(self) -> None:
        """Write the delivered watermark; files are flushed, synced and closed by the sink's owner."""
        if not self.deleted:
            self._write_delivered()

    def open_files(self) -> list[AppendFile]:
        return list(self._files.values())

    @property
    def live_count(self) -> int:
        return sum(self._live.values())

