"""The node: the broker's state on one process, independent of sockets and queue types.

Owns: the configuration, the auth store, the virtual hosts with their topology (exchanges, queues,
bindings), policies and topic permissions, the set of live connections (as `ConnectionPort`s), the
Direct Reply-To registry, alarms and memory pressure, churn counters, the definitions log (recording
each definition change, or replicating it through the cluster's `MetadataPort`), consumer-timeout ticks,
and topology operations that must touch more than one object at once (deleting a queue cancels its
consumers on their channels; deleting a vhost closes its connections).

Rules (checked by tests/unit/test_layers.py):
- No sockets, no listeners, no queue-type names: queue types are `QueueTypePort`s registered by the
  composition root (`runtime/app.py`), which also starts the listeners. A declare goes to the type named
  by `x-queue-type` (default `classic`); a `queue.declare`/`queue.members` record goes to the first
  registered type that takes it.
- The node never imports `session/`, `queue_types/` or `clustering/`.
- Time comes from the injected clock (`runtime/clock.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.config import Config
from hutch.core import definition_ops as ops_
from hutch.core import direct_reply
from hutch.core.arguments import equivalence_arguments, with_default_queue_type
from hutch.core.auth import AuthStore, auth_diff, auth_patch
from hutch.core.credit_flow import LoopLoad
from hutch.core.definition_ops import DefinitionOp
from hutch.core.limits import LimitStore, PeerCounts
from hutch.core.patterns import PatternError, compile_stored
from hutch.core.policy import PolicyStore
from hutch.core.queue_type import Queue
from hutch.core.routing import DELAYED_MESSAGE, Exchange
from hutch.core.vhost import VirtualHost, rs
from hutch.runtime.broker import limits, parameters, policies
from hutch.runtime.broker.alarms import ResourceMonitor, memory_limit_bytes
from hutch.runtime.broker.definitions import DefinitionStore, pack_arguments, unpack_arguments
from hutch.runtime.broker.logins import LoginGate
from hutch.runtime.clock import SYSTEM_CLOCK
from hutch.runtime.ports import (
    ChannelPort,
    Clock,
    ConnectionPort,
    DelayedPort,
    ManagementAgentPort,
    MetadataPort,
    QueueTypePort,
    SessionConnection,
)
from hutch.runtime.tls import NodeTls
from hutch.runtime.workers.spec import public_name

if TYPE_CHECKING:
    from hutch.core.message import Message

log = logging.getLogger("hutch.node")

# the queue types a vhost's default_queue_type may name (mgmt/users.py)
SUPPORTED_QUEUE_TYPES = ("classic",)


class Node:
    def __init__(self, config: Config, auth: AuthStore | None = None,
                 store: DefinitionStore | None = None, monitor_resources: bool = True,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.name = config.node_name  # the cluster member's name (a worker's is `<node>#w<N>`)
        self.clock = clock
        self.store = store
        self.persistence: Any = None  # the classic queue type's message store (set by runtime/app.py)
        self.delayed: DelayedPort | None = None  # what x-delayed-message exchanges hold (set by runtime/app.py)
        self.replaying = False  # applying saved or replicated definitions: nothing is recorded again
        # task -> the group its definition changes are recorded in (`grouped`; definitions.py, "Groups")
        self._groups: dict[asyncio.Task[Any] | None, int] = {}
        self._held: dict[int, list[DefinitionOp]] = {}  # a clustered node's changes of a group, until its end
        self._apply = ops_.Dispatch({  # the one dispatch table of the definition operations
            ops_.SetAuth: self._apply_auth, ops_.PatchAuth: self._apply_auth_patch, ops_.RehashUser: self._apply_rehash, ops_.SetClusterName: lambda op: self.set_cluster_name(op.name),
            ops_.SetTopicPermissions: self._apply_topic_permissions,
            ops_.PatchTopicPermissions: self._apply_topic_patch,
            ops_.DeclareExchange: self._apply_declare_exchange, ops_.DeleteExchange: self._apply_delete_exchange,
            ops_.DeclareQueue: self._apply_queue_record, ops_.DeleteQueue: self._apply_delete_queue,
            ops_.SetQueueMembers: self._apply_queue_record, ops_.Bind: self._apply_binding,
            ops_.Unbind: self._apply_binding, ops_.SetPolicy: self._apply_policy, ops_.ClearPolicy: self._apply_policy,
            ops_.SetVhostLimits: lambda op: limits.apply_op(self, op),
            ops_.SetUserLimits: lambda op: limits.apply_op(self, op),
            ops_.SetParameter: self._apply_parameter, ops_.ClearParameter: self._apply_parameter,
        })
        self._saved_ops = store.load() if store is not None else []
        if auth is None:
            auth = AuthStore()
            if not self._saved_ops and not config.load_definitions:  # RabbitMQ seeds no default user then
                auth.bootstrap(config.default_user, config.default_pass, config.default_vhost)
        self.auth = auth
        # the auth store as last recorded or applied: a change is recorded as what differs from it (PatchAuth)
        self._auth_doc = auth.to_dict()
        self.vhosts: dict[str, VirtualHost] = {v.name: VirtualHost(v.name) for v in auth.list_vhosts()}
        self.policies = PolicyStore()  # policies and operator policies (runtime/broker/policies.py)
        self.policy_refreshes: dict[str, asyncio.Handle] = {}  # vhost -> next slice of its policy refresh
        # bytes of unfinished message bodies held by every connection, and the cap (session/connection.py)
        self.unfinished_body_bytes = 0
        self.unfinished_body_limit = max(config.max_unfinished_body_bytes_total or memory_limit_bytes(config) // 4,
                                         config.max_message_size)
        self.limits = LimitStore()  # vhost and user limits (runtime/broker/limits.py)
        self.peer_counts = PeerCounts()  # the other nodes' connection and channel counts (a cluster)
        self.worker_limits: limits.WorkerLimits | None = None  # exact counts between workers, set by runtime/app.py
        self.parameters = parameters.ParameterStore()  # runtime parameters: shovels (runtime/broker/parameters.py)
        self.shovels: Any = None  # the dynamic shovels' service, set by runtime/app.py (runtime/shovel/)
        self.federation: Any = None  # the federation links' service, set by runtime/app.py (runtime/federation/)
        # what the management API asks of this process (runtime/agent.py's LocalAgent, or a gatherer of
        # several), set by runtime/app.py
        self.agent: ManagementAgentPort | None = None
        # topic permissions (mgmt/users.py): (vhost, user) -> {exchange: (write regex, read regex)}; the
        # channel checks write on publishes to topic exchanges; saved and replicated like permissions
        self.topic_permissions: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self._topic_doc: dict[tuple[str, str, str], tuple[str, str]] = {}  # as last recorded or applied
        self.cluster_name_set = False  # set through the API (saved), not only from the config
        self.connections: set[Any] = set()  # ConnectionPort
        self.reply_channels: dict[str, Any] = {}  # Direct Reply-To token -> ChannelPort
        # a clustered node: send a reply to the node (or worker) of its requester (app.cluster_node)
        self.forward_direct_reply: Callable[[str, str, Message], bool] | None = None
        self.alarms: set[str] = set()  # in force here: this process's own and the node's other workers'
        self.local_alarms: set[str] = set()  # this process's own (its ResourceMonitor's)
        self.worker_alarms: set[str] = set()  # a node of workers: every worker's, from the supervisor
        self.alarm_hooks: list[Callable[[set[str]], None]] = []  # told this process's own on each change
        # how busy the event loop is with input (the AMQP sockets report it): the flow rule's "is the
        # node the bottleneck?" (core/credit_flow.py)
        self.loop_load = LoopLoad(clock.monotonic)
        self.memory_pressure = False  # over the paging threshold: queues keep a small working set in RAM
        # churn counters (Prometheus rabbitmq_*_opened/closed/declared/created/deleted_total); never decrease
        self.churn = dict.fromkeys(("connections_opened", "connections_closed", "channels_opened",
                                    "channels_closed", "queues_declared", "queues_created", "queues_deleted"), 0)
        # the queue types, in the order a `queue.declare` record is offered to them (runtime/app.py)
        self.queue_types: list[QueueTypePort] = []
        self.perm_epoch = 0
        self.started_at = clock.wall_s()
        self.server: Any = None  # the AMQP listener (an asyncio Server), set by runtime/app.py
        self.amqp_port = 0  # the AMQP listener's port, once it listens (runtime/app.py)
        self.management_port = 0
        self.amqps_port = 0  # the TLS listeners' ports, once bound (runtime/tls.py, mgmt/http.py)
        self.management_ssl_port = 0
        # every listener's bound port by name ("amqp", "amqps", "management", "management_ssl", "cluster"),
        # set where it binds; runtime/app.py writes them to the ports file once the node is up (portfile.py)
        self.listener_ports: dict[str, int] = {}
        self.streams: Any = None  # the stream protocol's StreamHub while its listener runs (runtime/app.py)
        self.tls = NodeTls(config)  # TLS contexts of every listener, and certificate reloads
        self._tick_handle: asyncio.TimerHandle | None = None
        self.monitor_resources = monitor_resources
        self.monitor: ResourceMonitor | None = None
        # clustering (runtime/clustering/service.py): set by runtime/app.py for a clustered node
        self.cluster: MetadataPort | None = None
        self.logins = LoginGate(self)  # password checks: off the loop, bounded (runtime/broker/logins.py)
        self.cluster_peer_hooks: list[Callable[[str, bool], None]] = []  # (peer, up) from the transport
        self.limit_hooks: list[Callable[[], None]] = []  # a vhost's or user's limits changed (broker/limits.py)
        self.stale_transient: list[tuple[str, str]] = []  # (vhost, queue) this node's, gone with a restart
        # stat_* counters of channels that have closed, so node-wide totals (the management overview)
        # do not drop when a channel goes. Invariant: only ever grows.
        self.closed_channel_stats: dict[str, int] = {}

    def wall_ms(self) -> float:
        return float(self.clock.wall_ms())

    unpack_arguments = staticmethod(unpack_arguments)

    # -- queue types -----------------------------------------------------------------------------
    def register_queue_type(self, queue_type: QueueTypePort) -> None:
        assert all(t.name != queue_type.name for t in self.queue_types), queue_type.name
        self.queue_types.append(queue_type)

    def queue_type(self, name: str) -> QueueTypePort | None:
        for t in self.queue_types:
            if t.name == name and t.declarable:
                return t
        return None

    def queue_type_of(self, q: Queue) -> QueueTypePort:
        for t in self.queue_types:
            if t.owns(q):
                return t
        raise AssertionError(f"no queue type owns {q!r}")

    def add_queue(self, vhost: VirtualHost, q: Queue, count: bool = True) -> None:
        """A queue type's new queue joins its vhost (policies applied). `count`: a client's declare."""
        vhost.add_queue(q)
        if count:
            self.churn["queues_created"] += 1
        policies.apply_to_queue(self, q)

    def restore(self) -> None:
        """Replay the saved definitions (once the queue types are registered)."""
        if self.store is not None:
            self._restore(self._saved_ops)
        self._saved_ops = []

    def recover_messages(self) -> None:
        """Recover stored messages (after the definitions, and on a clustered node after its boot)."""
        for t in self.queue_types:
            t.recover()
        if self.delayed is not None:
            self.delayed.recover()

    # -- durable definitions ---------------------------------------------------------------------
    def _record(self, op: DefinitionOp) -> None:
        if self.replaying:
            return
        group = self._groups.get(asyncio.current_task()) if self._groups else None
        if self.cluster is not None:  # the metadata Raft group is the durable record of a clustered node
            if group is not None:
                self._held.setdefault(group, []).append(op)
            else:
                self.cluster.replicate(op)
        elif self.store is not None:
            self.store.append(op, group)

    @contextlib.contextmanager
    def grouped(self, group: int) -> Iterator[None]:
        """The definition changes the current task makes inside the block (across its awaits; other
        tasks' changes are not in it) are one group: durable all at once by `end_group`, or never (a
        crash, or `end_group(commit=False)`). The definitions log tags them (definitions.py, "Groups");
        a clustered node holds them and proposes them as one metadata entry at the group's end."""
        task = asyncio.current_task()
        assert task is not None and task not in self._groups, "one group at a time, in a task"
        self._groups[task] = group
        try:
            yield
        finally:
            del self._groups[task]

    def in_group(self) -> bool:
        """Whether the current task's changes are being grouped (their replication waits for the end)."""
        return bool(self._groups) and asyncio.current_task() in self._groups

    async def end_group(self, group: int, commit: bool = True) -> None:
        """Make `group`'s changes durable: one sync of the definitions log, or on a clustered node one
        metadata entry, committed and applied by the connected members before this returns (as each
        change of a stream's declare waits: runtime/stream_session/catalog.py). `commit=False`: the
        group is given up (its changes were undone in memory), nothing of it is ever durable."""
        held = self._held.pop(group, [])
        if not commit:
            return
        if self.cluster is not None:
            for op in held:  # proposed together at the end of this turn: one entry
                self.cluster.replicate(op)
            await self.cluster.wait_replicated()
            await self.cluster.sync_peers()
        elif self.store is not None:
            self.store.end_group(group)

    # -- the metadata machine's target (cluster/metadata.py) --------------------------------------------
    def apply_op(self, op: DefinitionOp) -> None:
        """Apply a definition change another node made (or this node made before a restart)."""
        self.replaying = True
        try:
            self._apply(op)
        finally:
            self.replaying = False

    def state_ops(self) -> list[DefinitionOp]:
        return list(self._state_ops())

    def reset_to(self, ops: list[DefinitionOp]) -> None:
        """Make the durable definitions exactly `ops` (a metadata snapshot): drop what they do not
        name, then apply them (an identical declaration is a no-op)."""
        wanted = {(type(op), op.vhost, op.name) for op in ops
                  if isinstance(op, ops_.DeclareQueue | ops_.DeclareExchange)}
        keep_bindings = {self._binding_key(op) for op in ops if isinstance(op, ops_.Bind)}
        self.replaying = True
        try:
            for vhost in list(self.vhosts.values()):
                for x in list(vhost.exchanges.values()):
                    if not (x.durable or self.cluster is not None):
                        continue
                    for b in list(x.router.bindings()):
                        bind = self._binding_op(ops_.Bind, vhost, x, b.destination, b.routing_key, b.arguments)
                        if (self.cluster is not None or self._durable_destination(vhost, b.destination)) and \
                                self._binding_key(bind) not in keep_bindings:
                            self.unbind(vhost, x, b.destination, b.routing_key, b.arguments)
                for q in list(vhost.queues.values()):
                    if (is_durable_queue(q) or self.cluster is not None) and \
                            (ops_.DeclareQueue, vhost.name, q.name) not in wanted:
                        self.delete_queue(vhost, q)
                for name, x in list(vhost.exchanges.items()):
                    if (x.durable or self.cluster is not None) and name and not name.startswith("amq.") and \
                            (ops_.DeclareExchange, vhost.name, name) not in wanted:
                        self.delete_exchange(vhost, name, False)
            for operator, p in list(self.policies):
                policies.clear_policy(self, p.vhost, p.name, operator)
            self.limits = LimitStore()  # the snapshot's operations set them again
            parameters.reset(self)
        finally:
            self.replaying = False
        for op in ops:
            try:
                self.apply_op(op)
            except (ChannelError, KeyError, ValueError) as exc:
                log.warning("metadata snapshot: cannot apply %s: %s", ops_.kind_of(op), exc)

    @staticmethod
    def _binding_key(op: ops_.Bind | ops_.Unbind) -> tuple[Any, ...]:
        return (op.vhost, op.source, op.dest_kind, op.dest, op.routing_key, bytes(op.arguments))

    def members_changed(self) -> None:
        if self.cluster is not None:
            self.cluster.members_changed()

    def _restore(self, ops: list[DefinitionOp]) -> None:
        """Replay saved definitions through the same methods that made them, then compact."""
        assert self.store is not None
        self.replaying = True
        try:
            for op in ops:
                try:
                    self._apply(op)
                except (ChannelError, KeyError, ValueError) as exc:
                    log.warning("skipping saved definition %s: %s", ops_.kind_of(op), exc)
        finally:
            self.replaying = False
        self.store.compact(self._state_ops())
        log.info("definitions restored: %d vhosts, %d queues, %d exchanges", len(self.vhosts),
                 sum(len(v.queues) for v in self.vhosts.values()),
                 sum(len(v.exchanges) for v in self.vhosts.values()))

    # -- applying definition operations (the handlers of the dispatch table `_apply`) ---------------------
    def _apply_auth(self, op: ops_.SetAuth) -> None:
        self._auth_replaced(op.auth)

    def _apply_auth_patch(self, op: ops_.PatchAuth) -> None:
        self._auth_replaced(auth_patch(self.auth.to_dict(), op.changes))

    def _auth_replaced(self, doc: dict[str, Any]) -> None:
        self.auth = AuthStore.from_dict(doc)
        self._auth_doc = self.auth.to_dict()
        names = {v.name for v in self.auth.list_vhosts()}
        for name in list(self.vhosts):
            if name not in names:  # deleted on another member (or worker): its connections here go too
                self._close_vhost_connections(self.vhosts.pop(name))
        for name in names:
            self.vhosts.setdefault(name, VirtualHost(name))
        self.perm_epoch += 1
        limits.prune(self)

    def _apply_rehash(self, op: ops_.RehashUser) -> None:
        if self.auth.upgrade_password_hash(op.user, op.previous_hash, op.new_hash):
            self.perm_epoch += 1
            self._auth_doc = self.auth.to_dict()

    def _apply_topic_permissions(self, op: ops_.SetTopicPermissions) -> None:
        self._set_topic_rows(op.table)

    def _apply_topic_patch(self, op: ops_.PatchTopicPermissions) -> None:
        rows = self._topic_rows()
        for change in op.changes:
            if not (isinstance(change, list | tuple) and len(change) in (3, 5) and all(isinstance(f, str) for f in change)):
                raise ValueError(f"malformed topic permission change {change!r:.200}")
            key = (change[0], change[1], change[2])
            if len(change) == 3:
                rows.pop(key, None)
            else:
                rows[key] = (change[3], change[4])
        self._set_topic_rows([[*k, *wr] for k, wr in sorted(rows.items())])

    def _topic_rows(self) -> dict[tuple[str, str, str], tuple[str, str]]:
        return {(v, u, x): wr for (v, u), by_x in self.topic_permissions.items() for x, wr in by_x.items()}

    def _set_topic_rows(self, table: list[list[str]]) -> None:
        self.topic_permissions = {}
        for v, u, x, w, r in table:
            self.topic_permissions.setdefault((v, u), {})[x] = (w, r)
            for pattern in (w, r):  # a stored pattern RE2 refuses: warned here, allows nothing
                try:
                    compile_stored(pattern, f"topic permission of user '{u}' on exchange '{x}' in vhost '{v}'")
                except PatternError as exc:
                    log.warning("topic permission of user '%s' in vhost '%s': %s; it allows nothing", u, v, exc)
        self.perm_epoch += 1
        self._topic_doc = self._topic_rows()

    def _apply_declare_exchange(self, op: ops_.DeclareExchange) -> None:
        self.declare_exchange(self.vhosts[op.vhost], op.name, op.type, op.durable, op.auto_delete, op.internal,
                              unpack_arguments(op.arguments))

    def _apply_delete_exchange(self, op: ops_.DeleteExchange) -> None:
        self.delete_exchange(self.vhosts[op.vhost], op.name, False)

    def _apply_queue_record(self, op: ops_.DeclareQueue | ops_.SetQueueMembers) -> None:
        """A queue's declaration or members: the first queue type that takes the record applies it."""
        vhost = self.vhosts[op.vhost]
        for t in self.queue_types:
            if t.restore(vhost, op):
                return

    def _apply_delete_queue(self, op: ops_.DeleteQueue) -> None:
        vhost = self.vhosts[op.vhost]
        q = vhost.queues.get(op.name)
        if q is not None:
            self.delete_queue(vhost, q)

    def _apply_policy(self, op: ops_.SetPolicy | ops_.ClearPolicy) -> None:
        if op.vhost not in self.vhosts:
            raise KeyError(op.vhost)
        policies.apply_op(self, op)

    def _apply_parameter(self, op: ops_.SetParameter | ops_.ClearParameter) -> None:
        parameters.apply_op(self, op)

    def _apply_binding(self, op: ops_.Bind | ops_.Unbind) -> None:
        vhost = self.vhosts[op.vhost]
        source = vhost.lookup_exchange(op.source)
        method = self.bind if isinstance(op, ops_.Bind) else self.unbind
        method(vhost, source, (op.dest_kind, op.dest), op.routing_key, unpack_arguments(op.arguments))

    def _state_ops(self) -> Iterator[DefinitionOp]:
        """The durable state as operations that rebuild it: auth, then exchanges, queues, bindings.
        A clustered node's metadata holds transient objects too (other nodes route to them)."""
        everything = self.cluster is not None
        yield ops_.SetAuth(self.auth.to_dict())
        if self.topic_permissions:
            yield self._topic_permissions_op()
        if self.cluster_name_set:
            yield ops_.SetClusterName(self.config.cluster_name)
        yield from policies.state_ops(self)
        yield from limits.state_ops(self)
        yield from parameters.state_ops(self)
        for vhost in self.vhosts.values():
            for x in vhost.exchanges.values():
                if (x.durable or everything) and x.name and not x.name.startswith("amq."):
                    yield self._exchange_op(vhost, x)
            for q in vhost.queues.values():
                if is_durable_queue(q) or everything:
                    yield self._queue_op(vhost, q)
            for x in vhost.exchanges.values():
                if not (x.durable or everything):
                    continue
                for b in x.router.bindings():
                    if everything or self._durable_destination(vhost, b.destination):
                        yield self._binding_op(ops_.Bind, vhost, x, b.destination, b.routing_key, b.arguments)

    def _queue_op(self, vhost: VirtualHost, q: Queue) -> ops_.DeclareQueue:
        op = ops_.DeclareQueue(vhost.name, q.name, q.auto_delete, pack_arguments(q.arguments), self.name,
                               q.durable, q.exclusive)
        return dataclasses.replace(op, **self.queue_type_of(q).record_fields(q))

    def set_queue_members(self, vhost: VirtualHost, q: Queue, members: list[str]) -> None:
        """A quorum queue's member list changed (hutch-queues add_member/delete_member): applied here and
        recorded, so every node applies it (members open or delete their replica)."""
        op = ops_.SetQueueMembers(vhost.name, q.name, list(members))
        self._apply_queue_record(op)
        self._record(op)

    @staticmethod
    def _exchange_op(vhost: VirtualHost, x: Exchange) -> ops_.DeclareExchange:
        return ops_.DeclareExchange(vhost.name, x.name, x.type, x.auto_delete, x.internal, pack_arguments(x.arguments),
                                    x.durable)

    @staticmethod
    def _binding_op(kind: type[ops_.Bind | ops_.Unbind], vhost: VirtualHost, source: Exchange,
                    destination: tuple[str, str], routing_key: str,
                    arguments: dict[str, Any]) -> ops_.Bind | ops_.Unbind:
        return kind(vhost.name, source.name, destination[0], destination[1], routing_key, pack_arguments(arguments))

    @staticmethod
    def _durable_destination(vhost: VirtualHost, destination: tuple[str, str]) -> bool:
        kind, name = destination
        if kind == "queue":
            q = vhost.queues.get(name)
            return q is not None and is_durable_queue(q)
        x = vhost.exchanges.get(name)
        return x is not None and x.durable

    # -- storage and memory -------------------------------------------------------------------------
    def set_memory_pressure(self, on: bool) -> None:
        """Over (or back under) the paging threshold: every queue type shrinks (or restores) what its
        queues keep in RAM. Called on every memory check while paging."""
        self.memory_pressure = on
        for t in self.queue_types:
            t.memory_pressure(on)

    # -- access control changes ------------------------------------------------------------------
    def permissions_changed(self) -> None:
        """Users, vhosts or permissions changed: drop cached permission checks and save them."""
        self.perm_epoch += 1
        limits.prune(self)
        doc = self.auth.to_dict()
        changes = auth_diff(self._auth_doc, doc)
        self._auth_doc = doc
        if changes:  # only what changed: a whole snapshot would undo what another member changed meanwhile
            self._record(ops_.PatchAuth(changes))

    @property
    def public_name(self) -> str:
        """The node's name as clients, the management API, /metrics and hutchctl see it (the node's
        for a worker of a node of workers: runtime/workers/spec.py's `public_name`)."""
        return public_name(self.config)

    def password_rehashed(self, user: str, previous_hash: str, new_hash: str) -> bool:
        """A login's re-hash of an imported hash (runtime/broker/logins.py): stored if the user's hash is
        still `previous_hash`, and recorded as that one change (`RehashUser`), never as the whole auth
        store, which would undo a change another worker or member committed meanwhile."""
        op = ops_.RehashUser(user, previous_hash, new_hash)
        if not self.auth.upgrade_password_hash(user, previous_hash, new_hash):
            return False
        self.perm_epoch += 1
        self._auth_doc = self.auth.to_dict()  # recorded as the re-hash, not again in the next PatchAuth
        self._record(op)
        return True

    def set_cluster_name(self, name: str) -> None:
        """PUT /api/cluster-name: the running node's name for its cluster, saved (and replicated)."""
        self.config = dataclasses.replace(self.config, cluster_name=name)
        self.cluster_name_set = True
        self._record(ops_.SetClusterName(name))

    def topic_permissions_changed(self) -> None:
        """Topic permissions changed (mgmt/users.py): drop cached checks and record what changed
        (`PatchTopicPermissions`: the whole table would undo what another member changed meanwhile)."""
        self.perm_epoch += 1
        rows = self._topic_rows()
        changes = [[*k, *wr] for k, wr in sorted(rows.items()) if self._topic_doc.get(k) != wr]
        changes += [list(k) for k in sorted(self._topic_doc) if k not in rows]
        self._topic_doc = rows
        if changes:
            self._record(ops_.PatchTopicPermissions(changes))

    def _topic_permissions_op(self) -> ops_.SetTopicPermissions:
        return ops_.SetTopicPermissions([[v, u, x, w, r] for (v, u), by_x in sorted(self.topic_permissions.items())
                                         for x, (w, r) in sorted(by_x.items())])

    def add_vhost(self, name: str, description: str = "", tags: Sequence[str] = ()) -> None:
        self.auth.add_vhost(name, description=description, tags=list(tags))
        self.vhosts[name] = VirtualHost(name)
        self.permissions_changed()

    def delete_vhost(self, name: str) -> None:
        policies.forget_vhost(self, name)
        parameters.forget_vhost(self, name)
        self.auth.delete_vhost(name)
        vhost = self.vhosts.pop(name, None)
        if vhost is not None:
            self._close_vhost_connections(vhost)
            for q in list(vhost.queues.values()):
                self.delete_queue(vhost, q)
        self.permissions_changed()

    def _close_vhost_connections(self, vhost: VirtualHost) -> None:
        """A deleted vhost's connections are closed (320 CONNECTION_FORCED, as RabbitMQ on every node)."""
        for conn in list(self.connections):
            if conn.vhost_obj is vhost:
                conn.close_forced("vhost deleted")

    def channel_closed(self, ch: ChannelPort) -> None:
        """Fold a closing channel's stat_* counters into `closed_channel_stats` (called once)."""
        self.churn["channels_closed"] += 1
        stats = self.closed_channel_stats
        for key, value in ch.stats().items():
            stats[key] = stats.get(key, 0) + value

    # -- resource alarms ---------------------------------------------------------------------------
    def set_alarm(self, name: str) -> None:
        """Raise an alarm of this process's: publishing connections are blocked (consumers keep going)."""
        self.local_alarms.add(name)
        self._alarms_changed(local=True)

    def set_worker_alarms(self, names: set[str]) -> None:
        """The alarms of every worker of this node (the supervisor's union): memory and disk are node-wide,
        so one worker's alarm blocks the publishers of all of them, as a RabbitMQ alarm does."""
        self.worker_alarms = set(names)
        self._alarms_changed(local=False)

    def _alarms_changed(self, local: bool) -> None:
        was = bool(self.alarms)
        self.alarms = self.local_alarms | self.worker_alarms
        if local:
            for hook in self.alarm_hooks:
                hook(set(self.local_alarms))
        if self.alarms and not was:
            for conn in list(self.connections):
                conn.alarm_raised()
        elif was and not self.alarms:
            for conn in list(self.connections):
                conn.alarm_cleared()

    def reap_blocked_connections(self) -> int:
        """Close connections held by an alarm whose clients have gone (their FIN is unread while reading
        is held); what they held (unfinished bodies) is released. Returns how many."""
        gone = [conn for conn in self.connections if conn.alarm_blocked and conn.peer_closed()]
        for conn in gone:
            log.info("connection %s:%d closed by its client while blocked by an alarm", *conn.peer)
            conn.abort()
        return len(gone)

    def clear_alarm(self, name: str) -> None:
        """Clear an alarm of this process's; connections are unblocked only when no alarm remains (here
        or, in a node of workers, in any worker)."""
        self.local_alarms.discard(name)
        self._alarms_changed(local=True)

    def check_connection_limits(self, vhost: str, user: str) -> None:
        """connection.open: ConnectionError_ 530 past the vhost's or the user's max-connections."""
        limits.check_connection(self, vhost, user)

    def open_connection_limits(self, vhost: str, user: str) -> Coroutine[Any, Any, None] | None:
        """connection.open: 530 past a connection limit, judged here or (a worker) waited for."""
        return limits.connections_over_workers(self, vhost, user)

    def open_channel_limit(self, conn: SessionConnection) -> Coroutine[Any, Any, None] | None:
        """channel.open: 530 past the user's max-channels, judged here or (a worker) waited for."""
        return limits.channels_over_workers(self, conn)

    # -- topology ----------------------------------------------------------------------------------
    def declare_exchange(self, vhost: VirtualHost, name: str, type_: str, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict[str, Any]) -> Exchange:
        x, created = vhost.declare_exchange(name, type_, durable, auto_delete, internal, arguments)
        if created:
            policies.apply_to_exchange(self, x)
        if created and (durable or self.cluster is not None):
            self._record(self._exchange_op(vhost, x))
        if created and not self.replaying and self.delayed is not None and x.type == DELAYED_MESSAGE:
            self.delayed.exchange_declared(vhost, x)
        return x

    def delete_exchange(self, vhost: VirtualHost, name: str, if_unused: bool) -> bool:
        x = vhost.exchanges.get(name)
        deleted = vhost.delete_exchange(name, if_unused)
        if deleted and self.delayed is not None:
            self.delayed.exchange_deleted(vhost.name, name)
        if deleted and x is not None and (x.durable or self.cluster is not None):
            self._record(ops_.DeleteExchange(vhost.name, name))
        return deleted

    def bind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
             arguments: dict[str, Any]) -> bool:
        added = vhost.bind(source, destination, routing_key, arguments)
        if added and (self.cluster is not None or source.durable and self._durable_destination(vhost, destination)):
            self._record(self._binding_op(ops_.Bind, vhost, source, destination, routing_key, arguments))
        return added

    def unbind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
               arguments: dict[str, Any]) -> bool:
        removed = vhost.unbind(source, destination, routing_key, arguments)
        if removed and (self.cluster is not None or source.durable and self._durable_destination(vhost, destination)):
            self._record(self._binding_op(ops_.Unbind, vhost, source, destination, routing_key, arguments))
        return removed

    def declare_queue(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                      arguments: dict[str, Any], owner: object) -> Queue:
        self.churn["queues_declared"] += 1
        existing = vhost.queues.get(name)
        default_type = self._default_queue_type(vhost)
        if existing is not None:
            vhost.check_queue_equivalence(existing, durable, exclusive, auto_delete,
                                          equivalence_arguments(arguments, default_type, existing.queue_type),
                                          owner)
            self.queue_type_of(existing).redeclared(existing)
            return existing
        if not self.replaying:  # a queue that exists stays when a limit is lowered
            limits.check_queue(self, vhost.name, name, len(vhost.queues))
            arguments = with_default_queue_type(arguments, default_type, durable, exclusive, auto_delete)
        qtype = arguments.get("x-queue-type", "classic")
        queue_type = self.queue_type(qtype)
        if queue_type is None:
            supported = ", ".join(t.name for t in self.queue_types if t.declarable)
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for {rs('queue', name, vhost.name)}: "
                               f"'{qtype}' is not supported by this node (supported: {supported})")
        q = queue_type.declare(vhost, name, durable, exclusive, auto_delete, arguments, owner)
        assert vhost.queues.get(name) is q, "a queue type's declare adds the queue (Node.add_queue)"
        if q.settings.consumer_timeout is not None:
            self._ensure_tick()
        if is_durable_queue(q) or self.cluster is not None:
            self._record(self._queue_op(vhost, q))
        return q

    def _default_queue_type(self, vhost: VirtualHost) -> str | None:
        record = self.auth.get_vhost(vhost.name)
        return record.default_queue_type if record is not None else None

    def delete_queue(self, vhost: VirtualHost, q: Queue) -> int:
        if vhost.queues.get(q.name) is q:
            self.churn["queues_deleted"] += 1
        self.queue_type_of(q).deleted(q)
        consumers = q.consumers()
        durable = (is_durable_queue(q) or self.cluster is not None) and vhost.queues.get(q.name) is q
        count = vhost.delete_queue(q)
        if durable:
            self._record(ops_.DeleteQueue(vhost.name, q.name))
        for consumer in consumers:
            consumer.channel.consumer_cancelled_by_broker(consumer)
        return count

    def release_exclusive(self, conn: ConnectionPort) -> None:
        """Delete the exclusive queues a closing connection owns."""
        vhost = conn.vhost_obj
        if vhost is None:
            return
        for q in [q for q in vhost.queues.values() if q.exclusive_owner is conn]:
            self.delete_queue(vhost, q)

    def deliver_direct_reply(self, token: str, msg: Message) -> bool:
        """Deliver a reply to the requester's channel, here or (`forward_direct_reply`, set on a clustered
        node) on the node or worker its token names; False when nobody is known to wait for it."""
        ch = self.reply_channels.get(token)
        if ch is not None:
            return bool(ch.deliver_direct_reply(msg))
        home = direct_reply.token_node(token)
        forward = self.forward_direct_reply
        return home is not None and home != self.name and forward is not None and forward(home, token, msg)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the queue types, consumer-timeout ticks and resource monitoring (listeners: app.py)."""
        self._schedule_tick()
        for t in self.queue_types:
            await t.start()
        if self.delayed is not None:
            self.delayed.start()
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
        for conn in list(self.connections):
            conn.close_forced("shutdown")
        await asyncio.sleep(0.05)  # a grace period for the connection.close frames to reach clients
        for conn in list(self.connections):
            conn.abort()
        self.logins.close()
        if self.delayed is not None:
            self.delayed.stop()
        for t in self.queue_types:
            await t.stop()


def is_durable_queue(q: Queue) -> bool:
    return q.durable and q.exclusive_owner is None


__all__ = ["Node", "is_durable_queue"]
