"""stream_rstream: the second stream-protocol load generator (issue 23), built on rstream, not on hutch's code.

`benchmarks/stream_rawload.py` encodes its frames with hutch's own stream-protocol records; this one
drives the broker through rstream (the published Python client), so a ratio both generators agree on is
not an artefact of one client. Each publisher (its own OS process) sends batches of `-b` messages of `-s`
bytes with `Producer.send_batch` and keeps at most `-w` messages unconfirmed; each consumer (its own
process) subscribes at `first` with rstream's `Consumer` (credit 10, rstream's default). The parent
creates and deletes the stream and prints one JSON object: confirmed msg/s, consumed msg/s, confirm
latency p50/p99 (a batch's `send_batch` to the confirm of its last message), delivery latency p50/p99
(the chunk's broker timestamp to the callback, ms wall clock), the broker's CPU µs per confirmed message
and RSS (with `--pid`) and the load average (1 min) before and after.

    python benchmarks/stream_rstream.py --port 5552 -x 1 -y 1 -s 16 -b 100 -w 20000 -z 10 --pid 1234

rstream's Python costs more per message than either broker, so a broker that is faster than this
generator shows as equal: read its figures beside stream_rawload's (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
)

# benchmarks/stream_rawload.py: the same command line, processes, window and /proc reading
from stream_rawload import measure, parse_options


def publisher(args: argparse.Namespace, index: int, start_at: float, out: Any) -> None:
    async def run() -> None:
        window_start, window_end = start_at + args.warmup, start_at + args.warmup + args.seconds
        body = b"x" * args.size
        sent_at: dict[int, float] = {}
        latencies: list[float] = []
        counts = {"sent": 0, "confirmed": 0, "in_window": 0}

        def confirmed(status: ConfirmationStatus) -> None:
            now = time.monotonic()
            counts["confirmed"] += 1
            inside = window_start <= now < window_end
            if inside:
                counts["in_window"] += 1
            at = sent_at.pop(status.message_id, None)
            if at is not None and inside:
                latencies.append(now - at)

        async with Producer(args.host, args.port, username=args.user, password=args.password) as producer:
            while time.monotonic() < window_end:
                if counts["sent"] - counts["confirmed"] >= args.window:
                    await asyncio.sleep(0.001)
                    continue
                ids = await producer.send_batch(args.stream, [body] * args.batch, on_publish_confirm=confirmed)
                sent_at[max(ids)] = time.monotonic()
                counts["sent"] += len(ids)
        out.put(("published", index, counts["in_window"], latencies))
    asyncio.run(run())


def consumer(args: argparse.Namespace, index: int, start_at: float, out: Any) -> None:
    async def run() -> None:
        window_start, window_end = start_at + args.warmup, start_at + args.warmup + args.seconds
        latencies: list[float] = []
        counts = {"in_window": 0}

        async def on_message(message: AMQPMessage, ctx: MessageContext) -> None:
            if window_start <= time.monotonic() < window_end:
                counts["in_window"] += 1
                if counts["in_window"] % 64 == 0:  # one sample in 64: the clock read is not free
                    latencies.append(max(time.time() - ctx.timestamp / 1000, 0.0))

        consumer = Consumer(args.host, args.port, username=args.user, password=args.password)
        await consumer.start()
        await consumer.subscribe(args.stream, on_message, decoder=lambda raw: raw,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        runner = asyncio.ensure_future(consumer.run())
        await asyncio.sleep(max(window_end - time.monotonic(), 0))
        runner.cancel()
        await consumer.close()
        out.put(("consumed", index, counts["in_window"], latencies))
    asyncio.run(run())


async def admin(args: argparse.Namespace, create: bool) -> None:
    """Create (or delete) the stream the run uses."""
    async with Producer(args.host, args.port, username=args.user, password=args.password) as producer:
        if create:
            await producer.create_stream(args.stream, exists_ok=True)
        else:
            await producer.delete_stream(args.stream, missing_ok=True)


def main() -> None:
    args = parse_options(__doc__.splitlines()[0], f"stream-rstream-{os.getpid()}", "message body bytes",
                         "messages per send_batch")
    asyncio.run(admin(args, True))
    result = {"tool": "rstream", **measure(args, publisher, consumer, start_delay_s=1.5,
                                             finish=lambda: asyncio.run(admin(args, False)))}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
