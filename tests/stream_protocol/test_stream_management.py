"""Streams in the management API and in Prometheus, against a real node with rstream (stream protocol) and
pika (AMQP 0-9-1) clients: RabbitMQ's rabbitmq_stream_management routes (per vhost, one connection, its
publishers and consumers, closing it with DELETE and who may), hutch's /api/stream/streams, where each
consumer of a stream reads (offset, lag, credits), and the rabbitmq_stream_* and protocol="stream"
metrics (docs/streams.md, docs/metrics.md)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pika
import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, Producer

from mgmt.helpers import Api, unique, wait_for
from mgmt.test_prometheus import fetch, scrape, value

from .conftest import StreamServer

pytestmark = pytest.mark.asyncio
AUTH = {"username": "guest", "password": "guest"}
COUNT = 20
SEGMENTS_SAMPLE = "rabbitmq_stream_segments_total"  # prometheus_client's name for the plain counter's sample


def path_of(name: str) -> str:
    return quote(name, safe="")


async def wait_until(predicate: Any, timeout: float = 15.0) -> bool:
    """Poll `predicate` (an API read) from a thread while the rstream clients keep running on the loop."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: wait_for(predicate, timeout))


def amqp_reader(server: StreamServer, stream: str, prefetch: int) -> tuple[pika.BlockingConnection, list[int]]:
    """A pika consumer of `stream` from its first offset that never acknowledges: it holds `prefetch`."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.info.amqp_port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[int] = []
    ch.basic_consume(stream, lambda _c, _m, p, _b: got.append(p.headers["x-stream-offset"]),
                     arguments={"x-stream-offset": "first"}, consumer_tag="held")
    return conn, got


async def test_stream_connections_publishers_consumers_and_closing(stream_server: StreamServer) -> None:
    api = Api(stream_server.info.mgmt_url)
    stream = unique("mgmt-s")
    closed: list[Any] = []

    async def on_close(info: Any) -> None:
        closed.append(info)

    consumed: list[int] = []

    async def on_message(_msg: AMQPMessage, ctx: MessageContext) -> None:
        consumed.append(ctx.offset)

    async with Producer("127.0.0.1", port=stream_server.port, connection_name="mgmt-producer",
                        on_close_handler=on_close, **AUTH) as producer, \
            Consumer("127.0.0.1", port=stream_server.port, **AUTH) as consumer:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(COUNT):
            await producer.send_wait(stream, AMQPMessage(body=b"m%d" % i), publisher_name="mgmt-ref")
        await consumer.start()
        await consumer.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        amqp, held = amqp_reader(stream_server, stream, prefetch=2)
        try:
            assert await wait_until(lambda: (amqp.process_data_events(0), len(held))[1] == 2 and len(consumed) == COUNT)

            conns = api.ok("/api/stream/connections/%2F")
            [mine] = [c for c in conns if c["client_properties"].get("connection_name") == "mgmt-producer"]
            one = f"/api/stream/connections/%2F/{path_of(mine['name'])}"
            assert api.ok(one)["publishers"] == 1 and api.ok(one)["user"] == "guest"
            [pub] = api.ok(one + "/publishers")
            assert (pub["stream"], pub["reference"], pub["messages_confirmed"]) == (stream, "mgmt-ref", COUNT)
            assert [p["publisher_id"] for p in api.ok(f"/api/stream/publishers/%2F/{stream}")] == [pub["publisher_id"]]
            assert api.get("/api/stream/connections/%2F/nobody").status == 404
            assert api.get("/api/stream/connections/no-such-vhost").status == 404

            def caught_up() -> bool:  # the rstream subscription: read everything, nothing left committed
                subs = [s for s in api.ok("/api/stream/consumers/%2F") if s["stream"] == stream]
                return len(subs) == 1 and subs[0]["offset"] == COUNT and subs[0]["offset_lag"] == 0
            assert await wait_until(caught_up)

            # the AMQP consumer holds 2 unacked of its prefetch of 2: it reads at offset 2, 18 behind, no credit
            q = api.ok(f"/api/queues/%2F/{stream}")
            [held_details] = [c for c in q["consumer_details"] if c["consumer_tag"] == "held"]
            assert (held_details["offset"], held_details["offset_lag"], held_details["credits"]) == (2, COUNT - 2, 0)
            [row] = [s for s in api.ok("/api/stream/streams/%2F") if s["name"] == stream]
            assert (row["stream_publishers"], row["stream_consumers"], row["consumers"]) == (1, 1, 1)
            assert (row["first_offset"], row["last_offset"], row["segments"]) == (0, COUNT - 1, 1)
            assert row["leader"] == row["node"] and row["members"] == [row["node"]]

            # closing: not by another user without the administrator tag; by an administrator
            watcher = unique("watcher")
            assert api.put(f"/api/users/{watcher}", {"password": "pw", "tags": "management"}).status in (201, 204)
            assert api.put(f"/api/permissions/%2F/{watcher}", {"configure": ".*", "write": ".*", "read": ".*"}).status \
                in (201, 204)
            other = api.as_user(watcher, "pw")
            assert other.get(one).status == 401 and other.delete(one).status == 401
            assert all(c["user"] == watcher for c in other.ok("/api/stream/connections"))
            assert api.call("DELETE", one, headers={"X-Reason": "maintenance"}).status == 204
            assert await wait_until(lambda: bool(closed))
            assert api.get(one).status == 404 and api.delete(one).status == 404
            api.delete(f"/api/users/{watcher}")
        finally:
            amqp.close()
            assert api.delete(f"/api/queues/%2F/{stream}").status == 204  # the producer's connection is gone


async def test_stream_metrics(stream_server: StreamServer) -> None:
    info = stream_server.info
    api = Api(info.mgmt_url)
    stream = unique("metric-s")
    before = scrape(info)
    received_before = value(before, "rabbitmq_global_messages_received_total", protocol="stream")
    async with Producer("127.0.0.1", port=stream_server.port, **AUTH) as producer:
        await producer.create_stream(stream, exists_ok=True, arguments={"stream-max-segment-size-bytes": 400})
        for i in range(COUNT):
            await producer.send_wait(stream, AMQPMessage(body=b"%04d" % i + b"x" * 100), publisher_name="metrics")
        amqp, held = amqp_reader(stream_server, stream, prefetch=3)
        try:
            assert await wait_until(lambda: (amqp.process_data_events(0), len(held))[1] == 3)
            segments = api.ok(f"/api/queues/%2F/{stream}")["segments"]
            assert segments > 2
            per_object = scrape(info, per_object=True)
            assert value(per_object, "rabbitmq_stream_segments", SEGMENTS_SAMPLE, vhost="/", queue=stream) == segments
            lag = value(per_object, "rabbitmq_stream_consumer_max_offset_lag", vhost="/", queue=stream)
            assert lag >= COUNT - 3  # the AMQP consumer reads at 3; the log also holds tracking entries
            aggregated = scrape(info)
            assert value(aggregated, "rabbitmq_stream_segments", SEGMENTS_SAMPLE) >= segments
            assert value(aggregated, "rabbitmq_stream_consumer_max_offset_lag") >= lag
            assert value(aggregated, "rabbitmq_global_messages_received_total", protocol="stream") >= \
                received_before + COUNT
            assert value(aggregated, "rabbitmq_global_messages_confirmed_total", protocol="stream") >= COUNT
            assert value(aggregated, "rabbitmq_global_publishers", protocol="stream") >= 1
            assert value(aggregated, "rabbitmq_global_messages_received_total", protocol="amqp091") >= 0
            assert stream.encode() not in fetch(info, "/metrics")[2]  # no stream names unless per object
        finally:
            amqp.close()
        await producer.delete_stream(stream)
