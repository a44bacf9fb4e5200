"""Storage faults under quorum queues (issue 7): kill -9 of the node mid-batch, a torn last WAL record,
writes lost because they were not fsynced. Real hutch-server processes, pika publishers with confirms.

Every scenario: publishers (threads, tests/cluster/jepsen.py's `Publisher`) publish persistent messages
with unique bodies and confirms, continuously, while a seeded fault is injected `rounds` times:

- **kill -9 mid-batch**: after a seeded delay, the test polls `/proc/<pid>/task/*/syscall` of the victim
  (the only node, the queue's leader, or the leader first and then every other node) until one of its
  threads is inside fsync/fdatasync of a file of the Raft store (of the WAL, for the torn-record test), and
  kills it there: a group commit written and not yet durable, whose confirms have not left. If /proc
  cannot tell, it kills at the seeded moment anyway.
- **torn last WAL record** (1 node): the node runs with the store's sync journal (below), so the test knows
  which WAL bytes were never fsynced: the in-flight record. It cuts that record short (a few bytes off its
  end, or anywhere inside it) and/or appends garbage (random bytes or zeros, as a power cut leaves them).
  Bytes that were fsynced are never touched: losing those is media failure, which no single node survives.
- **power cut**: every node runs with HUTCH_FAULT_SYNC_JOURNAL (storage/raft_log.py `SyncJournalFS`: after
  each fsync it journals the file's durable length). After the kill -9 (which keeps the page cache) each
  file of the node's Raft store is cut back to its last journaled length, keeping (seeded) a random part of
  the unsynced bytes as a torn write: what a power cut leaves. On 3 nodes every node loses power at once.

Then the node(s) restart, the publishers go on, and after the last round the queue is drained by a
consumer (manual acks): every confirmed message must be there, nothing that was never published, and the
queue empty on every node. On one node the test also checks the claim that makes a torn tail harmless: no
body found in a WAL's unsynced bytes was ever confirmed (confirms leave only after the fdatasync of their
group commit: raft_driver `_finish_synced`). `make test` runs short seeded rounds (~1 minute in all); the
`slow` soak (`make test-slow`) runs 12 rounds of every scenario for 3 seeds (~12 minutes).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest

from hutch.storage import snapshot
from hutch.storage.fs import RealFS
from hutch.storage.raft_log import FAULT_SYNC_JOURNAL_ENV, MANIFEST, MANIFEST_KIND

from .jepsen import (
    History,
    JepsenConfig,
    Publisher,
    Watchdog,
    _close,
    _final_count,
    _join,
    _wait_healthy,
    excerpts,
    params,
    queue_info,
    stable_port,
)
from .nodes import FAST, Cluster, Node, eventually

QUEUE = "storage-faults-qq"
# A small WAL (the minimum) and small segments: the store flushes every few hundred messages, so faults
# also land in flushes (segment files being written, MANIFEST replaced, old WAL generations deleted).
CONFIG = FAST + "raft.wal_max_size_bytes = 65536\nraft.segment_max_entries = 64\n"
BODY = re.compile(rb"sf\d+-\d+")  # the publishers' bodies: sf<publisher>-<n>
# fsync and fdatasync syscall numbers, by machine
SYNC_SYSCALLS = {"x86_64": {"74", "75"}, "aarch64": {"82", "83"}, "arm64": {"82", "83"}}.get(platform.machine(),
                                                                                            set())


@dataclass
class Report:
    """What the faults did, for the assertion messages and the test output."""

    kills: int = 0
    mid_sync: int = 0  # kills that landed while the victim was in fsync/fdatasync of a Raft store file
    caught: list[str] = field(default_factory=list)  # the files being synced
    torn_records: int = 0  # in-flight WAL records cut short
    garbage_appends: int = 0
    files_cut: int = 0  # power cut: files cut back to their durable length (plus a torn part)
    bytes_dropped: int = 0
    unsynced_bodies: set[str] = field(default_factory=set)  # bodies found in bytes that were never fsynced
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"kills {self.kills} ({self.mid_sync} mid-sync: {', '.join(self.caught)}), torn records "
                f"{self.torn_records}, garbage appends {self.garbage_appends}, files cut {self.files_cut} "
                f"({self.bytes_dropped} bytes), bodies in unsynced bytes {len(self.unsynced_bodies)}"
                + ("; " + "; ".join(self.notes) if self.notes else ""))


# -- the cluster --------------------------------------------------------------------------------------------
def raft_root(node: Node) -> Path:
    return node.directory / "data" / "cluster" / "raft"


def journal_of(node: Node) -> Path:
    return node.directory / "sync-journal"


def start_cluster(tmp: Path, n: int, journal: bool) -> Cluster:
    cluster = Cluster(tmp)
    try:
        for i in range(n):
            name = f"n{i + 1}"
            env = {FAULT_SYNC_JOURNAL_ENV: str(tmp / name / "sync-journal")} if journal else {}
            node = Node(name, tmp / name, stable_port(), stable_port(), stable_port(),
                        cluster.nodes[0].seed if cluster.nodes else None, config_text=CONFIG, env=env)
            cluster.nodes.append(node)
            node.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def restart(nodes: list[Node]) -> None:
    """All first, then wait (a node opens its listeners once a majority of the metadata members is up)."""
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready(60)


def leader_of(cluster: Cluster, timeout: float = 20.0) -> Node:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in cluster.nodes:
            if node.running():
                info = queue_info(node, QUEUE, timeout=3)
                if info and info.get("leader"):
                    found = next((x for x in cluster.nodes if x.full_name == info["leader"]), None)
                    if found is not None and found.running():
                        return found
        time.sleep(0.1)
    raise AssertionError(f"no leader for {QUEUE} within {timeout:.0f}s")


# -- kill -9 mid-sync ---------------------------------------------------------------------------------------
def syncing_file(pid: int, match: str) -> str | None:
    """A file of the Raft store (whose path contains `match`) a thread of `pid` is fsyncing now, or None."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                parts = f.read().split()
            if len(parts) > 1 and parts[0] in SYNC_SYSCALLS:
                target = os.readlink(f"/proc/{pid}/fd/{int(parts[1], 16)}")
                if "/cluster/raft/" in target and match in target:
                    return target
        except (OSError, ValueError):
            continue
    return None


