"""Every message one node sends another after the handshake, as a typed record, with one codec and one
dispatch table.

Owns:
- The records: one `NamedTuple` per message kind (Raft traffic, transparent routing of classic queues,
  quorum queues, cluster membership and operations), each with a small integer `TAG`. A request (sent
  with the transport's `call`) names the record its reply is decoded into in `REPLY` (None: the reply is
  a plain msgpack value, documented on the request).
- The codec: `to_wire(record)` -> `[TAG, field, ...]` (a positional msgpack array; a `Message` field is
  the array `[exchange, routing_key, properties_raw, body, route_tail, foreign_deaths]`), `from_wire(value)`
  -> record, and `encode(record) -> bytes` / `decode(bytes) -> record` (msgpack underneath). The
  transport's batch decoder unpacks a whole frame at once, so the runtime receives wire values and calls
  `from_wire`; `encode`/`decode` are the same codec on bytes.
- The dispatch table: `Registry.register(Kind, handler)` (one handler per kind, a second registration is
  a bug and raises) and `Registry.handle(peer, value)`, which decodes and calls the handler.

Rules:
- Pure: no asyncio, no sockets, no clock. `from_wire` raises only `MessageError` subclasses: `UnknownMessage`
  for a tag no record has (or a kind no handler is registered for), `MalformedMessage` for the wrong number
  of fields or a field of the wrong type, with the kind's name and the field in the text. The runtime logs
  them and carries on; nothing a peer sends makes it raise anything else.
- Field types are checked one level deep (an `int` field holds an int, a `list` field a list); the elements
  of list fields are the handler's to check (they are converted with `int()`/`str()` where used).
- Records are `NamedTuple`s rather than frozen dataclasses because they are built once per message on the
  hot paths (publish, deliver, confirm, Raft): constructing one costs about 0.11 µs against 0.36 µs for a
  frozen slotted dataclass of the same fields (CPython 3.11, this machine), and a tuple packs as the
  msgpack array it is on the wire. They are immutable and typed; compare them by kind and fields.
- The wire format may change between versions; a mixed-version cluster is not supported (the handshake's
  protocol version guards it).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias, TypeGuard, TypeVar

import msgpack

from hutch.core.message import Message


class MessageError(ValueError):
    """A value received from a peer is not a message this node understands."""


class UnknownMessage(MessageError):
    """No record has this tag, or no handler is registered for this kind on this node."""


class MalformedMessage(MessageError):
    """A known kind with the wrong number of fields or a field of the wrong type."""


# -- the records ----------------------------------------------------------------------------------------
# Tags: 1-9 Raft and the metadata group, 10-29 transparent routing (queue_types/remote.py), 30-49 quorum
# queues (queue_types/quorum/), 50-59 operations (mgmt), 60-69 stream replication
# (queue_types/stream_replication/), 140-149 a stream's one copy in a node of workers
# (stream_session/home_link.py; 148 a stream consumer's position for management, queue_types/remote.py). A reply record has a tag of its own. The kind's
# tag (and a request's reply) is given by its decorator, which also sets `TAG` (and `REPLY`) on the class.

T = TypeVar("T")
_TAGS: dict[type, int] = {}
_REPLIES: dict[type, type | None] = {}  # request kind -> its reply record (None: a plain msgpack value)


def message_kind(tag: int) -> Callable[[type[T]], type[T]]:
    """A record kind with wire tag `tag`."""

    def register(cls: type[T]) -> type[T]:
        _TAGS[cls] = tag
        setattr(cls, "TAG", tag)  # noqa: B010 - a class constant the type of a NamedTuple cannot declare
        return cls

    return register


def request_kind(tag: int, reply: type | None = None) -> Callable[[type[T]], type[T]]:
    """A request kind with wire tag `tag`, answered by a `reply` record (None: a plain msgpack value)."""

    def register(cls: type[T]) -> type[T]:
        message_kind(tag)(cls)
        _REPLIES[cls] = reply
        setattr(cls, "REPLY", reply)  # noqa: B010 - as TAG
        return cls

    return register


def tag_of(kind: type) -> int:
    return _TAGS[kind]


def reply_of(kind: type) -> type | None:
    """The reply record of a request kind (None: a plain value); KeyError for a kind that is no request."""
    return _REPLIES[kind]



@message_kind(1)
class RaftMessage(NamedTuple):
    """The Raft driver's batch for one peer (`hutch.cluster.raft_wire.PeerBatch`, already a wire value)."""

    payload: list[Any]


@message_kind(2)
class JoinReply(NamedTuple):
    raft_id: int
    members: list[list[Any]]  # Member.to_list() of every member


@request_kind(3, reply=JoinReply)
class Join(NamedTuple):
    """Register a node with the metadata leader (`promote`: make the registered node a voter)."""

    name: str
    host: str
    port: int
    promote: bool


