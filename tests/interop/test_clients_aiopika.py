"""aio-pika (and aiormq underneath) against hutch: the async client most asyncio applications use.

Covers connect and heartbeats, publisher confirms under concurrency, mandatory returns, the exchange
types and exchange-to-exchange bindings, QoS, ack/nack/reject, basic.get, transactions, large
messages, headers of every type aio-pika can encode, broker-initiated cancel, requeue on channel close,
Direct Reply-To, and the aiormq exception classes for RabbitMQ's error codes."""

from __future__ import annotations

import asyncio
import datetime as dt
from decimal import Decimal

import aio_pika
import aiormq.exceptions
import pytest
import pytest_asyncio
from aio_pika import ExchangeType, Message

from .helpers import unique

pytestmark = pytest.mark.asyncio

TIMEOUT = 10


@pytest_asyncio.fixture
async def connection(server):
    conn = await aio_pika.connect(server.url, timeout=TIMEOUT)
    yield conn
    await conn.close()


async def _collect(queue, count: int, no_ack: bool = True, timeout: float = TIMEOUT) -> list:
    got = []
    async with queue.iterator(no_ack=no_ack) as it:
        async for message in it:
            got.append(message)
            if len(got) >= count:
                break
    return got


async def test_connect_publish_consume_ack(connection):
    props = connection.transport.connection.server_properties
    assert props["product"] == "hutch"
    assert props["capabilities"]["publisher_confirms"] is True
    ch = await connection.channel()
    q = await ch.declare_queue(unique(), auto_delete=True)
    for i in range(10):
        await ch.default_exchange.publish(Message(f"m{i}".encode()), routing_key=q.name)
    messages = await asyncio.wait_for(_collect(q, 10, no_ack=False), TIMEOUT)
    assert [m.body for m in messages] == [f"m{i}".encode() for i in range(10)]
    for m in messages:
        await m.ack()
    await q.delete(if_unused=False, if_empty=False)


async def test_confirms_under_concurrency(connection):
    ch = await connection.channel(publisher_confirms=True)
    q = await ch.declare_queue("", exclusive=True)
    results = await asyncio.wait_for(asyncio.gather(*(
        ch.default_exchange.publish(Message(str(i).encode()), routing_key=q.name) for i in range(500)
    )), TIMEOUT)
    assert len(results) == 500
    assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results)
    declared = await ch.declare_queue(q.name, passive=True)
    assert declared.declaration_result.message_count == 500


async def test_confirms_of_routed_and_unroutable_publishes_in_flight_together(connection):
    """aiormq's `test_confirm_multiple` in shape, without its 0.2 s bound: ten publishes at once (not
    mandatory, aiormq's default) to a topic exchange where one is routed (to an exclusive queue) and nine
    are not, ten times; every publish is acked, whatever mix of single and multiple acks covers them (the
    shape RabbitMQ was seen to send: 1 2 4 5-multiple). Session 17 ran the suite's own test at normal
    priority: 64 of 64 on hutch (docs/compatibility.md)."""
    ch = await connection.channel(publisher_confirms=True)
    exchange = await ch.declare_exchange(unique("cm"), ExchangeType.TOPIC, auto_delete=True)
    q = await ch.declare_queue(exclusive=True)
    await q.bind(exchange, "test.5")
    for _ in range(10):
        results = await asyncio.wait_for(asyncio.gather(*(
            exchange.publish(Message(b"test"), routing_key=f"test.{i}", mandatory=False) for i in range(10)
        )), TIMEOUT)
        assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results), results
    declared = await ch.declare_queue(q.name, passive=True)
    assert declared.declaration_result.message_count == 10


async def test_mandatory_unroutable_raises_publish_error(connection):
    ch = await connection.channel(publisher_confirms=True, on_return_raises=True)
    with pytest.raises(aiormq.exceptions.PublishError) as info:
        await ch.default_exchange.publish(Message(b"x"), routing_key=unique("nobody"), mandatory=True)
    assert info.value.frame.reply_code == 312
    assert info.value.frame.reply_text == "NO_ROUTE"


