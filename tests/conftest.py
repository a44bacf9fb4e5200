"""Shared fixtures: a real `hutch-server` process on free ports.

`hutch_server` is one node for the whole run (one per `HUTCH_TEST_WORKERS` value: the workers copies of
the client suites get a node of 2 workers, below); `fresh_server` (function scope) starts a node for tests
that need a clean or specially configured broker. Both give a `ServerInfo` with the ports and data
directory. Tests never use 5672/15672.

The workers copies (tests/worker_suites.py): the client suites of `WORKER_SUITES` are collected twice, the
second time as `<module>[workers2]`, marked `workers2`; each test of a copy runs with `HUTCH_TEST_WORKERS=2`
in the environment (`pytest_runtest_protocol` below), so every node its fixtures start is a node of 2
workers. Both copies run in one session (`make test`); `make test-workers` runs only the copies.

Ports (issue 22): a node is started with port 0 on every listener and the fixture reads the ports it
bound from its ports file (hutch/portfile.py). Picking a number by binding port 0 and closing the
socket raced every client on the machine (the number is in the ephemeral range clients' source ports
come from: "address already in use" under a connection churn). `free_port()` stays for the few places
that need a number before anything listens (a port nobody listens on, a refused connection).

Nodes are forked (tests/node_forkserver.py): `start_server` and tests/cluster/nodes.py hand the command to
a fork server that has imported hutch once, so a node's start does not import it again (0.2-0.4 s instead
of 1.1-1.4 s); each node is still a process of its own. `HUTCH_TEST_EXEC_NODES=1`: a fresh interpreter each.

Parallel runs (docs/testing.md): `make test` runs pytest-xdist with `--dist loadgroup`, and
`pytest_xdist_make_scheduler` below makes each test module a unit of work (the Spark suite one unit),
handed out costliest first (tests/xdist_schedule.py), so a module's tests run in one worker, one after
another, in file order: a module- or session-scoped server is started once per worker that needs it, and
one Spark session (one JVM) serves the whole Spark suite.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hutch.portfile import NodeDidNotStart, wait_for_ports
from node_forkserver import spawn_node
from worker_suites import (
    DESELECTED,
    SLOW_COPIES,
    WORKER_SUITES,
    WORKERS_COPY,
    WORKERS_COPY_COUNT,
    copy_nodeid,
    original_nodeid,
)

# Bytecode is written and reused (__pycache__, git-ignored) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1 on the shared machine): every process this run starts (nodes, cluster
# nodes, hutchctl, xdist workers, Spark's Python workers) inherits it, so a node's start does not compile
# hutch's ~250 modules again, nor a worker rewrite every test module (docs/testing.md, "Where the time goes").
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

TEST_WORKERS_ENV = "HUTCH_TEST_WORKERS"
"""Set (e.g. to 2), every `start_server` node runs with `--workers` that many: the client-facing suites
against a node of worker processes (docs/scaling.md); unset, a node is one process (`--workers 1`, given
explicitly: the server's default, auto, would make the suite's behaviour depend on the machine's cores)."""


_BASE_TEST_WORKERS = os.environ.get(TEST_WORKERS_ENV)
"""`HUTCH_TEST_WORKERS` as the run was started with: what every test but a workers copy's runs with."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{WORKERS_COPY}: a test of a client suite's copy run against a node of "
                            f"{WORKERS_COPY_COUNT} workers (tests/worker_suites.py; `make test-workers` runs only these)")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """A client suite of `WORKER_SUITES` once more, as its workers copy (beside the module pytest collects)."""
    try:
        module = file_path.relative_to(parent.config.rootpath).as_posix()
    except ValueError:
        return None
    if module not in WORKER_SUITES:
        return None
    copy: pytest.Module = pytest.Module.from_parent(parent, path=file_path, nodeid=copy_nodeid(module))
    copy.add_marker(WORKERS_COPY)
    return copy


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: the slow copies are marked here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    copies = [(item, original) for item in items if (original := original_nodeid(item.nodeid)) != item.nodeid]
    for item, original in copies:
        if original in SLOW_COPIES:
            item.add_marker(pytest.mark.slow)
    left_out = [item for item, original in copies if original in DESELECTED]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]
    from xdist_schedule import repeated_ids
    repeated = repeated_ids(item.nodeid for item in items)
    if repeated:  # under xdist only one test of each would run, and nothing would say so
        raise pytest.UsageError(f"{len(repeated)} test ids are shared by several tests (each id must name one "
                                f"test: docs/testing.md): {', '.join(repeated[:5])}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A workers copy's test (setup, call and teardown, its module's fixtures included) runs with
    `HUTCH_TEST_WORKERS=2`; every other test with the value the run was started with."""
    if item.get_closest_marker(WORKERS_COPY) is not None:
        os.environ[TEST_WORKERS_ENV] = WORKERS_COPY_COUNT
    elif _BASE_TEST_WORKERS is None:
        os.environ.pop(TEST_WORKERS_ENV, None)
    else:
        os.environ[TEST_WORKERS_ENV] = _BASE_TEST_WORKERS
    return (yield)


DURATIONS_OUT_ENV = "HUTCH_TEST_DURATIONS_OUT"
"""Set to a path, the run writes there the seconds each unit of work took (setup, call and teardown of its
tests): `make test-durations` refreshes tests/durations.json, the order `make test` hands units out in."""


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # the hook is xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` hands out hutch's units of work (a module; the Spark suite as one), costliest
    first (tests/xdist_schedule.py says why xdist's own loadgroup does not do it under pytest 9.2)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist_schedule import ModuleScheduling
    return ModuleScheduling(config, log)


_unit_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(DURATIONS_OUT_ENV) and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller
        from xdist_schedule import group_of
        unit = group_of(report.nodeid)
        _unit_seconds[unit] = _unit_seconds.get(unit, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(DURATIONS_OUT_ENV)
    if out and _unit_seconds and not os.environ.get("PYTEST_XDIST_WORKER"):
        ranked = sorted(_unit_seconds.items(), key=lambda kv: (-kv[1], kv[0]))
        Path(out).write_text(json.dumps({k: round(v, 1) for k, v in ranked}, indent=1) + "\n")


NODE_LOG_ENV = "HUTCH_TEST_NODE_LOG"
"""Set to a path, every node start (`start_server`, and each node of tests/cluster/nodes.py) appends a line
there: the test that started it, the phase (setup: a fixture's; call: the test's own) and its `--workers`
(`start_server`'s), tab-separated. A count by module of where nodes are still started (docs/testing.md,
"Where the time goes")."""


def note_node_start(workers: str = "") -> None:
    path = os.environ.get(NODE_LOG_ENV)
    if path:
        test, _, phase = os.environ.get("PYTEST_CURRENT_TEST", "? (?)").rpartition(" ")
        with open(path, "a") as out:  # one short write per line: the xdist workers' lines do not mix
            out.write(f"{test}\t{phase.strip('()')}\t{workers}\n")


PASSED_ENV = ("HUTCH_PURE", "HUTCH_WORKER_EXEC")
"""The HUTCH_* variables of the test process that `start_server`'s nodes take (the others are the tests')."""


def free_port() -> int:
    """A port number nothing listened on a moment ago: only for "nobody listens here" (a refused
    connection), never to hand to a server (start it with port 0 and read its ports file)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerInfo:
    amqp_port: int
    management_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # every listener's bound port (the ports file)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def mgmt_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def start_server(tmp: Path, *extra_args: str, env: dict[str, str] | None = None,
                 config_text: str | None = None, cluster: bool | None = False) -> ServerInfo:
    """A hutch-server on free ports. A lone node is a cluster of one by default, on port 25672, which
    parallel test servers must not share: `cluster=False` (the default here) starts it with
    --no-cluster, `cluster=True` as a cluster of one on a free inter-node port, `cluster=None` with
    neither flag (the caller's `extra_args` or `env` say what it needs)."""
    data_dir = tmp / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = tmp / "server.log"
    args = [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0",
            "--management-port", "0", "--data-dir", str(data_dir), "--node-name", "test@localhost"]
    if config_text is not None:
        cfg = tmp / "hutch.conf"
        cfg.write_text(config_text)
        args += ["--config", str(cfg)]
    if cluster is True:
        args += ["--cluster-port", "0"]
    elif cluster is False:
        args.append("--no-cluster")
    if "--workers" not in extra_args:  # auto (the server's default) would follow the machine's cores
        args += ["--workers", os.environ.get(TEST_WORKERS_ENV) or "1"]  # a suite against a node of workers
    args += list(extra_args)
    full_env = {k: v for k, v in os.environ.items()  # HUTCH_PURE: the pure hot path; HUTCH_WORKER_EXEC:
                if not k.startswith("HUTCH_") or k in PASSED_ENV}  # workers exec'd, not forked
    full_env.update(env or {})
    note_node_start(_flag(args, "--workers"))
    proc = spawn_node(args, full_env, log_path)  # forked from a process that imported hutch already
    ports = node_ports(_flag(args, "--data-dir"), proc, log_path)
    return ServerInfo(ports["amqp"], ports.get("management", 0), data_dir, proc, log_path, env or {}, ports)


def node_ports(data_dir: str | Path, proc: subprocess.Popen[bytes], log_path: Path,
               timeout: float = 40.0) -> dict[str, int]:
    """The ports the node process `proc` bound (listener name -> port), from its ports file, once every
    listener accepts connections; RuntimeError (with the log) if it exits or writes none in time."""
    try:
        return wait_for_ports(data_dir, proc, timeout, log_path)
    except NodeDidNotStart as exc:
        raise RuntimeError(str(exc)) from None


def _flag(args: list[str], name: str) -> str:
    """The value of the last `name` flag in `args` (argparse's rule: the last one wins)."""
    return args[len(args) - 1 - args[::-1].index(name) + 1]


class SharedNodes:
    """The session's shared nodes, one per name and `HUTCH_TEST_WORKERS` value (a workers copy's tests
    get their own node of workers), each started when a test first asks for it, all stopped at the end."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._nodes: dict[tuple[str, str], ServerInfo] = {}

    def get(self, name: str, config_text: str | None = None) -> ServerInfo:
        workers = os.environ.get(TEST_WORKERS_ENV) or "1"
        info = self._nodes.get((name, workers))
        if info is None:
            info = start_server(self._factory.mktemp(f"{name}-w{workers}"), config_text=config_text)
            self._nodes[(name, workers)] = info
        return info

    def stop_all(self) -> None:
        for info in self._nodes.values():
            info.stop()


@pytest.fixture(scope="session")
def shared_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedNodes]:
    nodes = SharedNodes(tmp_path_factory)
    yield nodes
    nodes.stop_all()


@pytest.fixture
def hutch_server(shared_nodes: SharedNodes) -> ServerInfo:
    """The run's shared node (of 2 workers for a workers copy's test)."""
    return shared_nodes.get("hutch")


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerInfo]:
    info = start_server(tmp_path)
    yield info
    info.stop()


def self_feeding_channel_gets_everything(conn: Any, queue: str, total: int = 20_000, seconds: float = 60.0) -> None:
    """Credit flow's self-feeding case (classic and quorum): one pika channel publishes `total` messages
    to `queue` (declared) while consuming from it (prefetch 100, acking in batches of 50). If its
    connection is held, its own acks are not read, so its consumer stops keeping pace and the recheck
    lets it go: every message comes back within `seconds`."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[int] = []

    def on_message(c: Any, m: Any, _p: Any, _b: bytes) -> None:
        got.append(1)
        if len(got) % 50 == 0:
            c.basic_ack(m.delivery_tag, multiple=True)

    ch.basic_consume(queue, on_message)
    for i in range(total):
        ch.basic_publish("", queue, b"m")
        if i % 1000 == 0:
            conn.process_data_events(0)
    deadline = time.monotonic() + seconds
    while len(got) < total and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert len(got) == total
    ch.queue_delete(queue)


def slow_consumer(conn: Any, queue: str, stop: Any) -> None:
    """A consumer truly slower than a publisher at full speed (prefetch 50, one ack every ~2 ms) on
    `conn` (a pika BlockingConnection) until `stop` (a threading.Event) is set; closes `conn`. Credit
    flow must not hold the publisher to its pace: the queue grows, as in RabbitMQ."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    for method, _props, _body in ch.consume(queue, inactivity_timeout=0.1):
        if stop.is_set():
            break
        if method is not None:
            time.sleep(0.002)
            ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()