@request_kind(4)
class Propose(NamedTuple):
    """Propose an encoded metadata entry at the leader. Reply: its Raft index (int)."""

    data: bytes


@request_kind(5)
class Leave(NamedTuple):
    """Forget a stopped member (at the metadata leader). Reply: the node's name (str)."""

    name: str


@message_kind(6)
class NodeStatus(NamedTuple):
    name: str
    alarms: list[str]
    running: bool
    raft_id: int


@request_kind(7, reply=NodeStatus)
class Status(NamedTuple):
    """A member's own status (cluster_status)."""


@request_kind(8)
class Sync(NamedTuple):
    """Wait (briefly) until the metadata is applied up to `index`. Reply: True if it is (bool)."""

    index: int  # type: ignore[assignment]  # the metadata index; shadows tuple.index, never called on a Sync


@message_kind(10)
class RemotePublish(NamedTuple):
    """A publish to a queue whose home is the receiving node; answered by `RemoteConfirm`."""

    vhost: str
    queue: str
    publish_id: int
    message: Message


@message_kind(11)
class RemoteConfirm(NamedTuple):
    """The home node's answer to publishes: enqueued (and synced when it had to be), or refused."""

    ok: bool
    publish_ids: list[int]


@message_kind(12)
class RemoteDeliver(NamedTuple):
    """A delivery from a queue's home node to the node of its consumer."""

    consumer_id: int
    delivery_id: int
    message: Message
    redelivered: bool
    no_ack: bool


@message_kind(100)
class RemotePublishBatch(NamedTuple):
    """One loop turn's publishes from the sender to queues whose home is the receiving node, in order:
    `entries` is flat, `PUBLISH_STRIDE` values per publish (vhost, queue, publish id, then the message's
    six wire fields as in `message_to_wire`); answered by `RemoteConfirm`s. Read with `publishes_of`."""

    entries: list[Any]


@message_kind(101)
class RemoteDeliverBatch(NamedTuple):
    """One loop turn's deliveries from queues of the sender to consumers on the receiving node, in order:
    `entries` is flat, `DELIVER_STRIDE` values per delivery (consumer id, delivery id, redelivered,
    no_ack, then the message's six wire fields). Read with `deliveries_of`."""

    entries: list[Any]


@message_kind(102)
class RemoteHold(NamedTuple):
    """Credit across the hop: the home's queue `queue` holds its publishers (`hold`), or lets them go; the
    receiving node holds (or releases) its own publishers to that queue (runtime/queue_types/remote.py)."""

    vhost: str
    queue: str
    hold: bool


@message_kind(103)
class LoopSaturated(NamedTuple):
    """The sender's event loop became saturated (`saturated`) or has time to spare again: between the
    workers of one node, so each judges its queues' backlogs as the one loop of a node would."""

    saturated: bool


@message_kind(104)
class RemoteConsumerPaused(NamedTuple):
    """The consumer's node: consumer `consumer_id`'s connection has a full write buffer (`paused`), or has
    room again; the home stops (or resumes) delivering to it, and its backlog rule sees a full socket."""

    consumer_id: int
    paused: bool


@request_kind(105)
class LimitAcquire(NamedTuple):
    """A worker asks the worker that counts the node's limited connections and channels (worker 0) for one
    more of each `wanted` row [kind, name, limit] (core/limits.py's kinds), as its request `request_id`.
    Reply: None (granted, counted until the sender's reports show it settled), or the first row refused,
    [kind, name, limit] (runtime/broker/limits.py)."""

    request_id: int
    wanted: list[list[Any]]


@message_kind(107)
class LimitReport(NamedTuple):
    """A worker's counts of some keys at one moment (`counts`: [kind, name, count] rows), the requests of
    `LimitAcquire` it has sent and not yet settled (`pending`), the id its next request will have
    (`next_id`) and its process's `incarnation` (its ids start again when it restarts)."""

    incarnation: int
    counts: list[list[Any]]
    pending: list[int]
    next_id: int


@request_kind(106, LimitReport)
class LimitQuery(NamedTuple):
    """Worker 0 asks another worker its counts of `keys` ([kind, name] rows) now. Reply: its
    `LimitReport`."""

    keys: list[list[Any]]


PUBLISH_STRIDE = 9
DELIVER_STRIDE = 10


class Outcome(enum.IntEnum):
    ACK = 0
    REQUEUE = 1
    DISCARD = 2


@message_kind(13)
class RemoteSettle(NamedTuple):
    """The consumer's node settles deliveries of the home node (ack, requeue, or reject/nack)."""

    outcome: int  # an Outcome
    delivery_ids: list[int]
    reason: str  # dead-letter reason of a discard ("" otherwise)


@message_kind(14)
class RemoteConsume(NamedTuple):
    """basic.consume on a queue of the receiving node, for a consumer on the sender."""

    vhost: str
    queue: str
    consumer_id: int
    tag: str
    no_ack: bool
    exclusive: bool
    prefetch: int
    priority: int
    arguments: list[Any]  # a stream's consume arguments: [key, value, value is a timestamp], ...


