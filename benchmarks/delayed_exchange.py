"""Throughput of an x-delayed-message exchange on a real hutch-server, and the cost of consistent-hash routing.

    python benchmarks/delayed_exchange.py [messages] [--cluster]

Starts a hutch-server on free ports in a temporary directory, declares a durable x-delayed-message exchange
bound to a durable queue, and publishes `messages` (default 20,000) persistent 100 B messages with pika, in
windows of 500 confirmed publishes, each with an `x-delay` spread over 3-5 s (so release order differs from
publish order). Prints the held publish rate (confirmed, on disk), the server's RSS while holding, how long
the release took from the first due message to the last in the queue, and the `route()` cost of a
consistent-hash exchange (20 weighted queues) beside a direct one. The node is started with --no-cluster
(held messages in the exchange's own store), or with `--cluster` as a cluster of one (held messages in the
exchange's replica, a quorum queue). docs/delayed-messages.md quotes it.
"""

from __future__ import annotations

import sys
import tempfile
import time
import timeit
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_server  # noqa: E402
from hutch.core.routing import Binding, ConsistentHashRouter, Exchange, queue_dest, route  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def delayed(n: int, cluster: bool) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        server = start_server(Path(tmp), cluster=cluster)
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.amqp_port))
            ch = conn.channel()
            ch.exchange_declare("bench-delay", "x-delayed-message", durable=True,
                                arguments={"x-delayed-type": "direct"})
            ch.queue_declare("bench-delay-q", durable=True)
            ch.queue_bind("bench-delay-q", "bench-delay", "k")
            confirm = conn.channel()
            confirm.confirm_delivery()
            body = b"x" * 100
            start = time.perf_counter()
            last_due = start
            for i in range(n):
                delay_ms = 3000 + (i * 7919) % 2000
                props = pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay_ms})
                (confirm if i % 500 == 499 else ch).basic_publish("bench-delay", "k", body, props)
                last_due = max(last_due, time.perf_counter() + delay_ms / 1000)
            held_s = time.perf_counter() - start
            rss = rss_mb(server.proc.pid)
            while ch.queue_declare("bench-delay-q", passive=True).method.message_count < n:
                time.sleep(0.05)
            done = time.perf_counter()
            print(f"held {n} messages: {n / held_s:,.0f} msg/s (every 500th confirmed); server RSS {rss:.0f} MB")
            print(f"released: all {n} in the queue {done - last_due:+.2f} s after the last one was due")
            conn.close()
        finally:
            server.stop()


def routing_cost() -> None:
    chx = Exchange("/", "h", "x-consistent-hash")
    direct = Exchange("/", "d", "direct")
    for i in range(20):
        chx.router.add(Binding("h", queue_dest(f"q{i}"), str(1 + i % 5), {}))
    direct.router.add(Binding("d", queue_dest("q"), "order-1", {}))
    keys = [f"order-{i}" for i in range(20_000)]
    assert isinstance(chx.router, ConsistentHashRouter)
    chx.router.cache_entries = 0
    t = min(timeit.repeat(lambda: [route({}, chx, [k], None) for k in keys], number=1, repeat=3))
    print(f"route() x-consistent-hash, 20 queues, distinct keys (uncached): {t / len(keys) * 1e6:.2f} µs")
    chx.router.cache_entries = 4096
    for name, x in (("x-consistent-hash, 20 queues, a repeated key", chx), ("direct", direct)):
        t = min(timeit.repeat(lambda x=x: route({}, x, ["order-1"], None), number=20_000, repeat=5))
        print(f"route() {name}: {t / 20_000 * 1e6:.2f} µs")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--cluster"]
    delayed(int(args[0]) if args else 20_000, "--cluster" in sys.argv)
    routing_cost()
