"""Transparent routing: using a queue that lives on another node of the cluster (seed 001), or in another
worker of a node of workers (docs/scaling.md, "Worker processes").

Owns `QueueLink`, both ends of the queue protocol between nodes (one per node): the inter-node records that
carry publishes, publisher confirms, consumers, deliveries, settlements, basic.get, purge and queue
counts between a queue's home node and the node a client is connected to. Its parts, each a module of
its own:
- remote_queue.py: `RemoteQueue`, the stand-in a node keeps for every queue whose home is another node
  (so routing, permissions and exclusivity work as for a local queue); it reaches the link by
  `StandinLink`;
- remote_home.py: at the home, what stands for another node inside its queues (`RemoteDeliverer`,
  `FlowHold`, `PeerConfirms`);
- remote_moves.py: `MoveTraffic`, compaction of load's traffic while a queue moves between workers (held,
  forwarded, relayed, sent back, kept behind markers), which the link owns and hands every move to;
- remote_stats.py: the queue counts and the loop saturation told to the other nodes on a timer;
- remote_codec.py: a message packed as a quorum queue stores it, and a consumer's stream arguments.

Rules:
- A queue lives on the node where it was declared (its "home", in the metadata). Elsewhere it is a
  `RemoteQueue`; every message operation goes to the home node over the transport, batched per loop
  iteration, in order per node pair.
- The hot records are batched per loop turn and peer, in order: publishes (`RemotePublishBatch`, the
  message's stored fields as they are, no re-encoding) and deliveries (`RemoteDeliverBatch`) are
  appended to the peer's held list and written as one record each when the turn ends, or at once before
  any other record to that peer (`ClusterService.hold`), so a peer sees every record in the order this
  node made them. A message larger than `BATCH_MESSAGE_BYTES` goes alone, as `RemotePublish` /
  `RemoteDeliver`; a held list is written once it holds `BATCH_BYTES`.
- The per-message paths pay for compaction of load with one truthiness check each: a publish here
  `if self.outbound:`, a publish taken at the home `if self.moving:` (both `MoveTraffic`'s dicts, bound
  to the link once, empty unless a move is in flight); everything else of a move is `MoveTraffic`'s.
- Publisher confirms: a publish with a receipt is PENDING until the home node answers (`RemoteConfirm`
  with its publish id): the home node publishes it to the queue with a receipt of its own
  (`PeerConfirms`), so it answers once the message is safe there (for a persistent message in a durable
  queue, synced to disk); a refusal (reject-publish overflow, queue gone, home node down) rejects the
  receipt.
- Deliveries to a consumer on another node stay unacked at the home node until the consumer's node
  settles them; when that node goes down, the home node requeues them (as for a closed channel).
- Credit flow across the hop: publishers here are held while the link to the home is backed up, and
  while the home says its queue holds publishers (`RemoteHold`: the home's own flow rule for the queue,
  judged as it takes each publish from this node; it lets go the same way, `FlowHold`). The home judges
  the pace of a consumer on another node from its settlements (`_judge_pace`); the workers of one node
  tell one another when their loops' saturation changes (`LoopSaturated`, remote_stats.py, never to
  another node). A consumer whose connection here has a full write buffer is reported to its queue's
  home (`RemoteConsumerPaused`), which delivers nothing to it until this node says it drained.
- When a home node is down its queues are unavailable: 404 NOT_FOUND "home node ... is down or
  inaccessible" (RabbitMQ's text); consumers get basic.cancel; they come back with the node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import ACCESS_REFUSED, NOT_FOUND, ChannelError
from hutch.cluster import messages as cm
from hutch.core import direct_reply
from hutch.core.confirms import Receipt
from hutch.core.credit_flow import consumer_settled
from hutch.core.message import Message
from hutch.core.queue_type import PENDING, REJECTED, SETTLED, Consumer, Published, Queue, QueueEntry
from hutch.core.vhost import rs
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
from hutch.runtime.queue_types.remote_codec import arguments_of, portable_arguments
from hutch.runtime.queue_types.remote_home import FlowHold, PeerConfirms, RemoteDeliverer
from hutch.runtime.queue_types.remote_moves import MAX_HELD_WHILE_MOVING, MoveTraffic
from hutch.runtime.queue_types.remote_queue import RemoteQueue
from hutch.runtime.queue_types.remote_stats import LoadTell, StatsPush
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService

log = logging.getLogger("hutch.cluster.queues")

PREPARE_TIMEOUT_S = 5.0
BATCH_BYTES = 256 << 10  # a held batch is written once its bodies reach this
BATCH_MESSAGE_BYTES = 64 << 10  # a larger message is sent in a record of its own
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."


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
        self._peer_confirms: dict[str, PeerConfirms] = {}  # home side: the receipts' owner per origin node
        self._acks_out: dict[tuple[str, bool], list[int]] = {}  # (peer, confirmed) -> ids, sent once per turn
        self._acks_scheduled = False
        # peer -> the records held back this loop turn: [kind, flat entries, body bytes] runs, in order
        self._held: dict[str, list[list[Any]]] = {}
        self._held_scheduled = False
        self._discarded: set[str] = set()  # homes sent a discard since the last `discards_applied`
        self._discard_wait: asyncio.Future[None] | None = None  # the round trips of the last one
        # home side: (peer, id(queue)) -> the hold of that peer's publishers by that queue (`RemoteHold`)
        self.flow_holds: dict[tuple[str, int], FlowHold] = {}
        # compaction of load: a queue's traffic while it moves between workers (remote_moves.py); the two
        # dicts the per-message paths check are its own, bound here once (never rebound there), so a publish
        # pays one attribute lookup and one truthiness check for them, as before the split
        moves = self.moves = MoveTraffic(self)
        self.moving = moves.moving
        self.outbound = moves.outbound
        self.stats = StatsPush(node, cluster)  # the counts of this node's queues, told to the others
        self.load = LoadTell(node, cluster)  # this worker's loop saturation, told to the others
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
        cluster.register(cm.RemoteConsumerEnded, self._on_consumer_ended)
        cluster.register(cm.RemoteHold, self._on_flow)
        cluster.register(cm.RemoteConsumerPaused, self._on_consumer_paused)
        cluster.register(cm.StreamConsumerInfo, self._h_stream_consumer_info)
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
        while it was full: `RemoteDeliverer.can_take`), as a channel's queues do when its socket drains."""
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
        if consumer is None or not isinstance(consumer.channel, RemoteDeliverer):
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
            held = self.moves.incoming(peer, vhost, queue)
            if held is not None:
                held.append((peer, (pid, msg)))
                return
            standin = self.moves.standin_elsewhere(peer, vhost, queue)
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
            owner = self._peer_confirms[peer] = PeerConfirms(self, peer)
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
        publishing connection here would be held), until the queue lets go (`FlowHold`)."""
        hold = FlowHold(self, peer, q)
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
            incoming = self.moves.incoming(peer, c.vhost, c.queue)
            if incoming is not None:
                incoming.append((peer, c))
            else:
                self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
            return
        if q.refuses_consumer(bool(c.exclusive)):  # raced another consume past the origin's check
            log.info("consumer %s on %s refused at the home: in exclusive use", c.tag, rs("queue", q.name, q.vhost))
            self._send(peer, cm.RemoteConsumerEnded(c.consumer_id))
            return
        deliverer = RemoteDeliverer(self, peer, c.consumer_id)
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

    def deliver_remote(self, d: RemoteDeliverer, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
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
        if q is None and self.moves.standin_of(req.vhost, req.queue) is not None:
            # moving here, or moved from here before `peer` applied that: get-empty for the moment of the move
            return cm.QueueGetReply([0, 0, 0], None)
        if q is None:
            raise LookupError(f"404 no {rs('queue', req.queue, req.vhost)}")
        if (req.vhost, req.queue) in self.moving:  # its messages are on their way (milliseconds): get-empty
            return cm.QueueGetReply([0, q.unacked_count, q.consumer_count], None)
        no_ack = req.no_ack
        entry = q.get(RemoteDeliverer(self, peer, 0), no_ack)
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
            standin = self.moves.standin_of(req.vhost, req.queue)
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
        await self.moves.marker_passed(req.vhost, req.queue, peer)
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
            standin = self.moves.standin_of(req.vhost, req.queue)
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

    # -- the parts on a timer (remote_stats.py) ------------------------------------------------------------
    def booted(self) -> None:
        self.stats.start()
        self.load.start()

    def stop(self) -> None:
        self.stats.stop()
        for hold in self.flow_holds.values():
            hold.drop()
        self.flow_holds.clear()
        self.load.stop()

    # -- liveness ------------------------------------------------------------------------------------
    def _peer_changed(self, peer: str, up: bool) -> None:
        if up:
            self.stats.peer_up()  # the next push tells everyone everything
            self.load.peer_up(peer)
            return
        self.load.peer_down(peer)
        self.moves.peer_down(peer)  # a marker that cannot come any more
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