@message_kind(15)
class RemoteCancel(NamedTuple):
    """The consumer's node cancelled consumer `consumer_id`."""

    consumer_id: int


@message_kind(16)
class RemoteConsumerEnded(NamedTuple):
    """The home node ended consumer `consumer_id` (queue gone or deleted): basic.cancel to the client."""

    consumer_id: int


@message_kind(17)
class QueueStats(NamedTuple):
    """Counts of the sender's queues that changed: rows [vhost, queue, ready, unacked, consumers, bytes,
    published, delivered, acked, redelivered, get, dead-lettered, dropped, rejected] (the last three since
    issue 26's management suites under workers; a receiver takes rows without them)."""

    rows: list[list[Any]]


@message_kind(18)
class QueueGetReply(NamedTuple):
    counts: list[int]  # ready, unacked, consumers
    entry: list[Any] | None  # [delivery id, Message wire value, redelivered], or None when empty


@request_kind(19, reply=QueueGetReply)
class QueueGet(NamedTuple):
    """basic.get at the home node."""

    vhost: str
    queue: str
    no_ack: bool


@request_kind(20)
class QueuePurge(NamedTuple):
    """queue.purge at the home node. Reply: the count purged (int)."""

    vhost: str
    queue: str


@request_kind(21)
class QueueInfo(NamedTuple):
    """The counts of a queue at its home node. Reply: [ready, unacked, consumers], or None if no queue."""

    vhost: str
    queue: str


@message_kind(30)
class QuorumCommand(NamedTuple):
    """An encoded quorum-queue command (queues/quorum/commands.py) forwarded to the group's leader. A
    tracked one (`seq` > 0) is answered by the leader with `QuorumApplied(gid, [seq])` to `origin` once
    applied; a member that relays it passes `origin` and `seq` on (queues/quorum/client.py)."""

    gid: int
    command: bytes
    origin: str  # the node that made the command ("" for an untracked one)
    seq: int  # the origin's sequence number for it (0: untracked, nobody waits to hear it was applied)


@message_kind(31)
class QuorumDeliver(NamedTuple):
    """The leader's deliveries to a consumer on the receiving node: [msg id, payload, redelivered, count]."""

    gid: int
    consumer_id: int
    messages: list[list[Any]]


@message_kind(32)
class QuorumConfirm(NamedTuple):
    """The leader's confirms (`ok`) or rejections of a publisher's seqs; `incarnation` is the publisher's."""

    gid: int
    incarnation: str
    seqs: list[int]
    ok: bool


@message_kind(33)
class QuorumLeaderChanged(NamedTuple):
    """A new leader, told to a node with consumers that is not a member (it sees no leader change)."""

    gid: int


@message_kind(40)
class QuorumApplied(NamedTuple):
    """The leader applied these tracked commands (`QuorumCommand.seq`) of the receiving node: it stops
    resending them, and learns the sender as the queue's leader (`leader_hint`)."""

    gid: int
    seqs: list[int]


@message_kind(34)
class QuorumGetReply(NamedTuple):
    ready: int
    message: list[Any] | None  # [msg id, payload, redelivered, delivery count], or None when empty


@request_kind(35, reply=QuorumGetReply)
class QuorumGet(NamedTuple):
    """basic.get at the leader, for a getter on `node`."""

    gid: int
    no_ack: bool
    node: str


@request_kind(36)
class QuorumPurge(NamedTuple):
    """queue.purge at the leader. Reply: the count purged (int)."""

    gid: int


@request_kind(37)
class QuorumInfo(NamedTuple):
    """The leader's counts. Reply: [ready, unacked, consumers, bytes, ...] (QuorumQueue._state_counts)."""

    gid: int


@request_kind(38)
class QuorumMember(NamedTuple):
    """Add (`add`) or remove member `node` at the leader. Reply: True (bool)."""

    gid: int
    node: str
    add: bool


@request_kind(39)
class QuorumCancel(NamedTuple):
    """Cancel consumer (`node`, `consumer_id`) at the leader, committed before the reply. Reply: True."""

    gid: int
    node: str
    consumer_id: int


@request_kind(50)
class QuorumLocalView(NamedTuple):
    """A member's own view of a quorum queue's group (mgmt/quorum.py). Reply: a JSON-able dict."""

    gid: int


@request_kind(51)
class QuorumTransfer(NamedTuple):
    """Hand the leadership of a quorum queue to member `to` (at the leader). Reply: True."""

    gid: int
    to: str


@request_kind(52)
class NodeInfo(NamedTuple):
    """A node's `node_info` (GET /api/nodes on another node). Reply: a JSON-able dict."""


@message_kind(53)
class LimitCounts(NamedTuple):
    """The sender's open connections and channels of every vhost and user with a connection or channel
    limit, all of them (each replaces the previous): rows [kind, name, count] (core/limits.py)."""

    rows: list[list[Any]]


