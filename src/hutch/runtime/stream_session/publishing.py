"""Publishers of a stream-protocol connection: declare, publish with confirms, deduplication, delete.

Owns: the connection's publishers (id → stream, handle, reference), turning a publish frame into one
append on the stream's `StreamHandle` (publishing ids and, with a reference, deduplication: ids at or
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
from dataclasses import dataclass

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


class Publishing:
    """The publishing half of one connection."""

    def __init__(self, conn: StreamSession) -> None:
        self.conn = conn
        self.publishers: dict[int, Publisher] = {}
        self.pending_appends = 0

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

    def _append(self, pub: Publisher, entries: list[ck.Entry], ids: list[int],
                values: list[bytes | None] | None) -> None:
        reference = pub.reference.encode() if pub.reference else None
        conn = self.conn
        if pub.handle.closed or conn.catalog.lookup(conn.vhost.name, pub.stream) is not pub.handle:
            # deleted by another path (AMQP 0-9-1, management): tell every user of it
            self._error(pub.publisher_id, ids, Code.STREAM_NOT_AVAILABLE)
            self.conn.hub.stream_deleted(self.conn.vhost.name, pub.stream)
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
        if not stored:
            return
        self.pending_appends += 1
        if self.pending_appends == MAX_PENDING_APPENDS:
            self.conn.hold_reading("confirms")
        appended.settled.add_done_callback(lambda fut: self._settled(pub, stored, fut))

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
