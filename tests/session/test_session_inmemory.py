"""The AMQP connection and its channels driven in memory: a pamqp client, a real `AMQPConnection` on a
real broker `Node`, bytes in and frames out, no socket and no transport (issue 14 point 5).

Covers the handshake (whole and one byte at a time), the channel lifecycle, publish -> deliver -> ack,
publisher confirms with `multiple`, flow control (alarms, channel.flow, a full write buffer), the
heartbeat and handshake timers on a manual clock, connection errors, login and gated methods holding
the input, and the 8-byte frame tolerance."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands, frame
from pamqp import header as pheader
from pamqp.body import ContentBody
from pamqp.heartbeat import Heartbeat

from hutch.runtime.broker.node import Node
from hutch.runtime.session.connection import CLOSE_OK_TIMEOUT_S, FLOW_STATE_S

from .memory import SessionPair, close_node, make_node

pytestmark = pytest.mark.asyncio


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


def types(frames: list[tuple[int, Any]]) -> list[tuple[int, type]]:
    return [(ch, type(f)) for ch, f in frames]


async def opened(node: Node, **tune: int) -> SessionPair:
    pair = SessionPair(node)
    await pair.open(**tune)
    return pair


# -- handshake -------------------------------------------------------------------------------------
async def test_handshake(node: Node) -> None:
    pair = SessionPair(node)
    seen = await pair.open()
    assert types(seen) == [(0, commands.Connection.Start), (0, commands.Connection.Tune),
                           (0, commands.Connection.OpenOk)]
    start, tune = seen[0][1], seen[1][1]
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    assert start.server_properties["product"] == "hutch"
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    assert pair.conn.user_name == "guest" and pair.conn.vhost_obj is node.vhosts["/"]
    assert pair.conn in node.connections and pair.transport.reading


async def test_handshake_one_byte_at_a_time(node: Node) -> None:
    pair = SessionPair(node)
    seen = await pair.open(one_byte_at_a_time=True)
    assert [t for _, t in types(seen)] == [commands.Connection.Start, commands.Connection.Tune,
                                           commands.Connection.OpenOk]


async def test_wrong_protocol_header_gets_ours_and_the_socket_closes(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(b"AMQP\x00\x00\x08\x00")
    assert bytes(pair.transport.written) == b"AMQP\x00\x00\x09\x01"
    assert pair.transport.closed


async def test_the_login_holds_the_input_until_it_completes(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(b"AMQP\x00\x00\x09\x01")
    pair.received()
    pair.send(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                             response="\x00guest\x00guest"))
    assert not pair.transport.reading  # nothing past start-ok is read while the password is checked
    pair.feed(bytes(Heartbeat().marshal()))  # what one read may still bring: kept, not handled
    assert pair.conn.reader.buffered == 8
    await pair.until(lambda: pair.transport.reading)
    assert types(pair.received()) == [(0, commands.Connection.Tune)]
    assert pair.conn.reader.buffered == 0


async def test_more_than_a_frame_during_the_login_closes(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(b"AMQP\x00\x00\x09\x01")
    pair.send(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                             response="\x00guest\x00guest"))
    pair.feed(bytes(Heartbeat().marshal()) * 20_000)
    assert pair.transport.closed


async def test_wrong_password_is_403(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(b"AMQP\x00\x00\x09\x01")
    pair.received()
    pair.send(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response="\x00guest\x00wrong"))
    await pair.until(lambda: bool(pair.transport.written[pair._read:]))
    (ch, close), = pair.received()
    assert (ch, close.reply_code, close.class_id, close.method_id) == (0, 403, 10, 11)
    assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                                "For details see the broker logfile.")


async def test_handshake_timeout_on_the_manual_clock(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(b"AMQP\x00\x00\x09\x01")
    pair.clock.advance(9.9)
    assert not pair.transport.closed
    pair.clock.advance(0.2)  # handshake_timeout is 10 s
    assert pair.transport.closed


# -- heartbeats --------------------------------------------------------------------------------------
async def test_heartbeats_both_ways(node: Node) -> None:
    pair = await opened(node, heartbeat=10)
    pair.clock.advance(5)  # every heartbeat/2 with nothing sent: a heartbeat frame
    assert types(pair.received()) == [(0, Heartbeat)]
    pair.send(0, Heartbeat())  # the client's keeps the connection alive
    pair.clock.advance(15)
    assert not pair.transport.closed
    pair.clock.advance(10)  # nothing received for more than two intervals
    assert pair.transport.closed


# -- channels ----------------------------------------------------------------------------------------
async def test_channel_lifecycle(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.open_channel(65535)
    pair.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert types(pair.received()) == [(1, commands.Channel.CloseOk)]
    pair.open_channel(1)  # the number can be used again
    # a channel error closes that channel only; it counts until the client's close-ok
    pair.send(1, commands.Queue.Declare(queue="missing", passive=True))
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (1, 404) and close.reply_text.startswith("NOT_FOUND")
    pair.send(1, commands.Queue.Declare(queue="ignored"))  # ignored until close-ok
    assert pair.received() == []
    pair.send(1, commands.Channel.CloseOk())
    pair.open_channel(1)
    assert sorted(pair.conn.channels) == [1, 65535]


async def test_channel_max_is_a_count(node: Node) -> None:
    pair = await opened(node, channel_max=2)
    pair.open_channel(4000)
    pair.open_channel(9)
    pair.send(10, commands.Channel.Open())
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (0, 530)
    assert close.reply_text == ("NOT_ALLOWED - number of channels opened (2) has reached the negotiated "
                                "channel_max (2)")


# -- publish, deliver, ack ---------------------------------------------------------------------------
async def test_publish_deliver_ack(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="work"), commands.Basic.Consume(queue="work", consumer_tag="c1"))
    assert types(pair.received()) == [(1, commands.Queue.DeclareOk), (1, commands.Basic.ConsumeOk)]
    props = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"}, delivery_mode=1)
    pair.feed(pair.publish(1, "work", b"hello", properties=props))
    (c1, deliver), (c2, head), (c3, body) = pair.received()
    assert (c1, c2, c3) == (1, 1, 1)
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered, deliver.routing_key) == \
        ("c1", 1, False, "work")
    assert isinstance(head, pheader.ContentHeader) and head.body_size == 5
    assert head.properties.content_type == "text/plain" and head.properties.headers == {"k": "v"}
    assert isinstance(body, ContentBody) and body.value == b"hello"
    queue = node.vhosts["/"].queues["work"]
    assert queue.message_count == 0 and len(pair.conn.channels[1].unacked) == 1
    pair.send(1, commands.Basic.Ack(delivery_tag=1))
    assert not pair.conn.channels[1].unacked and pair.received() == []


async def test_the_content_header_is_delivered_as_sent_unless_weight_or_properties_change(node: Node) -> None:
    """The header payload a publisher sent is kept as the message's header (no re-packing), except when
    its weight is not 0 (delivered with 0, as RabbitMQ does) or the broker rewrote the properties (BCC)."""
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="hdr"), commands.Basic.Consume(queue="hdr", no_ack=True))
    pair.received()

    def header_frame(weight: int, props: commands.Basic.Properties, size: int) -> tuple[bytes, bytes]:
        sent = pair.encode(1, pheader.ContentHeader(0, size, props))
        sent = sent[:9] + struct.pack(">H", weight) + sent[11:]  # pamqp always writes weight 0
        return sent, sent[7:-1]

    def delivered_header_payload() -> bytes:
        data = bytes(pair.transport.written[pair._read:])
        pair.received()
        pos = 0
        while pos < len(data):  # the payload of the (only) header frame written
            ftype, _ch, size = struct.unpack_from(">BHI", data, pos)
            if ftype == 2:
                return data[pos + 7:pos + 7 + size]
            pos += 8 + size
        raise AssertionError("no header frame delivered")

    method = pair.encode(1, commands.Basic.Publish(exchange="", routing_key="hdr"))
    body = pair.encode(1, ContentBody(b"abc"))
    for props in (commands.Basic.Properties(delivery_mode=2),
                  commands.Basic.Properties(content_type="t/p", headers={"k": "v"})):
        sent, payload = header_frame(0, props, 3)
        pair.feed(method + sent + body)
        assert delivered_header_payload() == payload
        sent7, _ = header_frame(7, props, 3)  # weight 7: delivered with weight 0, the rest unchanged
        pair.feed(method + sent7 + body)
        assert delivered_header_payload() == payload
    bcc = commands.Basic.Properties(headers={"BCC": ["nobody"], "k": "v"})
    sent, _ = header_frame(0, bcc, 3)
    pair.feed(method + sent + body)
    _, expected = header_frame(0, commands.Basic.Properties(headers={"k": "v"}), 3)
    assert delivered_header_payload() == expected  # BCC removed: packed again with the new properties


async def test_a_multiple_ack_over_interleaved_queues_settles_each_queue(node: Node) -> None:
    """One multi-ack covering deliveries of two queues, interleaved (runs of one queue, then the other,
    then the first again): each queue is told of exactly its own, and later tags stay unacked."""
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="qa"), commands.Queue.Declare(queue="qb"),
              commands.Basic.Consume(queue="qa"), commands.Basic.Consume(queue="qb"))
    pair.received()
    for rk in ("qa", "qa", "qb", "qa", "qb", "qb", "qa"):  # tags 1..7 in this order
        pair.feed(pair.publish(1, rk, rk.encode()))
    pair.received()
    qa, qb = node.vhosts["/"].queues["qa"], node.vhosts["/"].queues["qb"]
    assert (qa.unacked_count, qb.unacked_count) == (4, 3)
    pair.send(1, commands.Basic.Ack(delivery_tag=6, multiple=True))
    assert (qa.unacked_count, qb.unacked_count) == (1, 0)
    assert list(pair.conn.channels[1].unacked) == [7]
    assert (qa.stat_acked, qb.stat_acked) == (3, 3)


async def test_publishes_fed_one_byte_at_a_time(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="bytewise"))
    pair.received()
    big = bytes(range(256)) * 1200  # three body frames at 131072
    data = pair.publish(1, "bytewise", b"small") + pair.publish(1, "bytewise", big)
    pair.feed(data, one_byte_at_a_time=True)
    pair.send(1, commands.Basic.Get(queue="bytewise", no_ack=True))
    pair.send(1, commands.Basic.Get(queue="bytewise", no_ack=True))
    got = pair.received()
    bodies = [f.value for _, f in got if isinstance(f, ContentBody)]
    assert b"".join(bodies) == b"small" + big
    assert [type(f) for _, f in got if isinstance(f, commands.Basic.GetOk)] == [commands.Basic.GetOk] * 2


async def test_a_body_frame_of_exactly_frame_max_payload_is_taken(node: Node) -> None:
    pair = await opened(node, frame_max=4096)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="fudge"))
    pair.received()
    body = b"f" * 8192
    head = pair.encode(1, commands.Basic.Publish(routing_key="fudge"),
                       pheader.ContentHeader(0, len(body), commands.Basic.Properties()))
    frames = b"".join(struct.pack(">BHI", 3, 1, 4096) + body[i:i + 4096] + b"\xce" for i in (0, 4096))
    pair.feed(head + frames)
    assert node.vhosts["/"].queues["fudge"].message_count == 1
    pair.feed(pair.encode(1, commands.Basic.Publish(routing_key="fudge"),
                          pheader.ContentHeader(0, 5000, commands.Basic.Properties()))
              + struct.pack(">BHI", 3, 1, 4097))
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (0, 501)


# -- confirms ----------------------------------------------------------------------------------------
async def test_confirms_are_folded_into_one_multiple_ack(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="confirmed"), commands.Confirm.Select())
    assert types(pair.received()) == [(1, commands.Queue.DeclareOk), (1, commands.Confirm.SelectOk)]
    pair.feed(b"".join(pair.publish(1, "confirmed", b"m%d" % i) for i in range(3)))
    (ch, ack), = pair.received()
    assert ch == 1 and isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (3, True)
    pair.feed(pair.publish(1, "confirmed", b"fourth"))
    (ch, ack), = pair.received()
    assert (ack.delivery_tag, ack.multiple) == (4, False)


async def test_persistent_publishes_are_confirmed_after_the_group_commit(tmp_path: Path) -> None:
    node = make_node(str(tmp_path / "durable"), durable=True)
    try:
        pair = await opened(node)
        pair.open_channel(1)
        pair.send(1, commands.Queue.Declare(queue="kept", durable=True), commands.Confirm.Select())
        assert types(pair.received()) == [(1, commands.Queue.DeclareOk), (1, commands.Confirm.SelectOk)]
        persistent = commands.Basic.Properties(delivery_mode=2)
        pair.feed(b"".join(pair.publish(1, "kept", b"p%d" % i, properties=persistent) for i in range(3)))
        assert node.persistence is not None
        # the fsync runs in an executor and reports back on the loop, which has not run yet
        assert node.persistence.synced_seq < node.persistence.last_enqueued
        assert pair.received() == []  # nothing is confirmed before its fsync
        await pair.until(lambda: bool(pair.transport.written[pair._read:]))
        (ch, ack), = pair.received()
        assert isinstance(ack, commands.Basic.Ack) and (ack.delivery_tag, ack.multiple) == (3, True)
        assert node.persistence.synced_seq >= node.persistence.last_enqueued
    finally:
        await close_node(node)


# -- flow control ------------------------------------------------------------------------------------
async def test_an_alarm_blocks_a_publisher_mid_message(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="alarmed"))
    pair.received()
    node.set_alarm("memory")
    assert pair.transport.reading  # has not published: "blocking"
    data = pair.publish(1, "alarmed", b"x" * 300_000)
    pair.feed(data[:200])  # the method and the header: the reader stops at the content frame
    assert not pair.transport.reading
    assert types(pair.received()) == [(0, commands.Connection.Blocked)]
    assert pair.conn._state_name() == "blocked"
    node.clear_alarm("memory")
    assert pair.transport.reading
    assert types(pair.received()) == [(0, commands.Connection.Unblocked)]
    pair.feed(data[200:])
    assert node.vhosts["/"].queues["alarmed"].message_count == 1


class _HoldingQueue:
    """What `flow_block` needs of a queue: its waiters, and whether it still needs to hold them."""

    def __init__(self) -> None:
        self.flow_waiters: set[Any] = set()

    def flow_still_needed(self) -> bool:
        return True


async def test_a_queue_hold_reads_flow_for_a_second_after_it_began(node: Node) -> None:
    """As RabbitMQ's credit_flow:state/0: `flow` while held, and until FLOW_STATE_S after the hold began,
    so a hold of a few ms at a time under a steady load shows in a state sampled now and then."""
    pair = await opened(node)
    assert pair.conn._state_name() == "running"
    queue = _HoldingQueue()
    pair.conn.flow_block(queue)
    assert pair.conn._state_name() == "flow" and not pair.transport.reading
    pair.clock.advance(0.3)
    pair.conn.flow_unblock(queue)
    assert pair.transport.reading  # the input runs again at once: only the state lingers
    assert pair.conn._state_name() == "flow"
    pair.clock.advance(FLOW_STATE_S - 0.3 - 0.01)
    assert pair.conn._state_name() == "flow"
    pair.clock.advance(0.02)
    assert pair.conn._state_name() == "running"
    pair.conn.flow_block(queue)  # a new hold starts the second again
    pair.conn.flow_unblock(queue)
    pair.clock.advance(FLOW_STATE_S / 2)
    assert pair.conn._state_name() == "flow"


async def test_channel_flow(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Channel.Flow(active=True))
    (ch, ok), = pair.received()
    assert isinstance(ok, commands.Channel.FlowOk) and ok.active
    pair.send(1, commands.Channel.Flow(active=False))
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (0, 540)


async def test_a_full_write_buffer_pauses_deliveries(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="slow"), commands.Basic.Consume(queue="slow", no_ack=True))
    pair.received()
    pair.conn.pause_writing()  # what the transport says above its high-water mark
    pair.feed(pair.publish(1, "slow", b"waits"))
    assert pair.received() == []
    assert node.vhosts["/"].queues["slow"].message_count == 1
    pair.conn.resume_writing()
    bodies = [f.value for _, f in pair.received() if isinstance(f, ContentBody)]
    assert bodies == [b"waits"]


# -- connection errors -------------------------------------------------------------------------------
async def test_bad_frame_end_is_501_and_close_ok_closes(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    raw = pair.encode(1, commands.Queue.Declare(queue="x"))
    pair.feed(raw[:-1] + b"\x00")
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (0, 501) and close.reply_text.startswith("FRAME_ERROR")
    assert not pair.conn.channels and not pair.transport.closed
    # the frame boundaries are lost, so (like RabbitMQ) the socket goes after a grace period
    pair.send(0, commands.Connection.CloseOk())
    assert pair.received() == [] and not pair.transport.closed
    pair.clock.advance(CLOSE_OK_TIMEOUT_S)  # 3 s: the wait for close-ok after the node's own close
    assert pair.transport.closed


async def test_close_ok_after_a_connection_error(node: Node) -> None:
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Channel.Open())  # a second channel.open: a connection error
    frames = pair.received()
    assert types(frames)[-1] == (0, commands.Connection.Close) and frames[-1][1].reply_code == 504
    pair.send(1, commands.Queue.Declare(queue="ignored"))  # nothing but close/close-ok is looked at
    assert pair.received() == []
    pair.send(0, commands.Connection.CloseOk())
    assert pair.transport.closed


async def test_client_close(node: Node) -> None:
    """After close-ok the socket stays open and what the client still sends is read and discarded
    (issue 22: amqplib's publisher had frames queued behind its close) until the client closes it."""
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert types(pair.received()) == [(0, commands.Connection.CloseOk)]
    assert not pair.transport.closed and not pair.conn.channels
    pair.feed(pair.publish(1, "q", b"queued behind the close") * 100 + b"not even a frame")
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="again", class_id=0, method_id=0))
    assert pair.received() == [] and not pair.transport.closed and pair.transport.reading
    pair.conn.connection_lost()  # the client closed the socket
    assert pair.conn not in node.connections


