"""Quorum queues, hutch against RabbitMQ 3.10.8 on this machine (issue 7; docs/BENCHMARKS.md, "Quorum queues").

Starts its own brokers: hutch nodes n1..nN (`hutch-server` processes through tests/cluster/nodes.py, default
settings, every port 0: the ports each bound are read from its ports file, and a restart reuses them)
and RabbitMQ nodes rabbit1..rabbitN@localhost
(AMQP 5801+i, distribution 25801+i, no plugins, empty config, joined with `join_cluster`), all under
--base (default /tmp/qqb), and stops and deletes them at the end. Every line of output is one JSON object.

    quorum_bench.py throughput --nodes 1 --rounds 3 --seconds 30 --sizes 16,1000
    quorum_bench.py fsyncs     --nodes 3 --seconds 20           # perf record of fdatasync/fsync, per broker pid
    quorum_bench.py latency    --nodes 3 --rate 5000 --seconds 30 --rounds 3   # confirm latency at a fixed rate
    quorum_bench.py memory     --nodes 3 --count 1000000        # RSS with 1M x 16 B queued
    quorum_bench.py failover   --nodes 3 --rounds 5             # kill -9 the leader -> first confirm via a survivor
    quorum_bench.py profile    --nodes 3 --seconds 20           # py-spy on hutch's leader under the 16 B load
    quorum_bench.py machine-bytes --count 1000000               # the machine's own bytes per ready message

Every subcommand takes --brokers hutch,rabbitmq (default both). Set HUTCH_SRC=/path/to/src to run hutch from
another source tree (e.g. a `git archive` of the commit being measured) instead of the installed one; the
tree must have `hutch/portfile.py` (issue 22 or later: its nodes start on port 0 and report their ports,
which tests/cluster/nodes.py reads). An older tree was measured with the fixed ports 5811+i of this
script's earlier versions.

The throughput scenario is issue 7's: one quorum queue, 1 -> 1, confirm window 1000, prefetch 1000, multi-ack
every 100, publisher and consumer connected to node 1 (which declares the queue, so its leader is there on
both brokers: hutch campaigns on the declaring node, RabbitMQ's default locator is client-local).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "bin"
PERF = str(VENV / "hutch-perf")
sys.path.insert(0, str(ROOT))
if os.environ.get("HUTCH_SRC"):
    sys.path.insert(0, os.environ["HUTCH_SRC"])
    os.environ["PYTHONPATH"] = os.environ["HUTCH_SRC"] + os.pathsep + os.environ.get("PYTHONPATH", "")

SCENARIO = ["-x", "1", "-y", "1", "-c", "1000", "-q", "1000", "-A", "100"]
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps({**obj, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}), flush=True)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- /proc ----------------------------------------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, threads included; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy (not idle, not iowait)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


def descendants(pid: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def wait_idle(max_wait: float = 30.0, busy_below: float = 0.3, window: float = 1.5) -> float:
    """Wait until the machine's busy CPU over `window` s is below `busy_below` cores; return the last value."""
    deadline = time.monotonic() + max_wait
    while True:
        b0 = machine_busy()
        time.sleep(window)
        busy = (machine_busy() - b0) / window
        if busy < busy_below or time.monotonic() > deadline:
            return busy


# -- brokers --------------------------------------------------------------------------------------------

class HutchCluster:
    kind = "hutch"

    def __init__(self, base: Path, n: int, config: str = "") -> None:
        from tests.cluster.nodes import Node
        self.base = base / "hutch"
        config_text = "cluster.fault_injection = false\n" + "".join(f"{c.strip()}\n" for c in config.split(";")
                                                                   if c.strip())
        self.nodes: list[Any] = []
        for i in range(1, n + 1):  # port 0 everywhere (issue 22); n2.. join n1 once it reported its port
            self.nodes.append(Node(f"n{i}", self.base / f"n{i}", 0, 0, 0, None,
                                   secret="qqb-secret", config_text=config_text))

    def start(self) -> HutchCluster:
        for node in self.nodes:
            if node is not self.nodes[0]:
                node.join = self.nodes[0].seed
            node.start()
            self._wait_members(self.nodes.index(node) + 1)
        return self

    def _wait_members(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, doc = self.nodes[0].api("GET", "/api/cluster-status")
            if code == 200 and len(doc.get("running_nodes", [])) >= count:
                return
            time.sleep(0.2)
        raise RuntimeError(f"hutch cluster did not reach {count} running nodes")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def uri(self, i: int = 0) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i].amqp_port}/%2F"

    def port(self, i: int = 0) -> int:
        return self.nodes[i].amqp_port

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.running()]

    def pid(self, i: int) -> int:
        return self.nodes[i].proc.pid

    def node_names(self) -> list[str]:
        return [n.full_name for n in self.nodes]

    def queue_info(self, queue: str, via: int | None = None) -> dict[str, Any]:
        for i, node in enumerate(self.nodes):
            if (via is None or via == i) and node.running():
                code, doc = node.api("GET", f"/api/queues/%2F/{queue}", timeout=5)
                if code == 200:
                    return {"leader": doc.get("leader"), "members": doc.get("members"),
                            "online": doc.get("online"), "messages": doc.get("messages")}
        return {}

    def kill(self, i: int) -> float:
        """SIGKILL node i; return the monotonic time of the signal."""
        proc = self.nodes[i].proc
        t = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        return t

    def restart(self, i: int) -> None:
        self.nodes[i].start()

    def log_excerpt(self) -> dict[str, list[str]]:
        """WARNING/ERROR lines of every node's logs."""
        out = {}
        for node in self.nodes:
            lines = [ln for ln in node.log().splitlines() if "[WARNING]" in ln or "[ERROR]" in ln
                     or "Traceback" in ln or "[CRITICAL]" in ln]
            out[node.name] = lines
        return out