def can_see_syscalls(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/task/{pid}/syscall") as f:
            return bool(SYNC_SYSCALLS) and bool(f.read().strip())
    except OSError:
        return False


def kill_mid_sync(victims: list[Node], rng: random.Random, report: Report, match: str = "/",
                  wait: float = 3.0) -> None:
    """After a seeded delay, kill -9 `victims[0]` while it fsyncs a Raft store file whose path contains
    `match` (within `wait` seconds; otherwise at once), then the other victims right after it."""
    time.sleep(rng.uniform(0.05, 0.6))
    first = victims[0]
    assert first.proc is not None
    pid = first.proc.pid
    caught = None
    if can_see_syscalls(pid):
        deadline = time.monotonic() + wait
        while caught is None and time.monotonic() < deadline:
            caught = syncing_file(pid, match)
    for node in victims:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGKILL)
    for node in victims:
        node.kill()  # reaps it
    report.kills += 1
    if caught is not None:
        report.mid_sync += 1
        report.caught.append(f"{first.name}:{caught.rsplit('/raft/', 1)[-1]}")


# -- the store's files after a kill -------------------------------------------------------------------------
def read_journal(node: Node) -> dict[str, int]:
    durable: dict[str, int] = {}
    path = journal_of(node)
    if path.exists():
        for line in path.read_text().splitlines():
            length, name = line.split(" ", 1)
            durable[name] = int(length)
    return durable


def store_files(node: Node) -> list[Path]:
    return sorted(p for p in raft_root(node).rglob("*") if p.is_file())


def wal_tail(node: Node) -> Path | None:
    """The last segment of the WAL generation the MANIFEST names (the one recovery opens)."""
    root = raft_root(node)
    raw = snapshot.read_snapshot(RealFS(), str(root / MANIFEST), kind=MANIFEST_KIND)
    gen = json.loads(raw)["gen"] if raw is not None else 0
    segments = sorted((root / f"wal-{gen:08d}").glob("*.seg"))
    return segments[-1] if segments else None


def note_unsynced(data: bytes, report: Report) -> None:
    report.unsynced_bodies |= {m.decode() for m in BODY.findall(data)}


