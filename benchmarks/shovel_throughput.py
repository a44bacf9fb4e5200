"""Shovel throughput (issue 25): how fast a dynamic shovel (ack-mode on-confirm) moves a backlog of
persistent messages from one durable queue to another, hutch beside RabbitMQ's shovel plugin.

For each broker and message size: fill `bench-shovel-src` with N persistent messages, create the shovel through the management API (`src-uri` and `dest-uri` `amqp://`, the local
node; `src-delete-after: queue-length`), and time from the PUT until the destination queue holds N
messages. Both queues are deleted afterwards. The hutch nodes are started by this script on free ports
(fresh data directories, `--no-cluster`; with `--between-nodes` a second node is the destination, over
TCP); RabbitMQ is the one already running (its ports are arguments).

    .venv/bin/python benchmarks/shovel_throughput.py --messages 20000 --sizes 16 1024 --rounds 3 \
        [--between-nodes] [--rabbitmq 5672:15672]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pika

from hutch.portfile import NodeDidNotStart, wait_for_ports

ROOT = Path(__file__).resolve().parents[1]
SRC, DST = "bench-shovel-src", "bench-shovel-dst"


def api(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def fill(amqp_port: int, count: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0))
    ch = conn.channel()
    for q in (SRC, DST):
        ch.queue_delete(q)
        ch.queue_declare(q, durable=True)
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", SRC, body, props)
    while depth(ch, SRC) < count:  # publishes without confirms (faster with pika), then wait for all
        time.sleep(0.05)
    conn.close()


def depth(ch: object, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)  # type: ignore[attr-defined]


def move(amqp_port: int, mgmt_port: int, count: int, dest_port: int = 0) -> float:
    """Seconds from creating the shovel to `count` messages in the destination queue (on the node of
    `dest_port`, over TCP, when given; else on the same node)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", dest_port or amqp_port, heartbeat=0))
    ch = conn.channel()
    ch.queue_declare(DST, durable=True)
    dest_uri = f"amqp://guest:guest@127.0.0.1:{dest_port}" if dest_port else "amqp://"
    value = {"src-uri": "amqp://", "src-queue": SRC, "dest-uri": dest_uri, "dest-queue": DST,
             "ack-mode": "on-confirm", "src-delete-after": "queue-length"}
    start = time.monotonic()
    code, _ = api(mgmt_port, "PUT", "/api/parameters/shovel/%2F/bench-shovel", {"value": value})
    assert code in (201, 204), code
    while depth(ch, DST) < count:
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    ch.queue_delete(DST)
    conn.close()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0))
    conn.channel().queue_delete(SRC)
    conn.close()
    api(mgmt_port, "DELETE", "/api/parameters/shovel/%2F/bench-shovel")
    return elapsed


def run(name: str, amqp_port: int, mgmt_port: int, args: argparse.Namespace, dest_port: int = 0) -> None:
    for size in args.sizes:
        rates = []
        for _ in range(args.rounds):
            fill(amqp_port, args.messages, size)
            rates.append(args.messages / move(amqp_port, mgmt_port, args.messages, dest_port))
        print(json.dumps({"broker": name, "size": size, "messages": args.messages,
                          "msg_s": [round(r) for r in rates], "median_msg_s": round(statistics.median(rates))}),
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rabbitmq", default="", help="AMQP:MANAGEMENT ports of a running RabbitMQ to compare")
    parser.add_argument("--between-nodes", action="store_true",
                        help="also: a shovel from one hutch node to a second one over TCP")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shovel-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        amqp, mgmt = start_node(tmp / "a", procs)
        run("hutch", amqp, mgmt, args)
        if args.between_nodes:
            dest_amqp, _ = start_node(tmp / "b", procs)
            run("hutch to another hutch over TCP", amqp, mgmt, args, dest_amqp)
        if args.rabbitmq:
            r_amqp, r_mgmt = (int(p) for p in args.rabbitmq.split(":"))
            run("rabbitmq", r_amqp, r_mgmt, args)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def start_node(directory: Path, procs: list[subprocess.Popen[bytes]]) -> tuple[int, int]:
    """A hutch node (not clustered) on port 0 for every listener; the AMQP and management ports it bound,
    from its ports file, once they answer (hutch/portfile.py)."""
    directory.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
    log_path = directory / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0",
                                 "--management-port", "0", "--data-dir", str(directory / "data"),
                                 "--no-cluster"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    procs.append(proc)
    try:
        ports = wait_for_ports(directory / "data", proc, 30, log_path)
    except NodeDidNotStart as exc:
        raise SystemExit(f"hutch-server did not start: {exc}") from None
    return ports["amqp"], ports["management"]


if __name__ == "__main__":
    raise SystemExit(main())
