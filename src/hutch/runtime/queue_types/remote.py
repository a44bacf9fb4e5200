"""Transparent routing: using a queue that lives on another node of the cluster (seed 001).

Owns: `RemoteQueue`, the stand-in a node keeps for every queue whose home is another node (so routing,
permissions and exclusivity work as for a local queue), and `QueueLink`, the inter-node protocol that
carries publishes, publisher confirms, consumers, deliveries, settlements, basic.get, purge and queue
counts between a queue's home node and the node a client is connected to.

Rules:
- A queue lives on the node where it was declared (its "home", in the metadata). Elsewhere it is a
  `RemoteQueue`; every message operation goes to the home node over the transport, batched per loop
  iteration, in order per node pair.
- A queue its home has deleted (auto-delete, expiry) is re-declared anew, as on one node: a
  `queue.declare` whose home answers that it has no such queue waits (at most `GONE_WAIT_S`) for the
  deletion's record to delete the stand-in here, then declares the queue; only a passive declare, or a
  stand-in still there after the wait, gets 404.
- Operations a client waits for (basic.get, queue.purge, queue.declare/delete counts, basic.consume's
  existence check) are prepared asynchronously before the channel handles the method (the connection
  is suspended meanwhile: connection.py), so the channel code stays synchronous and type-blind.
- The hot records are batched per loop turn and peer, in order: publishes (`RemotePublishBatch`, the
  message's stored fields as they are, no re-encoding) and deliveries (`RemoteDeliverBatch`) are
  appended to the peer's held list and written as one record each when the turn ends, or at once before
  any other record to that peer (`ClusterService.hold`), so a peer sees every record in the order this
  node made them. A message larger than `BATCH_MESSAGE_BYTES` goes alone, as `RemotePublish` /
  `RemoteDeliver`; a held list is written once it holds `BATCH_BYTES`.
- Publisher confirms: a publish with a receipt is PENDING until the home node answers (`RemoteConfirm`
  with its publish id): the home node publishes it to the queue with a receipt of its own
  (`_PeerConfirms`), so it answers once the message is safe there (for a persistent message in a durable
  queue, synced to disk); a refusal (reject-publish overflow, queue gone, home node down) rejects the
  receipt.
- Deliveries to a consumer on another node stay unacked at the home node until the consumer's node
  settles them; when that node goes down, the home node requeues them (as for a closed channel).
- Credit flow across the hop: publishers here are held while the link to the home is backed up, and
  while the home says its queue holds publishers (`RemoteHold`: the home's own flow rule for the queue,
  judged as it takes each publish from this node; it lets go the same way, `_FlowHold`). The home judges
  the pace of a consumer on another node from its settlements (`_judge_pace`); the workers of one node
  tell one another when their loops' saturation changes (`LoopSaturated`, never to another node). A
  consumer whose connection here has a full write buffer is reported to its queue's home
  (`RemoteConsumerPaused`), which delivers nothing to it until this node says it drained.
- When a home node is down its queues are unavailable: 404 NOT_FOUND "home node ... is down or
  inaccessible" (RabbitMQ's text); consumers get basic.cancel; they come back with the node.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
from collections.abc import Awaitable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from hutch.amqp import spec
from hutch.amqp.errors import ACCESS_REFUSED, NOT_FOUND, NOT_IMPLEMENTED, ChannelError, ConnectionError_
from hutch.amqp.table import Timestamp
from hutch.cluster import messages as cm
from hutch.core import direct_reply
from hutch.core.confirms import Receipt
from hutch.core.credit_flow import WINDOW_S, consumer_settled
from hutch.core.message import Message
from hutch.core.move_order import MarkerWait
from hutch.core.queue_type import (
    PENDING,
    REJECTED,
    SETTLED,
    Consumer,
    Deliverer,
    Published,
    Queue,
    QueueEntry,
)
from hutch.core.vhost import rs
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService

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

PREPARE_TIMEOUT_S = 5.0
GONE_WAIT_S = 5.0  # how long a re-declare waits for a stand-in its home deleted to be deleted here (`_forgotten`)
BATCH_BYTES = 256 << 10  # a held batch is written once its bodies reach this
BATCH_MESSAGE_BYTES = 64 << 10  # a larger message is sent in a record of its own
FLOW_RECHECK_S = 0.1  # how often a home asks a queue that holds another node's publishers whether it still does
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."
STATS_INTERVAL_S = 1.0  # how often a node tells the others the counts of its queues (when they change)


_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def pack_message(msg: Message) -> bytes:
    """`msgpack(message_to_wire(msg))`: a message as a quorum queue stores it (bytes-like fields packed as
    they are, no copies)."""
    return _pack((msg.exchange, msg.routing_key, msg.properties_raw, msg.body, msg.route_tail,
                  msg.foreign_deaths))


def decode_message(v: list[Any]) -> Message:
    """The message `pack_message` packed, once unpacked (a quorum queue's stored payload)."""
    return cm.message_from_wire(v)


def home_down_error(q: Queue, home: str) -> ChannelError:
    # (a worker of a node of workers is named as its node: clients see one node per machine)
    return ChannelError(NOT_FOUND, f"home node '{node_of_worker(home)}' of durable {rs('queue', q.name, q.vhost)} "
                                   "is down or inaccessible")


STREAM_CONSUME_ARGUMENTS = ("x-stream-offset", "x-stream-filter", "x-stream-match-unfiltered")


def portable_arguments(arguments: dict[str, Any]) -> list[Any]:
    """The consume arguments a stream's home reads (where to start, the filter), as the link carries
    them: [key, value, is a timestamp] (a field table's timestamp or a datetime: seconds)."""
    out: list[Any] = []
    for key in STREAM_CONSUME_ARGUMENTS:
        if key not in arguments:
            continue
        value = arguments[key]
        if isinstance(value, datetime.datetime):
            when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
            out.append([key, int(when.timestamp()), True])
        elif isinstance(value, Timestamp):
            out.append([key, int(value), True])
        elif isinstance(value, str | bytes | int | list):  # (bool is an int)
            out.append([key, value, False])
    return out


def arguments_of(portable: list[Any]) -> dict[str, Any]:
    """`portable_arguments` read back (anything else in the list is ignored)."""
    out: dict[str, Any] = {}
    for item in portable:
        if type(item) is list and len(item) == 3 and item[0] in STREAM_CONSUME_ARGUMENTS:
            key, value, stamp = item
            out[key] = Timestamp(value) if stamp is True and type(value) is int else value
    return out


class RemoteQueue(Queue):
    """A queue whose home is another node. Counts are the home node's, as of the last answer."""

    queue_type = "classic"
    remote = True

    def __init__(self, link: QueueLink, home: str, vhost: str, name: str, durable: bool, exclusive: bool,
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        super().__init__(vhost, name, durable, REMOTE_OWNER if exclusive else None, auto_delete, arguments)
        self.link = link
        self.home = home
        self._consumers: dict[int, Consumer] = {}  # consumer id -> a consumer on this node
        self._ready = 0
        self._unacked = 0
        self._consumer_count = 0
        self._bytes = 0
        self.stat_dead_lettered = self.stat_dropped = self.stat_rejected = 0  # the home's, as it reports them
        self._prepared_get: QueueEntry | None = None
        self._prepared_purge = 0
        self._consume_sent = False  # a RemoteConsume went to the home since `take_consume_sent`
        self._new_consumers: list[int] = []  # ids of the consumers added since `take_consume_sent`
        self._registering: list[int] = []  # ... taken by the gate: their consume-ok waits for the home
        # consumer id -> deliveries that arrived before its consume-ok went to the client (held, then
        # delivered in order once it has: a client never sees basic.deliver before basic.consume-ok)
        self._before_ok: dict[int, list[tuple[str, int, bool, bool, Message]]] = {}
        self.flow_hold = False  # the home said its queue holds publishers (`RemoteHold`), until it lets go
        self.paused_consumers: set[int] = set()  # consumers here the home was told have a full socket
        self._home_exclusive = False  # the home said one of its consumers is exclusive (`_set_counts`)
        self._gone: asyncio.Event | None = None  # set when this stand-in is deleted here (`_forgotten`)
        # a replicated stream's stand-in on a node that is not a member: (its group id, its members), from
        # its record (the stream protocol asks a member for its writer, offsets and sequences)
        self.stream_group: tuple[int, tuple[str, ...]] | None = None

    # -- answers fetched before the channel handles a method ------------------------------------------
    async def prepare(self, method: spec.Method) -> None:
        link = self.link
        if not link.up(self.home):
            raise home_down_error(self, self.home)
        if isinstance(method, spec.Basic.Get):
            reply = await link.request(self.home, cm.QueueGet(self.vhost, self.name, bool(method.no_ack)))
            self._set_counts(reply.counts)
            e = reply.entry
            if e is not None:
                entry = QueueEntry(int(e[0]), cm.message_from_wire(e[1]))
                entry.redelivered = bool(e[2])
                self._prepared_get = entry
        elif isinstance(method, spec.Queue.Purge):
            if self.stream_group is not None:  # a stream: refused as its home refuses it (540, the connection)
                raise ConnectionError_(NOT_IMPLEMENTED, "queue.purge not supported by stream queues "
                                       f"{rs('queue', self.name, self.vhost)}", 50, 30)
            reply = await link.request(self.home, cm.QueuePurge(self.vhost, self.name))
            self._prepared_purge = int(reply)
        else:
            reply = await link.request(self.home, cm.QueueInfo(self.vhost, self.name))
            if reply is None and isinstance(method, spec.Queue.Delete):
                reply = [0, 0, 0]  # gone at its home already (expired, auto-deleted): delete-ok, as on one node
            elif reply is None and isinstance(method, spec.Queue.Declare) and not method.passive \
                    and await self._forgotten():
                return  # gone at its home and its deletion applied here: the declare makes the queue anew
            self._set_counts(reply)

    async def _forgotten(self) -> bool:
        """Whether this stand-in is deleted here within `GONE_WAIT_S`: its home deleted the queue (auto-delete,
        expiry) and answered that it has none, but the deletion's record may not have reached this worker
        yet. A client that re-declares the queue at once (celery's result consumer, reconnecting) then gets
        a new queue, as on one node, not 404 for a stand-in about to go."""
        if not self.deleted:
            gone = self._gone = self._gone or asyncio.Event()
            try:
                await asyncio.wait_for(gone.wait(), GONE_WAIT_S)
            except TimeoutError:
                return False
        return True

    async def refresh_counts(self) -> None:
        """The home's counts now (the pushed ones are up to a second old); a queue gone at its home keeps
        the last ones (its delete is then a no-op there)."""
        reply = await self.link.request(self.home, cm.QueueInfo(self.vhost, self.name))
        if reply is not None:
            self._set_counts(reply)

    async def fetch_for_get(self, no_ack: bool) -> None:
        """The management API's get: one message fetched from the home, as basic.get's `prepare` does."""
        await self.prepare(spec.Basic.Get(queue=self.name, no_ack=no_ack))

    def take_consume_sent(self) -> bool:
        """Whether a consumer was sent to the home since the last call (the gate then holds consume-ok,
        and this queue holds those consumers' deliveries until `consumer_registered` lets them go)."""
        sent, self._consume_sent = self._consume_sent, False
        if sent:
            for cid in self._new_consumers:
                if cid in self._consumers:
                    self._before_ok[cid] = []
                    self._registering.append(cid)
        self._new_consumers.clear()
        return sent

    async def consumer_registered(self) -> None:
        """Return once the home has registered the consumers sent to it: a `QueueInfo` round trip, which the
        home answers after the `RemoteConsume` records sent before it (one ordered link per worker or node
        pair, and `_on_consume` is synchronous). So basic.consume-ok follows the home's registration, as on
        one node (single active consumer: who consumed first is active). A home gone meanwhile or a queue
        deleted is not an error here: the consumer gets basic.cancel (`home_down`, `consumer_ended`).
        The home delivers as soon as it registers a consumer, so deliveries may arrive before this round
        trip ends: they are held (`hold_before_ok`) and delivered in the next loop turn, after the
        connection has put the held consume-ok out (the gate's last await is this one)."""
        cids, self._registering = self._registering, []
        try:
            await self.refresh_counts()
        except ChannelError:
            pass
        finally:
            asyncio.get_running_loop().call_soon(self._consume_ok_sent, cids)

    def hold_before_ok(self, cid: int, delivery: tuple[str, int, bool, bool, Message]) -> bool:
        """Hold a delivery to consumer `cid` if its consume-ok is not out yet (True: held)."""
        held = self._before_ok.get(cid)
        if held is None:
            return False
        held.append(delivery)
        return True

    def _consume_ok_sent(self, cids: list[int]) -> None:
        """The consume-ok of consumers `cids` went out: deliver what arrived for them meanwhile, in order."""
        for cid in cids:
            for peer, did, redelivered, no_ack, msg in self._before_ok.pop(cid, []):
                self.link.deliver_here(peer, cid, did, redelivered, no_ack, msg)

    def _give_back_held(self, cid: int) -> None:
        """Consumer `cid` went before its consume-ok did: its held deliveries go back to the home."""
        for peer, did, _redelivered, no_ack, _msg in self._before_ok.pop(cid, []):
            if not no_ack:
                self.link.send_settle(peer, [did])

    def _set_counts(self, counts: list[int] | None) -> None:
        """The home's answer: ready, unacked, consumers and (from a home that says it) whether one of those
        consumers is exclusive."""
        if counts is None:
            raise ChannelError(NOT_FOUND, f"no {rs('queue', self.name, self.vhost)}")
        self._ready, self._unacked, self._consumer_count = (int(c) for c in counts[:3])
        self._home_exclusive = len(counts) > 3 and bool(counts[3])

    def refuses_consumer(self, exclusive: bool) -> bool:
        """The exclusivity rule over the home's consumers as `prepare` fetched them (basic.consume goes
        through the gate, so the counts are this method's own round trip) and this node's own; the home
        judges again when the consumer arrives (`QueueLink._on_consume`), for two consumes that raced."""
        if super().refuses_consumer(exclusive):
            return True
        return self._consumer_count > 0 and (exclusive or self._home_exclusive)

    # -- messages ------------------------------------------------------------------------------------
    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        self.stat_published += 1
        return self.link.publish(self, msg, receipt)

    def get(self, channel: Deliverer | None, no_ack: bool) -> QueueEntry | None:
        entry, self._prepared_get = self._prepared_get, None
        if entry is not None:
            self.stat_get += 1
        return entry

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        self.link.settle(self, cm.Outcome.ACK, entries)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        self.link.settle(self, cm.Outcome.REQUEUE, entries)

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        self.link.settle(self, cm.Outcome.DISCARD, entries, reason)

    def purge(self) -> int:
        count, self._prepared_purge = self._prepared_purge, 0
        return count

    def deliver_pending(self) -> None:
        """Called when a consumer's connection can take deliveries again (its write buffer drained): tell
        the home for each consumer here that it was told was paused. The home delivers; credit is the
        consumer's prefetch and its socket (`QueueLink.consumer_paused`)."""
        paused = self.paused_consumers
        if paused:
            for cid in list(paused):
                consumer = self._consumers.get(cid)
                if consumer is None or not consumer.channel.conn.write_paused:
                    paused.discard(cid)
                    if consumer is not None:
                        self.link.send_consumer_paused(self.home, cid, False)

    # -- credit flow across the hop ----------------------------------------------------------------------
    def needs_flow_control(self) -> bool:
        """Credit flow across the hop: publishers to this queue are held while its home says the queue
        holds its publishers (`flow_hold`: the home's own flow rule, told with `RemoteHold`: a backlog
        behind consumers it does not serve fast enough, or its store behind the disk), and while the
        link to the home is over its write high-water mark (a saturated home reads the link only as fast
        as its loop gets to it; nothing is published into a full link, which the transport would drop).
        As RabbitMQ's credit flow paces a channel by the queue process on another node. A home that is
        down holds nobody (its queue's publishes are refused)."""
        link = self.link
        return link.up(self.home) and (self.flow_hold or not link.transport.writable(self.home))

    def flow_still_needed(self) -> bool:
        return not self.deleted and self.needs_flow_control()

    def set_flow_hold(self, hold: bool) -> None:
        """The home's `RemoteHold`: hold publishers here at their next publish, or let the held ones go
        (unless the link itself is still backed up)."""
        self.flow_hold = hold
        if not hold:
            self.release_flow_if_done()

    # -- consumers -------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        cid = self.link.add_consumer(self, consumer)
        self._consumers[cid] = consumer
        self._consume_sent = True
        self._new_consumers = [cid]  # one basic.consume at a time per connection; the gate takes it at once

    def remove_consumer(self, consumer: Consumer) -> None:
        for cid, c in list(self._consumers.items()):
            if c is consumer:
                del self._consumers[cid]
                self._give_back_held(cid)
                self.link.cancel_consumer(self, cid)

    def consumers(self) -> list[Consumer]:
        return list(self._consumers.values())

    def consumer_ended(self, cid: int) -> None:
        """The home node ended consumer `cid` (its queue went): basic.cancel to the client."""
        consumer = self._consumers.pop(cid, None)
        self._before_ok.pop(cid, None)  # the home ended it: nothing of it is unacked there any more
        if consumer is not None:
            consumer.channel.consumer_cancelled_by_broker(consumer)

    def set_stats(self, row: list[Any]) -> None:
        """The counts the home node reported: ready, unacked, consumers, bytes, then the stat_* counters
        (dead-lettered, dropped and rejected last, absent from an older node's rows)."""
        (self._ready, self._unacked, self._consumer_count, self._bytes, self.stat_published, self.stat_delivered,
         self.stat_acked, self.stat_redelivered, self.stat_get) = (int(x) for x in row[:9])
        if len(row) >= 12:
            self.stat_dead_lettered, self.stat_dropped, self.stat_rejected = (int(x) for x in row[9:12])

    def home_down(self) -> None:
        """The home node went away: cancel this node's consumers (basic.cancel to clients)."""
        consumers = list(self._consumers.values())
        self._consumers.clear()
        self._before_ok.clear()  # the home is gone: it requeues what it delivered here
        for c in consumers:
            self.link.forget_consumer(c)
            c.channel.consumer_cancelled_by_broker(c)
        self.set_flow_hold(False)

    # -- counts ------------------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self._ready

    @property
    def unacked_count(self) -> int:
        return self._unacked

    @property
    def consumer_count(self) -> int:
        return self._consumer_count

    @property
    def message_bytes(self) -> int:
        return self._bytes

    def delete(self) -> int:
        self.deleted = True
        if self._gone is not None:
            self._gone.set()
        consumers = list(self._consumers.values())
        self._consumers.clear()
        self._before_ok.clear()  # the queue is gone at its home, and its messages with it
        for c in consumers:
            self.link.forget_consumer(c)
        return self._ready

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["node"] = self.home
        return out


class _RemoteOwner:
    """The exclusive owner of a queue whose owning connection is on another node: nobody here."""

    def __repr__(self) -> str:
        return "<connection on another node>"


REMOTE_OWNER = _RemoteOwner()


class _RemoteDeliverer:
    """At the home node: the channel of a consumer that is on another node. `paused`: that node said the
    consumer's connection has a full write buffer (`RemoteConsumerPaused`): nothing is delivered to it
    until it says otherwise, and the queue's flow rule sees a consumer held by its socket."""

    def __init__(self, link: QueueLink, peer: str, cid: int) -> None:
        self.link = link
        self.peer = peer
        self.cid = cid
        self.paused = False

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.link.deliver_remote(self, consumer, queue, entry)

    def can_take(self) -> bool:
        return not self.paused and self.link.transport.writable(self.peer)

    @property
    def conn(self) -> _RemoteDeliverer:
        """The consumer's connection as a queue's flow check sees it: the link to the peer."""
        return self

    @property
    def write_paused(self) -> bool:
        return self.paused or not self.link.transport.writable(self.peer)

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.link.drop_remote_consumer(self.peer, self.cid, notify=True)


class _FlowHold:
    """At the home: the publishers of one other node (or worker) held by one queue here. It waits in the
    queue's `flow_waiters` as a held connection does (`flow_unblock` when the queue lets go), and asks
    the queue every `FLOW_RECHECK_S` whether its rule still holds, as a held connection's recheck does;
    letting go sends `RemoteHold(hold=False)` to the peer.
    Invariant: registered in `QueueLink.flow_holds` exactly while the peer was told to hold."""

    def __init__(self, link: QueueLink, peer: str, queue: Queue) -> None:
        self.link = link
        self.peer = peer
        self.queue = queue
        self.timer = asyncio.get_running_loop().call_later(FLOW_RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        q = self.queue
        if q.deleted or not q.flow_still_needed():
            q.flow_waiters.discard(self)
            self.flow_unblock(q)
        else:
            self.timer = asyncio.get_running_loop().call_later(FLOW_RECHECK_S, self._recheck)

    def flow_unblock(self, queue: Any) -> None:
        self.timer.cancel()
        if self.link.flow_holds.pop((self.peer, id(self.queue)), None) is self:
            self.link.send_flow(self.peer, self.queue, False)

    def drop(self) -> None:
        """The peer went away: forget the hold without telling it."""
        self.timer.cancel()
        self.queue.flow_waiters.discard(self)


class _PeerConfirms:
    """At the home node: the ConfirmOwner of the publishes one other node sent here (its publish ids),
    answered to that node with `RemoteConfirm` as the local queues settle or reject them."""

    def __init__(self, link: QueueLink, peer: str) -> None:
        self.link = link
        self.peer = peer
        self.pending: dict[int, Hashable] = {}  # publish id -> the queue that still has to settle it

    def settle(self, seq: int, queue: Hashable) -> None:
        if self.pending.pop(seq, None) is not None:
            self.link.confirm_out(self.peer, True, seq)

    def reject(self, seq: int, queue: Hashable, error: str | None) -> None:
        if self.pending.pop(seq, None) is not None:
            self.link.confirm_out(self.peer, False, seq)

    def queue_deleted(self, queue: Hashable) -> None:
        for pid in [pid for pid, q in self.pending.items() if q is queue]:
            self.settle(pid, queue)


class _Relayed:
    """The owner of a publish held while its queue moved here (`QueueLink.release_outbound`), published to
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


class QueueLink:
    """Both ends of the queue protocol between nodes (one per node)."""

    def __init__(self, node: Node, cluster: ClusterService) -> None:
        self.node = node
        self.cluster = cluster
        self.transport = cluster.transport
        self._ids = itertools.count(1)
        self._send = cluster.send
        # origin side
        self.consumers: dict[int, tuple[RemoteQueue, Consumer]] = {}
        # publish id -> (receipt, queue) of a publish sent to its queue's home node, until it answers
        self.confirm_pending: dict[int, tuple[Receipt, RemoteQueue]] = {}
        # home side: deliveries to other nodes not yet settled, per peer: delivery id -> (queue, entry, consumer)
        self.out_entries: dict[str, dict[int, tuple[Queue, QueueEntry, Consumer | None]]] = {}
        self.remote_consumers: dict[tuple[str, int], Consumer] = {}
        self._peer_confirms: dict[str, _PeerConfirms] = {}  # home side: the receipts' owner per origin node
        self._acks_out: dict[tuple[str, bool], list[int]] = {}  # (peer, confirmed) -> ids, sent once per turn
        self._acks_scheduled = False
        # peer -> the records held back this loop turn: [kind, flat entries, body bytes] runs, in order
        self._held: dict[str, list[list[Any]]] = {}
        self._held_scheduled = False
        self._discarded: set[str] = set()  # homes sent a discard since the last `discards_applied`
        self._discard_wait: asyncio.Future[None] | None = None  # the round trips of the last one
        self._stats_sent: dict[tuple[str, str], tuple[int, ...]] = {}  # what peers were last told
        self._stats_handle: asyncio.TimerHandle | None = None
        self._load_handle: asyncio.TimerHandle | None = None
        self._told_saturated = False  # what the other workers were last told of this loop (`LoopSaturated`)
        # home side: (peer, id(queue)) -> the hold of that peer's publishers by that queue (`RemoteHold`)
        self.flow_holds: dict[tuple[str, int], _FlowHold] = {}
        # home side: (vhost, queue) of a queue moving to another worker (compaction of load, runtime/compaction.py)
        # -> the other workers' publishes (peer, publish id, message), consumes and markers (`QueueMoved`) held
        # for it until the move commits (then forwarded to its new home) or does not (then taken here, in
        # order); and (vhost, queue, origin) of a queue moved here -> the publishes `origin` sent straight here,
        # kept behind until its marker comes through the old home (`marker_waits`, core/move_order.py).
        # Invariant: empty unless a move is in flight (the publish path's one truthiness check)
        self.moving: dict[tuple[str, ...], list[tuple[str, Any]]] = {}
        # new home's side: (vhost, queue) moved (or moving) here -> its wait for the other workers' markers
        self.marker_waits: dict[tuple[str, str], MarkerWait[tuple[str, Any]]] = {}
        # ... and (vhost, queue, origin) -> what a purge of that origin's waits on until its publishes are let go
        self._marker_waiters: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        # origin side: (vhost, queue) of a queue moving here -> this worker's own publishes to it (through its
        # stand-in, the stand-in, message and receipt), held from the moment it asks to commit the move until
        # it has the queue (then published to it, after what its old home sent back) or the move is off
        # (then sent to the home): its own connections' publishes never overtake their earlier ones
        self.outbound: dict[tuple[str, str], list[tuple[RemoteQueue, Message, Receipt | None]]] = {}
        # one call per kind, so the type checker matches each handler to its record
        cluster.register(cm.QueueGet, self._h_get)
        cluster.register(cm.QueuePurge, self._h_purge)
        cluster.register(cm.QueueInfo, self._h_info)
        cluster.register(cm.RemotePublish, self._on_publish)
        cluster.register(cm.RemoteDeliver, self._on_delivery)
        cluster.register(cm.RemotePublishBatch, self._on_publish_batch)
        cluster.register(cm.RemoteDeliverBatch, self._on_delivery_batch)
        cluster.register(cm.RemoteSettle, self._on_settle)
        cluster.register(cm.RemoteConfirm, self._on_confirm)
        cluster.register(cm.RemoteConsume, self._on_consume)
        cluster.register(cm.RemoteCancel, self._on_cancel)
        cluster.register(cm.QueueStats, self._on_stats)
        cluster.register(cm.RemoteConsumerEnded, self._on_consumer_ended)
        cluster.register(cm.RemoteHold, self._on_flow)
        cluster.register(cm.LoopSaturated, self._on_loop_saturated)
        cluster.register(cm.RemoteConsumerPaused, self._on_consumer_paused)
        cluster.register(cm.StreamConsumerInfo, self._h_stream_consumer_info)
        cluster.register(cm.QueueMoved, self._on_queue_moved)
        self.transport.writable_hooks.append(self._link_writable)
        node.cluster_peer_hooks.append(self._peer_changed)

    def up(self, peer: str) -> bool:
        return self.transport.connected(peer)

    async def request(self, peer: str, req: cm.QueueGet | cm.QueuePurge | cm.QueueInfo) -> Any:
        try:
            return await self.cluster.call(peer, req, timeout=PREPARE_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError) as exc:
            raise ChannelError(NOT_FOUND, f"home node '{node_of_worker(peer)}' of {rs('queue', req.queue, req.vhost)} "
                                          "is down or inaccessible") from exc
        except RemoteError as exc:
            text = str(exc)
            code = NOT_FOUND
            if text.startswith("403 "):
                code, text = ACCESS_REFUSED, text[4:]
            elif text.startswith("404 "):
                text = text[4:]
            raise ChannelError(code, text) from exc

    async def reply_token_alive(self, name: str) -> str | None:
        """The token of Direct Reply-To address `name` if it names another node (or worker) whose requester's
        channel is alive there, asked over the link (as RabbitMQ asks the requester's node whether the
        channel process lives); None otherwise."""
        token = name[len(REPLY_TO_PREFIX):]
        home = direct_reply.token_node(token)
        if home is None or home == self.node.name or not self.up(home):
            return None
        try:
            reply = await self.cluster.call(home, cm.QueueInfo("", name), timeout=PREPARE_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError, RemoteError):
            return None
        return token if reply is not None else None

    # -- origin side -------------------------------------------------------------------------------------
    def publish(self, q: RemoteQueue, msg: Message, receipt: Receipt | None) -> Published:
        """Send `msg` to its queue's home node. Without a receipt nobody waits for the answer (a message
        lost with the home node is not reported, as before)."""
        if self.outbound:
            held = self.outbound.get((q.vhost, q.name))
            if held is not None:  # the queue is moving here: kept in order until it is here (`release_outbound`)
                if len(held) >= MAX_HELD_WHILE_MOVING:  # bounded: nacked (its publisher resends), or sent on
                    if receipt is not None:
                        return REJECTED
                else:
                    held.append((q, msg, receipt))
                    return SETTLED if receipt is None else PENDING
        pid = next(self._ids)
        home = q.home
        if msg.size > BATCH_MESSAGE_BYTES:
            sent = self._send(home, cm.RemotePublish(q.vhost, q.name, pid, msg))
        elif self.transport.connected(home):
            self._hold(home, cm.RemotePublishBatch,
                       (q.vhost, q.name, pid, msg.exchange, msg.routing_key, msg.properties_raw, msg.body,
                        msg.route_tail, msg.foreign_deaths), msg.size)
            sent = True
        else:
            sent = False
        if not sent:
            return SETTLED if receipt is None else REJECTED  # home node down: the message is lost
        if receipt is None:
            return SETTLED
        self.confirm_pending[pid] = (receipt, q)
        return PENDING

    # -- the records held back for one loop turn -----------------------------------------------------------
    def _hold(self, peer: str, kind: type[cm.RemotePublishBatch | cm.RemoteDeliverBatch], values: tuple[Any, ...],
              size: int) -> None:
        runs = self._held.get(peer)
        if runs is None:
            runs = self._held[peer] = []
            self.cluster.hold(peer, self._release)
            if not self._held_scheduled:
                self._held_scheduled = True
                asyncio.get_running_loop().call_soon(self._release_all)
        if runs and runs[-1][0] is kind:
            run = runs[-1]
            run[1].extend(values)
            run[2] += size
        else:
            run = [kind, list(values), size]
            runs.append(run)
        if run[2] >= BATCH_BYTES:
            self.cluster.release(peer)

    def _release(self, peer: str) -> None:
        """Write the records held for `peer`; the receipts of publishes that could not be are rejected."""
        runs = self._held.pop(peer, None)
        if not runs:
            return
        send = self.transport.send_packed
        for kind, entries, _size in runs:
            if send(peer, cm.encode(kind(entries))) or kind is not cm.RemotePublishBatch:
                continue  # a delivery not written stays unacked here until the peer settles or goes
            pending = self.confirm_pending
            for i in range(2, len(entries), cm.PUBLISH_STRIDE):
                found = pending.pop(entries[i], None)
                if found is not None:
                    found[0].reject(found[1])

    def _release_all(self) -> None:
        self._held_scheduled = False
        held = self.cluster.held
        for peer in list(self._held):
            held.pop(peer, None)
            self._release(peer)

    def settle(self, q: RemoteQueue, outcome: cm.Outcome, entries: Iterable[QueueEntry], reason: str = "") -> None:
        ids = [e.seq for e in entries]
        if ids:
            self._send(q.home, cm.RemoteSettle(int(outcome), ids, reason))
            if outcome == cm.Outcome.DISCARD:
                self._discarded.add(q.home)

    def discards_pending(self) -> bool:
        """Whether a reject (or nack) without requeue went to another node whose effect (a dead letter,
        maybe published back here) this node has not yet seen acknowledged."""
        return bool(self._discarded) or (self._discard_wait is not None and not self._discard_wait.done())

    async def discards_applied(self) -> None:
        """Return once every home this node sent a discard to has handled it: a round trip to each (the
        link is ordered per node pair, and a home dead-letters while it handles the settle, so a dead
        letter it publishes to this node arrives before its answer). basic.get then sees the dead letter
        of a reject the client sent before, as on one node."""
        peers, self._discarded = self._discarded, set()
        if peers:
            self._discard_wait = asyncio.ensure_future(self._round_trips(peers, self._discard_wait))
        wait = self._discard_wait
        if wait is not None:
            await asyncio.shield(wait)

    async def _round_trips(self, peers: set[str], before: asyncio.Future[None] | None) -> None:
        if before is not None:
            await asyncio.shield(before)
        for peer in peers:
            try:
                await self.cluster.call(peer, cm.QueueInfo("", ""), timeout=PREPARE_TIMEOUT_S)
            except (PeerUnavailable, TimeoutError, RemoteError):
                pass  # a home gone: its dead letters went with it

    def add_consumer(self, q: RemoteQueue, consumer: Consumer) -> int:
        cid = next(self._ids)
        self.consumers[cid] = (q, consumer)
        self._send(q.home, cm.RemoteConsume(q.vhost, q.name, cid, consumer.tag, bool(consumer.no_ack),
                                            bool(consumer.exclusive), int(consumer.prefetch), int(consumer.priority),
                                            portable_arguments(consumer.arguments)))
        return cid

    def cancel_consumer(self, q: RemoteQueue, cid: int) -> None:
        self.consumers.pop(cid, None)
        self._send(q.home, cm.RemoteCancel(cid))

    def forget_consumer(self, consumer: Consumer) -> None:
        for cid, (_q, c) in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[cid]

    def _on_delivery(self, peer: str, d: cm.RemoteDeliver) -> None:
        self._deliver_here(peer, d.consumer_id, d.delivery_id, d.redelivered, d.no_ack, d.message)

    def _on_delivery_batch(self, peer: str, batch: cm.RemoteDeliverBatch) -> None:
        for cid, did, redelivered, no_ack, msg in cm.deliveries_of(batch):
            self._deliver_here(peer, cid, did, redelivered, no_ack, msg)

    def _deliver_here(self, peer: str, cid: int, did: int, redelivered: bool, no_ack: bool, msg: Message) -> None:
        found = self.consumers.get(cid)
        if found is not None and found[0].hold_before_ok(cid, (peer, did, redelivered, no_ack, msg)):
            return  # its consume-ok is not out yet (`RemoteQueue.consumer_registered`)
        self.deliver_here(peer, cid, did, redelivered, no_ack, msg)

    def send_settle(self, peer: str, dids: list[int]) -> None:
        """Give deliveries `dids` back to their queue at `peer` (requeued, as for a closed channel)."""
        self._send(peer, cm.RemoteSettle(cm.Outcome.REQUEUE, dids, ""))

    def deliver_here(self, peer: str, cid: int, did: int, redelivered: bool, no_ack: bool, msg: Message) -> None:
        """A delivery from `peer` to consumer `cid` here, to its channel (or back, if it is gone)."""
        found = self.consumers.get(cid)
        if found is None:  # cancelled meanwhile: give it back
            if not no_ack:
                self.send_settle(peer, [did])
            return
        q, consumer = found
        entry = QueueEntry(did, msg)
        entry.redelivered = redelivered
        if not consumer.no_ack:
            consumer.unacked += 1
        consumer.delivered += 1
        q.stat_delivered += 1
        consumer.channel.deliver(consumer, q, entry)
        if consumer.channel.conn.write_paused and cid not in q.paused_consumers:
            q.paused_consumers.add(cid)  # told again by `RemoteQueue.deliver_pending` once it drains
            self.send_consumer_paused(peer, cid, True)

    def _link_writable(self, peer: str) -> None:
        """The link to `peer` drained: the queues here with consumers there deliver again (they stopped
        while it was full: `_RemoteDeliverer.can_take`), as a channel's queues do when its socket drains."""
        seen: set[int] = set()
        for (p, _cid), consumer in list(self.remote_consumers.items()):
            q = consumer.queue
            if p == peer and id(q) not in seen and not q.deleted:
                seen.add(id(q))
                q.deliver_pending()

    def send_consumer_paused(self, peer: str, cid: int, paused: bool) -> None:
        self._send(peer, cm.RemoteConsumerPaused(cid, paused))

    def _on_consumer_paused(self, peer: str, rec: cm.RemoteConsumerPaused) -> None:
        """At the home: a consumer's socket on `peer` is full (or has room again)."""
        consumer = self.remote_consumers.get((peer, rec.consumer_id))
        if consumer is None or not isinstance(consumer.channel, _RemoteDeliverer):
            return
        consumer.channel.paused = bool(rec.paused)
        if not rec.paused and not consumer.queue.deleted:
            consumer.queue.deliver_pending()

    def _on_confirm(self, peer: str, c: cm.RemoteConfirm) -> None:
        """The home node's answer for publish ids: their receipts are settled (`ok`) or rejected."""
        pending = self.confirm_pending
        for pid in c.publish_ids:
            found = pending.pop(pid, None)
            if found is not None:
                if c.ok:
                    found[0].settle(found[1])
                else:
                    found[0].reject(found[1])

    # -- home side ---------------------------------------------------------------------------------------
    def _lookup(self, vhost: str, name: str) -> Queue | None:
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return None if q is None or getattr(q, "remote", False) else q

    def confirm_out(self, peer: str, ok: bool, pid: int) -> None:
        """Answer publish `pid` of `peer` (batched: one RemoteConfirm per peer and outcome per turn)."""
        self._acks_out.setdefault((peer, ok), []).append(pid)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_confirms)

    def _send_confirms(self) -> None:
        self._acks_scheduled = False
        out, self._acks_out = self._acks_out, {}
        for (peer, ok), ids in out.items():
            self._send(peer, cm.RemoteConfirm(ok, ids))

    def _on_publish(self, peer: str, p: cm.RemotePublish) -> None:
        self._publish_here(peer, p.vhost, p.queue, p.publish_id, p.message)

    def _on_publish_batch(self, peer: str, batch: cm.RemotePublishBatch) -> None:
        for vhost, queue, pid, msg in cm.publishes_of(batch):
            self._publish_here(peer, vhost, queue, pid, msg)

    def _publish_here(self, peer: str, vhost: str, queue: str, pid: int, msg: Message) -> None:
        if self.moving:
            moving = self.moving
            held = moving.get((vhost, queue, peer))  # `peer`'s, kept behind its marker
            if held is None:
                held = moving.get((vhost, queue))
            if held is not None:
                if len(held) < MAX_HELD_WHILE_MOVING:
                    held.append((peer, (pid, msg)))
                else:  # bounded: past it a publish is nacked (its publisher resends), never dropped silently
                    self.confirm_out(peer, False, pid)
                return
        q = self._lookup(vhost, queue)
        if q is None:
            held = self._incoming(peer, vhost, queue)
            if held is not None:
                held.append((peer, (pid, msg)))
                return
            standin = self._standin_elsewhere(peer, vhost, queue)
            if standin is None:
                self.confirm_out(peer, False, pid)
                return
            q = standin  # the queue moved from here and `peer` has not applied that yet: relayed to its home
        self._publish_to(peer, q, pid, msg)

    def _publish_to(self, peer: str, q: Queue, pid: int, msg: Message) -> None:
        """Publish `peer`'s publish `pid` to `q` (this worker's queue, or a stand-in a held publish is
        forwarded through), its confirm answered to `peer` when `q` settles it."""
        owner = self._peer_confirms.get(peer)
        if owner is None:
            owner = self._peer_confirms[peer] = _PeerConfirms(self, peer)
        result = q.publish(msg, Receipt(owner, pid))
        if result is PENDING:
            owner.pending[pid] = q
        else:
            self.confirm_out(peer, result is SETTLED, pid)
        if q.needs_flow_control() and (peer, id(q)) not in self.flow_holds:
            self._flow_hold(peer, q)

    # -- credit flow across the hop: the home's rule told to the publishing node -------------------------
    def _flow_hold(self, peer: str, q: Queue) -> None:
        """Queue `q` holds its publishers and `peer` publishes to it: tell `peer` to hold its own (as a
        publishing connection here would be held), until the queue lets go (`_FlowHold`)."""
        hold = _FlowHold(self, peer, q)
        self.flow_holds[(peer, id(q))] = hold
        q.flow_waiters.add(hold)
        self.send_flow(peer, q, True)

    def send_flow(self, peer: str, q: Queue, hold: bool) -> None:
        self._send(peer, cm.RemoteHold(q.vhost, q.name, hold))

    def _on_flow(self, peer: str, f: cm.RemoteHold) -> None:
        v = self.node.vhosts.get(f.vhost)
        q = v.queues.get(f.queue) if v is not None else None
        if isinstance(q, RemoteQueue) and q.home == peer:
            q.set_flow_hold(bool(f.hold))

    def _on_consume(self, peer: str, c: cm.RemoteConsume) -> None:
        held = self.moving.get((c.vhost, c.queue))
        if held is not None:
            if len(held) < MAX_HELD_WHILE_MOVING:
                held.append((peer, c))
            else:
                self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
            return
        q = self._lookup(c.vhost, c.queue)
        if q is None:
            incoming = self._incoming(peer, c.vhost, c.queue)
            if incoming is not None:
                incoming.append((peer, c))
            else:
                self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
            return
        if q.refuses_consumer(bool(c.exclusive)):  # raced another consume past the origin's check
            log.info("consumer %s on %s refused at the home: in exclusive use", c.tag, rs("queue", q.name, q.vhost))
            self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
            return
        deliverer = _RemoteDeliverer(self, peer, c.consumer_id)
        consumer = Consumer(c.tag, deliverer, q, c.no_ack, c.exclusive, c.prefetch, c.priority,
                            arguments_of(c.arguments))
        if q.queue_type == "stream":  # where it reads from (x-stream-offset) and its filter, as here
            try:
                self.node.queue_type_of(q).check_consume(q, consumer)
            except ChannelError as exc:
                log.info("consumer %s on %s refused at the home: %s", c.tag, rs("queue", q.name, q.vhost), exc.text)
                self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
                return
        self.remote_consumers[(peer, c.consumer_id)] = consumer
        q.add_consumer(consumer)

    def _on_cancel(self, peer: str, c: cm.RemoteCancel) -> None:
        self.drop_remote_consumer(peer, c.consumer_id)

    def _on_consumer_ended(self, peer: str, e: cm.RemoteConsumerEnded) -> None:
        found = self.consumers.pop(e.consumer_id, None)
        if found is not None:
            found[0].consumer_ended(e.consumer_id)

    def drop_remote_consumer(self, peer: str, cid: int, notify: bool = False) -> None:
        consumer = self.remote_consumers.pop((peer, cid), None)
        if consumer is None:
            return
        q = consumer.queue
        if notify:
            self._send(peer, cm.RemoteConsumerEnded(cid))
        else:
            q.remove_consumer(consumer)
            if q.auto_delete and not q.consumer_count and not q.deleted:
                vhost = self.node.vhosts.get(q.vhost)
                if vhost is not None:
                    self.node.delete_queue(vhost, q)

    def deliver_remote(self, d: _RemoteDeliverer, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        did = next(self._ids)
        no_ack = bool(consumer.no_ack)
        if not no_ack:
            self.out_entries.setdefault(d.peer, {})[did] = (queue, entry, consumer)
        msg = entry.msg
        if msg.size > BATCH_MESSAGE_BYTES:
            self._send(d.peer, cm.RemoteDeliver(d.cid, did, msg, bool(entry.redelivered), no_ack))
        elif self.transport.connected(d.peer):
            self._hold(d.peer, cm.RemoteDeliverBatch,
                       (d.cid, did, bool(entry.redelivered), no_ack, msg.exchange, msg.routing_key,
                        msg.properties_raw, msg.body, msg.route_tail, msg.foreign_deaths), msg.size)

    def _on_settle(self, peer: str, s: cm.RemoteSettle) -> None:
        outcome, ids, reason = s.outcome, s.delivery_ids, s.reason
        table = self.out_entries.get(peer)
        if not table:
            return
        by_queue: dict[int, tuple[Queue, list[QueueEntry]]] = {}
        consumer: Consumer | None = None
        settled_by: list[Consumer] = []
        for did in ids:
            item = table.pop(did, None)
            if item is None:
                continue
            q, entry, consumer = item
            if consumer is not None:
                consumer.unacked -= 1
                if not settled_by or settled_by[-1] is not consumer:
                    settled_by.append(consumer)
            by_queue.setdefault(id(q), (q, []))[1].append(entry)
        for q, entries in by_queue.values():
            if q.deleted:
                continue
            if outcome == cm.Outcome.ACK:
                q.ack(entries)
            elif outcome == cm.Outcome.REQUEUE:
                q.requeue(entries)
            else:
                q.discard(entries, reason or "rejected")
        self._judge_pace(settled_by)
        for q, _entries in by_queue.values():
            if not q.deleted:
                q.deliver_pending()

    # -- compaction of load: a queue's hop traffic held while it moves (runtime/compaction.py) -------------
    def hold_queue(self, vhost: str, name: str) -> None:
        """From now on, the other workers' publishes and consumes for queue `name` are held, not taken."""
        self.moving.setdefault((vhost, name), [])

    def _standin_of(self, vhost: str, name: str) -> RemoteQueue | None:
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

    def _incoming(self, peer: str, vhost: str, name: str) -> list[tuple[str, Any]] | None:
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

    def _standin_elsewhere(self, peer: str, vhost: str, name: str) -> RemoteQueue | None:
        """This worker's stand-in of queue `name` when its home is neither here nor `peer`: `peer` sent here as
        to the queue's home, and the queue moved from here (compaction of load) before `peer` applied that.
        Its publishes are relayed to the home (their confirms answered when the home's come), behind what was
        held here for the queue, and `peer`'s marker follows them (`_on_queue_moved`)."""
        q = self._standin_of(vhost, name)
        return q if q is not None and q.home != peer else None

    # -- order across a move: the other workers' markers (core/move_order.py) ----------------------------------
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
                self._publish_here(peer, vhost, name, pid, msg)
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
                    self._on_consume(peer, item)
                continue
            if isinstance(item, cm.QueueMoved):  # behind everything of its origin's held before it
                self._send(item.home, item)
                continue
            pid, msg = item
            if q is None or q.deleted:
                self.confirm_out(peer, False, pid)
            elif moved:
                self._publish_to(peer, q, pid, msg)
            else:
                self._publish_here(peer, vhost, name, pid, msg)

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
                self._publish_to(peer, q, *item)
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
                result = self.publish(standin, msg, receipt)
            else:
                result = here.publish(msg, None if receipt is None else Receipt(_Relayed(receipt, standin), 0))
            if receipt is not None and result is not PENDING:
                if result is SETTLED:
                    receipt.settle(standin)
                else:
                    receipt.reject(standin)

    def _judge_pace(self, consumers: list[Consumer]) -> None:
        """Settlements from another node came back: judge whether its consumers that filled their prefetch
        keep pace (core/credit_flow.py), as the channel of a consumer here does once per settle call, so
        the queue's flow rule sees the pace of a consumer across the hop too."""
        now_ms = 0
        for c in consumers:
            if c.pace_start_ms >= 0:
                now_ms = now_ms or int(self.node.wall_ms())
                q = c.queue
                consumer_settled(c, now_ms, q.stat_published, q.stat_acked)

    def _h_get(self, peer: str, req: cm.QueueGet) -> cm.QueueGetReply:
        q = self._lookup(req.vhost, req.queue)
        if q is None and self._standin_of(req.vhost, req.queue) is not None:
            # moving here, or moved from here before `peer` applied that: get-empty for the moment of the move
            return cm.QueueGetReply([0, 0, 0], None)
        if q is None:
            raise LookupError(f"404 no {rs('queue', req.queue, req.vhost)}")
        if (req.vhost, req.queue) in self.moving:  # its messages are on their way (milliseconds): get-empty
            return cm.QueueGetReply([0, q.unacked_count, q.consumer_count], None)
        no_ack = req.no_ack
        entry = q.get(_RemoteDeliverer(self, peer, 0), no_ack)
        wire_entry = None
        if entry is not None:
            did = next(self._ids)
            if not no_ack:
                self.out_entries.setdefault(peer, {})[did] = (q, entry, None)
            wire_entry = [did, cm.message_to_wire(entry.msg), bool(entry.redelivered)]
        return cm.QueueGetReply([q.message_count, q.unacked_count, q.consumer_count], wire_entry)

    def _h_purge(self, peer: str, req: cm.QueuePurge) -> int | Awaitable[int]:
        q = self._lookup(req.vhost, req.queue)
        if q is None:
            standin = self._standin_of(req.vhost, req.queue)
            if standin is None:
                raise LookupError(f"404 no {rs('queue', req.queue, req.vhost)}")
            if standin.home != peer:  # moved from here before `peer` applied that: relayed, behind its publishes
                return self._relay_purge(standin)
            # moving to `peer`, which has not taken it yet
        if q is None or (req.vhost, req.queue) in self.moving:
            raise LookupError(f"404 {rs('queue', req.queue, req.vhost)} is moving between workers; try again")
        if (req.vhost, req.queue, peer) in self.moving:  # moved here: after `peer`'s publishes still on the way
            return self._purge_after_marker(peer, req)
        return q.purge()

    async def _purge_after_marker(self, peer: str, req: cm.QueuePurge) -> int:
        """A purge of `peer`'s that reached the queue's new home before `peer`'s marker: its earlier publishes,
        coming through the old home, are purged too (it waits for the marker, or the end of the wait)."""
        key = (req.vhost, req.queue, peer)
        waiter = self._marker_waiters.get(key)
        if waiter is None:
            waiter = self._marker_waiters[key] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)
        result = self._h_purge(peer, req)
        return result if isinstance(result, int) else await result

    async def _relay_purge(self, standin: RemoteQueue) -> int:
        return int(await self.cluster.call(standin.home, cm.QueuePurge(standin.vhost, standin.name),
                                           timeout=PREPARE_TIMEOUT_S))

    def _h_info(self, peer: str, req: cm.QueueInfo) -> list[int] | None:
        if req.queue.startswith(REPLY_TO_PREFIX):  # a Direct Reply-To address (no queue is named amq.*)
            return [0, 0, 1] if req.queue[len(REPLY_TO_PREFIX):] in self.node.reply_channels else None
        q = self._lookup(req.vhost, req.queue)
        if q is None:  # moving here, or moved from here before `peer` applied that: the stand-in's counts
            standin = self._standin_of(req.vhost, req.queue)
            return None if standin is None else [standin.message_count, standin.unacked_count,
                                                 standin.consumer_count, 0]
        return [q.message_count, q.unacked_count, q.consumer_count, int(q.refuses_consumer(False))]

    async def stream_consumer_info(self, q: RemoteQueue) -> dict[Consumer, dict[str, int]]:
        """Where this node's consumers of `q` (a stream whose copy is its home's) read, as the home sees
        them (management's `offset`, `offset_lag`, `credits`); {} if the home does not answer."""
        mine = dict(q._consumers)
        if not mine:
            return {}
        try:
            reply = await self.cluster.call(q.home, cm.StreamConsumerInfo(q.vhost, q.name, list(mine)),
                                            timeout=PREPARE_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError, RemoteError) as exc:
            log.debug("consumer positions of %s not answered by %s: %r", rs("queue", q.name, q.vhost), q.home, exc)
            return {}
        out: dict[Consumer, dict[str, int]] = {}
        for item in reply if isinstance(reply, list) else ():
            if isinstance(item, list) and len(item) == 2 and item[0] in mine and isinstance(item[1], dict):
                out[mine[item[0]]] = {k: v for k, v in item[1].items()
                                      if k in ("offset", "offset_lag", "credits") and type(v) is int}
        return out

    def _h_stream_consumer_info(self, peer: str, req: cm.StreamConsumerInfo) -> list[list[Any]]:
        out: list[list[Any]] = []
        for cid in req.consumer_ids:
            consumer = self.remote_consumers.get((peer, cid)) if type(cid) is int else None
            if consumer is not None and (consumer.queue.vhost, consumer.queue.name) == (req.vhost, req.queue):
                out.append([cid, consumer.queue.consumer_info(consumer)])
        return out

    # -- queue counts for other nodes' listings -----------------------------------------------------------
    def booted(self) -> None:
        self.start_stats()
        if self.node.config.worker_index is not None:
            self.node.loop_load.on_saturated = self._loop_saturated

    def stop(self) -> None:
        self.stop_stats()
        for hold in self.flow_holds.values():
            hold.drop()
        self.flow_holds.clear()
        if self.node.loop_load.on_saturated == self._loop_saturated:
            self.node.loop_load.on_saturated = None
        if self._load_handle is not None:
            self._load_handle.cancel()
            self._load_handle = None

    # -- one node's loop load over its workers -----------------------------------------------------------
    def _siblings(self) -> list[str]:
        """The other workers of this node that are connected (never other nodes of a cluster: their cores
        are their own)."""
        mine = node_of_worker(self.node.name)
        return [p for p in self.transport.connected_peers() if node_of_worker(p) == mine]

    def _loop_saturated(self) -> None:
        """This worker's loop just became saturated (`LoopLoad.on_saturated`, as a window of input closes):
        tell the other workers (`LoopSaturated`), so their flow rules judge a backlog as the one loop of
        a node would, and watch every WINDOW_S for the end of it (`_tell_load`). No timer runs while the
        loop is not saturated: an idle worker's loop sleeps."""
        if self._told_saturated:
            return
        self._told_saturated = True
        for peer in self._siblings():
            self._send(peer, cm.LoopSaturated(True))
        if self._load_handle is None:
            self._load_handle = asyncio.get_running_loop().call_later(WINDOW_S, self._tell_load)

    def _tell_load(self) -> None:
        """Every WINDOW_S while the other workers were told this loop is saturated: tell them when it no
        longer is (then the timer stops until `_loop_saturated`)."""
        self._load_handle = None
        if self.node.loop_load.own_saturated():
            self._load_handle = asyncio.get_running_loop().call_later(WINDOW_S, self._tell_load)
            return
        self._told_saturated = False
        for peer in self._siblings():
            self._send(peer, cm.LoopSaturated(False))

    def _on_loop_saturated(self, peer: str, rec: cm.LoopSaturated) -> None:
        if node_of_worker(peer) != node_of_worker(self.node.name):
            return  # another node's load is not this node's
        peers = self.node.loop_load.saturated_peers
        if rec.saturated:
            peers.add(peer)
        else:
            peers.discard(peer)

    def start_stats(self) -> None:
        self._stats_handle = asyncio.get_running_loop().call_later(STATS_INTERVAL_S, self._push_stats)

    def stop_stats(self) -> None:
        if self._stats_handle is not None:
            self._stats_handle.cancel()
            self._stats_handle = None

    def _push_stats(self, full: bool = False) -> None:
        """Every STATS_INTERVAL_S: tell the other nodes the counts of this node's queues that changed
        (all of them to a node that just came up), so their listings and the HTTP API show them."""
        self._stats_handle = asyncio.get_running_loop().call_later(STATS_INTERVAL_S, self._push_stats)
        changed = []
        sent = self._stats_sent
        for vhost in self.node.vhosts.values():
            for q in vhost.queues.values():
                if q.remote:
                    continue
                row = (q.message_count, q.unacked_count, q.consumer_count, q.message_bytes, q.stat_published,
                       q.stat_delivered, q.stat_acked, q.stat_redelivered, q.stat_get,
                       getattr(q, "stat_dead_lettered", 0), getattr(q, "stat_dropped", 0),
                       getattr(q, "stat_rejected", 0))
                key = (vhost.name, q.name)
                if full or sent.get(key) != row:
                    sent[key] = row
                    changed.append([vhost.name, q.name, *row])
        if changed:
            for peer in self.transport.connected_peers():
                self._send(peer, cm.QueueStats(changed))

    def _on_stats(self, peer: str, stats: cm.QueueStats) -> None:
        vhosts = self.node.vhosts
        for row in stats.rows:
            v = vhosts.get(row[0])
            q = v.queues.get(row[1]) if v is not None else None
            if isinstance(q, RemoteQueue):
                q.set_stats(row[2:14])

    # -- liveness ------------------------------------------------------------------------------------
    def _peer_changed(self, peer: str, up: bool) -> None:
        if up:
            self._stats_sent.clear()  # the next push tells everyone everything
            if self._told_saturated and peer in self._siblings():
                self._send(peer, cm.LoopSaturated(True))
            return
        self.node.loop_load.saturated_peers.discard(peer)
        for waited, wait in list(self.marker_waits.items()):  # a marker that cannot come any more
            self._let_go(waited, wait, wait.peer_down(peer))
        self.cluster.held.pop(peer, None)
        self._held.pop(peer, None)  # its publishes' receipts are rejected below, its deliveries requeued
        # origin side: that node's queues are unavailable; what waited for its confirms is nacked
        pending = self.confirm_pending
        for pid in [pid for pid, (_receipt, rq) in pending.items() if rq.home == peer]:
            receipt, rq = pending.pop(pid)
            receipt.reject(rq)
        for vhost in self.node.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, RemoteQueue) and q.home == peer:
                    q.home_down()
        # home side: that node's consumers are gone and what they held goes back to the queues
        for key in [k for k in self.flow_holds if k[0] == peer]:
            self.flow_holds.pop(key).drop()
        for key in [k for k in self.remote_consumers if k[0] == peer]:
            self.drop_remote_consumer(*key)
        table = self.out_entries.pop(peer, {})
        by_queue: dict[int, tuple[Queue, list[QueueEntry]]] = {}
        for q, entry, consumer in table.values():
            if consumer is not None:
                consumer.unacked -= 1
            by_queue.setdefault(id(q), (q, []))[1].append(entry)
        for q, entries in by_queue.values():
            if not q.deleted:
                q.requeue(entries)
                q.deliver_pending()
        if table:
            log.info("node %s went away: %d unacknowledged deliveries returned to their queues", peer,
                     len(table))

