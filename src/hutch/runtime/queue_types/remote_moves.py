"""Compaction of load's side of the queue link: a queue's hop traffic while the queue moves between the
workers of a node (runtime/compaction.py moves it; docs/scaling.md, "Compaction of load: status").

Owns `MoveTraffic`, the collaborator each `QueueLink` (remote.py) owns and hands every part of a move to:
- at the old home: the other workers' publishes, consumes and markers held for a queue moving away
  (`hold_queue`), forwarded to the new home once the move commits or taken here if it does not
  (`release_queue`); the publishes of the new home itself sent back to it as the move is agreed
  (`send_back`); and the relay of what reaches the old home after it let the queue go (`standin_elsewhere`:
  a publish, a purge, a marker, sent on through its stand-in);
- at the new home: traffic for a queue moving here held until this worker has it (`incoming`, given
  back to the queue's home after `UNCLAIMED_HOLD_S` if nobody claims it); this worker's own publishes to
  it held from the moment it asks to commit (`hold_outbound` / `release_outbound`); and the other
  workers' direct publishes kept behind their markers (`expect_markers`, `markers_installed`,
  `drop_markers`: core/move_order.py's pure `MarkerWait`);
- at a third worker: its marker (`QueueMoved`, tag 153) sent as it applies the move's record (`moved_away`).

Rules:
- Never on a message's path unless a move is in flight: the link reads `moving` and `outbound` (the very
  dicts this object owns, bound to the link's own attributes once) with one truthiness check each on its
  publish paths. Invariant: `moving` and `outbound` are never rebound, only changed in place, and both
  are empty unless a move is in flight.
- Nothing held is dropped silently: past `MAX_HELD_WHILE_MOVING` a publish is nacked and a consume
  ended; a marker wait ends at the latest `MARKER_WAIT_S` after the install, or when the old home goes.
- The link's home side (`_publish_here`, `_publish_to`, `_on_consume`, `confirm_out`) and origin side
  (`publish`) take what a move lets go, as if it had just arrived (`MoveHost`, the port this module
  reaches the link by, without importing it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

from hutch.cluster import messages as cm
from hutch.core.confirms import Receipt
from hutch.core.message import Message
from hutch.core.move_order import MarkerWait
from hutch.core.queue_type import PENDING, SETTLED, Published, Queue
from hutch.core.vhost import rs
from hutch.runtime.queue_types.remote_queue import RemoteQueue
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService
    from hutch.runtime.clustering.transport import Transport

MAX_HELD_WHILE_MOVING = 10_000  # publishes and consumes held for a queue while it moves between workers
UNCLAIMED_HOLD_S = 60.0  # traffic held for a queue moving here that never came is sent on to its home after this
# the new home's longest wait for a worker's marker once it has the queue (`MarkerWait`): the marker comes
# behind that worker's traffic through the old home as soon as the old home applies the record; an old home
# that is down releases the wait at once, and one that is alive applies a committed record within its Raft
# group's next round trip (milliseconds). 30 s is six times the heartbeat timeout after which the supervisor
# kills a hung worker (`workers.heartbeat_timeout`, 5 s) and five times the link's 6 s of silence after which
# a peer is dropped: a marker that late comes from nothing alive, and waiting longer would only keep
# publishes from their queue (released then, in arrival order, logged)
MARKER_WAIT_S = 30.0

log = logging.getLogger("hutch.cluster.queues")


class MoveHost(Protocol):
    """What a move's traffic asks of the queue link (remote.py's `QueueLink`): where a let-go publish or
    consume is taken, as if it had just arrived."""

    node: Node
    cluster: ClusterService
    transport: Transport

    def publish(self, q: RemoteQueue, msg: Message, receipt: Receipt | None) -> Published: ...

    def confirm_out(self, peer: str, ok: bool, pid: int) -> None: ...

    def _publish_here(self, peer: str, vhost: str, queue: str, pid: int, msg: Message) -> None: ...

    def _publish_to(self, peer: str, q: Queue, pid: int, msg: Message) -> None: ...

    def _on_consume(self, peer: str, c: cm.RemoteConsume) -> None: ...


class _Relayed:
    """The owner of a publish held while its queue moved here (`release_outbound`), published to
    the queue once here: its sender's receipt is answered as the stand-in it went to would have answered it."""

    __slots__ = ("receipt", "standin")

    def __init__(self, receipt: Receipt, standin: RemoteQueue) -> None:
        self.receipt = receipt
        self.standin = standin

    def settle(self, seq: int, queue: Hashable) -> None:
        self.receipt.settle(self.standin)

    def reject(self, seq: int, queue: Hashable, error: str | None) -> None:
        self.receipt.reject(self.standin, error)

    def queue_deleted(self, queue: Hashable) -> None:
        self.receipt.settle(self.standin)


