"""Compaction of load in a node of workers, wired: reports, the controller's host, and an island's move.

Owns: `Compaction`, one per worker with `workers.compaction` on (config.py's `compaction_on`):
- **Reports** (step 1, docs/scaling.md "Compaction of load"): every `REPORT_S` a worker samples its busy
  share and scans its islands (`IslandScan`: a queue and
  the connections that use only it, their rate, whether they can move), and sends them to worker 0 as
  one `CompactReport` (worker 0 keeps its own).
  The busy share is the larger of two `LoadMeter`s: the process's CPU share (`time.process_time`: what
  the worker costs, paths outside the loop's timed input included) and its loop's wall-clock input share
  (`LoopLoad.busy_total_s`), which a contended machine inflates (time runnable but not running counts)
  and which is right to: a worker that waits for a core is not one to pack into, and one starved after
  a pack shows hot and is spread again. On a quiet machine the two agree within a few hundredths at a
  moderate rate (docs/BENCHMARKS.md, "Compaction thresholds and the spread on imbalance, session 20").
- **The controller's host** (step 2): worker 0 runs `Compactor.observe` (core/compaction.py) on the reports
  younger than `STALE_S` at each of its own reports, and asks the source worker to make the move it
  answers (`CompactMove`); the answer ends the move (`move_done`). `force` is the test hook (`SIGUSR1` to
  a worker, wired by the composition root): that worker moves its busiest island that can move now to
  the next worker, outside the controller.
- **The move** (step 3): worker A (`move_out`) holds the other workers' traffic for the queue
  (`MoveTraffic.hold_queue`, queue_types/remote_moves.py) and the island's connections between messages
  (`hold_island`: deliveries and reading held, no publish begun whose content is not wholly buffered),
  waits at most `QUIET_WAIT_S` until each is quiet (`island_reason` None: confirms written, content
  whole, output flushed; else the move is given up and the controller backs the island off), exports the queue and the
  connections in one loop turn, hands the sockets and the state to B (`IslandTransfer`), forgets the
  connections (their unacked messages go back into its copy, which has no consumer left) and sets the
  copy aside, a stand-in homed at B in its place; then it makes its promise to B durable (`_Promises`),
  while B takes the island. Worker B (`_adopt`) builds a copy aside, imports, syncs the import if it
  wrote a persistent message (`wrote_durable`), asks A whether it may commit (`CompactCommit`), proposes
  the queue's record naming B (the commit point) and waits for it, then puts its copy in its stand-in's
  place and adopts the connections, together (consumers attached and deliveries held under their tags
  before any unread byte is handled). Each side logs one INFO line per move with its phases' durations
  (`_Phases`). A applies the record (`RemoteQueueType.on_record`): the copy set aside is dropped, and what
  it held for the queue is forwarded to B (`release_queue`).

Rules:
- Nothing is lost, nothing refused silently. Before A answers `CompactCommit` it may give the move up
  (a timeout of `COMMIT_WAIT_S`): its copy holds everything (the forgotten connections' unacked messages
  were requeued into it), the held traffic is taken there, and B, told False, drops its copy and closes
  the clients with 320 (they reconnect). Once A said True, only the record decides: if B dies, A waits
  for a read barrier of the workers' Raft group (every earlier proposal committed or gone) and then keeps
  its copy unless the record named B (then the copy was dropped as it applied). A's True is durable first
  (`_Promises`, synced): a restarted A does not serve a promised queue's recovered copy (`recover`) until
  the record applies or B is no longer taking it and a read barrier shows no record naming B.
- Order across a move: B holds its own publishes to the queue from its `CompactCommit` until it has the
  queue, and A sends back what it held from B before it answers (`MoveTraffic.send_back`, `hold_outbound`).
  Every other worker (or node) C sends A a marker as it applies the record, behind its last publish there;
  A relays C's late publishes and forwards the marker behind them, and B, from its `CompactCommit`, keeps
  C's direct publishes behind until the marker came and B has the queue (`MoveTraffic.expect_markers`,
  `markers_installed`, `drop_markers`; core/move_order.py). A queue still waiting for markers does not
  move again.
- One move at a time per worker; a worker that is not this node's, or is down, is never a target.
- Reports and scans run once a second, off the message path (O(connections + channels + queues)).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from hutch.cluster import messages as cm
from hutch.core.compaction import Compactor, Island, LoadMeter, Move, WorkerLoad
from hutch.core.definition_ops import DeclareQueue
from hutch.core.queue_type import QueueEntry
from hutch.core.vhost import VirtualHost
from hutch.queues.classic.queue import ClassicQueue
from hutch.queues.classic.transfer import (
    QueueTransfer,
    export_queue,
    import_queue,
    not_movable,
    wrote_durable,
)
from hutch.runtime.broker.definitions import pack_arguments
from hutch.runtime.broker.node import Node
from hutch.runtime.clustering.service import ClusterService
from hutch.runtime.queue_types.classic import features
from hutch.runtime.queue_types.classic.queue_type import ClassicQueueType
from hutch.runtime.queue_types.remote import QueueLink
from hutch.runtime.queue_types.remote_queue import RemoteQueue
from hutch.runtime.queue_types.remote_type import RemoteQueueType
from hutch.runtime.session.connection import AMQPConnection, State
from hutch.runtime.session.island import (
    MAX_ISLAND_CONNECTIONS,
    WAIT_REASONS,
    IslandConnection,
    IslandScan,
    island_channels,
    island_reason,
    queues_used,
    restore_island,
)
from hutch.runtime.session.ports import Handover
from hutch.runtime.session.protocol import AMQPProtocol
from hutch.runtime.workers.handover import refuse_client
from hutch.runtime.workers.island import IslandTransfer
from hutch.runtime.workers.link import WorkerLink
from hutch.runtime.workers.spec import node_of_worker, worker_name

log = logging.getLogger("hutch.workers")

REPORT_S = 1.0  # each worker's report to worker 0 (and worker 0's judgement)
STALE_S = 3.0  # a report older than this is left out (its worker is down or silent)
# A waits this long for the island's connections to be quiet, else gives the move up (and the controller
# backs off the island, core/compaction.py): a held connection only finishes what it had begun, so quiet
# comes in milliseconds or not soon
QUIET_WAIT_S = 0.5
QUIET_POLL_S = 0.005
COMMIT_WAIT_S = 20.0  # A gives the move up when B has not asked to commit within this
MOVE_CALL_S = 120.0  # worker 0's wait for a move's answer (a move waiting on a restart takes seconds)
HEADER_VERSION = 1
PROMISES_FILE = "compaction-promised.json"  # in the worker's data directory: A's promises (`_Promises`)
SETTLE_RETRY_S = 0.5
STATE_LOG_S = 5.0  # worker 0 logs the node's loads and islands this often while it moves messages (one line)
# test hooks (read only by tests/workers/test_compaction.py): a file whose presence makes A kill itself right
# after it synced its promise and answered `CompactCommit` (the file removed first: once), and a file while
# which B waits before it proposes the record (the window of a restarted A made as long as a test needs)
KILL_AFTER_PROMISE_ENV = "HUTCH_TEST_COMPACT_KILL_AFTER_PROMISE"
HOLD_RECORD_ENV = "HUTCH_TEST_COMPACT_HOLD_RECORD"


class _Promises:
    """A's durable promises: (vhost, queue) -> the worker it hands the queue to (and says True to, at its
    `CompactCommit`), written and synced as the island is handed (at the latest before the answer) and kept
    until the move ends (its record applied here, or given up). A worker
    that restarts with a promise does not serve its recovered copy of that queue (`Compaction.recover`)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, PROMISES_FILE)
        self.items: dict[tuple[str, str], str] = {}

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                v = json.loads(f.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("compaction: %s unreadable (%r); no promise kept", self.path, exc)
            return
        if isinstance(v, list):
            self.items = {(a, b): c for a, b, c in (x for x in v if isinstance(x, list) and len(x) == 3
                                                    and all(isinstance(y, str) for y in x))}

    def put(self, key: tuple[str, str], target: str) -> None:
        self.items[key] = target
        self._save()

    def drop(self, key: tuple[str, str]) -> None:
        if self.items.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        """Written whole and synced (file and directory): a promise is durable before A answers."""
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps([[k[0], k[1], t] for k, t in self.items.items()]).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Phases:
    """A move's phases on one side, timed by `time.monotonic` (uvloop's loop clock counts whole
    milliseconds, cached per turn): one INFO line per move says where its time went (docs/BENCHMARKS.md
    "The rest of a move, session 19")."""

    def __init__(self, start: float) -> None:
        self.start = self.last = start
        self.items: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.items.append((name, now - self.last))
        self.last = now

    def text(self) -> str:
        return ", ".join(f"{n} {1000 * d:.1f}" for n, d in self.items) + \
            f" ms (total {1000 * (self.last - self.start):.1f} ms)"


@dataclass
class _Outgoing:
    """A's side of a move in flight: to whom, the copy set aside (its stand-in for the target in its
    place), and how it ends (True: the record names the target)."""

    target: str
    copy: ClassicQueue
    standin: RemoteQueue
    done: asyncio.Future[bool]
    committing: bool = False
    promised: bool = False  # the promise to the target durable (`_Promises`): written as the island is handed
    phases: _Phases | None = None  # (a move from here: timed; a promise recovered at a restart: not)


class Compaction:
    def __init__(self, node: Node, cluster: ClusterService, link: QueueLink, remote: RemoteQueueType,
                 classic: ClassicQueueType, worker: WorkerLink, handover: Handover | None) -> None:
        cfg = node.config
        assert cfg.worker_index is not None
        self.node, self.cluster, self.link, self.classic = node, cluster, link, classic
        self.handover = handover
        self.index = cfg.worker_index
        self.workers = cfg.workers
        self.node_name = node_of_worker(node.name)
        # the busy share the controller judges by is the larger of two: the process's CPU share and its loop's
        # (wall-clock) input share; see the module docstring
        self.meter = LoadMeter(self.index)  # over the process's CPU time
        self.loop_meter = LoadMeter(self.index)  # over the loop's busy time (`LoopLoad.busy_total_s`)
        self.scan = IslandScan(self.index)
        self.transfer = IslandTransfer(worker, self._adopt)
        self.compactor = Compactor() if self.index == 0 else None
        # worker -> (when, its load, its islands, island name -> (vhost, queue)): each worker's last report
        self.reports: dict[int, tuple[float, WorkerLoad, list[Island], dict[str, tuple[str, str]]]] = {}
        self.outgoing: dict[tuple[str, str], _Outgoing] = {}
        self.promises = _Promises(cfg.data_dir)
        self.promises.load()
        self.incoming: set[tuple[str, str, str]] = set()  # B: (vhost, queue, A) agreed, waiting for the record
        self.moved_out = self.moved_in = self.given_up = 0
        self._state_logged = 0.0  # when worker 0 last logged the node's loads and islands (`_log_state`)
        self._local_logged = 0.0  # when this worker last logged where its load is
        self._handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        remote.on_record = self._record_applies
        cluster.register(cm.CompactReport, self._on_report)
        cluster.register(cm.CompactMove, self._on_move)
        cluster.register(cm.CompactCommit, self._on_commit)
        node.cluster_peer_hooks.append(self._peer_changed)

    def start(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(REPORT_S, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.transfer.stop()
        for task in list(self._tasks):
            task.cancel()

    # -- step 1: reports -----------------------------------------------------------------------------------
    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(REPORT_S, self._tick)
        now = loop.time()
        queues = [q for v in self.node.vhosts.values() for q in v.queues.values() if not q.remote]
        islands, conns_of = self.scan.scan(now, list(self.node.connections), queues)
        # a connection the kernel cannot hand over (TLS, an in-process pipe) keeps its island here
        islands = [Island(i.name, i.worker, i.msgs_per_s, i.movable and all(_plain_socket(c) for c in
                                                                           conns_of.get(i.name, ())))
                   for i in islands]
        rate = sum(i.msgs_per_s for i in islands)
        lp = self.node.loop_load
        cpu = self.meter.sample(now, time.process_time(), lp.own_saturated(), rate)
        loop_busy = self.loop_meter.sample(now, lp.busy_total_s, False, rate).busy
        load = WorkerLoad(self.index, max(cpu.busy, loop_busy), cpu.saturated, rate)
        flat: list[Any] = []
        for i, q in zip(islands, queues, strict=True):
            flat += [q.vhost, q.name, int(i.msgs_per_s), i.movable]
        report = cm.CompactReport(self.index, int(load.busy * 1e6), load.saturated, int(rate), flat)
        if now - self._local_logged >= STATE_LOG_S and load.busy >= 0.1:
            self._local_logged = now  # where the load is: connections in an island here, or others
            held = sum(len(v) for v in conns_of.values())
            log.info("compaction: worker %d busy %.3f (CPU %.3f, its loop's input %.3f), %d msg/s in %d queues; "
                     "connections: %d in its islands, %d others", self.index, load.busy, cpu.busy, loop_busy,
                     int(rate), len(queues), held, len(self.node.connections) - held)
        if self.index == 0:
            self._on_report(self.node.name, report)
            self._judge(now)
        else:
            self.cluster.send(worker_name(self.node_name, 0), report)

    def _on_report(self, peer: str, r: cm.CompactReport) -> None:
        if self.compactor is None or node_of_worker(peer) != self.node_name or not 0 <= r.worker < self.workers:
            return
        v = r.islands
        if len(v) % 4:
            return
        islands = []
        where: dict[str, tuple[str, str]] = {}
        for k in range(0, len(v), 4):
            vhost, name, rate, movable = v[k:k + 4]
            if type(vhost) is not str or type(name) is not str or type(rate) is not int or type(movable) is not bool:
                return
            key = f"{vhost}/{name}"
            where[key] = (vhost, name)
            islands.append(Island(key, r.worker, float(max(0, rate)), movable))
        load = WorkerLoad(r.worker, min(1.0, max(0.0, r.busy_ppm / 1e6)), r.saturated, float(max(0, r.msgs_per_s)))
        self.reports[r.worker] = (asyncio.get_running_loop().time(), load, islands, where)

    # -- step 2: the controller's host (worker 0) ------------------------------------------------------------
    def _judge(self, now: float) -> None:
        compactor = self.compactor
        assert compactor is not None
        fresh = [(load, islands) for t, load, islands, _w in self.reports.values() if now - t <= STALE_S]
        move = compactor.observe(now, [load for load, _i in fresh], [i for _l, islands in fresh for i in islands])
        if now - self._state_logged >= STATE_LOG_S and sum(load.msgs_per_s for load, _i in fresh) >= compactor.min_rate:
            self._state_logged = now
            _log_state(fresh)
        if move is not None:
            log.info("compaction: moving island %s from worker %d to worker %d (%s; busy %s, msg/s %s)", move.island,
                     move.source, move.target, move.reason, [round(load.busy, 3) for load, _i in fresh],
                     [int(load.msgs_per_s) for load, _i in fresh])
            report = self.reports.get(move.source)
            self._spawn(self._make(move, report[3].get(move.island, ("", "")) if report is not None else ("", "")))

    async def _make(self, move: Move, where: tuple[str, str]) -> None:
        compactor = self.compactor
        assert compactor is not None
        vhost, name = where
        moved = False
        try:
            if move.source == self.index:
                moved = await self.move_out(vhost, name, move.target)
            else:
                moved = bool(await self.cluster.call(worker_name(self.node_name, move.source),
                                                     cm.CompactMove(vhost, name, move.target), timeout=MOVE_CALL_S))
        except Exception as exc:  # noqa: BLE001 - the move's worker gone or silent: judged again from reports
            log.info("compaction: the move of %s did not answer: %r", move.island, exc)
        finally:
            now = asyncio.get_running_loop().time()
            compactor.move_done(now, moved)
        if moved and move.reason == "pack":  # the pack goes on with the source's next island at once
            self._judge(now)

    async def _on_move(self, peer: str, req: cm.CompactMove) -> bool:
        if node_of_worker(peer) != self.node_name:
            return False
        return await self.move_out(req.vhost, req.queue, req.target)

    def force(self) -> None:
        """The test hook (`SIGUSR1`): move this worker's busiest island that can move now (its queue's
        messages published and delivered so far) to the next worker, outside the controller."""
        queues = [q for v in self.node.vhosts.values() for q in v.queues.values()
                  if isinstance(q, ClassicQueue) and island_of(self.node, q) is not None]
        if not queues or self.workers < 2:
            log.info("compaction: no movable island in worker %d", self.index)
            return
        q = max(queues, key=lambda q: (q.stat_published + q.stat_delivered, q.name))
        self._spawn(self.move_out(q.vhost, q.name, (self.index + 1) % self.workers))

    # -- step 3: the move, A's side ---------------------------------------------------------------------------
    async def move_out(self, vhost: str, name: str, target: int) -> bool:
        """Move queue `name`'s island to worker `target`. True when its record names the target."""
        key = (vhost, name)
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        to = worker_name(self.node_name, target)
        if key in self.outgoing or not isinstance(q, ClassicQueue) or target == self.index \
                or not 0 <= target < self.workers or not self.cluster.connected(to) \
                or self.link.moves.awaiting_markers(vhost, name):  # (moved here, its order across that not settled)
            return False
        conns = island_of(self.node, q)
        if conns is None:
            return False
        phases = _Phases(time.monotonic())
        self.link.moves.hold_queue(vhost, name)
        for c in conns:
            c.hold_island()
        try:
            quiet = await self._quiet(q, conns)
            phases.mark("quiet")
            if quiet:
                out = self._hand(q, conns, target, to, phases)
                if out is not None:
                    return await self._await_commit(key, out)
        except Exception:  # a fault of this code: logged; the queue stays (and its traffic is let go below)
            log.exception("compaction: the move of queue '%s' failed", name)
            if key in self.outgoing:
                raise  # handed over already: only the record (or B's death) decides now
        finally:
            for c in conns:
                c.release_island()  # (a handed-over connection has no transport left: a no-op)
        self.link.moves.release_queue(vhost, name, False)
        return False

    async def _quiet(self, q: ClassicQueue, conns: list[AMQPConnection]) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + QUIET_WAIT_S
        while True:
            if any(c.state != State.OPEN or c not in self.node.connections for c in conns):
                return False
            reasons = [island_reason(c, q) for c in conns]
            if any(r is not None and r not in WAIT_REASONS for r in reasons):
                return False
            if all(r is None for r in reasons):
                for c in conns:
                    c.flush()
                if all(_written(c) for c in conns) and island_of(self.node, q, conns) == conns:
                    log.info("compaction: queue '%s' quiet after %.1f ms", q.name,
                             1000 * (loop.time() - deadline + QUIET_WAIT_S))
                    return True
            if loop.time() > deadline:
                log.info("compaction: queue '%s' not quiet in %.1f s: %s", q.name, QUIET_WAIT_S,
                         "; ".join(_why_not_quiet(c, r) for c, r in zip(conns, reasons, strict=True)))
                return False
            await asyncio.sleep(QUIET_POLL_S)

    def _hand(self, q: ClassicQueue, conns: list[AMQPConnection], target: int, to: str,
              phases: _Phases) -> _Outgoing | None:
        """Export and hand over, in one loop turn (nothing of the island runs between the two)."""
        held = [u.entry for c in conns for ch in c.channels.values() for u in ch.unacked.values()]
        try:
            queue_state = export_queue(q, held).encode()
        except ValueError as exc:
            log.info("compaction: queue '%s' stays: %s", q.name, exc)
            return None
        states = []
        for c in conns:
            reader = c.reader
            unread = bytes(memoryview(reader._buf)[reader._pos:])
            states.append(IslandConnection(q.name, c.handover_state(unread), island_channels(c.channels)).encode())
        header = msgpack.packb([HEADER_VERSION, q.vhost, q.name, self.node.name, queue_state], use_bin_type=True)
        socks = [c.transport.get_extra_info("socket") if c.transport is not None else None for c in conns]
        phases.mark("export")
        if any(s is None for s in socks) or not self.transfer.send(target, socks, header, states):
            return None
        phases.mark("send")
        log.info("compaction: island of queue '%s' (%d connections, %d messages, %d unacked, %d bytes) handed to "
                 "worker %d: %s", q.name, len(conns), q.message_count, len(held), len(header), target, phases.text())
        for c in conns:
            c._forget_moved()  # its unacked messages go back into the copy, which has no consumer left
        # the copy is set aside (timers off: no expiry nor dead-lettering of what the target now holds), and
        # a stand-in for the target takes its place: this worker's other connections reach the queue there
        # (the target holds that traffic until it has the queue), never the copy
        self.classic.deleted(q)
        standin = RemoteQueue(self.link, to, q.vhost, q.name, q.durable, False, q.auto_delete, dict(q.arguments))
        vhost = self.node.vhosts[q.vhost]
        self.node.add_queue(vhost, standin, count=False)
        out = _Outgoing(to, q, standin, asyncio.get_running_loop().create_future(), phases=phases)
        self.outgoing[(q.vhost, q.name)] = out
        # the promise made durable now, while B takes the island, not when B asks (its fsync off the move's
        # path): a promise without an answer yet is a promise a restart keeps and settles (`recover`)
        try:
            self.promises.put((q.vhost, q.name), to)
            out.promised = True
        except OSError as exc:  # written again when B asks; its error then is B's answer
            log.warning("compaction: the promise of queue '%s' not written yet: %r", q.name, exc)
        phases.mark("promise")
        return out

    async def _await_commit(self, key: tuple[str, str], out: _Outgoing) -> bool:
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(out.done), COMMIT_WAIT_S)
            except TimeoutError:
                if not out.committing:  # B never asked: given up here, and B will be told so
                    self._give_up(key, out)
                    return False
            return await out.done
        finally:
            self.outgoing.pop(key, None)

    def _give_up(self, key: tuple[str, str], out: _Outgoing) -> None:
        """The move is off: the copy back in its stand-in's place, with everything held for it."""
        log.warning("compaction: the move of queue '%s' to %s did not commit; it stays here", key[1], out.target)
        self.given_up += 1
        self.outgoing.pop(key, None)
        self.promises.drop(key)
        vhost = self.node.vhosts.get(key[0])
        q = out.copy
        if vhost is not None and vhost.queues.get(key[1]) is out.standin:
            out.standin.home_down()  # a consumer that came meanwhile consumes again (basic.cancel)
            out.standin.delete()
            self.node.add_queue(vhost, q, count=False)
            features.attach(self.node, self.classic.timers, q)
        self.link.moves.release_queue(key[0], key[1], False)
        if not out.done.done():
            out.done.set_result(False)
        q.deliver_pending()

    def _on_commit(self, peer: str, req: cm.CompactCommit) -> bool:
        """A: may `peer` commit the move of the queue? True once, durably promised. B: asked by a restarted A
        (`_settle_promise`), whether it is still taking the queue from A (agreed, the record not yet applied)."""
        key = (req.vhost, req.queue)
        if (req.vhost, req.queue, peer) in self.incoming:
            return True
        out = self.outgoing.get(key)
        if out is None or out.target != peer or out.done.done():
            return False
        if not out.committing:
            if out.phases is not None:
                out.phases.mark("ask")  # handed over and promised -> B's CompactCommit here
            if not out.promised:
                self.promises.put(key, peer)  # synced before the answer: a restart of A keeps the promise
                out.promised = True
            out.committing = True
            self.link.moves.send_back(req.vhost, req.queue, peer)  # B's own held publishes, ahead of this answer
            _fault_after_promise()
        return True

    def _record_applies(self, vhost: str, name: str, home: str) -> None:
        """remote_type.py applies a record naming `home` as queue `name`'s: the commit of a move from here to
        `home`. The copy set aside and its index are dropped (its messages are there), and what was held
        here for the queue is forwarded through the stand-in, once the record is applied."""
        out = self.outgoing.get((vhost, name))
        if out is None or out.target != home or out.done.done():
            return
        self.moved_out += 1
        self.outgoing.pop((vhost, name), None)
        if out.phases is not None:
            out.phases.mark("record")  # the answer -> the record naming B applied here
            log.info("compaction: queue '%s' moved out to %s: %s", name, home, out.phases.text())
        out.copy.delete()
        self.promises.drop((vhost, name))
        asyncio.get_running_loop().call_soon(self.link.moves.release_queue, vhost, name, True)
        out.done.set_result(True)

    def _peer_changed(self, peer: str, up: bool) -> None:
        if up:
            return
        for key, out in list(self.outgoing.items()):
            if out.target == peer and not out.done.done():
                self._spawn(self._resolve(key, out))

    async def _resolve(self, key: tuple[str, str], out: _Outgoing) -> None:
        """B died with the move in flight: a read barrier says whether its record committed (then the
        copy here was dropped as it applied, and `done` is True), else the move is given up."""
        while not out.done.done():
            try:
                await self.cluster.barrier()
                break
            except Exception:  # noqa: BLE001 - no majority yet (B restarting): try again
                await asyncio.sleep(0.5)
        if not out.done.done():
            self._give_up(key, out)

    def recover(self) -> None:
        """At a restart, before any client is served: a queue this worker promised to B and recovered (the
        record naming B not applied yet) is not served here. Its copy is set aside and a stand-in homed at B
        takes its place (traffic for it is held at B until B has the queue) until the move settles
        (`_settle_promise`): the record naming B applies (the copy dropped), or B is no longer taking it
        and a read barrier shows no such record (the copy back, with everything)."""
        for key, target in list(self.promises.items.items()):
            v = self.node.vhosts.get(key[0])
            q = v.queues.get(key[1]) if v is not None else None
            if v is None or not isinstance(q, ClassicQueue):  # gone, or the record already names B: done
                self.promises.drop(key)
                continue
            log.info("compaction: queue '%s' was promised to %s before a restart; held until the move settles",
                     key[1], target)
            self.classic.deleted(q)
            standin = RemoteQueue(self.link, target, q.vhost, q.name, q.durable, False, q.auto_delete,
                                  dict(q.arguments))
            self.node.add_queue(v, standin, count=False)
            out = _Outgoing(target, q, standin, asyncio.get_running_loop().create_future(), committing=True)
            self.outgoing[key] = out
            self._spawn(self._settle_promise(key, out))

    async def _settle_promise(self, key: tuple[str, str], out: _Outgoing) -> None:
        try:
            while not out.done.done():
                try:
                    if self.cluster.connected(out.target):
                        taking = bool(await self.cluster.call(out.target, cm.CompactCommit(*key), timeout=5.0))
                        if taking:  # B waits for its record: it applies here (`_record_applies`)
                            await asyncio.wait_for(asyncio.shield(out.done), SETTLE_RETRY_S * 10)
                            continue
                        await self.cluster.barrier()  # B gave it up: a record of it would be applied here now
                        if not out.done.done():
                            self._give_up(key, out)
                        return
                except Exception as exc:  # noqa: BLE001 - B or the majority not there yet: asked again
                    log.debug("compaction: the promise of queue '%s' waits: %r", key[1], exc)
                await asyncio.sleep(SETTLE_RETRY_S)
        finally:
            if self.outgoing.get(key) is out and out.done.done():
                self.outgoing.pop(key, None)

    # -- step 3: the move, B's side ----------------------------------------------------------------------------
    async def _adopt(self, header: bytes, pairs: list[tuple[socket.socket, bytes]], arrived: float) -> None:
        phases = _Phases(arrived)
        phases.mark("receive")  # the supervisor's message -> the envelope read whole
        try:
            await self._take(header, pairs, phases)
        except Exception:  # a fault of this code: logged, and the clients told (320), never left hanging
            log.exception("compaction: an island handed over could not be taken")
            _refuse([p for p in pairs if p[0].fileno() >= 0])

    async def _take(self, header: bytes, pairs: list[tuple[socket.socket, bytes]], phases: _Phases) -> None:
        try:
            vhost_name, name, source, state, conns = _decode(header, [s for _sock, s in pairs])
            phases.mark("decode")
        except ValueError as exc:
            log.warning("an island handed over is closed: %s", exc)
            _refuse(pairs)
            return
        vhost = self.node.vhosts.get(vhost_name)
        standin = vhost.queues.get(name) if vhost is not None else None
        if vhost is None or not isinstance(standin, RemoteQueue) or standin.home != source:
            log.warning("an island of queue '%s' handed over from %s is closed: the queue is not %s's here",
                        name, source, source)
            _refuse(pairs)
            return
        self.link.moves.hold_outbound(vhost_name, name)  # this worker's own publishes wait for the queue from here
        try:
            await self._take_queue(vhost, standin, source, state, pairs, conns, phases)
        finally:
            self.link.moves.release_outbound(vhost_name, name, None)  # the move off (or a fault): sent to the home

    async def _take_queue(self, vhost: VirtualHost, standin: RemoteQueue, source: str, state: QueueTransfer,
                          pairs: list[tuple[socket.socket, bytes]], conns: list[IslandConnection],
                          phases: _Phases) -> None:
        vhost_name, name = vhost.name, standin.name
        q = self.classic.moved_copy(vhost, standin)
        try:
            entries = import_queue(q, state)
            phases.mark("import")
            if wrote_durable(q, state):  # (a transient queue, or no persistent message: nothing to sync)
                self._synced()
            phases.mark("sync")
            allowed = bool(await self.cluster.call(source, cm.CompactCommit(vhost_name, name), timeout=COMMIT_WAIT_S))
            phases.mark("commit")
        except Exception as exc:  # noqa: BLE001 - A gone or silent, or the import refused: the move is off
            log.warning("compaction: queue '%s' from %s not taken: %r", name, source, exc)
            allowed = False
        if not allowed:
            q.delete()  # (its index with it)
            self.link.moves.release_queue(vhost_name, name, True)  # what came here for it goes back to its home
            _refuse(pairs)
            return
        self.incoming.add((vhost_name, name, source))
        self.link.moves.expect_markers(vhost_name, name, source)  # the other workers' direct publishes wait for their markers
        installed = False
        try:
            installed = await self._commit_and_install(vhost, standin, q, entries, pairs, conns, phases)
        finally:
            self.incoming.discard((vhost_name, name, source))
            if not installed:
                self.link.moves.drop_markers(vhost_name, name)

    async def _commit_and_install(self, vhost: VirtualHost, standin: RemoteQueue, q: ClassicQueue,
                                  entries: dict[int, QueueEntry], pairs: list[tuple[socket.socket, bytes]],
                                  conns: list[IslandConnection], phases: _Phases) -> bool:
        """Propose the record naming this worker, and once it is committed install the copy and adopt the
        connections: True once installed."""
        vhost_name, name, source = vhost.name, standin.name, standin.home
        hold = os.environ.get(HOLD_RECORD_ENV)
        while hold and os.path.exists(hold):  # the test hook only
            await asyncio.sleep(0.05)
        op = DeclareQueue(vhost_name, name, q.auto_delete, pack_arguments(q.arguments), self.node.name,
                          q.durable, False)
        self.cluster.replicate(op)  # the commit point: proposed until it commits, or this worker dies
        while True:
            try:
                await self.cluster.wait_replicated()
                break
            except Exception as exc:  # noqa: BLE001 - no majority now (A restarting): it is proposed again
                log.info("compaction: the record of queue '%s' waits: %r", name, exc)
                await asyncio.sleep(0.5)
        phases.mark("record")  # proposed -> committed and applied here
        if vhost.queues.get(name) is not standin:  # deleted (or declared again) meanwhile: that record came later
            log.warning("compaction: queue '%s' changed while it moved here; its island is closed", name)
            q.delete()
            _refuse(pairs)
            return False
        self.classic.install_moved(vhost, standin, q)
        self.link.moves.release_queue(vhost_name, name, False)  # what came here for it meanwhile, after its messages
        self.link.moves.markers_installed(vhost_name, name)  # then the other workers' whose markers came through the source
        self.link.moves.release_outbound(vhost_name, name, q)  # then this worker's own, held since it asked to commit
        phases.mark("install")
        self.moved_in += 1
        # the connections adopted together (each its own; nothing orders one client's against another's): the
        # first now, the others' tasks from the next turn, while the first waits for its `connection_made`,
        # not one after the other's (two turns each)
        adoptions = [self._adopt_connection(q, name, sock, conn, entries)
                     for (sock, _s), conn in zip(pairs, conns, strict=True)]
        later = [asyncio.ensure_future(a) for a in adoptions[1:]]
        try:
            if adoptions:
                await adoptions[0]
        finally:
            await asyncio.gather(*later)
        q.deliver_pending()
        phases.mark("adopt")
        log.info("compaction: queue '%s' moved here from %s (%d connections): %s", name, source, len(pairs),
                 phases.text())
        return True

    async def _adopt_connection(self, q: ClassicQueue, name: str, sock: socket.socket, conn: IslandConnection,
                                entries: dict[int, QueueEntry]) -> None:
        """Adopt one connection of the island: its consumers attached and deliveries held under their tags
        (`restore_island`) before any unread byte is handled."""
        unread, conn.connection.unread = conn.connection.unread, b""

        def island(c: AMQPConnection) -> None:
            try:
                restore_island(c, q, conn.channels, entries)
            except ValueError as exc:  # (a state that does not fit its connection: nothing attached)
                log.warning("compaction: a connection of queue '%s' could not be restored: %s", name, exc)
                q.requeue([entries[seq] for ch in conn.channels for _t, seq, _c in ch.deliveries if seq in entries])
                c.close_forced("the connection could not be moved between workers")
                return
            c.receive_data(unread)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: AMQPProtocol(self.node, self.handover, adopted=conn.connection.encode(), island=island),
                sock=sock)
        except (OSError, ValueError) as exc:  # that client went away meanwhile: its deliveries go back
            log.info("compaction: a connection of queue '%s' was gone at its adoption: %r", name, exc)
            sock.close()
            q.requeue([entries[seq] for ch in conn.channels for _t, seq, _c in ch.deliveries if seq in entries])

    def _synced(self) -> None:
        """The import's persistent messages durable before the record: one synchronous flush and fsync of
        what is pending (a move is rare; `sync_now` covers everything written so far)."""
        persistence = self.node.persistence
        if persistence is not None:
            persistence.sink.sync_now()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def island_of(node: Node, q: ClassicQueue, expected: list[AMQPConnection] | None = None) -> list[AMQPConnection] | None:
    """The connections of `q`'s island (those that use only it), when it can move: every consumer of `q`
    theirs, 1 to `MAX_ISLAND_CONNECTIONS` of them, each a plain socket's, none kept by `island_reason`."""
    if not_movable(q) is not None:
        return None
    conns = [c for c in node.connections if isinstance(c, AMQPConnection) and queues_used(c) == {id(q)}]
    if expected is not None:
        conns.sort(key=expected.index if set(conns) == set(expected) else id)
    ids = {id(c) for c in conns}
    if not 1 <= len(conns) <= MAX_ISLAND_CONNECTIONS or any(id(c.channel.conn) not in ids for c in q.consumers()):
        return None
    if not all(_plain_socket(c) and island_reason(c, q) in (None, *WAIT_REASONS) for c in conns):
        return None
    return conns


def _log_state(fresh: list[tuple[WorkerLoad, list[Island]]]) -> None:
    """One INFO line: each worker's busy share, saturation, msg/s and islands (name:msg/s, * if it cannot
    move now), what the controller judged by (`--keep-logs` in benchmarks/workers_bench.py keeps it)."""
    log.info("compaction: loads %s", "; ".join(
        f"w{load.worker} busy {load.busy:.3f}{' sat' if load.saturated else ''} {int(load.msgs_per_s)} msg/s ["
        + " ".join(f"{i.name}:{int(i.msgs_per_s)}{'' if i.movable else '*'}" for i in islands) + "]"
        for load, islands in sorted(fresh, key=lambda f: f[0].worker)))


def _plain_socket(c: Any) -> bool:  # Any: a connection of the node (an AMQPConnection, or an in-process one)
    """A connection whose socket the kernel can hand over: not TLS (its session cannot leave this
    process), not an in-process pipe (no socket)."""
    t = getattr(c, "transport", None)
    return t is not None and getattr(c, "ssl_object", None) is None and t.get_extra_info("socket") is not None


def _why_not_quiet(c: AMQPConnection, reason: str | None) -> str:
    """What kept connection `c` from quiet at the wait's last look (the log of a move given up)."""
    t: Any = c.transport  # Any: asyncio's or uvloop's transport (the port's Protocol names neither method)
    size = t.get_write_buffer_size() if t is not None else -1
    reading = t.is_reading() if t is not None else None
    return (f"{c.name}: {reason or 'quiet'}, write buffer {size}, read holds {sorted(c._read_holds)}, "
            f"suspended {c._suspended}, buffered {c.reader.buffered}, out {len(c.out)}, reading {reading}")


def _written(c: AMQPConnection) -> bool:
    t = c.transport
    size = getattr(t, "get_write_buffer_size", None)
    return t is not None and size is not None and size() == 0


def _decode(header: bytes, states: list[bytes]) -> tuple[str, str, str, QueueTransfer, list[IslandConnection]]:
    try:
        v = msgpack.unpackb(header, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed island header: {exc}") from None
    if not isinstance(v, list) or len(v) != 5 or v[0] != HEADER_VERSION or not all(isinstance(x, str) for x in v[1:4]) \
            or not isinstance(v[4], bytes):
        raise ValueError("not an island header of this version")
    state = QueueTransfer.decode(v[4])
    if (state.vhost, state.name) != (v[1], v[2]):
        raise ValueError("an island's queue state names another queue")
    conns = [IslandConnection.decode(s) for s in states]
    return v[1], v[2], v[3], state, conns


def _fault_after_promise() -> None:
    """The test hook: with `KILL_AFTER_PROMISE_ENV` naming a file that exists, the file is removed and this
    worker kills itself as soon as its answer is written (the next loop turns)."""
    path = os.environ.get(KILL_AFTER_PROMISE_ENV)
    if not path or not os.path.exists(path):
        return
    os.unlink(path)
    log.warning("compaction: the test hook kills this worker after its promise")
    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGKILL)


def _refuse(pairs: list[tuple[socket.socket, bytes]]) -> None:
    for sock, _state in pairs:
        refuse_client(sock, stream=False)
