"""A Jepsen-style test of quorum queues (issue 7) and of replicated streams (issue 23): workloads, nemesis
and checkers, reusable.

`run(tmp, JepsenConfig(nodes=3, seconds=20, seed=1))` starts a cluster of real hutch-server processes
(tests/cluster/nodes.py), declares a quorum queue with a member on every node and, for `seconds`:

- publishers (threads, each with its own pika connection to a node; on failure they reconnect to another)
  publish unique bodies `p<i>-<n>` with confirms: an ack is *confirmed*, a nack *failed*, a connection or
  channel error or a timeout before the confirm *unknown*;
- consumers (threads with connections to different nodes) consume with manual acks and prefetch 50,
  recording every body they receive before acking it (reconnecting on failure, re-consuming on a
  broker cancel), and take breaks (disconnect for a few seconds) so that a backlog builds up and
  connections close with deliveries in flight;
- the nemesis (seeded `random.Random(seed)`, one fault at a time: wait, inject, hold, undo): kill -9 of
  one node or a minority (restarted after a while), SIGSTOP/SIGCONT, partitions (random halves, one node
  isolated, and the "majorities ring": on 5 nodes each node blocks its two non-neighbours of a random
  ring so that every node sees a different majority; on 3 nodes the same idea is a bridge, one link cut),
  and a crash of every node at once; the queue's leader is the victim half the time.

Then everything is healed, dead nodes restarted, the cluster awaited, the publishers stopped, the
consumers kept on until the queue is drained, the rest fetched with basic.get through every node, and
the checker asserts: every confirmed message was consumed at least once, nothing that was never
published was consumed, and every node reports the queue empty. Duplicates (consumed more than once),
unknown and failed outcomes are figures, not failures.

The stream workload (`JepsenConfig(kind="stream")`, `run` declares a stream with a member on every node):
the same publishers and nemesis, no consumers during the run; after healing, every node's log is read
from `first` with pika (x-stream-offset) until every confirmed message has come and the stream is quiet,
and the checker asserts: every confirmed message is on every member, once (no body twice), in each
publisher's order, nothing that was never published is there, every member holds the same
(offset, body) sequence, and its offsets are dense (no offset without a message, as on RabbitMQ). Unknown and nacked publishes may be there or not (once at most).

Every client call is bounded: connection establishment by pika's socket/stack timeouts, every blocking
call by a watchdog thread that shuts the connection's socket down once a deadline passes (pika then
raises in the blocked call), every thread join by a timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from .nodes import Cluster, Node, node_of, short, stable_port

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
STATUS_FIELDS = ("leader", "messages_ready", "messages_unacknowledged", "consumers")


@dataclass
class JepsenConfig:
    nodes: int = 3
    seconds: float = 20.0
    seed: int = 0
    publishers: int = 3
    consumers: int = 3
    queue: str = "jepsen-qq"
    prefetch: int = 50
    calm: tuple[float, float] = (1.0, 2.5)  # seconds between faults
    fault: tuple[float, float] = (1.5, 4.0)  # seconds a fault lasts
    publish_pause: float = 0.002  # between a publisher's publishes (leaves CPU to the brokers)
    # nemesis faults and their weights; "crash" kills every node at once (a cluster-wide power cut)
    faults: tuple[tuple[str, int], ...] = (("kill", 2), ("pause", 2), ("halves", 1), ("isolate", 1),
                                           ("ring", 1), ("crash", 1))
    # consumers take breaks (disconnect for a while) so that a backlog builds up: (every, for) seconds
    consumer_breaks: tuple[float, float] | None = (6.0, 2.5)
    confirm_timeout: float = 10.0  # a publish not confirmed by then is "unknown"
    call_timeout: float = 10.0  # any other blocking client call
    recover_timeout: float = 60.0  # the cluster back on its feet after the run
    drain_timeout: float = 120.0  # the consumers draining the queue, at most
    stall_timeout: float = 20.0  # ... and without any progress
    config_text: str | None = None  # the nodes' hutch.conf (default: the harness's FAST)
    kind: str = "quorum"  # or "stream": a replicated stream, read back on every member after healing
    workers: str = "1"  # --workers of every node: "2" is a cluster of nodes of 2 worker processes each


@dataclass
class JepsenResult:
    config: dict[str, Any]
    attempted: int = 0
    confirmed: int = 0
    failed: int = 0
    unknown: int = 0
    consumed_distinct: int = 0
    deliveries: int = 0
    duplicates: int = 0  # deliveries beyond the first of a message
    duplicated_messages: int = 0  # messages delivered more than once
    unknown_consumed: int = 0  # unknown outcome, but the message was there
    failed_consumed: int = 0  # nacked, and still delivered (allowed: a nack promises nothing)
    drained_by_get: int = 0
    stream_lengths: dict[str, int] = field(default_factory=dict)  # stream: node -> messages read from first
    lost: list[str] = field(default_factory=list)  # confirmed, never consumed: a violation
    lost_at: dict[str, float] = field(default_factory=dict)  # the first lost: published at (s from start)
    phantom: list[str] = field(default_factory=list)  # consumed, never published: a violation
    final_counts: dict[str, Any] = field(default_factory=dict)  # node -> messages / error
    problems: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    wall_start: float = 0.0
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        c = self.config
        head = (f"jepsen {'' if c.get('kind', 'quorum') == 'quorum' else c['kind'] + ' '}"
                f"{c['nodes']} nodes{'' if c.get('workers', '1') == '1' else ' x ' + c['workers'] + ' workers'} "
                f"seed {c['seed']} {c['seconds']:.0f}s: "
                f"attempted {self.attempted}, "
                f"confirmed {self.confirmed}, lost {len(self.lost)}, phantom {len(self.phantom)}, "
                f"failed {self.failed}, unknown {self.unknown} "
                f"({self.unknown_consumed} of them consumed), consumed {self.consumed_distinct} distinct in "
                f"{self.deliveries} deliveries, duplicates {self.duplicates} "
                f"({self.duplicated_messages} messages), failed-but-consumed {self.failed_consumed}, "
                f"drained by get {self.drained_by_get}, "
                f"{'' if not self.stream_lengths else f'read per member {self.stream_lengths}, '}"
                f"faults {len(self.faults)} "
                f"[{', '.join(self.faults)}], {self.elapsed:.1f}s")
        if self.problems:
            head += "\nPROBLEMS:\n  " + "\n  ".join(self.problems)
        return head

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


class History:
    """What the clients did and saw; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.attempted: set[str] = set()
        self.attempted_at: dict[str, float] = {}  # body -> seconds since the start
        self.confirmed: set[str] = set()
        self.failed: set[str] = set()
        self.unknown: set[str] = set()
        self.consumed: Counter[str] = Counter()
        self.events: list[tuple[float, str, str]] = []

    def event(self, who: str, what: str) -> None:
        with self.lock:
            self.events.append((round(time.monotonic() - self.t0, 3), who, what))

    def attempt(self, body: str) -> None:
        with self.lock:
            self.attempted.add(body)
            self.attempted_at[body] = round(time.monotonic() - self.t0, 3)

    def outcome(self, body: str, kind: str) -> None:
        with self.lock:
            {"ok": self.confirmed, "nack": self.failed, "unknown": self.unknown}[kind].add(body)

    def consume(self, body: str) -> None:
        with self.lock:
            self.consumed[body] += 1


