"""Ports: the small interfaces the runtime's layers depend on instead of each other's classes.

Owns: the `Protocol`s that cross a layer boundary inside `hutch.runtime`. The layers and their rules
(checked by tests/unit/test_layers.py, which scans imports with `ast`, `TYPE_CHECKING` blocks and
function-local imports included):

    app.py (composition root) ─┬─> session/ ──────> ports, errors, clock
                               ├─> queue_types/ ──> clustering/, broker/ (as ports), ports
                               ├─> clustering/ ───> ports, errors
                               └─> broker/ ───────> ports, errors, clock

- `session/` (the AMQP connection and channel) never imports `broker.node`, `clustering/` or
  `queue_types/`: it talks to the broker through `BrokerPort` and to the cluster through `MetadataPort`.
- `broker/` (node state, topology, policies, alarms, the definitions log) never imports `session/`,
  `queue_types/` or `clustering/`: connections are `ConnectionPort`s, channels `ChannelPort`s, queue types
  `QueueTypePort`s registered by the composition root, and the cluster a `MetadataPort`.
- `clustering/` never imports the node or `queue_types/`: queue types register their inter-node handlers.
- `queue_types/` never imports `session/`.

A third queue type (streams) is one more `QueueTypePort` registered in `app.py`; nothing in `broker/`
or `session/` changes for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hutch.amqp.errors import AMQPError
    from hutch.config import Config
    from hutch.core.auth import AuthStore, LoginOutcome
    from hutch.core.confirms import Receipt
    from hutch.core.credit_flow import LoopLoad
    from hutch.core.definition_ops import DeclareQueue, DefinitionOp, SetQueueMembers
    from hutch.core.message import Message
    from hutch.core.queue_type import Consumer, Queue
    from hutch.core.routing import Exchange
    from hutch.core.vhost import VirtualHost


class Clock(Protocol):
    """The runtime's clock (runtime/clock.py): readings only, no timers. `wall_ms` for what a client or
    a peer sees (timestamps, TTLs, x-expires, statistics), `monotonic` for intervals. A session's timers
    run on its `LoopClock` (session/ports.py) instead: the event loop, whose time is the base its timers
    count from."""

    def wall_ms(self) -> int: ...

    def wall_s(self) -> float: ...

    def monotonic(self) -> float: ...


class LoginChecker(Protocol):
    """The node's password checks (runtime/broker/logins.py's `LoginGate`): off the event loop, bounded
    per node and per source address; a refusal's reason is for the log only."""

    async def check(self, user: str, password: str, source: str) -> LoginOutcome: ...


class ChannelPort(Protocol):
    """What the broker asks of an open AMQP channel."""

    conn: SessionConnection

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...

    def deliver_direct_reply(self, msg: Message) -> bool: ...

    def stats(self) -> dict[str, int]:
        """The channel's message counters (`stat_*`), folded into node totals when it closes."""
        ...


class ConnectionPort(Protocol):
    """What the broker asks of a client connection."""

    user_name: str
    vhost_obj: VirtualHost | None

    def close_forced(self, reason: str) -> None: ...

    def abort(self) -> None: ...

    def alarm_raised(self) -> None: ...

    def alarm_cleared(self) -> None: ...

    def check_consumer_timeouts(self, now: float, timeout_ms: int) -> None: ...


class ClusterSubsystem(Protocol):
    """A part of a node that speaks over the cluster transport (queue types' services): it registers
    its inter-node message handlers with the cluster service's typed registry."""

    def booted(self) -> None:
        """The node's cluster boot finished (its metadata is as new as the cluster's)."""
        ...

    def stop(self) -> None: ...


class MetadataPort(Protocol):
    """How definition changes are replicated, and how a session waits for the cluster.

    On a clustered node this is the cluster service (runtime/clustering/service.py); a plain node has
    none (`node.cluster is None`) and writes its definitions log itself."""

    post_commit: list[Callable[[], Awaitable[Any]]]  # Any: what a hook's awaitable returns is ignored

    @property
    def has_unreplicated(self) -> bool: ...

    def replicate(self, op: DefinitionOp) -> None: ...

    def members_changed(self) -> None: ...

    async def barrier(self, timeout: float | None = None) -> None: ...

    async def wait_replicated(self) -> None: ...

    async def sync_peers(self) -> None: ...


