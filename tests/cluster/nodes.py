"""Multi-process clusters of real hutch nodes on loopback, for tests.

`Cluster.start(tmp, n)` starts node n1 (which founds the cluster) and joins n2..nN through it, every
node a `hutch-server` process with its own data directory and free ports. Nodes can be stopped,
killed (-9), paused (SIGSTOP) and restarted on the same ports and data.

Ports: a node keeps its ports across restarts (the other members know it at its inter-node port), so
`Cluster.add` gives each node ports outside the kernel's ephemeral range (`stable_port`): a port from
that range (what port 0 gives) can be taken, while its node is down, by the local end of some client's
connection, and the node then cannot restart ("address already in use": it failed a fresh-clone run of
`make test` once, tests/cluster/test_shovel_cluster.py, session 15). A `Node` made by hand with port 0
learns the ports its first start bound from its ports file (hutch/portfile.py).

Nodes of workers (`workers="2"`, `Cluster.start(tmp, 3, workers="2")`; docs/scaling.md, "A node of workers
in a multi-node cluster"): the node's process is its supervisor, and a node's `kill` (-9), `pause` and
`resume` signal the supervisor and every worker at once, as a machine's crash or a stopped VM would; its
inter-node port is its worker 0's, the seed the others join through.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ServerInfo, node_ports, note_node_start, spawn_node

from hutch import portfile

SECRET = "test-cluster-secret"
FAST = "cluster.tick_interval = 50\ncluster.metadata_timeout = 4000\ncluster.fault_injection = true\n"


@dataclass
class Node:
    name: str
    directory: Path
    amqp_port: int  # 0 until the first start has reported the port it bound (`wait_ready`)
    management_port: int
    cluster_port: int
    join: str | None
    secret: str = SECRET
    config_text: str = FAST
    env: dict[str, str] = field(default_factory=dict)  # extra environment (HUTCH_* ones pass too)
    workers: str = "1"  # --workers: one process, unless a test asks (auto, the default, follows the cores)
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.name}@localhost"

    @property
    def seed(self) -> str:
        assert self.cluster_port, f"{self.name} has not reported its inter-node port yet (not started?)"
        return f"{self.full_name}@127.0.0.1:{self.cluster_port}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def info(self) -> ServerInfo:
        assert self.proc is not None
        return ServerInfo(self.amqp_port, self.management_port, self.directory / "data", self.proc, self.logs[-1])

    def start(self, wait: bool = True) -> Node:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.directory / "hutch.conf"
        cfg.write_text(self.config_text)
        log_path = self.directory / f"server-{len(self.logs)}.log"
        self.logs.append(log_path)
        args = [sys.executable, "-m", "hutch.cli.server", "--amqp-port", str(self.amqp_port),
                "--management-port", str(self.management_port), "--data-dir", str(data),
                "--node-name", self.full_name, "--cluster-port", str(self.cluster_port), "--config", str(cfg), "--workers", self.workers]
        if self.join:
            args += ["--join", self.join]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}  # HUTCH_PURE: the pure hot path
        env["HUTCH_CLUSTER_SECRET"] = self.secret
        env.update(self.env)
        note_node_start()
        self.proc = spawn_node(args, env, log_path)  # forked from a process that imported hutch already
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 40.0) -> None:
        """Until the node's listeners are all up (its ports file); learns the ports a first start bound."""
        assert self.proc is not None
        ports = node_ports(self.directory / "data", self.proc, self.logs[-1], timeout)
        self.amqp_port, self.management_port = ports["amqp"], ports["management"]
        self.cluster_port = ports.get("cluster", 0)  # a node of workers: its worker 0's (the node's seed)

    def reported_ports(self) -> bool:
        """Whether this process has written its ports file (its listeners are open)."""
        doc = portfile.read(self.directory / "data")
        return doc is not None and self.proc is not None and doc.get("pid") == self.proc.pid

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def worker_pids(self) -> list[int]:
        """The node's worker processes (a node of workers: the supervisor's children), none for one process."""
        if self.proc is None or self.workers == "1":
            return []
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def _signal_all(self, sig: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        workers = self.worker_pids()
        if sig == signal.SIGTERM:
            self._signal_all(signal.SIGCONT, [self.proc.pid, *workers])
        elif sig == signal.SIGKILL:  # the node's crash: its workers die with it, not after it
            self._signal_all(signal.SIGKILL, workers)
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_all(signal.SIGKILL, workers)
            self.proc.kill()
            self.proc.wait(timeout)
        _wait_gone(workers, timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def pause(self) -> None:
        assert self.proc is not None
        self._signal_all(signal.SIGSTOP, [self.proc.pid, *self.worker_pids()])

    def resume(self) -> None:
        assert self.proc is not None
        self._signal_all(signal.SIGCONT, [self.proc.pid, *self.worker_pids()])

    # -- the HTTP API ----------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None, user: str = "guest", password: str = "guest",
            timeout: float = 20.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.management_port}{path}", data=data, method=method)
        req.add_header("Authorization", "Basic " + b64encode(f"{user}:{password}".encode()).decode())
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def block(self, *others: Node) -> None:
        code, doc = self.api("POST", "/api/cluster-faults", {"block": [o.full_name for o in others]})
        assert code == 200, doc

    def unblock(self, *others: Node) -> None:
        code, doc = self.api("POST", "/api/cluster-faults", {"unblock": [o.full_name for o in others]})
        assert code == 200, doc

    def ctl(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}  # HUTCH_PURE: the pure hot path
        return subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--port", str(self.management_port), *args],
                              capture_output=True, text=True, timeout=timeout, env=env)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_taken: set[int] = set()


