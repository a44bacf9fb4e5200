"""stream_rstream_frames: what a broker sends rstream's clients, and what each client pays per message.

benchmarks/stream_rstream.py's publisher (`send_batch` of `-b` messages, at most `-w` unconfirmed) and
consumer (at `first`, credit 10, one credit back per chunk), one process each, run against the broker
on `--port` for `-z` seconds; rstream's `Connection` is wrapped in each process
to count the frames it reads (by type), the records per Deliver, the ids per PublishConfirm and the
frames it writes. Each process also reports its own CPU time (user + system) per message: against two
brokers, the same client paying more per message against one is what the broker makes it do. Prints
one JSON object {"pub": {...}, "cons": {...}}.

    python benchmarks/stream_rstream_frames.py --port 5552 -s 16 -b 100 -w 20000 -z 6
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import rstream.connection as rconn
from rstream import schema

# benchmarks/stream_rstream.py: the same publisher and consumer processes (and its command line)
from stream_rawload import parse_options
from stream_rstream import admin, consumer, publisher


def count_frames(stats: collections.Counter[str]) -> None:
    """Wrap rstream's Connection (in this process) to count what it reads and writes."""
    read_frame = rconn.Connection.read_frame
    write_raw = rconn.Connection._write_frame_raw

    async def counted_read(self: rconn.Connection) -> schema.Frame:
        frame = await read_frame(self)
        stats["frames_" + type(frame).__name__] += 1
        if isinstance(frame, schema.Deliver):
            stats["records"] += frame.num_entries
        elif isinstance(frame, schema.PublishConfirm):
            stats["confirm_ids"] += len(frame.publishing_ids)
        return frame

    async def counted_write(self: rconn.Connection, data: bytes) -> None:
        stats["writes"] += 1
        stats["write_bytes"] += len(data)
        await write_raw(self, data)

    rconn.Connection.read_frame = counted_read  # type: ignore[method-assign]
    rconn.Connection._write_frame_raw = counted_write  # type: ignore[method-assign]


class _Result:
    """Takes the one result a stream_rstream.py process puts (a queue's `put`)."""

    item: tuple[Any, ...] = ()

    def put(self, item: tuple[Any, ...]) -> None:
        self.item = item


def counted(role: Callable[[argparse.Namespace, int, float, Any], None], key: str, counter: str,
            args: argparse.Namespace, start_at: float, out: Any) -> None:
    """Run stream_rstream.py's `publisher` or `consumer` (its window from `start_at`, no warm-up) in
    this process with rstream's Connection counted, then put (key, stats) with its CPU time."""
    stats: collections.Counter[str] = collections.Counter()
    count_frames(stats)
    cpu = time.process_time()
    result = _Result()
    role(args, 0, start_at, result)
    stats[counter] = result.item[2]  # (kind, index, messages in the window, latencies)
    stats["cpu_ns"] = int((time.process_time() - cpu) * 1e9)
    out.put((key, dict(stats)))


def summary(stats: dict[str, int], messages: int) -> dict[str, Any]:
    frames = {k[len("frames_"):]: v for k, v in stats.items() if k.startswith("frames_")}
    result: dict[str, Any] = {"messages": messages, "frames_read": frames, "writes": stats.get("writes", 0),
                              "cpu_us_per_msg": round(stats.get("cpu_ns", 0) / 1000 / max(messages, 1), 3)}
    if frames.get("Deliver"):
        result["records_per_deliver"] = round(stats["records"] / frames["Deliver"], 1)
    if frames.get("PublishConfirm"):
        result["ids_per_confirm"] = round(stats["confirm_ids"] / frames["PublishConfirm"], 1)
    return result


def main() -> None:
    args = parse_options(__doc__.splitlines()[0], f"stream-frames-{time.time_ns()}", "message body bytes",
                         "messages per send_batch")
    args.warmup = 0.0  # (counted from the start: the frames and the CPU cover the same messages)
    asyncio.run(admin(args, True))
    out: Any = mp.Queue()
    start_at = time.monotonic() + 1.0
    procs = [mp.Process(target=counted, args=(publisher, "pub", "confirmed", args, start_at, out)),
             mp.Process(target=counted, args=(consumer, "cons", "consumed", args, start_at, out))]
    for proc in procs:
        proc.start()
    got = dict(out.get() for _ in procs)
    for proc in procs:
        proc.join()
    asyncio.run(admin(args, False))
    print(json.dumps({"pub": summary(got["pub"], got["pub"].get("confirmed", 0)),
                      "cons": summary(got["cons"], got["cons"].get("consumed", 0))}))


if __name__ == "__main__":
    main()
