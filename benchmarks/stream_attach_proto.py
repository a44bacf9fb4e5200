"""Time to the first message when attaching over the stream protocol, split in its parts (issue 23).

Usage:
    python benchmarks/stream_attach_proto.py --port PORT --stream NAME [--runs 12] [--pause 0.3]

Per run, on a fresh connection: a QueryOffset (its round trip: the broker's response time alone), then a
Subscribe at `first` with credit 10, timing the subscribe's response and the first Deliver. The stream
must exist and hold messages. Prints each run and the medians (docs/BENCHMARKS.md, "Streams (issue 23),
third pass"); run it against hutch and RabbitMQ (5552) in the same sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import time

from stream_rawload import open_connection  # benchmarks/stream_rawload.py

from hutch.streamproto import commands as c
from hutch.streamproto.codes import Key, OffsetType
from hutch.streamproto.wire import OffsetSpec


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    return await reader.readexactly(size)


async def attach(host: str, port: int, stream: str) -> dict[str, float]:
    reader, writer = await open_connection(host, port, "guest", "guest")
    try:
        started = time.perf_counter()
        writer.write(c.encode(c.QueryOffset(7, "stream-attach-proto", stream)))
        await read_frame(reader)
        query_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        writer.write(c.encode(c.Subscribe(1, 1, stream, OffsetSpec(OffsetType.FIRST), 10)))
        response_ms = -1.0
        while True:
            frame = await read_frame(reader)
            key = struct.unpack_from(">H", frame)[0]
            if key == Key.DELIVER:
                return {"query_ms": round(query_ms, 2), "response_ms": round(response_ms, 2),
                        "first_deliver_ms": round((time.perf_counter() - started) * 1000, 2)}
            if response_ms < 0:
                response_ms = (time.perf_counter() - started) * 1000
    finally:
        writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between runs")
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        time.sleep(args.pause)
        runs.append(asyncio.run(attach(args.host, args.port, args.stream)))
        print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({k + "_p50": round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
                     | {"first_deliver_ms_max": max(r["first_deliver_ms"] for r in runs)}))


if __name__ == "__main__":
    main()
