"""Issue 17's scenarios, hutch against RabbitMQ 3.10.8 in one sitting (docs/BENCHMARKS.md, "issue 17").

Starts hutch from a source tree (`--hutch-src`, default this tree's src/) on free ports: one node
(`--no-cluster` when the server has that flag, unless `--hutch-cluster-of-one`; else a cluster of one
with a cluster port, as `make run` starts it; always a cluster of one for the 1-node quorum scenarios,
since quorum queues need a clustered node) and, for the 3-node quorum scenarios, a 3-node cluster. RabbitMQ: the node already running
on 5672 (`--rabbit external`, the default when one answers there) or one node this script starts
(`--rabbit start`); the 3-node RabbitMQ cluster is benchmarks/quorum_bench.py's `RabbitCluster`
(nodes rabbit1..3@localhost on 5801-5803). Every broker and load generator the script starts is stopped
when it ends, also on an error, Ctrl-C or SIGTERM.

For every scenario, round and broker (the brokers alternate: hutch first in odd rounds, RabbitMQ first
in even ones) it runs one load generator and reads the broker's CPU (utime + stime from /proc/PID/stat,
all nodes summed) over the measured window. Every flow shape runs twice, once with each of two
independent generators: `rawload` (benchmarks/rawload.py, raw pre-encoded frames; the scenario's plain
name, `headline-raw` for the headline) and `hutch-perf` (from `--perf-src`, default this tree; the name
ends in `-perf`; persistent messages go to a durable queue declared beforehand with pika, since
hutch-perf declares its own queues non-durable). hutch-perf has no churn or idle mode, so those two run
with rawload (`churn`, `idle-10k`) and with `libload` (benchmarks/libload.py, the aio-pika client library:
`churn-lib`, `idle-10k-lib`). Every idle-10k run gets a broker node of its own, started for it and
stopped after it (a node that has had 10,000 connections keeps their memory, so a second run on it
would not grow), with one login made before the RSS baseline; for RabbitMQ a node on 5801
(`--idle-rabbit fresh`, the default) or, with `--idle-rabbit reuse`, the external node on 5672 reused
across rounds (its mode in the JSON says so). Output: a Markdown table per scenario on stdout (medians
over the rounds, hutch / RabbitMQ ratio, broker CPU µs per delivered message, latency p50 / p99) and
every run as JSON in `--out`.

The default runs every scenario (`--list` shows them and estimates the time; `--only` and `--tools`
pick some). With `--rounds 3 --seconds 8 --warmup 2` that is 36 scenarios × 2 brokers × 3 rounds = 216
runs, about 50 minutes on a quiet machine (`--list` prints the estimate); `--seconds 6` brings it to
about 45, `--seconds 5 --warmup 1` to under 40, at the cost of noisier medians.

    python benchmarks/scenarios.py --rounds 3 --seconds 8 --warmup 2 --out results.json
    python benchmarks/scenarios.py --only headline-raw,churn-lib --rounds 1 --seconds 3 --warmup 1
    python benchmarks/scenarios.py --tools perf --list
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from node_ports import port_arg, takes_port_zero  # benchmarks/node_ports.py
from rawload import proc_cpu  # benchmarks/rawload.py: the same /proc reading for both tools

from hutch.portfile import wait_for_ports

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SCRIPTS = {"raw": str(ROOT / "benchmarks" / "rawload.py"), "lib": str(ROOT / "benchmarks" / "libload.py")}
TICK = os.sysconf("SC_CLK_TCK")


# -- scenarios -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    tool: str  # "raw" (rawload), "perf" (hutch-perf) or "lib" (libload, aio-pika)
    args: tuple[str, ...]
    nodes: int = 1
    kind: str = "flow"  # flow | churn | idle
    quorum_leader: bool = False  # connect to node 1 (the declaring node, the leader)
    durable_queue: str = ""  # hutch-perf and persistent messages: a durable queue declared beforehand (-u)


HEAD = ("-c", "1000", "-q", "1000", "-A", "100")
RAW_HEAD = ("-x", "1", "-y", "1", *HEAD)
PERF_HEAD = ("-x", "1", "-y", "1", *HEAD)
GENERATOR = {"raw": "rawload", "perf": "hutch-perf", "lib": "aio-pika"}
DURABLE_QUEUE = "scenarios-durable"
# old names still accepted by --only (and by check_regression.py for recorded ratios)
ALIASES = {"classic-16B-20k-perf": "classic-16B-transient-20k-perf"}


@dataclass(frozen=True)
class Shape:
    """One flow shape, run with both load generators: rawload's options and hutch-perf's (PerfTest's:
    `-r` is per producer there, the total in rawload)."""

    name: str
    what: str
    raw: tuple[str, ...]
    perf: tuple[str, ...]
    nodes: int = 1
    quorum_leader: bool = False
    persistent: bool = False


def classic_shapes() -> list[Shape]:
    out = []
    for size in (16, 1000):
        for persistent in (False, True):
            sz = "1kB" if size == 1000 else "16B"
            label = f"classic-{sz}-{'persistent' if persistent else 'transient'}"
            desc = f"classic {'1 kB' if size == 1000 else '16 B'} {'persistent' if persistent else 'transient'} 1→1"
            raw = (*RAW_HEAD, "-s", str(size), *(("--persistent",) if persistent else ()))
            perf = (*PERF_HEAD, "-s", str(size), *(("-f", "persistent") if persistent else ()))
            out.append(Shape(f"{label}-20k", f"{desc} at 20k msg/s", (*raw, "-r", "20000"), (*perf, "-r", "20000"),
                             persistent=persistent))
            if size != 16 or persistent:  # 16 B transient unlimited is the headline
                out.append(Shape(f"{label}-max", f"{desc}, unlimited", raw, perf, persistent=persistent))
    return out


def shapes() -> list[Shape]:
    out = [Shape("headline", "1→1 16 B, unlimited", (*RAW_HEAD, "-s", "16"), (*PERF_HEAD, "-s", "16")),
           *classic_shapes()]
    for nodes in (1, 3):
        raw, perf = (*RAW_HEAD, "-s", "16", "--quorum"), (*PERF_HEAD, "-s", "16", "--quorum-queue")
        what = f"quorum, {nodes} node{'s' if nodes > 1 else ''}, 16 B"
        out += [Shape(f"quorum-{nodes}n-20k", f"{what} at 20k msg/s", (*raw, "-r", "20000"), (*perf, "-r", "20000"),
                      nodes=nodes, quorum_leader=True),
                Shape(f"quorum-{nodes}n-max", f"{what} unlimited", raw, perf, nodes=nodes, quorum_leader=True)]
    pat = ("--queue-pattern", "scen-%d", "--queue-pattern-from", "1")
    out += [
        Shape("2to2-two-queues", "2 producers → 2 queues → 2 consumers, 16 B",
              ("-x", "2", "-y", "2", "--queues", "2", *HEAD, "-s", "16", "--processes", "2"),
              ("-x", "2", "-y", "2", *HEAD, "-s", "16", *pat, "--queue-pattern-to", "2")),
        Shape("fanout-3", "1 producer → fanout → 3 queues → 3 consumers, 16 B",
              ("-x", "1", "-y", "3", "--fanout", "3", *HEAD, "-s", "16"),
              ("-x", "1", "-y", "3", *HEAD, "-s", "16", "-e", "scen-fanout", "-t", "fanout", *pat,
               "--queue-pattern-to", "3")),
        Shape("10to1to10", "10 producers → 1 queue → 10 consumers, 16 B",
              ("-x", "10", "-y", "10", *HEAD, "-s", "16", "--processes", "2"),
              ("-x", "10", "-y", "10", *HEAD, "-s", "16")),
        # rawload's -r is the total; hutch-perf's is per producer: 1,000 × 10 msg/s
        Shape("1000-queues-10k", "1,000 queues, 1,000 producers and consumers, 10k msg/s in total",
              ("-x", "1000", "-y", "1000", "--queues", "1000", "-c", "100", "-q", "100", "-A", "10", "-s", "16",
               "-r", "10000", "--processes", "2"),
              ("-x", "1000", "-y", "1000", "-c", "100", "-q", "100", "-A", "10", "-s", "16", "-r", "10",
               *pat, "--queue-pattern-to", "1000", "--processes", "2")),
    ]
    return out


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    for sh in shapes():
        raw_name = "headline-raw" if sh.name == "headline" else sh.name
        out.append(Scenario(raw_name, f"{sh.what} (rawload)", "raw", sh.raw, sh.nodes,
                            quorum_leader=sh.quorum_leader))
        out.append(Scenario(f"{sh.name}-perf", f"{sh.what} (hutch-perf)", "perf", sh.perf, sh.nodes,
                            quorum_leader=sh.quorum_leader,
                            durable_queue=DURABLE_QUEUE if sh.persistent else ""))
    churn = "connection churn: open, publish 1 with confirm, close, 20 at a time"
    idle = "10,000 idle connections (one channel each), a fresh broker node per run"
    out += [
        Scenario("churn", f"{churn} (rawload)", "raw", ("--mode", "churn", "--concurrency", "20", "--processes", "2"),
                 kind="churn"),
        Scenario("churn-lib", f"{churn} (aio-pika)", "lib",
                 ("--mode", "churn", "--concurrency", "20", "--processes", "2"), kind="churn"),
        Scenario("idle-10k", f"{idle} (rawload)", "raw",
                 ("--mode", "idle", "--connections", "10000", "--processes", "2"), kind="idle"),
        Scenario("idle-10k-lib", f"{idle} (aio-pika)", "lib",
                 ("--mode", "idle", "--connections", "10000", "--processes", "2"), kind="idle"),
    ]
    # churn and the idle connections last: closing 10,000 connections keeps a broker busy
    return sorted(out, key=lambda s: s.kind != "flow")


# -- /proc -----------------------------------------------------------------------------------------------

def machine_busy_s() -> float:
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def wait_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what}: port {port} not open after {timeout} s")


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- brokers ---------------------------------------------------------------------------------------------

@dataclass
class HutchNode:
    name: str
    amqp: int
    mgmt: int
    cluster: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Hutch:
    """hutch-server processes from `src` (one node, or a cluster of n joined through n1)."""

    src: Path
    base: Path
    n: int = 1
    cluster_of_one: bool = False  # one node with a cluster port even when --no-cluster exists
    kind: str = "hutch"
    nodes: list[HutchNode] = field(default_factory=list)
    mode: str = ""

    def start(self) -> Hutch:
        help_text = subprocess.run([PY, "-m", "hutch.cli.server", "--help"], capture_output=True, text=True,
                                   env=self.env()).stdout
        no_cluster = "--no-cluster" in help_text and not self.cluster_of_one
        self.mode = "no-cluster" if self.n == 1 and no_cluster else f"cluster of {self.n}"
        reports_ports = takes_port_zero(self.src)  # port 0 and the ports file (benchmarks/node_ports.py)
        for i in range(1, self.n + 1):
            node = HutchNode(f"n{i}", *(int(port_arg(self.src)) for _ in range(3)), self.base / f"n{i}")
            (node.directory / "data").mkdir(parents=True, exist_ok=True)
            args = [PY, "-m", "hutch.cli.server", "--amqp-port", str(node.amqp), "--management-port",
                    str(node.mgmt), "--data-dir", str(node.directory / "data"), "--log-level", "warning",
                    "--node-name", f"{node.name}@localhost"]
            if self.n == 1 and no_cluster:
                args.append("--no-cluster")
            else:
                args += ["--cluster-port", str(node.cluster)]
                if i > 1:
                    first = self.nodes[0]
                    args += ["--join", f"{first.name}@localhost@127.0.0.1:{first.cluster}"]
            with open(node.directory / "server.log", "wb") as log:
                node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env())
            self.nodes.append(node)
            if reports_ports:
                ports = wait_for_ports(node.directory / "data", node.proc, 60, node.directory / "server.log")
                node.amqp, node.mgmt, node.cluster = ports["amqp"], ports["management"], ports.get("cluster", 0)
            else:
                wait_port(node.amqp, node.proc, 60, f"hutch {node.name}")
                wait_port(node.mgmt, node.proc, 60, f"hutch {node.name} management")
            if self.n > 1:
                self.wait_members(i)
        return self

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
        env["PYTHONPATH"] = str(self.src)
        env["HUTCH_CLUSTER_SECRET"] = "scenarios-secret"
        env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
        return env

    def wait_members(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        req = urllib.request.Request(f"http://127.0.0.1:{self.nodes[0].mgmt}/api/cluster-status")
        req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(req, timeout=5) as resp:
                if len(json.loads(resp.read()).get("running_nodes", [])) >= count:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"hutch cluster did not reach {count} running nodes")

    def port(self) -> int:
        return self.nodes[0].amqp

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
                try:
                    node.proc.wait(20)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


class RabbitExternal:
    """The RabbitMQ node already running on 5672 (not stopped by this script)."""

    kind = "rabbitmq"
    mode = "external node on 5672"

    def __init__(self) -> None:
        out = subprocess.run(["rabbitmqctl", "eval", "os:getpid()."], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl eval failed: {out.stdout}{out.stderr}")
        self.pid = int(out.stdout.strip().strip('"'))

    def start(self) -> RabbitExternal:
        return self

    def port(self) -> int:
        return 5672

    def pids(self) -> list[int]:
        return [self.pid]

    def stop(self) -> None:
        pass


class RabbitStarted:
    """RabbitMQ nodes this script starts (quorum_bench.py's RabbitCluster), stopped and deleted at the end."""

    kind = "rabbitmq"

    def __init__(self, base: Path, n: int) -> None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from quorum_bench import RabbitCluster
        self.cluster = RabbitCluster(base, n)
        self.mode = f"{n} node(s) started by the script, ports 5801+"

    def start(self) -> RabbitStarted:
        try:
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        return self

    def port(self) -> int:
        return int(self.cluster.port(0))

    def pids(self) -> list[int]:
        return list(self.cluster.pids())

    def stop(self) -> None:
        self.cluster.stop()
        self.cluster.cleanup()


def nofile_limit(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return 0


# -- one run ---------------------------------------------------------------------------------------------

class Procs:
    """Load-generator processes started here, each in its own process group; killed on the way out."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen[str]] = []

    def popen(self, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        self.live.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.live:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.live.clear()


PERF_LINE = re.compile(r"time: ([\d.]+)s, .*received: (\d+) msg/s")


@contextlib.contextmanager
def durable_queue(port: int, name: str) -> Iterator[None]:
    """A durable classic queue `name` for the run (hutch-perf declares its own queues non-durable, and a
    persistent message in a non-durable queue is not written to disk), deleted afterwards. pika, not
    hutch's code: the same declare for both brokers."""
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))

    def declare(create: bool) -> None:
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.queue_delete(name)  # an earlier run's leftover, or this run's
            if create:
                ch.queue_declare(name, durable=True)
        finally:
            conn.close()
    declare(True)
    try:
        yield
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            declare(False)