class RabbitNode:
    def __init__(self, base: Path, i: int, config: str = "") -> None:
        self.config = "".join(f"{c.strip()}\n" for c in config.split(";") if c.strip())
        self.i = i
        self.name = f"rabbit{i}@localhost"
        self.port = 5800 + i
        self.dist = 25800 + i
        self.dir = base / f"rabbit{i}"
        self._pid = 0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(self.dist), RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
                   RABBITMQ_LOG_BASE=str(self.dir / "log"), RABBITMQ_PID_FILE=str(self.dir / "pid"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
                   RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"))
        return env

    def ctl(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        r = subprocess.run(["rabbitmqctl", "-n", self.name, *args], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.name} {' '.join(args)}: {r.stdout}{r.stderr}")
        return r.stdout

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(self.config)
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.dir)], check=True)
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env(), cwd=str(self.dir), check=True)
        deadline = time.monotonic() + 120
        while True:  # the node registers with epmd a few seconds after -detached returns
            r = subprocess.run(["rabbitmqctl", "-n", self.name, "await_startup", "--timeout", "60"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {r.stdout}{r.stderr}")
            time.sleep(1)
        self._pid = int(self.ctl("eval", "os:getpid().").strip().strip('"'))

    @property
    def pid(self) -> int:
        return self._pid

    def running(self) -> bool:
        return self._pid > 0 and _state(self._pid) not in ("Z", "X", "")

    def stop(self) -> None:
        if self.running():
            self.ctl("stop", check=False)
        self._pid = 0


class RabbitCluster:
    kind = "rabbitmq"

    def __init__(self, base: Path, n: int, config: str = "") -> None:
        self.base = base / "rabbitmq"
        self.nodes = [RabbitNode(self.base, i, config) for i in range(1, n + 1)]

    def start(self) -> RabbitCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "rabbitmq:rabbitmq", str(self.base)], check=True)
        for node in self.nodes:
            node.start()
            if node.i > 1:
                node.ctl("stop_app")
                node.ctl("join_cluster", self.nodes[0].name)
                node.ctl("start_app")
        if len(self.nodes) > 1:
            status = self.nodes[0].ctl("cluster_status", "--formatter", "json")
            running = json.loads(status)["running_nodes"]
            assert len(running) == len(self.nodes), running
        return self

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def uri(self, i: int = 0) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i].port}/%2F"

    def port(self, i: int = 0) -> int:
        return self.nodes[i].port

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.running()]

    def pid(self, i: int) -> int:
        return self.nodes[i].pid

    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def queue_info(self, queue: str, via: int | None = None) -> dict[str, Any]:
        for i, node in enumerate(self.nodes):
            if (via is None or via == i) and node.running():
                try:
                    out = node.ctl("list_queues", "name", "leader", "members", "online", "messages", "memory",
                                   "--formatter", "json", timeout=30)
                except (RuntimeError, subprocess.TimeoutExpired):
                    continue
                for row in json.loads(out):
                    if row["name"] == queue:
                        return row
        return {}

    def kill(self, i: int) -> float:
        """SIGKILL node i; return the monotonic time of the signal (the node is detached: nobody here reaps
        it, so a zombie counts as dead)."""
        pid = self.nodes[i].pid
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while _state(pid) not in ("Z", "X", ""):
            time.sleep(0.005)
        self.nodes[i]._pid = 0
        return t

    def restart(self, i: int) -> None:
        self.nodes[i].start()

    def log_excerpt(self) -> dict[str, list[str]]:
        return {}


