"""Publishers of a stream-protocol connection: declare, publish with confirms, deduplication, delete.

Owns: the connection's publishers (id → stream, handle, reference), turning a publish frame into one
append on the stream's `StreamHandle` (a frame of simple entries without deduplication straight from
its bytes: `publish_frame`) (publishing ids and, with a reference, deduplication: ids at or
below the reference's last stored id are confirmed without being stored again, as osiris does), the
confirms and errors (a `PublishConfirm` once the append settles: after the fdatasync on one node), and
the bound on what a connection may have in flight (`MAX_PENDING_APPENDS` unsettled appends, then its
input stops until they settle), confirms coalesced (`send_confirms`: the ids confirmed for a publisher
since the connection last wrote go out as one PublishConfirm, as osiris confirms a written batch at once), and publishing to a replicated stream this node does not write: the
entries go to the writer's node (`StreamForwarder`, a `StreamPublish` record there), as RabbitMQ's stream
reader writes to the leader's osiris process wherever it runs.

Rules (rabbit_stream_reader): a reference is at most 256 characters; a publisher id is unique per
connection, and so is a reference per stream; a publish for an unknown publisher id is answered with a
PublishError PUBLISHER_DOES_NOT_EXIST for each publishing id.
- Confirms wait in `_confirms` until the connection writes (`StreamConnection.flush` calls
  `send_confirms` first), at most `confirm_ids_per_frame` ids a frame (the negotiated frame_max). One
  sync settles every chunk it covered in one loop turn, so a client gets one frame per publisher per
  sync, not one per publish frame: each frame costs a Python client a read, a decode and a pass over
  its waiting ids (rstream's publisher paid ~3-4% more per message against 100 ids a frame than against
  RabbitMQ's ~600, docs/BENCHMARKS.md "Stream protocol, session 14"). A publisher's pending confirms go
  out before any PublishError for it and before its delete's response, so its client sees them in the
  order the appends settled.
- Forwarded publishes of one publisher go to the writer in order, one request at a time (what arrives
  meanwhile joins the next request, at most CHUNK_ENTRIES entries and FORWARD_BYTES bytes): a publish
  refused while a writer is elected is retried, and a later one overtaking it would make the writer's
  deduplication drop it. Once a publisher forwards, it keeps forwarding until its queue is empty (even if
  this node becomes the writer meanwhile), for the same reason. A forward that fails (no writer in 30 s,
  a lost answer) is a PublishError INTERNAL_ERROR for its ids, never a confirm.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from hutch.queues.stream import chunk as ck
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.stream_session.ports import StreamForwarder, StreamSession
from hutch.storage.errors import StorageError
from hutch.streamproto import commands as c
from hutch.streamproto.codes import MAX_REFERENCE_CHARS, Code
from hutch.streamproto.errors import CommandError

log = logging.getLogger("hutch.stream")

MAX_PENDING_APPENDS = 512
# a publish frame's messages go into chunks of at most this many (as the stream queue type's AMQP path
# does): a delivery is a chunk per credit, so this bounds what one credit sends; RabbitMQ's osiris also
# cuts a large publish into several chunks (rstream's test_offset_type_last counts on it)
CHUNK_ENTRIES = 4096
FORWARD_BYTES = 4 << 20  # at most this much data per forwarded request (and one publish's whatever its size)
HOLD_BYTES = 1 << 20  # a batch held for the stream's sync under way is written once it has this much data
CONFIRM_FRAME_OVERHEAD = 13  # a PublishConfirm's size field, key, version, publisher id and id count
MAX_CONFIRM_IDS = 1 << 16  # ids in one PublishConfirm when frame_max is 0 (no limit)
_U32 = struct.Struct(">I")


def confirm_ids_per_frame(frame_max: int) -> int:
    """How many publishing ids one PublishConfirm may carry within `frame_max` (0: no limit)."""
    if frame_max <= 0:
        return MAX_CONFIRM_IDS
    return max(1, min(MAX_CONFIRM_IDS, (frame_max - CONFIRM_FRAME_OVERHEAD) // 8))


@dataclass(eq=False)
class Publisher:
    publisher_id: int
    stream: str
    reference: str  # "": no deduplication
    handle: StreamHandle | None  # None: the stream's copy is another worker's (`forwarder` goes there)
    forwarder: StreamForwarder | None = None  # a replicated stream's way to its writer, or to its home
    published: int = 0
    confirmed: int = 0
    errored: int = 0
    # forwarded publishes waiting for the one in flight: (data section, entries, ids, filter values)
    forwards: deque[tuple[bytes, list[int], list[bytes | None] | None]] = field(default_factory=deque)
    forwarding: bool = False  # a forwarded request is in flight (Invariant: False when `forwards` is empty
    #                          and nothing is in flight)

    def forwards_now(self) -> bool:
        """Do this publisher's publishes go to the writer's node (not appended here)?"""
        f = self.forwarder
        return f is not None and (self.forwarding or not f.writes_here())


def _entries(cmd: c.Publish) -> tuple[list[ck.Entry], list[int], list[bytes | None] | None]:
    """The entries, publishing ids and filter values (None: no entry has one) of a publish."""
    es = cmd.entries
    ids = [e.publishing_id for e in es]
    if cmd.version == 1 and all(type(e) is c.PublishedEntry for e in es):  # the common case, in two passes
        return [e.message for e in es], ids, None  # type: ignore[union-attr]  # all PublishedEntry, checked above
    entries: list[ck.Entry] = []
    values: list[bytes | None] = []
    for e in es:
        if isinstance(e, c.SubBatchEntry):
            entries.append(ck.SubBatch(e.count, e.compression, e.uncompressed_size, e.data))
            values.append(None)
        else:
            entries.append(e.message)
            values.append(e.filter_value.encode() if e.filter_value else None)
    return entries, ids, (values if any(values) else None)


@dataclass(eq=False)
class _Batch:
    """The simple publishes to one stream read from one input (or from the inputs read while the
    stream's sync was under way: `write_batched`), written as one chunk."""

    handle: StreamHandle
    data: list[bytes] = field(default_factory=list)  # each publish's entries, framed as in a chunk
    entries: int = 0  # Invariant: the sum of the publishes' ids, at most CHUNK_ENTRIES
    size: int = 0  # the bytes of `data`
    held: bool = False  # waiting for the stream's sync under way (`handle.after_sync` will write it)
    publishes: list[tuple[Publisher, list[int]]] = field(default_factory=list)


class Publishing:
    """The publishing half of one connection."""

    def __init__(self, conn: StreamSession) -> None:
        self.conn = conn
        self.publishers: dict[int, Publisher] = {}
        self.pending_appends = 0
        self._batches: dict[StreamHandle, _Batch] = {}  # per stream, until `write_batched`
        self._tasks: set[asyncio.Task[None]] = set()  # forwarding publishers' requests
        self._confirms: dict[Publisher, list[int]] = {}  # ids confirmed, not yet written (`send_confirms`)
        self.confirm_ids_per_frame = MAX_CONFIRM_IDS  # the connection sets it from the negotiated frame_max

    def declare(self, cmd: c.DeclarePublisher) -> None:
        conn = self.conn
        if len(cmd.reference) > MAX_REFERENCE_CHARS:
            raise CommandError("publisher reference too long", Code.PRECONDITION_FAILED)
        home = conn.hub.reader_link.home(conn.vhost.name, cmd.stream)
        handle = None if home is not None else conn.stream_handle(cmd.stream)
        conn.check_permission("write", cmd.stream)
        if cmd.publisher_id in self.publishers:
            raise CommandError(f"publisher id {cmd.publisher_id} is in use", Code.PRECONDITION_FAILED)
        if cmd.reference and any(p.reference == cmd.reference and p.stream == cmd.stream
                                 for p in self.publishers.values()):
            raise CommandError(f"publisher reference {cmd.reference} is in use", Code.PRECONDITION_FAILED)
        forwarder = conn.catalog.forwarder(conn.vhost.name, cmd.stream) if home is None \
            else conn.hub.reader_link.forwarder(home, conn.vhost.name, cmd.stream)
        self.publishers[cmd.publisher_id] = Publisher(cmd.publisher_id, cmd.stream, cmd.reference, handle, forwarder)
        conn.respond(cmd, Code.OK)

    def delete(self, cmd: c.DeletePublisher) -> None:
        pub = self.publishers.pop(cmd.publisher_id, None)
        if pub is None:
            raise CommandError(f"publisher {cmd.publisher_id} does not exist", Code.PUBLISHER_DOES_NOT_EXIST)
        self._send_confirms_of(pub)
        self.conn.respond(cmd, Code.OK)

    def query_sequence(self, cmd: c.QueryPublisherSequence) -> None:
        handle = self.conn.stream_handle(cmd.stream)
        self.conn.check_permission("read", cmd.stream)
        seq = handle.query_publisher_sequence(cmd.reference.encode()) if cmd.reference else 0
        self.conn.send(c.QueryPublisherSequenceResponse(cmd.correlation_id, Code.OK, seq))

    def publish(self, cmd: c.Publish) -> None:
        pub = self.publishers.get(cmd.publisher_id)
        if pub is None:
            self._error(cmd.publisher_id, [e.publishing_id for e in cmd.entries], Code.PUBLISHER_DOES_NOT_EXIST)
            return
        entries, ids, values = _entries(cmd)
        if not entries:
            return
        pub.published += len(ids)
        self.conn.hub.counters.messages_received += len(ids)
        for start in range(0, len(entries), CHUNK_ENTRIES):
            end = start + CHUNK_ENTRIES
            self._append(pub, entries[start:end], ids[start:end], None if values is None else values[start:end])

    def publish_frame(self, frame: bytes | memoryview) -> bool:
        """The hot path: a version 1 publish of simple entries by a publisher without a reference (no
        deduplication) is taken from the frame's bytes, with no record per message
        (`commands.scan_simple_publish`), and joins its stream's batch: the publishes of one input
        to one stream become one chunk (`write_batched`, which the connection calls before any other
        command and at the end of the input), as osiris's writer makes one chunk of what its
        publishers sent meanwhile. False: not such a publish; the caller decodes the frame and
        `publish` takes it. `frame` may be a view of the input buffer: what is kept is a copy."""
        scanned = c.scan_simple_publish(frame)
        if scanned is None:
            return False
        pub = self.publishers.get(scanned.publisher_id)
        ids = scanned.publishing_ids
        if pub is None or pub.reference:
            return False
        pub.published += len(ids)
        self.conn.hub.counters.messages_received += len(ids)  # (the node's counter, as `publish` counts)
        if not self._writable(pub, ids):
            return True
        if len(ids) <= CHUNK_ENTRIES:
            self._take_simple(pub, ids, scanned.data)
            return True
        # a frame of more messages than a chunk holds (a 1 MiB frame carries up to ~80,000): cut its
        # data section at entry boundaries rather than decoding it again entry by entry (which cost
        # as much as the scan again, ~0.15 s on the loop for a 1 MiB frame of 1-byte messages)
        data = scanned.data
        pos = 0
        for start in range(0, len(ids), CHUNK_ENTRIES):
            piece = ids[start:start + CHUNK_ENTRIES]
            end = pos
            for _ in piece:
                end += 4 + _U32.unpack_from(data, end)[0]
            self._take_simple(pub, piece, data[pos:end])
            pos = end
        return True

    def _take_simple(self, pub: Publisher, ids: list[int], data: bytes) -> None:
        """Simple entries (`data`, their data section) of a publisher without a reference: to the
        writer's node, or into the stream's batch (at most CHUNK_ENTRIES entries a batch)."""
        if pub.forwarder is not None and pub.forwards_now():  # (its data section travels as it came)
            self._queue_forward(pub, bytes(data), list(ids), None)
            return
        if pub.handle is None:
            return
        batch = self._batches.get(pub.handle)
        if batch is not None and batch.entries + len(ids) > CHUNK_ENTRIES:
            self._write_batch(batch)
            batch = None
        if batch is None:
            batch = self._batches[pub.handle] = _Batch(pub.handle)
        batch.data.append(data)
        batch.entries += len(ids)
        batch.size += len(data)
        batch.publishes.append((pub, ids))

    def write_batched(self, hold: bool = False) -> None:
        """Write each stream's batch as one chunk (see `publish_frame`). With `hold` (the end of an
        input), a batch whose stream is syncing (`StreamHandle.syncing`) waits for that sync's answer
        and gathers what the next inputs bring meanwhile (group commit, as osiris's writer makes one
        chunk of what arrived while it wrote): a chunk written during a sync is made durable by the
        next one anyway, so this delays no confirm and no delivery, and a client reads fewer, larger
        chunks (rstream's consumer pays a credit frame and a Deliver frame per chunk). A held batch is
        written at once when it reaches CHUNK_ENTRIES entries or HOLD_BYTES bytes, before any other
        command of the connection, and when its stream closes."""
        if self._batches:
            batches = list(self._batches.values())
            for batch in batches:
                if hold and batch.entries < CHUNK_ENTRIES and batch.size < HOLD_BYTES and batch.handle.syncing:
                    if not batch.held:
                        batch.held = True
                        batch.handle.after_sync(functools.partial(self._release, batch))
                    continue
                self._write_batch(batch)

    def _release(self, batch: _Batch) -> None:
        """The sync a held batch waited for was answered: write it (unless it was written meanwhile)."""
        if self._batches.get(batch.handle) is batch:
            self._write_batch(batch)

    def _write_batch(self, batch: _Batch) -> None:
        self._batches.pop(batch.handle, None)
        try:
            appended = batch.handle.append_encoded(batch.data, batch.entries)
        except (StorageError, ValueError):
            code = Code.STREAM_NOT_AVAILABLE if batch.handle.closed else Code.INTERNAL_ERROR
            for pub, ids in batch.publishes:
                self._error(pub.publisher_id, ids, code)
            return
        for pub, ids in batch.publishes:
            self._track(pub, appended.settled, ids)

    def _writable(self, pub: Publisher, ids: list[int]) -> bool:
        """The publisher's stream is still the catalog's; if not, its ids are refused (False)."""
        conn = self.conn
        if pub.handle is None:
            gone = conn.hub.reader_link.home(conn.vhost.name, pub.stream) is None
        else:
            gone = pub.handle.closed or conn.catalog.lookup(conn.vhost.name, pub.stream) is not pub.handle
        if gone:
            # deleted by another path (AMQP 0-9-1, management): tell every user of it
            self._error(pub.publisher_id, ids, Code.STREAM_NOT_AVAILABLE)
            conn.hub.stream_deleted(conn.vhost.name, pub.stream)
            return False
        return True

    def _append(self, pub: Publisher, entries: list[ck.Entry], ids: list[int],
                values: list[bytes | None] | None) -> None:
        reference = pub.reference.encode() if pub.reference else None
        if not self._writable(pub, ids):
            return
        if pub.forwarder is not None and pub.forwards_now():
            self._forward(pub, entries, ids, values)
            return
        assert pub.handle is not None  # (a publisher without one forwards)
        try:
            appended = pub.handle.append(entries, publisher=reference, publishing_ids=ids if reference else None,
                                         filter_values=values)
        except (StorageError, ValueError):
            self._error(pub.publisher_id, ids, Code.INTERNAL_ERROR)
            return
        if appended.duplicates:
            self._confirm(pub, appended.duplicates)
        stored = appended.stored if reference is not None else ids
        if stored:
            self._track(pub, appended.settled, stored)

    def _forward(self, pub: Publisher, entries: list[ck.Entry], ids: list[int],
                 values: list[bytes | None] | None) -> None:
        """Queue the entries for the writer's node; a request goes when none of this publisher's is in
        flight. Each queued publish counts as a pending append (the connection's bound)."""
        data, _ = ck.encode_entries(entries)
        self._queue_forward(pub, data, ids, values)

    def _queue_forward(self, pub: Publisher, data: bytes, ids: list[int], values: list[bytes | None] | None) -> None:
        pub.forwards.append((data, ids, values))
        self.pending_appends += 1
        if self.pending_appends == MAX_PENDING_APPENDS:
            self.conn.hold_reading("confirms")
        if not pub.forwarding:
            pub.forwarding = True
            self._spawn(self._send_forwards(pub))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_forwards(self, pub: Publisher) -> None:
        """Send the publisher's queued publishes to the writer, in order, one request at a time (what
        queued meanwhile joins the next), and confirm or refuse each once its request is answered."""
        forwarder = pub.forwarder
        assert forwarder is not None
        try:
            while pub.forwards:
                if self.publishers.get(pub.publisher_id) is not pub:  # deleted, or its connection closed:
                    self._forwarded(pub, list(pub.forwards), ok=False)  # what is not sent yet goes unsent
                    pub.forwards.clear()
                    return
                taken: list[tuple[bytes, list[int], list[bytes | None] | None]] = []
                count = size = 0
                while pub.forwards and (not taken or (count + len(pub.forwards[0][1]) <= CHUNK_ENTRIES
                                                      and size + len(pub.forwards[0][0]) <= FORWARD_BYTES)):
                    item = pub.forwards.popleft()
                    taken.append(item)
                    count += len(item[1])
                    size += len(item[0])
                ids = [i for _, item_ids, _ in taken for i in item_ids]
                values = None
                if any(v is not None for _, _, v in taken):
                    values = [x for _, item_ids, v in taken for x in (v if v is not None else [None] * len(item_ids))]
                try:
                    await forwarder.publish(b"".join(d for d, _, _ in taken), ids, pub.reference.encode(), values)
                except Exception as exc:  # noqa: BLE001 - any failure is a refusal of these ids, never a confirm
                    log.warning("stream %s: %d publishes through the writer's node failed: %r", pub.stream,
                                len(ids), exc)
                    self._forwarded(pub, taken, ok=False)
                else:
                    self._forwarded(pub, taken, ok=True)
        finally:
            pub.forwarding = False

    def _forwarded(self, pub: Publisher, taken: list[tuple[bytes, list[int], list[bytes | None] | None]],
                   ok: bool) -> None:
        for _, ids, _ in taken:
            self.pending_appends -= 1
            if self.pending_appends == MAX_PENDING_APPENDS // 2:
                self.conn.release_reading("confirms")
            if self.publishers.get(pub.publisher_id) is not pub:
                continue  # deleted meanwhile: its client no longer waits for these
            if ok:
                self._confirm(pub, ids)
            else:
                self._error(pub.publisher_id, ids, Code.INTERNAL_ERROR)
        self.conn.want_flush()

    def _track(self, pub: Publisher, settled: asyncio.Future[None], stored: list[int]) -> None:
        """Confirm (or refuse) `stored` once their append settles; bound the appends in flight."""
        self.pending_appends += 1
        if self.pending_appends == MAX_PENDING_APPENDS:
            self.conn.hold_reading("confirms")
        settled.add_done_callback(lambda fut: self._settled(pub, stored, fut))

    def bound(self, settled: asyncio.Future[None]) -> None:
        """An append that sends no confirm (a stored offset: consuming.py) counted against
        MAX_PENDING_APPENDS until it settles: a flood of them during a slow sync holds the input as
        publishes do, instead of piling up chunks waiting for their commit."""
        self.pending_appends += 1
        if self.pending_appends == MAX_PENDING_APPENDS:
            self.conn.hold_reading("confirms")
        settled.add_done_callback(self._unbound)

    def _unbound(self, _fut: asyncio.Future[None] | None = None) -> None:
        self.pending_appends -= 1
        if self.pending_appends == MAX_PENDING_APPENDS // 2:
            self.conn.release_reading("confirms")

    def _settled(self, pub: Publisher, ids: Sequence[int], fut: asyncio.Future[None]) -> None:
        self._unbound()
        if self.publishers.get(pub.publisher_id) is not pub:
            return  # deleted meanwhile: its client no longer waits for these
        if fut.cancelled() or fut.exception() is not None:
            self._error(pub.publisher_id, list(ids), Code.INTERNAL_ERROR)
        else:
            self._confirm(pub, ids)
        self.conn.want_flush()

    def _confirm(self, pub: Publisher, ids: Sequence[int]) -> None:
        pub.confirmed += len(ids)
        self.conn.hub.counters.messages_confirmed += len(ids)
        pending = self._confirms.get(pub)
        if pending is None:
            self._confirms[pub] = list(ids)
        else:
            pending.extend(ids)

    def send_confirms(self) -> None:
        """Put the confirms waiting since the last write in the output: one PublishConfirm per publisher
        (more when its ids pass `confirm_ids_per_frame`)."""
        if self._confirms:
            confirms = list(self._confirms.items())
            self._confirms.clear()
            for pub, ids in confirms:
                self._send_confirm_frames(pub, ids)

    def _send_confirms_of(self, pub: Publisher) -> None:
        ids = self._confirms.pop(pub, None)
        if ids is not None:
            self._send_confirm_frames(pub, ids)

    def _send_confirm_frames(self, pub: Publisher, ids: list[int]) -> None:
        step = self.confirm_ids_per_frame
        if len(ids) <= step:
            self.conn.send(c.PublishConfirm(pub.publisher_id, ids))
            return
        for start in range(0, len(ids), step):
            self.conn.send(c.PublishConfirm(pub.publisher_id, ids[start:start + step]))

    def _error(self, publisher_id: int, ids: list[int], code: Code) -> None:
        pub = self.publishers.get(publisher_id)
        if pub is not None:
            pub.errored += len(ids)
            self._send_confirms_of(pub)
        self.conn.hub.counters.messages_errored += len(ids)
        self.conn.send(c.PublishError(publisher_id, [(i, code) for i in ids]))

    def info(self) -> list[dict[str, object]]:
        return [{"publisher_id": p.publisher_id, "stream": p.stream, "reference": p.reference,
                 "messages_published": p.published, "messages_confirmed": p.confirmed,
                 "messages_errored": p.errored} for p in self.publishers.values()]

    def stream_gone(self, stream: str) -> bool:
        gone = [pid for pid, p in self.publishers.items() if p.stream == stream]
        for pid in gone:
            self._send_confirms_of(self.publishers.pop(pid))
        return bool(gone)
