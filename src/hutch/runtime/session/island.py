"""Compaction of load, the session's half: which of a connection's state belongs to an island, and how it moves.

Owns: `IslandScan` (a worker's islands, for the controller's reports: which connections use only one
queue, how fast each queue moves messages, and whether it could move), `island_reason` (why an open
connection cannot move now with the queue it uses, or None),
`island_channels` (its channels' consumers and unacked deliveries, as they move), `restore_island`
(the adopting side: consumers attached and deliveries held again, before any unread frame), and
`IslandConnection` (a connection's `HandoverState`, runtime/session/handover.py, plus per channel its
consumers — tag, no_ack, exclusive, prefetch, priority, arguments, how many it was handed — and its
unacked deliveries, delivery tag -> the queue entry's sequence number and the consumer's tag) with its
one codec. An **island** is a queue and the connections of its home worker that use only that queue
(docs/scaling.md, "Compaction of load"); the queue's side is queues/classic/transfer.py, the
controller core/compaction.py.

Rules:
- A connection of an island uses one queue: every consumer and every unacked delivery of every channel
  is that queue's (a `basic.get` delivery too). Direct Reply-To, a transaction, an exclusive queue of its
  own and an alarm or flow block make it not movable.
- What waits is not refused: unconfirmed publishes, a write buffer not yet flushed, a publish whose
  content is still arriving and a channel closing are the move's to wait for (`AMQPConnection.hold_island`:
  reading goes on until a message is whole, then is held, and no publish is begun whose content is not
  wholly buffered), so `island_reason` names them apart (`WAIT_REASONS`).
- The delivery tags continue: each channel's `next_tag` travels in its `ChannelState`, and every
  unacked delivery keeps its tag, so an ack of a tag delivered before the move settles it after.
- A decoded state is checked whole before anything is built: tags unique, ascending and below the
  channel's next tag; consumer tags unique per channel; a delivery's consumer one of its channel's (or
  "" for a `basic.get`); every channel one of the connection's. A malformed state is a ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hutch.amqp.table import encode_table
from hutch.core.compaction import Island
from hutch.core.queue_type import Consumer, Queue, QueueEntry
from hutch.queues.classic.queue import ClassicQueue
from hutch.queues.classic.transfer import not_movable
from hutch.runtime.session.channel import _Unacked
from hutch.runtime.session.handover import (
    HandoverState,
    MovableConnection,
    blocked_reason,
    decode_state_table,
    owns_exclusive,
    pack_state,
    unpack_record,
)

VERSION = 1
MAX_ISLAND_CONNECTIONS = 15  # runtime/workers/island.py's MAX_CONNECTIONS: what one control message carries
# the move waits for these (reading goes on until the content is whole and the close-ok has come), then
# judges again
WAIT_REASONS = frozenset({"unconfirmed publishes", "busy", "unfinished content", "a channel closing"})


@dataclass
class ConsumerState:
    tag: str
    no_ack: bool
    exclusive: bool
    prefetch: int
    priority: int = 0
    arguments: dict[str, Any] = field(default_factory=dict)
    delivered: int = 0

    def wire(self) -> list[Any]:
        return [self.tag, self.no_ack, self.exclusive, self.prefetch, self.priority, encode_table(self.arguments),
                self.delivered]

    @classmethod
    def from_wire(cls, v: Any) -> ConsumerState:  # Any: a msgpack value, checked here
        if not isinstance(v, list) or len(v) != 7:
            raise ValueError("a consumer's state is a list of 7")
        tag, no_ack, exclusive, prefetch, priority, arguments, delivered = v
        if not isinstance(tag, str) or not tag or len(tag.encode()) > 255:
            raise ValueError("malformed consumer state: tag")
        if type(no_ack) is not bool or type(exclusive) is not bool or not isinstance(arguments, bytes):
            raise ValueError("malformed consumer state: flags")
        if type(prefetch) is not int or not 0 <= prefetch <= 65535 or type(priority) is not int \
                or not -2**31 <= priority < 2**31 or type(delivered) is not int or not 0 <= delivered < 2**63:
            raise ValueError("malformed consumer state: numbers")
        args = decode_state_table(arguments, "consumer state: arguments")
        return cls(tag, no_ack, exclusive, prefetch, priority, args, delivered)


@dataclass
class ChannelIsland:
    number: int
    consumers: list[ConsumerState] = field(default_factory=list)
    deliveries: list[tuple[int, int, str]] = field(default_factory=list)  # (delivery tag, seq, consumer tag)

    def wire(self) -> list[Any]:
        return [self.number, [c.wire() for c in self.consumers], [v for d in self.deliveries for v in d]]


@dataclass
class IslandConnection:
    queue: str  # the island's queue (in the connection's vhost)
    connection: HandoverState
    channels: list[ChannelIsland] = field(default_factory=list)

    def encode(self) -> bytes:
        return pack_state([VERSION, self.queue, self.connection.encode(), [c.wire() for c in self.channels]])

    @classmethod
    def decode(cls, data: bytes) -> IslandConnection:
        """The state `encode` made; ValueError if it is not one (or too large)."""
        _, queue, conn, channels = unpack_record(data, "island connection", 4, VERSION)
        if not isinstance(queue, str) or not isinstance(conn, bytes) or not isinstance(channels, list):
            raise ValueError("malformed island connection state")
        connection = HandoverState.decode(conn)
        next_tags = {c.number: c.next_tag for c in connection.channels}
        out = [_channel_from_wire(c, next_tags) for c in channels]
        if len({c.number for c in out}) != len(out):
            raise ValueError("malformed island connection state: a channel twice")
        return cls(queue, connection, out)


def _channel_from_wire(v: Any, next_tags: dict[int, int]) -> ChannelIsland:  # Any: a msgpack value
    if not isinstance(v, list) or len(v) != 3 or not isinstance(v[1], list) or not isinstance(v[2], list):
        raise ValueError("malformed island channel state")
    number, consumers, flat = v
    if number not in next_tags:
        raise ValueError(f"malformed island channel state: channel {number!r} is not the connection's")
    states = [ConsumerState.from_wire(c) for c in consumers]
    tags = {c.tag for c in states}
    if len(tags) != len(states):
        raise ValueError("malformed island channel state: a consumer tag twice")
    if len(flat) % 3:
        raise ValueError("malformed island channel state: deliveries")
    deliveries = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
    last = 0
    for tag, seq, consumer in deliveries:
        if type(tag) is not int or type(seq) is not int or not isinstance(consumer, str) \
                or not last < tag < next_tags[number] or not 0 < seq < 2**63 or (consumer and consumer not in tags):
            raise ValueError(f"malformed island channel state: delivery {tag!r}")
        last = tag
    if len({seq for _t, seq, _c in deliveries}) != len(deliveries):
        raise ValueError("malformed island channel state: a message delivered twice")
    return ChannelIsland(number, states, deliveries)


def island_reason(conn: MovableConnection, queue: Any) -> str | None:  # Any: core's Queue
    """Why `conn` cannot move now with `queue`, or None. The reasons in `WAIT_REASONS` pass with time
    (the move waits for them); the others make the connection, and so the island, not movable."""
    reason = blocked_reason(conn)
    if reason is not None:
        return reason
    for ch in conn.channels.values():
        if ch.reply_consumer is not None or ch.reply_token is not None:
            return "Direct Reply-To"
        if ch.tx or ch.tx_ops:
            return "a transaction"
        if ch.content_in_progress():
            return "unfinished content"
        if any(c.queue is not queue for c in ch.consumers.values()):
            return "consumers of another queue"
        if any(u.queue is not queue for u in ch.unacked.values()):
            return "deliveries of another queue"
    if owns_exclusive(conn):
        return "exclusive queues"
    for ch in conn.channels.values():
        if ch.confirms is not None and ch.confirms.unanswered:
            return "unconfirmed publishes"
    if conn.state_is_busy():
        return "busy"
    return None


def island_channels(channels: dict[int, Any]) -> list[ChannelIsland]:  # Any: ServerChannel
    """What moves of an island connection's channels beyond their `ChannelState`s: consumers and unacked
    deliveries (tag order), in channel order. Call after `island_reason` said None."""
    out = []
    for n, ch in sorted(channels.items()):
        consumers = [ConsumerState(c.tag, c.no_ack, c.exclusive, c.prefetch, c.priority, dict(c.arguments or {}),
                                   c.delivered) for c in ch.consumers.values()]
        live = ch.consumers
        # a delivery of a consumer cancelled since settles as a basic.get's does: by its tag alone
        deliveries = [(tag, u.entry.seq, u.consumer.tag if u.consumer is not None and live.get(u.consumer.tag)
                       is u.consumer else "") for tag, u in sorted(ch.unacked.items())]
        if consumers or deliveries:
            out.append(ChannelIsland(n, consumers, deliveries))
    return out


def restore_island(conn: Any, queue: Queue, channels: list[ChannelIsland],  # Any: the adopted AMQPConnection
                   entries: dict[int, QueueEntry]) -> None:
    """On the adopting worker, after the connection was adopted from its `HandoverState` (its channels
    open, numbered as they were) and before it handles any unread frame: every channel's unacked
    deliveries held again under their tags (`entries`: the moved queue's unacked entries by seq,
    queues/classic/transfer.py's `import_queue`), then its consumers attached to `queue`, which starts
    delivering to them. ValueError (nothing attached) when a channel or an entry is missing."""
    for isle in channels:
        if isle.number not in conn.channels:
            raise ValueError(f"channel {isle.number} was not adopted")
        for _tag, seq, _c in isle.deliveries:
            if seq not in entries:
                raise ValueError(f"delivery of message {seq} has no entry in queue '{queue.name}'")
    attached: list[Consumer] = []
    for isle in channels:
        ch = conn.channels[isle.number]
        by_tag: dict[str, Consumer] = {}
        for cs in isle.consumers:
            consumer = Consumer(cs.tag, ch, queue, cs.no_ack, cs.exclusive, cs.prefetch, cs.priority,
                                cs.arguments)
            consumer.delivered = cs.delivered
            by_tag[cs.tag] = ch.consumers[cs.tag] = consumer
            attached.append(consumer)
        for tag, seq, ctag in isle.deliveries:
            owner = by_tag.get(ctag) if ctag else None
            ch.unacked[tag] = _Unacked(queue, entries[seq], owner)
            if owner is not None:
                owner.unacked += 1
    for consumer in attached:
        queue.add_consumer(consumer)


def queues_used(conn: Any) -> set[int]:  # Any: an AMQPConnection
    """The ids of the queues `conn` uses now: its consumers', its unacked deliveries', and those each
    channel's last routed publish reached (`last_routed`: a publisher that alternates between queues
    may be seen using one of them; a wrong guess only costs hops after a move, never correctness:
    consumers and deliveries are what a move must carry, and those are exact)."""
    used: set[int] = set()
    for ch in conn.channels.values():
        used.update(id(c.queue) for c in ch.consumers.values())
        used.update(id(u.queue) for u in ch.unacked.values() if u.queue is not None)
        used.update(id(q) for q in ch.last_routed)
    return used


class IslandScan:
    """A worker's islands as the controller sees them (core/compaction.py's `Island`), scanned once per
    report (O(connections + channels + queues)), never on the message path. A queue's rate is its
    messages published and delivered since the last scan, per second of `now` (monotonic seconds)."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self._last: dict[str, tuple[float, int]] = {}  # vhost/queue -> (time, published + delivered) at the last scan

    def scan(self, now: float, connections: Any, queues: list[Queue]) -> tuple[list[Island], dict[str, list[Any]]]:
        """The islands of `queues` (this worker's own, by `vhost/name`) and, for each, the connections that
        use only it. Movable: a classic queue that `not_movable` lets go, every consumer of it a local
        connection's, 1 to `MAX_ISLAND_CONNECTIONS` connections, none of them kept (`island_reason`
        None or a wait)."""
        by_id = {id(q): q for q in queues}
        members: dict[int, list[Any]] = {}
        for conn in connections:
            used = queues_used(conn)
            if len(used) == 1:
                (qid,) = used
                if qid in by_id:
                    members.setdefault(qid, []).append(conn)
        islands: list[Island] = []
        conns_of: dict[str, list[Any]] = {}
        last: dict[str, tuple[float, int]] = {}
        for q in queues:
            name = f"{q.vhost}/{q.name}"
            count = q.stat_published + q.stat_delivered
            then, before = self._last.get(name, (now, count))
            last[name] = (now, count)
            rate = max(0.0, (count - before) / (now - then)) if now > then else 0.0
            mine = members.get(id(q), [])
            conns_of[name] = mine
            local = {id(c) for c in mine}
            movable = (isinstance(q, ClassicQueue) and not_movable(q) is None
                       and 1 <= len(mine) <= MAX_ISLAND_CONNECTIONS
                       and all(id(c.channel.conn) in local for c in q.consumers())
                       and all(island_reason(c, q) in (None, *WAIT_REASONS) for c in mine))
            islands.append(Island(name, self.worker, rate, movable))
        self._last = last
        return islands, conns_of