def stable_port() -> int:
    """A free port outside the kernel's ephemeral range. A node keeps its ports across restarts; a port
    from the ephemeral range (what `free_port` gives) can be taken, while the node is down, by the local
    end of some client's connection, and the node then cannot restart ("address already in use").
    Under pytest-xdist each worker takes its own residue class of ports, so two workers never pick the
    same one (a port is free between a node's kill and its restart)."""
    lo, hi = _ephemeral_range()
    low, high = (20000, lo - 1) if lo > 21000 else (hi + 1, 65000)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(low, high)
        if port % workers != worker % workers or port in _taken or port in (5551, 5552, 5672, 15672, 25672):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise RuntimeError("no free port outside the ephemeral range")


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nodes: list[Node] = []

    def add(self, name: str | None = None, join: bool = True, start: bool = True, **kw: Any) -> Node:
        """A node (`workers="2"` among `kw`: a node of 2 workers), joining the first one unless `join` is False."""
        name = name or f"n{len(self.nodes) + 1}"
        seed = self.nodes[0].seed if join and self.nodes else None
        # ports outside the ephemeral range (`stable_port`): a restart asks for the same ports again
        node = Node(name, self.tmp / name, stable_port(), stable_port(), stable_port(), seed, **kw)
        self.nodes.append(node)
        if start:
            node.start()
        return node

    @classmethod
    def start(cls, tmp: Path, n: int, workers: str = "1") -> Cluster:
        c = cls(tmp)
        for _ in range(n):
            c.add(workers=workers)
        return c

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def partition(self, side: list[Node], other: list[Node]) -> None:
        """Cut every link between the two sides (each node drops the other side's traffic)."""
        for a in side:
            a.block(*other)
        for b in other:
            b.block(*side)

    def heal(self) -> None:
        for a in self.nodes:
            if a.running():
                a.unblock(*[b for b in self.nodes if b is not a])

    def status(self, via: Node | None = None) -> dict[str, Any]:
        node = via or next(n for n in self.nodes if n.running())
        code, doc = node.api("GET", "/api/cluster-status")
        assert code == 200, doc
        return doc

    def wait_running(self, expected: set[str], via: Node | None = None, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = self.status(via)
            if {short(n) for n in doc["running_nodes"]} == expected:
                return doc
            time.sleep(0.2)
        raise AssertionError(f"running nodes {doc.get('running_nodes')} != {sorted(expected)}")


def short(name: str) -> str:
    """'n1@localhost' -> 'n1' (and a worker's 'n1@localhost#w0' -> 'n1')."""
    return name.split("@", 1)[0]


def node_of(name: str) -> str:
    """A member's node: 'n1@localhost#w1' -> 'n1@localhost' (a node's own name stays)."""
    node, sep, index = name.rpartition("#w")
    return node if sep and index.isdigit() else name


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Until none of `pids` runs (a killed node's workers, reaped by whoever adopted them)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.02)


def member_names(doc: dict[str, Any]) -> list[str]:
    return [short(m["name"]) for m in doc["members"]]


def eventually(check: Any, timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Call `check` until it returns a truthy value without raising; return that value."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(interval)
    if last is not None:
        raise last
    raise AssertionError("condition not met in time")
