"""The stream-protocol connection driven in memory: a real `StreamConnection` on a real broker node and
real stream handles (MemoryFS), bytes in, frames out, a manual clock. Covers the handshake (whole and
one byte at a time, refused logins and vhosts, the pre-open frame limit), publishing with confirms,
errors and deduplication, subscribing with credit, offsets, metadata and stats, command versions,
heartbeats, closing both ways, and bad frames."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from hutch.queues.stream import chunk as ck
from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.connection import COALESCE_MAX_BYTES, coalesce
from hutch.runtime.stream_session.publishing import MAX_CONFIRM_IDS, confirm_ids_per_frame
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.wire import OffsetSpec
from session.memory import make_node

from .memory import StreamPair, make_hub

pytestmark = pytest.mark.asyncio


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def opened(node: Node) -> StreamPair:
    pair = StreamPair(make_hub(node))
    await pair.open()
    return pair


def chunk_records(chunk: bytes) -> list[tuple[int, bytes]]:
    """(offset, record) of a delivered chunk: its header, then its entries (no filter, no trailer, as
    osiris sends it to a client, whatever the header says of the trailer)."""
    header = ck.decode_header(chunk)
    assert len(chunk) == ck.HEADER_SIZE + header.data_size
    entries = ck.iter_entries(memoryview(chunk)[ck.HEADER_SIZE:])
    return [(header.chunk_id + i, e) for i, e in enumerate(entries) if isinstance(e, bytes)]


def records(deliveries: list[c.Command]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for d in deliveries:
        assert isinstance(d, c.Deliver)
        out.extend(chunk_records(d.chunk))
    return out


async def confirmed(pair: StreamPair, count: int) -> list[tuple[int, int]]:
    """(publisher id, publishing id) of the next `count` ids confirmed, in the order they came: the
    confirms settled together come as one frame per publisher, so how many frames is not fixed."""
    got: list[tuple[int, int]] = []
    while len(got) < count:
        for conf in await pair.expect(1):
            assert isinstance(conf, c.PublishConfirm)
            got.extend((conf.publisher_id, i) for i in conf.publishing_ids)
    assert len(got) == count
    return got


# -- handshake -------------------------------------------------------------------------------------
@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
async def test_handshake(node: Node, one_byte_at_a_time: bool) -> None:
    pair = StreamPair(make_hub(node))
    seen = await pair.open(one_byte_at_a_time=one_byte_at_a_time)
    props, mechs, auth, tune, opened_ = seen
    assert isinstance(props, c.PeerPropertiesResponse) and props.properties["product"] == "hutch"
    assert isinstance(mechs, c.SaslHandshakeResponse) and mechs.mechanisms == ["PLAIN", "AMQPLAIN"]
    assert auth == c.SaslAuthenticateResponse(3, Code.OK)
    assert tune == c.Tune(1_048_576, 60)
    assert opened_ == c.OpenResponse(4, Code.OK, {"advertised_host": "127.0.0.1", "advertised_port": "5552"})
    assert pair.conn.user_name == "guest" and pair.conn.vhost is node.vhosts["/"]
    assert pair.conn.reader.frame_max == 1_048_576


async def test_a_wrong_password_is_refused_and_closed(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    pair.send(c.PeerProperties(1, {}), c.SaslHandshake(2), c.SaslAuthenticate(3, "PLAIN", b"\0guest\0nope"))
    seen = await pair.expect(3)
    assert seen[-1] == c.SaslAuthenticateResponse(3, Code.AUTHENTICATION_FAILURE)
    assert not pair.transport.reading  # the client may read the refusal; the socket goes a second later
    pair.clock.advance(2)
    assert pair.transport.closed


async def test_guest_from_another_host_is_refused_as_loopback_only(node: Node) -> None:
    pair = StreamPair(make_hub(node), peer="10.1.2.3")
    pair.send(c.PeerProperties(1, {}), c.SaslHandshake(2), c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"))
    seen = await pair.expect(3)
    assert seen[-1] == c.SaslAuthenticateResponse(3, Code.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
    pair.clock.advance(2)
    assert pair.transport.closed


async def test_an_unknown_mechanism_and_an_unknown_vhost(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    pair.send(c.PeerProperties(1, {}), c.SaslHandshake(2), c.SaslAuthenticate(3, "CRAM-MD5", b""))
    assert (await pair.expect(3))[-1] == c.SaslAuthenticateResponse(3, Code.SASL_MECHANISM_NOT_SUPPORTED)
    assert not pair.transport.closed
    pair.send(c.SaslAuthenticate(4, "PLAIN", b"\0guest\0guest"))
    await pair.expect(2)
    pair.send(c.TuneResponse(1_048_576, 0), c.Open(5, "no-such-vhost"))
    assert await pair.expect(1) == [c.OpenResponse(5, Code.VIRTUAL_HOST_ACCESS_FAILURE)]
    pair.clock.advance(2)
    assert pair.transport.closed


async def test_before_open_a_frame_past_the_initial_limit_or_out_of_order_closes(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    pair.feed(struct.pack(">I", 8193))
    assert pair.transport.closed and pair.received() == []
    pair = StreamPair(make_hub(node))
    pair.send(c.Open(1, "/"))  # open before authenticating
    assert pair.transport.closed and pair.received() == []


# -- streams ---------------------------------------------------------------------------------------
async def test_create_delete_metadata_and_stats(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1", {"max-age": "1h"})
    assert await pair.request(c.Create(10, "s1", {})) == c.Response(Key.CREATE, 10, Code.STREAM_ALREADY_EXISTS)
    assert await pair.request(c.Create(11, "s2", {"max-age": "soon"})) == \
        c.Response(Key.CREATE, 11, Code.PRECONDITION_FAILED)
    assert await pair.request(c.Create(12, "amq.s", {})) == c.Response(Key.CREATE, 12, Code.PRECONDITION_FAILED)
    meta = await pair.request(c.Metadata(13, ["s1", "nope"]))
    assert meta == c.MetadataResponse(13, [(0, "127.0.0.1", 5552)],
                                      [("s1", Code.OK, 0, []), ("nope", Code.STREAM_DOES_NOT_EXIST, 0xFFFF, [])])
    stats = await pair.request(c.StreamStats(14, "s1"))
    assert stats == c.StreamStatsResponse(14, Code.OK, {"first_chunk_id": -1, "committed_chunk_id": -1})
    assert await pair.request(c.Delete(15, "s1")) == c.Response(Key.DELETE, 15, Code.OK)
    assert await pair.request(c.Delete(16, "s1")) == c.Response(Key.DELETE, 16, Code.STREAM_DOES_NOT_EXIST)


async def test_command_versions_list_every_key_in_order(node: Node) -> None:
    pair = await opened(node)
    reply = await pair.request(c.ExchangeCommandVersions(9, [(Key.DELIVER, 1, 2)]))
    assert isinstance(reply, c.ExchangeCommandVersionsResponse)
    assert [k for k, _, _ in reply.versions] == list(range(1, 32))  # rstream indexes it by key - 1
    assert reply.versions[Key.PUBLISH - 1] == (Key.PUBLISH, 1, 2)
    assert pair.conn.consuming.deliver_version == 2


# -- publishing ------------------------------------------------------------------------------------
async def test_publish_confirms_after_the_sync_and_deduplicates(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    assert await pair.request(c.DeclarePublisher(20, 1, "app", "s1")) == \
        c.Response(Key.DECLARE_PUBLISHER, 20, Code.OK)
    assert await pair.request(c.DeclarePublisher(21, 1, "other", "s1")) == \
        c.Response(Key.DECLARE_PUBLISHER, 21, Code.PRECONDITION_FAILED)
    assert await pair.request(c.DeclarePublisher(22, 2, "app", "s1")) == \
        c.Response(Key.DECLARE_PUBLISHER, 22, Code.PRECONDITION_FAILED)
    pair.send(c.Publish(1, [c.PublishedEntry(i, b"m%d" % i) for i in range(1, 4)]))
    assert await pair.expect(1) == [c.PublishConfirm(1, [1, 2, 3])]
    pair.send(c.Publish(1, [c.PublishedEntry(i, b"m%d" % i) for i in range(2, 6)]))  # 2, 3 resent
    confirms = await pair.expect(2)
    assert sorted(i for conf in confirms for i in conf.publishing_ids) == [2, 3, 4, 5]
    seq = await pair.request(c.QueryPublisherSequence(23, "app", "s1"))
    assert seq == c.QueryPublisherSequenceResponse(23, Code.OK, 5)
    handle = pair.hub.catalog.lookup("/", "s1")
    assert handle is not None and handle.next_offset == 5  # 1..5 once each
    pair.send(c.Publish(7, [c.PublishedEntry(9, b"x")]))
    assert await pair.expect(1) == [c.PublishError(7, [(9, Code.PUBLISHER_DOES_NOT_EXIST)])]
    assert await pair.request(c.DeletePublisher(24, 1)) == c.Response(Key.DELETE_PUBLISHER, 24, Code.OK)
    assert await pair.request(c.DeletePublisher(25, 1)) == \
        c.Response(Key.DELETE_PUBLISHER, 25, Code.PUBLISHER_DOES_NOT_EXIST)


async def test_declaring_a_publisher_on_a_missing_stream(node: Node) -> None:
    pair = await opened(node)
    assert await pair.request(c.DeclarePublisher(20, 1, "", "nope")) == \
        c.Response(Key.DECLARE_PUBLISHER, 20, Code.STREAM_DOES_NOT_EXIST)


# -- consuming -------------------------------------------------------------------------------------
async def test_subscribe_delivers_a_chunk_per_credit_from_the_files(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    for batch in range(3):
        pair.send(c.Publish(1, [c.PublishedEntry(batch * 10 + i, b"b%d-%d" % (batch, i)) for i in range(2)]))
        await pair.expect(1)
    pair.send(c.Subscribe(3, 7, "s1", OffsetSpec(OffsetType.FIRST), 2))
    ok, *first = await pair.expect(3)
    assert ok == c.Response(Key.SUBSCRIBE, 3, Code.OK)
    assert [d.subscription_id for d in first] == [7, 7]
    assert records(first) == [(0, b"b0-0"), (1, b"b0-1"), (2, b"b1-0"), (3, b"b1-1")]
    pair.send(c.Credit(7, 5))
    assert records(await pair.expect(1)) == [(4, b"b2-0"), (5, b"b2-1")]
    pair.send(c.Publish(1, [c.PublishedEntry(99, b"late")]))  # a commit wakes the subscription
    got = await pair.expect(2)
    assert records([d for d in got if isinstance(d, c.Deliver)]) == [(6, b"late")]
    pair.send(c.Credit(9, 1))
    assert await pair.expect(1) == [c.CreditResponse(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST, 9)]
    assert await pair.request(c.Subscribe(4, 7, "s1", OffsetSpec(OffsetType.FIRST), 1)) == \
        c.Response(Key.SUBSCRIBE, 4, Code.SUBSCRIPTION_ID_ALREADY_EXISTS)
    assert await pair.request(c.Unsubscribe(5, 7)) == c.Response(Key.UNSUBSCRIBE, 5, Code.OK)
    assert await pair.request(c.Unsubscribe(6, 7)) == c.Response(Key.UNSUBSCRIBE, 6, Code.SUBSCRIPTION_ID_DOES_NOT_EXIST)


async def test_large_chunks_go_out_as_parts_and_arrive_whole(node: Node) -> None:
    """A delivery's chunk data past COALESCE_MAX_BYTES is written as a part of its own (`writelines`),
    the small frames around it joined; the client reads the same frames, in order."""
    pair = await opened(node)
    await pair.create("big")
    await pair.request(c.DeclarePublisher(2, 1, "", "big"))
    bodies = [bytes([65 + i]) * (COALESCE_MAX_BYTES + 100 * i) for i in range(3)]
    for i, body in enumerate(bodies):  # one chunk each
        pair.send(c.Publish(1, [c.PublishedEntry(i, body)]))
        assert await pair.expect(1) == [c.PublishConfirm(1, [i])]
    written: list[list[bytes | memoryview]] = []
    real = pair.transport.writelines

    def spy(parts: list[bytes | memoryview]) -> None:
        written.append(list(parts))
        real(parts)
    pair.transport.writelines = spy  # type: ignore[method-assign]
    pair.send(c.Subscribe(3, 7, "big", OffsetSpec(OffsetType.FIRST), 10))
    got = await pair.expect(4)
    assert records([d for d in got if isinstance(d, c.Deliver)]) == list(enumerate(bodies))
    assert any(isinstance(part, memoryview) and len(part) >= COALESCE_MAX_BYTES for parts in written for part in parts)


async def test_coalesce_joins_runs_of_small_parts_and_keeps_large_ones() -> None:
    big = memoryview(b"x" * COALESCE_MAX_BYTES)
    assert coalesce([b"a", b"b", big, b"c", big, big, b"d", b"e"]) == [b"ab", big, b"c", big, big, b"de"]
    assert coalesce([b"a"]) == [b"a"]
    assert coalesce([big]) == [big]
    parts = [b"1", big, b"2", b"3"]
    assert b"".join(coalesce(parts)) == b"".join(parts)


async def test_offset_specs_and_resolve(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    for i in range(3):
        pair.send(c.Publish(1, [c.PublishedEntry(i, b"m%d" % i)]))
        await pair.expect(1)
    for corr, spec, want in ((10, OffsetSpec(OffsetType.OFFSET, 1), [(1, b"m1"), (2, b"m2")]),
                             (11, OffsetSpec(OffsetType.LAST), [(2, b"m2")])):
        pair.send(c.Subscribe(corr, corr, "s1", spec, 10))
        ok, *chunks = await pair.expect(1 + len(want))
        assert ok == c.Response(Key.SUBSCRIBE, corr, Code.OK) and records(chunks) == want
    await pair.request(c.Subscribe(12, 12, "s1", OffsetSpec(OffsetType.NEXT), 10))
    assert pair.received() == []
    resolved = await pair.request(c.ResolveOffsetSpec(13, "s1", OffsetSpec(OffsetType.NEXT)))
    assert resolved == c.ResolveOffsetSpecResponse(13, Code.OK, OffsetType.OFFSET, 3)


async def test_store_and_query_offset(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    assert await pair.request(c.QueryOffset(2, "app", "s1")) == c.QueryOffsetResponse(2, Code.NO_OFFSET, 0)
    pair.send(c.StoreOffset("app", "s1", 42), c.StoreOffset("app", "nope", 1))
    assert await pair.request(c.QueryOffset(3, "app", "s1")) == c.QueryOffsetResponse(3, Code.OK, 42)
    assert await pair.request(c.QueryOffset(4, "app", "nope")) == \
        c.QueryOffsetResponse(4, Code.STREAM_DOES_NOT_EXIST, 0)


async def test_deleting_a_stream_tells_its_users(node: Node) -> None:
    hub = make_hub(node)
    owner, user = StreamPair(hub), StreamPair(hub)
    await owner.open()
    await user.open()
    await owner.create("s1")
    await user.request(c.Subscribe(2, 1, "s1", OffsetSpec(OffsetType.FIRST), 1))
    await owner.request(c.Delete(3, "s1"))
    assert await user.expect(1) == [c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, "s1")]
    assert user.conn.consuming.subscriptions == {}


# -- heartbeats, closing, bad frames ---------------------------------------------------------------
async def test_heartbeats_are_sent_and_a_silent_client_is_dropped(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    await pair.open(heartbeat_s=10)
    pair.clock.advance(10)
    assert pair.received() == [c.Heartbeat()]
    pair.clock.advance(15)
    assert pair.transport.closed


async def test_client_close_is_answered(node: Node) -> None:
    pair = await opened(node)
    pair.send(c.Close(9, 1, "bye"))
    assert pair.received() == [c.Response(Key.CLOSE, 9, Code.OK)]
    assert pair.transport.closed and pair.conn not in pair.hub.connections


async def test_an_unknown_frame_after_open_closes_with_its_code(node: Node) -> None:
    pair = await opened(node)
    pair.feed(struct.pack(">IHH", 4, 0x7F, 1))
    close = pair.received()
    assert len(close) == 1 and isinstance(close[0], c.Close) and close[0].closing_code == Code.UNKNOWN_FRAME
    assert not pair.transport.reading
    pair.send(c.Response(Key.CLOSE, close[0].correlation_id, Code.OK))
    assert pair.transport.closed


async def test_a_frame_past_the_negotiated_limit_closes_with_frame_too_large(node: Node) -> None:
    pair = await opened(node)
    pair.feed(struct.pack(">I", 1_048_577))
    close = pair.received()
    assert isinstance(close[0], c.Close) and close[0].closing_code == Code.FRAME_TOO_LARGE
    pair.clock.advance(2)  # no answer: closed after the grace period
    assert pair.transport.closed


async def test_last_names_a_chunk_written_and_not_yet_committed(node: Node) -> None:
    # as on RabbitMQ, where a chunk is visible once written: a subscription at `last` right after a
    # publish gets that chunk (when its fsync has committed it), not only what comes after it
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    pair.send(c.Publish(1, [c.PublishedEntry(1, b"old")]))
    await pair.expect(1)
    pair.send(c.Publish(1, [c.PublishedEntry(2, b"newest")]),
              c.Subscribe(3, 5, "s1", OffsetSpec(OffsetType.LAST), 10))  # before the fsync could run
    got = await pair.expect(3)
    assert records([d for d in got if isinstance(d, c.Deliver)]) == [(1, b"newest")]


async def test_a_large_publish_is_cut_into_chunks(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "app", "s1"))
    pair.send(c.Publish(1, [c.PublishedEntry(i, b"m") for i in range(1, 5001)]))
    assert sorted(i for _, i in await confirmed(pair, 5000)) == list(range(1, 5001))
    pair.send(c.Subscribe(3, 1, "s1", OffsetSpec(OffsetType.FIRST), 5))
    ok, *chunks = await pair.expect(3)
    assert [len(chunk_records(d.chunk)) for d in chunks] == [4096, 904]


async def test_the_publishes_of_one_input_become_one_chunk_per_stream_in_order(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.create("s2")
    for corr, (pid, ref, stream) in enumerate([(1, "", "s1"), (2, "", "s1"), (3, "", "s2"), (4, "app", "s1")]):
        await pair.request(c.DeclarePublisher(10 + corr, pid, ref, stream))
    one_size = [c.PublishedEntry(i, b"a%d" % i) for i in range(1, 4)]  # the uniform scan
    sizes = [c.PublishedEntry(i, b"b" * i) for i in range(1, 4)]  # the per-entry scan
    pair.send(c.Publish(1, one_size), c.Publish(2, sizes), c.Publish(3, one_size),
              c.Publish(4, [c.PublishedEntry(1, b"deduplicated")]),  # another path: what came before is written first
              c.Publish(1, [c.PublishedEntry(9, b"after")]))
    got = set(await confirmed(pair, 11))
    assert got == {(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3), (4, 1), (1, 9)}
    pair.send(c.Subscribe(20, 1, "s1", OffsetSpec(OffsetType.FIRST), 10))
    ok, *chunks = await pair.expect(4)
    assert ok == c.Response(Key.SUBSCRIBE, 20, Code.OK)
    assert [[r for _, r in chunk_records(d.chunk)] for d in chunks] == [
        [b"a1", b"a2", b"a3", b"b", b"bb", b"bbb"], [b"deduplicated"], [b"after"]]
    handle = pair.hub.catalog.lookup("/", "s2")
    assert handle is not None and handle.next_offset == 3


async def test_confirms_settled_together_go_out_as_one_frame_per_publisher(node: Node) -> None:
    """Three inputs are three chunks; the one sync that covers them settles all three in one turn, and
    each publisher's ids go out in one PublishConfirm (as osiris confirms a written batch), in order."""
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    await pair.request(c.DeclarePublisher(3, 2, "", "s1"))
    for n in range(3):  # each its own input (no loop turn between them: one sync covers all three)
        pair.send(c.Publish(1, [c.PublishedEntry(n * 10 + i, b"m") for i in range(3)]),
                  c.Publish(2, [c.PublishedEntry(n, b"p")]))
    assert sorted(await pair.expect(2), key=lambda conf: conf.publisher_id) == [  # type: ignore[attr-defined]
        c.PublishConfirm(1, [0, 1, 2, 10, 11, 12, 20, 21, 22]), c.PublishConfirm(2, [0, 1, 2])]
    handle = pair.hub.catalog.lookup("/", "s1")
    assert handle is not None and handle.chunks_written >= 3


