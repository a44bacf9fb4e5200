"""The messages x-delayed-message exchanges hold until their `x-delay` is over (docs/delayed-messages.md).

Owns: for each x-delayed-message exchange of this node, the messages published to it with a delay
(`core.routing.message_delay`), a heap of (release time, seq) over them, their bodies (in RAM up to a
bound, else only on disk), the timer that releases them in release-time order, and their files.

Rules:
- With a data directory, every held message is written, before anything else happens to it, to the
  exchange's own queue index (`<data_dir>/delayed/<id>/`, entries PUB with the release time in the
  expiry field), through the node's group commit; for a durable exchange the entries are persistent and a
  confirming publisher's receipt is settled once they are synced. A released message's entry is acked
  only after the group commit that follows its publish into the queues (at least once across a crash).
- Released, a message is routed by the exchange's `x-delayed-type` router with its `x-delay` header
  negated (as the plugin does, so it is not delayed again through an exchange-to-exchange binding) and
  published to the queues it reaches; at most `RELEASE_BATCH` per loop turn.
- RAM holds at most `RAM_MESSAGES` bodies / `RAM_BYTES` per exchange; the others are read back a
  segment (`SEGMENT_ENTRIES` entries) at a time when they are due. The heap costs one entry per message.
- Deleting the exchange drops what it holds (as the plugin does).
- On a clustered node a durable delayed exchange has a replica: a quorum queue `amq.delayed-message.<name>`
  (single active consumer) that the node which declared the exchange declares. A held message is
  published into it with its release time in the `x-hutch-release-at` header (the publisher's confirm
  waits for the Raft commit), and every node consumes it with a `Releaser`: the active one holds what it is
  given in a heap and releases it as above, acking each entry once it is routed. When its node goes, the
  queue gives the unacked entries to another node's releaser, so held messages outlive any minority of
  nodes. Until the replica exists on this node (replication lag) messages are held locally.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
from collections.abc import Callable, Hashable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from hutch.core.confirms import Receipt
from hutch.core.message import Message
from hutch.core.queue_type import PENDING, REJECTED, Consumer, Queue, QueueEntry
from hutch.core.routing import DELAYED_MESSAGE, Exchange, message_delay
from hutch.runtime.queue_types.classic.persistence import resource_dir
from hutch.storage.errors import StorageError
from hutch.storage.queue_index import QueueIndex, remove_queue_directory

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.ports import BrokerPort

log = logging.getLogger("hutch.delayed")

REPLICA_PREFIX = "amq.delayed-message."
RELEASE_HEADER = "x-hutch-release-at"
HOUSEKEEPING_S = 1.0
CATCH_UP_QUIET_MS = 200  # a releaser just made active waits this long after the last entry it was given…
CATCH_UP_MAX_MS = 5_000  # …but no longer than this, before releasing what is already due
RAM_MESSAGES = 10_000
RAM_BYTES = 32 << 20
RELEASE_BATCH = 1_000
SEGMENT_ENTRIES = 1024


class HeldMessages:
    """What one x-delayed-message exchange holds. It is the `queue` its publishers' receipts name."""

    __slots__ = ("vhost", "name", "index", "durable", "heap", "ram", "ram_bytes", "next_seq", "timer",
                 "timer_at", "__weakref__")

    def __init__(self, vhost: str, name: str, index: QueueIndex | None, durable: bool) -> None:
        self.vhost = vhost
        self.name = name
        self.index = index
        self.durable = durable
        self.heap: list[tuple[int, int]] = []  # (release at, wall-clock ms; seq)
        self.ram: dict[int, Message] = {}
        self.ram_bytes = 0
        self.next_seq = 1
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self.timer_at = 0

    def keep(self, seq: int, msg: Message) -> bool:
        """Keep the body in RAM if within the bounds (always without an index)."""
        if self.index is not None and (len(self.ram) >= RAM_MESSAGES or self.ram_bytes + msg.size > RAM_BYTES):
            return False
        self.ram[seq] = msg
        self.ram_bytes += msg.size
        return True

    def take(self, seq: int) -> Message | None:
        msg = self.ram.pop(seq, None)
        if msg is not None:
            self.ram_bytes -= msg.size
        return msg

    def __len__(self) -> int:
        return len(self.heap)

    def __repr__(self) -> str:
        return f"<delayed messages of exchange {self.name!r} in vhost {self.vhost!r}: {len(self.heap)}>"