async def test_mandatory_unroutable_returned_message(connection):
    ch = await connection.channel(publisher_confirms=True)
    key = unique("nobody")
    result = await ch.default_exchange.publish(Message(b"back", message_id="m-1"), routing_key=key,
                                               mandatory=True)
    assert isinstance(result.delivery, aiormq.spec.Basic.Return)
    assert (result.delivery.reply_code, result.delivery.routing_key, result.body) == (312, key, b"back")
    routable = await ch.declare_queue("", exclusive=True)
    ack = await ch.default_exchange.publish(Message(b"ok"), routing_key=routable.name, mandatory=True)
    assert isinstance(ack, aiormq.spec.Basic.Ack)


async def test_topic_exchange_and_headers_exchange(connection):
    ch = await connection.channel()
    topic = await ch.declare_exchange(unique("t"), ExchangeType.TOPIC, auto_delete=True)
    headers = await ch.declare_exchange(unique("h"), ExchangeType.HEADERS, auto_delete=True)
    tq = await ch.declare_queue("", exclusive=True)
    hq = await ch.declare_queue("", exclusive=True)
    await tq.bind(topic, "a.*.c")
    await hq.bind(headers, arguments={"x-match": "all", "k": "v", "n": 1})
    await topic.publish(Message(b"hit"), routing_key="a.b.c")
    await topic.publish(Message(b"miss"), routing_key="a.b.c.d")
    await headers.publish(Message(b"hit", headers={"k": "v", "n": 1}), routing_key="")
    await headers.publish(Message(b"miss", headers={"k": "v"}), routing_key="")
    assert [m.body for m in await asyncio.wait_for(_collect(tq, 1), TIMEOUT)] == [b"hit"]
    assert [m.body for m in await asyncio.wait_for(_collect(hq, 1), TIMEOUT)] == [b"hit"]
    assert await tq.get(fail=False) is None
    assert await hq.get(fail=False) is None


async def test_exchange_to_exchange_binding(connection):
    ch = await connection.channel()
    src = await ch.declare_exchange(unique("src"), ExchangeType.FANOUT)
    dst = await ch.declare_exchange(unique("dst"), ExchangeType.DIRECT, auto_delete=True)
    q = await ch.declare_queue("", exclusive=True)
    await q.bind(dst, "k")
    await dst.bind(src)
    await src.publish(Message(b"routed"), routing_key="k")
    msg = await q.get(timeout=TIMEOUT)
    assert msg.body == b"routed"
    await msg.ack()
    await dst.unbind(src)
    await src.publish(Message(b"dropped"), routing_key="k")
    assert await q.get(fail=False) is None
    await src.delete()


async def test_prefetch_limits_unacked(connection):
    ch = await connection.channel()
    await ch.set_qos(prefetch_count=2)
    q = await ch.declare_queue("", exclusive=True)
    for i in range(6):
        await ch.default_exchange.publish(Message(str(i).encode()), routing_key=q.name)
    received: list = []

    async def on_message(message) -> None:
        received.append(message)

    await q.consume(on_message)
    await asyncio.sleep(0.3)
    assert len(received) == 2
    await received[0].ack()
    await asyncio.sleep(0.2)
    assert len(received) == 3
    for m in received[1:]:
        await m.ack()
    for _ in range(50):
        if len(received) == 6:
            break
        for m in received:
            if not m.processed:
                await m.ack()
        await asyncio.sleep(0.05)
    assert [m.body for m in received] == [str(i).encode() for i in range(6)]


async def test_nack_requeue_and_reject(connection):
    ch = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    await ch.default_exchange.publish(Message(b"a"), routing_key=q.name)
    await ch.default_exchange.publish(Message(b"b"), routing_key=q.name)
    first = await q.get(timeout=TIMEOUT)
    assert (first.body, first.redelivered) == (b"a", False)
    await first.nack(requeue=True)
    again = await q.get(timeout=TIMEOUT)
    assert (again.body, again.redelivered) == (b"a", True)
    await again.reject(requeue=False)
    second = await q.get(timeout=TIMEOUT)
    assert second.body == b"b"
    await second.ack()
    assert await q.get(fail=False) is None


