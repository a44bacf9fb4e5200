"""Transparent routing: using a queue that lives on another node of the cluster (seed 001).

Owns: `RemoteQueue`, the stand-in a node keeps for every queue whose home is another node (so routing,
permissions and exclusivity work as for a local queue), and `QueueLink`, the inter-node protocol that
carries publishes, publisher confirms, consumers, deliveries, settlements, basic.get, purge and queue
counts between a queue's home node and the node a client is connected to.

Rules:
- A queue lives on the node where it was declared (its "home", in the metadata). Elsewhere it is a
  `RemoteQueue`; every message operation goes to the home node over the transport, batched per loop
  iteration, in order per node pair.
- Operations a client waits for (basic.get, queue.purge, queue.declare/delete counts, basic.consume's
  existence check) are prepared asynchronously before the channel handles the method (the connection
  is suspended meanwhile: connection.py), so the channel code stays synchronous and type-blind.
- Publisher confirms: a publish routed to a remote queue is confirmed once the home node has enqueued
  it and, for a persistent message in a durable queue, synced it to disk; a refusal (reject-publish
  overflow, queue gone, home node down) is a nack.
- Deliveries to a consumer on another node stay unacked at the home node until the consumer's node
  settles them; when that node goes down, the home node requeues them (as for a closed channel).
- When a home node is down its queues are unavailable: 404 NOT_FOUND "home node ... is down or
  inaccessible" (RabbitMQ's text); consumers get basic.cancel; they come back with the node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from hutch.amqp import spec
from hutch.amqp.errors import ACCESS_REFUSED, NOT_FOUND, ChannelError
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Deliverer, Queue, QueueEntry
from hutch.core.vhost import rs
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

log = logging.getLogger("hutch.cluster.queues")

PREPARE_TIMEOUT_S = 5.0
STATS_INTERVAL_S = 1.0  # how often a node tells the others the counts of its queues (when they change)


def encode_message(msg: Message) -> list[Any]:
    return [msg.exchange, msg.routing_key, bytes(msg.properties_raw), bytes(msg.body), bytes(msg.route_tail),
            msg.foreign_deaths]


_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def pack_message(msg: Message) -> bytes:
    """`msgpack(encode_message(msg))`, without the copies (bytes-like fields are packed as they are)."""
    return _pack((msg.exchange, msg.routing_key, msg.properties_raw, msg.body, msg.route_tail,
                  msg.foreign_deaths))


def decode_message(v: list[Any]) -> Message:
    msg = Message(v[0], v[1], None, v[3], v[2], v[4])
    msg.foreign_deaths = bool(v[5])
    return msg


def home_down_error(q: Queue, home: str) -> ChannelError:
    return ChannelError(NOT_FOUND, f"home node '{home}' of durable {rs('queue', q.name, q.vhost)} is down or "
                                   "inaccessible")


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
        self._prepared_get: QueueEntry | None = None
        self._prepared_purge = 0

    # -- answers fetched before the channel handles a method ------------------------------------------
    async def prepare(self, method: spec.Method) -> None:
        link = self.link
        if not link.up(self.home):
            raise home_down_error(self, self.home)
        if isinstance(method, spec.Basic.Get):
            reply = await link.request(self.home, {"t": "qget", "v": self.vhost, "q": self.name,
                                                   "na": bool(method.no_ack)})
            self._set_counts(reply["c"])
            e = reply.get("e")
            if e is not None:
                entry = QueueEntry(int(e[0]), decode_message(e[1]))
                entry.redelivered = bool(e[2])
                self._prepared_get = entry
        elif isinstance(method, spec.Queue.Purge):
            reply = await link.request(self.home, {"t": "qpurge", "v": self.vhost, "q": self.name})
            self._prepared_purge = int(reply)
        else:
            reply = await link.request(self.home, {"t": "qinfo", "v": self.vhost, "q": self.name})
            self._set_counts(reply)

    def _set_counts(self, counts: list[int] | None) -> None:
        if counts is None:
            raise ChannelError(NOT_FOUND, f"no {rs('queue', self.name, self.vhost)}")
        self._ready, self._unacked, self._consumer_count = (int(c) for c in counts)

    # -- messages ------------------------------------------------------------------------------------
    def publish(self, msg: Message) -> bool | None:
        self.stat_published += 1
        return self.link.publish(self, msg)

    def get(self, channel: Deliverer, no_ack: bool) -> QueueEntry | None:
        entry, self._prepared_get = self._prepared_get, None
        if entry is not None:
            self.stat_get += 1
        return entry

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        self.link.settle(self, "qk", entries)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        self.link.settle(self, "qr", entries)

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        self.link.settle(self, "qx", entries, reason)

    def purge(self) -> int:
        count, self._prepared_purge = self._prepared_purge, 0
        return count

    def deliver_pending(self) -> None:
        pass  # the home node delivers; credit is its consumer's prefetch

    # -- consumers -------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        cid = self.link.add_consumer(self, consumer)
        self._consumers[cid] = consumer

    def remove_consumer(self, consumer: Consumer) -> None:
        for cid, c in list(self._consumers.items()):
            if c is consumer:
                del self._consumers[cid]
                self.link.cancel_consumer(self, cid)

    def consumers(self) -> list[Consumer]:
        return list(self._consumers.values())

    def home_down(self) -> None:
        """The home node went away: cancel this node's consumers (basic.cancel to clients)."""
        consumers = list(self._consumers.values())
        self._consumers.clear()
        for c in consumers:
            self.link.forget_consumer(c)
            c.channel.consumer_cancelled_by_broker(c)

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
        consumers = list(self._consumers.values())
        self._consumers.clear()
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
    """At the home node: the channel of a consumer that is on another node."""

    def __init__(self, link: QueueLink, peer: str, cid: int) -> None:
        self.link = link
        self.peer = peer
        self.cid = cid

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.link.deliver_remote(self, consumer, queue, entry)

    def can_take(self) -> bool:
        return self.link.transport.writable(self.peer)

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.link.drop_remote_consumer(self.peer, self.cid, notify=True)