class DelayedMessages:
    """The node's `DelayedPort`: every delayed exchange's `HeldMessages`."""

    def __init__(self, node: BrokerPort, persistence: Any) -> None:
        self.node = node
        self.persistence = persistence
        self.directory = os.path.join(persistence.data_dir, "delayed") if persistence is not None else None
        self._held: dict[tuple[str, str], HeldMessages] = {}
        self._releasers: dict[tuple[str, str], Releaser] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._housekeeping: asyncio.TimerHandle | None = None

    # -- the DelayedPort ------------------------------------------------------------------------------
    def hold(self, vhost: VirtualHost, x: Exchange, msg: Message, headers: dict[str, Any] | None,
             receipt: Receipt | None) -> list[Hashable] | None:
        """Hold `msg` if it asks for a delay: the queues its receipt waits for ([] if none); None: route it."""
        delay = message_delay(headers)
        if delay is None:
            return None
        release_at = int(self.node.clock.wall_ms()) + delay
        replica = self._replica(vhost, x)
        if replica is not None:
            result = replica.publish(msg.with_header(RELEASE_HEADER, release_at), receipt)
            if result is not REJECTED:
                return [replica] if result is PENDING else []
        held = self._held_for(vhost.name, x)
        seq = held.next_seq
        held.next_seq = seq + 1
        heapq.heappush(held.heap, (release_at, seq))
        pending: list[Hashable] = []
        if held.index is not None:
            held.index.publish(seq, held.durable, msg, expires_at_ms=release_at)
            if receipt is not None and held.durable:
                self.persistence.sink.confirm_after_sync(receipt, held)
                pending.append(held)
        held.keep(seq, msg)
        self._arm(held)
        return pending

    def count(self, vhost: str, exchange: str) -> int:
        """The messages the exchange holds as this process sees them: `held_here` and its replica's."""
        return self.held_here(vhost, exchange) + self.in_replica(vhost, exchange)

    def held_here(self, vhost: str, exchange: str) -> int:
        """The messages this process holds itself (not in the replica): per worker of a node."""
        held = self._held.get((vhost, exchange))
        return len(held) if held is not None else 0

    def in_replica(self, vhost: str, exchange: str) -> int:
        """The messages in the exchange's replica (a quorum queue: the same on every member, so counted
        once for a node of workers, not once per worker)."""
        v = self.node.vhosts.get(vhost)
        replica = v.queues.get(replica_name(exchange)) if v is not None else None
        return replica.message_count + replica.unacked_count if replica is not None else 0

    def exchange_declared(self, vhost: VirtualHost, x: Exchange) -> None:
        """A client declared a durable delayed exchange on this clustered node: declare its replica."""
        if self.node.cluster is None or not x.durable:
            return
        self.node.declare_queue(vhost, replica_name(x.name), True, False, False,
                                {"x-queue-type": "quorum", "x-single-active-consumer": True}, None)

    def exchange_deleted(self, vhost: str, exchange: str) -> None:
        releaser = self._releasers.pop((vhost, exchange), None)
        if releaser is not None:
            releaser.stop()
        v = self.node.vhosts.get(vhost)
        replica = v.queues.get(replica_name(exchange)) if v is not None else None
        if v is not None and replica is not None and not getattr(self.node, "replaying", False):
            self.node.delete_queue(v, replica)
        held = self._held.pop((vhost, exchange), None)
        if held is None:
            return
        if held.timer is not None:
            held.timer.cancel()
        if held.index is not None:
            held.index.delete()

    def recover(self) -> None:
        """Read back what durable delayed exchanges held; remove the files of the others."""
        if self.directory is None:
            return
        fs = self.persistence.fs
        fs.make_dirs(self.directory)
        keep = set()
        for vhost in self.node.vhosts.values():
            for x in vhost.exchanges.values():
                if x.type == DELAYED_MESSAGE and x.durable:
                    keep.add(resource_dir(vhost.name, x.name))
                    self._recover_exchange(vhost.name, x)
        for name in fs.list_dir(self.directory):
            if name not in keep:
                try:
                    remove_queue_directory(fs, os.path.join(self.directory, name))
                except StorageError as exc:
                    log.warning("cannot remove the stale delayed-message directory %s: %s", name, exc)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for held in self._held.values():
            self._arm(held)
        if self.node.cluster is not None:
            self._tend_replicas()

    def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            self._housekeeping = None
        for releaser in self._releasers.values():
            releaser.stop()
        self._releasers.clear()
        for held in self._held.values():
            if held.timer is not None:
                held.timer.cancel()
                held.timer = None
            if held.index is not None:
                held.index.close()
        self._loop = None

    # -- replicas (clustered nodes) ---------------------------------------------------------------------
    def _replica(self, vhost: VirtualHost, x: Exchange) -> Queue | None:
        if self.node.cluster is None or not x.durable:
            return None
        q = vhost.queues.get(replica_name(x.name))
        return q if q is not None and q.queue_type == "quorum" else None

    def _tend_replicas(self) -> None:
        """Every second: a releaser on each replica of this node's view, none on a replica gone."""
        wanted: set[tuple[str, str]] = set()
        for vhost in self.node.vhosts.values():
            for x in vhost.exchanges.values():
                if x.type != DELAYED_MESSAGE:
                    continue
                replica = self._replica(vhost, x)
                if replica is None:
                    continue
                key = (vhost.name, x.name)
                wanted.add(key)
                releaser = self._releasers.get(key)
                if releaser is None or releaser.queue is not replica:
                    if releaser is not None:
                        releaser.stop()
                    self._releasers[key] = Releaser(self, vhost.name, x.name, replica)
        for key in set(self._releasers) - wanted:
            self._releasers.pop(key).stop()
        if self._loop is not None:
            self._housekeeping = self._loop.call_later(HOUSEKEEPING_S, self._tend_replicas)

    # -- inside ---------------------------------------------------------------------------------------
    def _held_for(self, vhost: str, x: Exchange) -> HeldMessages:
        held = self._held.get((vhost, x.name))
        if held is None:
            index = None
            if self.directory is not None:
                p = self.persistence
                index = QueueIndex(p.fs, os.path.join(self.directory, resource_dir(vhost, x.name)), p.sink,
                                   store=None, segment_entries=SEGMENT_ENTRIES)
            held = self._held[(vhost, x.name)] = HeldMessages(vhost, x.name, index, x.durable)
        return held

    def _recover_exchange(self, vhost: str, x: Exchange) -> None:
        held = self._held_for(vhost, x)
        index = held.index
        assert index is not None, "recover runs only with a data directory"
        found = index.recover()
        held.next_seq = found.max_seq + 1
        for segno in index.segments():
            messages, _ = index.read_from(segno * SEGMENT_ENTRIES)
            for seq, _persistent, exchange, routing_key, props, body, _store_id, release_at in messages:
                heapq.heappush(held.heap, (release_at, seq))
                held.keep(seq, Message(exchange, routing_key, None, body, props))
        if held.heap:
            log.info("exchange '%s' in vhost '%s': %d delayed messages recovered", x.name, vhost, len(held.heap))

    def _arm(self, held: HeldMessages) -> None:
        if not held.heap:
            return
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:  # recovered before the loop runs: start() arms it
                return
        _rearm(held, loop, held.heap[0][0], self.node.clock.wall_ms(), partial(self._release, held))

    def _release(self, held: HeldMessages) -> None:
        held.timer = None
        vhost = self.node.vhosts.get(held.vhost)
        x = vhost.exchanges.get(held.name) if vhost is not None else None
        if self._held.get((held.vhost, held.name)) is not held:
            return  # deleted meanwhile (exchange_deleted dropped it)
        if vhost is None or x is None or x.type != DELAYED_MESSAGE:
            self.exchange_deleted(held.vhost, held.name)  # gone without a delete (auto-delete, its vhost)
            return
        now = self.node.clock.wall_ms()
        heap = held.heap
        released: list[int] = []
        while heap and heap[0][0] <= now and len(released) < RELEASE_BATCH:
            _at, seq = heapq.heappop(heap)
            msg = held.take(seq)
            if msg is None:
                msg = self._read_back(held, seq)
            released.append(seq)
            if msg is not None:
                self._route(vhost, x, msg)
        if released and held.index is not None:
            self.persistence.sink.after_sync(partial(held.index.ack, released))
        if heap and heap[0][0] <= now and self._loop is not None:
            held.timer = self._loop.call_soon(self._release, held)
            held.timer_at = heap[0][0]
        else:
            self._arm(held)

    def _read_back(self, held: HeldMessages, seq: int) -> Message | None:
        """A body paged out: read its segment, keeping the other due-later bodies found there in RAM."""
        index = held.index
        if index is None:
            return None
        first = seq - seq % SEGMENT_ENTRIES
        messages, _ = index.read_from(first)
        waiting = {s for _at, s in held.heap if first <= s < first + SEGMENT_ENTRIES}
        found = None
        for s, _persistent, exchange, routing_key, props, body, _store_id, _at in messages:
            if s == seq:
                found = Message(exchange, routing_key, None, body, props)
            elif s in waiting and s not in held.ram:
                held.ram[s] = Message(exchange, routing_key, None, body, props)
                held.ram_bytes += len(body)
        if found is None:
            log.error("exchange '%s' in vhost '%s': delayed message %d cannot be read back", held.name,
                      held.vhost, seq)
        return found

    def _route(self, vhost: VirtualHost, x: Exchange, msg: Message) -> None:
        headers = msg.properties.headers or {}
        if RELEASE_HEADER in headers:  # from the replica: the release time was ours
            props = msg.properties.copy()
            props.headers = headers = {k: v for k, v in headers.items() if k != RELEASE_HEADER}
            msg = msg.with_properties(props)
        delay = message_delay(headers)
        if delay is not None:
            msg = msg.with_header("x-delay", -delay)
            headers = msg.properties.headers or {}
        keys = [msg.routing_key]
        cc = headers.get("CC")
        if isinstance(cc, list):
            keys += [k for k in cc if isinstance(k, str)]
        for q in vhost.route(x, keys, headers, msg):
            q.publish(msg, None)


