"""Many AMQP connections sending a burst of work at once, and how long the node's loop stalls meanwhile.

    PYTHONPATH=<tree>/src python benchmarks/amqp_turn_flood.py [connections] [--mode M] [--frames K]
        [--py-spy FILE]

Starts a node (tests/conftest.start_server), logs in `connections` (default 64) raw AMQP connections
(tests/interop/helpers.RawClient, 8 at a time: `auth.max_pending_logins_per_source`), each with one
channel, then all of them send their burst at the same moment and read until their burst is answered
(a `basic.qos` after it, whose `qos-ok` comes last). The bursts (`--mode`):

- `headers`: K unroutable publishes (amq.direct, no binding), each content header carrying a headers
  table of ~128 KiB of tiny fields (the header fills a 131,072-byte frame; decoded to validate it);
- `declare`: K passive `queue.declare`s of an existing queue (many small method frames, each answered);
- `bind`: K `queue.bind`s of the connection's own queue to amq.topic, each a new routing key;
- `publish`: K small unroutable publishes (header and body of a few bytes).

The attackers run in a child process (their threads do not take the probe's GIL). Beside them, in this
process, a pika client does a `basic.get` round trip (an empty queue: the loop alone) every 10 ms: the
longest round trip during the flood is the loop's stall (p99 beside it). `--py-spy FILE` records the
node during the flood (raw folded stacks) and prints the functions that held the most samples. Run it
with PYTHONPATH at another tree's `src` to measure that tree the same way. docs/security.md quotes it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from benchmarks.stream_decode_flood import summarise  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from tests.interop.helpers import RawClient, connect  # noqa: E402

from hutch.amqp import spec  # noqa: E402
from hutch.amqp.frames import content_frames, method_frame  # noqa: E402

HEADER_FIELDS = 11_500  # tiny fields: a headers table of ~127 KB, within one 131,072-byte frame
QUEUE = "flood-target"


def burst(mode: str, frames: int, index: int) -> bytes:
    """One connection's burst on channel 1, then the `basic.qos` whose answer ends it."""
    parts: list[bytes] = []
    if mode == "headers":
        props = spec.BasicProperties(headers={f"h{i}": i for i in range(HEADER_FIELDS)}).encode()
        publish = method_frame(1, spec.Basic.Publish(exchange="amq.direct", routing_key="nowhere"))
        one = publish + b"".join(content_frames(1, 60, props, b"x", 131072))
        parts = [one] * frames
    elif mode == "declare":
        parts = [method_frame(1, spec.Queue.Declare(queue=QUEUE, passive=True))] * frames
    elif mode == "bind":
        parts = [method_frame(1, spec.Queue.Bind(queue=f"own-{index}", exchange="amq.topic",
                                                 routing_key=f"k.{index}.{i}")) for i in range(frames)]
    elif mode == "publish":
        publish = method_frame(1, spec.Basic.Publish(exchange="amq.direct", routing_key="nowhere"))
        parts = [publish + b"".join(content_frames(1, 60, spec.BasicProperties().encode(), b"m", 131072))] * frames
    else:
        raise SystemExit(f"unknown mode {mode}")
    return b"".join(parts) + method_frame(1, spec.Basic.Qos(prefetch_count=1))


def attack(port: int, connections: int, mode: str, frames: int, pipe: multiprocessing.connection.Connection) -> None:
    """The child process: log in, say ready, wait for go, send every burst at once, report when all ended."""
    def login(index: int) -> RawClient:
        client = RawClient(port, timeout=600)
        client.handshake()
        client.open_channel(1)
        if mode == "bind":
            client.rpc(1, spec.Queue.Declare(queue=f"own-{index}", exclusive=True), spec.Queue.DeclareOk)
        return client

    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(login, range(connections)))
    data = [burst(mode, frames, i) for i in range(connections)] if mode == "bind" else [burst(mode, frames, 0)]
    go = threading.Barrier(connections + 1)

    def run(index: int, client: RawClient) -> None:
        go.wait(600)
        client.send(data[index % len(data)])
        while True:
            _, method = client.recv_method(600)
            if isinstance(method, spec.Basic.QosOk):
                return

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    pipe.send("ready")
    pipe.recv()
    began = time.monotonic()
    go.wait(600)
    for thread in threads:
        thread.join(900)
    pipe.send(time.monotonic() - began)
    for client in clients:
        client.close()


class GetProbe:
    """Every 10 ms a `basic.get` round trip on an empty queue (pika): the round trips (s)."""

    def __init__(self, port: int) -> None:
        self.conn = connect(port)
        self.channel = self.conn.channel()
        self.channel.queue_declare("probe-q")
        self.trips: list[tuple[float, float]] = []  # (when, round trip)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.channel.basic_get("probe-q", auto_ack=True)
            self.trips.append((began, time.monotonic() - began))
            time.sleep(0.01)

    def start(self) -> GetProbe:
        self._thread.start()
        return self

    def stop(self, since: float, until: float) -> str:
        self._stop.set()
        self._thread.join(300)
        self.conn.close()
        trips = sorted(t for when, t in self.trips if since <= when + t and when <= until)
        if not trips:
            return "no rounds"
        return (f"{len(trips)} rounds, longest {trips[-1] * 1000:.0f} ms, "
                f"p99 {trips[int(len(trips) * 0.99)] * 1000:.0f} ms, median {trips[len(trips) // 2] * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("connections", nargs="?", type=int, default=64)
    parser.add_argument("--mode", default="headers", choices=("headers", "declare", "bind", "publish"))
    parser.add_argument("--frames", type=int, default=4, help="units of work in each connection's burst")
    parser.add_argument("--py-spy", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        info = start_server(Path(tmp))
        try:
            setup = connect(info.amqp_port)
            setup.channel().queue_declare(QUEUE)
            setup.close()
            ours, theirs = multiprocessing.Pipe()
            child = multiprocessing.Process(target=attack, args=(info.amqp_port, args.connections, args.mode,
                                                                 args.frames, theirs))
            child.start()
            assert ours.recv() == "ready"
            probe = GetProbe(info.amqp_port).start()
            time.sleep(0.5)
            spy = None
            if args.py_spy is not None:
                spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "-r", "200", "-o", str(args.py_spy),
                                        "-p", str(info.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            began = time.monotonic()
            ours.send("go")
            answered_s = ours.recv()
            ended = time.monotonic()
            time.sleep(0.3)
            trips = probe.stop(began, ended)
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            child.join(60)
            print(f"{args.connections} AMQP connections x {args.frames} {args.mode}: all answered in "
                  f"{answered_s:.2f} s; basic.get probe during the flood: {trips}; "
                  f"load average {os.getloadavg()[0]:.1f}")
            if args.py_spy is not None:
                summarise(args.py_spy)
        finally:
            info.stop()


if __name__ == "__main__":
    socket.setdefaulttimeout(600)
    main()
