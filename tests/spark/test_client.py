"""The connector's AMQP client against a real hutch process (no Spark): consuming, settling,
publishing with confirms and returns, and the failures it must report instead of hanging."""

from __future__ import annotations

import time

import pytest

from conftest import ServerInfo
from hutch.amqp.spec import BasicProperties
from hutch.spark.client import AmqpClient, ClientClosed
from hutch.spark.options import parse_uri

from .helpers import Broker, Proxy, amqp_uri, unique


def _client(port: int, **query: object) -> AmqpClient:
    return AmqpClient(parse_uri(amqp_uri(port, **query))).connect()


def test_consume_ack_and_requeue(server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    broker.publish(q, 10)
    with _client(server.amqp_port) as c:
        assert c.queue_message_count(q) == 10
        c.consume(q, prefetch=4)
        first = c.take(10, 1.0)
        assert [d.body for d in first] == [f"m{i:07d}".encode() for i in range(4)], "prefetch bounds the buffer"
        c.requeue(first[1].delivery_tag)  # tags 1..2 back to the queue
        c.ack(first[3].delivery_tag)      # tags 3..4 acknowledged
        rest = c.take(8, 0.5, idle=True)
    # requeued messages go back to their original place (the head); prefetch still bounds at 4
    assert [(d.body, d.redelivered) for d in rest] == [
        (b"m0000000", True), (b"m0000001", True), (b"m0000004", False), (b"m0000005", False)]
    # closing returned the 4 unacknowledged deliveries to the queue: 10 - 2 acknowledged
    assert broker.ready(q) == 8


def test_publish_with_confirms_and_returns(server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    with _client(server.amqp_port) as c:
        c.confirm_select()
        frames: list[bytes] = []
        for i in range(100):
            frames.append(c.publish_frame_prefix("", q, True))
            frames.extend(c.content(BasicProperties(message_id=str(i)).encode(), b"x" * 100))
        frames.append(c.publish_frame_prefix("", "no-such-queue", True))
        frames.extend(c.content(BasicProperties().encode(), b"lost"))
        c.send_publishes(frames, 101)
        c.wait_confirms(0, 10)
        nacked, returned = c.publish_outcome()
    assert nacked == 0
    assert [(r.reply_code, r.routing_key) for r in returned] == [(312, "no-such-queue")]
    assert broker.ready(q) == 100


def test_large_bodies_span_frames(server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    body = bytes(range(256)) * 2000  # 512 KB > frame_max
    with _client(server.amqp_port) as c:
        c.confirm_select()
        c.send_publishes([c.publish_frame_prefix("", q, True), *c.content(b"\x00\x00", body)], 1)
        c.wait_confirms(0, 10)
        c.consume(q, 1)
        (d,) = c.take(1, 5.0)
        assert d.body == body


def test_missing_queue_and_bad_login_are_reported(server: ServerInfo) -> None:
    with _client(server.amqp_port) as c, pytest.raises(ClientClosed, match="404 NOT_FOUND") as err:
        c.queue_message_count("no-such-queue-here")
    assert err.value.code == 404
    with pytest.raises(ClientClosed, match="403 ACCESS_REFUSED"):
        AmqpClient(parse_uri(f"amqp://guest:wrong@127.0.0.1:{server.amqp_port}/%2F")).connect()
    with pytest.raises(ClientClosed, match="vhost"):
        AmqpClient(parse_uri(f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/nope")).connect()


def test_connection_refused() -> None:
    proxy = Proxy(1)  # a port nothing listens on behind it: accept, then close
    proxy.cut()
    try:
        with pytest.raises(ClientClosed, match="handshake|cannot connect"):
            AmqpClient(parse_uri(amqp_uri(proxy.port, connection_timeout=2000))).connect()
    finally:
        proxy.close()


def test_a_cut_connection_fails_the_next_call_and_requeues(server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    broker.publish(q, 5)
    proxy = Proxy(server.amqp_port)
    try:
        c = _client(proxy.port)
        c.consume(q, 10)
        assert len(c.take(5, 2.0)) == 5
        proxy.cut()
        with pytest.raises(ClientClosed, match="closed the connection|lost"):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                c.take(1, 0.1)
        with pytest.raises(ClientClosed):
            c.ack(5)
        c.close()
    finally:
        proxy.close()
    # the broker requeues the 5 unacked once it has seen the connection go (the proxy's close reaches it
    # asynchronously: CI once read the queue before that, 0 ready)
    assert wait_ready(broker, q, 5), broker.ready(q)


def test_missed_heartbeats_are_detected(server: ServerInfo) -> None:
    proxy = Proxy(server.amqp_port)
    try:
        c = _client(proxy.port, heartbeat=1)
        assert c.heartbeat_s == 1
        proxy.blackhole()
        start = time.monotonic()
        with pytest.raises(ClientClosed, match="missed heartbeats"):
            while time.monotonic() - start < 10:
                c.take(1, 0.2)
        assert time.monotonic() - start < 5
        c.close()
    finally:
        proxy.close()


def test_is_stream_tells_a_stream_from_a_queue_and_leaves_the_queue_as_it_was(server: ServerInfo,
                                                                              broker: Broker) -> None:
    stream = unique() + "-stream"
    broker.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    with _client(server.amqp_port) as c:
        assert c.is_stream(stream)
    empty = broker.declare()
    with _client(server.amqp_port) as c:
        assert not c.is_stream(empty)
    full = broker.declare()
    broker.publish(full, 2)
    with _client(server.amqp_port) as c:
        assert not c.is_stream(full)
    assert wait_ready(broker, full, 2)
    bodies = [body for _m, _p, body in broker.get_all(full)]
    assert bodies == [b"m0000000", b"m0000001"]  # both back, in order
    broker.ch.queue_delete(stream)


def wait_ready(broker: Broker, queue: str, n: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if broker.ready(queue) == n:
            return True
        time.sleep(0.05)
    return False