class ClusterNodePort(Protocol):
    """What the cluster service asks of the node: its identity and definitions (the metadata machine's
    target, cluster/metadata.py), its alarms (shown to peers) and hooks for peers going up or down."""

    config: Config
    name: str
    alarms: set[str]
    stale_transient: list[tuple[str, str]]
    cluster_peer_hooks: list[Callable[[str, bool], None]]
    loop_load: LoopLoad  # the Raft driver's cycles and inter-node input count in it (the flow rule)

    def apply_op(self, op: DefinitionOp) -> None: ...

    def state_ops(self) -> list[DefinitionOp]: ...

    def reset_to(self, ops: list[DefinitionOp]) -> None: ...

    def members_changed(self) -> None: ...


class QueueTypePort(Protocol):
    """A queue type as the broker sees it (classic, remote, quorum; streams next).

    The broker keeps topology and records; a queue type makes, restores and tears down its queues."""

    name: str
    declarable: bool  # a client may name it in x-queue-type (remote stand-ins are not)

    def owns(self, q: Queue) -> bool: ...

    def declare(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], owner: object) -> Queue:
        """Make a new queue: validated as this type requires, added with `Node.add_queue`, attached."""
        ...

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        """Apply a `queue.declare` or `queue.members` record if it is this type's (True), else False."""
        ...

    def record_fields(self, q: Queue) -> dict[str, Any]:
        """What this type adds to a queue's `queue.declare` record."""
        ...

    def redeclared(self, q: Queue) -> None:
        """An equivalent declare of an existing queue (a use: renews x-expires)."""
        ...

    def check_consume(self, q: Queue, consumer: Consumer) -> None:
        """Would `q` take `consumer`? Raise the AMQP error that refuses it (its arguments, its
        acknowledgement mode, its prefetch, as this type requires); asked by basic.consume before it
        answers consume-ok, so a refused consumer never sees one (as in RabbitMQ)."""
        ...

    def deleted(self, q: Queue) -> None: ...

    def memory_pressure(self, on: bool) -> None: ...

    def recover(self) -> None:
        """After definitions are known: recover stored messages."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class SessionConnection(Protocol):
    """What a channel asks of its connection (session/connection.py's `AMQPConnection`): where it
    writes its frames, and the connection-wide state it shares."""

    node: BrokerPort
    name: str  # "peer host:port -> local host:port", as the management API shows it
    peer: tuple[str, int]
    user_name: str
    vhost_obj: VirtualHost | None
    frame_max: int
    out: list[bytes]
    capabilities: dict[str, Any]
    channels: dict[int, Any]
    write_paused: bool
    alarm_blocked: bool
    has_published: bool
    unfinished_body_bytes: int

    def send_method(self, channel: int, method: Any) -> None: ...

    def send_raw_method(self, channel: int, payload: bytes) -> None: ...

    def want_write(self) -> None: ...

    def want_flush(self, channel: Any) -> None: ...

    def close_with_error(self, exc: AMQPError) -> None: ...

    def hold_unfinished_body(self, nbytes: int) -> None:
        """A channel holds `nbytes` more of a message body in progress (bounded per connection and
        node-wide)."""
        ...

    def release_unfinished_body(self, nbytes: int) -> None:
        """A channel no longer holds `nbytes` of a message body in progress."""
        ...

    def flow_block(self, queue: Any) -> None: ...

    def block_for_alarm(self) -> None: ...


class DelayedPort(Protocol):
    """The messages x-delayed-message exchanges hold (runtime/queue_types/delayed.py)."""

    def hold(self, vhost: VirtualHost, x: Exchange, msg: Message, headers: dict[str, Any] | None,
             receipt: Receipt | None) -> list[Hashable] | None:
        """Hold `msg` if its `x-delay` asks for it: the receipt's pending queues; None: route it now."""

    def count(self, vhost: str, exchange: str) -> int: ...

    def held_here(self, vhost: str, exchange: str) -> int: ...

    def in_replica(self, vhost: str, exchange: str) -> int: ...

    def exchange_declared(self, vhost: VirtualHost, x: Exchange) -> None: ...

    def exchange_deleted(self, vhost: str, exchange: str) -> None: ...

    def recover(self) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class BrokerPort(Protocol):
    """What an AMQP session (connection and channel) may ask of the broker."""

    config: Config
    auth: AuthStore
    name: str
    vhosts: dict[str, VirtualHost]
    alarms: set[str]
    loop_load: LoopLoad
    perm_epoch: int
    churn: dict[str, int]
    connections: set[Any]
    reply_channels: dict[str, Any]
    topic_permissions: dict[tuple[str, str], dict[str, tuple[str, str]]]
    cluster: MetadataPort | None
    persistence: Any
    delayed: DelayedPort | None
    clock: Clock

    @property
    def logins(self) -> LoginChecker: ...  # every password check (runtime/broker/logins.py's LoginGate)
    # bytes of unfinished message bodies over every connection, and the node-wide cap (issue 21)
    unfinished_body_bytes: int
    unfinished_body_limit: int

    def wall_ms(self) -> float: ...

    def declare_exchange(self, vhost: VirtualHost, name: str, type_: str, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict[str, Any]) -> Exchange: ...

    def grouped(self, group: int) -> AbstractContextManager[None]:
        """The current task's definition changes inside the block are one group, durable all at once by
        `end_group` or never (a super stream's creation: runtime/broker/definitions.py, "Groups")."""
        ...

    def in_group(self) -> bool: ...

    async def end_group(self, group: int, commit: bool = True) -> None: ...

    def delete_exchange(self, vhost: VirtualHost, name: str, if_unused: bool) -> bool: ...

    def bind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
             arguments: dict[str, Any]) -> bool: ...

    def unbind(self, vhost: VirtualHost, source: Exchange, destination: tuple[str, str], routing_key: str,
               arguments: dict[str, Any]) -> bool: ...

    def declare_queue(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                      arguments: dict[str, Any], owner: object) -> Queue: ...

    def delete_queue(self, vhost: VirtualHost, q: Queue) -> int: ...

    def queue_type_of(self, q: Queue) -> QueueTypePort:
        """The queue type that owns `q` (basic.consume asks it before answering consume-ok)."""
        ...

    def release_exclusive(self, conn: ConnectionPort) -> None: ...

    def deliver_direct_reply(self, token: str, msg: Message) -> bool: ...

    def channel_closed(self, ch: ChannelPort) -> None: ...

    def check_connection_limits(self, vhost: str, user: str) -> None:
        """connection.open: raises the connection error RabbitMQ gives past a vhost or user limit."""
        ...

    def open_connection_limits(self, vhost: str, user: str) -> Coroutine[Any, Any, None] | None:
        """connection.open: as `check_connection_limits`, or (a worker of a node of several, a limit that
        applies) the wait for the node's exact count, which raises that error; the caller counts the
        connection in the step the wait ends in."""
        ...

    def open_channel_limit(self, conn: SessionConnection) -> Coroutine[Any, Any, None] | None:
        """channel.open: raises the connection error RabbitMQ gives past the user's max-channels, or
        returns the wait for it as `open_connection_limits`."""
        ...


