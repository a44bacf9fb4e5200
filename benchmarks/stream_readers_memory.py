"""A large stream read at many offsets over the stream protocol: time to the first message and the broker's RSS (issue 23).

    python benchmarks/stream_readers_memory.py --port PORT --pid BROKER_PID --messages 10000000 --size 100 \\
        --readers 10 [--stream NAME] [--keep]

Steps, against hutch or RabbitMQ (pass its beam.smp pid), one JSON line at the end:
1. fill: create the stream and publish `--messages` messages of `--size` bytes (AMQP 1.0 data sections,
   as benchmarks/stream_rawload.py encodes them: frames of 1,000, 4 connections, 50,000 unconfirmed
   each), confirmed; the fill rate is recorded but is not the point here;
2. attach: one subscriber at `first` (credit 10): milliseconds from the subscribe to its first
   delivery, then it unsubscribes;
3. readers: `--readers` subscribers at offsets 0, N/R, 2N/R, … each read to the end of the stream
   (credit 10, a credit back per chunk), all at once; the broker's RSS (/proc/PID/status VmRSS) is
   sampled every 100 ms from before the fill to the end, so `rss_mib` shows idle → after fill → peak
   while the readers ran;
4. the stream is deleted (unless `--keep`).

Bounded memory means the peak while reading does not grow with the stream: run it with 1,000,000 and
with 10,000,000 messages and compare (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import threading
import time
from typing import Any

from stream_rawload import (  # benchmarks/stream_rawload.py
    open_connection,
    publish_template,
    read_frame,
    rss_mib,
)

from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.wire import OffsetSpec

_ENTRY_ID = struct.Struct(">Q")
FILL_BATCH = 1000
FILL_CONNECTIONS = 4
FILL_WINDOW = 50_000


async def fill(args: argparse.Namespace) -> float:
    """Publish the messages, confirmed; returns the seconds it took."""
    per = -(-args.messages // FILL_CONNECTIONS)

    async def one(index: int) -> None:
        count = min(per, args.messages - index * per)
        if count <= 0:
            return
        reader, writer = await open_connection(args.host, args.port, "guest", "guest")
        writer.write(c.encode(c.DeclarePublisher(1, 1, "", args.stream)))
        await read_frame(reader)
        frame, positions = publish_template(1, FILL_BATCH, args.size)
        sent = confirmed = 0
        done = asyncio.Event()

        async def confirms() -> None:
            nonlocal confirmed
            while confirmed < count:
                cmd = await read_frame(reader)
                if isinstance(cmd, c.PublishConfirm):
                    confirmed += len(cmd.publishing_ids)
            done.set()
        task = asyncio.ensure_future(confirms())
        while sent < count:
            if sent - confirmed >= FILL_WINDOW:
                await asyncio.sleep(0.001)
                continue
            n = min(FILL_BATCH, count - sent)
            if n < FILL_BATCH:
                frame, positions = publish_template(1, n, args.size)
            for pos in positions:
                sent += 1
                _ENTRY_ID.pack_into(frame, pos, sent)
            writer.write(bytes(frame))
            await writer.drain()
        await done.wait()
        task.cancel()
        writer.close()
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(FILL_CONNECTIONS)))
    return time.perf_counter() - started


async def subscriber(args: argparse.Namespace, offset: int, until: int | None) -> tuple[float, int]:
    """Subscribe at `offset` (None: `first`); read until the record at `until - 1` arrived (None: stop
    at the first delivery). Returns (seconds to the first delivery, records read)."""
    reader, writer = await open_connection(args.host, args.port, "guest", "guest")
    spec = OffsetSpec(OffsetType.FIRST) if offset == 0 else OffsetSpec(OffsetType.OFFSET, offset)
    started = time.perf_counter()
    writer.write(c.encode(c.Subscribe(1, 1, args.stream, spec, 10)))
    credit = c.encode(c.Credit(1, 1))
    first_s, records = -1.0, 0
    while True:
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        frame = await reader.readexactly(size)
        key, version = struct.unpack_from(">HH", frame)
        if key != Key.DELIVER:
            continue
        if first_s < 0:
            first_s = time.perf_counter() - started
        header_at = 5 if version == 1 else 13
        count, chunk_id = struct.unpack_from(">I", frame, header_at + 4)[0], struct.unpack_from(">Q", frame, header_at + 24)[0]
        records += count
        if until is None or chunk_id + count >= until:
            break
        writer.write(credit)
    writer.close()
    return first_s, records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5552)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--stream", default=f"stream-readers-{os.getpid()}")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--readers", type=int, default=10)
    p.add_argument("--keep", action="store_true", help="keep the stream (and skip the fill if it exists)")
    args = p.parse_args()
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss = rss_mib(args.pid)
            if rss is not None:
                samples.append((time.perf_counter(), rss))
            stop.wait(0.1)

    async def admin(cmd: Any) -> Any:
        reader, writer = await open_connection(args.host, args.port, "guest", "guest")
        writer.write(c.encode(cmd))
        reply = await read_frame(reader)
        writer.close()
        return reply

    out: dict[str, Any] = {"messages": args.messages, "size": args.size, "readers": args.readers,
                           "loadavg": [round(os.getloadavg()[0], 2)]}
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.3)
    idle = samples[-1][1]
    created = asyncio.run(admin(c.Create(1, args.stream, {})))
    if created.code == Code.OK:
        out["fill_s"] = round(asyncio.run(fill(args)), 1)
    elif created.code != Code.STREAM_ALREADY_EXISTS or not args.keep:
        raise SystemExit(f"cannot create {args.stream}: {created}")
    time.sleep(1.0)
    filled = samples[-1][1]
    first_s, _ = asyncio.run(subscriber(args, 0, None))
    out["first_message_ms"] = round(first_s * 1000, 1)
    read_from = time.perf_counter()

    async def readers() -> list[tuple[float, int]]:
        step = args.messages // args.readers
        return await asyncio.gather(*(subscriber(args, i * step, args.messages) for i in range(args.readers)))
    got = asyncio.run(readers())
    read_s = time.perf_counter() - read_from
    stop.set()
    sampler.join()
    peak = max(rss for at, rss in samples if at >= read_from)
    out.update(read_s=round(read_s, 1), records_read=sum(n for _, n in got),
               reader_first_ms=[round(f * 1000, 1) for f, _ in got],
               rss_mib={"idle": idle, "after_fill": filled, "peak_while_reading": peak},
               loadavg=out["loadavg"] + [round(os.getloadavg()[0], 2)])
    if not args.keep:
        asyncio.run(admin(c.Delete(2, args.stream)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
