"""Moving a classic queue between workers of a node: what the queue exports, and how a fresh queue takes it.

Owns: `QueueTransfer` (a queue's contents and counters as they move: its ready messages and the unacked
ones its consumers hold, each with its sequence number, redelivered flag, delivery and return counts,
enqueue time and expiry; the next sequence number, the delivered watermark, the statistics),
`export_queue`, `import_queue`, `not_movable` (why a queue cannot move now) and the state's one codec
(`encode` / `decode`, msgpack, bounded, checked field by field). Compaction of load (core/compaction.py,
docs/scaling.md "Compaction of load") moves a queue with the connections that use it; the connections'
side (consumers and delivery tags) is runtime/session/handover.py's.

Rules:
- Pure: no IO but the queue's own index calls (`import_queue` writes a durable queue's persistent
  messages to its index, as a publish does: the caller waits for their sync before the queue's record
  names the new home, the commit point of a move; `wrote_durable` says whether there was any).
- Only a queue whose every message is in RAM moves (`not_movable`): a paged queue, a deleted,
  exclusive, auto-delete or single-active-consumer one, or one over `MAX_TRANSFER_MESSAGES` messages or `MAX_TRANSFER_BYTES` of bodies stays.
- Every unacked message travels: `export_queue` is given the entries its consumers' channels hold and
  refuses (ValueError) unless they are exactly as many as the queue counts unacked.
- Order and identity are kept: sequence numbers travel, ready messages are delivered in the same order
  after the move, and a requeued unacked message goes back to its place by its sequence number.
- A decoded state is checked before anything is built: sequence numbers positive, unique, at most the
  queue's counter, ascending in each list; counters not negative; every message's property list
  decodes. The bodies of ready and unacked messages together are at most `MAX_TRANSFER_BYTES`. A malformed state is a ValueError.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from hutch.amqp.errors import FrameError
from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import QueueEntry

from .queue import ClassicQueue

if TYPE_CHECKING:
    from hutch.storage.queue_index import QueueIndex

VERSION = 1
MAX_TRANSFER_MESSAGES = 50_000  # a queue holding more (ready + unacked) does not move
MAX_TRANSFER_BYTES = 16 * 1024 * 1024  # ... nor one holding more bytes of bodies
MAX_STATE_BYTES = MAX_TRANSFER_BYTES + 16 * 1024 * 1024  # an encoded state (bodies, properties, names)
ENTRY_STRIDE = 12
STAT_FIELDS = ("stat_published", "stat_delivered", "stat_acked", "stat_redelivered", "stat_get",
               "stat_dead_lettered", "stat_dropped", "stat_rejected")


@dataclass
class EntryState:
    seq: int
    msg: Message
    redelivered: bool = False
    delivery_count: int = 0
    enqueued_at_ms: int = 0
    expires_at_ms: int = 0
    returns: int = 0

    @classmethod
    def of(cls, e: QueueEntry) -> EntryState:
        return cls(e.seq, e.msg, e.redelivered, e.delivery_count, e.enqueued_at_ms, e.expires_at_ms, e.returns)

    def wire(self) -> list[Any]:
        m = self.msg
        return [self.seq, m.exchange, m.routing_key, m.properties_raw, m.body, m.route_tail, m.foreign_deaths,
                self.redelivered, self.delivery_count, self.enqueued_at_ms, self.expires_at_ms, self.returns]


@dataclass
class QueueTransfer:
    vhost: str
    name: str
    next_seq: int  # the queue's sequence counter: the next publish gets next_seq + 1
    max_delivered: int
    has_ttl: bool
    last_used_ms: int
    had_consumers: bool
    stats: dict[str, int] = field(default_factory=dict)
    ready: list[EntryState] = field(default_factory=list)  # by seq (a priority queue files each by its level)
    unacked: list[EntryState] = field(default_factory=list)  # by seq

    def encode(self) -> bytes:
        data = msgpack.packb([VERSION, self.vhost, self.name, self.next_seq, self.max_delivered, self.has_ttl,
                              self.last_used_ms, self.had_consumers, [self.stats.get(f, 0) for f in STAT_FIELDS],
                              [v for e in self.ready for v in e.wire()],
                              [v for e in self.unacked for v in e.wire()]], use_bin_type=True)
        assert isinstance(data, bytes)
        return data

    @classmethod
    def decode(cls, data: bytes) -> QueueTransfer:
        """The state `encode` made; ValueError if it is not one (or too large)."""
        if len(data) > MAX_STATE_BYTES:
            raise ValueError(f"a queue's state of {len(data)} bytes is over {MAX_STATE_BYTES}")
        try:
            v = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"malformed queue state: {exc}") from None
        if not isinstance(v, list) or len(v) != 11 or v[0] != VERSION:
            raise ValueError("not a queue state of this version")
        _, vhost, name, next_seq, max_delivered, has_ttl, last_used, had_consumers, stats, ready, unacked = v
        if not isinstance(vhost, str) or not isinstance(name, str):
            raise ValueError("malformed queue state: names")
        if not all(_count(n) for n in (next_seq, max_delivered, last_used)) or max_delivered > next_seq:
            raise ValueError("malformed queue state: counters")
        if type(has_ttl) is not bool or type(had_consumers) is not bool:
            raise ValueError("malformed queue state: flags")
        if not isinstance(stats, list) or len(stats) != len(STAT_FIELDS) or not all(_count(n) for n in stats):
            raise ValueError("malformed queue state: statistics")
        t = cls(vhost, name, next_seq, max_delivered, has_ttl, last_used, had_consumers,
                dict(zip(STAT_FIELDS, stats, strict=True)), _entries(ready, "ready"), _entries(unacked, "unacked"))
        seqs = [e.seq for e in t.ready] + [e.seq for e in t.unacked]
        if len(set(seqs)) != len(seqs) or any(s > next_seq for s in seqs):
            raise ValueError("malformed queue state: sequence numbers")
        if len(seqs) > MAX_TRANSFER_MESSAGES:
            raise ValueError(f"a queue's state of {len(seqs)} messages is over {MAX_TRANSFER_MESSAGES}")
        return t


def _count(n: Any) -> bool:  # Any: a msgpack value
    return type(n) is int and 0 <= n < 2**63


def _entries(v: Any, what: str) -> list[EntryState]:  # Any: a msgpack value, checked here
    if not isinstance(v, list) or len(v) % ENTRY_STRIDE:
        raise ValueError(f"malformed queue state: {what} entries")
    out = []
    for i in range(0, len(v), ENTRY_STRIDE):
        (seq, exchange, routing_key, props, body, tail, foreign, redelivered, count, enqueued, expires,
         returns) = v[i:i + ENTRY_STRIDE]
        if not (isinstance(exchange, str) and isinstance(routing_key, str) and isinstance(props, bytes)
                and len(props) >= 2 and isinstance(body, bytes) and isinstance(tail, bytes)):
            raise ValueError(f"malformed queue state: the {what} message at {i // ENTRY_STRIDE}")
        if not all(_count(n) for n in (seq, count, enqueued, expires, returns)) or seq == 0 \
                or type(foreign) is not bool or type(redelivered) is not bool:
            raise ValueError(f"malformed queue state: the {what} entry at {i // ENTRY_STRIDE}")
        try:
            BasicProperties.decode(props, 0)  # as a publish's content header is checked
        except FrameError as exc:
            raise ValueError(f"malformed queue state: the {what} message at {i // ENTRY_STRIDE}: {exc}") from None
        msg = Message(exchange, routing_key, None, body, props, tail)
        msg.foreign_deaths = foreign
        out.append(EntryState(seq, msg, redelivered, count, enqueued, expires, returns))
    if any(a.seq >= b.seq for a, b in zip(out, out[1:], strict=False)):
        raise ValueError(f"malformed queue state: {what} messages out of order")
    return out


def not_movable(q: ClassicQueue) -> str | None:
    """Why `q` cannot move to another worker now, or None."""
    if q.deleted:
        return "deleted"
    if q.exclusive:
        return "exclusive"
    if q.auto_delete:
        return "auto-delete"  # its last consumer leaving the old worker would delete it
    if q.settings.single_active_consumer:
        return "single active consumer"  # which consumer is active would have to travel with its order
    if q.messages_paged_out:
        return "paged to disk"
    if q.message_count + q.unacked_count > MAX_TRANSFER_MESSAGES:
        return "too many messages"
    if q.message_bytes > MAX_TRANSFER_BYTES:
        return "too many bytes"
    return None


def export_queue(q: ClassicQueue, unacked: Iterable[QueueEntry]) -> QueueTransfer:
    """`q`'s contents and counters, with `unacked` (every entry its consumers hold unsettled). ValueError
    when it cannot move (`not_movable`) or `unacked` is not every unacked entry."""
    why = not_movable(q)
    if why is not None:
        raise ValueError(f"queue '{q.name}' cannot move: {why}")
    held = sorted(unacked, key=lambda e: e.seq)
    if len(held) != q.unacked_count or len({e.seq for e in held}) != len(held):
        raise ValueError(f"queue '{q.name}' cannot move: {len(held)} unacked entries given, "
                         f"{q.unacked_count} counted")
    if q.message_bytes + sum(e.msg.size for e in held) > MAX_TRANSFER_BYTES:
        raise ValueError(f"queue '{q.name}' cannot move: too many bytes")
    ready = sorted(q._ready, key=lambda e: e.seq)
    return QueueTransfer(q.vhost, q.name, q._seq, q._max_delivered, q._has_ttl, q._last_used, q.had_consumers,
                         {f: getattr(q, f) for f in STAT_FIELDS}, [EntryState.of(e) for e in ready],
                         [EntryState.of(e) for e in held])


def import_queue(q: ClassicQueue, t: QueueTransfer) -> dict[int, QueueEntry]:
    """Fill the fresh queue `q` (no message, no consumer, never published to) from `t`: its ready messages
    in order, its unacked ones counted as handed out; a persisting queue writes the persistent ones to
    its index (the caller waits for their sync). Returns the unacked entries by seq, for the channels
    that adopt the deliveries. Consumers attach after, and `deliver_pending` starts delivery."""
    if q._seq or q.message_count or q.unacked_count or q.consumer_count:
        raise ValueError(f"queue '{q.name}' is not fresh: it cannot take a moved queue's state")
    index = q.index if q.persist else None
    for f, n in t.stats.items():
        setattr(q, f, n)
    q._seq = t.next_seq
    q._max_delivered = t.max_delivered
    q._has_ttl = t.has_ttl
    q._last_used = t.last_used_ms
    q.had_consumers = t.had_consumers
    ready = q._ready
    for es in t.ready:
        entry = _entry(es, index)
        ready.append(entry)
        q._ready_bytes += entry.msg.size
    held: dict[int, QueueEntry] = {}
    for es in t.unacked:
        held[es.seq] = _entry(es, index)
    q._unacked = len(held)
    if index is not None:  # unacked ones recovered after a crash come back redelivered, as before the move
        index.mark_delivered(t.max_delivered)
        index.flush_delivered()
    if q._has_ttl and q.timer is not None:
        deadline = q.next_deadline()
        if deadline:
            q.timer(q, deadline)
    return held


def wrote_durable(q: ClassicQueue, t: QueueTransfer) -> bool:
    """Whether `import_queue(q, t)` wrote anything a crash must find: a persistent message into a
    persisting queue's index (only then does the caller wait for a sync before the commit point)."""
    return q.persist and any(es.msg.persistent for es in (*t.ready, *t.unacked))


def _entry(es: EntryState, index: QueueIndex | None) -> QueueEntry:
    entry = QueueEntry(es.seq, es.msg, es.enqueued_at_ms)
    entry.redelivered = es.redelivered
    entry.delivery_count = es.delivery_count
    entry.expires_at_ms = es.expires_at_ms
    entry.returns = es.returns
    if index is not None and es.msg.persistent:
        index.publish(es.seq, True, es.msg, es.expires_at_ms)
        if es.returns:
            index.record_returns(es.seq, es.returns)
        entry.on_disk = True
    return entry
