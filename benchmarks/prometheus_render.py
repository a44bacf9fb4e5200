"""Cost of building the Prometheus exposition text (GET /metrics, /metrics/per-object) for many queues.

The text is built on the broker's event loop (it reads the node without locks), so its cost is a pause
of the broker. By default this builds an in-process node (no sockets) with N queues holding one 100-byte
message each and times `hutch.mgmt.prometheus.render` plus the encode to bytes, for both registries.
With --amqp-port/--mgmt-port it declares the N queues on a running broker (over AMQP, with pika), times
GET /metrics and /metrics/per-object end to end (plain and gzip), then deletes the queues.

Usage: python benchmarks/prometheus_render.py [--queues 10000] [--repeat 5]
       python benchmarks/prometheus_render.py --amqp-port 5672 --mgmt-port 15672 [--queues 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import urllib.request

from hutch.amqp.spec import BasicProperties
from hutch.config import Config
from hutch.core.message import Message
from hutch.mgmt import prometheus, system
from hutch.runtime import app
from hutch.runtime.broker.node import Node


def build_node(queues: int) -> Node:
    node = app.build_node(Config(node_name="bench@localhost"), monitor_resources=False)
    vhost = node.vhosts["/"]
    for i in range(queues):
        q = node.declare_queue(vhost, f"orders.eu-west.{i:06d}", False, False, False, {}, None)
        q.publish(Message("", q.name, BasicProperties(), b"x" * 100))
    return node


def report(label: str, times: list[float], body: bytes) -> None:
    print(f"{label:>26}: median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms, "
          f"{len(body) / 1e6:.1f} MB")


def in_process(queues: int, repeat: int) -> None:
    node = build_node(queues)
    print(f"in-process render, {queues} queues")
    for registry in prometheus.REGISTRIES:
        times = []
        body = b""
        for _ in range(repeat):
            start = time.perf_counter()
            assert node.agent is not None
            clients = asyncio.run(node.agent.metric_samples())  # what the management agent answers
            info = asyncio.run(system.own_node_info(node.agent, node, node.wall_ms()))
            body = prometheus.render(node, registry, info, clients).encode()
            times.append(time.perf_counter() - start)
        report(registry, times, body)


def over_http(amqp_port: int, mgmt_port: int, queues: int, repeat: int) -> None:
    import pika  # a test dependency: only this mode needs it

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    names = [f"bench-prometheus.{i:06d}" for i in range(queues)]
    for name in names:
        ch.queue_declare(name)
        ch.basic_publish("", name, b"x" * 100)
    print(f"GET over HTTP, {queues} more queues on the broker")
    try:
        for path, headers in (("/metrics", {}), ("/metrics/per-object", {}),
                              ("/metrics/per-object", {"Accept-Encoding": "gzip"})):
            times = []
            body = b""
            for _ in range(repeat):
                req = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}{path}", headers=headers)
                start = time.perf_counter()
                with urllib.request.urlopen(req, timeout=60) as resp:
                    body = resp.read()
                times.append(time.perf_counter() - start)
            report(path + (" (gzip)" if headers else ""), times, body)
    finally:
        for name in names:
            ch.queue_delete(name)
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--amqp-port", type=int, help="a running broker's AMQP port (with --mgmt-port)")
    parser.add_argument("--mgmt-port", type=int, help="its management port")
    args = parser.parse_args()
    if args.amqp_port and args.mgmt_port:
        over_http(args.amqp_port, args.mgmt_port, args.queues, args.repeat)
    else:
        in_process(args.queues, args.repeat)


if __name__ == "__main__":
    main()
