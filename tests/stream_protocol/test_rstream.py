"""rstream (PyPI), an unchanged RabbitMQ stream client, against a real hutch node's stream listener:
publish with confirms, consume from first / an offset / a timestamp / next, server-side offset tracking,
deduplication across a `kill -9` (a publisher resends its last 1,000 messages: each is in the stream
once), filtering, super streams routed by hash and by key, and single active consumer per partition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetNotFound,
    OffsetSpecification,
    OffsetType,
    Producer,
    RouteType,
    SuperStreamConsumer,
    SuperStreamProducer,
    amqp_decoder,
)

from .conftest import StreamServer
from .suite_timing import Partitions

pytestmark = pytest.mark.asyncio
AUTH = {"username": "guest", "password": "guest"}
WAIT_S = 30.0


def producer(server: StreamServer, **kw: Any) -> Producer:
    return Producer("127.0.0.1", port=server.port, **AUTH, **kw)


def consumer(server: StreamServer) -> Consumer:
    return Consumer("127.0.0.1", port=server.port, **AUTH)


def body(msg: Any) -> bytes:
    return bytes(msg.body if isinstance(msg.body, bytes | bytearray) else b"".join(msg.body))


async def read(server: StreamServer, stream: str, spec: ConsumerOffsetSpecification, count: int,
               **subscribe: Any) -> list[tuple[int, bytes]]:
    """The first `count` (offset, body) a fresh consumer gets from `stream` at `spec`."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, body(msg)))
        if len(got) >= count:
            done.set()

    async with consumer(server) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=spec, **subscribe)
        await asyncio.wait_for(done.wait(), WAIT_S)
    return got


async def publish(server: StreamServer, stream: str, bodies: list[bytes], **send: Any) -> None:
    async with producer(server) as p:
        await p.create_stream(stream, exists_ok=True)
        for b in bodies:
            await p.send_wait(stream, AMQPMessage(body=b), **send)


async def test_publish_with_confirms_and_consume_from_first(stream_server: StreamServer) -> None:
    confirmed: list[int] = []
    async with producer(stream_server) as p:
        await p.create_stream("rs-basic")
        for i in range(100):
            await p.send("rs-basic", AMQPMessage(body=b"m%d" % i),
                         on_publish_confirm=lambda status: confirmed.extend(
                             [status.message_id] if status.is_confirmed else []))
        deadline = time.monotonic() + WAIT_S
        while len(confirmed) < 100 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(confirmed) == 100
        await p.send_wait("rs-basic", AMQPMessage(body=b"last"))  # sent at once (send() batches)
    got = await read(stream_server, "rs-basic", ConsumerOffsetSpecification(OffsetType.FIRST, None), 101)
    assert got == [(i, b"m%d" % i) for i in range(100)] + [(100, b"last")]


async def test_consume_from_an_offset_a_timestamp_and_next(stream_server: StreamServer) -> None:
    await publish(stream_server, "rs-specs", [b"a%d" % i for i in range(10)])
    await asyncio.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await publish(stream_server, "rs-specs", [b"b%d" % i for i in range(10)])
    got = await read(stream_server, "rs-specs", ConsumerOffsetSpecification(OffsetType.OFFSET, 15), 5)
    assert got == [(15 + i, b"b%d" % (5 + i)) for i in range(5)]
    got = await read(stream_server, "rs-specs", ConsumerOffsetSpecification(OffsetType.TIMESTAMP, middle_ms), 10)
    assert got == [(10 + i, b"b%d" % i) for i in range(10)]

    got_next: list[bytes] = []
    arrived = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got_next.append(body(msg))
        arrived.set()

    async with consumer(stream_server) as c:
        await c.start()
        await c.subscribe("rs-specs", on_message, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None))
        await publish(stream_server, "rs-specs", [b"new"])
        await asyncio.wait_for(arrived.wait(), WAIT_S)
    assert got_next == [b"new"]


