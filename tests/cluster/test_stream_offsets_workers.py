"""A node of 2 worker processes holds a replica of every stream in each worker (docs/scaling.md, "The
stream protocol in every worker"), so its streams are replicated ones: their first message is at offset
0, as on RabbitMQ and on a node of one process (stream_replica.py, "No marker when there is nothing to
commit"). Read with pika (`x-stream-offset`) and with rstream (the chunk's offsets)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from .nodes import Cluster
from .test_stream_cluster import STREAM_CONF, declare, publish, read_first, stream_port


@pytest.fixture
def node_of_workers(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.add(join=False, workers="2", config_text=STREAM_CONF)
    yield c
    c.stop()


async def rstream_offsets(port: int, name: str, count: int) -> list[tuple[int, bytes]]:
    from rstream import AMQPMessage, ConsumerOffsetSpecification, MessageContext, OffsetType, amqp_decoder
    from rstream import Consumer as RConsumer
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg.body if isinstance(msg.body, bytes | bytearray) else b"".join(msg.body))))
        if len(got) >= count:
            done.set()

    async with RConsumer("127.0.0.1", port=port, username="guest", password="guest") as c:
        await c.start()
        await c.subscribe(name, on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 30)
    return got


async def rstream_send(port: int, name: str, bodies: list[bytes]) -> None:
    from rstream import AMQPMessage, Producer
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        for b in bodies:
            await p.send_wait(name, AMQPMessage(body=b))


def test_a_fresh_stream_starts_at_offset_0_on_a_node_of_workers(node_of_workers: Cluster) -> None:
    node = node_of_workers.nodes[0]
    declare(node, "w-events")
    confirmed = publish(node, "w-events", [f"m{i}" for i in range(5)])
    assert len(confirmed) == 5
    assert read_first(node, "w-events", 5) == [(i, f"m{i}") for i in range(5)]
    port = stream_port(node)
    asyncio.run(rstream_send(port, "w-events", [b"r0", b"r1"]))
    got = asyncio.run(rstream_offsets(port, "w-events", 7))
    assert [o for o, _ in got] == list(range(7))
    assert [b for _, b in got[5:]] == [b"r0", b"r1"]
