"""A stream's log at size: time to attach at `first` and memory while readers read it (issue 23).

Writes N entries of SIZE bytes into one stream through `StreamHandle` (the runtime API every stream
path uses; chunks of CHUNK entries, each fdatasync'd in groups as in the broker), then:
- times a reader attached at `first` to its first chunk, and at an offset in the middle;
- reads the whole stream with READERS readers started at different offsets, one chunk each in turn,
  and reports the process's peak RSS against its RSS before reading (bounded: readers hold one
  read-ahead block each, never the log).

    .venv/bin/python benchmarks/stream_log_memory.py --messages 2000000 --size 100 --readers 10

It needs disk space for the stream (about N × (SIZE + 4) bytes) in --dir (default: a temporary
directory, deleted at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import time

from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.runtime.clock import SYSTEM_CLOCK
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamOptions
from hutch.storage.fs import RealFS


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def run(args: argparse.Namespace) -> dict[str, float]:
    directory = args.dir or tempfile.mkdtemp(prefix="hutch-stream-bench-")
    try:
        h = await StreamHandle.open(RealFS(), directory + "/s", clock=SYSTEM_CLOCK,
                                    options=StreamOptions(max_segment_size_bytes=args.segment_bytes))
        body = b"x" * args.size
        t0 = time.perf_counter()
        last = None
        for _ in range(args.messages // args.chunk):
            last = h.append([body] * args.chunk)
            if h.log.next_offset % (args.chunk * 64) == 0:
                await last.settled
        if last is not None:
            await last.settled
        write_s = time.perf_counter() - t0
        before = rss_mb()
        t0 = time.perf_counter()
        first = h.reader(OffsetSpec.first()).next_chunk()
        attach_first_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        middle = h.reader(OffsetSpec.offset(args.messages // 2)).next_chunk()
        attach_middle_ms = (time.perf_counter() - t0) * 1000
        assert first is not None and middle is not None
        readers = [h.reader(OffsetSpec.offset(i * args.messages // args.readers)) for i in range(args.readers)]
        peak = before
        t0 = time.perf_counter()
        records = 0
        live = list(readers)
        while live:
            for r in list(live):
                chunk = r.next_chunk()
                if chunk is None:
                    live.remove(r)
                    continue
                records += chunk.header.num_records
            if records % (args.chunk * 200) < args.chunk * args.readers:
                peak = max(peak, rss_mb())
        read_s = time.perf_counter() - t0
        peak = max(peak, rss_mb())
        await h.close()
        return {"messages": args.messages, "size": args.size, "segments": h.segment_count,
                "disk_mb": round(h.size_bytes / 2**20, 1), "write_s": round(write_s, 2),
                "attach_first_ms": round(attach_first_ms, 2), "attach_middle_ms": round(attach_middle_ms, 2),
                "readers": args.readers, "records_read": records, "read_s": round(read_s, 2),
                "rss_before_read_mb": round(before, 1), "rss_peak_while_reading_mb": round(peak, 1),
                "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--chunk", type=int, default=1000, help="entries per chunk (default 1000)")
    p.add_argument("--readers", type=int, default=10)
    p.add_argument("--segment-bytes", type=int, default=50_000_000)
    p.add_argument("--dir", default=None)
    print(json.dumps(asyncio.run(run(p.parse_args()))))


if __name__ == "__main__":
    main()