async def test_server_side_offset_tracking(stream_server: StreamServer) -> None:
    await publish(stream_server, "rs-track", [b"x%d" % i for i in range(5)])
    async with consumer(stream_server) as c:
        await c.start()
        with pytest.raises(OffsetNotFound):  # response code NO_OFFSET (0x13)
            await c.query_offset("rs-track", "reader-1")
        await c.store_offset("rs-track", "reader-1", 3)
        deadline = time.monotonic() + WAIT_S
        while True:  # store_offset has no response: poll until the tracking chunk is committed
            try:
                if await c.query_offset("rs-track", "reader-1") == 3:
                    break
            except OffsetNotFound:
                pass
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)


async def test_filtering_skips_chunks_without_the_wanted_value(stream_server: StreamServer) -> None:
    async with producer(stream_server, filter_value_extractor=region) as p:
        await p.create_stream("rs-filter")
        for where in ("eu", "us", "eu", "us"):
            await p.send_wait("rs-filter", AMQPMessage(body=where.encode(), application_properties={"region": where}))
    got = await read(stream_server, "rs-filter", ConsumerOffsetSpecification(OffsetType.FIRST, None), 2,
                     filter_input=FilterConfiguration(["eu"], lambda m: m.application_properties[b"region"] == b"eu"))
    assert [b for _, b in got] == [b"eu", b"eu"]


def numbered(i: int) -> AMQPMessage:
    msg = AMQPMessage(body=b"%d" % i)
    msg.publishing_id = i  # rstream's AMQPMessage(publishing_id=...) fails in its namedtuple __new__
    return msg


async def test_deduplication_across_a_kill_9(fresh_stream_server: StreamServer) -> None:
    server = fresh_stream_server
    async with producer(server) as p:
        await p.create_stream("rs-dedup")
        for start in range(1, 3001, 500):
            await p.send_batch("rs-dedup", [numbered(i)
                                            for i in range(start, start + 500)], publisher_name="app")
        await p.send_wait("rs-dedup", numbered(3000), publisher_name="app")
    server.kill()
    server.restart()
    async with producer(server) as p:
        client = await p.default_client
        assert await client.query_publisher_sequence("rs-dedup", "app") == 3000
        # the publisher does not know what survived: it resends its last 1,000, then goes on
        resent = [numbered(i) for i in range(2001, 4001)]
        for start in range(0, len(resent), 500):
            await p.send_batch("rs-dedup", resent[start:start + 500], publisher_name="app")
        await p.send_wait("rs-dedup", numbered(4000), publisher_name="app")
    got = await read(server, "rs-dedup", ConsumerOffsetSpecification(OffsetType.FIRST, None), 4000)
    assert [b for _, b in got] == [b"%d" % i for i in range(1, 4001)]
    assert [o for o, _ in got] == list(range(4000))


async def create_super_stream(server: StreamServer, name: str, **how: Any) -> None:
    """With a producer of its own: rstream closes the connection its create_super_stream used."""
    async with SuperStreamProducer("127.0.0.1", port=server.port, **AUTH, super_stream=name,
                                   routing_extractor=message_id) as admin:
        await admin.create_super_stream(name, **how)


async def message_id(msg: AMQPMessage) -> str:
    return str(msg.properties.message_id)


async def region(msg: AMQPMessage) -> str:
    return str(msg.application_properties["region"])


