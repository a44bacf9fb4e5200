"""Cluster benchmarks with real hutch processes on loopback (docs/BENCHMARKS.md, "Clustering").

1. Failover: a 3-node cluster; kill -9 the metadata leader; time until a queue.declare through a
   surviving node succeeds (detection + election + commit). Repeated, the killed node restarted between.
2. Metadata commit latency: queue.declare of new durable queues through a follower, p50/p99.

    .venv/bin/python benchmarks/cluster_failover.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pika
import pika.exceptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.nodes import Cluster, Node  # noqa: E402

DEFAULT_CONFIG = "cluster.fault_injection = false\n"  # the node's defaults: 100 ms ticks, 30 s timeout


def declare_until_ok(node: Node, name: str, deadline_s: float = 60.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0&socket_timeout=5"))
            try:
                conn.channel().queue_declare(name, durable=True)
                return time.monotonic() - started
            finally:
                if conn.is_open:
                    conn.close()
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.02)
    raise RuntimeError("no successful declare within the deadline")


def failover(c: Cluster, rounds: int) -> list[float]:
    times = []
    for r in range(rounds):
        c.wait_running({"n1", "n2", "n3"}, timeout=60)
        leader_name = c.status()["metadata"]["leader"].split("@")[0]
        leader = next(n for n in c.nodes if n.name == leader_name)
        survivor = next(n for n in c.nodes if n is not leader)
        leader.kill()
        took = declare_until_ok(survivor, f"failover-{r}")
        times.append(took)
        print(f"round {r}: leader {leader_name} killed; declare through {survivor.name} after {took:.2f} s")
        leader.start()
    return times


def commit_latency(c: Cluster, count: int) -> list[float]:
    follower = c.nodes[1]
    conn = pika.BlockingConnection(pika.URLParameters(follower.url + "?heartbeat=0"))
    ch = conn.channel()
    out = []
    for i in range(count):
        t = time.perf_counter()
        ch.queue_declare(f"lat-{i}", durable=True)
        out.append(time.perf_counter() - t)
    conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--declares", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(Path(tmp))
        for _ in range(3):
            c.add(config_text=DEFAULT_CONFIG)
        try:
            lat = commit_latency(c, args.declares)
            lat.sort()
            print(f"queue.declare through a follower ({args.declares}): p50 {statistics.median(lat) * 1000:.1f} ms, "
                  f"p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.1f} ms")
            times = failover(c, args.rounds)
            print(f"failover (kill -9 of the metadata leader -> declare ok), {args.rounds} rounds: "
                  f"median {statistics.median(times):.2f} s, max {max(times):.2f} s")
        finally:
            c.stop()


if __name__ == "__main__":
    main()