async def test_after_close_ok_the_socket_goes_after_the_closing_timeout(node: Node) -> None:
    pair = await opened(node)
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert types(pair.received()) == [(0, commands.Connection.CloseOk)]
    assert pair.conn.closing_timeout_s() == 30.0  # rabbit_reader's CLOSING_TIMEOUT without a heartbeat
    pair.clock.advance(29)
    assert not pair.transport.closed
    pair.clock.advance(1)
    assert pair.transport.closed


async def test_the_closing_timeout_is_the_heartbeat_timeout_when_shorter(node: Node) -> None:
    pair = await opened(node, heartbeat=5)
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert pair.conn.closing_timeout_s() == 5
    pair.clock.advance(5)
    assert pair.transport.closed


async def test_a_close_during_the_handshake_discards_the_rest(node: Node) -> None:
    pair = SessionPair(node)
    pair.feed(frame.marshal(pheader.ProtocolHeader(), 0))
    assert types(pair.received()) == [(0, commands.Connection.Start)]
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
              commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
    assert types(pair.received()) == [(0, commands.Connection.CloseOk)]
    pair.clock.advance(node.config.handshake_timeout_ms / 1000)  # the handshake timer is stopped
    assert not pair.transport.closed
    pair.clock.advance(pair.conn.closing_timeout_s())
    assert pair.transport.closed


