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
ratio hutch ÷ RabbitMQ of the pair measured in the same minute. Over AMQP each run also records the
broker's CPU (`cpu_cores`, 1.0 = one core for the whole window) and the time its threads were runnable
but waiting for a CPU (`runq_wait_cores`), from /proc/PID/task/*/schedstat: on a shared machine that says
whether a broker was held back by its share of the CPUs rather than by its own work. `--brokers hutch`
with `--label` measures one tree or option against another (A/B) on the same generators. With
`--hutch-cluster-dir DIR` (a cluster of three started by benchmarks/stream_cluster.py; stream protocol
only) each run is also made against the cluster's first node, the writer of the stream the generator creates there (its CPU: the three
nodes' sum), and the row adds its figures and its ratio to RabbitMQ's one node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

HERE = Path(__file__).resolve().parent
PY = sys.executable
PERF = str(Path(PY).with_name("hutch-perf"))


def schedstat(pids: list[int]) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) summed over every thread of `pids`
    (/proc/PID/task/TID/schedstat): how much of the machine a broker got, and how much it wanted more."""
    cpu = wait = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:
                continue
            cpu += int(fields[0])
            wait += int(fields[1])
    return cpu / 1e9, wait / 1e9


class ShareSampler:
    """The broker's CPU share and run-queue wait over [start + skip, start + skip + window) of a run,
    sampled in a thread while the generator runs (in cores: 1.0 is one core busy the whole window)."""

    def __init__(self, pids: list[int], skip_s: float, window_s: float) -> None:
        self.pids, self.skip_s, self.window_s = pids, skip_s, window_s
        self.result: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(self.skip_s)
        cpu0, wait0 = schedstat(self.pids)
        t0 = time.monotonic()
        time.sleep(self.window_s)
        cpu1, wait1 = schedstat(self.pids)
        span = time.monotonic() - t0
        self.result = {"cpu_cores": round((cpu1 - cpu0) / span, 3), "runq_wait_cores": round((wait1 - wait0) / span, 3),
                       "cpu_s": round(cpu1 - cpu0, 3)}

    def finish(self, r: dict[str, Any], messages_per_s: float | None) -> dict[str, Any]:
        self._thread.join(timeout=self.skip_s + self.window_s + 5)
        r.update(self.result)
        if messages_per_s and "cpu_cores" in self.result and "broker_cpu_us_per_msg" not in r:
            r["broker_cpu_us_per_msg"] = round(1e6 * self.result["cpu_cores"] / messages_per_s, 2)
        return r


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


def amqp_run(tool: str, port: int, pids: list[int], size: int, seconds: float, tag: str, rate: int = 0) -> dict[str, Any]:
    """One AMQP 0-9-1 run; `pids`: every process of the broker (a node of several workers: all of them);
    `rate`: the publisher's fixed rate in msg/s (0: as fast as the confirm window allows)."""
    if tool == "rawload":
        share = ShareSampler(pids, 3.0, seconds - 2)  # (rawload's spawn and warm-up, then inside its window)
        r = run_json([PY, str(HERE / "rawload.py"), "--port", str(port), "--pids", ",".join(map(str, pids)),
                      "--stream", "next", "-x1", "-y1", "-s", str(size), "-c1000", "-q500", "-A250", "-z", str(seconds),
                      "--warmup", "2", "-r", str(rate)], seconds + 90)
        if "error" in r:
            return r
        lat = r.get("latency_us", {})
        return share.finish({"published_per_s": r.get("confirm_rate"), "consumed_per_s": r.get("receive_rate"),
                             "latency_ms_p50": round(lat.get("p50", 0) / 1000, 1),
                             "latency_ms_p99": round(lat.get("p99", 0) / 1000, 1),
                             "broker_cpu_us_per_msg": r.get("broker_cpu_us_per_msg"),
                             "broker_rss_mib": r.get("broker_rss_mib")}, None)
    queue = f"h23perf-{tag}"
    declare_stream(port, queue)
    try:
        share = ShareSampler(pids, 2.0, seconds - 3)
        r = run_json([PERF, "--uri", f"amqp://guest:guest@127.0.0.1:{port}/%2F", "-u", queue, "-x", "1", "-y", "1",
                      "-q", "500", "-A", "250", "-c", "1000", "-s", str(size), "-z", str(int(seconds)), "-r", str(rate), "--json"],
                     seconds + 90)
    finally:
        declare_stream(port, queue, delete=True)
    if "error" in r:
        return r
    lat = r.get("latency_us", {})
    return share.finish({"published_per_s": r.get("confirm_rate"), "consumed_per_s": r.get("receive_rate"),
                         "latency_ms_p50": round(lat.get("p50", 0) / 1000, 1),
                         "latency_ms_p99": round(lat.get("p99", 0) / 1000, 1)}, r.get("receive_rate"))


def measure(out: Any, protocol: str, tool: str, size: int, rnd: int, broker: str, b: dict[str, Any],
            seconds: float, label: str) -> None:
    """One run of `tool` against broker `b` ({"stream", "amqp": ports, "pid": "P[,P...]", "pids": [...]}):
    its JSON line appended to `out` and printed."""
    load = os.getloadavg()[0]
    started = time.strftime("%H:%M:%S", time.gmtime())
    if protocol == "stream":
        r = stream_run(tool, b["stream"], b["pid"], size, seconds)
    else:
        r = amqp_run(tool, b["amqp"], b["pids"], size, seconds, f"{rnd}-{size}-{broker}")
    line = {"protocol": protocol, "tool": tool, "size": size, "round": rnd, "broker": broker,
            "utc": started, "loadavg_before": round(load, 2), "label": label, "r": r}
    out.write(json.dumps(line) + "\n")
    out.flush()
    print(json.dumps(line), flush=True)


def plan(protocols: list[str], sizes: list[int]) -> list[tuple[str, int, str]]:
    """(protocol, size, generator) of a round, in the order they run: two generators per protocol."""
    return [(protocol, size, tool) for protocol in protocols for size in sizes
            for tool in (["stream_rawload", "rstream"] if protocol == "stream" else ["rawload", "hutch-perf"])]


def load_rows(path: str, keep: Callable[[dict[str, Any]], bool]) -> dict[tuple[str, int, str, int, str], dict[str, Any]]:
    """The results file's runs that `keep` takes, by (protocol, size, generator, round, label), then broker."""
    rows: dict[tuple[str, int, str, int, str], dict[str, Any]] = {}
    with open(path) as f:
        for raw in f:
            d = json.loads(raw)
            if keep(d):
                rows.setdefault((d["protocol"], d["size"], d["tool"], d["round"], d.get("label", "")), {})[d["broker"]] = d
    return rows


def pair_cells(protocol: str, size: int, tool: str, rnd: int, h: dict[str, Any], q: dict[str, Any]) -> str:
    """The summary row's cells for hutch's run `h` and RabbitMQ's `q` of one (protocol, size, tool, round):
    load, both figures, the ratios, latencies and CPU per message."""
    hr, qr = h["r"], q["r"]
    pub = "confirmed_per_s" if protocol == "stream" else "published_per_s"
    p50, p99 = ("confirm_ms_p50", "confirm_ms_p99") if protocol == "stream" else ("latency_ms_p50", "latency_ms_p99")
    ratios = [f"{hr[k] / qr[k]:.2f}" if qr.get(k) else "-" for k in (pub, "consumed_per_s")]
    return (f"| {protocol} | {size} B | {tool} | {rnd} | {h['loadavg_before']} / {q['loadavg_before']} "
            f"| {hr[pub]:,} / {hr['consumed_per_s']:,} | {qr[pub]:,} / {qr['consumed_per_s']:,} "
            f"| {ratios[0]} / {ratios[1]} | {hr[p50]} / {hr[p99]} | {qr[p50]} / {qr[p99]} "
            f"| {hr.get('broker_cpu_us_per_msg', '-')} / {qr.get('broker_cpu_us_per_msg', '-')} |")


def run(args: argparse.Namespace) -> None:
    data = Path(args.hutch_data_dir)
    ports = json.loads((data / "ports.json").read_text())
    hutch_pids = [ports["pid"]]  # and a node of worker processes: each worker's (data/wN/ports.json)
    hutch_pids += [json.loads(w.read_text())["pid"] for w in sorted(data.glob("w*/ports.json"))]
    brokers = {"hutch": {"stream": ports["listeners"]["stream"], "amqp": ports["listeners"]["amqp"], "pids": hutch_pids},
               "rabbitmq": {"stream": 5552, "amqp": 5672, "pids": [args.rabbit_pid]}}
    if args.hutch_cluster_dir:  # benchmarks/stream_cluster.py's nodes: connect to n1 (the writer), CPU of all
        nodes = json.loads((Path(args.hutch_cluster_dir) / "cluster.json").read_text())["nodes"]
        brokers["hutch-3n"] = {"stream": nodes[0]["stream"], "amqp": nodes[0]["amqp"],
                               "pids": [n["pid"] for n in nodes]}
    # stream_run takes one pid or a comma-separated list (CPU summed over them)
    brokers = {k: {**v, "pid": ",".join(str(p) for p in v["pids"])} for k, v in brokers.items()}
    sizes = [int(s) for s in args.sizes.split(",")]
    protocols = args.protocols.split(",")
    only = args.brokers.split(",")
    with open(args.out, "a") as out:
        for rnd in range(args.first_round, args.first_round + args.rounds):
            order = [b for b in ("hutch-3n", "hutch", "rabbitmq") if b in brokers]
            order = order if rnd % 2 else order[::-1]
            for protocol, size, tool in plan(protocols, sizes):
                for broker in [b for b in order if b in only or b == "hutch-3n"]:
                    if broker == "hutch-3n" and protocol != "stream":
                        continue
                    measure(out, protocol, tool, size, rnd, broker, brokers[broker], args.seconds, args.label)