def make_clusters(args: argparse.Namespace) -> list[Any]:
    base = Path(args.base)
    out = []
    for kind in args.brokers.split(","):
        out.append(HutchCluster(base, args.nodes, args.hutch_config) if kind == "hutch"
                   else RabbitCluster(base, args.nodes, args.rabbit_config))
    return out


class Brokers:
    """Start the clusters (all kept running: the idle one costs ~1 % CPU), stop and delete them at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.clusters = make_clusters(args)

    def __enter__(self) -> list[Any]:
        try:
            for c in self.clusters:
                t = time.monotonic()
                c.start()
                note(f"{c.kind}: {len(c.nodes)} node(s) up in {time.monotonic() - t:.1f} s, pids {c.pids()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.clusters

    def __exit__(self, *exc: Any) -> None:
        for c in self.clusters:
            try:
                if c.kind == "hutch":
                    logs = c.log_excerpt()
                    if any(logs.values()):
                        emit({"kind": "hutch_log_warnings", "nodes": len(c.nodes),
                              "lines": {k: v[-40:] for k, v in logs.items()},
                              "counts": {k: len(v) for k, v in logs.items()}})
                c.stop()
            finally:
                if not self.args.keep:
                    c.cleanup()


# -- pika helpers ---------------------------------------------------------------------------------------

def declare_quorum(port: int, queue: str) -> None:
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=port, heartbeat=0))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()


def delete_queue(port: int, queue: str) -> None:
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=port, heartbeat=0,
                                                             blocked_connection_timeout=120))
    conn.channel().queue_delete(queue)
    conn.close()


# -- hutch-perf runs ------------------------------------------------------------------------------------

def run_perf(cluster: Any, extra: list[str], seconds: float, label: str, sample: tuple[float, float] | None = None,
             node: int = 0) -> dict[str, Any]:
    """One hutch-perf run against node `node`; CPU sampled between `sample` = (from, to) seconds of the run."""
    cmd = [PERF, "--uri", cluster.uri(node), *extra, "-z", str(seconds), "--json", "--id", label]
    log_path = Path(f"/tmp/qqb-perf-{label}.log")
    with open(log_path, "w") as errf:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True)
        cpu: dict[str, Any] = {}
        if sample is not None:
            a, b = sample
            time.sleep(max(0.0, a - (time.monotonic() - t0)))
            brokers = cluster.pids()
            clients = descendants(p.pid)
            c0 = [proc_cpu(x) for x in brokers]
            k0 = sum(proc_cpu(x) for x in clients)
            m0, w0 = machine_busy(), time.monotonic()
            time.sleep(max(0.0, b - (time.monotonic() - t0)))
            c1 = [proc_cpu(x) for x in brokers]
            k1 = sum(proc_cpu(x) for x in clients)
            m1, w1 = machine_busy(), time.monotonic()
            dt = w1 - w0
            per = [round(100 * (y - x) / dt, 1) for x, y in zip(c0, c1, strict=True)]
            client = 100 * (k1 - k0) / dt
            cpu = {"broker_pct": round(sum(per), 1), "broker_pct_per_node": per, "client_pct": round(client, 1),
                   "others_pct": round(100 * (m1 - m0) / dt - sum(per) - client, 1),
                   "window_s": [a, b], "rss_mb": [round(rss(x) / 2**20, 1) for x in brokers]}
        out, _ = p.communicate(timeout=seconds + 120)
    if p.returncode != 0 or not out.strip():
        raise RuntimeError(f"hutch-perf failed ({p.returncode}): {' '.join(cmd)}\n{log_path.read_text()[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    return {"command": "hutch-perf " + " ".join(cmd[1:]), "result": result, "cpu": cpu}


def cmd_throughput(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    with Brokers(args) as clusters:
        for rnd in range(1, args.rounds + 1):
            for size in sizes:
                for c in clusters:
                    idle = wait_idle()
                    label = f"{c.kind}-{args.nodes}n-{size}B-r{rnd}"
                    extra = [*SCENARIO, "-s", str(size), "--quorum-queue"]
                    run = run_perf(c, extra, args.seconds, label, sample=(5.0, args.seconds - 2.0))
                    r = run["result"]
                    emit({"kind": "throughput", "broker": c.kind, "nodes": args.nodes, "size": size, "round": rnd,
                          "receive_rate": r["receive_rate"], "confirm_rate": r["confirm_rate"],
                          "p50_us": r["latency_us"]["p50"], "p99_us": r["latency_us"]["p99"],
                          "idle_before_cores": round(idle, 2), **run})
                    time.sleep(2)


# -- fsyncs ---------------------------------------------------------------------------------------------

def count_syncs(perf_data: Path, pids: set[int]) -> tuple[Counter[int], Counter[str], list[float]]:
    """fsync/fdatasync calls per broker pid and per call, and each call's duration (enter -> exit, ms)."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid,tid,time,event"], capture_output=True,
                         text=True, check=True).stdout
    per_pid: Counter[int] = Counter()
    per_call: Counter[str] = Counter()
    entered: dict[int, float] = {}
    durations: list[float] = []
    for line in out.splitlines():
        parts = line.replace("/", " ").split()  # "pid/tid time: event:"
        if len(parts) < 4 or not parts[0].isdigit() or int(parts[0]) not in pids:
            continue
        tid, at, event = int(parts[1]), float(parts[2].rstrip(":")), parts[3].rstrip(":").split(":")[-1]
        if event.startswith("sys_enter_"):
            per_pid[int(parts[0])] += 1
            per_call[event] += 1
            entered[tid] = at
        elif tid in entered:
            durations.append(1000 * (at - entered.pop(tid)))
    return per_pid, per_call, sorted(durations)


