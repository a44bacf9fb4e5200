"""pika's asyncio adapter (`AsyncioConnection`, callback style) against hutch: handshake, refusal,
publisher confirms, consume and ack, a broker-side channel error, and close."""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

from .helpers import params, unique

pytestmark = pytest.mark.asyncio

TIMEOUT = 10


async def _open(port: int, **kwargs: Any) -> tuple[AsyncioConnection, asyncio.Future]:
    """Open a connection; returns it and a future resolved with the close reason."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future = loop.create_future()
    closed: asyncio.Future = loop.create_future()

    def on_open_error(_conn, exc):
        if not opened.done():
            opened.set_exception(exc)

    def on_close(_conn, reason):
        if not closed.done():
            closed.set_result(reason)

    conn = AsyncioConnection(params(port, **kwargs), on_open_callback=opened.set_result,
                             on_open_error_callback=on_open_error, on_close_callback=on_close,
                             custom_ioloop=loop)
    await asyncio.wait_for(opened, TIMEOUT)
    return conn, closed


async def _channel(conn: AsyncioConnection) -> Any:
    fut = asyncio.get_running_loop().create_future()
    conn.channel(on_open_callback=fut.set_result)
    return await asyncio.wait_for(fut, TIMEOUT)


async def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a pika channel method whose completion is reported to `callback`."""
    fut = asyncio.get_running_loop().create_future()
    method(*args, callback=lambda frame: fut.done() or fut.set_result(frame), **kwargs)
    return await asyncio.wait_for(fut, TIMEOUT)


async def _close(conn: AsyncioConnection, closed: asyncio.Future) -> Any:
    if conn.is_open:
        conn.close()
    return await asyncio.wait_for(closed, TIMEOUT)


async def test_handshake_and_close(server):
    conn, closed = await _open(server.amqp_port)
    assert conn.server_properties["product"] == "hutch"
    assert conn.server_capabilities["publisher_confirms"] is True
    assert conn.params.frame_max == 131072 and conn.params.channel_max == 2047
    reason = await _close(conn, closed)
    assert isinstance(reason, pika.exceptions.ConnectionClosedByClient)
    assert reason.reply_code == 200


async def test_wrong_password(server):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        await _open(server.amqp_port, password="nope")
    assert "ACCESS_REFUSED - Login was refused" in str(info.value)


async def test_publish_confirm_consume_ack(server):
    conn, closed = await _open(server.amqp_port)
    try:
        ch = await _channel(conn)
        q = (await _call(ch.queue_declare, "", exclusive=True)).method.queue
        acks: list[Any] = []
        all_acked = asyncio.get_running_loop().create_future()

        def on_confirm(frame):
            acks.append(frame.method)
            if frame.method.delivery_tag == 20 and not all_acked.done():
                all_acked.set_result(True)

        ch.confirm_delivery(ack_nack_callback=on_confirm)
        for i in range(20):
            ch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(message_id=str(i)))
        await asyncio.wait_for(all_acked, TIMEOUT)
        assert all(isinstance(a, pika.spec.Basic.Ack) for a in acks)
        tags = [a.delivery_tag for a in acks]
        assert tags == sorted(tags) and tags[-1] == 20

        received: list[tuple[bytes, str]] = []
        got_all = asyncio.get_running_loop().create_future()

        def on_message(channel, method, props, body):
            received.append((body, props.message_id))
            channel.basic_ack(method.delivery_tag)
            if len(received) == 20 and not got_all.done():
                got_all.set_result(True)

        await _call(ch.basic_qos, prefetch_count=5)
        ch.basic_consume(q, on_message)
        await asyncio.wait_for(got_all, TIMEOUT)
        assert received == [(f"m{i}".encode(), str(i)) for i in range(20)]
        ok = await _call(ch.queue_declare, q, passive=True)
        assert (ok.method.message_count, ok.method.consumer_count) == (0, 1)
    finally:
        await _close(conn, closed)


async def test_channel_error_closes_only_the_channel(server):
    conn, closed = await _open(server.amqp_port)
    try:
        ch = await _channel(conn)
        ch_closed = asyncio.get_running_loop().create_future()
        ch.add_on_close_callback(lambda _ch, reason: ch_closed.set_result(reason))
        name = unique("missing")
        ch.queue_declare(name, passive=True)
        reason = await asyncio.wait_for(ch_closed, TIMEOUT)
        assert isinstance(reason, pika.exceptions.ChannelClosedByBroker)
        assert (reason.reply_code, reason.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
        assert conn.is_open
        other = await _channel(conn)
        assert (await _call(other.queue_declare, "", exclusive=True)).method.queue.startswith("amq.gen-")
    finally:
        await _close(conn, closed)


async def test_heartbeat_1_idle(server):
    conn, closed = await _open(server.amqp_port, heartbeat=1)
    try:
        await asyncio.sleep(3)
        assert conn.is_open and not closed.done()
        ch = await _channel(conn)
        assert ch.is_open
    finally:
        await _close(conn, closed)