# -- clients -------------------------------------------------------------------------------------------

def params(node: Node, heartbeat: int = 5) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=node.amqp_port, heartbeat=heartbeat,
                                     socket_timeout=3, stack_timeout=6, blocked_connection_timeout=10,
                                     connection_attempts=1, retry_delay=0)


def _abort(conn: pika.BlockingConnection | None) -> None:
    """Shut the connection's socket down from any thread: a call blocked on it raises in its thread."""
    try:
        sock = conn._impl._transport._sock  # type: ignore[union-attr]
    except AttributeError:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _close(conn: pika.BlockingConnection | None) -> None:
    if conn is None:
        return
    _abort(conn)
    with contextlib.suppress(Exception):
        conn.close()


class Worker(threading.Thread):
    """A client thread owning one connection at a time, its blocking calls under the watchdog."""

    def __init__(self, name: str, nodes: list[Node], first: int, history: History, cfg: JepsenConfig,
                 rng: random.Random) -> None:
        super().__init__(name=name, daemon=True)
        self.nodes = nodes
        self.index = first
        self.history = history
        self.cfg = cfg
        self.rng = rng
        self.stop_event = threading.Event()
        self.conn: pika.BlockingConnection | None = None
        self.deadline: float | None = None
        self.aborted = 0
        self.errors: Counter[str] = Counter()

    @contextlib.contextmanager
    def guard(self, seconds: float) -> Iterator[None]:
        self.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            self.deadline = None

    def check_deadline(self) -> None:
        """Watchdog side."""
        deadline = self.deadline
        if deadline is not None and time.monotonic() > deadline:
            self.deadline = None
            self.aborted += 1
            self.history.event(self.name, "watchdog: blocked call timed out, socket shut down")
            _abort(self.conn)

    def node(self) -> Node:
        return self.nodes[self.index % len(self.nodes)]

    def connect(self) -> bool:
        node = self.node()
        try:
            conn = pika.BlockingConnection(params(node))
        except Exception as exc:  # noqa: BLE001 - a node down, paused or unready: try the next one
            self.failed(f"connect {short(node.full_name)}", exc)
            return False
        self.conn = conn
        return True

    def failed(self, what: str, exc: BaseException) -> None:
        kind = type(exc).__name__
        self.errors[kind] += 1
        self.history.event(self.name, f"{what}: {kind}: {(str(exc) or repr(exc))[:160]}")
        _close(self.conn)
        self.conn = None
        self.index += 1 + self.rng.randrange(len(self.nodes) - 1) if len(self.nodes) > 1 else 0
        self.stop_event.wait(0.2 + self.rng.random() * 0.3)


