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
import multiprocessing
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
from stream_rawload import (  # benchmarks/stream_rawload.py: the same /proc reading
    cpu_ticks,
    percentile_ms,
    rss_mib,
)


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5552)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--stream", default=f"stream-rstream-{os.getpid()}")
    p.add_argument("-x", "--publishers", type=int, default=1)
    p.add_argument("-y", "--consumers", type=int, default=1)
    p.add_argument("-s", "--size", type=int, default=16, help="message body bytes")
    p.add_argument("-b", "--batch", type=int, default=100, help="messages per send_batch")
    p.add_argument("-w", "--window", type=int, default=20000, help="unconfirmed messages per publisher")
    p.add_argument("-z", "--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--pid", type=int, help="the broker's pid, for its CPU and RSS")
    args = p.parse_args()

    async def admin(create: bool) -> None:
        async with Producer(args.host, args.port, username=args.user, password=args.password) as producer:
            if create:
                await producer.create_stream(args.stream, exists_ok=True)
            else:
                await producer.delete_stream(args.stream, missing_ok=True)
    asyncio.run(admin(True))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.monotonic() + 1.5
    procs = [ctx.Process(target=publisher, args=(args, i, start_at, out)) for i in range(args.publishers)]
    procs += [ctx.Process(target=consumer, args=(args, i, start_at, out)) for i in range(args.consumers)]
    for proc in procs:
        proc.start()
    load0 = os.getloadavg()[0]
    time.sleep(max(start_at + args.warmup - time.monotonic(), 0))
    cpu0, rss0 = cpu_ticks(args.pid), rss_mib(args.pid)
    time.sleep(args.seconds)
    cpu1, rss1 = cpu_ticks(args.pid), rss_mib(args.pid)
    totals = {"published": 0, "consumed": 0}
    samples: dict[str, list[float]] = {"published": [], "consumed": []}
    for _ in procs:
        kind, _index, count, lat = out.get(timeout=120)
        totals[kind] += count
        samples[kind] += lat
    for proc in procs:
        proc.join(10)
    asyncio.run(admin(False))
    result: dict[str, Any] = {
        "tool": "rstream", "publishers": args.publishers, "consumers": args.consumers, "size": args.size,
        "batch": args.batch, "window": args.window, "seconds": args.seconds,
        "confirmed_per_s": round(totals["published"] / args.seconds),
        "consumed_per_s": round(totals["consumed"] / args.seconds),
        "confirm_ms_p50": percentile_ms(samples["published"], 0.5),
        "confirm_ms_p99": percentile_ms(samples["published"], 0.99),
        "deliver_ms_p50": percentile_ms(samples["consumed"], 0.5),
        "deliver_ms_p99": percentile_ms(samples["consumed"], 0.99),
        "broker_rss_mib": [rss0, rss1], "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    if args.pid is not None and totals["published"]:
        tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
        result["broker_cpu_us_per_msg"] = round((cpu1 - cpu0) * tick_us / totals["published"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
