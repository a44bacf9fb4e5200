"""Publishers of a stream-protocol connection: declare, publish with confirms, deduplication, delete.

Owns: the connection's publishers (id → stream, handle, reference), turning a publish frame into one
append on the stream's `StreamHandle` (a frame of simple entries without deduplication straight from
its bytes: `publish_frame`) (publishing ids and, with a reference, deduplication: ids at or
below the reference's last stored id are confirmed without being stored again, as osiris does), the
confirms and errors (a `PublishConfirm` once the append settles: after the fdatasync on one node), and
the bound on what a connection may have in flight (`MAX_PENDING_APPENDS` unsettled appends, then its
input stops until they settle).

Rules (rabbit_stream_reader): a reference is at most 256 characters; a publisher id is unique per
connection, and so is a reference per stream; a publish for an unknown publisher id is answered with a
PublishError PUBLISHER_DOES_NOT_EXIST for each publishing id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from hutch.queues.stream import chunk as ck
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.stream_session.ports import StreamSession
from hutch.storage.errors import StorageError
from hutch.streamproto import commands as c
from hutch.streamproto.codes import MAX_REFERENCE_CHARS, Code
from hutch.streamproto.errors import CommandError

MAX_PENDING_APPENDS = 512
# a publish frame's messages go into chunks of at most this many (as the stream queue type's AMQP path
# does): a delivery is a chunk per credit, so this bounds what one credit sends; RabbitMQ's osiris also
# cuts a large publish into several chunks (rstream's test_offset_type_last counts on it)
CHUNK_ENTRIES = 4096


@dataclass(eq=False)
class Publisher:
    publisher_id: int
    stream: str
    reference: str  # "": no deduplication
    handle: StreamHandle
    published: int = 0
    confirmed: int = 0
    errored: int = 0


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
    """The simple publishes to one stream read from one input, written as one chunk."""

    handle: StreamHandle
    data: list[bytes] = field(default_factory=list)  # each publish's entries, framed as in a chunk
    entries: int = 0  # Invariant: the sum of the publishes' ids, at most CHUNK_ENTRIES
    publishes: list[tuple[Publisher, list[int]]] = field(default_factory=list)


class Publishing:
    """The publishing half of one connection."""

    def __init__(self, conn: StreamSession) -> None:
        self.conn = conn
        self.publishers: dict[int, Publisher] = {}
        self.pending_appends = 0
        self._batches: dict[StreamHandle, _Batch] = {}  # per stream, until `write_batched`

    def declare(self, cmd: c.DeclarePublisher) -> None:
        conn = self.conn
        if len(cmd.reference) > MAX_REFERENCE_CHARS:
            raise CommandError("publisher reference too long", Code.PRECONDITION_FAILED)
        handle = conn.stream_handle(cmd.stream)
        conn.check_permission("write", cmd.stream)
        if cmd.publisher_id in self.publishers:
            raise CommandError(f"publisher id {cmd.publisher_id} is in use", Code.PRECONDITION_FAILED)
        if cmd.reference and any(p.reference == cmd.reference and p.stream == cmd.stream
                                 for p in self.publishers.values()):
            raise CommandError(f"publisher reference {cmd.reference} is in use", Code.PRECONDITION_FAILED)
        self.publishers[cmd.publisher_id] = Publisher(cmd.publisher_id, cmd.stream, cmd.reference, handle)
        conn.respond(cmd, Code.OK)

    def delete(self, cmd: c.DeletePublisher) -> None:
        if self.publishers.pop(cmd.publisher_id, None) is None:
            raise CommandError(f"publisher {cmd.publisher_id} does not exist", Code.PUBLISHER_DOES_NOT_EXIST)
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
        if pub is None or pub.reference or len(ids) > CHUNK_ENTRIES:
            return False
        pub.published += len(ids)
        if not self._writable(pub, ids):
            return True
        batch = self._batches.get(pub.handle)
        if batch is not None and batch.entries + len(ids) > CHUNK_ENTRIES:
            self._write_batch(batch)
            batch = None
        if batch is None:
            batch = self._batches[pub.handle] = _Batch(pub.handle)
        batch.data.append(scanned.data)
        batch.entries += len(ids)
        batch.publishes.append((pub, ids))
        return True

    def write_batched(self) -> None:
        """Write each stream's batch as one chunk (see `publish_frame`)."""
        if self._batches:
            batches = list(self._batches.values())
            self._batches.clear()
            for batch in batches:
                self._write_batch(batch)

    def _write_batch(self, batch: _Batch) -> None:
        self._batches.pop(batch.handle, None)
        try:
            appended = batch.handle.append_encoded(batch.data, batch.entries)
        except (StorageError, ValueError):
            for pub, ids in batch.publishes:
                self._error(pub.publisher_id, ids, Code.INTERNAL_ERROR)
            return
        for pub, ids in batch.publishes:
            self._track(pub, appended.settled, ids)

    def _writable(self, pub: Publisher, ids: list[int]) -> bool:
        """The publisher's stream is still the catalog's; if not, its ids are refused (False)."""
        conn = self.conn
        if pub.handle.closed or conn.catalog.lookup(conn.vhost.name, pub.stream) is not pub.handle:
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

    def _track(self, pub: Publisher, settled: asyncio.Future[None], stored: list[int]) -> None:
        """Confirm (or refuse) `stored` once their append settles; bound the appends in flight."""
        self.pending_appends += 1
        if self.pending_appends == MAX_PENDING_APPENDS:
            self.conn.hold_reading("confirms")
        settled.add_done_callback(lambda fut: self._settled(pub, stored, fut))

    def _settled(self, pub: Publisher, ids: Sequence[int], fut: asyncio.Future[None]) -> None:
        self.pending_appends -= 1
        if self.pending_appends == MAX_PENDING_APPENDS // 2:
            self.conn.release_reading("confirms")
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
        self.conn.send(c.PublishConfirm(pub.publisher_id, list(ids)))

    def _error(self, publisher_id: int, ids: list[int], code: Code) -> None:
        pub = self.publishers.get(publisher_id)
        if pub is not None:
            pub.errored += len(ids)
        self.conn.hub.counters.messages_errored += len(ids)
        self.conn.send(c.PublishError(publisher_id, [(i, code) for i in ids]))

    def info(self) -> list[dict[str, object]]:
        return [{"publisher_id": p.publisher_id, "stream": p.stream, "reference": p.reference,
                 "messages_published": p.published, "messages_confirmed": p.confirmed,
                 "messages_errored": p.errored} for p in self.publishers.values()]

    def stream_gone(self, stream: str) -> bool:
        gone = [pid for pid, p in self.publishers.items() if p.stream == stream]
        for pid in gone:
            del self.publishers[pid]
        return bool(gone)
