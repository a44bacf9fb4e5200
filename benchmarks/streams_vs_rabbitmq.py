"""Streams, hutch against RabbitMQ 3.10.8 in one sitting (issue 23): two generators per protocol, alternating brokers.

    python benchmarks/streams_vs_rabbitmq.py run --hutch-data-dir DIR --rabbit-pid PID \\
        --rounds 3 --sizes 16,1000 --protocols stream,amqp --seconds 8 --out results.jsonl
    python benchmarks/streams_vs_rabbitmq.py summary --results results.jsonl

`run` reads the running hutch node's ports and pid from `DIR/ports.json` (start it with `hutch-server
--data-dir DIR --amqp-port 0 --stream-port 0 --management-port 0 --no-cluster`); RabbitMQ is the one on
127.0.0.1 (5552 stream, 5672 AMQP; `--rabbit-pid` is its beam.smp, for CPU and RSS). For each round,
size and protocol it runs both generators against both brokers, one after the other (hutch first in odd
rounds, RabbitMQ first in even ones), and appends one JSON line per run with the machine's load average
before it:

- stream protocol: benchmarks/stream_rawload.py (raw frames, hutch's codec) and benchmarks/stream_rstream.py
  (rstream), `-x 1 -y 1 -b 100 -w 20000`: confirmed and consumed msg/s, confirm latency and delivery
  latency p50/p99;
- AMQP 0-9-1: benchmarks/rawload.py (`--stream next`, its own codec) and hutch-perf on a stream declared
  with pika, window 1,000, prefetch 500, ack every 250: published and consumed msg/s, publish-to-delivery
  latency p50/p99.

`summary` prints one table row per (protocol, size, generator, round): both brokers' figures and the
ratio hutch ÷ RabbitMQ of the pair measured in the same minute. With `--hutch-cluster-dir DIR` (a cluster
of three started by benchmarks/stream_cluster.py; stream protocol only) each run is also made against
the cluster's first node, the writer of the stream the generator creates there (its CPU: the three
nodes' sum), and the row adds its figures and its ratio to RabbitMQ's one node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika

HERE = Path(__file__).resolve().parent
PY = sys.executable
PERF = str(Path(PY).with_name("hutch-perf"))


def run_json(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-800:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def declare_stream(port: int, name: str, delete: bool = False) -> None:
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    if delete:
        ch.queue_delete(name)
    else:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()


def stream_run(tool: str, port: int, pid: int | str, size: int, seconds: float) -> dict[str, Any]:
    script = "stream_rawload.py" if tool == "stream_rawload" else "stream_rstream.py"
    return run_json([PY, str(HERE / script), "--port", str(port), "-x", "1", "-y", "1", "-s", str(size), "-b", "100",
                     "-w", "20000", "-z", str(seconds), "--pid", str(pid)], seconds + 90)


def amqp_run(tool: str, port: int, pid: int, size: int, seconds: float, tag: str) -> dict[str, Any]:
    if tool == "rawload":
        r = run_json([PY, str(HERE / "rawload.py"), "--port", str(port), "--pids", str(pid), "--stream", "next",
                      "-x1", "-y1", "-s", str(size), "-c1000", "-q500", "-A250", "-z", str(seconds),
                      "--warmup", "2"], seconds + 90)
        if "error" in r:
            return r
        lat = r.get("latency_us", {})
        return {"published_per_s": r.get("confirm_rate"), "consumed_per_s": r.get("receive_rate"),
                "latency_ms_p50": round(lat.get("p50", 0) / 1000, 1), "latency_ms_p99": round(lat.get("p99", 0) / 1000, 1),
                "broker_cpu_us_per_msg": r.get("broker_cpu_us_per_msg"), "broker_rss_mib": r.get("broker_rss_mib")}
    queue = f"h23perf-{tag}"
    declare_stream(port, queue)
    try:
        r = run_json([PERF, "--uri", f"amqp://guest:guest@127.0.0.1:{port}/%2F", "-u", queue, "-x", "1", "-y", "1",
                      "-q", "500", "-A", "250", "-c", "1000", "-s", str(size), "-z", str(int(seconds)), "--json"],
                     seconds + 90)
    finally:
        declare_stream(port, queue, delete=True)
    if "error" in r:
        return r
    lat = r.get("latency_us", {})
    return {"published_per_s": r.get("confirm_rate"), "consumed_per_s": r.get("receive_rate"),
            "latency_ms_p50": round(lat.get("p50", 0) / 1000, 1), "latency_ms_p99": round(lat.get("p99", 0) / 1000, 1)}


def run(args: argparse.Namespace) -> None:
    ports = json.loads((Path(args.hutch_data_dir) / "ports.json").read_text())
    brokers: dict[str, dict[str, Any]] = {
        "hutch": {"stream": ports["listeners"]["stream"], "amqp": ports["listeners"]["amqp"], "pid": ports["pid"]},
        "rabbitmq": {"stream": 5552, "amqp": 5672, "pid": args.rabbit_pid}}
    if args.hutch_cluster_dir:  # benchmarks/stream_cluster.py's nodes: connect to n1 (the writer), CPU of all
        nodes = json.loads((Path(args.hutch_cluster_dir) / "cluster.json").read_text())["nodes"]
        brokers["hutch-3n"] = {"stream": nodes[0]["stream"], "amqp": nodes[0]["amqp"],
                               "pid": ",".join(str(n["pid"]) for n in nodes)}
    sizes = [int(s) for s in args.sizes.split(",")]
    protocols = args.protocols.split(",")
    with open(args.out, "a") as out:
        for rnd in range(args.first_round, args.first_round + args.rounds):
            order = [b for b in ("hutch-3n", "hutch", "rabbitmq") if b in brokers]
            order = order if rnd % 2 else order[::-1]
            for protocol in protocols:
                tools = ["stream_rawload", "rstream"] if protocol == "stream" else ["rawload", "hutch-perf"]
                for size in sizes:
                    for tool in tools:
                        for broker in order:
                            if broker == "hutch-3n" and protocol != "stream":
                                continue
                            b = brokers[broker]
                            load = os.getloadavg()[0]
                            started = time.strftime("%H:%M:%S", time.gmtime())
                            if protocol == "stream":
                                r = stream_run(tool, b["stream"], b["pid"], size, args.seconds)
                            else:
                                r = amqp_run(tool, b["amqp"], b["pid"], size, args.seconds, f"{rnd}-{size}-{broker}")
                            line = {"protocol": protocol, "tool": tool, "size": size, "round": rnd, "broker": broker,
                                    "utc": started, "loadavg_before": round(load, 2), "r": r}
                            out.write(json.dumps(line) + "\n")
                            out.flush()
                            print(json.dumps(line), flush=True)


def summary(args: argparse.Namespace) -> None:
    rows: dict[tuple[str, int, str, int], dict[str, Any]] = {}
    with open(args.results) as f:
        for raw in f:
            d = json.loads(raw)
            if "protocol" in d:
                rows.setdefault((d["protocol"], d["size"], d["tool"], d["round"]), {})[d["broker"]] = d
    print("| protocol | size | generator | round | load | hutch pub / cons msg/s | RabbitMQ pub / cons msg/s "
          "| ratio pub / cons | hutch p50 / p99 ms | RabbitMQ p50 / p99 ms | hutch 3 nodes pub / cons msg/s, "
          "ratio pub, p50 / p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (protocol, size, tool, rnd), pair in sorted(rows.items()):
        h, q = pair.get("hutch"), pair.get("rabbitmq")
        if not h or not q or "error" in h["r"] or "error" in q["r"]:
            continue
        hr, qr = h["r"], q["r"]
        pub = "confirmed_per_s" if protocol == "stream" else "published_per_s"
        p50, p99 = ("confirm_ms_p50", "confirm_ms_p99") if protocol == "stream" else ("latency_ms_p50", "latency_ms_p99")
        ratios = [f"{hr[k] / qr[k]:.2f}" if qr.get(k) else "-" for k in (pub, "consumed_per_s")]
        three = pair.get("hutch-3n")
        cluster = "-"
        if three and "error" not in three["r"]:
            tr = three["r"]
            cluster = (f"{tr[pub]:,} / {tr['consumed_per_s']:,}, {tr[pub] / qr[pub]:.2f}, {tr[p50]} / {tr[p99]}"
                       if qr.get(pub) else "-")
        print(f"| {protocol} | {size} B | {tool} | {rnd} | {h['loadavg_before']} / {q['loadavg_before']} "
              f"| {hr[pub]:,} / {hr['consumed_per_s']:,} | {qr[pub]:,} / {qr['consumed_per_s']:,} "
              f"| {ratios[0]} / {ratios[1]} | {hr[p50]} / {hr[p99]} | {qr[p50]} / {qr[p99]} | {cluster} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--hutch-data-dir", required=True)
    r.add_argument("--rabbit-pid", type=int, required=True)
    r.add_argument("--hutch-cluster-dir", help="also a hutch cluster started by benchmarks/stream_cluster.py "
                                               "(stream protocol only; runs first in odd rounds)")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--first-round", type=int, default=1, help="the number of the first round (the order "
                                                              "alternates on it: several short sittings)")
    r.add_argument("--sizes", default="16,1000")
    r.add_argument("--protocols", default="stream,amqp")
    r.add_argument("--seconds", type=float, default=8.0)
    r.add_argument("--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("--results", required=True)
    args = ap.parse_args()
    run(args) if args.cmd == "run" else summary(args)


if __name__ == "__main__":
    main()