async def test_a_publisher_held_by_an_alarm_reads_its_close_ok(node: Node) -> None:
    """A server-initiated close lifts the read holds (alarm, flow): the client's close-ok is read."""
    pair = await opened(node)
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="held"))
    pair.received()
    node.alarms.add("memory")
    pair.conn.has_published = True
    pair.conn.block_for_alarm()
    assert not pair.transport.reading
    pair.conn.close_forced("test")
    assert pair.transport.reading
    (ch, close), = pair.received()
    assert (ch, close.reply_code) == (0, 320)
    pair.send(0, commands.Connection.CloseOk())
    assert pair.transport.closed


async def test_simultaneous_close_answers_close_ok_then_discards(node: Node) -> None:
    pair = await opened(node)
    pair.conn.close_forced("test")
    assert types(pair.received()) == [(0, commands.Connection.Close)]
    pair.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert types(pair.received()) == [(0, commands.Connection.CloseOk)]
    pair.feed(b"anything")
    assert not pair.transport.closed
    pair.clock.advance(pair.conn.closing_timeout_s())
    assert pair.transport.closed


# -- a gated method (the cluster's port) ---------------------------------------------------------------
class HeldGate:
    """A `MethodGate` that wants queue.declare and makes its reply wait for `commit`."""

    def __init__(self) -> None:
        self.commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.barriers = 0

    def wants(self, channel: Any, method: Any) -> bool:
        return method.NAME == "queue.declare"

    async def barrier(self, method: Any) -> None:
        self.barriers += 1

    async def prepare(self, channel: Any, method: Any) -> None:
        return None

    def holds_replies(self) -> bool:
        return True

    async def after(self) -> None:
        await self.commit


async def test_a_gated_method_holds_input_and_its_reply(node: Node) -> None:
    gate = HeldGate()
    pair = SessionPair(node, gate=gate)
    await pair.open()
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="gated"), commands.Basic.Qos(prefetch_count=5))
    assert not pair.transport.reading
    await pair.until(lambda: "gated" in node.vhosts["/"].queues)  # the method ran...
    assert pair.received() == []  # ...but its reply waits, and the qos behind it is not handled
    assert gate.barriers == 1
    gate.commit.set_result(None)
    await pair.until(lambda: pair.transport.reading)
    assert types(pair.received()) == [(1, commands.Queue.DeclareOk), (1, commands.Basic.QosOk)]
