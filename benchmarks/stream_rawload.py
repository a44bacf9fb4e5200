"""stream_rawload: a raw load generator for RabbitMQ's stream protocol (issue 23), for hutch and RabbitMQ.

Publishers and consumers run in separate OS processes (multiprocessing 'spawn'). The handshake and the
few requests go through hutch.streamproto's records; the hot frames do not: a publish frame of `-b`
messages of `-s` bytes is encoded once, before the run, and only its publishing ids are patched in place
(`struct.pack_into`) before each write; a delivery is counted from its chunk header (the record count at
a fixed position) without decoding a message. Each publisher keeps at most `-w` messages unconfirmed.
The parent creates the stream, starts the workers, reads the broker's CPU from /proc (with `--pid`),
deletes the stream and prints one JSON object: confirmed msg/s, consumed msg/s, broker CPU µs per
published message, confirm latency (a publish frame's write to the confirm of its last id, p50/p99 over
every frame confirmed in the window), delivery latency (the broker's chunk timestamp to the delivery's
read, wall clock in ms: both ends are on this machine), the broker's RSS at the window's edges and the
machine's load average (1 min) before and after.

    python benchmarks/stream_rawload.py --port 5552 -x 2 -y 1 -s 16 -b 100 -w 20000 -z 10 --pid 1234

Counting: only confirms and deliveries read inside [start + warmup, start + warmup + z) count; rates are
counts / z. Consumers read from `first`, so they may also read what was published before the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import struct
import time
from collections.abc import Callable
from typing import Any

from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.wire import OffsetSpec

_HEAD = struct.Struct(">IHH")
_ENTRY_ID = struct.Struct(">Q")
_TIMESTAMP = struct.Struct(">q")


def percentile_ms(samples: list[float], p: float) -> float | None:
    """The `p` quantile (nearest rank) of `samples` (seconds), in ms."""
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


async def open_connection(host: str, port: int, user: str, password: str) -> tuple[Any, Any]:
    reader, writer = await asyncio.open_connection(host, port)
    corr = iter(range(1, 1 << 30))

    async def request(cmd: Any) -> Any:
        writer.write(c.encode(cmd))
        while True:
            reply = await read_frame(reader)
            if getattr(reply, "correlation_id", None) == cmd.correlation_id:
                return reply
    await request(c.PeerProperties(next(corr), {"product": "stream_rawload"}))
    await request(c.SaslHandshake(next(corr)))
    auth = await request(c.SaslAuthenticate(next(corr), "PLAIN", f"\0{user}\0{password}".encode()))
    assert auth.code == Code.OK, auth
    tune = await read_frame(reader)
    writer.write(c.encode(c.TuneResponse(tune.frame_max, 0)))
    opened = await request(c.Open(next(corr), "/"))
    assert opened.code == Code.OK, opened
    return reader, writer


async def read_frame(reader: Any) -> Any:
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    return c.decode(await reader.readexactly(size))


def amqp10_data(size: int) -> bytes:
    """An AMQP 1.0 message of `size` bytes: one data section (vbin8 or vbin32)."""
    if size < 8 + 256:
        n = max(size - 5, 0)
        return b"\x00Su\xa0" + bytes([n]) + b"x" * n
    n = size - 8
    return b"\x00Su\xb0" + struct.pack(">I", n) + b"x" * n


def publish_template(publisher_id: int, batch: int, size: int) -> tuple[bytearray, list[int]]:
    """One publish frame of `batch` messages of `size` bytes, and where each publishing id sits in it."""
    body = amqp10_data(size)
    frame = bytearray(c.encode(c.Publish(publisher_id, [c.PublishedEntry(i, body) for i in range(batch)])))
    first = 4 + 4 + 1 + 4  # size, key+version, publisher id, count
    return frame, [first + i * (8 + 4 + len(body)) for i in range(batch)]


def publisher(args: argparse.Namespace, index: int, start_at: float, out: Any) -> None:
    async def run() -> None:
        reader, writer = await open_connection(args.host, args.port, args.user, args.password)
        writer.write(c.encode(c.DeclarePublisher(1, 1, "", args.stream)))
        await read_frame(reader)
        frame, positions = publish_template(1, args.batch, args.size)
        next_id, confirmed, in_window = 1, 0, 0
        window_start, window_end = start_at + args.warmup, start_at + args.warmup + args.seconds
        sent_at: dict[int, float] = {}  # a frame's last publishing id -> when it was written
        latencies: list[float] = []

        async def confirms() -> None:
            nonlocal confirmed, in_window
            while True:
                cmd = await read_frame(reader)
                if isinstance(cmd, c.PublishConfirm):
                    now = time.monotonic()
                    confirmed += len(cmd.publishing_ids)
                    inside = window_start <= now < window_end
                    if inside:
                        in_window += len(cmd.publishing_ids)
                    for pid in cmd.publishing_ids:
                        if pid % args.batch == 0:
                            at = sent_at.pop(pid, None)
                            if at is not None and inside:
                                latencies.append(now - at)
        task = asyncio.ensure_future(confirms())
        while time.monotonic() < window_end:
            if next_id - 1 - confirmed >= args.window:
                await asyncio.sleep(0.001)
                continue
            for pos in positions:
                _ENTRY_ID.pack_into(frame, pos, next_id)
                next_id += 1
            sent_at[next_id - 1] = time.monotonic()
            writer.write(bytes(frame))
            await writer.drain()
        task.cancel()
        writer.close()
        out.put(("published", index, in_window, latencies))
    asyncio.run(run())


def consumer(args: argparse.Namespace, index: int, start_at: float, out: Any) -> None:
    async def run() -> None:
        reader, writer = await open_connection(args.host, args.port, args.user, args.password)
        writer.write(c.encode(c.Subscribe(1, 1, args.stream, OffsetSpec(OffsetType.FIRST), 100)))
        credit = c.encode(c.Credit(1, 1))
        window_start, window_end = start_at + args.warmup, start_at + args.warmup + args.seconds
        in_window = 0
        latencies: list[float] = []
        while time.monotonic() < window_end:
            try:
                (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 1.0))
            except TimeoutError:
                continue
            frame = await reader.readexactly(size)
            key, version = struct.unpack_from(">HH", frame)
            if key == Key.DELIVER:
                header_at = 5 if version == 1 else 13
                (records,) = struct.unpack_from(">I", frame, header_at + 4)  # magic, type, entries, records
                writer.write(credit)
                if window_start <= time.monotonic() < window_end:
                    in_window += records
                    (stamp_ms,) = _TIMESTAMP.unpack_from(frame, header_at + 8)
                    latencies.append(max(time.time() - stamp_ms / 1000, 0.0))
        writer.close()
        out.put(("consumed", index, in_window, latencies))
    asyncio.run(run())


def cpu_ticks(pids: list[int] | None) -> int:
    """User + system CPU ticks of the broker's processes (a cluster's nodes: their sum)."""
    total = 0
    for pid in pids or []:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def rss_mib(pids: list[int] | None) -> float | None:
    """The RSS of the broker's (first) process."""
    if not pids:
        return None
    pid = pids[0]
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def measure(args: argparse.Namespace, publisher: Callable[..., None], consumer: Callable[..., None],
            start_delay_s: float, finish: Callable[[], None]) -> dict[str, Any]:
    """Run `args.publishers` publisher and `args.consumers` consumer processes (each `fn(args, index,
    start_at, out)`, putting (kind, index, count in the window, latency samples) on `out`), read the
    broker's CPU and RSS at the window's edges, call `finish` (delete the stream) and return the figures."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.monotonic() + start_delay_s
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
    finish()
    result: dict[str, Any] = {
        "publishers": args.publishers, "consumers": args.consumers, "size": args.size, "batch": args.batch,
        "window": args.window, "seconds": args.seconds,
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
    return result


def parse_options(description: str, stream: str, size_help: str, batch_help: str) -> argparse.Namespace:
    """The command line both stream generators take (this one and stream_rstream.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5552)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--stream", default=stream)
    p.add_argument("-x", "--publishers", type=int, default=1)
    p.add_argument("-y", "--consumers", type=int, default=1)
    p.add_argument("-s", "--size", type=int, default=16, help=size_help)
    p.add_argument("-b", "--batch", type=int, default=100, help=batch_help)
    p.add_argument("-w", "--window", type=int, default=20000, help="unconfirmed messages per publisher")
    p.add_argument("-z", "--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--pid", type=lambda text: [int(pid) for pid in text.split(",")],
                   help="the broker's pid, for its CPU and RSS (a cluster: its nodes' pids, comma-separated, "
                        "the one connected to first: CPU summed, RSS of the first)")
    return p.parse_args()


def main() -> None:
    args = parse_options(__doc__.splitlines()[0], f"stream-rawload-{os.getpid()}", "message bytes (AMQP 1.0 encoded)",
                         "messages per publish frame")

    async def admin(cmd: Any) -> Any:
        reader, writer = await open_connection(args.host, args.port, args.user, args.password)
        writer.write(c.encode(cmd))
        reply = await read_frame(reader)
        writer.close()
        return reply
    created = asyncio.run(admin(c.Create(1, args.stream, {})))
    assert created.code in (Code.OK, Code.STREAM_ALREADY_EXISTS), created
    result = measure(args, publisher, consumer, start_delay_s=1.0,
                     finish=lambda: asyncio.run(admin(c.Delete(2, args.stream))))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
