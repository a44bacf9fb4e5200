"""The node: composition root of a running broker.

Owns: the configuration, the auth store, the virtual hosts, the set of live connections, the Direct
Reply-To registry, the AMQP listener, signal handling, and topology operations that must touch more
than one vhost object at once (deleting a queue cancels its consumers on their channels; deleting a
vhost closes its connections). Other services (management HTTP) are started by `run_node` as plug-ins
so that this layer does not import them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError, ConnectionError_
from hutch.config import Config
from hutch.core.arguments import validate_queue_arguments
from hutch.core.auth import AuthStore
from hutch.core.limits import LimitStore
from hutch.core.message import Message
from hutch.core.policy import PolicyStore
from hutch.core.queue_type import Queue
from hutch.core.routing import Exchange
from hutch.core.vhost import VirtualHost, rs
from hutch.queues.classic.queue import (
    PRESSURE_RAM_BYTES_LIMIT,
    PRESSURE_RAM_LIMIT,
    RAM_BYTES_LIMIT,
    ClassicQueue,
)
from hutch.runtime.broker import limits, policies
from hutch.runtime.broker.alarms import ResourceMonitor
from hutch.runtime.broker.definitions import DefinitionStore, pack_arguments, unpack_arguments
from hutch.runtime.queue_types.classic import features as queue_features
from hutch.runtime.queue_types.classic.persistence import Persistence
from hutch.runtime.session.connection import CAPABILITIES, AMQPConnection
from hutch.storage.errors import StorageError

if TYPE_CHECKING:
    from hutch.runtime.clustering.service import ClusterService
    from hutch.runtime.session.channel import ServerChannel

log = logging.getLogger("hutch.node")

# A service is started with the node and returns a coroutine function that stops it.
Service = Callable[["Node"], Awaitable[Callable[[], Awaitable[None]]]]

SUPPORTED_QUEUE_TYPES = ("classic",)


class Node:
    def __init__(self, config: Config, auth: AuthStore | None = None,
                 store: DefinitionStore | None = None, monitor_resources: bool = True,
                 persistence: Persistence | None = None, recover: bool = True) -> None:
        self.config = config
        self.name = config.node_name
        self.store = store
        self.persistence = persistence
        # channels with publisher confirms (or a tx.commit) waiting for message storage to sync
        self.sync_waiters: set[ServerChannel] = set()
        self._replaying = False
        self._transient_ids = 0
        saved_ops = store.load() if store is not None else []
        if auth is None:
            auth = AuthStore()
            if not saved_ops and not config.load_definitions:  # RabbitMQ seeds no default user then
                auth.bootstrap(config.default_user, config.default_pass, config.default_vhost)
        self.auth = auth
        self.vhosts: dict[str, VirtualHost] = {v.name: VirtualHost(v.name) for v in auth.list_vhosts()}
        self.policies = PolicyStore()  # policies and operator policies (runtime/broker/policies.py)
        self.limits = LimitStore()  # vhost and user limits (runtime/broker/limits.py)
        # topic permissions (mgmt/users.py): (vhost, user) -> {exchange: (write regex, read regex)}; the
        # channel checks write on publishes to topic exchanges; saved and replicated like permissions
        self.topic_permissions: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self.cluster_name_set = False  # set through the API (saved), not only from the config
        self.connections: set[AMQPConnection] = set()
        self.reply_channels: dict[str, ServerChannel] = {}
        self.alarms: set[str] = set()
        self.memory_pressure = False  # over the paging threshold: queues keep a small working set in RAM
        # churn counters (Prometheus rabbitmq_*_opened/closed/declared/created/deleted_total); never decrease
        self.churn = dict.fromkeys(("connections_opened", "connections_closed", "channels_opened",
                                    "channels_closed", "queues_declared", "queues_created", "queues_deleted"), 0)
        ClassicQueue.ram_limit = config.classic_queue_ram_limit  # class-wide, like the pressure limits
        ClassicQueue.clock = staticmethod(queue_features.wall_ms)
        self.queue_timers = queue_features.QueueTimers(self)
        self.perm_epoch = 0
        self.started_at = time.time()
        self.server: asyncio.base_events.Server | None = None
        self.amqp_port = 0
        self.management_port = 0
        self._tick_handle: asyncio.TimerHandle | None = None
        self.monitor_resources = monitor_resources
        self.monitor: ResourceMonitor | None = None
        # clustering (runtime/clustering/service.py): set by `serve` for a clustered node before it starts
        self.cluster: ClusterService | None = None
        self.cluster_peer_hooks: list[Callable[[str, bool], None]] = []  # (peer, up) from the transport
        self.sync_hooks: list[Callable[[int], None]] = []  # after each group commit: the synced count
        self.stale_transient: list[tuple[str, str]] = []  # (vhost, queue) this node's, gone with a restart
        if store is not None:
            self._restore(saved_ops)
        if persistence is not None and recover:
            self._recover_messages(persistence)
        # stat_* counters of channels that have closed, so node-wide totals (the management overview)
        # do not drop when a channel goes. Invariant: only ever grows.
        self.closed_channel_stats: dict[str, int] = {}

    @staticmethod
    def wall_ms() -> float:
        return time.time() * 1000

    def server_properties(self) -> dict[str, Any]:
        return {
            "capabilities": dict(CAPABILITIES),
            "cluster_name": self.config.cluster_name,
            "copyright": "Copyright (c) the hutch authors",
            "information": "Licensed under the Apache License 2.0. Website: https://github.com/hutch-broker",
            "platform": f"Python {platform.python_version()}",
            "product": "hutch",
            "version": __version__,
        }

    # -- durable definitions ---------------------------------------------------------------------
    def _record(self, op: dict[str, Any]) -> None:
        if self._replaying:
            return
        if self.cluster is not None:  # the metadata Raft group is the durable record of a clustered node
            self.cluster.replicate(op)
        elif self.store is not None:
            self.store.append(op)

    # -- the metadata machine's target (cluster/metadata.py) --------------------------------------------
    def apply_op(self, op: dict[str, Any]) -> None:
        """Apply a definition change another node made (or this node made before a restart)."""
        self._replaying = True
        try:
            self._apply(op)
        finally:
            self._replaying = False

    def state_ops(self) -> list[dict[str, Any]]:
        return list(self._state_ops())

    def reset_to(self, ops: list[dict[str, Any]]) -> None:
        """Make the durable definitions exactly `ops` (a metadata snapshot): drop what they do not
        name, then apply them (an identical declaration is a no-op)."""
        wanted = {(op["op"], op.get("vhost"), op.get("name")) for op in ops}
        keep_bindings = {self._binding_key(op) for op in ops if op["op"] == "bind"}
        self._replaying = True
        try:
            for vhost in list(self.vhosts.values()):
                for x in list(vhost.exchanges.values()):
                    if not (x.durable or self.cluster is not None):
                        continue
                    for b in list(x.router.bindings()):
                        op = self._binding_op("bind", vhost, x, b.destination, b.routing_key, b.arguments)
                        if (self.cluster is not None or self._durable_destination(vhost, b.destination)) and \
                                self._binding_key(op) not in keep_bindings:
                            self.unbind(vhost, x, b.destination, b.routing_key, b.arguments)
                for q in list(vhost.queues.values()):
                    if (_is_durable_queue(q) or self.cluster is not None) and \
                            ("queue.declare", vhost.name, q.name) not in wanted:
                        self.delete_queue(vhost, q)
                for name, x in list(vhost.exchanges.items()):
                    if (x.durable or self.cluster is not None) and name and not name.startswith("amq.") and \
                            ("exchange.declare", vhost.name, name) not in wanted:
                        self.delete_exchange(vhost, name, False)
            for operator, p in list(self.policies):
                policies.clear_policy(self, p.vhost, p.name, operator)
            self.limits = LimitStore()  # the snapshot's operations set them again
        finally:
            self._replaying = False
        for op in ops:
            try:
                self.apply_op(op)
            except (ChannelError, KeyError, ValueError) as exc:
                log.warning("metadata snapshot: cannot apply %s: %s", op.get("op"), exc)

    @staticmethod
    def _binding_key(op: dict[str, Any]) -> tuple[Any, ...]:
        return (op["vhost"], op["source"], op["dest_kind"], op["dest"], op["routing_key"],
                repr(op["arguments"]))

    def members_changed(self) -> None:
        if self.cluster is not None:
            self.cluster.members_changed()

    def _restore(self, ops: list[dict[str, Any]]) -> None:
        """Replay saved definitions through the same methods that made them, then compact."""
        assert self.store is not None
        self._replaying = True
        try:
            for op in ops:
                try:
                    self._apply(op)
                except (ChannelError, KeyError, ValueError) as exc:
                    log.warning("skipping saved definition %s: %s", op.get("op"), exc)
        finally:
            self._replaying = False
        self.store.compact(self._state_ops())
        log.info("definitions restored: %d vhosts, %d queues, %d exchanges", len(self.vhosts),
                 sum(len(v.queues) for v in self.vhosts.values()),
                 sum(len(v.exchanges) for v in self.vhosts.values()))

    def _apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "auth":
            self.auth = AuthStore.from_dict(op["auth"])
            names = {v.name for v in self.auth.list_vhosts()}
            for name in list(self.vhosts):
                if name not in names:
                    del self.vhosts[name]
            for name in names:
                self.vhosts.setdefault(name, VirtualHost(name))
            self.perm_epoch += 1
            limits.prune(self)
            return
        if kind == "cluster_name":
            self.set_cluster_name(op["name"])
            return
        if kind == "topic_permissions":
            self.topic_permissions = {}
            for v, u, x, w, r in op["table"]:
                self.topic_permissions.setdefault((v, u), {})[x] = (w, r)
            self.perm_epoch += 1
            return
        if kind in limits.OP_KINDS:
            limits.apply_op(self, op)
            return
        vhost = self.vhosts[op["vhost"]]
        if kind == "exchange.declare":
            self.declare_exchange(vhost, op["name"], op["type"], op.get("durable", True), op["auto_delete"],
                                  op["internal"], unpack_arguments(op["arguments"]))
        elif kind == "exchange.delete":
            self.delete_exchange(vhost, op["name"], False)
        elif kind == "queue.declare":
            home = op.get("node", self.name)
            durable = op.get("durable", True)
            if op.get("type") == "quorum" and self.cluster is not None:
                self._apply_quorum_queue(vhost, op)
            elif home != self.name and self.cluster is not None:
                self._declare_remote_queue(vhost, home, op)
            elif not durable:  # this node's transient queue: it did not survive the restart
                self.stale_transient.append((vhost.name, op["name"]))
            else:
                self.declare_queue(vhost, op["name"], True, False, op["auto_delete"],
                                   unpack_arguments(op["arguments"]), None)
        elif kind == "queue.delete":
            q = vhost.queues.get(op["name"])
            if q is not None:
                self.delete_queue(vhost, q)
        elif kind == "queue.members":
            q = vhost.queues.get(op["name"])
            if q is not None and q.queue_type == "quorum" and self.cluster is not None:
                self.cluster.quorum.members_changed(q, list(op["members"]))  # type: ignore[arg-type]
        elif kind in policies.OP_KINDS:
            policies.apply_op(self, op)
        elif kind in ("bind", "unbind"):
            source = vhost.lookup_exchange(op["source"])
            method = self.bind if kind == "bind" else self.unbind
            method(vhost, source, (op["dest_kind"], op["dest"]), op["routing_key"],
                   unpack_arguments(op["arguments"]))
        else:
            raise ValueError(f"unknown operation {kind!r}")

    def _state_ops(self) -> Iterator[dict[str, Any]]:
        """The durable state as operations that rebuild it: auth, then exchanges, queues, bindings.
        A clustered node's metadata holds transient objects too (other nodes route to them)."""
        everything = self.cluster is not None
        yield {"op": "auth", "auth": self.auth.to_dict()}
        if self.topic_permissions:
            yield self._topic_permissions_op()
        if self.cluster_name_set:
            yield {"op": "cluster_name", "name": self.config.cluster_name}
        yield from policies.state_ops(self)
        yield from limits.state_ops(self)
        for vhost in self.vhosts.values():
            for x in vhost.exchanges.values():
                if (x.durable or everything) and x.name and not x.name.startswith("amq."):
                    yield self._exchange_op(vhost, x)
            for q in vhost.queues.values():
                if _is_durable_queue(q) or everything:
                    yield self._queue_op(vhost, q)
            for x in vhost.exchanges.values():
                if not (x.durable or everything):
                    continue
                for b in x.router.bindings():
                    if everything or self._durable_destination(vhost, b.destination):
                        yield self._binding_op("bind", vhost, x, b.destination, b.routing_key, b.arguments)

    def _queue_op(self, vhost: VirtualHost, q: Queue) -> dict[str, Any]:
        op = {"op": "queue.declare", "vhost": vhost.name, "name": q.name, "auto_delete": q.auto_delete,
              "arguments": pack_arguments(q.arguments), "node": getattr(q, "home", self.name),
              "durable": q.durable, "exclusive": q.exclusive}
        if q.queue_type == "quorum":
            op.update(type="quorum", gid=q.gid, members=list(q.members))  # type: ignore[attr-defined]
        return op

    def set_queue_members(self, vhost: VirtualHost, q: Queue, members: list[str]) -> None:
        """A quorum queue's member list changed (hutch-queues add_member/delete_member): applied here and
        recorded, so every node applies it (members open or delete their replica)."""
        assert self.cluster is not None
        self.cluster.quorum.members_changed(q, members)  # type: ignore[arg-type]
        self._record({"op": "queue.members", "vhost": vhost.name, "name": q.name, "members": list(members)})

    def _apply_quorum_queue(self, vhost: VirtualHost, op: dict[str, Any]) -> None:
        from hutch.runtime.queue_types.quorum.queue import QuorumQueue
        assert self.cluster is not None
        existing = vhost.queues.get(op["name"])
        if existing is not None:
            if getattr(existing, "gid", None) == op["gid"]:
                return
            self.delete_queue(vhost, existing)
        q = QuorumQueue(self.cluster.quorum, vhost.name, op["name"], unpack_arguments(op["arguments"]),
                        int(op["gid"]), list(op["members"]))
        vhost.add_queue(q)
        policies.apply_to_queue(self, q)
        # a one-member queue of this node (every quorum queue of a cluster of one) has no one to wait
        # for: it elects itself now rather than after an election timeout (after a restart, too)
        self.cluster.quorum.attach(q, campaign=list(op["members"]) == [self.name])

    def _declare_remote_queue(self, vhost: VirtualHost, home: str, op: dict[str, Any]) -> None:
        from hutch.runtime.queue_types.remote import RemoteQueue
        assert self.cluster is not None
        existing = vhost.queues.get(op["name"])
        if existing is not None:
            if getattr(existing, "home", None) == home:
                return
            log.warning("queue '%s' in vhost '%s' was declared on %s and here at once; %s's wins",
                        op["name"], vhost.name, home, home)
            self.delete_queue(vhost, existing)
        q = RemoteQueue(self.cluster.link, home, vhost.name, op["name"], op.get("durable", True),
                        op.get("exclusive", False), op["auto_delete"], unpack_arguments(op["arguments"]))
        vhost.add_queue(q)
        policies.apply_to_queue(self, q)

    @staticmethod
    def _exchange_op(vhost: VirtualHost, x: Exchange) -> dict[str, Any]:
        return {"op": "exchange.declare", "vhost": vhost.name, "name": x.name, "type": x.type,
                "auto_delete": x.auto_delete, "internal": x.internal,
                "arguments": pack_arguments(x.arguments), "durable": x.durable}

    @staticmethod
    def _binding_op(kind: str, vhost: VirtualHost, source: Exchange, destination: tuple[str, str],
                    routing_key: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"op": kind, "vhost": vhost.name, "source": source.name, "dest_kind": destination[0],
                "dest": destination[1], "routing_key": routing_key, "arguments": pack_arguments(arguments)}

    @staticmethod
    def _durable_destination(vhost: VirtualHost, destination: tuple[str, str]) -> bool:
        kind, name = destination
        if kind == "queue":
            q = vhost.queues.get(name)
            return q is not None and _is_durable_queue(q)
        x = vhost.exchanges.get(name)
        return x is not None and x.durable

    # -- persistent messages -----------------------------------------------------------------------
    def _recover_messages(self, persistence: Persistence) -> None:
        """Recover the index of every durable queue and the reference counts of the message stores;
        delete what belongs to queues that no longer exist."""
        keep: set[str] = set()
        refs_by_vhost: dict[str, dict[int, int]] = {}
        recovered: list[tuple[ClassicQueue, Any]] = []
        for vhost in self.vhosts.values():
            for q in vhost.queues.values():
                if not (isinstance(q, ClassicQueue) and _is_durable_queue(q)):
                    continue
                index = persistence.index(vhost.name, q.name)
                found = index.recover()
                for path in found.torn_tails:
                    log.warning("queue index %s: dropped an incomplete write at its end", path)
                store = persistence.store(vhost.name)
                missing = [seq for seq, store_id in found.refs.items() if not store.contains(store_id)]
                if missing:
                    log.warning("queue '%s' in vhost '%s': %d messages were never fully written (not "
                                "confirmed); dropped", q.name, vhost.name, len(missing))
                    for seq in missing:
                        del found.refs[seq]
                        index.refs.pop(seq, None)  # nothing to release in the store
                    index.ack(missing)
                    found.live -= len(missing)
                refs = refs_by_vhost.setdefault(vhost.name, {})
                for store_id in found.refs.values():
                    refs[store_id] = refs.get(store_id, 0) + 1
                keep.add(os.path.basename(index.directory))
                self._attach_storage(vhost, q, index)
                recovered.append((q, found))
        removed = persistence.remove_orphans(keep)
        persistence.set_store_refs(refs_by_vhost)
        total = 0
        for q, found in recovered:
            q.recover_index(found)
            total += found.live
        persistence.sink.sync_now()
        log.info("messages recovered: %d in %d durable queues (%d stale queue directories removed)",
                 total, len(recovered), removed)

    def _attach_storage(self, vhost: VirtualHost, q: ClassicQueue, index: Any = None) -> None:
        """Give a classic queue its index: durable queues always, others only when they page."""
        persistence = self.persistence
        if persistence is None:
            return
        if _is_durable_queue(q):
            q.index = index if index is not None else persistence.index(vhost.name, q.name)
            q.persist = True
        else:
            self._transient_ids += 1
            unique = f"transient-{self._transient_ids}"
            q.index_factory = lambda: persistence.index(vhost.name, q.name, unique)

    def set_memory_pressure(self, on: bool) -> None:
        """Over (or back under) the paging threshold: shrink (or restore) what queues keep in RAM, and
        page out what they hold beyond it now. Called on every memory check while paging."""
        self.memory_pressure = on
        ClassicQueue.ram_limit = PRESSURE_RAM_LIMIT if on else self.config.classic_queue_ram_limit
        ClassicQueue.ram_bytes_limit = PRESSURE_RAM_BYTES_LIMIT if on else RAM_BYTES_LIMIT
        if not on:
            return
        paged = 0
        for vhost in self.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, ClassicQueue):
                    paged += q.page_out(PRESSURE_RAM_LIMIT)
        if paged:
            log.info("memory pressure: %d messages paged out to disk", paged)

    def _storage_drained(self) -> None:
        """The group commit caught up: publishers paused because the disk was behind may read again."""
        for vhost in self.vhosts.values():
            for q in vhost.queues.values():
                if q.flow_waiters:
                    q.release_flow()

    def _storage_synced(self, synced: int) -> None:
        for ch in self.sync_waiters:
            ch.conn.want_flush(ch)
        for hook in self.sync_hooks:
            hook(synced)

    # -- access control changes ------------------------------------------------------------------
    def permissions_changed(self) -> None:
        """Users, vhosts or permissions changed: drop cached permission checks and save them."""
        self.perm_epoch += 1
        limits.prune(self)
        self._record({"op": "auth", "auth": self.auth.to_dict()})

    def set_cluster_name(self, name: str) -> None:
        """PUT /api/cluster-name: the running node's name for its cluster, saved (and replicated)."""
        self.config = dataclasses.replace(self.config, cluster_name=name)
        self.cluster_name_set = True
        self._record({"op": "cluster_name", "name": name})

    def topic_permissions_changed(self) -> None:
        """Topic permissions changed (mgmt/users.py): drop cached checks and save them."""
        self.perm_epoch += 1
        self._record(self._topic_permissions_op())

    def _topic_permissions_op(self) -> dict[str, Any]:
        return {"op": "topic_permissions",
                "table": [[v, u, x, w, r] for (v, u), by_x in sorted(self.topic_permissions.items())
                          for x, (w, r) in sorted(by_x.items())]}

    def add_vhost(self, name: str, description: str = "", tags: Sequence[str] = ()) -> None:
        self.auth.add_vhost(name, description=description, tags=list(tags))
        self.vhosts[name] = VirtualHost(name)
        self.permissions_changed()

    def delete_vhost(self, name: str) -> None:
        policies.forget_vhost(self, name)
        self.auth.delete_vhost(name)
        vhost = self.vhosts.pop(name, None)
        for conn in list(self.connections):
            if conn.vhost_obj is vhost:
                conn.close_forced("vhost deleted")
        if vhost is not None:
            for q in list(vhost.queues.values()):
                self.delete_queue(vhost, q)
        self.permissions_changed()

    def channel_closed(self, ch: ServerChannel) -> None:
        """Fold a closing channel's stat_* counters into `closed_channel_stats` (called once)."""
        self.churn["channels_closed"] += 1
        stats = self.closed_channel_stats
        for key, value in vars(ch).items():
            if key.startswith("stat_") and isinstance(value, int):
                stats[key] = stats.get(key, 0) + value

    # -- resource alarms ---------------------------------------------------------------------------
    def set_alarm(self, name: str) -> None:
        """Raise an alarm: publishing connections are blocked (consumers keep going)."""
        first = not self.alarms
        self.alarms.add(name)
        if first:
            for conn in list(self.connections):
                conn.alarm_raised()

    def clear_alarm(self, name: str) -> None:
        """Clear an alarm; connections are unblocked only when no alarm remains."""
        self.alarms.discard(name)
        if not self.alarms:
            for conn in list(self.connections):
                conn.alarm_cleared()

    def check_connection_limits(self, vhost: str, user: str) -> None:
        """connection.open: ConnectionError_ 530 past the vhost's or the user's max-connections."""
        limits.check_connection(self, vhost, user)

    def check_channel_limit(self, conn: AMQPConnection) -> None:
        """channel.open: ConnectionError_ 530 past the user's max-channels."""
        limits.check_channel(self, conn)

    def close_user_connections(self, user: str, reason: str) -> None:
        for conn in list(self.connections):
            if conn.user_name == user:
                conn.close_forced(reason)

    # -- topology ----------------------------------------------------------------------------------
    def declare_exchange(self, vhost: VirtualHost, name: str, type_: str, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict[str, Any]) -> Exchange:
        x, created = vhost.declare_exchange(name, type_, durable, auto_delete, internal, arguments)
        if created:
            policies.apply_to_exchange(self, x)
        if created and (durable or self.cluster is not None):
            self._record(self._exchange_op(vhost, x))
        return x

    def delete_exchange(self, vhost: VirtualHost, name: str, if_unused: bool) -> bool:
        x = vhost.exchanges.get(name)
        deleted = vhost.delete_exchange(name, if_unused)
        if deleted and x is not None and (x.durable or self.cluster is not None):
            self._record({"op": "exchange.delete", "vhost": vhost.name, "name": name})
        return deleted

    def bind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
             arguments: dict[str, Any]) -> bool:
        added = vhost.bind(source, destination, routing_key, arguments)
        if added and (self.cluster is not None or source.durable and self._durable_destination(vhost, destination)):
            self._record(self._binding_op("bind", vhost, source, destination, routing_key, arguments))
        return added

    def unbind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
               arguments: dict[str, Any]) -> bool:
        removed = vhost.unbind(source, destination, routing_key, arguments)
        if removed and (self.cluster is not None or source.durable and self._durable_destination(vhost, destination)):
            self._record(self._binding_op("unbind", vhost, source, destination, routing_key, arguments))
        return removed

    def declare_queue(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                      arguments: dict[str, Any], owner: object) -> Queue:
        self.churn["queues_declared"] += 1
        existing = vhost.queues.get(name)
        if existing is not None:
            vhost.check_queue_equivalence(existing, durable, exclusive, auto_delete, arguments, owner)
            if isinstance(existing, ClassicQueue):
                existing.touch(queue_features.wall_ms())  # a redeclare is a use (x-expires)
            return existing
        if not self._replaying:  # a queue that exists stays when a limit is lowered
            limits.check_queue(self, vhost.name, name, len(vhost.queues))
        qtype = arguments.get("x-queue-type", "classic")
        if qtype == "quorum":
            return self._declare_quorum(vhost, name, durable, exclusive, auto_delete, arguments)
        if qtype not in SUPPORTED_QUEUE_TYPES:
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for {rs('queue', name, vhost.name)}: "
                               f"'{qtype}' is not supported by this node (supported: "
                               f"{', '.join(SUPPORTED_QUEUE_TYPES)})")
        if not self._replaying:  # as RabbitMQ, recovery does not re-validate what was once accepted
            validate_queue_arguments(name, vhost.name, qtype, arguments)
        q = ClassicQueue(vhost.name, name, durable, owner if exclusive else None, auto_delete, dict(arguments))
        vhost.add_queue(q)
        self.churn["queues_created"] += 1
        policies.apply_to_queue(self, q)
        if not self._replaying:
            self._attach_storage(vhost, q)
        queue_features.attach(self, q)
        if q.settings.consumer_timeout is not None:
            self._ensure_tick()
        if _is_durable_queue(q) or self.cluster is not None:
            self._record(self._queue_op(vhost, q))
        return q

    def _declare_quorum(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool,
                        auto_delete: bool, arguments: dict[str, Any]) -> Queue:
        """A new quorum queue (runtime/queue_types/quorum/queue.py): checked as RabbitMQ does, members chosen, its
        Raft group opened here; the other members open theirs when they apply the metadata record."""
        what = rs("queue", name, vhost.name)
        for bad, prop in ((not durable, "non-durable"), (exclusive, "exclusive-owner"),
                          (auto_delete, "auto-delete"), (name.startswith("amq.gen-"), "server-named")):
            if bad:
                raise ChannelError(PRECONDITION_FAILED, f"invalid property '{prop}' for {what}", 50, 10)
        if self.cluster is None:
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for {what}: quorum queues need a clustered node "
                               "(this node was started with --no-cluster; see docs/clustering.md)", 50, 10)
        validate_queue_arguments(name, vhost.name, "quorum", arguments)
        if arguments.get("x-overflow") == "reject-publish-dlx":
            raise ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-overflow' for {what}: "
                               "'reject-publish-dlx' is not supported by quorum queues", 50, 10)
        size = int(arguments.get("x-quorum-initial-group-size") or self.config.quorum_cluster_size)
        from hutch.runtime.queue_types.quorum.queue import QuorumQueue, leader_locator
        from hutch.runtime.queue_types.quorum.service import QuorumService
        svc = self.cluster.quorum
        q = QuorumQueue(svc, vhost.name, name, dict(arguments), QuorumService.new_gid(), [self.name])
        vhost.add_queue(q)
        self.churn["queues_created"] += 1
        policies.apply_to_queue(self, q)
        locator = leader_locator(q.settings.effective_policy_definition, arguments, self.config.queue_leader_locator)
        q.members = self.cluster.choose_members(size, svc.choose_leader(locator) if size > 1 else self.name)
        svc.attach(q, campaign=False)
        self.cluster.post_commit.append(lambda: svc.elect(q))
        self._record(self._queue_op(vhost, q))
        return q

    def delete_queue(self, vhost: VirtualHost, q: Queue) -> int:
        if vhost.queues.get(q.name) is q:
            self.churn["queues_deleted"] += 1
        if isinstance(q, ClassicQueue):
            self.queue_timers.cancel(q)
        consumers = q.consumers()
        durable = (_is_durable_queue(q) or self.cluster is not None) and vhost.queues.get(q.name) is q
        count = vhost.delete_queue(q)
        if durable:
            self._record({"op": "queue.delete", "vhost": vhost.name, "name": q.name})
        for consumer in consumers:
            consumer.channel.consumer_cancelled_by_broker(consumer)
        return count

    def release_exclusive(self, conn: AMQPConnection) -> None:
        """Delete the exclusive queues a closing connection owns."""
        vhost = conn.vhost_obj
        if vhost is None:
            return
        for q in [q for q in vhost.queues.values() if q.exclusive_owner is conn]:
            self.delete_queue(vhost, q)

    def deliver_direct_reply(self, token: str, msg: Message) -> bool:
        ch = self.reply_channels.get(token)
        return ch is not None and ch.deliver_direct_reply(msg)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        host = cfg.amqp_host or None
        self.server = await loop.create_server(lambda: AMQPConnection(self), host=host, port=cfg.amqp_port,
                                               backlog=1024, reuse_address=True)
        sock = self.server.sockets[0]
        self.amqp_port = sock.getsockname()[1]
        log.info("AMQP listener started on %s:%d", host or "0.0.0.0", self.amqp_port)
        self._schedule_tick()
        for vhost in self.vhosts.values():  # deadlines of recovered queues (TTLs, x-expires)
            for q in vhost.queues.values():
                if isinstance(q, ClassicQueue) and (deadline := q.next_deadline()):
                    self.queue_timers.request(q, deadline)
        if self.persistence is not None:
            self.persistence.sink.on_drained = self._storage_drained
            self.persistence.start(loop, self._storage_synced)
        if self.monitor_resources:
            self.monitor = ResourceMonitor(self)
            self.monitor.start()

    def _tick_interval_s(self) -> float:
        timeout_ms = self.config.consumer_timeout_ms
        for vhost in self.vhosts.values():  # queues with their own x-consumer-timeout
            for q in vhost.queues.values():
                own = q.settings.consumer_timeout
                if own is not None and own < timeout_ms:
                    timeout_ms = own
        return min(max(timeout_ms / 10_000, 0.1), 30.0)

    def _ensure_tick(self) -> None:
        """A queue with a short x-consumer-timeout appeared: tick at least as often as it needs."""
        handle = self._tick_handle
        if handle is None:
            return
        loop = asyncio.get_running_loop()
        if handle.when() > loop.time() + self._tick_interval_s():
            handle.cancel()
            self._schedule_tick()

    def _schedule_tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._tick_handle = loop.call_later(self._tick_interval_s(), self._tick)

    def _tick(self) -> None:
        """Coarse periodic housekeeping: consumer timeouts."""
        now = asyncio.get_running_loop().time()
        timeout_ms = self.config.consumer_timeout_ms
        for conn in list(self.connections):
            conn.check_consumer_timeouts(now, timeout_ms)
        self._schedule_tick()

    async def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self.queue_timers.cancel_all()
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.close_forced("shutdown")
        await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn._abort()
        if self.persistence is not None:
            for vhost in self.vhosts.values():
                for q in vhost.queues.values():
                    if isinstance(q, ClassicQueue):
                        q.close_storage()
            await self.persistence.close()


