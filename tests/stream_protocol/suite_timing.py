"""Where the time goes in the shape of rstream's super stream tests (issue 23; docs/streams.md, "Client
suites"), runnable by hand against any broker: `python tests/stream_protocol/suite_timing.py PORT`.

One Python process, as in rstream's `test_consume_superstream_with_sac_*`: a Producer sends 10,000
messages over three plain streams with rstream's own hash routing (murmur3, seed 104729, as its
SuperStreamProducer does; plain streams so that RabbitMQ 3.10.8, which has no super streams, runs it
too), one Consumer reads each stream. Prints, in seconds after the send loop, when each publish frame
was written and each Deliver frame read, and when each stream's last message was decoded: the gap from
a frame written to its Deliver read is the broker's, the gaps between frames are the client's.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from typing import Any

import rstream.client
import rstream.connection
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    Properties,
    amqp_decoder,
    schema,
)
from rstream.superstream import HashRoutingMurmurStrategy

COUNT = 10_000
STREAMS = [f"suite-timing-{i}" for i in range(3)]


class Partitions:
    """rstream's super stream metadata, for its own hash strategy: the partitions in binding order."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    async def partitions(self) -> list[str]:
        return self.names

    async def routes(self, routing_key: str) -> list[str]:
        return []


def instrument(events: list[tuple[float, str]]) -> None:
    """Note each publish frame written and each Deliver frame read (rstream's own methods, wrapped)."""
    send, read = rstream.client.Client.send_publish_frame, rstream.connection.Connection.read_frame

    async def send_publish_frame(self: Any, frame: Any, version: int = 1) -> None:
        await send(self, frame, version)
        events.append((time.time(), f"publish frame written: publisher {frame.publisher_id}, "
                                    f"{len(frame.messages)} messages"))

    async def read_frame(self: Any) -> Any:
        frame = await read(self)
        if isinstance(frame, schema.Deliver):
            events.append((time.time(), f"deliver read: connection {id(self) % 1000}"))
        return frame

    rstream.client.Client.send_publish_frame = send_publish_frame  # type: ignore[method-assign]
    rstream.connection.Connection.read_frame = read_frame  # type: ignore[method-assign]


async def message_id(msg: AMQPMessage) -> str:
    return str(msg.properties.message_id)


async def run(port: int) -> None:
    events: list[tuple[float, str]] = []
    instrument(events)
    auth: dict[str, Any] = {"host": "127.0.0.1", "port": port, "username": "guest", "password": "guest"}
    counts: collections.Counter[str] = collections.Counter()
    last: dict[str, float] = {}

    def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        counts[ctx.stream] += 1
        last[ctx.stream] = time.time()

    producer = Producer(**auth)
    await producer.start()
    for name in STREAMS:
        await producer.create_stream(name, exists_ok=True)
    consumers = [Consumer(**auth) for _ in STREAMS]
    try:
        for name, consumer in zip(STREAMS, consumers, strict=True):
            await consumer.start()
            await consumer.subscribe(name, on_message, decoder=amqp_decoder,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None))
        strategy, meta = HashRoutingMurmurStrategy(message_id), Partitions(STREAMS)
        for i in range(COUNT):
            msg = AMQPMessage(body=b"a:%d" % i, properties=Properties(message_id=str(i)))
            (stream,) = await strategy.route(msg, meta)
            await producer.send(stream, msg)
        sent = time.time()
        while sum(counts.values()) < COUNT and time.time() - sent < 30:
            await asyncio.sleep(0.01)
        for at, what in events:
            print(f"{at - sent:6.3f} {what}")
        for name in STREAMS:
            print(f"{name}: {counts[name]} messages, last decoded at {last.get(name, sent) - sent:.3f}")
    finally:
        for consumer in consumers:
            await consumer.close()
        for name in STREAMS:
            await producer.delete_stream(name)
        await producer.close()


if __name__ == "__main__":
    asyncio.run(run(int(sys.argv[1])))