async def test_get_empty_raises_queue_empty(connection):
    ch = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    with pytest.raises(aio_pika.exceptions.QueueEmpty):
        await q.get(timeout=TIMEOUT)


async def test_transactions(connection):
    ch = await connection.channel(publisher_confirms=False)
    observer = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    tx = ch.transaction()
    await tx.select()
    await ch.default_exchange.publish(Message(b"rollback"), routing_key=q.name)
    await tx.rollback()
    await ch.default_exchange.publish(Message(b"commit"), routing_key=q.name)
    assert (await observer.declare_queue(q.name, passive=True)).declaration_result.message_count == 0
    await tx.commit()
    msg = await observer.get_queue(q.name)
    got = await msg.get(timeout=TIMEOUT, no_ack=True)
    assert got.body == b"commit"
    assert await msg.get(fail=False) is None


async def test_large_message(connection):
    ch = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    body = bytes(range(256)) * 8192  # 2 MiB
    await ch.default_exchange.publish(Message(body), routing_key=q.name)
    msg = await q.get(timeout=TIMEOUT, no_ack=True)
    assert msg.body == body


async def test_header_types_round_trip(connection):
    headers = {
        "str": "välue", "int": 7, "negative": -3, "big": 2**40, "float": 1.25, "true": True,
        "false": False, "decimal": Decimal("1.23"), "none": None,
        "timestamp": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
        "list": [1, "two", [3]], "table": {"nested": {"x": 1}},
    }
    ch = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    for extra in ({}, {"BCC": [unique("nobody")]}):  # BCC makes the broker rewrite the table
        await ch.default_exchange.publish(Message(b"h", headers={**headers, **extra}), routing_key=q.name)
        msg = await q.get(timeout=TIMEOUT, no_ack=True)
        got = dict(msg.headers)
        assert got["timestamp"].timestamp() == headers["timestamp"].timestamp()
        got["timestamp"] = headers["timestamp"]
        assert got == headers


async def test_message_properties_round_trip(connection):
    ch = await connection.channel()
    q = await ch.declare_queue("", exclusive=True)
    sent = Message(b"p", content_type="application/json", content_encoding="utf-8",
                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT, priority=5, correlation_id="cid",
                   reply_to="somewhere", expiration=60, message_id="mid", type="kind", app_id="tests",
                   user_id="guest")
    await ch.default_exchange.publish(sent, routing_key=q.name)
    got = await q.get(timeout=TIMEOUT, no_ack=True)
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "message_id", "type", "app_id", "user_id"):
        assert getattr(got, name) == getattr(sent, name), name
    assert got.expiration == 60


async def test_broker_cancel_when_queue_deleted(connection):
    ch = await connection.channel()
    q = await ch.declare_queue(unique(), auto_delete=False)
    cancelled = asyncio.Event()
    frames = []

    def on_cancel(frame):
        frames.append(frame)
        cancelled.set()

    (await ch.get_underlay_channel()).on_consumer_cancel_callbacks.add(on_cancel)
    async def ignore(message) -> None:
        pass

    tag = await q.consume(ignore)
    other = await connection.channel()
    await other.queue_delete(q.name)
    await asyncio.wait_for(cancelled.wait(), TIMEOUT)
    assert frames[0].consumer_tag == tag
    assert not ch.is_closed


async def test_unacked_requeued_when_channel_closes(connection):
    ch = await connection.channel()
    q = await ch.declare_queue(unique(), auto_delete=False)
    await ch.default_exchange.publish(Message(b"one"), routing_key=q.name)
    msg = await q.get(timeout=TIMEOUT)
    assert not msg.redelivered
    await ch.close()
    ch2 = await connection.channel()
    q2 = await ch2.get_queue(q.name)
    again = await q2.get(timeout=TIMEOUT, no_ack=True)
    assert (again.body, again.redelivered) == (b"one", True)
    await q2.delete()


