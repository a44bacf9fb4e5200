"""Open N idle AMQP connections with one channel each and report the broker's resident memory.

Usage: python benchmarks/idle_connections.py --port 5672 --pid BROKER_PID [-n 1000]

The broker's RSS (VmRSS from /proc/PID/status, summed over the PID and its children, so Erlang's helper
processes count for RabbitMQ) is read before and after the connections are open. Connections are made
with hutch's own codec over plain sockets, from this one process, and kept open (heartbeat 0) while
measuring.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

from hutch.amqp import spec
from hutch.amqp.frames import FrameReader, method_frame


def rss_kib(pid: int) -> int:
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def open_connection(port: int, user: str, password: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    reader = FrameReader(0)

    def next_method() -> spec.Method:
        while True:
            for ftype, _ch, payload in reader.frames():
                if ftype == spec.FRAME_METHOD:
                    return spec.decode_method(payload)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            reader.feed(data)

    sock.sendall(spec.PROTOCOL_HEADER)
    next_method()
    response = f"\0{user}\0{password}".encode()
    sock.sendall(method_frame(0, spec.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response=response, locale="en_US")))
    tune = next_method()
    sock.sendall(method_frame(0, spec.Connection.TuneOk(channel_max=tune.channel_max,
                                                         frame_max=tune.frame_max, heartbeat=0)))
    sock.sendall(method_frame(0, spec.Connection.Open(virtual_host="/")))
    next_method()
    sock.sendall(method_frame(1, spec.Channel.Open()))
    next_method()
    return sock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--pid", type=int, required=True, help="broker process id")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    args = ap.parse_args()
    before = rss_kib(args.pid)
    socks = [open_connection(args.port, args.user, args.password) for _ in range(args.n)]
    time.sleep(2)
    after = rss_kib(args.pid)
    print(f"connections={len(socks)} rss_before_kib={before} rss_after_kib={after} "
          f"per_connection_kib={(after - before) / len(socks):.1f}")
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
