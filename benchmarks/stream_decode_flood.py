"""Many stream-protocol connections decoding large frames at once, and how long the node's loop stalls.

    PYTHONPATH=<tree>/src python benchmarks/stream_decode_flood.py [connections] [--py-spy FILE]

Starts a node (tests/conftest.start_server, the stream port on), fills a stream with 20 filtered chunks,
logs in `connections` (default 64) stream connections, then each sends one ~1 MiB `subscribe` of 45,000
properties `filter.N` (the frame of tests/stream_protocol/test_security_stream.py), all at once, and
reads its answer. Beside it a second client publishes one message on a stream connection of its own
every 10 ms and waits for its confirm, then asks the stream's statistics: the longest statistics round
trip is the loop's stall (p99 beside it; the confirm's waits for the stream's sync too).
`--py-spy FILE` records the node with py-spy during the flood (raw
folded stacks) and prints the functions that held the most samples. Run it with PYTHONPATH at another
tree's `src` (e.g. /work/main/src) to measure that tree the same way. docs/security.md quotes it.
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from tests.conftest import start_server  # noqa: E402
from tests.stream_protocol.hostile import RawStream  # noqa: E402
from tests.stream_protocol.test_security_stream import MESSAGE, fill, subscribe_of_tiny_fields  # noqa: E402

from hutch.streamproto import commands as sc  # noqa: E402
from hutch.streamproto.codes import Code, Key  # noqa: E402


class StreamProbe:
    """Every 10 ms, on a connection of its own: a publish and its confirm (which waits for the stream's
    sync too), then a `stream_stats` round trip (the loop alone). The round trips (s) of each."""

    def __init__(self, port: int, stream: str) -> None:
        self.stream = stream
        self.client = RawStream(port)
        self.client.ok(sc.DeclarePublisher(self.client.next_corr(), 1, "", stream))
        self.confirms: list[float] = []
        self.stats: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pid = 0
        while not self._stop.is_set():
            pid += 1
            began = time.monotonic()
            (confirm,) = self.client.request(sc.Publish(1, [sc.PublishedEntry(pid, MESSAGE)]))
            assert isinstance(confirm, sc.PublishConfirm), confirm
            asked = time.monotonic()
            (stats,) = self.client.request(sc.StreamStats(self.client.next_corr(), self.stream))
            assert isinstance(stats, sc.StreamStatsResponse), stats
            self.confirms.append(asked - began)
            self.stats.append(time.monotonic() - asked)
            time.sleep(0.01)

    def start(self) -> StreamProbe:
        self._thread.start()
        return self

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(120)
        self.client.close()
        parts = []
        for name, trips in (("stats", sorted(self.stats)), ("publish/confirm", sorted(self.confirms))):
            parts.append(f"{name} longest {trips[-1] * 1000:.0f} ms, p99 {trips[int(len(trips) * 0.99)] * 1000:.0f} ms")
        return f"{len(self.stats)} rounds: " + "; ".join(parts)


def stream_attacker(port: int, frame: bytes, ready: threading.Barrier, codes: list[int]) -> None:
    client = RawStream(port)
    try:
        ready.wait(300)
        client.send_raw(frame)
        while True:
            (got,) = client.receive(1, timeout=300)
            if isinstance(got, sc.Response) and got.key == Key.SUBSCRIBE:
                codes.append(got.code)
                ready.wait(300)  # every subscription held until all are answered
                return
    finally:
        client.close()


def summarise(folded: Path) -> None:
    """The functions (self and in the stack) holding the most of py-spy's raw samples."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inside[frame] += n
    print(f"py-spy: {total} samples")
    for title, counter in (("self", own), ("in the stack", inside)):
        print(f"  most {title}:")
        for name, n in counter.most_common(25):
            print(f"    {n * 100 / total:5.1f} %  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("connections", nargs="?", type=int, default=64)
    parser.add_argument("--py-spy", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        info = start_server(Path(tmp), "--stream-port", "0")
        try:
            port = info.ports["stream"]
            setup = RawStream(port)
            fill(setup, "flood", 20)
            setup.create("probe")
            setup.close()
            ready = threading.Barrier(args.connections + 1)
            codes: list[int] = []
            frame = subscribe_of_tiny_fields(99, 1, "flood")
            threads = [threading.Thread(target=stream_attacker, args=(port, frame, ready, codes))
                       for _ in range(args.connections)]
            for thread in threads:
                thread.start()
                time.sleep(0.01)  # logins one after the other (the login pool is fair per source)
            probe = StreamProbe(port, "probe").start()
            time.sleep(0.5)
            spy = None
            if args.py_spy is not None:
                spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "-r", "200", "-o", str(args.py_spy),
                                        "-p", str(info.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            began = time.monotonic()
            ready.wait(300)  # all send at once
            ready.wait(600)  # all answered
            answered_s = time.monotonic() - began
            time.sleep(0.5)
            trips = probe.stop()
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            for thread in threads:
                thread.join(60)
            taken = sum(code == Code.OK for code in codes)
            kind = "stream connections x 1 subscribe of 45,000 properties"
            print(f"{args.connections} {kind}: answered in {answered_s:.2f} s, {taken} OK; stream probe {trips}; "
                  f"load average {os.getloadavg()[0]:.1f}")
            if args.py_spy is not None:
                summarise(args.py_spy)
        finally:
            info.stop()


if __name__ == "__main__":
    socket.setdefaulttimeout(300)
    main()