@request_kind(90)
class LinkStatus(NamedTuple):
    """The dynamic shovels (`what` "shovels") or federation links ("federation") a node runs, of `vhost`
    ("" for all), as GET /api/shovels and /api/federation-links list them. Reply: a JSON-able list."""

    what: str
    vhost: str


@message_kind(60)
class StreamReplica(NamedTuple):
    """A stream replica protocol message between members of stream group `gid`
    (hutch.cluster.stream_replica.message_to_wire's list: Hello, Start, Chunks, Ack, ...)."""

    gid: int
    message: list[Any]


@message_kind(61)
class StreamPropose(NamedTuple):
    """An encoded stream coordinator command (hutch.cluster.stream_coordinator.encode_command) forwarded to
    the leader of stream group `gid`'s Raft group."""

    gid: int
    command: bytes


@request_kind(62)
class StreamAppend(NamedTuple):
    """Publishes to replicated stream `gid` from another node, for its writer: `entries` (each the AMQP 1.0
    encoding of a message, as streams store them) written as chunks, with their filter values (None: no
    value; `filters` None: none has one). Reply: True once a majority of the members has them (an error
    reply when this node does not write the stream or the majority does not come)."""

    gid: int
    entries: list[bytes]
    filters: list[bytes | None] | None


@request_kind(63)
class StreamEndpoint(NamedTuple):
    """The host and port of a node's stream protocol listener (the stream protocol's metadata names each
    member's). Reply: [host, port]; [] while it has none yet (its listener is not up: ask again); False
    when it has no stream listener at all (configured without one)."""


@request_kind(64)
class StreamMember(NamedTuple):
    """At the leader of stream group `gid`'s Raft group: add (`add`) or remove member `node` (the Raft voter
    and the stream's member, StreamReplicationService.add_member / delete_member). Reply: True."""

    gid: int
    node: str
    add: bool


@request_kind(65)
class StreamPublish(NamedTuple):
    """A stream-protocol publisher's publishes to replicated stream `gid` from a node that does not write
    it, for its writer (as RabbitMQ's stream reader writes to the leader's osiris process on its node):
    `data` the entries framed as a chunk's data section (simple entries and sub-batches, as
    hutch.queues.stream.chunk.encode_entries frames them), one publishing id per entry in `ids`,
    `reference` the publisher's reference (b"": none; with one, ids at or below the reference's last
    stored one are not stored again), `filters` the entries' filter values (None: none has one). Reply:
    True once a majority of the members has what was stored (an error reply when this node does not
    write the stream, the data is malformed or the majority does not come)."""

    gid: int
    data: bytes
    ids: list[int]
    reference: bytes
    filters: list[bytes | None] | None


@message_kind(66)
class StreamSacUpdate(NamedTuple):
    """A single-active-consumer member on the sending node, to the node its group lives on (the stream's
    writer's; runtime/stream_session/sac_router.py): `op` 0 joins (`partition_index`, `subscription_id`,
    `connection` for listing; `active`: it is reading already), 1 leaves, 2 says its client answered a
    deactivation, 3 joins a group that moved there with the writer (not activated at once unless
    `active`). `member_id` names the member on the sending node."""

    op: int
    vhost: str
    stream: str
    name: str
    partition_index: int
    member_id: int
    subscription_id: int
    connection: str
    active: bool


@message_kind(67)
class StreamSacNotify(NamedTuple):
    """From the node a single-active-consumer group lives on to a member's node: member `member_id` of
    group (`vhost`, `stream`, `name`) is now active (`active`), or told inactive (`stepping_down`: it is
    to answer before the next one is activated); its client gets a ConsumerUpdate."""

    vhost: str
    stream: str
    name: str
    member_id: int
    active: bool
    stepping_down: bool


@message_kind(68)
class StreamStoreOffset(NamedTuple):
    """A consumer's stored offset for replicated stream `gid`, from a member that does not write it, for its
    writer (as RabbitMQ writes the tracking through the leader): `reference` the consumer name, `offset`.
    No reply (the stream protocol's store offset has none)."""

    gid: int
    reference: bytes
    offset: int


@request_kind(69)
class StreamLookup(NamedTuple):
    """From a node that is not a member of replicated stream `gid`, to a member (the stream protocol's
    metadata, query offset and query publisher sequence answer from every node, as RabbitMQ's do): `what`
    is "writer" (reply: the writer's node, "" while one is elected), "offset" (reply: [the offset stored
    for consumer `reference`], [] if none) or "sequence" (reply: the last publishing id of publisher
    `reference`, 0 if none). Reply None: the stream is not (or not yet) open on the member asked."""

    gid: int
    what: str
    reference: bytes