def cmd_fsyncs(args: argparse.Namespace) -> None:
    size = int(args.sizes.split(",")[0])
    with Brokers(args) as clusters:
        for c in clusters:
            wait_idle()
            data = Path(args.base) / f"perf-{c.kind}.data"
            rec = subprocess.Popen(["perf", "record", "-q", "-a", "-e", "syscalls:sys_enter_fdatasync",
                                    "-e", "syscalls:sys_enter_fsync", "-e", "syscalls:sys_exit_fdatasync",
                                    "-e", "syscalls:sys_exit_fsync", "-o", str(data)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            label = f"fsync-{c.kind}-{args.nodes}n"
            run = run_perf(c, [*SCENARIO, "-s", str(size), "--quorum-queue"], args.seconds, label,
                           sample=(5.0, args.seconds - 2.0))
            rec.send_signal(signal.SIGINT)
            rec.wait(30)
            per_pid, per_call, took = count_syncs(data, set(c.pids()))
            data.unlink(missing_ok=True)
            confirmed = run["result"]["confirmed"]
            total = sum(per_pid.values())
            emit({"kind": "fsyncs", "broker": c.kind, "nodes": args.nodes, "size": size, "confirmed": confirmed,
                  "confirm_rate": run["result"]["confirm_rate"], "fsyncs": total,
                  "per_node": [per_pid.get(p, 0) for p in c.pids()], "by_call": dict(per_call),
                  "sync_ms": {"p50": round(took[len(took) // 2], 2), "p99": round(took[int(len(took) * 0.99)], 2),
                              "mean": round(sum(took) / len(took), 2)} if took else None,
                  "fsyncs_per_1000": round(1000 * total / max(confirmed, 1), 2),
                  "leader_fsyncs_per_1000": round(1000 * per_pid.get(c.pid(0), 0) / max(confirmed, 1), 2),
                  "command": run["command"], "cpu": run["cpu"]})


# -- confirm latency at a fixed rate ---------------------------------------------------------------------

async def _timed_publisher(uri_text: str, queue: str, size: int, rate: float, seconds: float, warmup: float,
                           window: int) -> dict[str, Any]:
    """hutch-perf's Producer (same encoding, token bucket and window), recording each message's confirm
    latency: send time of its batch -> the basic.ack that settles it."""
    from hutch.perf.options import parse_uri
    from hutch.perf.producer import _ACK, Producer, PublishPlan
    from hutch.perf.protocol import connect

    clock = time.monotonic_ns
    lat: list[int] = []
    measuring = [False]

    class Timed(Producer):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.sent_ns: dict[int, int] = {}
            self.low = 1

        def _pump(self) -> None:
            before = self.sent
            super()._pump()
            if self.sent != before:
                now = clock()
                for s in range(before + 1, self.sent + 1):
                    self.sent_ns[s] = now

        def _on_ack(self, buf: bytes, start: int, end: int) -> None:
            now = clock()
            tag, bits = _ACK.unpack_from(buf, start + 4)
            seqs = range(self.low, tag + 1) if bits & 1 else (tag,)
            for s in seqs:
                t = self.sent_ns.pop(s, None)
                if t is not None and measuring[0]:
                    lat.append(now - t)
            if bits & 1:
                self.low = tag + 1
            super()._on_ack(buf, start, end)

    plan = PublishPlan(exchange="", routing_key=queue, size_bytes=size, confirm_window=window, rate=rate)
    uri = parse_uri(uri_text)
    prod = await connect(uri, lambda: Timed(uri, plan))
    await prod.setup()
    prod.start()
    await asyncio.sleep(warmup)
    measuring[0] = True
    c0 = prod.confirmed
    await asyncio.sleep(seconds)
    measuring[0] = False
    confirmed = prod.confirmed - c0
    prod.stop()
    await asyncio.sleep(1.0)
    await prod.close()
    lat.sort()

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(len(lat) * p))] / 1000, 1) if lat else 0.0
    return {"confirmed": confirmed, "confirm_rate": round(confirmed / seconds), "samples": len(lat),
            "nacked": prod.nacked,
            "confirm_latency_us": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "p999": pct(0.999),
                                   "max": round(lat[-1] / 1000, 1) if lat else 0.0}}