async def test_heartbeat_keeps_idle_connection(server):
    conn = await aio_pika.connect(server.url + "?heartbeat=1", timeout=TIMEOUT)
    try:
        assert conn.transport.connection.connection_tune.heartbeat == 1
        await asyncio.sleep(3.5)
        assert not conn.is_closed
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        assert q.name.startswith("amq.gen-")
    finally:
        await conn.close()


async def test_direct_reply_to(connection):
    ch = await connection.channel()
    server_ch = await connection.channel()
    request_q = await server_ch.declare_queue("", exclusive=True)

    async def serve(message):
        async with message.process():
            await server_ch.default_exchange.publish(
                Message(message.body[::-1], correlation_id=message.correlation_id),
                routing_key=message.reply_to)

    await request_q.consume(serve)
    reply_q = await ch.declare_queue("amq.rabbitmq.reply-to", passive=True)
    replies: asyncio.Queue = asyncio.Queue()
    await reply_q.consume(replies.put, no_ack=True)
    await ch.default_exchange.publish(
        Message(b"olleh", reply_to="amq.rabbitmq.reply-to", correlation_id="1"), routing_key=request_q.name)
    reply = await asyncio.wait_for(replies.get(), TIMEOUT)
    assert (reply.body, reply.correlation_id) == (b"hello", "1")


async def test_rpc_pattern(connection):
    from aio_pika.patterns import RPC

    ch = await connection.channel()
    rpc = await RPC.create(ch)

    async def multiply(*, x: int, y: int) -> int:
        return x * y

    name = unique("multiply")
    await rpc.register(name, multiply, auto_delete=True)
    assert await asyncio.wait_for(rpc.call(name, kwargs={"x": 6, "y": 7}), TIMEOUT) == 42
    await rpc.close()


# -- errors as aiormq classes -------------------------------------------------------------------


async def test_passive_declare_missing_queue(connection):
    ch = await connection.channel()
    name = unique("missing")
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
        await ch.declare_queue(name, passive=True)
    assert f"no queue '{name}' in vhost '/'" in str(info.value)
    assert ch.is_closed


async def test_inequivalent_declare(connection):
    name = unique()
    ch = await connection.channel()
    await ch.declare_queue(name, durable=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await ch.declare_queue(name, durable=False)
    assert "inequivalent arg 'durable'" in str(info.value)
    ch = await connection.channel()
    await ch.queue_delete(name)


async def test_exclusive_queue_locked(server, connection):
    ch = await connection.channel()
    q = await ch.declare_queue(unique(), exclusive=True)
    other = await aio_pika.connect(server.url, timeout=TIMEOUT)
    try:
        och = await other.channel()
        with pytest.raises(aiormq.exceptions.ChannelLockedResource):
            await och.declare_queue(q.name, exclusive=True)
    finally:
        await other.close()


async def test_internal_exchange_publish_refused(connection):
    ch = await connection.channel(publisher_confirms=False)
    x = await ch.declare_exchange(unique("int"), ExchangeType.FANOUT, internal=True, auto_delete=True)
    # aio-pika refuses this client-side, so publish on the underlying aiormq channel
    await (await ch.get_underlay_channel()).basic_publish(b"no", exchange=x.name, routing_key="")
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await ch.declare_queue("", exclusive=True)


async def test_exclusive_queue_removed_on_close(server):
    conn = await aio_pika.connect(server.url, timeout=TIMEOUT)
    ch = await conn.channel()
    q = await ch.declare_queue(unique(), exclusive=True)
    await conn.close()
    checker = await aio_pika.connect(server.url, timeout=TIMEOUT)
    try:
        cch = await checker.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await cch.declare_queue(q.name, passive=True)
    finally:
        await checker.close()


async def test_robust_connection_basics(server):
    conn = await aio_pika.connect_robust(server.url, timeout=TIMEOUT)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        await ch.default_exchange.publish(Message(b"robust"), routing_key=q.name)
        msg = await q.get(timeout=TIMEOUT, no_ack=True)
        assert msg.body == b"robust"
    finally:
        await conn.close()