class _Timed(Protocol):
    timer: asyncio.TimerHandle | asyncio.Handle | None
    timer_at: int


def _rearm(holder: _Timed, loop: asyncio.AbstractEventLoop, first: int, now_ms: float,
           fn: Callable[[], None]) -> None:
    """One timer per heap, at its earliest release time: moved earlier when an earlier message arrives."""
    if holder.timer is not None:
        if holder.timer_at <= first:
            return
        holder.timer.cancel()
    holder.timer = loop.call_later(max(0.0, (first - now_ms) / 1000), fn)
    holder.timer_at = first


def replica_name(exchange: str) -> str:
    """The quorum queue that replicates what a delayed exchange holds on a cluster."""
    return (REPLICA_PREFIX + exchange)[:255]


class _NeverPaused:
    write_paused = False


class Releaser:
    """This node's consumer of a delayed exchange's replica (a `Deliverer`): a heap of the entries it was
    given, released at their time, each acked once routed."""

    conn = _NeverPaused()

    def __init__(self, owner: DelayedMessages, vhost: str, exchange: str, queue: Queue) -> None:
        self.owner = owner
        self.vhost = vhost
        self.exchange = exchange
        self.queue = queue
        self.heap: list[tuple[int, int, QueueEntry]] = []
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self.timer_at = 0
        self.stopped = False
        self.active = False  # given entries at least once: the queue's single active consumer
        # catching up: made active with a backlog (a restart, a failover), whose entries arrive over
        # several loop turns in publish order; releasing the overdue ones as they come would break the
        # release-time order, so the first release waits until the entries stop coming and the replica
        # has none ready left for it (`_given_more`), at most `CATCH_UP_MAX_MS`
        self.catching_up = True
        self.settle_at = 0
        self.catch_up_until = 0
        self.consumer = Consumer(f"amq.ctag-delayed-{owner.node.name}", self, queue, False, False, 0)
        queue.add_consumer(self.consumer)

    def can_take(self) -> bool:
        return not self.stopped

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        now = int(self.owner.node.clock.wall_ms())
        if not self.active:
            self.active = True
            self.catch_up_until = now + CATCH_UP_MAX_MS
            log.info("exchange '%s' in vhost '%s': this node releases its delayed messages", self.exchange,
                     self.vhost)
        if self.catching_up:
            self._settle_after(now)
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        headers = entry.msg.properties.headers or {}
        release_at = headers.get(RELEASE_HEADER)
        heapq.heappush(self.heap, (release_at if isinstance(release_at, int) else 0, entry.seq, entry))
        self._arm()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.stop(cancel=False)

    def _given_more(self) -> bool:
        """Catching up: the replica still has ready entries (not yet given to this, its single active
        consumer) and the bound is not reached: wait another quiet spell (True). On a loaded machine the
        backlog's entries can arrive further apart than `CATCH_UP_QUIET_MS`; releasing the overdue ones
        among the first would break the release-time order against those still to come."""
        now = int(self.owner.node.clock.wall_ms())
        if now >= self.catch_up_until or self.queue.message_count <= 0:
            return False
        self._settle_after(now)
        self._arm()
        return True

    def _settle_after(self, now: int) -> None:
        """Catching up: the first release waits another quiet spell from `now`, within the bound."""
        self.settle_at = min(self.catch_up_until, now + CATCH_UP_QUIET_MS)

    def stop(self, cancel: bool = True) -> None:
        """Not consuming any more; what it held goes back to the queue (unacked)."""
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.heap.clear()
        if cancel:
            self.queue.remove_consumer(self.consumer)

    def _arm(self) -> None:
        loop = self.owner._loop
        if loop is None or not self.heap or self.stopped:
            return
        first = max(self.heap[0][0], self.settle_at) if self.catching_up else self.heap[0][0]
        _rearm(self, loop, first, self.owner.node.clock.wall_ms(), self._release)

    def _release(self) -> None:
        self.timer = None
        if self.catching_up and self._given_more():
            return
        self.catching_up = False
        vhost = self.owner.node.vhosts.get(self.vhost)
        x = vhost.exchanges.get(self.exchange) if vhost is not None else None
        if vhost is None or x is None:
            return
        now = self.owner.node.clock.wall_ms()
        done: list[QueueEntry] = []
        while self.heap and self.heap[0][0] <= now and len(done) < RELEASE_BATCH:
            entry = heapq.heappop(self.heap)[2]
            self.owner._route(vhost, x, entry.msg)
            done.append(entry)
        if done:
            self.queue.ack(done)
        loop = self.owner._loop
        if self.heap and self.heap[0][0] <= now and loop is not None:
            self.timer = loop.call_soon(self._release)
            self.timer_at = self.heap[0][0]
        else:
            self._arm()
