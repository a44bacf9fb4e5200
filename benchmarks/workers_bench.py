"""Worker processes against one process (docs/scaling.md): throughput and broker CPU per message.

Usage:
    python benchmarks/workers_bench.py [--workers 1,2] [--seconds 8] [--rate 20000] [--tools rawload,perf]
                                       [--shapes unlimited,rate,single] [--declares 200] [--locality on,off] [--queues 8]
                                       [--placement spread,one] [--rounds 1]

For each worker count it starts a `hutch-server --workers N --no-cluster` on port 0 with a fresh data
directory, then runs, with 8 queues, 8 publishers and 8 consumers spread over connections:
- `rawload` unlimited (throughput) and at `--rate` msg/s in all (broker CPU per message),
- `hutch-perf` unlimited with `--queue-pattern` over the same 8 queues (`--processes 2`, or `--perf-processes N`), and with the `rate`
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
- `--placement one`: a node of workers with every queue of the runs in worker 0 (before the runs the
  bench gives every other worker `--queues` idle queues of its own, `fill-*`, so that the fewest-queues
  placement puts the runs' queues in worker 0, and connection locality moves their connections there):
  the other workers idle, to tell a cost of splitting the traffic from a per-message cost of worker mode
  (`spread`, the default, is the placement as a user gets it),
- `--rounds N`: the whole sequence N times (`--workers 1,2`: one process and two workers interleaved),
- `--broker-cpus`, `--client-cpus`: the node's processes and the load generators' on these cores only
  (CPU affinity; on a bigger machine, the generators apart from the node).
Broker CPU is every process of the node (the supervisor and each worker, read from /proc), so the
supervisor's own cost is in the figure; `cpu_pct_by_process` is each process's share of a core (the
supervisor first, then worker 0, 1, ...) and `kernel_share` the system time's share of the node's CPU,
both over the same middle of the run as `wakeups_per_msg`. A rawload run also reports `wakeups_per_msg`: the node's
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
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hutch import portfile

HERE = Path(__file__).resolve().parent
CPUS: dict[str, set[int]] = {"broker": set(), "clients": set()}  # `--broker-cpus`, `--client-cpus` (empty: any)


def pin(role: str) -> Any:
    """The `preexec_fn` that runs a child (and so its children) on `role`'s cores, or None."""
    cpus = CPUS[role]
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


