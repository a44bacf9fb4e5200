"""The loop time a stream's home worker spends on a reader of many filter values from another worker.

    PYTHONPATH=<tree>/src python benchmarks/remote_filter_open.py [values] [rounds]

In one process, no sockets: a node and a stream with one filtered chunk (as tests/stream_protocol/memory.py
builds them), the home's end of the worker link (`StreamReaderLink`) given a `StreamReadOpen` of `values`
(default 45,000) filter values, as a subscription in another worker sends it; the loop is run until the
matching chunk is sent. Prints, over `rounds` (default 5) readers: the longest time the link held the
loop in one call (the open, or one step of its filter's preparation), the number of calls, and the
time from the open to the chunk. Run it with PYTHONPATH at another tree's `src` (e.g. /work/main/src)
to measure that tree the same way. docs/security.md ("Stream protocol") quotes it.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from hutch.cluster import messages as cm  # noqa: E402
from hutch.runtime.stream_session.home_link import StreamReaderLink  # noqa: E402
from hutch.streamproto import commands as c  # noqa: E402
from hutch.streamproto.codes import OffsetType  # noqa: E402
from session.memory import make_node  # noqa: E402
from stream_protocol.memory import StreamPair, make_hub  # noqa: E402


class Host:
    name = "w0"

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, peer: str, record: Any) -> bool:
        self.sent.append(record)
        return True

    def register(self, kind: type[Any], handler: Any) -> None:
        pass

    def connected(self, peer: str) -> bool:
        return True

    async def call(self, peer: str, request: Any, timeout: float = 5.0) -> Any:
        raise NotImplementedError


def time_steps(link: StreamReaderLink) -> list[float]:
    """The longest call of the link's filter preparation step (none in a tree without one), in [0]."""
    held = [0.0]
    step = getattr(link, "_prepare_step", None)
    if step is not None:
        def timed(served: Any) -> None:
            began = time.perf_counter()
            step(served)
            held[0] = max(held[0], time.perf_counter() - began)
        link._prepare_step = timed  # type: ignore[method-assign]  # (the loop calls it through the instance)
    return held


async def main(values: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pair = StreamPair(make_hub(make_node(tmp)))
        await pair.open()
        await pair.create("s")
        pair.send(c.DeclarePublisher(pair.next_corr(), 1, "", "s"), c.Publish(1, [c.PublishedEntry(1, b"m", "a")], 2))
        await pair.expect(2)
        filters = [f"{i:x}".encode() for i in range(values)]
        longest = 0.0
        calls = 0
        for n in range(rounds):
            host = Host()
            link = StreamReaderLink(pair.hub.catalog)
            link.start(host)
            held = time_steps(link)
            began = time.perf_counter()
            link._on_open("w1", cm.StreamReadOpen(n + 1, "/", "s", int(OffsetType.FIRST), 0, 10, filters, False))
            opened = time.perf_counter() - began
            steps = 1
            while not host.sent:
                await asyncio.sleep(0)
                steps += 1
            served = time.perf_counter() - began
            longest = max(longest, opened, held[0])
            calls = max(calls, steps)
            print(f"reader {n + 1}: open {opened * 1000:.1f} ms, longest step {held[0] * 1000:.1f} ms, "
                  f"chunk sent after {served * 1000:.1f} ms and {steps} loop turns")
        print(f"{values} values: the link held the loop at most {longest * 1000:.1f} ms in one call "
              f"({calls} turns at most)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 45_000, int(sys.argv[2]) if len(sys.argv) > 2 else 5))