def _has_cluster_identity(config: Config) -> bool:
    """Has this data directory been part of a cluster (runtime/clustering/service.py's identity file)?"""
    return bool(config.data_dir) and os.path.exists(os.path.join(config.data_dir, "cluster", "node.json"))


def _is_durable_queue(q: Queue) -> bool:
    return q.durable and q.exclusive_owner is None


async def serve(config: Config, services: Sequence[Service] = (),
                prepare: Callable[[Node], str | None] | None = None) -> int:
    """Run a node. `prepare` runs after recovery and before the listeners accept clients (the CLI
    passes the management layer's definitions import for `load_definitions`); a returned text is a
    one-line start-up error."""
    clustered = config.cluster_enabled  # a cluster of one unless turned off (docs/clustering.md)
    try:
        # A clustered node's definitions come from the metadata Raft group; the local definitions
        # store only seeds the cluster a node founds (its first start as a clustered node).
        use_store = bool(config.data_dir) and not (clustered and (_has_cluster_identity(config)
                                                                  or config.cluster_join))
        store = DefinitionStore(config.data_dir) if use_store else None
        persistence = Persistence(config.data_dir, embed_below=config.queue_index_embed_msgs_below,
                                  segment_entries=config.queue_index_segment_entries,
                                  store_file_size_limit=config.msg_store_file_size_limit) \
            if config.data_dir else None
        node = Node(config, store=store, persistence=persistence, recover=not clustered)
        cluster = None
        if clustered:
            from hutch.runtime.clustering.service import ClusterService, load_secret
            cluster = ClusterService(node, load_secret(config))
    except (StorageError, ValueError, OSError) as exc:
        print(f"hutch-server: cannot load definitions or messages from {config.data_dir}: {exc}",
              file=sys.stderr)
        return 1
    if cluster is not None:
        node.cluster = cluster
        try:
            await cluster.start()
        except OSError as exc:
            msg = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            print(f"hutch-server: cannot listen for inter-node traffic on port {config.cluster_port}: {msg} "
                  "(another node on this machine? give each its own --cluster-port, or start with --no-cluster)",
                  file=sys.stderr)
            await cluster.stop()
            return 1
        except ValueError as exc:
            print(f"hutch-server: {exc}", file=sys.stderr)
            await cluster.stop()
            return 1
        if persistence is not None:
            node._recover_messages(persistence)
    if prepare is not None:
        problem = prepare(node)
        if problem:
            print(f"hutch-server: {problem}", file=sys.stderr)
            return 1
    try:
        await node.start()
    except OSError as exc:
        msg = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        print(f"hutch-server: cannot listen for AMQP on port {config.amqp_port}: {msg}", file=sys.stderr)
        return 1
    stoppers: list[Callable[[], Awaitable[None]]] = []
    try:
        for service in services:
            stoppers.append(await service(node))
    except OSError as exc:
        msg = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        what = getattr(exc, "hutch_listener", None)
        print(f"hutch-server: cannot listen for {what}: {msg}" if what else f"hutch-server: cannot start: {msg}",
              file=sys.stderr)
        await node.stop()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("node %s started (hutch %s)", node.name, __version__)
    await stop.wait()
    log.info("node %s stopping", node.name)
    for stopper in reversed(stoppers):
        await stopper()
    await node.stop()
    if cluster is not None:
        await cluster.stop()
    log.info("node %s stopped", node.name)
    return 0


GC_THRESHOLDS = (100_000, 20, 10)


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a broker's allocation pattern.

    Each message allocates a few small objects that live for milliseconds (until acked) and form no
    cycles. With CPython's default gen-0 threshold (700) those objects are scanned and promoted many
    times while in flight; with 100,000 most of them are freed by reference counting before any
    collection sees them. Measured: +10% end-to-end throughput (docs/BENCHMARKS.md), the same as with
    the collector disabled. Objects alive at start-up are frozen out of future collections.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_node(config: Config, services: Sequence[Service] = (),
             prepare: Callable[[Node], str | None] | None = None) -> int:
    """Run a node until SIGTERM/SIGINT; returns the process exit code."""
    tune_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the node usable without it
        return asyncio.run(serve(config, services, prepare))
    return uvloop.run(serve(config, services, prepare))


__all__ = ["Node", "run_node", "serve", "ConnectionError_"]
