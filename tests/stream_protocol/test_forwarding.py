"""A stream-protocol publisher on a member that does not write a replicated stream (publishing.py's
forwarding), driven in memory: its publishes go to the writer through the catalog's `StreamForwarder`,
in order, one request at a time (what arrives meanwhile joins the next), confirmed only once the
writer's node answered, refused (INTERNAL_ERROR) when it fails; nothing is appended here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hutch.queues.stream import chunk as ck
from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.catalog import QueueCatalog
from hutch.runtime.stream_session.hub import StreamHub
from hutch.runtime.stream_session.ports import StreamForwarder
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key
from session.memory import make_node

from .memory import StreamPair

pytestmark = pytest.mark.asyncio


class FakeWriter:
    """The writer's node as the forwarder reaches it: each request waits for the test to answer it."""

    def __init__(self) -> None:
        self.writes_here_now = False
        self.requests: list[tuple[list[bytes], list[int], bytes, list[bytes | None] | None]] = []
        self.answers: list[asyncio.Future[None]] = []
        self.offsets: list[tuple[bytes, int]] = []

    def writes_here(self) -> bool:
        return self.writes_here_now

    async def publish(self, data: bytes, ids: list[int], reference: bytes,
                      filters: list[bytes | None] | None) -> None:
        entries = [e if isinstance(e, bytes) else b"<sub-batch>" for e in ck.iter_entries(memoryview(data))]
        self.requests.append((entries, ids, reference, filters))
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        await answer


    def store_offset(self, reference: bytes, offset: int) -> bool:
        self.offsets.append((reference, offset))
        return True


class ForwardingCatalog(QueueCatalog):
    def __init__(self, node: Node, writer: FakeWriter) -> None:
        super().__init__(node)
        self.writer = writer

    def forwarder(self, vhost: str, name: str) -> StreamForwarder | None:
        return self.writer


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def forwarding_pair(node: Node) -> tuple[FakeWriter, StreamPair]:
    """A client on a member that does not write stream "s1" (its publishes go to the fake writer)."""
    writer = FakeWriter()
    pair = StreamPair(StreamHub(node, ForwardingCatalog(node, writer)))
    await pair.open()
    await pair.create("s1")
    return writer, pair


async def test_publishes_go_to_the_writer_in_order_one_request_at_a_time(node: Node) -> None:
    writer, pair = await forwarding_pair(node)
    assert await pair.request(c.DeclarePublisher(2, 1, "app", "s1")) == c.Response(Key.DECLARE_PUBLISHER, 2, Code.OK)
    assert await pair.request(c.DeclarePublisher(3, 2, "", "s1")) == c.Response(Key.DECLARE_PUBLISHER, 3, Code.OK)
    pair.send(c.Publish(1, [c.PublishedEntry(1, b"a"), c.PublishedEntry(2, b"b")]))
    await pair.until(lambda: len(writer.requests) == 1)
    # while the first is in flight, three more publishes of publisher 1 (one a version 2 with a filter
    # value) and one of publisher 2 (no reference: the hot path's kind of frame) arrive
    pair.send(c.Publish(1, [c.PublishedEntry(3, b"c")]),
              c.Publish(1, [c.PublishedEntry(4, b"d", "eu")], version=2),
              c.Publish(1, [c.SubBatchEntry(5, 0, 1, 5, b"\0\0\0\1e")]),
              c.Publish(2, [c.PublishedEntry(7, b"x")]))
    await pair.until(lambda: len(writer.requests) == 2)  # publisher 2's own request
    assert writer.requests[1] == ([b"x"], [7], b"", None)
    assert pair.received() == []  # nothing confirmed before the writer answers
    writer.answers[0].set_result(None)
    assert await pair.expect(1) == [c.PublishConfirm(1, [1, 2])]
    await pair.until(lambda: len(writer.requests) == 3)  # what queued meanwhile: one request, in order
    assert writer.requests[2] == ([b"c", b"d", b"<sub-batch>"], [3, 4, 5], b"app", [None, b"eu", None])
    writer.answers[2].set_exception(TimeoutError("no writer took the publishes in time"))
    writer.answers[1].set_result(None)
    got = await pair.expect(4)
    assert c.PublishConfirm(2, [7]) in got
    assert [r for r in got if isinstance(r, c.PublishError)] == [  # refused (a frame each), never confirmed
        c.PublishError(1, [(i, Code.INTERNAL_ERROR)]) for i in (3, 4, 5)]
    handle = pair.hub.catalog.lookup("/", "s1")
    assert handle is not None and handle.next_offset == 0  # nothing was appended on this member