@contextlib.contextmanager
def running(data: Path, workers: int, locality: bool = True, extra: Sequence[str] = (),
            compaction: bool = False) -> Iterator[tuple[dict[str, int], list[int]]]:
    """A node of `workers` (port 0, `--no-cluster`, `workers.locality` as given unless `extra`, more flags,
    names a `--config` of its own) for the `with` block: its ports and the pids of its processes (the
    supervisor and each worker); stopped (SIGTERM) when the block ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}
    conf = data.parent / "hutch.conf"
    conf.write_text(f"workers.locality = {'true' if locality else 'false'}\n"
                    f"workers.compaction = {'true' if compaction else 'false'}\n")
    with open(data.parent / f"server-{workers}.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port",
                                 "0", "--data-dir", str(data), "--no-cluster", "--workers", str(workers),
                                 *(() if "--config" in extra else ("--config", str(conf))), *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=pin("broker"))
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


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system (kernel) CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pids: list[int]) -> float:
    return sum(sum(cpu_times(pid)) for pid in pids)


def run_seconds(pid: int) -> float:
    """The time process `pid`'s threads have run so far, to the nanosecond (the scheduler's own account,
    /proc/PID/task/*/schedstat; /proc/PID/stat counts in 10 ms ticks, too coarse for an idle worker)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def cpu_each(pids: list[int]) -> list[tuple[float, float, float]]:
    """User and system CPU seconds of each of `pids` so far, and its run time (`run_seconds`)."""
    return [(*cpu_times(pid), run_seconds(pid)) for pid in pids]


def window_cpu(each0: list[tuple[float, float, float]], each1: list[tuple[float, float, float]],
               took: float) -> dict[str, Any]:
    """Over a window of `took` s: each process's CPU in % of a core (its run time), and the kernel's share
    of the node's CPU (system over user and system)."""
    pct = [round(100 * (b[2] - a[2]) / took, 3) for a, b in zip(each0, each1, strict=True)]
    used = sum(u + s for u, s, _ in each1) - sum(u + s for u, s, _ in each0)
    kernel = sum(s for _, s, _ in each1) - sum(s for _, s, _ in each0)
    return {"cpu_pct_by_process": pct, "kernel_share": round(kernel / used, 3) if used else None}


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
                            stderr=subprocess.PIPE, text=True, preexec_fn=pin("clients"))
    window = max(1.0, seconds - 3.0)  # rawload sets up (~1-2 s) and warms up (2 s) before its window
    time.sleep(4.0)
    first, each0, t0 = wakeups(pids), cpu_each(pids), time.monotonic()
    time.sleep(window)
    woke, each1, took = wakeups(pids) - first, cpu_each(pids), time.monotonic() - t0
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
    return {**out, **window_cpu(each0, each1, took)}


def perf(port: int, pids: list[int], seconds: int, queues: int = 8, rate: int = 0,
         processes: int = 2) -> dict[str, Any]:
    """hutch-perf over `queues` queues, unlimited or at `rate` msg/s in all (`-r` is per producer), its
    producers and consumers in `processes` client processes (`--perf-processes`). Broker
    CPU is over the whole run (its connections' set-up and moves included), per message received, and
    over the middle of the run only (`_steady`, with `wakeups_per_msg`, as rawload's are taken)."""
    uri = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    before = cpu_seconds(pids)
    n = str(queues)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.perf", "--uri", uri, "--json", "-x", n, "-y", n,
                             "-s", "16", "-c", "1000", "-q", "1000", "-A", "100", "--queue-pattern", "perf-%d",
                             "--queue-pattern-from", "1", "--queue-pattern-to", n, "--processes", str(processes),
                             *(("-r", str(rate / queues)) if rate else ()),
                             "-z", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pin("clients"))
    window = max(1.0, seconds - 4.0)  # as rawload's: the middle of the run (hutch-perf starts in ~1-2 s)
    time.sleep(3.0)
    first, each0, t0 = wakeups(pids), cpu_each(pids), time.monotonic()
    time.sleep(window)
    woke, each1, took = wakeups(pids) - first, cpu_each(pids), time.monotonic() - t0
    cpu_mid = sum(u + s for u, s, _ in each1) - sum(u + s for u, s, _ in each0)
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
            **window_cpu(each0, each1, took),
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


def fill_others(ports: dict[str, int], workers: int, queues: int) -> None:
    """Give every worker but worker 0 `queues` idle queues (`fill-*`), so that the fewest-queues placement
    puts the next `queues` queues in worker 0 (`--placement one`): `workers` × `queues` declares give each
    worker `queues`, then the ones in worker 0 (the management API's `worker` field) are deleted."""
    import base64
    import urllib.request

    import pika  # a test dependency; only this run needs it

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ports["amqp"]))
    ch = conn.channel()
    for i in range(workers * queues):
        ch.queue_declare(f"fill-{i}")
    req = urllib.request.Request(f"http://127.0.0.1:{ports['management']}/api/queues/%2F",
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as answer:
        listed = json.load(answer)
    for q in listed:
        if q["name"].startswith("fill-") and q.get("worker") == 0:
            ch.queue_delete(q["name"])
    conn.close()


def idle(pids: list[int], seconds: float) -> dict[str, Any]:
    """The node's CPU with no client (after 5 s for its start-up work to settle), in % of a core."""
    time.sleep(5.0)
    each0, woke0, t0 = cpu_each(pids), wakeups(pids), time.monotonic()
    time.sleep(seconds)
    each1, woke, took = cpu_each(pids), wakeups(pids) - woke0, time.monotonic() - t0
    used = sum(run for _, _, run in each1) - sum(run for _, _, run in each0)
    return {"broker_cpu_pct": round(100 * used / took, 3), "wakeups_per_s": round(woke / took, 1),
            **window_cpu(each0, each1, took)}


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
    ap.add_argument("--placement", default="spread",
                    help="a node of workers with the queues spread over the workers (spread), all in worker 0 "
                         "(one), or both (spread,one)")
    ap.add_argument("--compaction", default="off",
                    help="a node of workers with compaction of load (workers.compaction) off, on or off,on")
    ap.add_argument("--rounds", type=int, default=1, help="run the whole sequence this many times")
    ap.add_argument("--broker-cpus", default="", help="run the node on these cores (comma-separated; default any)")
    ap.add_argument("--client-cpus", default="", help="run the load generators on these cores (default any)")
    ap.add_argument("--keep-logs", default="",
                    help="copy each node's log into this directory (round-workers-placement-compaction.log)")
    ap.add_argument("--perf-processes", type=int, default=2,
                    help="hutch-perf's client processes (its producers and consumers shared out over them)")
    args = ap.parse_args()
    CPUS["broker"] = {int(c) for c in args.broker_cpus.split(",") if c}
    CPUS["clients"] = {int(c) for c in args.client_cpus.split(",") if c}
    tools = args.tools.split(",")
    common = ["-s", "16", "-c", "1000", "-q", "1000", "-A", "100", "-z", str(args.seconds), "--warmup", "2"]
    nodes = [(r, w, loc == "on", place, comp == "on") for r in range(args.rounds)
             for w in (int(w) for w in args.workers.split(","))
             for loc in (args.locality.split(",") if w > 1 else ["on"])
             for place in (args.placement.split(",") if w > 1 else ["spread"])
             for comp in (args.compaction.split(",") if w > 1 else ["off"])]
    seen: list[tuple[int, tuple[int, bool, str], str, dict[str, Any]]] = []
    for rnd, workers, locality, placement, compaction in nodes:
        with tempfile.TemporaryDirectory(prefix="hutch-workers-") as tmp:
            data = Path(tmp) / "data"
            data.mkdir()
            with running(data, workers, locality, compaction=compaction) as (ports, pids):
                if placement == "one":
                    fill_others(ports, workers, args.queues)
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
                        runs.append((f"hutch-perf {args.queues}q unlimited",
                                     perf(ports["amqp"], pids, args.seconds, args.queues,
                                          processes=args.perf_processes)))
                    if "rate" in args.shapes.split(","):
                        runs.append((f"hutch-perf {args.queues}q at {args.rate}/s",
                                     perf(ports["amqp"], pids, args.seconds, args.queues, args.rate,
                                          args.perf_processes)))
                if "churn" in tools:  # connections that publish one message each: a move costs, saves nothing
                    runs.append(("rawload churn", rawload(ports["amqp"], pids, ["--mode", "churn", "--concurrency", "20",
                                                                           "-z", str(args.seconds)], args.seconds)))
                if "idle" in tools:
                    runs.append(("idle 20 s", idle(pids, 20.0)))
                for name, result in runs:
                    seen.append((rnd, (workers, locality, placement + ("+compaction" if compaction else "")), name,
                                 result))
                    pinned = {f"{role}_cpus": sorted(cpus) for role, cpus in CPUS.items() if cpus}
                    print(json.dumps({"workers": workers, "locality": locality and workers > 1, **pinned,
                                      "seconds": args.seconds,
                                      **({"placement": placement, "compaction": compaction} if workers > 1 else {}),
                                      "run": name,
                                      "time": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg()[0], **result}),
                          flush=True)
            if args.keep_logs:  # (after the node stopped: its log is whole)
                keep = Path(args.keep_logs)
                keep.mkdir(parents=True, exist_ok=True)
                name = f"{rnd}-{workers}-{placement}-{'on' if compaction else 'off'}.log"
                shutil.copyfile(data.parent / f"server-{workers}.log", keep / name)

    if args.rounds > 1:
        for line in ratios(seen):
            print(json.dumps(line), flush=True)


def ratios(seen: list[tuple[int, tuple[int, bool, str], str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run and node shape, the broker CPU per message of each round over one process's in the same
    round (`--rounds`): every ratio, their median, min and max, and how many are above 1.10 (issue 26's
    goal (b))."""
    base = {(rnd, name): r for rnd, (w, _, _), name, r in seen if w == 1}
    out: dict[tuple[str, tuple[int, bool, str], str], list[float]] = {}
    for rnd, shape, name, r in seen:
        one = base.get((rnd, name))
        if shape[0] == 1 or one is None:
            continue
        for key in ("broker_cpu_us_per_msg", "broker_cpu_us_per_msg_steady"):
            if r.get(key) and one.get(key):
                out.setdefault((name, shape, key), []).append(round(r[key] / one[key], 3))
    lines = []
    for (name, (workers, locality, placement), key), values in out.items():
        ordered = sorted(values)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        lines.append({"summary": name, "workers": workers, "locality": locality, "placement": placement,
                      "figure": key, "ratios": values, "median": round(median, 3), "min": ordered[0],
                      "max": ordered[-1], "above_1_10": sum(v > 1.10 for v in values)})
    return lines


if __name__ == "__main__":
    main()