def tear_wal_tail(node: Node, rng: random.Random, report: Report) -> bool:
    """Tear the WAL's in-flight record (only bytes never fsynced) and/or append garbage. True when there
    was an in-flight record to tear."""
    path = wal_tail(node)
    if path is None:
        report.notes.append(f"{node.name}: no WAL segment to tear")
        return False
    durable = read_journal(node)
    size = path.stat().st_size
    synced = durable.get(str(path))
    assert synced is not None and synced <= size, f"{path}: size {size}, journaled {synced}"
    data = path.read_bytes()
    torn = size > synced
    if torn:
        note_unsynced(data[synced:], report)
        if size - synced > 1:
            keep = size - rng.randint(1, 8) if rng.random() < 0.5 else rng.randint(synced + 1, size - 1)
            keep = max(keep, synced + 1)
        else:
            keep = synced
        os.truncate(path, keep)
        report.torn_records += 1
        report.bytes_dropped += size - keep
    if not torn or rng.random() < 0.5:
        garbage = rng.randbytes(rng.randint(1, 300)) if rng.random() < 0.5 else bytes(rng.randint(1, 4096))
        with open(path, "ab") as f:
            f.write(garbage)
        report.garbage_appends += 1
    return torn


def power_cut(node: Node, rng: random.Random, report: Report) -> None:
    """Drop what the node wrote to its Raft store and never fsynced: each file back to its last journaled
    durable length, plus (half the time) a random part of the rest, a torn write. Files never synced keep
    nothing of their data."""
    durable = read_journal(node)
    for path in store_files(node):
        size = path.stat().st_size
        synced = durable.get(str(path), 0)
        assert synced <= size, f"{path}: size {size} below its journaled durable length {synced}"
        if size == synced:
            continue
        if path.parent.name.startswith("wal-"):
            note_unsynced(path.read_bytes()[synced:], report)
        keep = synced + (rng.randint(0, size - synced - 1) if rng.random() < 0.5 else 0)
        os.truncate(path, keep)
        report.files_cut += 1
        report.bytes_dropped += size - keep


# -- the workload and the check -----------------------------------------------------------------------------
@dataclass
class Workload:
    cluster: Cluster
    history: History
    cfg: JepsenConfig
    publishers: list[Publisher]
    watchdog: Watchdog

    def confirmed(self) -> int:
        with self.history.lock:
            return len(self.history.confirmed)

    def wait_confirms(self, more: int, timeout: float = 30.0) -> None:
        target = self.confirmed() + more
        deadline = time.monotonic() + timeout
        while self.confirmed() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.confirmed()} confirms, waited for {target}:\n"
                                     f"{excerpts(self.cluster.tmp)}")
            time.sleep(0.02)


@pytest.fixture
def quiet_pika() -> Iterator[None]:
    pika_log = logging.getLogger("pika")
    level = pika_log.level
    pika_log.setLevel(logging.CRITICAL)  # refused connections while a node is down are expected
    yield
    pika_log.setLevel(level)


def start_workload(cluster: Cluster, seed: int, publishers: int) -> Workload:
    n = len(cluster.nodes)
    conn = pika.BlockingConnection(params(cluster.nodes[0], heartbeat=0))
    try:
        conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum",
                                                                     "x-quorum-initial-group-size": n})
    finally:
        conn.close()
    cfg = JepsenConfig(nodes=n, seed=seed, publishers=publishers, queue=QUEUE, publish_pause=0.0,
                       confirm_timeout=15.0, recover_timeout=60.0)
    history = History()
    rng = random.Random(seed)
    pubs = [Publisher(i, cluster.nodes, i % n, history, cfg, random.Random(rng.random()))
            for i in range(publishers)]
    for i, p in enumerate(pubs):
        p.name = f"sf{i}"  # bodies sf<i>-<n>: BODY finds them in raw WAL bytes
    watchdog = Watchdog(list(pubs))
    watchdog.start()
    for p in pubs:
        p.start()
    return Workload(cluster, history, cfg, pubs, watchdog)


def drain(node: Node, history: History) -> int:
    """Consume (manual acks, prefetch 1000, acked in batches) until the queue is quiet for half a second.
    Not no-ack: a quorum queue stops delivering to a no-ack consumer after `prefetch` (or 2000) messages
    (test_no_ack_consumer_of_a_quorum_queue_gets_every_message below)."""
    conn = pika.BlockingConnection(params(node, heartbeat=0))
    got = 0
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        tag = 0
        for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.5):
            if method is None:
                break
            history.consume(body.decode())
            got += 1
            tag = method.delivery_tag
            if got % 250 == 0:
                ch.basic_ack(tag, multiple=True)
        if tag:
            ch.basic_ack(tag, multiple=True)
        ch.cancel()
    finally:
        _close(conn)
    return got


