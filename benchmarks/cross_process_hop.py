"""The cost of one cross-process hop for a batch of messages (docs/scaling.md).

A node with one worker process per core must hand a publish to the worker that owns its queue. This
measures that hop on this machine as hutch would do it: a batch of publish records (exchange, routing key,
properties bytes, body) encoded with msgpack, written to a Unix socket pair with uvloop, decoded by the
other process, which answers with one confirm record per batch (the publisher's sequence range).

Reported per batch size: round trips per second, the round trip's p50/p99, and CPU microseconds per
message summed over both processes (`time.process_time()` of each process).

    python benchmarks/cross_process_hop.py --batches 2000 --sizes 1,10,100,1000 --body 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import time

import msgpack
import uvloop

HEADER = struct.Struct(">I")


def encode_batch(seq: int, count: int, body: bytes) -> bytes:
    records = [[seq + i, "amq.direct", "orders.created", b"\x10\x00\x02", body] for i in range(count)]
    payload = msgpack.packb(records, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
    return await reader.readexactly(size)


async def owner(sock: socket.socket) -> None:
    """The worker that owns the queue: decode each batch, append to a queue, confirm the range."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    queue: list[list[object]] = []
    while True:
        try:
            frame = await read_frame(reader)
        except asyncio.IncompleteReadError:
            break
        records = msgpack.unpackb(frame, raw=False)
        queue.extend(records)
        if len(queue) > 100_000:
            queue.clear()
        confirm = msgpack.packb([records[0][0], records[-1][0]])
        writer.write(HEADER.pack(len(confirm)) + confirm)
    writer.write(msgpack.packb([time.process_time()]))
    await writer.drain()
    writer.close()


async def sender(sock: socket.socket, batches: int, size: int, body: bytes) -> tuple[list[float], float]:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    rtts = []
    seq = 0
    for _ in range(batches):
        start = time.perf_counter()
        writer.write(encode_batch(seq, size, body))
        confirm = msgpack.unpackb(await read_frame(reader))
        assert confirm == [seq, seq + size - 1]
        rtts.append(time.perf_counter() - start)
        seq += size
    writer.write_eof()
    owner_cpu = msgpack.unpackb(await reader.read())[0]
    writer.close()
    return rtts, owner_cpu


def run(batches: int, size: int, body_size: int) -> dict[str, float]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the owning worker
        parent.close()
        uvloop.run(owner(child))
        os._exit(0)
    child.close()
    before = time.process_time()
    wall = time.perf_counter()
    rtts, owner_cpu = uvloop.run(sender(parent, batches, size, b"x" * body_size))
    wall = time.perf_counter() - wall
    sender_cpu = time.process_time() - before
    os.waitpid(pid, 0)
    rtts.sort()
    messages = batches * size
    return {
        "batch": size,
        "round_trips_per_s": batches / wall,
        "messages_per_s": messages / wall,
        "rtt_p50_us": rtts[len(rtts) // 2] * 1e6,
        "rtt_p99_us": rtts[int(len(rtts) * 0.99)] * 1e6,
        "cpu_us_per_msg": (sender_cpu + owner_cpu) / messages * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--sizes", default="1,10,100,1000")
    ap.add_argument("--body", type=int, default=16, help="body bytes per message")
    args = ap.parse_args()
    print("| batch | round trips/s | msg/s | RTT p50 (µs) | RTT p99 (µs) | CPU µs/msg (both processes) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in (int(s) for s in args.sizes.split(",")):
        r = run(args.batches if size < 1000 else max(200, args.batches // 10), size, args.body)
        print(f"| {size} | {r['round_trips_per_s']:,.0f} | {r['messages_per_s']:,.0f} | {r['rtt_p50_us']:.0f} | "
              f"{r['rtt_p99_us']:.0f} | {r['cpu_us_per_msg']:.2f} |")


if __name__ == "__main__":
    main()