@message_kind(70)
class DirectReply(NamedTuple):
    """A reply published to a Direct Reply-To address whose requester is on the receiving node (another
    worker of the same node, or another node): delivered to the requester's channel, or dropped as
    RabbitMQ drops a reply to a requester that is gone (core/direct_reply.py)."""

    token: str
    message: Message


@request_kind(110)
class AgentQuery(NamedTuple):
    """A question to (or a command for) another worker's management agent (runtime/ports.py's
    `ManagementAgentPort`): `method` one of its methods, `args` their arguments as plain values
    (runtime/agent_link.py checks both). Reply: the agent's plain answer."""

    method: str
    args: list[Any]


@request_kind(131)
class BlockPeers(NamedTuple):
    """Fault injection (tests, `cluster.fault_injection`) in a node of workers: worker 0, which answers the
    management API, tells its other workers to block (or unblock) these members too, so that a node is cut
    off from a node as a whole. Reply: True."""

    names: list[str]
    blocked: bool


# 140-149: a stream's one copy in a node of workers, read and written from the node's other workers
# (runtime/stream_session/home_link.py: the copy's worker is the stream's "home")


@message_kind(140)
class StreamReadOpen(NamedTuple):
    """A subscription on the sender, of a stream whose only copy on this node of workers is the receiver's:
    read it from `offset_type`/`offset_value` (the stream protocol's offset specification: OffsetType's
    numbers), with `credit` chunks to send, filtered by `filters` (none: every chunk) and
    `match_unfiltered`. The receiver answers with `StreamReadChunks`, or `StreamReadEnd` if it cannot."""

    reader_id: int
    vhost: str
    stream: str
    offset_type: int
    offset_value: int
    credit: int
    filters: list[bytes]
    match_unfiltered: bool


@message_kind(141)
class StreamReadChunks(NamedTuple):
    """Chunks for reader `reader_id`, each as the stream protocol delivers it (the chunk's header and its
    data, without the bloom filter or the trailer), and the stream's committed chunk id as they were
    sent. Each one took a credit."""

    reader_id: int
    chunks: list[bytes]
    committed: int


@message_kind(142)
class StreamReadCredit(NamedTuple):
    """More credit (chunks) for reader `reader_id`, as its client gave it."""

    reader_id: int
    credit: int


@message_kind(143)
class StreamReadEnd(NamedTuple):
    """Reader `reader_id` is over: from its subscription's worker (unsubscribed, its connection closed;
    `code` 0), or from the stream's home (`code` a stream protocol code: the stream is gone or cannot be
    read; the subscription's client is told)."""

    reader_id: int
    code: int


@request_kind(144)
class StreamHomePublish(NamedTuple):
    """A stream-protocol publisher's publishes to stream `stream` of vhost `vhost`, whose only copy on this
    node of workers is the receiver's: the fields after `stream` as `StreamPublish`'s. Reply: True once
    what was stored is committed (an error reply if the stream is not here or the data is malformed)."""

    vhost: str
    stream: str
    data: bytes
    ids: list[int]
    reference: bytes
    filters: list[bytes | None] | None


@message_kind(145)
class StreamHomeOffset(NamedTuple):
    """A consumer's stored offset (`reference`, `offset`) for stream `stream` of vhost `vhost`, whose only
    copy on this node of workers is the receiver's. No reply, as the stream protocol's store offset has
    none."""

    vhost: str
    stream: str
    reference: bytes
    offset: int


@request_kind(146)
class StreamHomeStats(NamedTuple):
    """The stream protocol's stream stats of stream `stream` of vhost `vhost`, whose only copy on this node
    of workers is the receiver's. Reply: [first chunk id (-1 for an empty stream), committed chunk id], or
    None if the stream is not open (or not available) there."""

    vhost: str
    stream: str


@request_kind(147)
class StreamHomeResolve(NamedTuple):
    """The stream protocol's resolve offset spec of `offset_type`/`offset_value` (OffsetType's numbers) in
    stream `stream` of vhost `vhost`, whose only copy on this node of workers is the receiver's. Reply: the
    offset a reader attached there would read next, or None if the stream is not open (or not available)
    there."""

    vhost: str
    stream: str
    offset_type: int
    offset_value: int


@request_kind(148)
class StreamConsumerInfo(NamedTuple):
    """From a node (or worker) with AMQP 0-9-1 consumers of stream `queue` of vhost `vhost` whose copy is
    the receiver's (consumed through a stand-in, `RemoteConsume`): where consumers `consumer_ids` (the
    sender's ids) read, for management. Reply: [[consumer id, {"offset", "offset_lag", "credits"}], ...]
    for those the receiver holds."""

    vhost: str
    queue: str
    consumer_ids: list[int]

# 150-153: compaction of load in a node of workers (runtime/compaction.py, docs/scaling.md)