def stop_and_check(w: Workload, report: Report, single_node: bool) -> None:
    """Stop publishing, drain the queue, compare: confirmed ⊆ consumed ⊆ published."""
    cluster, history = w.cluster, w.history
    for p in w.publishers:
        p.stop_event.set()
    hung = _join(list(w.publishers), w.cfg.confirm_timeout + 10)
    w.watchdog.stop_event.set()
    assert not hung, f"publishers did not stop: {hung}"
    stuck = _wait_healthy(cluster, w.cfg, time.monotonic() + w.cfg.recover_timeout)
    assert stuck is None, f"cluster not healthy after the faults: {stuck}\n{excerpts(cluster.tmp)}"
    with history.lock:
        confirmed = set(history.confirmed)
        attempted = set(history.attempted)
    deadline = time.monotonic() + 20
    while True:  # a restarted leader may still be applying its log: drain until nothing is missing
        try:
            drain(leader_of(cluster), history)
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            history.event("drain", f"failed: {exc!r}")
        with history.lock:
            consumed = set(history.consumed)
        if confirmed <= consumed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    lost = sorted(confirmed - consumed)
    phantom = sorted(consumed - attempted)
    summary = (f"{report.summary()}; attempted {len(attempted)}, confirmed {len(confirmed)}, "
               f"consumed {len(consumed)}, lost {len(lost)}, phantom {len(phantom)}")
    print(summary)
    assert confirmed, "nothing was confirmed: the workload did not run"
    assert not lost, f"{len(lost)} confirmed messages lost: {lost[:20]}\n{summary}\n{excerpts(cluster.tmp)}"
    assert not phantom, f"consumed but never published: {phantom[:20]}\n{summary}"
    if single_node:
        # Confirms leave only after the fdatasync of their group commit: bytes never synced hold none.
        early = sorted(report.unsynced_bodies & confirmed)
        assert not early, f"confirmed, yet found only in never-fsynced WAL bytes: {early[:20]}\n{summary}"
    counts = {x.name: _final_count(x, QUEUE) for x in cluster.nodes}
    assert all(c == (0, 0) for c in counts.values()), f"queue not empty after the drain: {counts}"


# -- scenarios ----------------------------------------------------------------------------------------------
def run_scenario(tmp: Path, *, nodes: int, fault: str, victims: str, rounds: int, seed: int,
                 publishers: int = 6, min_torn: int = 0, min_cut: int = 0, max_rounds: int | None = None) -> Report:
    """`fault`: "kill" | "torn" | "power"; `victims`: "leader" | "all" (1 node: the node either way).
    With `min_torn` (`min_cut`), rounds go on (up to `max_rounds`) until that many in-flight records were
    torn (files were cut back by a power cut): a kill that lands between a sync and the next write leaves
    nothing unsynced to lose."""
    rng = random.Random(seed)
    report = Report()
    cluster = start_cluster(tmp, nodes, journal=fault in ("torn", "power"))
    try:
        w = start_workload(cluster, seed, publishers)
        w.wait_confirms(150)
        done = 0
        while done < rounds or ((report.torn_records < min_torn or report.files_cut < min_cut)
                                and done < (max_rounds or rounds)):
            lead = leader_of(cluster)
            chosen = [lead] + ([x for x in cluster.nodes if x is not lead] if victims == "all" else [])
            kill_mid_sync(chosen, rng, report, "/wal-" if fault == "torn" else "/")
            for node in chosen:
                if fault == "torn":
                    tear_wal_tail(node, rng, report)
                elif fault == "power":
                    power_cut(node, rng, report)
            if nodes > 1 and victims == "leader":
                w.wait_confirms(100)  # the others go on without it: a new leader, failover
            restart(chosen)
            w.wait_confirms(150)
            done += 1
        if min_torn:
            assert report.torn_records >= min_torn, f"no kill landed mid-batch: {report.summary()}"
        stop_and_check(w, report, single_node=nodes == 1)
        return report
    finally:
        cluster.stop()