async def test_publishes_read_while_the_stream_syncs_become_one_chunk(node: Node,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Group commit: while a sync of the stream is under way, the inputs read meanwhile gather into
    one batch, written as one chunk once that sync is answered; a command of another kind writes it
    first (its publishes stay in order), and so does the stream's close."""
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    await pair.request(c.DeclarePublisher(3, 2, "app", "s1"))  # a reference: the other path
    handle = pair.hub.catalog.lookup("/", "s1")
    assert handle is not None
    syncing = [True]
    monkeypatch.setattr(type(handle), "syncing", property(lambda self: syncing[0]))
    written = handle.chunks_written
    for n in range(3):  # three inputs while "a sync is under way": held, not written
        pair.send(c.Publish(1, [c.PublishedEntry(n, b"a%d" % n)]))
    assert handle.chunks_written == written
    syncing[0] = False
    handle._run_after_sync()  # the sync is answered: the three inputs go out as one chunk
    assert handle.chunks_written == written + 1
    assert await confirmed(pair, 3) == [(1, 0), (1, 1), (1, 2)]
    syncing[0] = True
    pair.send(c.Publish(1, [c.PublishedEntry(3, b"b")]))  # held ...
    pair.send(c.Publish(2, [c.PublishedEntry(1, b"c")]))  # ... and written before this one
    assert handle.chunks_written == written + 3
    assert set(await confirmed(pair, 2)) == {(1, 3), (2, 1)}
    pair.send(c.Publish(1, [c.PublishedEntry(4, b"d")]))  # held, then written by the close
    await handle.close()
    assert await confirmed(pair, 1) == [(1, 4)]
    assert handle.chunks_written == written + 4


async def test_coalesced_confirms_stay_within_the_frame_max(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    pair.conn.publishing.confirm_ids_per_frame = 4  # (what a frame_max of 45 bytes allows)
    assert confirm_ids_per_frame(45) == 4
    pair.send(c.Publish(1, [c.PublishedEntry(i, b"m") for i in range(10)]))
    assert await pair.expect(3) == [c.PublishConfirm(1, [0, 1, 2, 3]), c.PublishConfirm(1, [4, 5, 6, 7]),
                                    c.PublishConfirm(1, [8, 9])]


async def test_confirm_ids_per_frame() -> None:
    assert confirm_ids_per_frame(0) == MAX_CONFIRM_IDS  # no limit negotiated
    assert confirm_ids_per_frame(1048576) == MAX_CONFIRM_IDS
    assert confirm_ids_per_frame(13 + 8 * 100) == 100  # the frame's fields, then 8 bytes an id
    assert confirm_ids_per_frame(13 + 8 * 100 - 1) == 99
    assert confirm_ids_per_frame(8) == 1  # never none


async def test_batched_publishes_stay_within_a_chunks_entries(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    pair.send(*[c.Publish(1, [c.PublishedEntry(n * 2000 + i, b"m") for i in range(2000)]) for n in range(3)])
    assert sorted(i for _, i in await confirmed(pair, 6000)) == list(range(6000))
    pair.send(c.Subscribe(3, 1, "s1", OffsetSpec(OffsetType.FIRST), 5))
    ok, *chunks = await pair.expect(3)
    assert [len(chunk_records(d.chunk)) for d in chunks] == [4000, 2000]


async def test_a_full_write_buffer_stops_input_and_deliveries(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    pair.conn.pause_writing()  # the transport's buffer passed its high mark
    assert not pair.transport.reading and not pair.conn.can_deliver()
    pair.conn.resume_writing()
    assert pair.transport.reading and pair.conn.can_deliver()


async def test_an_internal_error_closes_only_that_connection(node: Node) -> None:
    hub = make_hub(node)
    broken, fine = StreamPair(hub), StreamPair(hub)
    await broken.open()
    await fine.open()

    def explode(cmd: c.Metadata) -> None:
        raise RuntimeError("a bug")
    broken.conn._dispatch[c.Metadata] = explode
    broken.send(c.Metadata(9, ["s1"]))
    close = broken.received()
    assert isinstance(close[0], c.Close) and close[0].closing_code == Code.INTERNAL_ERROR
    reply = await fine.request(c.Metadata(10, ["s1"]))
    assert isinstance(reply, c.MetadataResponse)


async def test_a_stream_deleted_over_amqp_is_reported_to_its_publisher(node: Node) -> None:
    pair = await opened(node)
    await pair.create("s1")
    await pair.request(c.DeclarePublisher(2, 1, "", "s1"))
    vhost = node.vhosts["/"]
    node.delete_queue(vhost, vhost.queues["s1"])  # as queue.delete or the management API do
    pair.send(c.Publish(1, [c.PublishedEntry(7, b"late")]))
    assert await pair.expect(2) == [c.PublishError(1, [(7, Code.STREAM_NOT_AVAILABLE)]),
                                    c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, "s1")]
    assert pair.conn.publishing.publishers == {}
