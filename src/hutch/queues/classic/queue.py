"""The classic queue: an in-memory FIFO with round-robin delivery over consumers.

Owns: the ready messages of one classic queue (ordered by a per-queue sequence number), the count of
messages delivered but not settled, and the consumer rota.

Rules:
- FIFO: messages are delivered in publish order; a requeued message goes back to its original
  position (by `seq`), so a requeue of the oldest unacked messages puts them at the head.
- Consumers are grouped by priority (x-priority); the highest group that has a consumer able to take a
  message wins; within a group, round robin. A consumer is able when under its prefetch and its
  channel's global prefetch.
- Invariant: `_unacked` == number of entries handed out with manual ack and not yet settled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Deliverer, Queue, QueueEntry

if TYPE_CHECKING:
    from hutch.runtime.journal import MessageJournal

FLOW_HIGH = 1000  # ready messages behind a socket-blocked consumer before publishers are paused
FLOW_LOW = 500  # publishers resume below this


class ClassicQueue(Queue):
    queue_type = "classic"
    # set by the node on durable, non-exclusive queues when messages are persisted: persistent messages
    # are journalled on publish and settled in the journal on ack/discard/purge/delete
    journal: MessageJournal | None = None

    def __init__(self, vhost: str, name: str, durable: bool, exclusive_owner: object | None,
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self._ready: deque[QueueEntry] = deque()
        self._ready_bytes = 0
        self._unacked = 0
        self._seq = 0
        # priority groups, highest first: [(priority, deque of consumers)]
        self._groups: list[tuple[int, deque[Consumer]]] = []
        self._consumer_count = 0
        self._delivering = False

    # -- messages ------------------------------------------------------------------------------
    def publish(self, msg: Message) -> None:
        self._seq += 1
        ready = self._ready
        # A backlog means the last delivery attempt found no consumer able to take a message, and
        # every event that frees one (ack, qos, resumed socket, new consumer, requeue) calls
        # deliver_pending itself: nothing to try here.
        backlog = bool(ready)
        entry = QueueEntry(self._seq, msg)
        journal = self.journal
        if journal is not None and msg.persistent:
            entry.jseq = journal.enqueue(self.vhost, self.name, self._seq, msg)
        ready.append(entry)
        self._ready_bytes += msg.size
        self.stat_published += 1
        if self._consumer_count and not backlog:
            self.deliver_pending()

    def deliver_pending(self) -> None:
        if self._delivering or self.deleted:
            return
        self._delivering = True
        try:
            ready = self._ready
            groups = self._groups
            while ready and groups:
                consumer = self._next_consumer()
                if consumer is None:
                    break
                entry = ready.popleft()
                self._ready_bytes -= entry.msg.size
                entry.delivery_count += 1
                if not consumer.no_ack:
                    self._unacked += 1
                    consumer.unacked += 1
                self.stat_delivered += 1
                consumer.delivered += 1
                consumer.channel.deliver(consumer, self, entry)
        finally:
            self._delivering = False
        if self.flow_waiters and (len(self._ready) <= FLOW_LOW or not self._consumer_blocked_by_socket()):
            self.release_flow()

    def needs_flow_control(self) -> bool:
        """Credit-flow's effect in one thread: a backlog behind a consumer whose socket is full.

        RabbitMQ's credit flow blocks a publisher when the queue cannot hand messages on as fast as
        they arrive. Here that happens when a consumer that could take messages is held back only by
        its connection's full write buffer; then publishers are paused rather than letting the backlog
        (and latency) grow without bound. A backlog behind consumers that are merely at their prefetch,
        or with no consumers at all, does not block publishers, as in RabbitMQ.
        """
        # sampled every 64th message: the consumer scan is not free and flow is a coarse signal
        return len(self._ready) > FLOW_HIGH and not self._seq & 63 and self._consumer_blocked_by_socket()

    def _consumer_blocked_by_socket(self) -> bool:
        for _prio, group in self._groups:
            for c in group:
                if c.channel.conn.write_paused and (not c.prefetch or c.unacked < c.prefetch):
                    return True
        return False

    def _next_consumer(self) -> Consumer | None:
        for _prio, group in self._groups:
            n = len(group)
            if n == 1:
                c = group[0]
                if c.can_take():
                    return c
                continue
            for _ in range(n):
                c = group[0]
                group.rotate(-1)
                if c.can_take():
                    return c
        return None

    def get(self, channel: Deliverer, no_ack: bool) -> QueueEntry | None:
        if not self._ready:
            return None
        entry = self._ready.popleft()
        self._ready_bytes -= entry.msg.size
        entry.delivery_count += 1
        if not no_ack:
            self._unacked += 1
        self.stat_get += 1
        return entry

    def recover(self, seq: int, msg: Message, jseq: int) -> None:
        """Put back a message recovered from the journal at start-up (marked redelivered)."""
        entry = QueueEntry(seq, msg)
        entry.jseq = jseq
        entry.redelivered = True
        self._ready.append(entry)
        self._ready_bytes += msg.size
        if seq > self._seq:
            self._seq = seq

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        if self.journal is not None:
            items = entries if isinstance(entries, list) else list(entries)
            journalled = [e for e in items if e.jseq]
            if journalled:
                self._settle_journal(journalled)
            n = len(items)
        else:
            n = 0
            for _ in entries:
                n += 1
        self._unacked -= n
        self.stat_acked += n

    def _settle_journal(self, entries: list[QueueEntry]) -> None:
        journal = self.journal
        assert journal is not None
        journal.settle(self.vhost, self.name, [e.seq for e in entries], [e.jseq for e in entries],
                       write=not self.deleted)
        for e in entries:
            e.jseq = 0

    def settled_one(self) -> None:
        """Fast path for one acknowledged entry (not journalled)."""
        self._unacked -= 1
        self.stat_acked += 1

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        items = sorted(entries, key=_seq_of, reverse=True)
        if not items:
            return
        self._unacked -= len(items)
        if self.deleted:
            if self.journal is not None:
                self.journal.forget([e.jseq for e in items if e.jseq])
            return
        ready = self._ready
        for entry in items:  # highest seq first, so each appendleft keeps order
            entry.redelivered = True
            self._ready_bytes += entry.msg.size
            self.stat_redelivered += 1
            if not ready or entry.seq < ready[0].seq:
                ready.appendleft(entry)
            elif entry.seq > ready[-1].seq:
                ready.append(entry)
            else:
                ready.insert(_bisect_seq(ready, entry.seq), entry)
        self.deliver_pending()

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        items = list(entries)
        self._unacked -= len(items)
        if self.journal is not None:
            journalled = [e for e in items if e.jseq]
            if journalled:
                self._settle_journal(journalled)

    def purge(self) -> int:
        n = len(self._ready)
        if self.journal is not None:
            journalled = [e for e in self._ready if e.jseq]
            if journalled:
                self._settle_journal(journalled)
        self._ready.clear()
        self._ready_bytes = 0
        self.release_flow()
        return n

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        for prio, group in self._groups:
            if prio == consumer.priority:
                group.append(consumer)
                break
        else:
            self._groups.append((consumer.priority, deque([consumer])))
            self._groups.sort(key=lambda g: -g[0])
        self._consumer_count += 1
        self.deliver_pending()

    def remove_consumer(self, consumer: Consumer) -> None:
        for i, (_prio, group) in enumerate(self._groups):
            if consumer in group:
                group.remove(consumer)
                self._consumer_count -= 1
                if not group:
                    del self._groups[i]
                if not self._consumer_count:
                    self.release_flow()
                return

    def consumers(self) -> list[Consumer]:
        return [c for _p, g in self._groups for c in g]

    @property
    def consumer_count(self) -> int:
        return self._consumer_count

    @property
    def message_count(self) -> int:
        return len(self._ready)

    @property
    def unacked_count(self) -> int:
        return self._unacked

    @property
    def message_bytes(self) -> int:
        return self._ready_bytes

    def delete(self) -> int:
        n = len(self._ready)
        if self.journal is not None and not self.deleted:
            self.journal.delete(self.vhost, self.name)
            self.journal.forget([e.jseq for e in self._ready if e.jseq])
        self.deleted = True
        self._ready.clear()
        self._ready_bytes = 0
        self._groups.clear()
        self._consumer_count = 0
        self.release_flow()
        return n


def _seq_of(entry: QueueEntry) -> int:
    return entry.seq


def _bisect_seq(ready: deque[QueueEntry], seq: int) -> int:
    lo, hi = 0, len(ready)
    while lo < hi:
        mid = (lo + hi) // 2
        if ready[mid].seq < seq:
            lo = mid + 1
        else:
            hi = mid
    return lo