def cmd_latency(args: argparse.Namespace) -> None:
    size = int(args.sizes.split(",")[0])
    warmup = 3.0
    with Brokers(args) as clusters:
        for rnd in range(1, args.rounds + 1):
            for c in clusters:
                wait_idle()
                queue = f"qq-lat-{rnd}"
                declare_quorum(c.port(0), queue)
                total = warmup + args.seconds + 3
                # the consumer: hutch-perf, same connection settings as the throughput runs, on node 1
                cons = subprocess.Popen([PERF, "--uri", c.uri(0), "-x", "0", "-y", "1", "-q", "1000", "-A", "100",
                                         "-u", queue, "-z", str(total), "--json"],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                time.sleep(2.0)
                b0 = [proc_cpu(p) for p in c.pids()]
                t0 = time.monotonic()
                pub = asyncio.run(_timed_publisher(c.uri(0), queue, size, args.rate, args.seconds, warmup, 1000))
                dt = time.monotonic() - t0
                b1 = [proc_cpu(p) for p in c.pids()]
                out, _ = cons.communicate(timeout=total + 60)
                consumer = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
                delete_queue(c.port(0), queue)
                emit({"kind": "latency", "broker": c.kind, "nodes": args.nodes, "size": size, "round": rnd,
                      "rate": args.rate, "seconds": args.seconds, **pub,
                      "consumer_latency_us": consumer.get("latency_us"), "consumer_received": consumer.get("received"),
                      "broker_cpu_pct": round(100 * (sum(b1) - sum(b0)) / dt, 1),
                      "command": f"quorum_bench.py latency --nodes {args.nodes} --rate {args.rate} "
                                 f"--seconds {args.seconds} (publisher) + hutch-perf -x 0 -y 1 -q 1000 -A 100 "
                                 f"-u {queue} (consumer)"})
                time.sleep(2)


# -- memory with 1M messages queued ---------------------------------------------------------------------

def cmd_memory(args: argparse.Namespace) -> None:
    size = int(args.sizes.split(",")[0])
    with Brokers(args) as clusters:
        for c in clusters:
            queue = "qq-mem"
            declare_quorum(c.port(0), queue)
            time.sleep(3)
            before = [rss(p) for p in c.pids()]
            peak = list(before)
            stop = threading.Event()

            def sampler(c: Any = c, peak: list[int] = peak, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    for i, p in enumerate(c.pids()):
                        peak[i] = max(peak[i], rss(p))
                    time.sleep(0.2)
            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            t = time.monotonic()
            cmd = [PERF, "--uri", c.uri(0), "-x", "1", "-y", "0", "-s", str(size), "-c", "1000", "-u", queue,
                   "-C", str(args.count), "--json"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600).stdout
            took = time.monotonic() - t
            pub = json.loads(out.strip().splitlines()[-1])
            time.sleep(args.settle)
            after = [rss(p) for p in c.pids()]
            stop.set()
            th.join()
            info = c.queue_info(queue, via=0)
            delete_queue(c.port(0), queue)
            time.sleep(5)
            deleted = [rss(p) for p in c.pids()]
            n = pub["confirmed"]
            emit({"kind": "memory", "broker": c.kind, "nodes": args.nodes, "size": size, "count": args.count,
                  "config": args.hutch_config if c.kind == "hutch" else args.rabbit_config,
                  "confirmed": n, "publish_rate": round(n / took), "publish_s": round(took, 1),
                  "queue_info": info,
                  "rss_before_mb": [round(x / 2**20, 1) for x in before],
                  "rss_after_mb": [round(x / 2**20, 1) for x in after],
                  "rss_peak_mb": [round(x / 2**20, 1) for x in peak],
                  "rss_after_delete_mb": [round(x / 2**20, 1) for x in deleted],
                  "bytes_per_msg_rss": [round((a - b) / max(n, 1), 1) for a, b in zip(after, before, strict=True)],
                  "queue_process_bytes_per_msg": (round(info["memory"] / max(n, 1), 1)
                                                  if c.kind == "rabbitmq" and info.get("memory") else None),
                  "command": "hutch-perf " + " ".join(cmd[1:])})


def cmd_machine_bytes(args: argparse.Namespace) -> None:
    """The quorum machine's own RAM per ready message (docs/quorum-queues.md's tracemalloc method) at N."""
    import tracemalloc

    from hutch.queues.quorum import Meta, QueueState, apply, make_enqueue
    for with_publisher in (False, True):
        st = QueueState()
        cmds = [make_enqueue("p" if with_publisher else None, s + 1 if with_publisher else 0, 16)
                for s in range(args.count)]
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for i, cmd in enumerate(cmds, 1):
            apply(Meta(i, 1, 0), cmd, st)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        per = sum(s.size_diff for s in after.compare_to(before, "filename")) / args.count
        emit({"kind": "machine_bytes", "count": args.count, "tracked_publisher": with_publisher,
              "bytes_per_ready_message": round(per, 2), "ready": st.ready_count()})
        del cmds, st


# -- failover -------------------------------------------------------------------------------------------

async def _probe_until_confirmed(uri_text: str, queue: str, kill: Any, interval: float, limit: float) -> dict:
    """Publish one probe every `interval` s (confirms on) through a surviving node; call `kill()` once the
    connection is up and a first probe is confirmed; return when a probe published after the kill is acked."""
    from hutch.amqp import spec
    from hutch.perf.options import parse_uri
    from hutch.perf.producer import _ACK, CHANNEL, PublishPlan, encode_publish
    from hutch.perf.protocol import AmqpClient, connect

    loop = asyncio.get_running_loop()
    uri = parse_uri(uri_text)

    class Probe(AmqpClient):
        def __init__(self) -> None:
            super().__init__(uri)
            self.seq = 0
            self.acked: asyncio.Queue[tuple[int, bool, bool, float]] = asyncio.Queue()

        async def setup(self) -> None:
            await self.open_channel(CHANNEL)
            self.fast_methods[spec.Basic.Ack.INDEX] = lambda b, s, e: self._settle(b, s, True)
            self.fast_methods[spec.Basic.Nack.INDEX] = lambda b, s, e: self._settle(b, s, False)
            await self.call(CHANNEL, spec.Confirm.Select(), spec.Confirm.SelectOk)
            self.pre, self.suf = encode_publish(PublishPlan("", queue, 16), self.frame_max)

        def _settle(self, buf: bytes, start: int, ok: bool) -> None:
            tag, bits = _ACK.unpack_from(buf, start + 4)
            self.acked.put_nowait((tag, bool(bits & 1), ok, time.monotonic()))

        def publish(self) -> int:
            self.seq += 1
            self.transport.write(self.pre + time.clock_gettime_ns(time.CLOCK_MONOTONIC).to_bytes(8, "big")
                                 + self.suf)
            return self.seq

    client = await connect(uri, Probe)
    await client.setup()
    client.publish()
    await asyncio.wait_for(client.acked.get(), 10)
    first_after = client.seq + 1
    t_kill = await loop.run_in_executor(None, kill)
    nacks = 0
    events: list[tuple[float, int, str]] = []

    async def pump() -> None:
        while True:
            client.publish()
            await asyncio.sleep(interval)
    task = asyncio.create_task(pump())
    try:
        while True:
            left = limit - (time.monotonic() - t_kill)
            if left <= 0:
                return {"ok": False, "nacks": nacks, "events": events}
            try:
                tag, _multiple, ok, at = await asyncio.wait_for(client.acked.get(), left)
            except TimeoutError:
                continue
            events.append((round(at - t_kill, 3), tag, "ack" if ok else "nack"))
            if not ok:
                nacks += 1
            elif tag >= first_after:
                return {"ok": True, "seconds": round(at - t_kill, 3), "nacks": nacks, "probes": client.seq,
                        "events": events[:20]}
    finally:
        task.cancel()
        await client.close()


def cmd_failover(args: argparse.Namespace) -> None:
    assert args.nodes >= 3, "failover needs 3 nodes"
    with Brokers(args) as clusters:
        for c in clusters:
            queue = "qq-failover"
            declare_quorum(c.port(0), queue)
            names = c.node_names()
            for rnd in range(1, args.rounds + 1):
                info: dict[str, Any] = {}
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # every member online, a leader known
                    info = c.queue_info(queue)
                    if info.get("leader") in names and len(info.get("online") or []) == len(names):
                        break
                    time.sleep(0.5)
                time.sleep(2)
                leader = names.index(info["leader"])
                survivor = (leader + 1) % len(names)
                res = asyncio.run(_probe_until_confirmed(c.uri(survivor), queue, lambda i=leader, c=c: c.kill(i),
                                                         args.interval, 60.0))
                after = c.queue_info(queue, via=survivor)
                emit({"kind": "failover", "broker": c.kind, "round": rnd, "killed": names[leader],
                      "via": names[survivor], "new_leader": after.get("leader"), **res})
                c.restart(leader)
            delete_queue(c.port(0), queue)


# -- profile --------------------------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> None:
    """py-spy on hutch's node 1 (the queue's leader) in the steady state of the throughput scenario."""
    args.brokers = "hutch"
    size = int(args.sizes.split(",")[0])
    with Brokers(args) as clusters:
        c = clusters[0]
        total = args.seconds + 12
        cmd = [PERF, "--uri", c.uri(0), *SCENARIO, "-s", str(size), "--quorum-queue", "-z", str(total), "--json"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        raw = Path(args.base) / "qq-profile.txt"
        spy = [str(VENV / "py-spy"), "record", "-d", str(int(args.seconds)), "-r", "200", "-f", "raw", "--nolineno",
               "--threads", "-o", str(raw), "--pid", str(c.pid(0))]
        try:
            time.sleep(6)
            leader = c.queue_info(f"hutch-perf-{p.pid}", via=0).get("leader")
            subprocess.run(spy, capture_output=True, check=True)
            out, _ = p.communicate(timeout=total + 60)
        finally:
            if p.poll() is None:
                p.kill()
        result = json.loads(out.strip().splitlines()[-1])
        # self and inclusive time of the event-loop thread, as a share of the wall time sampled (200 Hz);
        # the executor threads (fdatasync jobs) are reported as totals
        self_time: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        threads: Counter[str] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = stack.split(";")
            threads[frames[0]] += n
            if "MainThread" not in frames[0]:
                continue
            self_time[frames[-1]] += n
            for f in set(frames[1:]):
                inclusive[f] += n
        if args.stacks:
            shutil.copy(raw, args.stacks)
        raw.unlink(missing_ok=True)
        wall = 200 * int(args.seconds)

        def pct(n: int) -> float:
            return round(100 * n / wall, 1)
        emit({"kind": "profile", "nodes": args.nodes, "size": size, "leader": leader, "wall_samples": wall,
              "receive_rate": result["receive_rate"], "py_spy": "py-spy " + " ".join(spy[1:]),
              "perf": "hutch-perf " + " ".join(cmd[1:]),
              "threads_busy_pct": {t: pct(n) for t, n in threads.most_common()},
              "main_top_self": [{"function": f, "pct": pct(n)} for f, n in self_time.most_common(args.top)],
              "main_top_inclusive": [{"function": f, "pct": pct(n)} for f, n in inclusive.most_common(args.top)]})


def cmd_summary(args: argparse.Namespace) -> None:
    """Markdown tables (medians, ratios) from the JSON lines of earlier runs (`--results FILE`)."""
    import statistics
    rows = [json.loads(ln) for f in args.results for ln in Path(f).read_text().splitlines() if ln.startswith("{")]

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")
    thr = [r for r in rows if r["kind"] == "throughput"]
    if thr:
        print("| setting | hutch msg/s (rounds) | RabbitMQ msg/s (rounds) | hutch / RabbitMQ (median) | per round |"
              " hutch p50 / p99 | RabbitMQ p50 / p99 | others' CPU (h / r) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for nodes, size in sorted({(r["nodes"], r["size"]) for r in thr}):
            h = [r for r in thr if (r["nodes"], r["size"], r["broker"]) == (nodes, size, "hutch")]
            b = [r for r in thr if (r["nodes"], r["size"], r["broker"]) == (nodes, size, "rabbitmq")]
            hr, br = [r["receive_rate"] for r in h], [r["receive_rate"] for r in b]
            per = [f"{x / y:.2f}" for x, y in zip(hr, br, strict=False) if y]
            print(f"| {nodes} node{'s' if nodes > 1 else ''}, {size} B | {' / '.join(f'{x:,}' for x in hr)} | "
                  f"{' / '.join(f'{x:,}' for x in br)} | **{med(hr) / med(br):.2f}×** | {', '.join(per)} | "
                  f"{med([r['p50_us'] for r in h]) / 1000:.0f} / {med([r['p99_us'] for r in h]) / 1000:.0f} ms | "
                  f"{med([r['p50_us'] for r in b]) / 1000:.0f} / {med([r['p99_us'] for r in b]) / 1000:.0f} ms | "
                  f"{med([r['cpu']['others_pct'] for r in h]):.0f} % / {med([r['cpu']['others_pct'] for r in b]):.0f} % |")
        print()
        print("| setting | broker | broker CPU % (per node) | client CPU % | broker CPU µs per message |")
        print("| --- | --- | ---: | ---: | ---: |")
        for nodes, size in sorted({(r["nodes"], r["size"]) for r in thr}):
            for broker in ("hutch", "rabbitmq"):
                sel = [r for r in thr if (r["nodes"], r["size"], r["broker"]) == (nodes, size, broker)]
                if not sel:
                    continue
                cpu = med([r["cpu"]["broker_pct"] for r in sel])
                nodes_cpu = [med([r["cpu"]["broker_pct_per_node"][i] for r in sel]) for i in range(nodes)]
                us = med([10_000 * r["cpu"]["broker_pct"] / r["receive_rate"] for r in sel])
                print(f"| {nodes} n, {size} B | {broker} | {cpu:.0f} ({' + '.join(f'{x:.0f}' for x in nodes_cpu)})"
                      f" | {med([r['cpu']['client_pct'] for r in sel]):.0f} | {us:.0f} |")
        print()
    for kind in ("fsyncs", "latency", "memory", "failover", "machine_bytes", "profile"):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        print(f"## {kind}")
        if kind == "latency":
            for nodes in sorted({r["nodes"] for r in sel}):
                for broker in ("hutch", "rabbitmq"):
                    s2 = [r for r in sel if r["nodes"] == nodes and r["broker"] == broker]
                    if s2:
                        cl = [r["confirm_latency_us"] for r in s2]
                        co = [r["consumer_latency_us"] for r in s2]
                        print(f"{nodes} n {broker}: confirm p50 {[c['p50'] for c in cl]} p99 {[c['p99'] for c in cl]}"
                              f" -> median {med([c['p50'] for c in cl]) / 1000:.2f} / {med([c['p99'] for c in cl]) / 1000:.2f} ms;"
                              f" consumer p50/p99 median {med([c['p50'] for c in co]) / 1000:.2f} /"
                              f" {med([c['p99'] for c in co]) / 1000:.2f} ms; rate {[r['confirm_rate'] for r in s2]};"
                              f" broker CPU {med([r['broker_cpu_pct'] for r in s2]):.0f} %")
        elif kind == "failover":
            for broker in ("hutch", "rabbitmq"):
                s2 = [r for r in sel if r["broker"] == broker]
                ok = [r["seconds"] for r in s2 if r.get("ok")]
                if s2:
                    print(f"{broker}: {len(ok)}/{len(s2)} ok, seconds {ok}, median {med(ok):.3f}, "
                          f"max {max(ok) if ok else float('nan'):.3f}; nacks {[r['nacks'] for r in s2]}")
        else:
            for r in sel:
                print(json.dumps({k: v for k, v in r.items() if k not in ("command", "cpu")}))
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["throughput", "fsyncs", "latency", "memory", "failover", "profile",
                                     "machine-bytes", "summary"])
    ap.add_argument("--results", nargs="*", default=[], help="summary: JSON-lines files")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--brokers", default="hutch,rabbitmq")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--sizes", default="16,1000")
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--settle", type=float, default=10.0, help="memory: seconds after publishing before RSS")
    ap.add_argument("--interval", type=float, default=0.02, help="failover: seconds between probes")
    ap.add_argument("--base", default="/tmp/qqb")
    ap.add_argument("--stacks", default=None, help="profile: also keep py-spy's raw (collapsed) stacks here")
    ap.add_argument("--hutch-config", default="", help="extra hutch config lines, ';'-separated")
    ap.add_argument("--rabbit-config", default="", help="rabbitmq.conf lines, ';'-separated (default: empty)")
    ap.add_argument("--top", type=int, default=25, help="profile: functions listed")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' data directories")
    args = ap.parse_args()
    # SIGTERM or SIGINT (also when started in the background, where SIGINT is ignored) stop the brokers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fn = {"throughput": cmd_throughput, "fsyncs": cmd_fsyncs, "latency": cmd_latency, "memory": cmd_memory,
          "failover": cmd_failover, "profile": cmd_profile, "machine-bytes": cmd_machine_bytes,
          "summary": cmd_summary}[args.what]
    fn(args)


if __name__ == "__main__":
    main()