STREAM_PROTOCOL_FIELDS = ("messages_received", "messages_confirmed", "messages_errored", "messages_delivered",
                          "publishers", "consumers")  # the stream protocol's counters in `metric_samples`


class ManagementAgentPort(Protocol):
    """What the management API and hutchctl ask of a node: RabbitMQ's management agent.

    Answers are plain data (dicts, lists, str, int, float, bool, None: msgpack-serialisable), in
    RabbitMQ's field names, so an answer can cross a process or a node boundary unchanged. Statistics
    rates are not here: the management layer adds them from its own samples. An agent answers for the
    objects its process holds (runtime/agent.py's `LocalAgent`); a node of several workers answers by
    gathering its workers' answers (runtime/gather.py's `GatheringAgent`), which is itself an agent.

    Invariant: every object an answer names carries `node` (or `channel_details.node`) = `name`, the
    node's name as clients and other cluster members see it."""

    @property
    def name(self) -> str: ...

    async def counts(self) -> dict[str, int]:
        """`connections`, `channels` and `consumers` held, and the node-wide message counters
        (`publish`, `confirm`, ... of stats.CHANNEL_FIELDS: closed channels plus live ones)."""
        ...

    async def connections(self) -> list[dict[str, Any]]:
        """Every AMQP connection as GET /api/connections shows it, without rates (`recv_oct`, `send_oct`
        are the live byte counts)."""
        ...

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        """Every channel (of one connection, by its name) as GET /api/channels shows it, without rates
        (`message_stats` holds the live counters)."""
        ...

    async def channel(self, name: str) -> dict[str, Any] | None:
        """One channel with `consumer_details` and `publishes` (GET /api/channels/{name}); None when
        no such channel is here."""
        ...

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        """Every consumer (of one (vhost, queue), in the queue's order) as GET /api/consumers shows it."""
        ...

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        """Every queue (of those vhosts) by its cheap fields: `name`, `vhost`, `durable`, `auto_delete`,
        `exclusive`, `messages`, `messages_ready`, `messages_unacknowledged`, `consumers` (what a
        paginated list sorts and filters on before it asks for the page in full)."""
        ...

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The queues named by (vhost, name) that are here, in that order, as GET /api/queues shows
        them without rates (`message_stats` holds the live counters)."""
        ...

    async def samples(self) -> dict[str, Any]:
        """What the statistics collector (mgmt/stats.py) samples every interval, as lists of plain values:
        `queues` [vhost, name, ready, unacked, published, delivered, get, acked, redelivered];
        `channels` [name, vhost, [counters in core/counters.py's CHANNEL_FIELDS order], publishes per
        exchange that still exists [[vhost, exchange, published, routed], ...]]; `connections` [name,
        vhost (None before connection.open), recv_oct, send_oct]; `closed` the closed channels' counters
        (CHANNEL_FIELDS order) and `churn` the node's churn counters by name."""
        ...

    async def metric_samples(self) -> dict[str, Any]:
        """What Prometheus' connection and channel families read (mgmt/prometheus.py), as plain values:
        `connections` [name, recv_oct, send_oct, channels]; `channels` [name, vhost ("" before
        connection.open), [core/counters.py's CHANNEL_METRIC_FIELDS]]; `closed` the closed channels'
        `stat_*` totals by attribute name; `churn` the churn counters by name; `streams` [vhost, name,
        segment files, consumer offset lag] per stream held; `stream_protocol` the stream protocol's
        counters in `STREAM_PROTOCOL_FIELDS` order ([] without a stream listener)."""
        ...

    async def stream_connections(self) -> list[dict[str, Any]]:
        """The opened stream-protocol connections (runtime/stream_session/), as plain values: each
        connection's `info()` fields (name, vhost, user, node, host, port, peer_host, peer_port, ssl,
        frame_max, heartbeat, auth_mechanism, connected_at, client_properties, state, publishers,
        subscriptions), `tls` [protocol version, cipher] or None, `publisher_rows` and `consumer_rows`
        (its publishers' and subscriptions' management rows)."""
        ...

    async def stream_groups(self, vhost: str) -> list[dict[str, Any]]:
        """The single-active-consumer groups of `vhost` that live here (each on its stream's writer):
        stream, reference, partition_index, consumers, and `members` in arrival order."""
        ...

    async def stream_tracking(self, vhost: str, stream: str) -> list[list[Any]] | None:
        """A stream's tracking as this worker's copy holds it: [type ("writer" or "offset"), reference,
        value] rows, writers then offsets, each sorted by reference; None when no copy of it is open here
        (in a node of workers, the stream's home answers)."""
        ...

    async def close_stream_connection(self, vhost: str, name: str, reason: str) -> bool:
        """Close the stream-protocol connection `name` of `vhost` (the socket, as RabbitMQ); False if
        there is none."""
        ...

    async def process_figures(self) -> dict[str, int]:
        """The figures of the processes answering (runtime/procinfo.py's `PROCESS_FIGURES`: resident
        memory, descriptors, AMQP sockets, threads, fsyncs and synced batches), summed over a node's workers:
        GET /api/nodes' `mem_used`, `fd_used`, ... of a node of workers are the node's, not one worker's."""
        ...

    async def delayed_counts(self) -> list[list[Any]]:
        """[vhost, exchange, messages held] for every x-delayed-message exchange with messages this process
        holds itself (`DelayedPort.held_here`: held in the worker that took the publish), so a node of
        workers sums its workers'; the messages in an exchange's replica (a quorum queue, the same on every
        member) are not in it: the management layer adds them once."""
        ...

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        """Drop the queue's ready messages: how many; None when the queue is not here."""
        ...

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        """Delete the queue (as queue.delete does): "deleted", "in_use" (`if_unused` and it has consumers),
        "not_empty" (`if_empty` and it has ready messages), or "absent" when it is not here."""
        ...

    async def close_connection(self, name: str, reason: str) -> bool:
        """Close the connection with 320 CONNECTION_FORCED and `reason`; False when it is not here."""
        ...

    async def close_user_connections(self, user: str, reason: str) -> int:
        """Close every connection of `user` (320 CONNECTION_FORCED); how many were closed."""
        ...


def queues_of(vhosts: Iterable[VirtualHost]) -> Iterable[tuple[VirtualHost, Queue]]:
    """Every (vhost, queue) pair, for queue types that sweep their queues."""
    for vhost in vhosts:
        for q in vhost.queues.values():
            yield vhost, q