class Publisher(Worker):
    def __init__(self, pid: int, *args: Any) -> None:
        super().__init__(f"p{pid}", *args)
        self.n = 0
        self.ch: Any = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.conn is None:
                if not self.connect():
                    continue
                try:
                    with self.guard(self.cfg.call_timeout):
                        ch = self.conn.channel()  # type: ignore[union-attr]
                        ch.confirm_delivery()
                        self.ch = ch
                except Exception as exc:  # noqa: BLE001
                    self.failed("channel", exc)
                    continue
            body = f"{self.name}-{self.n}"
            self.n += 1
            self.history.attempt(body)
            try:
                with self.guard(self.cfg.confirm_timeout):
                    self.ch.basic_publish("", self.cfg.queue, body.encode(), PERSISTENT)
            except pika.exceptions.NackError:
                self.history.outcome(body, "nack")
                self.stop_event.wait(0.05)  # no leader, probably: do not spin
            except Exception as exc:  # noqa: BLE001 - the outcome is unknown
                self.history.outcome(body, "unknown")
                self.failed(f"publish {body} via {short(self.node().full_name)}", exc)
                continue
            else:
                self.history.outcome(body, "ok")
            if self.cfg.publish_pause:
                time.sleep(self.cfg.publish_pause)
        _close(self.conn)