class MoveTraffic:
    """A node's (a worker's) traffic for the queues moving to or from it (one per `QueueLink`)."""

    def __init__(self, link: MoveHost) -> None:
        self.link = link
        self.node = link.node
        self.cluster = link.cluster
        self.transport = link.transport
        self._send = link.cluster.send
        # old home's side: (vhost, queue) of a queue moving to another worker -> the other workers' publishes
        # (peer, (publish id, message)), consumes and markers (`QueueMoved`) held for it until the move
        # commits (then forwarded to its new home) or does not (then taken here, in order); and (vhost,
        # queue, origin) of a queue moved here -> the publishes `origin` sent straight here, kept behind until
        # its marker comes through the old home (`marker_waits`, core/move_order.py).
        # Invariant: empty unless a move is in flight (the publish path's one truthiness check); never
        # rebound (the link reads this very dict as its own `moving`)
        self.moving: dict[tuple[str, ...], list[tuple[str, Any]]] = {}
        # new home's side: (vhost, queue) moved (or moving) here -> its wait for the other workers' markers
        self.marker_waits: dict[tuple[str, str], MarkerWait[tuple[str, Any]]] = {}
        # ... and (vhost, queue, origin) -> what a purge of that origin's waits on until its publishes are let go
        self._marker_waiters: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        # origin side: (vhost, queue) of a queue moving here -> this worker's own publishes to it (through its
        # stand-in, the stand-in, message and receipt), held from the moment it asks to commit the move until
        # it has the queue (then published to it, after what its old home sent back) or the move is off
        # (then sent to the home): its own connections' publishes never overtake their earlier ones.
        # Invariant: never rebound (the link reads this very dict as its own `outbound`)
        self.outbound: dict[tuple[str, str], list[tuple[RemoteQueue, Message, Receipt | None]]] = {}
        link.cluster.register(cm.QueueMoved, self._on_queue_moved)

    def hold_queue(self, vhost: str, name: str) -> None:
        """From now on, the other workers' publishes and consumes for queue `name` are held, not taken."""
        self.moving.setdefault((vhost, name), [])

    def standin_of(self, vhost: str, name: str) -> RemoteQueue | None:
        """This worker's stand-in of queue `name` of a node of workers' own worker (compaction moves only
        between those), whatever its home."""
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return q if isinstance(q, RemoteQueue) and node_of_worker(q.home) == node_of_worker(self.node.name) \
            and q.home != self.node.name else None

    def _standin_homed(self, peer: str, vhost: str, name: str) -> RemoteQueue | None:
        """This worker's stand-in of queue `name` when its home is `peer`, which sends here as to the queue's
        home: `peer` is moving the queue here (compaction of load) and this worker has not taken it yet."""
        if node_of_worker(peer) != node_of_worker(self.node.name):
            return None
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return q if isinstance(q, RemoteQueue) and q.home == peer else None

    def incoming(self, peer: str, vhost: str, name: str) -> list[tuple[str, Any]] | None:
        """Where traffic for a queue moving here is held until this worker has it (`release_queue` once it
        has, or once the move is off); None when the queue is not moving here. A hold nobody claims is
        given back to the queue's home after `UNCLAIMED_HOLD_S`."""
        key = (vhost, name)
        held = self.moving.get(key)
        if held is not None:
            return held if len(held) < MAX_HELD_WHILE_MOVING else None
        if self._standin_homed(peer, vhost, name) is None and key not in self.outbound:
            return None  # (while this worker takes the queue, a worker it expects no marker from is held too)
        held = self.moving[key] = []
        asyncio.get_running_loop().call_later(UNCLAIMED_HOLD_S, self._unclaimed, key, held)
        return held

    def standin_elsewhere(self, peer: str, vhost: str, name: str) -> RemoteQueue | None:
        """This worker's stand-in of queue `name` when its home is neither here nor `peer`: `peer` sent here as
        to the queue's home, and the queue moved from here (compaction of load) before `peer` applied that.
        Its publishes are relayed to the home (their confirms answered when the home's come), behind what was
        held here for the queue, and `peer`'s marker follows them (`_on_queue_moved`)."""
        q = self.standin_of(vhost, name)
        return q if q is not None and q.home != peer else None

    # -- order across a move: the other workers' markers (core/move_order.py) -------------------------------
    def moved_away(self, vhost: str, name: str, old_home: str, home: str) -> None:
        """This worker applied the record moving queue `name` from `old_home` to `home` (neither is this worker):
        its marker goes to `old_home`, behind its last publish there (`send` writes the held batch first),
        before any publish of its own reaches `home` directly; to `home` itself if `old_home` cannot take it
        (then nothing it sent there is confirmed: its link is down or full, and its publishes were nacked)."""
        marker = cm.QueueMoved(vhost, name, self.node.name, home)
        if not self._send(old_home, marker):
            self._send(home, marker)

    def _on_queue_moved(self, peer: str, rec: cm.QueueMoved) -> None:
        if rec.home != self.node.name:  # the old home: forwarded behind what it holds of the queue, or at once
            held = self.moving.get((rec.vhost, rec.queue))
            if held is not None:  # (one marker per worker and move: not counted against the bound)
                held.append((peer, rec))
            else:
                self._send(rec.home, rec)
            return
        key = (rec.vhost, rec.queue)
        wait = self.marker_waits.get(key)
        if wait is not None:
            self._let_go(key, wait, wait.marker(rec.origin))

    def expect_markers(self, vhost: str, name: str, via: str) -> None:
        """New home's side, as it asks to commit the move of queue `name` from `via`: from now on the direct
        publishes of every other worker connected here wait for that worker's marker (`markers_installed`
        takes them once the queue is here; `drop_markers` if the move does not end here). No worker applies
        the record before this (it is proposed after), so none has sent here directly yet."""
        key = (vhost, name)
        old = self.marker_waits.pop(key, None)
        if old is not None:
            self._let_go(key, old, old.expire())
        wait: MarkerWait[tuple[str, Any]] = MarkerWait(via, self.transport.connected_peers())
        self.marker_waits[key] = wait
        for origin, held in wait.held.items():
            self.moving[(vhost, name, origin)] = held

    def markers_installed(self, vhost: str, name: str) -> None:
        """The queue is here: the publishes of the workers whose marker came are taken; the others' wait for
        theirs, at most `MARKER_WAIT_S`."""
        key = (vhost, name)
        wait = self.marker_waits.get(key)
        if wait is None:
            return
        self._let_go(key, wait, wait.install())
        if not wait.done:
            asyncio.get_running_loop().call_later(MARKER_WAIT_S, self._markers_late, key, wait)

    def _markers_late(self, key: tuple[str, str], wait: MarkerWait[tuple[str, Any]]) -> None:
        if self.marker_waits.get(key) is wait:
            log.warning("compaction: no marker from %s for %s within %.0f s; their publishes are taken as they came",
                        ", ".join(sorted(wait.held)), rs("queue", key[1], key[0]), MARKER_WAIT_S)
            self._let_go(key, wait, wait.expire())

    def drop_markers(self, vhost: str, name: str) -> None:
        """The move did not end here: what waited for markers is handled as if it had just come."""
        key = (vhost, name)
        wait = self.marker_waits.get(key)
        if wait is not None:
            self._let_go(key, wait, wait.abandon())

    def awaiting_markers(self, vhost: str, name: str) -> bool:
        """Whether queue `name` moved here still waits for a marker (it does not move again meanwhile)."""
        return (vhost, name) in self.marker_waits

    def _let_go(self, key: tuple[str, str], wait: MarkerWait[tuple[str, Any]],
                released: list[tuple[str, list[tuple[str, Any]]]]) -> None:
        """Publishes a marker (or the end of a wait) let go: taken in the order they came."""
        vhost, name = key
        for origin, items in released:
            self.moving.pop((vhost, name, origin), None)
            for peer, (pid, msg) in items:
                self.link._publish_here(peer, vhost, name, pid, msg)
            waiter = self._marker_waiters.pop((vhost, name, origin), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if wait.done and self.marker_waits.get(key) is wait:
            del self.marker_waits[key]

    def _unclaimed(self, key: tuple[str, str], held: list[tuple[str, Any]]) -> None:
        if self.moving.get(key) is held:
            self.release_queue(key[0], key[1], True)

    def release_queue(self, vhost: str, name: str, moved: bool) -> None:
        """The move of queue `name` ended. `moved`: its record names its new home, and this worker has its
        stand-in: each held publish is forwarded through it (its confirm answered when the new home's
        comes) and each held consumer is ended (basic.cancel to its client, which consumes again from the
        new home). Else everything held is taken here, in the order it came."""
        held = self.moving.pop((vhost, name), None)
        if not held:
            return
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        for peer, item in held:
            if isinstance(item, cm.RemoteConsume):
                if moved or q is None:
                    self._send(peer, cm.RemoteConsumerEnded(item.consumer_id))
                else:
                    self.link._on_consume(peer, item)
                continue
            if isinstance(item, cm.QueueMoved):  # behind everything of its origin's held before it
                self._send(item.home, item)
                continue
            pid, msg = item
            if q is None or q.deleted:
                self.link.confirm_out(peer, False, pid)
            elif moved:
                self.link._publish_to(peer, q, pid, msg)
            else:
                self.link._publish_here(peer, vhost, name, pid, msg)

    def send_back(self, vhost: str, name: str, peer: str) -> None:
        """Old home's side: the move of queue `name` to `peer` is agreed (`CompactCommit`). The publishes held
        here from `peer` itself go back to it now, through this worker's stand-in (their confirms relayed),
        written before the answer: `peer` holds them until it has the queue and holds its own later
        publishes behind them (`hold_outbound`), so a channel of `peer` keeps its order across the move."""
        held = self.moving.get((vhost, name))
        q = self._standin_homed(peer, vhost, name)
        if not held or q is None:
            return
        keep: list[tuple[str, Any]] = []
        for origin, item in held:
            if origin == peer and not isinstance(item, cm.RemoteConsume | cm.QueueMoved):
                self.link._publish_to(peer, q, *item)
            else:
                keep.append((origin, item))
        held[:] = keep
        self.cluster.release(peer)

    def hold_outbound(self, vhost: str, name: str) -> None:
        """New home's side: from now on this worker's own publishes to queue `name` are held here, not sent
        to its home (`release_outbound` ends it)."""
        self.outbound.setdefault((vhost, name), [])

    def release_outbound(self, vhost: str, name: str, here: Queue | None) -> None:
        """The move of queue `name` here ended: `here`, the queue now this worker's, takes the publishes held
        by `hold_outbound` in order (each receipt answered as the stand-in it went to would have answered
        it); None (the move is off): they are sent to the queue's home, as they would have been."""
        held = self.outbound.pop((vhost, name), None)
        for standin, msg, receipt in held or ():
            if here is None or here.deleted:
                result = self.link.publish(standin, msg, receipt)
            else:
                result = here.publish(msg, None if receipt is None else Receipt(_Relayed(receipt, standin), 0))
            if receipt is not None and result is not PENDING:
                if result is SETTLED:
                    receipt.settle(standin)
                else:
                    receipt.reject(standin)

    async def marker_passed(self, vhost: str, name: str, origin: str) -> None:
        """Return once `origin`'s publishes to queue `name` moved here are let go (its marker came, or the wait
        for it ended): a purge of `origin`'s that reached the new home first waits for them (remote.py)."""
        key = (vhost, name, origin)
        waiter = self._marker_waiters.get(key)
        if waiter is None:
            waiter = self._marker_waiters[key] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)

    def peer_down(self, peer: str) -> None:
        """`peer` went away: a marker that cannot come any more is waited for no longer."""
        for waited, wait in list(self.marker_waits.items()):
            self._let_go(waited, wait, wait.peer_down(peer))