async def test_a_forwarding_publisher_keeps_forwarding_until_its_queue_is_empty(node: Node) -> None:
    writer, pair = await forwarding_pair(node)
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    pair.send(c.Publish(1, [c.PublishedEntry(1, b"a")]))
    await pair.until(lambda: len(writer.requests) == 1)
    writer.writes_here_now = True  # this node became the writer while a request is in flight
    pair.send(c.Publish(1, [c.PublishedEntry(2, b"b")]))
    writer.answers[0].set_result(None)
    await pair.until(lambda: len(writer.requests) == 2)  # (not appended here ahead of publish 1)
    writer.answers[1].set_result(None)
    confirms = await pair.expect(2)
    assert [i for conf in confirms for i in conf.publishing_ids] == [1, 2]
    pair.send(c.Publish(1, [c.PublishedEntry(3, b"c")]))  # the queue is empty: appended here now
    assert await pair.expect(1) == [c.PublishConfirm(1, [3])]
    handle = pair.hub.catalog.lookup("/", "s1")
    assert handle is not None and handle.next_offset == 1 and len(writer.requests) == 2


async def test_the_writer_refuses_a_malformed_forwarded_publish() -> None:
    from hutch.runtime.queue_types.stream_replication.service import entries_of
    data, _ = ck.encode_entries([b"a", ck.SubBatch(2, 1, 9, b"zz")])
    assert entries_of(data, [1, 2], None) == [b"a", ck.SubBatch(2, 1, 9, b"zz")]
    for bad_data, ids, filters, why in [
        (data, [1], None, "2 entries for 1 publishing ids"),
        (data, [1, 2], [None], "filter values"),
        (data, [1, -2], None, "publishing ids"),
        (data, [], None, "publishing ids"),
        (data[:-1], [1, 2], None, "runs past"),
        (data + b"\0\0", [1, 2, 3], None, "malformed stream publish"),
    ]:
        with pytest.raises(ValueError, match=why):
            entries_of(bad_data, ids, filters)


async def test_a_stored_offset_goes_to_the_writer(node: Node) -> None:
    writer, pair = await forwarding_pair(node)
    pair.send(c.StoreOffset("billing", "s1", 42))  # (no answer, as RabbitMQ)
    await pair.until(lambda: writer.offsets == [(b"billing", 42)])
    writer.writes_here_now = True  # on the writer's node: stored here
    pair.send(c.StoreOffset("billing", "s1", 43))
    reply = await pair.request(c.QueryOffset(9, "billing", "s1"))
    assert reply == c.QueryOffsetResponse(9, Code.OK, 43) and writer.offsets == [(b"billing", 42)]


async def test_a_deleted_publishers_queued_publishes_are_not_sent(node: Node) -> None:
    writer, pair = await forwarding_pair(node)
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    pair.send(c.Publish(1, [c.PublishedEntry(1, b"a")]))
    await pair.until(lambda: len(writer.requests) == 1)
    pair.send(c.Publish(1, [c.PublishedEntry(2, b"b")]))  # queued behind the first
    assert await pair.request(c.DeletePublisher(3, 1)) == c.Response(Key.DELETE_PUBLISHER, 3, Code.OK)
    writer.answers[0].set_result(None)
    await pair.until(lambda: pair.conn.publishing.pending_appends == 0)
    assert len(writer.requests) == 1 and pair.received() == []  # not sent, and nobody is told