async def test_super_stream_hash_routing_and_single_active_consumer(stream_server: StreamServer) -> None:
    ss = "rs-invoices"
    await create_super_stream(stream_server, ss, n_partitions=3)
    async with SuperStreamProducer("127.0.0.1", port=stream_server.port, **AUTH, super_stream=ss,
                                   routing=RouteType.Hash, routing_extractor=message_id) as p:
        for i in range(60):
            await p.send(AMQPMessage(body=b"%d" % i, properties=_props(f"id-{i}")))
        await asyncio.sleep(0.5)  # rstream's batching delay: its send() returns before the frame leaves
    seen: dict[str, set[bytes]] = {}
    updates: list[tuple[int, str, bool]] = []
    changed = asyncio.Event()

    def listener(n: int) -> Callable[[bool, Any], Awaitable[Any]]:
        async def on_update(is_active: bool, ctx: Any) -> Any:
            updates.append((n, ctx.stream, is_active))
            changed.set()
            return OffsetSpecification(OffsetType.FIRST, 0)
        return on_update

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        seen.setdefault(ctx.stream, set()).add(body(msg))
        changed.set()

    def done() -> bool:
        return sum(len(v) for v in seen.values()) == 60 and (1, f"{ss}-1", True) in updates

    consumers = [SuperStreamConsumer("127.0.0.1", port=stream_server.port, **AUTH, super_stream=ss) for _ in range(2)]
    try:
        for n, ssc in enumerate(consumers):
            await ssc.start()
            await ssc.subscribe(on_message, decoder=amqp_decoder, consumer_update_listener=listener(n),
                                properties={"single-active-consumer": "true", "name": "billing", "super-stream": ss})
        deadline = time.monotonic() + WAIT_S
        while not done():
            changed.clear()
            await asyncio.wait_for(changed.wait(), max(deadline - time.monotonic(), 0.01))
        before_close = list(updates)  # the closes below hand partitions 0 and 2 to consumer 1
    finally:
        for ssc in consumers:
            await ssc.close()
    assert sorted(b for v in seen.values() for b in v) == sorted(b"%d" % i for i in range(60))
    assert len(seen) == 3  # hashed over all three partitions
    # consumer 0 was active on every partition; when consumer 1 joined, partition 1 (1 % 2 members)
    # moved to it: consumer 0 stepped down first, then consumer 1 was activated; 0 and 2 stayed
    assert sorted(u for u in before_close if u[0] == 0 and u[2]) == [(0, f"{ss}-{i}", True) for i in range(3)]
    assert before_close.index((0, f"{ss}-1", False)) < before_close.index((1, f"{ss}-1", True))
    assert [u for u in before_close if u[0] == 1] == [(1, f"{ss}-1", True)]


def _props(message_id: str) -> Any:
    from rstream import Properties
    return Properties(message_id=message_id)


async def test_super_stream_route_by_key(stream_server: StreamServer) -> None:
    # rstream 1.1.1's SuperStreamProducer(routing=RouteType.Key) caches the first key's route for every
    # key (DefaultSuperstreamMetadata.routes), against RabbitMQ too; so the route and partitions queries
    # are asked through its client, and each message is published to the partition the node names
    ss = "rs-regions"
    await create_super_stream(stream_server, ss, binding_keys=["eu", "us"])
    async with producer(stream_server) as p:
        client = await p.default_client
        assert await client.partitions(ss) == [f"{ss}-eu", f"{ss}-us"]
        assert await client.route("eu", ss) == [f"{ss}-eu"]
        assert await client.route("nowhere", ss) == []
        for where in ("eu", "us", "eu"):
            (stream,) = await client.route(where, ss)
            await p.send_wait(stream, AMQPMessage(body=where.encode()))
    eu = await read(stream_server, f"{ss}-eu", ConsumerOffsetSpecification(OffsetType.FIRST, None), 2)
    us = await read(stream_server, f"{ss}-us", ConsumerOffsetSpecification(OffsetType.FIRST, None), 1)
    assert [b for _, b in eu] == [b"eu", b"eu"] and [b for _, b in us] == [b"us"]