class QueueLink:
    """Both ends of the queue protocol between nodes (one per node)."""

    def __init__(self, node: Node, cluster: Any) -> None:
        self.node = node
        self.cluster = cluster
        self.transport = cluster.transport
        self._ids = itertools.count(1)
        # origin side
        self.consumers: dict[int, tuple[RemoteQueue, Consumer]] = {}
        self.confirm_pending: dict[int, str] = {}  # publish id -> home node, until acked or nacked
        self.confirm_nacked: set[int] = set()
        self.last_publish_id = 0
        # home side: deliveries to other nodes not yet settled, per peer: delivery id -> (queue, entry, consumer)
        self.out_entries: dict[str, dict[int, tuple[Queue, QueueEntry, Consumer | None]]] = {}
        self.remote_consumers: dict[tuple[str, int], Consumer] = {}
        self._confirm_backlog: list[tuple[str, int, int]] = []  # (peer, publish id, storage count to sync)
        self._acks_out: dict[tuple[str, str], list[int]] = {}  # (peer, "qa"|"qn") -> ids, sent once per turn
        self._acks_scheduled = False
        self._stats_sent: dict[tuple[str, str], tuple[int, ...]] = {}  # what peers were last told
        self._stats_handle: asyncio.TimerHandle | None = None
        cluster.handlers.update({"qget": self._h_get, "qpurge": self._h_purge, "qinfo": self._h_info})
        node.cluster_peer_hooks.append(self._peer_changed)
        node.sync_hooks.append(self._storage_synced)

    def up(self, peer: str) -> bool:
        return self.transport.connected(peer)

    async def request(self, peer: str, obj: dict[str, Any]) -> Any:
        try:
            return await self.transport.call(peer, obj, timeout=PREPARE_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError) as exc:
            raise ChannelError(NOT_FOUND, f"home node '{peer}' of {rs('queue', obj['q'], obj['v'])} is down "
                                          "or inaccessible") from exc
        except RemoteError as exc:
            text = str(exc)
            code = NOT_FOUND
            if text.startswith("403 "):
                code, text = ACCESS_REFUSED, text[4:]
            elif text.startswith("404 "):
                text = text[4:]
            raise ChannelError(code, text) from exc

    # -- origin side -------------------------------------------------------------------------------------
    def publish(self, q: RemoteQueue, msg: Message) -> bool | None:
        pid = next(self._ids)
        self.last_publish_id = pid
        if not self.transport.send(q.home, {"t": "qp", "v": q.vhost, "q": q.name, "m": encode_message(msg),
                                            "i": pid}):
            self.confirm_nacked.add(pid)  # home node down: the message is lost, tell a confirming publisher
            return None
        self.confirm_pending[pid] = q.home
        return None

    def confirmed(self, lo: int, hi: int) -> int:
        """For publish ids lo..hi: 1 all confirmed, 0 some still pending, -1 some refused."""
        nacked = self.confirm_nacked
        pending = self.confirm_pending
        if lo == hi:  # one queue: the common case, without the range walk
            return 0 if lo in pending else -1 if lo in nacked else 1
        result = 1
        for pid in range(lo, hi + 1):
            if pid in pending:
                return 0
            if pid in nacked:
                result = -1
        return result

    def forget_confirms(self, lo: int, hi: int) -> None:
        nacked = self.confirm_nacked
        if nacked:
            for pid in range(lo, hi + 1):
                nacked.discard(pid)

    def settle(self, q: RemoteQueue, kind: str, entries: Iterable[QueueEntry], reason: str = "") -> None:
        ids = [e.seq for e in entries]
        if ids:
            self.transport.send(q.home, {"t": kind, "ids": ids, "r": reason})

    def add_consumer(self, q: RemoteQueue, consumer: Consumer) -> int:
        cid = next(self._ids)
        self.consumers[cid] = (q, consumer)
        self.transport.send(q.home, {"t": "qc", "v": q.vhost, "q": q.name, "cid": cid, "tag": consumer.tag,
                                     "na": consumer.no_ack, "ex": consumer.exclusive, "pf": consumer.prefetch,
                                     "pr": consumer.priority})
        return cid

    def cancel_consumer(self, q: RemoteQueue, cid: int) -> None:
        self.consumers.pop(cid, None)
        self.transport.send(q.home, {"t": "qcc", "cid": cid})

    def forget_consumer(self, consumer: Consumer) -> None:
        for cid, (_q, c) in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[cid]

    def _on_delivery(self, obj: dict[str, Any]) -> None:
        found = self.consumers.get(obj["cid"])
        if found is None:  # cancelled meanwhile: give it back
            if not obj.get("na"):
                self.transport.send(obj["from"], {"t": "qr", "ids": [obj["d"]], "r": ""})
            return
        q, consumer = found
        entry = QueueEntry(int(obj["d"]), decode_message(obj["m"]))
        entry.redelivered = bool(obj["rd"])
        if not consumer.no_ack:
            consumer.unacked += 1
        consumer.delivered += 1
        q.stat_delivered += 1
        consumer.channel.deliver(consumer, q, entry)

    def _on_confirms(self, acks: list[int], nacks: list[int]) -> None:
        for pid in acks:
            self.confirm_pending.pop(pid, None)
        for pid in nacks:
            if self.confirm_pending.pop(pid, None) is not None:
                self.confirm_nacked.add(pid)
        for ch in list(self.node.sync_waiters):
            ch.conn.want_flush(ch)

    # -- home side ---------------------------------------------------------------------------------------
    def _lookup(self, vhost: str, name: str) -> Queue | None:
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return None if q is None or getattr(q, "remote", False) else q

    def _confirm_out(self, peer: str, kind: str, pid: int) -> None:
        self._acks_out.setdefault((peer, kind), []).append(pid)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_confirms)

    def _send_confirms(self) -> None:
        self._acks_scheduled = False
        out, self._acks_out = self._acks_out, {}
        for (peer, kind), ids in out.items():
            self.transport.send(peer, {"t": kind, "ids": ids})

    def _on_publishes(self, peer: str, obj: dict[str, Any]) -> None:
        q = self._lookup(obj["v"], obj["q"])
        pid = obj["i"]
        if q is None:
            self._confirm_out(peer, "qn", pid)
            return
        storage = self.node.persistence
        before = storage.last_enqueued if storage is not None else 0
        refused = q.publish(decode_message(obj["m"])) is False
        if refused:
            self._confirm_out(peer, "qn", pid)
            return
        need = storage.last_enqueued if storage is not None and storage.last_enqueued != before else 0
        if need and storage is not None and need > storage.synced_seq:
            self._confirm_backlog.append((peer, pid, need))
        else:
            self._confirm_out(peer, "qa", pid)

    def _storage_synced(self, synced: int) -> None:
        if not self._confirm_backlog:
            return
        keep = []
        by_peer: dict[str, list[int]] = {}
        for peer, pid, need in self._confirm_backlog:
            if need <= synced:
                by_peer.setdefault(peer, []).append(pid)
            else:
                keep.append((peer, pid, need))
        self._confirm_backlog = keep
        for peer, ids in by_peer.items():
            for pid in ids:
                self._confirm_out(peer, "qa", pid)

    def _on_consume(self, peer: str, obj: dict[str, Any]) -> None:
        q = self._lookup(obj["v"], obj["q"])
        if q is None:
            self.transport.send(peer, {"t": "qe", "cid": obj["cid"]})
            return
        deliverer = _RemoteDeliverer(self, peer, int(obj["cid"]))
        consumer = Consumer(obj["tag"], deliverer, q, bool(obj["na"]), bool(obj["ex"]), int(obj["pf"]),
                            int(obj["pr"]))
        self.remote_consumers[(peer, int(obj["cid"]))] = consumer
        q.add_consumer(consumer)

    def drop_remote_consumer(self, peer: str, cid: int, notify: bool = False) -> None:
        consumer = self.remote_consumers.pop((peer, cid), None)
        if consumer is None:
            return
        q = consumer.queue
        if notify:
            self.transport.send(peer, {"t": "qe", "cid": cid})
        else:
            q.remove_consumer(consumer)
            if q.auto_delete and not q.consumer_count and not q.deleted:
                vhost = self.node.vhosts.get(q.vhost)
                if vhost is not None:
                    self.node.delete_queue(vhost, q)

    def deliver_remote(self, d: _RemoteDeliverer, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        did = next(self._ids)
        if not consumer.no_ack:
            self.out_entries.setdefault(d.peer, {})[did] = (queue, entry, consumer)
        self.transport.send(d.peer, {"t": "qd", "cid": d.cid, "d": did, "m": encode_message(entry.msg),
                                     "rd": entry.redelivered, "na": consumer.no_ack})

    def _on_settle(self, peer: str, kind: str, ids: list[int], reason: str) -> None:
        table = self.out_entries.get(peer)
        if not table:
            return
        by_queue: dict[int, tuple[Queue, list[QueueEntry]]] = {}
        for did in ids:
            item = table.pop(did, None)
            if item is None:
                continue
            q, entry, consumer = item
            if consumer is not None:
                consumer.unacked -= 1
            by_queue.setdefault(id(q), (q, []))[1].append(entry)
        for q, entries in by_queue.values():
            if q.deleted:
                continue
            if kind == "qk":
                q.ack(entries)
            elif kind == "qr":
                q.requeue(entries)
            else:
                q.discard(entries, reason or "rejected")
            q.deliver_pending()

    def _h_get(self, peer: str, obj: dict[str, Any]) -> dict[str, Any]:
        q = self._lookup(obj["v"], obj["q"])
        if q is None:
            raise LookupError(f"404 no {rs('queue', obj['q'], obj['v'])}")
        no_ack = bool(obj["na"])
        entry = q.get(_RemoteDeliverer(self, peer, 0), no_ack)
        reply: dict[str, Any] = {"c": [q.message_count, q.unacked_count, q.consumer_count]}
        if entry is not None:
            did = next(self._ids)
            if not no_ack:
                self.out_entries.setdefault(peer, {})[did] = (q, entry, None)
            reply["e"] = [did, encode_message(entry.msg), entry.redelivered]
        return reply

    def _h_purge(self, peer: str, obj: dict[str, Any]) -> int:
        q = self._lookup(obj["v"], obj["q"])
        if q is None:
            raise LookupError(f"404 no {rs('queue', obj['q'], obj['v'])}")
        return q.purge()

    def _h_info(self, peer: str, obj: dict[str, Any]) -> list[int] | None:
        q = self._lookup(obj["v"], obj["q"])
        return None if q is None else [q.message_count, q.unacked_count, q.consumer_count]

    # -- queue counts for other nodes' listings -----------------------------------------------------------
    def booted(self) -> None:
        self.start_stats()

    def stop(self) -> None:
        self.stop_stats()

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
                       q.stat_delivered, q.stat_acked, q.stat_redelivered, q.stat_get)
                key = (vhost.name, q.name)
                if full or sent.get(key) != row:
                    sent[key] = row
                    changed.append([vhost.name, q.name, *row])
        if changed:
            for peer in self.transport.connected_peers():
                self.transport.send(peer, {"t": "qs", "s": changed})

    def _on_stats(self, rows: list[list[Any]]) -> None:
        vhosts = self.node.vhosts
        for row in rows:
            v = vhosts.get(row[0])
            q = v.queues.get(row[1]) if v is not None else None
            if isinstance(q, RemoteQueue):
                (q._ready, q._unacked, q._consumer_count, q._bytes, q.stat_published, q.stat_delivered,
                 q.stat_acked, q.stat_redelivered, q.stat_get) = (int(x) for x in row[2:11])

    # -- messages and liveness ---------------------------------------------------------------------------
    def on_message(self, peer: str, obj: dict[str, Any]) -> bool:
        """Handle a queue-protocol message; False if `obj` is not one."""
        kind = obj.get("t")
        if kind == "qp":
            self._on_publishes(peer, obj)
        elif kind == "qd":
            obj["from"] = peer
            self._on_delivery(obj)
        elif kind in ("qk", "qr", "qx"):
            self._on_settle(peer, kind, obj["ids"], obj.get("r", ""))
        elif kind == "qa":
            self._on_confirms(obj["ids"], [])
        elif kind == "qn":
            self._on_confirms([], obj["ids"])
        elif kind == "qc":
            self._on_consume(peer, obj)
        elif kind == "qcc":
            self.drop_remote_consumer(peer, int(obj["cid"]))
        elif kind == "qs":
            self._on_stats(obj["s"])
        elif kind == "qe":
            found = self.consumers.pop(int(obj["cid"]), None)
            if found is not None:
                q, consumer = found
                q._consumers.pop(int(obj["cid"]), None)
                consumer.channel.consumer_cancelled_by_broker(consumer)
        else:
            return False
        return True

    def _peer_changed(self, peer: str, up: bool) -> None:
        if up:
            self._stats_sent.clear()  # the next push tells everyone everything
            return
        # origin side: that node's queues are unavailable; what waited for its confirms is nacked
        nacks = [pid for pid, home in self.confirm_pending.items() if home == peer]
        if nacks:
            self._on_confirms([], nacks)
        for vhost in self.node.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, RemoteQueue) and q.home == peer:
                    q.home_down()
        # home side: that node's consumers are gone and what they held goes back to the queues
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