def run_perf(sc: Scenario, broker: Any, args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    """hutch-perf (on a durable queue declared beforehand for persistent messages)."""
    if not sc.durable_queue:
        return run_perf_once(sc, broker, args, procs, ())
    try:
        with durable_queue(broker.port(), sc.durable_queue):
            return run_perf_once(sc, broker, args, procs, ("-u", sc.durable_queue))
    except pika.exceptions.AMQPError as exc:
        raise RuntimeError(f"declaring {sc.durable_queue}: {exc!r}") from None


def run_perf_once(sc: Scenario, broker: Any, args: argparse.Namespace, procs: Procs,
                  extra: tuple[str, ...]) -> dict[str, Any]:
    """hutch-perf for warmup + seconds; broker CPU between its per-second lines at warmup and the end."""
    total = int(args.warmup + args.seconds)
    env = dict(os.environ, PYTHONPATH=str(args.perf_src))
    cmd = [PY, "-m", "hutch.cli.perf", "--uri", f"amqp://guest:guest@127.0.0.1:{broker.port()}/%2F", *sc.args,
           *extra, "-z", str(total), "--json"]
    p = procs.popen(cmd, env)
    ticks: list[tuple[float, float, int]] = []  # (time s, broker cpu, received msg/s in that second)
    err_tail: list[str] = []

    def read_stderr() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            m = PERF_LINE.search(line)
            if m:
                ticks.append((float(m.group(1)), proc_cpu(broker.pids()), int(m.group(2))))
            else:
                err_tail.append(line)
    th = threading.Thread(target=read_stderr, daemon=True)
    th.start()
    assert p.stdout is not None
    timer = threading.Timer(total + 120, lambda: procs.kill_all())  # a hung run is killed, not waited for
    timer.start()
    try:
        out = p.stdout.read()  # stdout only: stderr is the reader thread's
        p.wait()
    finally:
        timer.cancel()
    th.join(5)
    if p.returncode != 0 or not out.strip():
        raise RuntimeError(f"hutch-perf failed ({p.returncode}): {''.join(err_tail)[-1500:]}")
    res = json.loads(out.strip().splitlines()[-1])
    w = [t for t in ticks if args.warmup - 0.5 <= t[0] <= total + 0.5]
    start = next((t for t in w if t[0] >= args.warmup - 0.01), None)
    end = w[-1] if w else None
    metrics: dict[str, Any] = {"rate": res["receive_rate"], "p50_us": res["latency_us"]["p50"],
                               "p99_us": res["latency_us"]["p99"]}
    if start and end and end[0] > start[0]:
        received = sum(t[2] for t in w if start[0] < t[0] <= end[0])
        metrics["rate"] = round(received / (end[0] - start[0]))
        metrics["cpu_us"] = round(1e6 * (end[1] - start[1]) / received, 2) if received else None
        metrics["broker_cpu_pct"] = round(100 * (end[1] - start[1]) / (end[0] - start[0]), 1)
    return {"command": "hutch-perf " + " ".join(cmd[3:]), "metrics": metrics, "result": res}


def run_script(sc: Scenario, broker: Any, args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    """rawload.py or libload.py (the same options for churn and idle, the same JSON keys)."""
    seconds = args.idle_seconds if sc.kind == "idle" else args.seconds
    script = SCRIPTS[sc.tool]
    cmd = [PY, script, "--port", str(broker.port()), "--pids", ",".join(map(str, broker.pids())), *sc.args,
           "-z", str(seconds), "--warmup", str(args.warmup)]
    p = procs.popen(cmd)
    out, err = p.communicate(timeout=seconds + args.warmup + 600)
    if not out.strip():
        raise RuntimeError(f"{Path(script).name} failed ({p.returncode}): {err[-1500:]}")
    res = json.loads(out.strip().splitlines()[-1])
    if sc.kind == "churn":
        metrics = {"rate": res["connections_per_s"], "cpu_us": res.get("broker_cpu_us_per_conn"),
                   "broker_cpu_pct": res.get("broker_cpu_pct")}
    elif sc.kind == "idle":
        metrics = {"kib_per_conn": res.get("kib_per_connection"), "connections": res["connections"],
                   "open_s": res["open_s"], "rss_mib": res.get("broker_rss_mib")}
    else:
        metrics = {"rate": res["receive_rate"], "cpu_us": res.get("broker_cpu_us_per_msg"),
                   "broker_cpu_pct": res.get("broker_cpu_pct"), "p50_us": res["latency_us"]["p50"],
                   "p99_us": res["latency_us"]["p99"], "client_cpu_us": res.get("client_cpu_us_per_msg")}
    if res.get("errors"):
        metrics["errors"] = res["errors"][:3]
    return {"command": f"{Path(script).name} " + " ".join(cmd[2:]), "metrics": metrics, "result": res}


# -- the session -----------------------------------------------------------------------------------------

def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict[str, Any]], chosen: list[Scenario]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for sc in chosen:
        per: dict[str, dict[str, Any]] = {}
        for broker in ("hutch", "rabbitmq"):
            ms = [r["metrics"] for r in runs if r["scenario"] == sc.name and r["broker"] == broker and "metrics" in r]
            per[broker] = {k: med([m.get(k) for m in ms]) for k in
                           ("rate", "cpu_us", "p50_us", "p99_us", "kib_per_conn", "broker_cpu_pct")}
            per[broker]["rounds"] = len(ms)
        h, r = per["hutch"], per["rabbitmq"]

        def ratio(key: str, h: dict[str, Any] = h, r: dict[str, Any] = r) -> float | None:
            return round(h[key] / r[key], 3) if h.get(key) and r.get(key) else None
        summary[sc.name] = {"what": sc.what, "tool": sc.tool, "kind": sc.kind, "hutch": h, "rabbitmq": r,
                            "throughput_ratio": ratio("rate"), "cpu_ratio": ratio("cpu_us"),
                            "p50_ratio": ratio("p50_us"), "p99_ratio": ratio("p99_us"),
                            "memory_ratio": ratio("kib_per_conn")}
    return summary


def fmt(v: float | None, unit: str = "", scale: float = 1.0, nd: int = 0) -> str:
    return "–" if v is None else f"{v / scale:,.{nd}f}{unit}"


def markdown(summary: dict[str, Any]) -> str:
    lines = []
    for name, s in summary.items():
        h, r = s["hutch"], s["rabbitmq"]
        lines += [f"### {name}: {s['what']}", ""]
        if s["kind"] == "idle":
            lines += ["| broker | KiB per connection | rounds |", "| --- | ---: | ---: |",
                      f"| hutch | {fmt(h['kib_per_conn'], nd=1)} | {h['rounds']} |",
                      f"| RabbitMQ | {fmt(r['kib_per_conn'], nd=1)} | {r['rounds']} |",
                      f"| ratio | {fmt(s['memory_ratio'], '×', nd=2)} | |", ""]
            continue
        unit = "connections/s" if s["kind"] == "churn" else "msg/s"
        per = "µs per connection" if s["kind"] == "churn" else "µs per message"
        lines += [f"| broker | {unit} | broker CPU {per} | broker CPU % | p50 / p99 | rounds |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for label, m in (("hutch", h), ("RabbitMQ", r)):
            lat = "–" if m.get("p50_us") is None else \
                f"{fmt(m['p50_us'], ' ms', 1000, 2)} / {fmt(m['p99_us'], ' ms', 1000, 2)}"
            lines.append(f"| {label} | {fmt(m['rate'])} | {fmt(m['cpu_us'], nd=1)} | {fmt(m['broker_cpu_pct'], nd=0)} |"
                         f" {lat} | {m['rounds']} |")
        lines += [f"| hutch / RabbitMQ | {fmt(s['throughput_ratio'], '×', nd=2)} | {fmt(s['cpu_ratio'], '×', nd=2)} |"
                  f" | {fmt(s['p50_ratio'], '×', nd=2)} / {fmt(s['p99_ratio'], '×', nd=2)} | |", ""]
    return "\n".join(lines)


def pick(args: argparse.Namespace) -> list[Scenario]:
    """--only (old names in ALIASES accepted) and --tools; by default every scenario."""
    every = scenarios()
    tools = set(args.tools.split(","))
    if tools - set(GENERATOR):
        raise SystemExit(f"unknown --tools {args.tools!r} (known: {', '.join(GENERATOR)})")
    chosen = [s for s in every if s.tool in tools]
    if args.only:
        names = {ALIASES.get(n, n) for n in args.only.split(",")}
        unknown = names - {s.name for s in every}
        if unknown:
            raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))} (see --list)")
        chosen = [s for s in chosen if s.name in names]
    return chosen


