"""CPU per message of a stream queue's side of an AMQP 0-9-1 delivery, in-process (issue 23, third pass).

Usage:
    python benchmarks/stream_deliver_micro.py [--messages N]

Writes N × 16 B messages (as `amqp10.from_091` stores a persistent 0-9-1 message) in chunks of 250 to a
stream in a temporary directory, then reads them from `first` with one `StreamQueue` consumer (prefetch
500) whose channel keeps nothing and acks at once: the reader, the conversion to 0-9-1, the credit and the
queue entry, not the channel's frame building. Prints the best of 5 rounds in µs of process CPU time per
message (docs/BENCHMARKS.md, "Streams (issue 23), third pass").
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from typing import Any

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import Consumer
from hutch.queues.stream import amqp10
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.queue_types.stream.queue import StreamQueue
from hutch.storage.fs import RealFS


class WallClock:
    def wall_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()


class NullConnection:
    write_paused = False


class NullChannel:
    """Counts deliveries and gives the credit back at once."""

    conn = NullConnection()

    def __init__(self) -> None:
        self.delivered = 0

    def can_take(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, queue: Any, entry: Any) -> None:
        self.delivered += 1
        consumer.unacked -= 1


async def measure(messages: int) -> float:
    directory = tempfile.mkdtemp(prefix="stream-deliver-micro-")
    try:
        handle = StreamHandle.open_now(RealFS(), directory, clock=WallClock())  # type: ignore[arg-type]
        entry = amqp10.from_091(Message("", "q", BasicProperties(delivery_mode=2), b"x" * 16))
        for _ in range(0, messages, 250):
            handle.append([entry] * 250)
        while handle.committed_chunk_id < handle.last_chunk_id:
            await asyncio.sleep(0.01)
        best = float("inf")
        for _ in range(5):
            queue = StreamQueue("/", "q", {"x-queue-type": "stream"}, handle, 1, WallClock())  # type: ignore[arg-type]
            channel = NullChannel()
            consumer = Consumer("t", channel, queue, False, False, 500,  # type: ignore[arg-type]
                                arguments={"x-stream-offset": "first"})
            started = time.process_time()
            queue.add_consumer(consumer)
            while channel.delivered < messages:
                queue.deliver_pending()
            best = min(best, time.process_time() - started)
            queue.remove_consumer(consumer)
        await handle.close()
        return best / messages * 1e6
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    args = ap.parse_args()
    us = asyncio.run(measure(args.messages))
    print(f"{args.messages} messages: best {us:.2f} µs of CPU per message delivered")


if __name__ == "__main__":
    main()