async def test_pika_and_rstream_read_each_others_messages(stream_server: StreamServer) -> None:
    import pika
    await publish(stream_server, "rs-mixed", [b"from-rstream"])
    conn = pika.BlockingConnection(pika.URLParameters(stream_server.info.url))
    try:
        ch = conn.channel()
        ch.queue_declare("rs-mixed", passive=True)  # a stream created over the stream protocol is a queue
        ch.basic_publish("", "rs-mixed", b"from-pika", pika.BasicProperties(content_type="text/plain"))
        ch.basic_qos(prefetch_count=10)
        got: list[bytes] = []
        tag = ch.basic_consume("rs-mixed", lambda c, m, p, b: got.append(b), arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + WAIT_S
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        ch.basic_cancel(tag)
    finally:
        conn.close()
    assert got == [b"from-rstream", b"from-pika"]
    read_back = await read(stream_server, "rs-mixed", ConsumerOffsetSpecification(OffsetType.FIRST, None), 2)
    assert [b for _, b in read_back] == [b"from-rstream", b"from-pika"]


async def test_super_stream_three_active_consumers_each_read_one_partition(stream_server: StreamServer) -> None:
    """The shape of rstream's own suite's test_consume_superstream_with_sac_all_active (issue 23): three
    consumers of one group subscribe to a three-partition super stream, then hash-routed messages are sent:
    each consumer reads one partition, a different one each, and every message arrives, in the partition
    rstream's murmur3 hash names (so hutch's `partitions` answer is in binding order)."""
    from rstream.superstream import HashRoutingMurmurStrategy
    ss, count = "rs-sac3", 1500
    partitions = [f"{ss}-{i}" for i in range(3)]
    await create_super_stream(stream_server, ss, n_partitions=3)
    got: list[list[tuple[str, bytes]]] = [[], [], []]
    active: set[tuple[int, str]] = set()
    changed = asyncio.Event()
    after = [OffsetType.FIRST]  # where an activated consumer starts: NEXT once the messages are read

    def on_message(k: int) -> Callable[[AMQPMessage, MessageContext], Awaitable[None]]:
        async def deliver(msg: AMQPMessage, ctx: MessageContext) -> None:
            got[k].append((ctx.stream, body(msg)))
            changed.set()
        return deliver

    def on_update(k: int) -> Callable[[bool, Any], Awaitable[Any]]:
        async def update(is_active: bool, ctx: Any) -> Any:
            (active.add if is_active else active.discard)((k, ctx.stream))
            changed.set()
            return OffsetSpecification(after[0], 0)
        return update

    async def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            changed.clear()
            await asyncio.wait_for(changed.wait(), max(deadline - time.monotonic(), 0.01))

    consumers = [SuperStreamConsumer("127.0.0.1", port=stream_server.port, **AUTH, super_stream=ss) for _ in range(3)]
    try:
        for k, ssc in enumerate(consumers):
            await ssc.start()
            await ssc.subscribe(on_message(k), decoder=amqp_decoder, consumer_update_listener=on_update(k),
                                properties={"single-active-consumer": "true", "name": "g", "super-stream": ss})
        # partition i's active consumer is member i % 3: consumer 0 hands partitions 1 and 2 over
        await until(lambda: active == {(0, partitions[0]), (1, partitions[1]), (2, partitions[2])})
        async with SuperStreamProducer("127.0.0.1", port=stream_server.port, **AUTH, super_stream=ss,
                                       routing=RouteType.Hash, routing_extractor=message_id) as p:
            for i in range(count):
                await p.send(AMQPMessage(body=b"%d" % i, properties=_props(str(i))))
            await until(lambda: sum(map(len, got)) >= count)
        seen = [list(g) for g in got]
        after[0] = OffsetType.NEXT  # the closes below hand partitions over again: nothing to re-read
    finally:
        for ssc in consumers:
            await ssc.close()
    assert [{stream for stream, _ in g} for g in seen] == [{p} for p in partitions]
    strategy = HashRoutingMurmurStrategy(message_id)
    meta = Partitions(partitions)
    expected: list[list[bytes]] = [[] for _ in range(3)]
    for i in range(count):
        (stream,) = await strategy.route(AMQPMessage(body=b"", properties=_props(str(i))), meta)
        expected[partitions.index(stream)].append(b"%d" % i)
    assert [[b for _, b in g] for g in seen] == expected
    assert all(expected)  # the hash spread the messages over all three partitions


async def test_a_filter_of_thousands_of_values_is_taken_as_rabbitmq_takes_it(stream_server: StreamServer) -> None:
    """rstream sends each filter value as a property `filter.N`: 3,000 values make a subscribe of 3,002
    properties (~60 KB), which RabbitMQ accepts (session 16's hutch refused past 1,024 entries)."""
    async with producer(stream_server, filter_value_extractor=region) as p:
        await p.create_stream("rs-many-filters")
        for where in ("eu", "us", "v2999"):
            await p.send_wait("rs-many-filters", AMQPMessage(body=where.encode(), application_properties={"region": where}))
    wanted = ["eu"] + [f"v{i}" for i in range(1, 3000)]
    got = await read(stream_server, "rs-many-filters", ConsumerOffsetSpecification(OffsetType.FIRST, None), 2,
                     filter_input=FilterConfiguration(wanted, lambda m: m.application_properties[b"region"] != b"us"))
    assert [b for _, b in got] == [b"eu", b"v2999"]
