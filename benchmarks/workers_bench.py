"""Worker processes against one process (docs/scaling.md): throughput and broker CPU per message.

Usage:
    python benchmarks/workers_bench.py [--workers 1,2] [--seconds 8] [--rate 20000] [--tools rawload,perf]
                                       [--shapes unlimited,rate,single] [--declares 200] [--locality on,off] [--queues 8]

For each worker count it starts a `hutch-server --workers N --no-cluster` on port 0 with a fresh data
directory, then runs, with 8 queues, 8 publishers and 8 consumers spread over connections:
- `rawload` unlimited (throughput) and at `--rate` msg/s in all (broker CPU per message),
- `hutch-perf` unlimited with `--queue-pattern` over the same 8 queues (`--processes 2`), and with the `rate`
  shape at `--rate` msg/s in all (its `-r` per producer): the fixed-rate CPU per message by a second generator,
- one queue, one publisher, one consumer (rawload, unlimited): a single queue must not lose,
- `--shapes fanout`: the same one queue behind a fanout exchange (rawload `--fanout 1`): a publisher whose
  first publish goes through a named exchange (connection locality judges it by the exchange's route),
- `--tools churn`: rawload's connection churn (open, channel, confirm.select, one publish, close; 20 at a
  time): what a connection's move costs where it saves nothing,
- `--tools idle`: the node's CPU over 20 s without clients (the background a worker adds: its internal
  Raft group's ticks, stats, heartbeats),
- `--declares N` sequential durable `queue.declare`s from one pika connection (the metadata cost: the
  declare-ok waits for the workers' Raft commit and for every worker to have applied it).
Broker CPU is every process of the node (the supervisor and each worker, read from /proc), so the
supervisor's own cost is in the figure. A rawload run also reports `wakeups_per_msg`: the node's
voluntary context switches (an event loop going to sleep and being woken: one per loop turn that found
nothing more to do) per message received, read from /proc over the middle of the run (from 4 s after its
start to 1 s before its end, divided by the run's receive rate times that time): the per-turn cost a
second worker multiplies. `--locality` runs a node of workers with connection locality on (the default,
`workers.locality = true`: a connection moves to the worker of the queue it first uses) and/or off (every
connection stays where the kernel put it, so messages hop); a one-process node has none. Prints one JSON
line per run. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hutch import portfile

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def running(data: Path, workers: int, locality: bool = True,
            extra: Sequence[str] = ()) -> Iterator[tuple[dict[str, int], list[int]]]:
    """A node of `workers` (port 0, `--no-cluster`, `workers.locality` as given unless `extra`, more flags,
    names a `--config` of its own) for the `with` block: its ports and the pids of its processes (the
    supervisor and each worker); stopped (SIGTERM) when the block ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}
    conf = data.parent / "hutch.conf"
    conf.write_text(f"workers.locality = {'true' if locality else 'false'}\n")
    with open(data.parent / f"server-{workers}.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port",
                                 "0", "--data-dir", str(data), "--no-cluster", "--workers", str(workers),
                                 *(() if "--config" in extra else ("--config", str(conf))), *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            ports = portfile.wait_for_ports(data, proc, 120, data.parent / f"server-{workers}.log")
            pids = [proc.pid]
            for index in range(workers if workers > 1 else 0):
                doc = portfile.read(data / f"w{index}")
                assert doc is not None
                pids.append(int(doc["pid"]))
            yield ports, pids
        finally:
            proc.terminate()
            proc.wait(60)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def wakeups(pids: list[int]) -> int:
    """Voluntary context switches of `pids` so far (the processes of the node)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
    return total


def rawload(port: int, pids: list[int], args: list[str], seconds: int) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, str(HERE / "rawload.py"), "--port", str(port),
                             "--pids", ",".join(map(str, pids)), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    window = max(1.0, seconds - 3.0)  # rawload sets up (~1-2 s) and warms up (2 s) before its window
    time.sleep(4.0)
    first, t0 = wakeups(pids), time.monotonic()
    time.sleep(window)
    woke, took = wakeups(pids) - first, time.monotonic() - t0
    stdout, _stderr = proc.communicate()
    line = stdout.strip().splitlines()[-1] if stdout.strip() else "{}"
    doc: dict[str, Any] = json.loads(line)
    if "connections_per_s" in doc:  # --mode churn
        return {k: doc.get(k) for k in ("connections_per_s", "failed", "broker_cpu_us_per_conn", "broker_cpu_pct",
                                        "errors")}
    out = {k: doc.get(k) for k in ("receive_rate", "publish_rate", "broker_cpu_us_per_msg", "broker_cpu_pct",
                                   "latency_us", "errors")}
    rate = doc.get("receive_rate") or 0
    out["wakeups_per_msg"] = round(woke / (rate * took), 4) if rate else None
    return out


def perf(port: int, pids: list[int], seconds: int, queues: int = 8, rate: int = 0) -> dict[str, Any]:
    """hutch-perf over `queues` queues, unlimited or at `rate` msg/s in all (`-r` is per producer). Broker
    CPU is over the whole run (its connections' set-up and moves included), per message received, and
    over the middle of the run only (`_steady`, with `wakeups_per_msg`, as rawload's are taken)."""
    uri = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    before = cpu_seconds(pids)
    n = str(queues)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.perf", "--uri", uri, "--json", "-x", n, "-y", n,
                             "-s", "16", "-c", "1000", "-q", "1000", "-A", "100", "--queue-pattern", "perf-%d",
                             "--queue-pattern-from", "1", "--queue-pattern-to", n, "--processes", "2",
                             *(("-r", str(rate / queues)) if rate else ()),
                             "-z", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    window = max(1.0, seconds - 4.0)  # as rawload's: the middle of the run (hutch-perf starts in ~1-2 s)
    time.sleep(3.0)
    first, cpu0, t0 = wakeups(pids), cpu_seconds(pids), time.monotonic()
    time.sleep(window)
    woke, cpu_mid, took = wakeups(pids) - first, cpu_seconds(pids) - cpu0, time.monotonic() - t0
    stdout, stderr = proc.communicate()
    cpu = cpu_seconds(pids) - before
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    summary = lines[-1] if lines else {}
    received = int(summary.get("received", 0))
    latency = summary.get("latency_us") or {}
    rate_seen = summary.get("receive_rate") or 0
    return {"receive_rate": summary.get("receive_rate"),
            "broker_cpu_us_per_msg": round(1e6 * cpu / received, 2) if received else None,
            # over the middle of the run only (no connection set-up, declares or moves), as rawload's figure
            "broker_cpu_us_per_msg_steady": round(1e6 * cpu_mid / (rate_seen * took), 2) if rate_seen else None,
            "latency_us": {k: latency.get(k) for k in ("p50", "p99")},
            "wakeups_per_msg": round(woke / (rate_seen * took), 4) if rate_seen else None,
            "errors": stderr[-300:] if proc.returncode else ""}


def declares(port: int, count: int) -> dict[str, Any]:
    import pika  # a test dependency; only this run needs it

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    took: list[float] = []
    for i in range(count):
        t0 = time.perf_counter()
        ch.queue_declare(f"declare-cost-{i}", durable=True)
        took.append(time.perf_counter() - t0)
    for i in range(count):
        ch.queue_delete(f"declare-cost-{i}")
    conn.close()
    took.sort()
    return {"declares_per_s": round(count / sum(took)), "p50_ms": round(1e3 * took[len(took) // 2], 2),
            "p99_ms": round(1e3 * took[int(len(took) * 0.99)], 2)}


def idle(pids: list[int], seconds: float) -> dict[str, Any]:
    """The node's CPU with no client (after 5 s for its start-up work to settle), in % of a core."""
    time.sleep(5.0)
    used, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return {"broker_cpu_pct": round(100 * (cpu_seconds(pids) - used) / (time.monotonic() - t0), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--tools", default="rawload,perf")
    ap.add_argument("--shapes", default="unlimited,rate,single",
                    help="rawload's runs: 8 queues unlimited, 8 queues at --rate, one queue unlimited, one queue behind a fanout (fanout)")
    ap.add_argument("--declares", type=int, default=200, help="sequential durable declares (0: none)")
    ap.add_argument("--queues", type=int, default=8,
                    help="queues, and publishers and consumers, of the many-queue runs (at least the workers)")
    ap.add_argument("--locality", default="on", help="a node of workers with connection locality on, off or on,off")
    args = ap.parse_args()
    tools = args.tools.split(",")
    common = ["-s", "16", "-c", "1000", "-q", "1000", "-A", "100", "-z", str(args.seconds), "--warmup", "2"]
    nodes = [(w, loc == "on") for w in (int(w) for w in args.workers.split(","))
             for loc in (args.locality.split(",") if w > 1 else ["on"])]
    for workers, locality in nodes:
        with tempfile.TemporaryDirectory(prefix="hutch-workers-") as tmp:
            data = Path(tmp) / "data"
            data.mkdir()
            with running(data, workers, locality) as (ports, pids):
                runs: list[tuple[str, dict[str, Any]]] = []
                if "rawload" in tools:
                    n = str(args.queues)
                    eight = ["-x", n, "-y", n, "--queues", n, "--processes", "2", *common]
                    shapes = args.shapes.split(",")
                    if "unlimited" in shapes:
                        runs.append((f"rawload {n}q unlimited", rawload(ports["amqp"], pids, eight, args.seconds)))
                    if "rate" in shapes:
                        runs.append((f"rawload {n}q at {args.rate}/s",
                                     rawload(ports["amqp"], pids, [*eight, "-r", str(args.rate)], args.seconds)))
                    if "single" in shapes:
                        runs.append(("rawload 1q unlimited",
                                     rawload(ports["amqp"], pids, ["-x", "1", "-y", "1", *common], args.seconds)))
                    if "fanout" in shapes:  # the first publish goes through a named exchange (locality)
                        runs.append(("rawload 1q behind a fanout, unlimited",
                                     rawload(ports["amqp"], pids, ["-x", "1", "-y", "1", "--fanout", "1", *common],
                                             args.seconds)))
                if args.declares:
                    runs.append((f"{args.declares} durable declares", declares(ports["amqp"], args.declares)))
                if "perf" in tools:
                    if "unlimited" in args.shapes.split(","):
                        runs.append((f"hutch-perf {args.queues}q unlimited", perf(ports["amqp"], pids, args.seconds,
                                                                                   args.queues)))
                    if "rate" in args.shapes.split(","):
                        runs.append((f"hutch-perf {args.queues}q at {args.rate}/s",
                                     perf(ports["amqp"], pids, args.seconds, args.queues, args.rate)))
                if "churn" in tools:  # connections that publish one message each: a move costs, saves nothing
                    runs.append(("rawload churn", rawload(ports["amqp"], pids, ["--mode", "churn", "--concurrency", "20",
                                                                           "-z", str(args.seconds)], args.seconds)))
                if "idle" in tools:
                    runs.append(("idle 20 s", idle(pids, 20.0)))
                for name, result in runs:
                    print(json.dumps({"workers": workers, "locality": locality and workers > 1, "run": name,
                                      "time": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg()[0], **result}),
                          flush=True)


if __name__ == "__main__":
    main()