class Consumer(Worker):
    def __init__(self, cid: int, *args: Any) -> None:
        super().__init__(f"c{cid}", *args)
        self.cancelled = False
        self.ch: Any = None
        self.draining = False  # set at the end: no more breaks
        self.next_break = self.break_time()

    def break_time(self) -> float:
        every = self.cfg.consumer_breaks[0] if self.cfg.consumer_breaks else 0
        return time.monotonic() + self.rng.uniform(0.5, 1.5) * every if every else float("inf")

    def take_break(self) -> None:
        """Disconnect for a while (what was prefetched and not yet seen goes back to the queue)."""
        assert self.cfg.consumer_breaks is not None
        pause = self.rng.uniform(0.5, 1.5) * self.cfg.consumer_breaks[1]
        self.history.event(self.name, f"break for {pause:.1f}s")
        _close(self.conn)
        self.conn = None
        self.stop_event.wait(pause)
        self.next_break = self.break_time()

    def on_message(self, ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.history.consume(body.decode())
        ch.basic_ack(method.delivery_tag)

    def on_cancel(self, _frame: Any) -> None:
        self.cancelled = True

    def run(self) -> None:
        while not self.stop_event.is_set():
            if not self.draining and time.monotonic() > self.next_break:
                self.take_break()
                continue
            if self.conn is None or self.cancelled:
                if self.cancelled:
                    self.history.event(self.name, f"cancelled by the broker on {self.node().name}")
                    self.failed("cancel", RuntimeError("basic.cancel"))
                    self.cancelled = False
                if not self.connect():
                    continue
                try:
                    with self.guard(self.cfg.call_timeout):
                        self.ch = self.conn.channel()  # type: ignore[union-attr]
                        self.ch.add_on_cancel_callback(self.on_cancel)
                        self.ch.basic_qos(prefetch_count=self.cfg.prefetch)
                        self.ch.basic_consume(self.cfg.queue, self.on_message, auto_ack=False)
                except Exception as exc:  # noqa: BLE001
                    self.failed(f"consume via {short(self.node().full_name)}", exc)
                    continue
            try:
                with self.guard(self.cfg.call_timeout):
                    self.conn.process_data_events(time_limit=0.2)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001
                self.failed(f"consuming via {short(self.node().full_name)}", exc)
        _close(self.conn)


class Watchdog(threading.Thread):
    def __init__(self, workers: list[Worker]) -> None:
        super().__init__(name="watchdog", daemon=True)
        self.workers = workers
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            for w in list(self.workers):
                w.check_deadline()


# -- the nemesis ---------------------------------------------------------------------------------------

def _api(node: Node, method: str, path: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        return node.api(method, path, body, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a paused or dead node
        return 0, str(exc)


def queue_info(node: Node, queue: str, timeout: float = 5.0) -> dict[str, Any] | None:
    code, doc = _api(node, "GET", f"/api/queues/%2F/{quote(queue, safe='')}", timeout=timeout)
    return doc if code == 200 and isinstance(doc, dict) else None


class Nemesis(threading.Thread):
    """Seeded faults, one at a time: each is injected, held, then undone (also when stopped)."""

    def __init__(self, cluster: Cluster, cfg: JepsenConfig, history: History) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.history = history
        self.stop_event = threading.Event()
        self.faults: list[str] = []
        self.paused: set[str] = set()
        self.blocked = False
        self.error: BaseException | None = None

    @property
    def nodes(self) -> list[Node]:
        return self.cluster.nodes

    def leader(self) -> Node | None:
        for node in self.nodes:
            if node.running() and node.name not in self.paused:
                info = queue_info(node, self.cfg.queue, timeout=3)
                if info and info.get("leader"):
                    # (a node of workers: the leader is one of its workers, `<node>#w<N>`)
                    return next((n for n in self.nodes if n.full_name == node_of(info["leader"])), None)
        return None

    def victims(self, count: int) -> list[Node]:
        """`count` nodes, the queue's leader among them half the time."""
        pool = list(self.nodes)
        chosen: list[Node] = []
        if self.rng.random() < 0.5:
            lead = self.leader()
            if lead is not None:
                chosen.append(lead)
                pool.remove(lead)
        self.rng.shuffle(pool)
        return chosen + pool[:count - len(chosen)]

    def note(self, what: str) -> None:
        self.faults.append(what)
        self.history.event("nemesis", what)

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.rng.uniform(*self.cfg.calm)):
                self.one_fault()
        except BaseException as exc:  # noqa: BLE001 - reported by the checker
            self.error = exc
            self.history.event("nemesis", f"nemesis failed: {exc!r}")

    def hold(self) -> None:
        self.stop_event.wait(self.rng.uniform(*self.cfg.fault))

    def one_fault(self) -> None:
        n = len(self.nodes)
        minority = (n - 1) // 2
        kinds, weights = zip(*self.cfg.faults, strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        if kind in ("kill", "crash"):
            victims = self.victims(self.rng.randint(1, minority)) if kind == "kill" else list(self.nodes)
            what = "crash (kill -9 all)" if kind == "crash" else "kill -9"
            self.note(f"{what} " + ",".join(v.name for v in victims))
            for v in victims:
                v.kill()
            self.hold()
            self.restart(victims)
        elif kind == "pause":
            victims = self.victims(self.rng.randint(1, minority))
            self.note("pause " + ",".join(v.name for v in victims))
            for v in victims:
                v.pause()
                self.paused.add(v.name)
            self.hold()
            for v in victims:
                v.resume()
                self.paused.discard(v.name)
            self.history.event("nemesis", "resumed " + ",".join(v.name for v in victims))
        else:
            blocks = self.partition_plan(kind)
            self.note(f"partition {kind}: " + "; ".join(f"{a.name}-x->{','.join(b.name for b in bs)}"
                                                         for a, bs in blocks if bs))
            self.blocked = True
            for a, bs in blocks:
                if bs:
                    code, doc = _api(a, "POST", "/api/cluster-faults", {"block": [b.full_name for b in bs]},
                                     timeout=10)
                    if code != 200:
                        self.history.event("nemesis", f"block on {a.name} failed: {code} {doc}")
            self.hold()
            self.heal()

    def partition_plan(self, kind: str) -> list[tuple[Node, list[Node]]]:
        nodes = list(self.nodes)
        self.rng.shuffle(nodes)
        n = len(nodes)
        if kind == "halves":
            k = n // 2
            a, b = nodes[:k], nodes[k:]
            return [(x, b if x in a else a) for x in nodes]
        if kind == "isolate":
            lone = self.victims(1)[0]
            rest = [x for x in nodes if x is not lone]
            return [(lone, rest), *((x, [lone]) for x in rest)]
        # majorities ring: node i keeps its ring neighbours (distance <= 1) and blocks everyone else. On 5
        # nodes each sees 3 (a majority) and no two see the same three; on 3 nodes the ring would cut
        # nothing, so one link is cut instead (a bridge: the ends see different majorities).
        if n <= 3:
            return [(nodes[0], [nodes[-1]]), (nodes[-1], [nodes[0]])]
        return [(nodes[i], [nodes[j] for j in range(n) if min((i - j) % n, (j - i) % n) > 1])
                for i in range(n)]

    def restart(self, nodes: list[Node], timeout: float = 45.0) -> bool:
        """Start the dead ones among `nodes`, all before waiting for any (a node opens its listeners only
        once a majority of the metadata members is up)."""
        dead = [x for x in nodes if not x.running()]
        for x in dead:
            x.start(wait=False)
        ok = True
        for x in dead:
            try:
                x.wait_ready(timeout)
            except Exception as exc:  # noqa: BLE001 - retried by recover()
                self.history.event("nemesis", f"restart {x.name} failed: {exc!r}")
                x.kill()
                ok = False
        if dead:
            self.history.event("nemesis", "restarted " + ",".join(x.name for x in dead))
        return ok

    def heal(self) -> None:
        for a in self.nodes:
            if a.running() and a.name not in self.paused:
                code, doc = _api(a, "POST", "/api/cluster-faults",
                                 {"unblock": [b.full_name for b in self.nodes if b is not a]}, timeout=10)
                if code != 200:
                    self.history.event("nemesis", f"unblock on {a.name} failed: {code} {doc}")
        self.blocked = False
        self.history.event("nemesis", "healed")

    def recover(self) -> None:
        """Everything back: resume, restart, unblock (after the thread stopped)."""
        for node in self.nodes:
            if node.running():
                node.resume()
        self.paused.clear()
        for _ in range(2):
            if self.restart(self.nodes):
                break
        self.heal()


# -- the run -------------------------------------------------------------------------------------------

def start_cluster(tmp: Path, n: int, config_text: str | None = None, workers: str = "1") -> Cluster:
    """Like `Cluster.start`, with ports outside the ephemeral range (see `stable_port`); `workers`: each
    node's --workers (a node of workers' other workers listen for other nodes on ports of their own)."""
    cluster = Cluster(tmp)
    try:
        for i in range(n):
            name = f"n{i + 1}"
            node = Node(name, tmp / name, stable_port(), stable_port(), stable_port(),
                        cluster.nodes[0].seed if cluster.nodes else None, workers=workers,
                        **({} if config_text is None else {"config_text": config_text}))
            cluster.nodes.append(node)
            node.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _join(threads: list[threading.Thread], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def _declare(node: Node, queue: str, members: int) -> None:
    conn = pika.BlockingConnection(params(node, heartbeat=0))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum",
                                                                     "x-quorum-initial-group-size": members})
    finally:
        _close(conn)


def _wait_healthy(cluster: Cluster, cfg: JepsenConfig, deadline: float) -> str | None:
    """Every node running and seeing all the others; the queue with a leader and all members online."""
    names = {n.full_name for n in cluster.nodes}
    last = "?"
    while time.monotonic() < deadline:
        ok = True
        for node in cluster.nodes:
            code, doc = _api(node, "GET", "/api/cluster-status")
            if code != 200 or set(doc.get("running_nodes", [])) != names:
                running = doc if code != 200 else doc.get("running_nodes")
                last = f"{node.name}: cluster-status {code} {running}"
                ok = False
                break
            info = queue_info(node, cfg.queue)
            # (a node of workers: its members are workers, `<node>#w<N>`)
            if not info or not info.get("leader") or {node_of(m) for m in info.get("online") or []} != names:
                last = f"{node.name}: queue info {info and {k: info.get(k) for k in ('leader', 'online')}}"
                ok = False
                break
        if ok:
            return None
        time.sleep(0.3)
    return last


def _drain_with_get(node: Node, cfg: JepsenConfig, history: History) -> int:
    got = 0
    conn = pika.BlockingConnection(params(node, heartbeat=0))
    try:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get(cfg.queue, auto_ack=False)
            if method is None:
                return got
            history.consume(body.decode())
            history.event("drain", f"basic.get via {node.name}: {body.decode()}")
            ch.basic_ack(method.delivery_tag)
            got += 1
    finally:
        _close(conn)


def _final_count(node: Node, queue: str) -> tuple[int, int] | str:
    """(ready via a passive declare, ready+unacked via the HTTP API)."""
    try:
        conn = pika.BlockingConnection(params(node, heartbeat=0))
    except Exception as exc:  # noqa: BLE001
        return f"connect: {exc!r}"
    try:
        ready = conn.channel().queue_declare(queue, passive=True).method.message_count
    except Exception as exc:  # noqa: BLE001
        return f"passive declare: {exc!r}"
    finally:
        _close(conn)
    info = queue_info(node, queue)
    if info is None:
        return "no queue info"
    return ready, int(info.get("messages", -1))


def run(tmp: Path, cfg: JepsenConfig, cluster: Cluster | None = None) -> JepsenResult:
    """One seeded run on a fresh cluster of `cfg.nodes` (or on `cluster`, left running)."""
    result = JepsenResult(config=asdict(cfg), wall_start=time.time())
    own = cluster is None
    pika_log = logging.getLogger("pika")
    level = pika_log.level
    pika_log.setLevel(logging.CRITICAL)  # failed connections are expected here, by the thousand
    try:
        if cluster is None:
            cluster = start_cluster(tmp, cfg.nodes, cfg.config_text, cfg.workers)
        try:
            return _run(cluster, cfg, result)
        finally:
            if own:
                cluster.stop()
    finally:
        pika_log.setLevel(level)


def _run(cluster: Cluster, cfg: JepsenConfig, result: JepsenResult) -> JepsenResult:
    history = History()
    rng = random.Random(cfg.seed)
    nodes = cluster.nodes
    n = len(nodes)
    stream = cfg.kind == "stream"
    if stream:
        _declare_stream(nodes[0], cfg.queue)
    else:
        _declare(nodes[0], cfg.queue, n)
    history.event("setup", f"declared {cfg.kind} {cfg.queue} on {nodes[0].name} with {n} members")
    publishers = [Publisher(i, nodes, i % n, history, cfg, random.Random(rng.random()))
                  for i in range(cfg.publishers)]
    consumers = [] if stream else [Consumer(i, nodes, (i + 1) % n, history, cfg, random.Random(rng.random()))
                                   for i in range(cfg.consumers)]
    workers: list[Worker] = [*publishers, *consumers]
    watchdog = Watchdog(workers)
    nemesis = Nemesis(cluster, cfg, history)
    t0 = time.monotonic()
    try:
        watchdog.start()
        for w in workers:
            w.start()
        nemesis.start()
        time.sleep(cfg.seconds)
        nemesis.stop_event.set()
        history.event("run", "stopping the nemesis")
        if _join([nemesis], 120):
            result.problems.append("the nemesis did not stop in 120 s")
        if nemesis.error is not None:
            result.problems.append(f"the nemesis failed: {nemesis.error!r}")
        nemesis.recover()
        history.event("run", "recovered: every node running, links unblocked")
        stuck = _wait_healthy(cluster, cfg, time.monotonic() + cfg.recover_timeout)
        if stuck is not None:
            result.problems.append(f"cluster not healthy {cfg.recover_timeout:.0f}s after healing: {stuck}")
        history.event("run", "healthy; stopping the publishers")
        for c in consumers:
            c.draining = True
        for p in publishers:
            p.stop_event.set()
        if hung := _join(list(publishers), cfg.confirm_timeout + 10):
            result.problems.append(f"publishers did not stop: {hung}")
        if stream:
            result.problems += _read_every_member(cluster, cfg, history, result)
        else:
            result.problems += _drain(cluster, cfg, history, consumers, result)
    finally:
        nemesis.stop_event.set()
        for w in workers:
            w.stop_event.set()
        _join([*workers, nemesis], 20)
        watchdog.stop_event.set()
        result.elapsed = time.monotonic() - t0
        result.faults = list(nemesis.faults)
        _check(history, result, stream)
        result.events = list(history.events)
    _write_artifact(result)
    return result


def _drain(cluster: Cluster, cfg: JepsenConfig, history: History, consumers: list[Consumer],
           result: JepsenResult) -> list[str]:
    problems: list[str] = []
    start = time.monotonic()
    deadline = start + cfg.drain_timeout
    quiet_since: float | None = None
    last: tuple[int, Any] = (-1, None)
    progress_at = start
    drained = False
    while time.monotonic() < deadline and not drained:
        with history.lock:
            total = sum(history.consumed.values())
        lead = next((x for x in cluster.nodes
                     if (i := queue_info(x, cfg.queue)) and node_of(i.get("leader") or "") == x.full_name), None)
        info = queue_info(lead, cfg.queue) if lead is not None else None
        counts = info and (info.get("messages_ready"), info.get("messages_unacknowledged"))
        now = time.monotonic()
        if (total, counts) != last:
            progress_at = now
        if counts == (0, 0) and total == last[0]:
            quiet_since = quiet_since or now
            drained = now - quiet_since >= 1.0
        else:
            quiet_since = None
        if not drained and now - progress_at > cfg.stall_timeout:
            break  # nothing consumed and the queue unchanged for that long: stuck
        last = (total, counts)
        time.sleep(0.3)
    if not drained:
        info = {x.name: queue_info(x, cfg.queue) for x in cluster.nodes}
        problems.append(f"the consumers did not drain the queue ({time.monotonic() - start:.0f}s, "
                        f"no progress for "
                        f"{time.monotonic() - progress_at:.0f}s): " + "; ".join(
            f"{k}: {v and {f: v.get(f) for f in STATUS_FIELDS}}"
            for k, v in info.items()))
    history.event("run", "stopping the consumers")
    for c in consumers:
        c.stop_event.set()
    if hung := _join(list(consumers), cfg.call_timeout + 10):
        problems.append(f"consumers did not stop: {hung}")
    for node in cluster.nodes:
        for attempt in range(5):
            try:
                result.drained_by_get += _drain_with_get(node, cfg, history)
                break
            except Exception as exc:  # noqa: BLE001 - retried
                history.event("drain", f"basic.get via {node.name} failed: {exc!r}")
                if attempt == 4:
                    problems.append(f"basic.get via {node.name} kept failing: {exc!r}")
                time.sleep(1)
    deadline = time.monotonic() + 15
    while True:
        counts = {x.name: _final_count(x, cfg.queue) for x in cluster.nodes}
        if all(c == (0, 0) for c in counts.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    result.final_counts = {k: list(v) if isinstance(v, tuple) else v for k, v in counts.items()}
    bad = {k: v for k, v in counts.items() if v != (0, 0)}
    if bad:
        problems.append(f"the queue is not empty at the end (ready by passive declare, messages by the API): "
                        f"{bad}")
    return problems


def _declare_stream(node: Node, stream: str) -> None:
    conn = pika.BlockingConnection(params(node, heartbeat=0))
    try:
        conn.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    finally:
        _close(conn)


def _read_stream(node: Node, cfg: JepsenConfig, history: History, quiet_s: float = 2.0,
                 timeout: float = 60.0) -> list[tuple[int, str]]:
    """(x-stream-offset, body) of every message of the stream on `node`, read from `first` until every
    confirmed body has come and nothing more for `quiet_s` (or `timeout`)."""
    with history.lock:
        wanted = set(history.confirmed)
    got: list[tuple[int, str]] = []
    conn = pika.BlockingConnection(params(node, heartbeat=0))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)

        def on(channel: Any, method: Any, props: Any, body: bytes) -> None:
            got.append((props.headers["x-stream-offset"], body.decode()))
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume(cfg.queue, on, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + timeout
        seen = 0
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
            if len(got) != seen:
                seen, quiet_since = len(got), time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s and wanted <= {b for _, b in got}:
                break
    finally:
        _close(conn)
    return got


def _read_every_member(cluster: Cluster, cfg: JepsenConfig, history: History, result: JepsenResult) -> list[str]:
    """Read the stream on every node (the history's consumptions are the first node's reads) and check
    that every member holds the same log; a member still catching up is read again (three times at most)."""
    problems: list[str] = []
    reads: dict[str, list[tuple[int, str]]] = {}
    for attempt in range(3):
        for node in cluster.nodes:
            try:
                reads[node.name] = _read_stream(node, cfg, history)
            except Exception as exc:  # noqa: BLE001 - read again below
                history.event("read", f"reading on {node.name} failed: {exc!r}")
                reads[node.name] = []
        if len({tuple(r) for r in reads.values()}) == 1:
            break
        history.event("read", f"members differ (attempt {attempt + 1}): "
                      + ", ".join(f"{k}: {len(v)}" for k, v in reads.items()))
        time.sleep(2)
    result.stream_lengths = {k: len(v) for k, v in reads.items()}
    first = reads[cluster.nodes[0].name]
    for _, body in first:
        history.consume(body)
    for name, got in reads.items():
        bodies = [b for _, b in got]
        offsets = [o for o, _ in got]
        if offsets != sorted(set(offsets)):
            problems.append(f"{name}: offsets not increasing")
        elif offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            holes = sorted(set(range(offsets[0], offsets[-1])) - set(offsets))
            problems.append(f"{name}: offsets not dense (as RabbitMQ's): none at {_sample([str(h) for h in holes])}")
        twice = sorted((b for b, k in Counter(bodies).items() if k > 1), key=_order)
        if twice:
            problems.append(f"{name}: {len(twice)} messages more than once: {_sample(twice)}")
        with history.lock:
            confirmed = set(history.confirmed)
        if missing := sorted(confirmed - set(bodies), key=_order):
            problems.append(f"{name}: {len(missing)} confirmed messages missing: {_sample(missing)}")
        last: dict[str, int] = {}
        for body in bodies:
            who, n = _order(body)
            if body in confirmed and n < last.get(who, -1):
                problems.append(f"{name}: {body} after {who}-{last[who]}: out of its publisher's order")
                break
            if body in confirmed:
                last[who] = n
        if got != first:
            problems.append(f"{name} holds another log than {cluster.nodes[0].name}: "
                            f"{len(got)} against {len(first)} messages")
    return problems


def _check(history: History, result: JepsenResult, stream: bool = False) -> None:
    with history.lock:
        consumed = set(history.consumed)
        result.attempted = len(history.attempted)
        result.confirmed = len(history.confirmed)
        result.failed = len(history.failed)
        result.unknown = len(history.unknown)
        result.consumed_distinct = len(consumed)
        result.deliveries = sum(history.consumed.values())
        result.duplicates = result.deliveries - result.consumed_distinct
        result.duplicated_messages = sum(1 for c in history.consumed.values() if c > 1)
        result.unknown_consumed = len(history.unknown & consumed)
        result.failed_consumed = len(history.failed & consumed)
        result.lost = sorted(history.confirmed - consumed, key=_order)
        result.phantom = sorted(consumed - history.attempted, key=_order)
        result.lost_at = {b: history.attempted_at[b] for b in result.lost[:50]}
    if result.lost and not stream:  # (a stream's are reported per member by _read_every_member)
        result.problems.append(f"{len(result.lost)} confirmed messages were never consumed: "
                               f"{_sample(result.lost)} "
                               f"(published at t={sorted(set(result.lost_at.values()))[:10]} s)")
    if result.phantom:
        result.problems.append(f"{len(result.phantom)} consumed messages were never published: "
                               f"{_sample(result.phantom)}")
    if result.confirmed == 0:
        result.problems.append("no message was confirmed: the workload did not run")


def _order(body: str) -> tuple[str, int]:
    who, _, n = body.rpartition("-")
    return who, int(n) if n.isdigit() else -1


def _sample(items: list[str], k: int = 20) -> str:
    return ", ".join(items[:k]) + (f", ... ({len(items) - k} more)" if len(items) > k else "")


def _write_artifact(result: JepsenResult) -> Path | None:
    if not ARTIFACTS.is_dir():
        return None
    c = result.config
    kind = "" if c.get("kind", "quorum") == "quorum" else f"{c['kind']}-"
    path = ARTIFACTS / f"jepsen-{kind}{c['nodes']}nodes-seed{c['seed']}.json"
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(result.to_json(), indent=1))
        return path
    return None


def excerpts(cluster_dir: Path, patterns: tuple[str, ...] = ("ERROR", "WARNING", "Traceback"),
             limit: int = 40) -> str:
    """The nodes' log lines matching `patterns` (for a failure report)."""
    out: list[str] = []
    for log in sorted(cluster_dir.glob("n*/server-*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if any(p in ln for p in patterns)]
        if lines:
            out.append(f"--- {log.parent.name}/{log.name} ({len(lines)} lines)")
            out += lines[-limit:]
    return "\n".join(out)