@message_kind(150)
class CompactReport(NamedTuple):
    """A worker's report to worker 0, which hosts the compaction controller (core/compaction.py), every
    second: its loop's busy share in millionths of a core, whether its loop is saturated, the messages
    its queues moved per second, and its islands, flat: [queue ("vhost/name"), msg/s, movable] each."""

    worker: int
    busy_ppm: int
    saturated: bool
    msgs_per_s: int
    islands: list[Any]


@request_kind(151)
class CompactMove(NamedTuple):
    """From worker 0 (the controller, or its test hook) to the worker that holds queue `queue` of vhost
    `vhost`: move its island to worker `target` (an index of this node's workers). Reply: True when the
    queue's record names the target now, False when it stayed (nothing was lost either way)."""

    vhost: str
    queue: str
    target: int


@request_kind(152)
class CompactCommit(NamedTuple):
    """From the worker a queue is moving to, to the worker it moves from, once it holds the queue and before
    it proposes the record naming itself: may it? Reply: True (the sender then proposes, and the old home
    no longer gives the move up unless the sender dies), or False (the move was given up: the sender
    drops its copy and closes the island's connections with 320)."""

    vhost: str
    queue: str



@message_kind(153)
class QueueMoved(NamedTuple):
    """A queue's marker across its move (queue_types/remote_moves.py, core/move_order.py): worker (or node)
    `origin`, applying the record that names `home` as queue `queue`'s home, sends it to the queue's old
    home behind its last publish there; the old home forwards it to `home` behind everything of `origin`'s
    it held or relayed, and `home` then takes `origin`'s direct publishes, which it kept behind. Sent to
    `home` directly when the old home is unreachable."""

    vhost: str
    queue: str
    origin: str
    home: str

Record: TypeAlias = (
    RaftMessage | JoinReply | Join | Propose | Leave | NodeStatus | Status | Sync
    | RemotePublish | RemoteConfirm | RemoteDeliver | RemoteSettle | RemoteConsume | RemoteCancel | RemoteConsumerEnded
    | RemotePublishBatch | RemoteDeliverBatch | RemoteHold | LoopSaturated | RemoteConsumerPaused
    | LimitAcquire | LimitQuery | LimitReport | QueueStats | QueueGetReply | QueueGet | QueuePurge | QueueInfo
    | QuorumCommand | QuorumDeliver | QuorumConfirm | QuorumLeaderChanged | QuorumApplied | QuorumGetReply | QuorumGet | QuorumPurge
    | QuorumInfo | QuorumMember | QuorumCancel | QuorumLocalView | QuorumTransfer | NodeInfo | LimitCounts | LinkStatus
    | StreamReplica | StreamPropose | StreamAppend | StreamEndpoint | StreamMember | StreamPublish | StreamSacUpdate
    | StreamSacNotify | StreamStoreOffset | StreamLookup | DirectReply | AgentQuery | BlockPeers
    | StreamReadOpen | StreamReadChunks | StreamReadCredit | StreamReadEnd | StreamHomePublish | StreamHomeOffset
    | StreamHomeStats | StreamHomeResolve | StreamConsumerInfo | CompactReport | CompactMove | CompactCommit
    | QueueMoved
)
"""Every record kind that travels between nodes, as one type (what `send` and the codec take)."""

Request: TypeAlias = (
    Join | Propose | Leave | Status | Sync | QueueGet | QueuePurge | QueueInfo
    | QuorumGet | QuorumPurge | QuorumInfo | QuorumMember | QuorumCancel | QuorumLocalView | QuorumTransfer | NodeInfo
    | LinkStatus | StreamAppend | StreamEndpoint | StreamMember | StreamPublish | StreamLookup | AgentQuery | LimitAcquire
    | LimitQuery | BlockPeers | StreamHomePublish | StreamHomeStats | StreamHomeResolve
    | StreamConsumerInfo | CompactMove | CompactCommit
)
"""Every request kind (sent with the transport's `call`, answered by its `REPLY` record or a plain value)."""

RECORDS: tuple[type, ...] = typing.get_args(Record)
"""Every record kind that travels between nodes (`Record`'s members, in tag order)."""

if set(typing.get_args(Request)) != set(_REPLIES) or not set(_REPLIES) <= set(RECORDS):
    raise AssertionError("Request must name exactly the request kinds, and Record every kind")

# -- Message fields --------------------------------------------------------------------------------------


def message_to_wire(msg: Message) -> tuple[Any, ...]:
    """A message as it travels: bytes-like fields are packed as they are (no copies)."""
    return (msg.exchange, msg.routing_key, msg.properties_raw, msg.body, msg.route_tail, msg.foreign_deaths)


def message_from_wire(v: Any) -> Message:
    if type(v) is not list or len(v) != 6 or type(v[0]) is not str or type(v[1]) is not str \
            or type(v[2]) is not bytes or type(v[3]) is not bytes or type(v[4]) is not bytes:
        raise MalformedMessage(f"a message must be [exchange, routing_key, properties, body, route_tail, "
                               f"foreign_deaths], got {_short(v)}")
    msg = Message(v[0], v[1], None, v[3], v[2], v[4])
    if v[5]:
        msg.foreign_deaths = True
    return msg