def summary(args: argparse.Namespace) -> None:
    rows = load_rows(args.results, lambda d: "protocol" in d)
    print("| protocol | size | generator | round | load | hutch pub / cons msg/s | RabbitMQ pub / cons msg/s "
          "| ratio pub / cons | hutch p50 / p99 ms | RabbitMQ p50 / p99 ms | CPU µs/msg hutch / RabbitMQ "
          "| CPU cores (run-queue wait) hutch / RabbitMQ | hutch 3 nodes pub / cons msg/s, ratio pub, p50 / p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (protocol, size, tool, rnd, _), pair in sorted(rows.items()):
        h, q = pair.get("hutch"), pair.get("rabbitmq")
        if not h or not q or "error" in h["r"] or "error" in q["r"]:
            continue
        hr, qr = h["r"], q["r"]
        pub = "confirmed_per_s" if protocol == "stream" else "published_per_s"
        p50, p99 = ("confirm_ms_p50", "confirm_ms_p99") if protocol == "stream" else ("latency_ms_p50", "latency_ms_p99")
        share = " / ".join(f"{r.get('cpu_cores', '-')} ({r.get('runq_wait_cores', '-')})" for r in (hr, qr))
        three = pair.get("hutch-3n")
        cluster = "-"
        if three and "error" not in three["r"]:
            tr = three["r"]
            cluster = (f"{tr[pub]:,} / {tr['consumed_per_s']:,}, {tr[pub] / qr[pub]:.2f}, {tr[p50]} / {tr[p99]}"
                       if qr.get(pub) else "-")
        print(f"{pair_cells(protocol, size, tool, rnd, h, q)} {share} | {cluster} |")


def cli(doc: str, rounds: int, brokers: Callable[[argparse.ArgumentParser], None],
        run_fn: Callable[[argparse.Namespace], None], summary_fn: Callable[[argparse.Namespace], None]) -> None:
    """The `run` / `summary` command line of a streams comparison: `brokers` adds the options that say
    which brokers a run measures, the rest (rounds, sizes, protocols, seconds, out, label) is common."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    brokers(r)
    r.add_argument("--rounds", type=int, default=rounds)
    r.add_argument("--first-round", type=int, default=1, help="the number of the first round (the order "
                                                              "alternates on it: several short sittings)")
    r.add_argument("--sizes", default="16,1000")
    r.add_argument("--protocols", default="stream,amqp")
    r.add_argument("--seconds", type=float, default=8.0)
    r.add_argument("--out", required=True)
    r.add_argument("--label", default="", help="a free-text tag written into each line (the tree, the options)")
    s = sub.add_parser("summary")
    s.add_argument("--results", required=True)
    args = ap.parse_args()
    run_fn(args) if args.cmd == "run" else summary_fn(args)


def _brokers(r: argparse.ArgumentParser) -> None:
    r.add_argument("--hutch-data-dir", required=True)
    r.add_argument("--rabbit-pid", type=int, required=True)
    r.add_argument("--hutch-cluster-dir", help="also a hutch cluster started by benchmarks/stream_cluster.py "
                                               "(stream protocol only; runs first in odd rounds)")
    r.add_argument("--brokers", default="hutch,rabbitmq", help="which of the two to run (comma-separated)")


if __name__ == "__main__":
    cli(__doc__, 3, _brokers, run, summary)
