"""The steps of the pika / rstream equivalence check (issue 23: "a stream written by one client and read
from `first`, from an offset, from a timestamp and with a filter, by pika and by the stream-protocol
client, gives exactly what RabbitMQ gives for the same steps"), runnable against any broker.

`run_steps` writes one stream with both clients (each message confirmed before the next, so each is
its own chunk on RabbitMQ as on hutch) and reads it back both ways; `EXPECTED` is what RabbitMQ 3.10.8
gave for the same steps, checked by hand with `python tests/stream_protocol/equivalence.py` against it
(the filter reads follow RabbitMQ 4.x's documentation instead: 3.10 has no filtering, see
docs/streams.md, "Client suites"). tests/stream_protocol/test_equivalence.py runs it against hutch.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import sys
import time
from typing import Any

import pika
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

WAIT_S = 30.0
AUTH = {"username": "guest", "password": "guest"}

# (writer, body, filter value) in the order written; a body names its filter value after the dash.
BEFORE = [("pika", b"p0-a", "a"), ("pika", b"p1-b", "b"), ("pika", b"p2-", None),
          ("rstream", b"r0-a", "a"), ("rstream", b"r1-b", "b"), ("rstream", b"r2-", None)]
AFTER = [("pika", b"p3-b", "b"), ("rstream", b"r3-a", "a")]  # written after the timestamp boundary
ALL = [(offset, body) for offset, (_, body, _f) in enumerate(BEFORE + AFTER)]

EXPECTED: dict[str, list[tuple[int, bytes]]] = {
    "first": ALL,
    "offset 4": ALL[4:],
    "timestamp": ALL[len(BEFORE):],
    "interval 1h": ALL,  # pika only: an interval is an AMQP 0-9-1 form of x-stream-offset
    "filter a": [ALL[0], ALL[3], ALL[7]],
    "filter a+unfiltered": [ALL[0], ALL[2], ALL[3], ALL[5], ALL[7]],
    "filter a,b": [ALL[0], ALL[1], ALL[3], ALL[4], ALL[6], ALL[7]],
}
READERS = ("pika", "rstream")


def _filter_of(body: bytes) -> str | None:
    value = body.split(b"-", 1)[1].decode()
    return value or None


def _pika_publish(url: str, stream: str, bodies: list[tuple[bytes, str | None]], declare: bool) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        if declare:
            ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for body, value in bodies:
            headers = {"x-stream-filter-value": value} if value else None
            ch.basic_publish("", stream, body, pika.BasicProperties(headers=headers))
    finally:
        conn.close()


def _pika_read(url: str, stream: str, count: int, arguments: dict[str, Any]) -> list[tuple[int, bytes]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    got: list[tuple[int, bytes]] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)

        def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
            got.append((p.headers["x-stream-offset"], b))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(stream, on_message, arguments=arguments)
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
    finally:
        conn.close()
    return got


def _body(msg: Any) -> bytes:
    return bytes(msg.body if isinstance(msg.body, bytes | bytearray) else b"".join(msg.body))


async def _rstream_publish(host: str, port: int, stream: str, bodies: list[tuple[bytes, str | None]],
                          filters: bool) -> None:
    async def extract(msg: AMQPMessage) -> str:
        return _filter_of(_body(msg)) or ""

    # RabbitMQ before 3.13 closes the connection at the command-version exchange a filtering producer starts with.
    async with Producer(host, port=port, filter_value_extractor=extract if filters else None, **AUTH) as p:
        for body, _value in bodies:
            await p.send_wait(stream, AMQPMessage(body=body))


async def _rstream_read(host: str, port: int, stream: str, count: int, spec: ConsumerOffsetSpecification,
                        filter_input: FilterConfiguration | None = None) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, _body(msg)))
        if len(got) >= count:
            done.set()

    async with Consumer(host, port=port, **AUTH) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=spec,
                          filter_input=filter_input)
        await asyncio.wait_for(done.wait(), WAIT_S)
    return got


def _wants(values: set[str], unfiltered: bool) -> Any:
    """rstream's client-side predicate (the bloom filter is only a first stage, as RabbitMQ documents)."""
    def predicate(msg: AMQPMessage) -> bool:
        value = _filter_of(_body(msg))
        return value in values if value else unfiltered
    return predicate


async def run_steps(amqp_url: str, host: str, stream_port: int, stream: str,
                    filters: bool = True) -> dict[tuple[str, str], list[tuple[int, bytes]]]:
    """Write `stream` with pika and rstream, read it back with both: {(read, reader): [(offset, body)]}."""
    def group(writer: str, part: list[tuple[str, bytes, str | None]]) -> list[tuple[bytes, str | None]]:
        return [(b, f) for w, b, f in part if w == writer]

    await asyncio.to_thread(_pika_publish, amqp_url, stream, group("pika", BEFORE), True)
    await _rstream_publish(host, stream_port, stream, group("rstream", BEFORE), filters)
    # The timestamp boundary: a whole second (x-stream-offset as a timestamp is in seconds) after every
    # chunk so far and before every chunk after.
    boundary_s = math.floor(time.time()) + 1
    await asyncio.sleep(max(0.0, boundary_s - time.time()) + 0.05)
    await asyncio.to_thread(_pika_publish, amqp_url, stream, group("pika", AFTER), False)
    await _rstream_publish(host, stream_port, stream, group("rstream", AFTER), filters)

    reads: dict[str, tuple[dict[str, Any], ConsumerOffsetSpecification | None, FilterConfiguration | None]] = {
        "first": ({"x-stream-offset": "first"}, ConsumerOffsetSpecification(OffsetType.FIRST), None),
        "offset 4": ({"x-stream-offset": 4}, ConsumerOffsetSpecification(OffsetType.OFFSET, 4), None),
        "timestamp": ({"x-stream-offset": datetime.datetime.fromtimestamp(boundary_s, datetime.UTC)},
                      ConsumerOffsetSpecification(OffsetType.TIMESTAMP, boundary_s * 1000), None),
        "interval 1h": ({"x-stream-offset": "1h"}, None, None),
    }
    if filters:
        first = ConsumerOffsetSpecification(OffsetType.FIRST)
        for name, values, unfiltered in (("filter a", ["a"], False), ("filter a+unfiltered", ["a"], True),
                                         ("filter a,b", ["a", "b"], False)):
            args: dict[str, Any] = {"x-stream-offset": "first",
                                    "x-stream-filter": values if len(values) > 1 else values[0]}
            if unfiltered:
                args["x-stream-match-unfiltered"] = True
            reads[name] = (args, first, FilterConfiguration(values, _wants(set(values), unfiltered), unfiltered))
    got: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
    for name, (arguments, spec, filter_input) in reads.items():
        count = len(EXPECTED[name])
        got[(name, "pika")] = await asyncio.to_thread(_pika_read, amqp_url, stream, count, arguments)
        if spec is not None:
            got[(name, "rstream")] = await _rstream_read(host, stream_port, stream, count, spec, filter_input)
    return got


def main() -> None:
    """By hand: `python tests/stream_protocol/equivalence.py AMQP_URL HOST STREAM_PORT STREAM [nofilter]`."""
    url, host, port, stream = sys.argv[1:5]
    got = asyncio.run(run_steps(url, host, int(port), stream, filters="nofilter" not in sys.argv[5:]))
    for (name, reader), rows in got.items():
        same = "same" if rows == EXPECTED[name] else "DIFFERS"
        print(f"{name:22} {reader:8} {same:8} {[(o, b.decode()) for o, b in rows]}")


if __name__ == "__main__":
    main()