def _message_at(v: list[Any], i: int, kind: str) -> Message:
    """The message whose six wire fields start at `v[i]` (a batch record's entry)."""
    exchange, routing_key, props, body, tail = v[i], v[i + 1], v[i + 2], v[i + 3], v[i + 4]
    if type(exchange) is not str or type(routing_key) is not str or type(props) is not bytes \
            or type(body) is not bytes or type(tail) is not bytes:
        raise MalformedMessage(f"malformed inter-node message {kind}: the message at {i} is "
                               f"{_short(v[i:i + 6])}")
    msg = Message(exchange, routing_key, None, body, props, tail)
    if v[i + 5]:
        msg.foreign_deaths = True
    return msg


def _check_stride(v: list[Any], stride: int, kind: str) -> None:
    if len(v) % stride:
        raise MalformedMessage(f"malformed inter-node message {kind}: {len(v)} values is not a multiple of "
                               f"{stride}")


def publishes_of(batch: RemotePublishBatch) -> list[tuple[str, str, int, Message]]:
    """(vhost, queue, publish id, message) of each publish of `batch`, in order; `MalformedMessage` (and
    nothing of the batch) when any of them is malformed."""
    v = batch.entries
    _check_stride(v, PUBLISH_STRIDE, "RemotePublishBatch")
    out = []
    for i in range(0, len(v), PUBLISH_STRIDE):
        vhost, queue, pid = v[i], v[i + 1], v[i + 2]
        if type(vhost) is not str or type(queue) is not str or type(pid) is not int:
            raise MalformedMessage(f"malformed inter-node message RemotePublishBatch: publish at {i} is "
                                   f"{_short(v[i:i + 3])}")
        out.append((vhost, queue, pid, _message_at(v, i + 3, "RemotePublishBatch")))
    return out


def deliveries_of(batch: RemoteDeliverBatch) -> list[tuple[int, int, bool, bool, Message]]:
    """(consumer id, delivery id, redelivered, no_ack, message) of each delivery of `batch`, in order;
    `MalformedMessage` (and nothing of the batch) when any of them is malformed."""
    v = batch.entries
    _check_stride(v, DELIVER_STRIDE, "RemoteDeliverBatch")
    out = []
    for i in range(0, len(v), DELIVER_STRIDE):
        cid, did, redelivered, no_ack = v[i], v[i + 1], v[i + 2], v[i + 3]
        if type(cid) is not int or type(did) is not int or type(redelivered) is not bool \
                or type(no_ack) is not bool:
            raise MalformedMessage(f"malformed inter-node message RemoteDeliverBatch: delivery at {i} is "
                                   f"{_short(v[i:i + 4])}")
        out.append((cid, did, redelivered, no_ack, _message_at(v, i + 4, "RemoteDeliverBatch")))
    return out


# -- the codec -------------------------------------------------------------------------------------------

_CHECKS: dict[Any, str] = {
    int: "type({x}) is int", str: "type({x}) is str", bytes: "type({x}) is bytes",
    bool: "type({x}) is bool", list: "type({x}) is list",
}


