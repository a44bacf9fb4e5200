"""The channel's publish lane (runtime/session/channel.py `_lane_publish`) as a client sees it: a run of
publishes to a stream through the default exchange, with and without properties the lane does not take,
reads back exactly as published; the lane follows the queue when it is deleted or replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pika
import pytest
from pamqp.commands import Basic

from conftest import ServerInfo

from .helpers import connect, drain, refused, settle, unique

STREAM = {"x-queue-type": "stream"}


def _read_all(conn: Any, queue: str, count: int) -> list[tuple[int, bytes, Any]]:
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    got: list[tuple[int, bytes, Any]] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((p.headers["x-stream-offset"], b, p))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
    drain(conn, got, count, 10.0)
    settle(conn, 0.2)
    ch.close()
    return got


def test_a_run_of_publishes_reads_back_as_published(server: ServerInfo) -> None:
    conn, ch, name = _new_stream(server.amqp_port)
    ch.confirm_delivery()
    # plain ones (the lane), then ones it leaves to the generic path, mixed in the same run
    kinds = [pika.BasicProperties(delivery_mode=2), pika.BasicProperties(delivery_mode=1), pika.BasicProperties(),
             pika.BasicProperties(priority=4, timestamp=1_700_000_000),
             pika.BasicProperties(delivery_mode=2, headers={"x-stream-filter-value": "red", "k": "v"})]
    sent = []
    for i in range(300):
        props = kinds[0] if i % 7 else kinds[(i // 7) % len(kinds)]
        body = b"m%d" % i * (1 + i % 5)
        ch.basic_publish("", name, body, props)
        sent.append((body, props))
    got = _read_all(conn, name, len(sent))
    assert [g[0] for g in got] == list(range(len(sent)))
    for (offset, body, p), (want_body, want) in zip(got, sent, strict=True):
        assert body == want_body, offset
        assert (p.delivery_mode, p.priority, p.timestamp) == (want.delivery_mode, want.priority, want.timestamp)
        headers = dict(p.headers)
        del headers["x-stream-offset"]
        assert headers == (want.headers or {}), offset
    # the filter value of a message among plain ones is the entry's filter value
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=50)
    red: list[bytes] = []
    ch2.basic_consume(name, lambda c, m, p, b: (red.append(b), c.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-offset": "first", "x-stream-filter": "red"})
    want_red = [b for b, p in sent if p.headers]
    drain(conn, red, len(want_red), 10.0)
    assert [b for b in red if b in want_red] == want_red
    ch.queue_delete(name)
    conn.close()


@pytest.mark.asyncio
async def test_runs_of_publishes_with_and_without_confirms(server: ServerInfo) -> None:
    """Publishes sent faster than one per read (aiormq with confirms, all in flight at once; pika without
    confirms) arrive in runs (`lane_run`): each confirmed, stored once, in order."""
    conn = await aiormq.connect(server.url)
    ch = await conn.channel(publisher_confirms=True)
    name = unique("lane")
    await ch.queue_declare(name, durable=True, arguments=STREAM)
    persistent, prioritised = Basic.Properties(delivery_mode=2), Basic.Properties(priority=3)
    confirms = await asyncio.gather(*(ch.basic_publish(b"c%d" % i, routing_key=name,
                                                       properties=prioritised if i == 100 else persistent)
                                      for i in range(600)))  # a fixed-size property list, not plain: in a run too
    assert all(isinstance(c, Basic.Ack) for c in confirms)
    await conn.close()
    sync = connect(server.amqp_port)
    loose = sync.channel()
    for i in range(600):
        loose.basic_publish("", name, b"n%d" % i)
    got = _read_all(sync, name, 1200)
    assert [g[0] for g in got] == list(range(1200))
    assert [g[1] for g in got] == [b"c%d" % i for i in range(600)] + [b"n%d" % i for i in range(600)]
    assert (got[100][2].priority, got[100][2].delivery_mode, got[101][2].delivery_mode) == (3, None, 2)
    assert got[700][2].delivery_mode is None
    sync.channel().queue_delete(name)
    sync.close()


def _new_stream(port: int) -> tuple[Any, Any, str]:
    """(connection, channel, name) of a new stream."""
    conn = connect(port)
    ch = conn.channel()
    name = unique("lane")
    ch.queue_declare(name, durable=True, arguments=STREAM)
    return conn, ch, name


def test_the_lane_follows_the_queue_deleted_or_replaced(server: ServerInfo) -> None:
    conn, ch, name = _new_stream(server.amqp_port)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", name, b"s%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.channel().queue_delete(name)
    # no queue of that name now: a mandatory publish comes back, an ordinary one is dropped but confirmed
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", name, b"gone", pika.BasicProperties(delivery_mode=2), mandatory=True)
    ch.basic_publish("", name, b"dropped", pika.BasicProperties(delivery_mode=2))
    # a classic queue of the same name takes the next publishes
    other = conn.channel()
    other.queue_declare(name, durable=True)
    for i in range(3):
        ch.basic_publish("", name, b"c%d" % i, pika.BasicProperties(delivery_mode=2))
    bodies = []
    for _ in range(3):
        _, _, body = other.basic_get(name, auto_ack=True)
        bodies.append(body)
    assert bodies == [b"c0", b"c1", b"c2"]
    other.queue_delete(name)
    conn.close()


def test_a_message_over_the_size_limit_is_refused_on_the_lane_too(limited_server: ServerInfo) -> None:
    conn, ch, name = _new_stream(limited_server.amqp_port)
    for _ in range(5):  # the lane is open after the first
        ch.basic_publish("", name, b"x" * 1024, pika.BasicProperties(delivery_mode=2))
    with refused(406, "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024"):
        ch.basic_publish("", name, b"x" * 2000, pika.BasicProperties(delivery_mode=2))
        ch.queue_declare("", exclusive=True)
    got = _read_all(conn, name, 5)
    assert [b for _, b, _ in got] == [b"x" * 1024] * 5
    conn.channel().queue_delete(name)
    conn.close()
