"""The state of one quorum queue, its queries and its snapshot.

Owns: `QueueState` (everything `apply` reads and writes: config, ready messages, returns, consumers and
their checked-out messages, the at-least-once dead letters, publishers for deduplication, the live raft
indexes, the queue-TTL clock, the release cursor last announced), `Publisher`, and `snapshot` /
`restore` (msgpack, versioned).

Rules:
- Ready messages are `messages` (FIFO, normal priority), `hi` (FIFO, high priority: a message priority
  above 4, RabbitMQ 4.0) and `returns` (returned messages delivered first, used only with a delivery
  limit). Invariant: `ready_bytes` == the sizes of all three; `live.count` == ready + checked out + dlx.
- `hi_out` holds the ids of the high-priority messages that are checked out or in `returns` (so that a
  returned one goes back to `hi`); `out_count` is the weighted queue's dequeue counter (machine.py
  `_pop_ready`).
- Publishers: one record per publisher id: last applied seq, node, last time seen, and the last
  MAX_REJECT_RANGES ranges of seqs refused by reject-publish (so a resend of a refused seq is refused
  again, never confirmed). Records go on unregister, on their channel or node going down, and after
  PUBLISHER_IDLE_MS without a publish (checked on ticks): the table is bounded by live publishers.
- The snapshot is canonical: equal states give equal bytes (records in queue order, dicts in their
  insertion order, which every replica shares). The live-index map is not stored: `restore` rebuilds
  it from the records.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgpack

from .config import QuorumConfig
from .consumers import Consumers
from .deadletter import DlxState
from .effects import PublisherId
from .messages import LiveIndexes, MsgQueue, Record

SNAPSHOT_VERSION = 1
MAX_REJECT_RANGES = 16
MAX_MISSING_RANGES = 64
PUBLISHER_IDLE_MS = 3_600_000  # a publisher silent this long is forgotten (no resend is that late)
RELEASE_CURSOR_STEP = 2048  # announce the release cursor when it moved this many entries
HIGH_PRIORITY_ABOVE = 4  # a message priority above this is high (RabbitMQ 4.0 quorum queues)
PRIORITY_WEIGHT = 2  # rabbit_fifo_q's ?WEIGHT: high ahead of normal 2 to 1 while both wait


class Publisher:
    __slots__ = ("last_seq", "node", "last_seen_ms", "rejected", "missing")

    def __init__(self, node: str = "", last_seq: int = 0, last_seen_ms: int = 0) -> None:
        self.last_seq = last_seq
        self.node = node
        self.last_seen_ms = last_seen_ms
        self.rejected: list[list[int]] = []  # [first, last] seq ranges refused, oldest first
        # [first, last] seq ranges below last_seq never applied (a command lost or overtaken on the way,
        # e.g. with a leader change): a later arrival of one of them is new, not a duplicate
        self.missing: list[list[int]] = []

    def take_missing(self, seq: int) -> bool:
        """If `seq` is in a gap, remove it from the gap and say True."""
        for i, (lo, hi) in enumerate(self.missing):
            if lo <= seq <= hi:
                parts = [r for r in ([lo, seq - 1], [seq + 1, hi]) if r[0] <= r[1]]
                self.missing[i:i + 1] = parts
                return True
        return False

    def add_missing(self, lo: int, hi: int) -> None:
        self.missing.append([lo, hi])
        if len(self.missing) > MAX_MISSING_RANGES:
            del self.missing[0]  # so old a gap is given up: a seq in it counts as a duplicate

    def was_rejected(self, seq: int) -> bool:
        return any(lo <= seq <= hi for lo, hi in self.rejected)

    def add_rejected(self, seq: int) -> None:
        ranges = self.rejected
        if ranges and ranges[-1][1] == seq - 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
            if len(ranges) > MAX_REJECT_RANGES:
                del ranges[0]


class QueueState:
    __slots__ = ("config", "messages", "returns", "ready_bytes", "live", "consumers", "dlx", "publishers",
                 "last_active_ms", "last_cursor", "rejecting", "release_step", "last_index", "hi", "hi_out",
                 "out_count", "last_high")

    def __init__(self, config: QuorumConfig | None = None, release_step: int = RELEASE_CURSOR_STEP) -> None:
        self.config = config or QuorumConfig()
        self.messages = MsgQueue()
        self.returns: deque[Record] = deque()
        self.ready_bytes = 0
        self.live = LiveIndexes()
        self.consumers = Consumers(self.config.single_active_consumer)
        self.dlx = DlxState()
        self.publishers: dict[PublisherId, Publisher] = {}
        self.last_active_ms: int | None = None  # queue TTL: last use; None until the first command
        self.last_cursor = 0  # the release cursor last announced
        self.rejecting = False  # reject-publish: OverflowStatus(True) announced
        self.release_step = release_step
        self.last_index = 0  # raft index of the last applied command
        self.hi = MsgQueue()  # ready high-priority messages (priority > 4)
        self.hi_out: set[int] = set()  # high-priority message ids checked out or in `returns`
        self.out_count = 0  # dequeue counter of the two-level weighted queue (0..PRIORITY_WEIGHT)
        self.last_high = False  # scratch: whether the last message taken came from `hi` (not state)

    # -- queries --------------------------------------------------------------------------------
    def ready_count(self) -> int:
        return len(self.messages) + len(self.returns) + len(self.hi)

    def unacked_count(self) -> int:
        return self.consumers.unacked

    def consumer_count(self) -> int:
        return self.consumers.count()

    def dlx_count(self) -> int:
        return self.dlx.count

    def message_count(self) -> int:
        """Every live message: ready, unacked, and dead letters awaiting the worker."""
        return self.live.count

    def release_cursor(self) -> int:
        """The smallest raft index still needed: the oldest live message's entry, or the last applied
        index when nothing is live."""
        smallest = self.live.smallest()
        return self.last_index if smallest is None else smallest

    def checked_out(self, consumer_key: Any) -> list[int]:
        """Message ids checked out to a consumer, in delivery order."""
        c = self.consumers.get(consumer_key)
        return [] if c is None else list(c.checked_out)

    def ready_indexes(self) -> list[int]:
        """Raft indexes of ready messages: returns (delivered first), normal, then high priority."""
        return [r[0] for r in self.returns] + self.messages.indexes() + self.hi.indexes()

    def live_indexes(self) -> list[int]:
        """Every live message's raft index (ready, checked out, dead letters), sorted."""
        out = self.ready_indexes()
        for c in self.consumers.by_key.values():
            out.extend(c.checked_out)
        out.extend(self.dlx.indexes())
        out.sort()
        return out

    def overview(self) -> dict[str, Any]:
        """Counts for management."""
        return {
            "messages_ready": self.ready_count(),
            "messages_unacknowledged": self.consumers.unacked,
            "messages_dlx": self.dlx.count,
            "messages": self.live.count,
            "message_bytes_ready": self.ready_bytes,
            "message_bytes_unacknowledged": self.consumers.unacked_bytes,
            "message_bytes_dlx": self.dlx.bytes,
            "consumers": self.consumers.count(),
            "publishers": len(self.publishers),
            "release_cursor": self.release_cursor(),
        }

    # -- snapshot -------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        return msgpack.packb([
            SNAPSHOT_VERSION,
            self.config.to_wire(),
            self.messages.to_wire(),
            [list(r) for r in self.returns],
            self.ready_bytes,
            self.consumers.to_wire(),
            self.dlx.to_wire(),
            [[pid, p.last_seq, p.node, p.last_seen_ms, p.rejected, p.missing]
             for pid, p in self.publishers.items()],
            self.last_active_ms,
            self.last_cursor,
            self.rejecting,
            self.release_step,
            self.last_index,
            self.hi.to_wire(),  # from here on: added with quorum priorities (older snapshots lack them)
            sorted(self.hi_out),
            self.out_count,
        ], use_bin_type=True)

    @classmethod
    def restore(cls, data: bytes) -> QueueState:
        items = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False)
        if items[0] != SNAPSHOT_VERSION:
            raise ValueError(f"unknown quorum snapshot version {items[0]}")
        (_v, config, messages, returns, ready_bytes, consumers, dlx, publishers, last_active_ms, last_cursor,
         rejecting, release_step, last_index, *priorities) = items
        st = cls(QuorumConfig.from_wire(dict(config)), release_step)
        st.messages = MsgQueue.from_wire(list(messages))
        st.returns = deque((r[0], r[1], r[2], r[3]) for r in returns)
        st.ready_bytes = ready_bytes
        st.consumers = Consumers.from_wire(list(consumers))
        st.dlx = DlxState.from_wire(list(dlx))
        for pid, last_seq, node, last_seen_ms, rejected, *more in publishers:
            p = st.publishers[pid] = Publisher(node, last_seq, last_seen_ms)
            p.rejected = [list(r) for r in rejected]
            p.missing = [list(r) for r in more[0]] if more else []
        st.last_active_ms = last_active_ms
        st.last_cursor = last_cursor
        st.rejecting = rejecting
        st.last_index = last_index
        if priorities:
            hi, hi_out, out_count = priorities
            st.hi = MsgQueue.from_wire(list(hi))
            st.hi_out = set(hi_out)
            st.out_count = out_count
        for idx in st.live_indexes():
            st.live.add(idx)
        return st