@pytest.mark.timeout(90)
def test_kill9_mid_batch_one_node(tmp_path: Path, quiet_pika: None) -> None:
    report = run_scenario(tmp_path, nodes=1, fault="kill", victims="leader", rounds=3, seed=11)
    assert report.kills == 3


@pytest.mark.timeout(150)
# `make test` kills the leader (twice); every node killed at once is in the slow set, as the power cut of every node
@pytest.mark.parametrize(("victims", "rounds"), [("leader", 2), pytest.param("all", 1, marks=pytest.mark.slow)])
def test_kill9_mid_batch_three_nodes(tmp_path: Path, quiet_pika: None, victims: str, rounds: int) -> None:
    report = run_scenario(tmp_path, nodes=3, fault="kill", victims=victims, rounds=rounds, seed=21)
    assert report.kills == rounds


@pytest.mark.timeout(90)
def test_torn_last_wal_record_one_node(tmp_path: Path, quiet_pika: None) -> None:
    report = run_scenario(tmp_path, nodes=1, fault="torn", victims="leader", rounds=3, seed=31,
                          min_torn=2, max_rounds=8)
    assert report.torn_records >= 2 and report.unsynced_bodies  # messages were in flight, and torn


@pytest.mark.timeout(90)
def test_power_cut_loses_unsynced_writes_one_node(tmp_path: Path, quiet_pika: None) -> None:
    report = run_scenario(tmp_path, nodes=1, fault="power", victims="leader", rounds=3, seed=41,
                          min_cut=1, max_rounds=8)
    assert report.files_cut >= 1  # (a run where every kill fell between a sync and the next write failed it)


@pytest.mark.slow  # 20 s; `make test` keeps the one-node power cut and the three-node kill -9 runs
@pytest.mark.timeout(150)
def test_power_cut_of_every_node_three_nodes(tmp_path: Path, quiet_pika: None) -> None:
    report = run_scenario(tmp_path, nodes=3, fault="power", victims="all", rounds=2, seed=51)
    assert report.files_cut >= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [101, 102, 103])
@pytest.mark.parametrize(("nodes", "fault", "victims"), [
    (1, "kill", "leader"), (1, "torn", "leader"), (1, "power", "leader"),
    (3, "kill", "leader"), (3, "kill", "all"), (3, "torn", "leader"), (3, "power", "leader"),
    (3, "power", "all"),
])
def test_storage_faults_soak(tmp_path: Path, quiet_pika: None, nodes: int, fault: str, victims: str,
                             seed: int) -> None:
    run_scenario(tmp_path, nodes=nodes, fault=fault, victims=victims, rounds=12, seed=seed)


@pytest.mark.timeout(60)
def test_no_ack_consumer_of_a_quorum_queue_gets_every_message(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 1, journal=False)
    try:
        conn = pika.BlockingConnection(params(cluster[0], heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("no-ack-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", "no-ack-qq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=10)  # ignored for no-ack consumers
        got = 0
        for method, _props, _body in ch.consume("no-ack-qq", auto_ack=True, inactivity_timeout=2.0):
            if method is None:
                break
            got += 1
            if got == 30:
                break
        _close(conn)
        assert got == 30
    finally:
        cluster.stop()


@pytest.mark.timeout(60)
def test_a_torn_wal_tail_is_reported_in_the_log_at_start(tmp_path: Path) -> None:
    """Recovery drops an incomplete write at the WAL's end, and the node says so (docs/storage.md)."""
    cluster = start_cluster(tmp_path, 1, journal=False)
    try:
        node = cluster[0]
        conn = pika.BlockingConnection(params(node, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("torn-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish("", "torn-qq", f"t{i}".encode(), pika.BasicProperties(delivery_mode=2))
        _close(conn)
        node.kill()
        tail = wal_tail(node)
        assert tail is not None
        with open(tail, "ab") as f:
            f.write(b"\x00\x00\x01\x00" + bytes(range(40)))  # a record header and part of its payload
        restart([node])
        assert "a torn write at its end was dropped at recovery" in node.log()
        conn = pika.BlockingConnection(params(node, heartbeat=0))

        def count() -> int:  # the queue has a leader again once its group has elected one
            return conn.channel().queue_declare("torn-qq", passive=True).method.message_count

        assert eventually(count, timeout=20) == 50
        _close(conn)
    finally:
        cluster.stop()
