"""The `remote` queue type's stand-in: `RemoteQueue`, the queue a node (or a worker of a node) keeps for every
queue whose home is another node (or worker), so routing, permissions and exclusivity work as for a local
queue.

Owns: the stand-in's side of each queue operation (its counts as the home last answered or pushed them,
the answers `prepare` fetches before the channel handles a method, its consumers here and their
deliveries held until their consume-ok is out, the home's flow hold), and `REMOTE_OWNER`, the exclusive
owner of a queue whose owning connection is elsewhere. Every message operation is handed to the node's
queue link (`StandinLink`, implemented by remote.py's `QueueLink`), which carries it to the home.

Rules:
- The stand-in never talks to the transport itself: it asks its link (`StandinLink`, a port: this module
  does not import the link's), which batches and orders per peer (remote.py).
- A queue its home has deleted (auto-delete, expiry) is re-declared anew, as on one node: a
  `queue.declare` whose home answers that it has no such queue waits (at most `GONE_WAIT_S`) for the
  deletion's record to delete the stand-in here, then declares the queue; only a passive declare, or a
  stand-in still there after the wait, gets 404.
- Operations a client waits for (basic.get, queue.purge, queue.declare/delete counts, basic.consume's
  existence check) are prepared asynchronously before the channel handles the method (the connection
  is suspended meanwhile: connection.py), so the channel code stays synchronous and type-blind.
- A client never sees basic.deliver before basic.consume-ok: deliveries that arrive for a consumer whose
  consume-ok is not out yet are held (`hold_before_ok`) and delivered in order once it is.
- When a home node is down its queues are unavailable: 404 NOT_FOUND "home node ... is down or
  inaccessible" (RabbitMQ's text, `home_down_error`); consumers get basic.cancel (`home_down`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from hutch.amqp import spec
from hutch.amqp.errors import NOT_FOUND, NOT_IMPLEMENTED, ChannelError, ConnectionError_
from hutch.cluster import messages as cm
from hutch.core.confirms import Receipt
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Deliverer, Published, Queue, QueueEntry
from hutch.core.vhost import rs
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.runtime.clustering.transport import Transport

GONE_WAIT_S = 5.0  # how long a re-declare waits for a stand-in its home deleted to be deleted here (`_forgotten`)


class StandinLink(Protocol):
    """What a stand-in asks of its node's queue link (remote.py's `QueueLink`): the port by which this module
    reaches the link without importing it."""

    transport: Transport

    def up(self, peer: str) -> bool: ...

    async def request(self, peer: str, req: cm.QueueGet | cm.QueuePurge | cm.QueueInfo) -> Any: ...

    def publish(self, q: RemoteQueue, msg: Message, receipt: Receipt | None) -> Published: ...

    def settle(self, q: RemoteQueue, outcome: cm.Outcome, entries: Iterable[QueueEntry],
               reason: str = "") -> None: ...

    def add_consumer(self, q: RemoteQueue, consumer: Consumer) -> int: ...

    def cancel_consumer(self, q: RemoteQueue, cid: int) -> None: ...

    def forget_consumer(self, consumer: Consumer) -> None: ...

    def send_settle(self, peer: str, dids: list[int]) -> None: ...

    def deliver_here(self, peer: str, cid: int, did: int, redelivered: bool, no_ack: bool,
                     msg: Message) -> None: ...

    def send_consumer_paused(self, peer: str, cid: int, paused: bool) -> None: ...

    async def stream_consumer_info(self, q: RemoteQueue) -> dict[Consumer, dict[str, int]]: ...


def home_down_error(q: Queue, home: str) -> ChannelError:
    # (a worker of a node of workers is named as its node: clients see one node per machine)
    return ChannelError(NOT_FOUND, f"home node '{node_of_worker(home)}' of durable {rs('queue', q.name, q.vhost)} "
                                   "is down or inaccessible")


class RemoteQueue(Queue):
    """A queue whose home is another node. Counts are the home node's, as of the last answer."""

    queue_type = "classic"
    remote = True

    def __init__(self, link: StandinLink, home: str, vhost: str, name: str, durable: bool, exclusive: bool,
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