def _check_of(annotation: Any, x: str) -> str | None:
    """The check expression of one field (None: anything goes), from its annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(annotation)
        parts = [f"{x} is None" if a is type(None) else _check_of(a, x) for a in args]
        return None if None in parts else "(" + " or ".join(p for p in parts if p) + ")"
    base = origin or annotation
    if base is Any:
        return None
    return _CHECKS[base].format(x=x)


def _compile(cls: type) -> tuple[Callable[[Any], Any], Callable[[list[Any]], Any]]:
    """The encoder (record -> wire value) and decoder (wire value -> record) of one record kind, generated
    from its fields, like dataclasses generates __init__ (a per-field loop costs several times more)."""
    hints = typing.get_type_hints(cls)
    fields: tuple[str, ...] = getattr(cls, "_fields")  # noqa: B009 - every record is a NamedTuple
    tag = _TAGS[cls]
    names = [f"a{i}" for i in range(len(fields))]
    enc = [f"_mw(r[{i}])" if hints[f] is Message else f"r[{i}]" for i, f in enumerate(fields)]
    env: dict[str, Any] = {"_mw": message_to_wire, "_mr": message_from_wire, "_new": tuple.__new__, "_cls": cls,
                           "_bad": _bad, "_n": len(fields) + 1}
    lines = [f"def encode(r):\n    return ({tag}, {''.join(e + ', ' for e in enc)})",
             "def decode(v):",
             "    if len(v) != _n:",
             "        raise _bad(_cls, v, None)"]
    if names:
        lines.append(f"    _, {', '.join(names)} = v")
    for name, f in zip(names, fields, strict=True):
        if hints[f] is Message:
            lines.append(f"    {name} = _mr({name})")
            continue
        check = _check_of(hints[f], name)
        if check is not None:
            lines.append(f"    if not {check}:\n        raise _bad(_cls, v, {f!r})")
    lines.append(f"    return _new(_cls, ({''.join(n + ', ' for n in names)}))")
    exec("\n".join(lines), env)  # noqa: S102 - code generated from our own record definitions only
    return env["encode"], env["decode"]


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 200 else text[:200] + "..."


def _bad(cls: type, v: Any, field: str | None) -> MalformedMessage:
    fields: tuple[str, ...] = getattr(cls, "_fields")  # noqa: B009 - every record is a NamedTuple
    if field is None:
        return MalformedMessage(f"malformed inter-node message {cls.__name__}: expected "
                                f"{len(fields)} fields, got {len(v) - 1}")
    i = fields.index(field) + 1
    return MalformedMessage(f"malformed inter-node message {cls.__name__}: field {field!r} is "
                            f"{type(v[i]).__name__} {_short(v[i])}")


_ENCODERS: dict[type, Callable[[Any], Any]] = {}
_DECODERS: dict[int, Callable[[list[Any]], Any]] = {}
for _cls in RECORDS:
    if _TAGS[_cls] in _DECODERS:
        raise AssertionError(f"two records with tag {_TAGS[_cls]}")
    _ENCODERS[_cls], _DECODERS[_TAGS[_cls]] = _compile(_cls)
del _cls

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def is_record(value: object) -> TypeGuard[Record]:
    return type(value) in _ENCODERS


def to_wire(record: Record) -> tuple[Any, ...]:
    """The msgpack-able value of a record: `(TAG, field, ...)`."""
    try:
        return _ENCODERS[type(record)](record)
    except KeyError:
        raise TypeError(f"not an inter-node message record: {type(record).__name__}") from None


def from_wire(value: Any) -> Record:  # Any: a msgpack value from a peer, checked here
    """The record a received wire value holds; `MessageError` if it holds none."""
    if type(value) is not list or not value:
        raise MalformedMessage(f"an inter-node message must be a non-empty array, got {_short(value)}")
    tag = value[0]
    decoder = _DECODERS.get(tag) if type(tag) is int else None
    if decoder is None:
        raise UnknownMessage(f"unknown inter-node message kind {_short(value[0])}")
    return decoder(value)


def encode(record: Record) -> bytes:
    return _pack(to_wire(record))


def decode(data: bytes | memoryview) -> Record:
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ValueError subclasses, TypeError, ...
        raise MalformedMessage(f"undecodable inter-node message ({type(exc).__name__}: {exc})") from None
    return from_wire(value)


def reply_from_wire(request: Request, value: Any) -> Any:  # Any: a reply record or a plain msgpack value
    """The reply to `request` as its `REPLY` record, or the plain value for a request without one."""
    kind = _REPLIES[type(request)]
    if kind is None:
        return value
    record = from_wire(value)
    if type(record) is not kind:
        raise MalformedMessage(f"reply to {type(request).__name__} is {type(record).__name__}, not {kind.__name__}")
    return record


# -- the dispatch table ----------------------------------------------------------------------------------

R = TypeVar("R", bound=Record)


class Registry:
    """One handler per record kind; `handle` decodes a wire value and calls its kind's handler with
    (peer, record). A handler of a request returns the reply (a record, a plain value, or an awaitable)."""

    __slots__ = ("_handlers",)

    def __init__(self) -> None:
        self._handlers: dict[type, Callable[[str, Any], Any]] = {}

    def register(self, kind: type[R], handler: Callable[[str, R], Any]) -> None:
        if kind not in _ENCODERS:
            raise TypeError(f"not an inter-node message record: {kind.__name__}")
        if kind in self._handlers:
            raise ValueError(f"a handler for {kind.__name__} is already registered")
        self._handlers[kind] = handler

    def registered(self, kind: type) -> bool:
        return kind in self._handlers

    def handle(self, peer: str, value: Any) -> Any:  # Any: a wire value from a peer in, the handler's reply out
        """Decode `value` and call its handler; `MessageError` for an unknown or malformed message."""
        return self.handle_record(peer, from_wire(value))

    def handle_record(self, peer: str, record: Record) -> Any:  # Any: the handler's reply, open by kind
        handler = self._handlers.get(type(record))
        if handler is None:
            raise UnknownMessage(f"no handler for inter-node message {type(record).__name__} on this node")
        return handler(peer, record)


__all__ = [
    "RECORDS", "MalformedMessage", "MessageError", "Outcome", "Record", "Registry", "Request", "UnknownMessage",
    "DELIVER_STRIDE", "PUBLISH_STRIDE", "decode", "deliveries_of", "encode",
    "from_wire", "is_record", "message_from_wire", "message_to_wire", "reply_from_wire", "publishes_of", "to_wire",
    *(cls.__name__ for cls in RECORDS),
]