def make_brokers(nodes: int, clustered: bool, args: argparse.Namespace, tmp: Path) -> list[Any]:
    hutch = Hutch(Path(args.hutch_src), tmp / f"hutch-{nodes}n-{int(clustered)}", nodes,
                  args.hutch_cluster_of_one or clustered)
    if nodes == 1 and args.rabbit == "external":
        rabbit: Any = RabbitExternal()
    else:
        rabbit = RabbitStarted(tmp / f"rabbit-{nodes}n-{int(clustered)}", nodes)
    return [hutch, rabbit]


def start_broker(b: Any, idle: bool) -> None:
    t = time.monotonic()
    b.start()
    note(f"{b.kind} ({b.mode}) up in {time.monotonic() - t:.1f} s, pids {b.pids()}")
    if b.kind == "rabbitmq" and idle:
        limit = min(nofile_limit(p) for p in b.pids())
        if limit < 12000:
            note(f"warning: RabbitMQ's open-file limit is {limit}: idle-10k will fail "
                 "(docs/BENCHMARKS.md says how to raise it)")


def session(args: argparse.Namespace, chosen: list[Scenario], runs: list[dict[str, Any]], procs: Procs) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="h17-scen-"))
    subprocess.run(["chmod", "755", str(tmp)], check=False)
    try:
        # quorum queues need a clustered hutch node: the 1-node quorum scenarios get a cluster of one
        shared = [s for s in chosen if s.kind != "idle"]
        for nodes, clustered in sorted({(s.nodes, s.quorum_leader) for s in shared}):
            group = [s for s in shared if (s.nodes, s.quorum_leader) == (nodes, clustered)]
            brokers: list[Any] = []
            try:
                for b in make_brokers(nodes, clustered, args, tmp):
                    brokers.append(b)
                    start_broker(b, False)
                run_group(args, group, brokers, runs, procs)
            finally:
                for b in brokers:
                    b.stop()
        idle = [s for s in chosen if s.kind == "idle"]
        if idle:
            run_fresh(args, idle, runs, procs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_group(args: argparse.Namespace, group: list[Scenario], brokers: list[Any], runs: list[dict[str, Any]],
              procs: Procs) -> None:
    for rnd in range(1, args.rounds + 1):
        for sc in group:
            order = brokers if rnd % 2 else list(reversed(brokers))
            for b in order:
                run_one(args, sc, b, brokers, rnd, runs, procs)


def fresh_broker(kind: str, args: argparse.Namespace, base: Path) -> Any:
    """A broker node that has had no connections yet (idle-10k), or the external RabbitMQ node with
    `--idle-rabbit reuse` (its mode says so)."""
    if kind == "hutch":
        return Hutch(Path(args.hutch_src), base, 1, args.hutch_cluster_of_one)
    if args.rabbit == "external" and args.idle_rabbit == "reuse":
        rabbit = RabbitExternal()
        rabbit.mode = "external node on 5672, reused across rounds"
        return rabbit
    return RabbitStarted(base, 1)


def first_login(port: int) -> None:
    """One connection opened and closed (pika) before the idle run: hutch checks a (user, password) it
    has not seen with scrypt, at most auth.max_pending_logins_per_source (8) at a time from one address,
    and refuses the logins past that at once; after the first success the pair is cached. A node reused
    across runs had that cache warm; a fresh one has it warm too, so the run measures connections, not
    the first login. The RSS baseline is read after this connection, so one-time costs of a first
    connection are not counted per connection."""
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.AMQPError as exc:
        raise RuntimeError(f"first login on port {port}: {exc!r}") from None


def run_fresh(args: argparse.Namespace, group: list[Scenario], runs: list[dict[str, Any]], procs: Procs,
              tmp: Path) -> None:
    """idle-10k: every run on a broker node started for it and stopped after it. A node that has had
    10,000 connections keeps the memory they used (CPython's allocator, like Erlang's, holds on to it),
    so a second run on it would open 10,000 connections without its RSS growing."""
    for rnd in range(1, args.rounds + 1):
        for sc in group:
            for kind in (("hutch", "rabbitmq") if rnd % 2 else ("rabbitmq", "hutch")):
                b = fresh_broker(kind, args, tmp / f"fresh-{kind}-{sc.name}-r{rnd}")
                try:
                    start_broker(b, True)
                    first_login(b.port())
                    run_one(args, sc, b, [b], rnd, runs, procs)
                except (RuntimeError, subprocess.SubprocessError, AssertionError) as exc:
                    note(f"{sc.name} r{rnd} {kind}: broker start failed: {exc}")
                    runs.append({"scenario": sc.name, "tool": sc.tool, "broker": kind, "round": rnd,
                                 "error": f"broker start failed: {exc}"[-2000:]})
                finally:
                    b.stop()


def run_one(args: argparse.Namespace, sc: Scenario, b: Any, brokers: list[Any], rnd: int,
            runs: list[dict[str, Any]], procs: Procs) -> None:
    quiesce(brokers, args.pause)
    busy0, w0 = machine_busy_s(), time.monotonic()
    rec: dict[str, Any] = {"scenario": sc.name, "tool": sc.tool, "broker": b.kind, "round": rnd,
                           "broker_mode": b.mode, "utc": time.strftime("%H:%M:%S", time.gmtime())}
    try:
        rec.update((run_perf if sc.tool == "perf" else run_script)(sc, b, args, procs))
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        rec["error"] = str(exc)[-2000:]
    finally:
        procs.kill_all()
    dt = time.monotonic() - w0
    rec["wall_s"] = round(dt, 1)
    rec["machine_busy_cores"] = round((machine_busy_s() - busy0) / dt, 2)
    runs.append(rec)
    m = rec.get("metrics", {})
    note(f"[{rec['utc']}] {sc.name} r{rnd} {b.kind}: "
         + (f"ERROR {rec['error'][:300]}" if "error" in rec else json.dumps(m))
         + f" ({rec['wall_s']} s)")


# -- the estimate (--list) -------------------------------------------------------------------------------

# seconds, from the wall times of the 1-round validation runs (2 busy cores; a quiet machine is faster):
# a run's start-up and clean-up plus the pause and the wait until the brokers are idle; the extra set-up
# of the big shapes (averaged over the two brokers: 2,000 connections and 1,000 queues; 10,000
# connections opened, 20-35 s with aio-pika); a broker's start (and, for the fresh idle nodes, its stop:
# `rabbitmqctl stop` takes some 10 s)
RUN_OVERHEAD_S = {"raw": 2.0, "perf": 2.3, "lib": 2.3}
SETUP_EXTRA_S = {"1000-queues-10k": 10.0, "1000-queues-10k-perf": 8.0, "idle-10k": 6.5, "idle-10k-lib": 28.0}
START_S = {("hutch", 1): 3.0, ("hutch", 3): 8.0, ("rabbitmq", 1): 17.0, ("rabbitmq", 3): 40.0}


def estimate_s(chosen: list[Scenario], args: argparse.Namespace) -> float:
    """Wall time of a run of `chosen` with these --rounds, --seconds, --warmup (and --idle-seconds)."""
    total = 0.0
    for sc in chosen:
        measured = args.idle_seconds if sc.kind == "idle" else args.seconds
        per_run = args.warmup + measured + RUN_OVERHEAD_S[sc.tool] + SETUP_EXTRA_S.get(sc.name, 0.0)
        if sc.kind == "idle":  # a fresh node per run
            rabbit = 0.0 if args.rabbit == "external" and args.idle_rabbit == "reuse" else START_S[("rabbitmq", 1)]
            per_run += (START_S[("hutch", 1)] + rabbit) / 2
        total += 2 * args.rounds * per_run
    for nodes, _clustered in {(s.nodes, s.quorum_leader) for s in chosen if s.kind != "idle"}:
        total += START_S[("hutch", nodes)]
        if nodes > 1 or args.rabbit == "start":
            total += START_S[("rabbitmq", nodes)]
    return total


def quiesce(brokers: list[Any], pause: float, limit: float = 60.0) -> None:
    """Sleep `pause` s, then until the brokers together use under 0.1 + 0.05 cores per process over 0.5 s
    (the previous run's backlog drained, its connections closed; an idle node uses about 0.01), at most
    `limit` s."""
    time.sleep(pause)
    pids = [p for b in brokers for p in b.pids()]
    below = 0.1 + 0.05 * len(pids)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        c0 = proc_cpu(pids)
        time.sleep(0.5)
        if (proc_cpu(pids) - c0) / 0.5 < below:
            return
    note(f"warning: the brokers were still busy {limit:.0f} s after the previous run")


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def git_head() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds before the measured window")
    ap.add_argument("--idle-seconds", type=float, default=2.0, help="idle-10k: seconds the connections are held")
    ap.add_argument("--pause", type=float, default=0.5,
                    help="seconds between runs (then until the brokers are idle)")
    ap.add_argument("--only", default="", help="comma-separated scenario names (see --list)")
    ap.add_argument("--tools", default="raw,perf,lib",
                    help="load generators to run (default all: raw = rawload, perf = hutch-perf, lib = libload)")
    ap.add_argument("--all-perf", action="store_true",
                    help="ignored: every shape runs with hutch-perf by default (kept for old command lines)")
    ap.add_argument("--idle-rabbit", choices=("fresh", "reuse"), default="fresh",
                    help="idle-10k on RabbitMQ: a node started for each run (default), or the external node "
                    "on 5672 reused across rounds")
    ap.add_argument("--list", action="store_true",
                    help="list the scenarios (those --only/--tools pick) and the estimated run time, and exit")
    ap.add_argument("--hutch-src", default=str(ROOT / "src"), help="source tree hutch-server runs from")
    ap.add_argument("--perf-src", default=str(ROOT / "src"), help="source tree hutch-perf runs from")
    ap.add_argument("--hutch-cluster-of-one", action="store_true",
                    help="run the single hutch node with a cluster port (as `make run`), not --no-cluster")
    ap.add_argument("--rabbit", choices=("external", "start"), default="external",
                    help="single-node RabbitMQ: the one on 5672, or one started here")
    ap.add_argument("--out", default="", help="JSON results file (default: scenario-results-<utc>.json)")
    ap.add_argument("--markdown", default="", help="also write the tables to this file")
    args = ap.parse_args()
    chosen = pick(args)
    if args.list:
        for s in chosen:
            print(f"{s.name:32} {GENERATOR[s.tool]:10} {s.nodes}n  {s.what}")
        est = estimate_s(chosen, args)
        print(f"{len(chosen)} scenarios × 2 brokers × {args.rounds} rounds = {len(chosen) * 2 * args.rounds} runs; "
              f"estimated {est / 60:.0f} min at --seconds {args.seconds:g} --warmup {args.warmup:g}")
        return 0
    raise_nofile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict[str, Any]] = []
    procs = Procs()
    started = time.time()
    try:
        session(args, chosen, runs, procs)
    finally:
        procs.kill_all()
        summary = summarize(runs, chosen)
        out = args.out or f"scenario-results-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
        doc = {"meta": {"commit": git_head(), "hutch_src": args.hutch_src, "perf_src": args.perf_src,
                        "rounds": args.rounds, "seconds": args.seconds, "warmup": args.warmup,
                        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                        "duration_s": round(time.time() - started), "argv": sys.argv[1:]},
               "summary": summary, "runs": runs}
        Path(out).write_text(json.dumps(doc, indent=1))
        md = markdown(summary)
        print(md)
        if args.markdown:
            Path(args.markdown).write_text(md + "\n")
        note(f"results: {out} ({round(time.time() - started)} s)")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
