"""The classic queue: a FIFO with round-robin delivery over consumers, paged to its index on disk.

Owns: the ready messages of one classic queue (ordered by a per-queue sequence number), the count of
messages delivered but not settled, the consumer rota, and which ready messages sit in RAM.

Rules:
- FIFO: messages are delivered in publish order; a requeued message goes back to its original
  position (by `seq`), so a requeue of the oldest unacked messages puts them at the head.
- Consumers are grouped by priority (x-priority); the highest group that has a consumer able to take a
  message wins; within a group, round robin. A consumer is able when under its prefetch and its
  channel's global prefetch.
- Invariant: `_unacked` == number of entries handed out with manual ack and not yet settled.
- Storage (seed 004's alpha/delta idea with two states): ready messages are either in RAM (`_ready`, the
  head of the queue) or only on disk in the queue index (`_delta` messages: every live entry with a seq
  >= `_delta_from`). A queue with an index pages when RAM holds `ram_limit` messages or `ram_bytes_limit`
  bytes of bodies: later publishes go straight to the index, and `_refill` reads the next segment back
  when RAM runs dry. Under memory pressure `page_out` moves the RAM tail (never-delivered messages only)
  to disk, transient ones included. Invariant: every seq in the delta is above every delivered seq.
- Persistent messages of durable queues (`persist`) are written to the index on publish and settled there
  (ACK) on ack, reject and purge. Their receipts are handed to the index's sync sink
  (`confirm_after_sync`): settled after the group commit's fsync (runtime/queue_types/classic/
  persistence.py), rejected if storage fails. Every other publish is SETTLED at once.
- Features (issue 5), read from `self.settings` (x-arguments + policies, core/queue_settings.py):
  message TTL (queue and per message; the earliest of the two, checked at the head and by a timer the
  runtime runs through `timer`, so expired messages go without a consumer), max-length / max-length-bytes
  with drop-head (oldest ready messages go), reject-publish (publish answers REJECTED: a nack) and
  reject-publish-dlx, delivery-limit (failed deliveries counted per message, `x-delivery-count` on
  redelivery, past the limit the message goes), single active consumer, and queue TTL (`on_timer` says
  when an unused queue should be deleted). Messages that go are handed to `dead_letterer` with their
  reason (expired, maxlen, delivery_limit, rejected) when a dead-letter exchange is set, else dropped.
- Time comes from `ClassicQueue.clock` (wall-clock ms, set by the runtime), so expiry survives paging and
  restarts (the expiry is stored in the index entry).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from hutch.core.credit_flow import FLOW_HIGH, FLOW_LOW, IDLE_LOOP, LoopLoad, consumer_filled, keeps_pace
from hutch.core.message import Message
from hutch.core.queue_settings import QueueSettings
from hutch.core.queue_type import (
    PENDING,
    REJECTED,
    SETTLED,
    Consumer,
    Deliverer,
    Published,
    Queue,
    QueueEntry,
)

from .priority import PriorityReady

if TYPE_CHECKING:
    from hutch.core.confirms import Receipt
    from hutch.storage.queue_index import IndexRecovery, QueueIndex

log = logging.getLogger("hutch.queue")

# ready messages kept in RAM before a queue pages to its index: about 50 MB of small messages, far above
# the standing backlog of a busy 1 -> 1 queue (a lower bound made such queues page, which slowed their
# consumer, which deepened the backlog: measured 0.9x instead of 1.4x RabbitMQ in the headline benchmark)
RAM_LIMIT = 131072
RAM_BYTES_LIMIT = 64 * 1024 * 1024  # message bodies kept in RAM before paging
PRESSURE_RAM_LIMIT = 256  # what a queue keeps in RAM while the node is over its paging threshold
PRESSURE_RAM_BYTES_LIMIT = 1024 * 1024


def _no_clock() -> int:
    return 0


class ClassicQueue(Queue):
    queue_type = "classic"
    ram_limit = RAM_LIMIT  # class-wide; the node lowers it under memory pressure
    ram_bytes_limit = RAM_BYTES_LIMIT
    clock: Callable[[], int] = staticmethod(_no_clock)  # wall-clock ms; the runtime sets it
    loop_load: LoopLoad = IDLE_LOOP  # how busy the node's event loop is; the runtime sets it

    def __init__(self, vhost: str, name: str, durable: bool, exclusive_owner: object | None,
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self._ready: deque[QueueEntry] | PriorityReady = deque()
        if self.settings.max_priority:  # x-max-priority: one FIFO per level (priority.py), never paged
            self._ready = PriorityReady(self.settings.max_priority)
        self._ready_bytes = 0  # bodies of the messages in `_ready`
        self._unacked = 0
        self._seq = 0
        # priority groups, highest first: [(priority, deque of consumers)]
        self._groups: list[tuple[int, deque[Consumer]]] = []
        self._consumer_count = 0
        self._delivering = False
        # -- storage: set by the node when it has a data directory
        self.index: QueueIndex | None = None
        self.index_factory: Callable[[], QueueIndex] | None = None  # for queues that index only to page
        self.persist = False  # durable queue on a node with storage: persistent messages go to the index
        self._delta = 0  # ready messages only on disk: every live index entry with seq >= _delta_from
        self._delta_from = 0
        self._delta_bytes = 0
        self._max_delivered = 0  # highest seq ever handed out (delivery or get)
        self._recovered_delivered = 0  # recovered seqs up to this one were delivered before the restart
        # -- features: hooks set by the runtime
        self.dead_letterer: Callable[[ClassicQueue, list[Message], str], object] | None = None
        self.timer: Callable[[ClassicQueue, int], None] | None = None  # call on_timer at this wall ms
        self._has_ttl = False  # some message carried an expiry (checked at the head from then on)
        self._now_hint = 0  # the clock reading of the publish in progress
        self._last_used = 0  # wall ms of the last use (x-expires)
        self._sac: list[Consumer] = []  # consumers in registration order (single active consumer)
        self.stat_dead_lettered = 0
        self.stat_dropped = 0
        self.stat_rejected = 0

    # -- messages ------------------------------------------------------------------------------
    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        """Enqueue; REJECTED when the queue refused it (reject-publish overflow: the publisher gets a nack),
        PENDING when the message was written to the index for good and `receipt` waits for its fsync."""
        st = self.settings
        expires_at = 0
        if st.message_ttl is not None or msg.properties_raw[0] & 0x01:
            ttl = st.message_ttl
            per_message = msg.expiration_ms
            if per_message is not None and (ttl is None or per_message < ttl):
                ttl = per_message
            if ttl is not None:
                now = self._now_hint = self.clock()  # the delivery attempt below sees the same time
                expires_at = now + ttl
        if (st.max_length is not None or st.max_length_bytes is not None) and st.overflow != "drop-head" \
                and self._full_for(msg, st):
            self.stat_rejected += 1
            if st.overflow == "reject-publish-dlx":
                self._dead_letter([msg], "maxlen")
            return REJECTED
        seq = self._seq = self._seq + 1
        durable = self.persist and msg.persistent
        ready = self._ready
        # A backlog means the last delivery attempt found no consumer able to take a message, and
        # every event that frees one (ack, qos, resumed socket, new consumer, requeue) calls
        # deliver_pending itself: nothing to try here.
        backlog = len(ready)
        self.stat_published += 1
        if (backlog >= self.ram_limit or self._delta or self._ready_bytes >= self.ram_bytes_limit) \
                and (self._delta or self._can_page()):
            index = self._get_index()
            index.publish(seq, durable, msg, expires_at)
            if not self._delta:
                self._delta_from = seq
            self._delta += 1
            self._delta_bytes += msg.size
        else:
            entry = QueueEntry(seq, msg)
            if durable:
                qindex = self.index
                assert qindex is not None, "a persisting queue has its index"
                qindex.publish(seq, True, msg, expires_at)
                entry.on_disk = True
            if expires_at:
                entry.expires_at_ms = expires_at
            ready.append(entry)
            self._ready_bytes += msg.size
            if self._consumer_count and not backlog:
                self.deliver_pending()
        self._now_hint = 0
        if expires_at:
            self._has_ttl = True
            if ttl == 0:
                self.expire_due(self.clock())  # TTL 0: delivered at once or not at all
            elif self.timer is not None and not backlog:
                # only a new head needs a timer: later messages are looked at when the head's fires
                self.timer(self, expires_at)
        if st.max_length is not None or st.max_length_bytes is not None:
            self._drop_over_limit(st)
        if durable and receipt is not None:
            qindex = self.index
            assert qindex is not None, "a persisting queue has its index"
            qindex.sink.confirm_after_sync(receipt, self)
            return PENDING
        return SETTLED

    def _full_for(self, msg: Message, st: QueueSettings) -> bool:
        if st.max_length is not None and self.message_count >= st.max_length:
            return True
        return st.max_length_bytes is not None and self.message_bytes + msg.size > st.max_length_bytes

    def _over_limit(self, st: QueueSettings) -> bool:
        if st.max_length is not None and self.message_count > st.max_length:
            return True
        return st.max_length_bytes is not None and self.message_bytes > st.max_length_bytes

    def _drop_over_limit(self, st: QueueSettings) -> None:
        """drop-head: the oldest ready messages go until the queue is within its limits."""
        if st.overflow != "drop-head":
            return
        dropped: list[QueueEntry] = []
        while self._over_limit(st) and (self._ready or self._delta):
            dropped.append(self._pop_head())
        if dropped:
            self._remove_dead(dropped, "maxlen")

    def _pop_head(self) -> QueueEntry:
        if not self._ready:
            self._refill()
        entry = self._ready.popleft()
        self._ready_bytes -= entry.msg.size
        return entry

    def _remove_dead(self, entries: list[QueueEntry], reason: str) -> None:
        """Entries leave the queue for good (expired, over the limit, past the delivery limit, rejected):
        settled on disk, then dead-lettered when the queue has a dead-letter exchange."""
        if self.index is not None:
            self._settle_on_disk(entries)
        self._dead_letter([e.msg for e in entries], reason)

    def _dead_letter(self, msgs: list[Message], reason: str) -> None:
        if self.settings.dead_letter_exchange is not None and self.dead_letterer is not None:
            self.stat_dead_lettered += len(msgs)
            self.dead_letterer(self, msgs, reason)
        else:
            self.stat_dropped += len(msgs)

    def expire_due(self, now: int) -> int:
        """Expired messages at the head go (dead-lettered 'expired'); returns how many."""
        if not self._has_ttl:
            return 0
        expired: list[QueueEntry] = []
        ready = self._ready
        while True:
            if not ready:
                if not self._delta:
                    break
                self._refill()
            head = ready[0]
            if not head.expires_at_ms or head.expires_at_ms > now:
                break
            expired.append(self._pop_head())
        if expired:
            self._remove_dead(expired, "expired")
        return len(expired)

    def next_deadline(self) -> int:
        """The wall ms at which `on_timer` has something to do, or 0."""
        deadline = 0
        if self._has_ttl and self._ready and self._ready[0].expires_at_ms:
            deadline = self._ready[0].expires_at_ms
        expires = self.settings.expires
        if expires is not None and not self._consumer_count:
            at = self._last_used + expires
            deadline = at if not deadline or at < deadline else deadline
        return deadline

    def on_timer(self, now: int) -> bool:
        """Run what is due; True when the queue has been unused for its x-expires and must be deleted."""
        self.expire_due(now)
        expires = self.settings.expires
        if expires is not None and not self._consumer_count and now - self._last_used >= expires:
            return True
        deadline = self.next_deadline()
        if deadline and self.timer is not None:
            self.timer(self, deadline)
        return False

    def touch(self, now: int) -> None:
        """The queue was used (declared, got from, consumed): restart its x-expires countdown."""
        self._last_used = now
        if self.settings.expires is not None and self.timer is not None:
            self.timer(self, now + self.settings.expires)

    def apply_settings(self, settings: QueueSettings) -> None:
        """A policy changed: limits apply at once (drop-head), TTLs to messages published from now on,
        and timers are re-armed."""
        self.settings = settings
        if settings.max_length is not None or settings.max_length_bytes is not None:
            self._drop_over_limit(settings)
        deadline = self.next_deadline()
        if deadline and self.timer is not None:
            self.timer(self, deadline)

    def _can_page(self) -> bool:
        if isinstance(self._ready, PriorityReady):
            return False  # a paged-out message could not overtake lower levels in RAM
        return self.index is not None or self.index_factory is not None

    def _get_index(self) -> QueueIndex:
        index = self.index
        if index is None:
            assert self.index_factory is not None
            index = self.index = self.index_factory()
        return index

    def _refill(self) -> None:
        """Read paged-out messages back into RAM: the rest of the next segment that has any, up to the
        RAM limit (called when RAM runs dry, so a deep backlog is read a segment at a time)."""
        index = self.index
        assert index is not None
        ready = self._ready
        target = max(self.ram_limit, 1)
        recovered_delivered = self._recovered_delivered
        loaded = 0
        while self._delta and len(ready) < target and not loaded:  # one segment's worth per call
            lost_before = index.lost_on_read
            msgs, next_seq = index.read_from(self._delta_from)
            self._delta -= index.lost_on_read - lost_before  # unreadable entries were dropped (logged)
            room = target - len(ready)
            if len(msgs) > room:  # take what fits; the rest stays on disk
                msgs = msgs[:room]
                next_seq = msgs[-1][0] + 1
            size = 0
            returns = index.last_returns
            for seq, _persistent, exchange, routing_key, props, body, store_id, expires_at in msgs:
                msg = Message(exchange, routing_key, None, body, props)
                msg.store_id = store_id
                entry = QueueEntry(seq, msg)
                entry.on_disk = True
                if returns:
                    entry.returns = returns.get(seq, 0)
                if expires_at:
                    entry.expires_at_ms = expires_at
                    self._has_ttl = True
                if seq <= recovered_delivered:
                    entry.redelivered = True
                ready.append(entry)
                size += msg.size
            self._ready_bytes += size
            loaded += len(msgs)
            self._delta -= len(msgs)
            self._delta_bytes -= size
            self._delta_from = next_seq
            if next_seq > index.max_seq and self._delta:
                log.error("queue '%s' in vhost '%s': %d paged-out messages missing from its index",
                          self.name, self.vhost, self._delta)
                self._delta = 0
        if not self._delta:
            self._delta_bytes = 0

    def page_out(self, keep: int) -> int:
        """Move ready messages beyond the first `keep` (never delivered ones only) from RAM to disk."""
        if not self._can_page():
            return 0
        ready = self._ready
        moved: list[QueueEntry] = []
        floor = self._max_delivered
        while len(ready) > keep and ready[-1].seq > floor and not ready[-1].redelivered:
            moved.append(ready.pop())
        if not moved:
            return 0
        index = self._get_index()
        size = 0
        for entry in reversed(moved):
            msg = entry.msg
            if not entry.on_disk:
                index.publish(entry.seq, False, msg, entry.expires_at_ms)
            size += msg.size
        self._ready_bytes -= size
        self._delta_bytes += size
        self._delta += len(moved)
        self._delta_from = moved[-1].seq
        return len(moved)

    def close_storage(self) -> None:
        """Node shutdown: write what the index should remember (the delivered watermark)."""
        if self.index is not None:
            self.index.mark_delivered(self._max_delivered)
            self.index.close()

    def recover_index(self, found: IndexRecovery) -> None:
        """Start from what the index held at start-up: every live message is paged out, the first segment
        is read back now. Messages delivered before the restart come back marked redelivered."""
        self._seq = found.max_seq
        self._max_delivered = 0
        self._recovered_delivered = found.delivered_upto
        if found.live:
            self._delta = found.live
            self._delta_from = found.first_live_seq
            self._delta_bytes = found.live_bytes
            self._refill()
            if isinstance(self._ready, PriorityReady):
                while self._delta:  # priority order needs every message in RAM
                    before = self._delta
                    self.ram_limit = max(self.ram_limit, len(self._ready) + self._delta)
                    self._refill()
                    if self._delta == before:
                        break

    def deliver_pending(self) -> None:
        if self._delivering or self.deleted:
            return
        self._delivering = True
        try:
            ready = self._ready
            groups = self._groups
            now = (self._now_hint or self.clock()) if self._has_ttl else 0
            expired: list[QueueEntry] = []
            limit = self.settings.delivery_limit_or_none
            while groups:
                if not ready:
                    if not self._delta:
                        break
                    self._refill()
                consumer = self._next_consumer()
                if consumer is None:
                    break
                entry = ready.popleft()
                self._ready_bytes -= entry.msg.size
                if now and entry.expires_at_ms and entry.expires_at_ms < now:  # strictly: TTL 0 can go out
                    expired.append(entry)
                    continue
                if entry.seq > self._max_delivered:
                    self._max_delivered = entry.seq
                if limit is not None and entry.returns:
                    entry.msg = entry.msg.with_header("x-delivery-count", entry.returns)
                entry.delivery_count += 1
                if not consumer.no_ack:
                    self._unacked += 1
                    consumer.unacked += 1
                    if consumer.unacked == consumer.prefetch and consumer.pace_start_ms < 0:
                        consumer_filled(consumer, self.clock(), self.stat_published, self.stat_acked)
                self.stat_delivered += 1
                consumer.delivered += 1
                consumer.channel.deliver(consumer, self, entry)
            if expired:
                self._remove_dead(expired, "expired")
        finally:
            self._delivering = False
        if self.flow_waiters and (len(self._ready) + self._delta <= FLOW_LOW or not self._held_by_consumers()):
            self.release_flow()

    def needs_flow_control(self) -> bool:
        """Credit flow's effect in one thread: a backlog behind consumers the node does not serve fast enough.

        RabbitMQ's credit flow blocks a publisher when a process downstream cannot hand messages on as
        fast as they arrive. Here that is the case, and publishers are paused rather than letting the
        backlog (and latency) grow, when the backlog is over `FLOW_HIGH` and either a consumer that could
        take messages is held back only by its connection's full write buffer, or the event loop is
        saturated while a consumer keeps pace (core/credit_flow.py: it gives back what it is given at
        once, so the node's time spent reading more publishes is time not spent delivering to it). A
        backlog behind consumers that sit on their prefetch, or with no consumer at all, or on a node
        with time to spare, does not block publishers, as in RabbitMQ. The last link is the store:
        while the node's group commit is behind the disk (`congested`), publishers to durable queues
        are paused too.
        """
        if self.persist and self.index is not None and self.index.sink.congested:
            return True  # the disk is behind: the store is the link of the chain that is full
        if self._seq & 63:
            return False  # sampled every 64th message: the consumer scan is not free, flow is coarse
        return len(self._ready) + self._delta > FLOW_HIGH and self._held_by_consumers()

    def flow_still_needed(self) -> bool:
        """While publishers wait on this queue: keep them while the store is behind, or the backlog is
        still over `FLOW_LOW` behind consumers the node is not serving fast enough."""
        qindex = self.index
        if self.persist and qindex is not None and qindex.sink.congested:  # persist implies an index
            return True
        return len(self._ready) + self._delta > FLOW_LOW and self._held_by_consumers()

    def _held_by_consumers(self) -> bool:
        return self._consumer_blocked_by_socket() or (self.loop_load.saturated() and self._consumer_keeps_pace())

    def _consumer_blocked_by_socket(self) -> bool:
        for _prio, group in self._groups:
            for c in group:
                if c.channel.conn.write_paused and (not c.prefetch or c.unacked < c.prefetch):
                    return True
        return False

    def _consumer_keeps_pace(self) -> bool:
        now = self.clock()
        for _prio, group in self._groups:
            for c in group:
                if keeps_pace(c, now):
                    return True
        return False

    def _next_consumer(self) -> Consumer | None:
        if self._sac:
            active = self._sac[0]
            return active if active.can_take() else None
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

    def get(self, channel: Deliverer | None, no_ack: bool) -> QueueEntry | None:
        if self._has_ttl:
            self.expire_due(self.clock())
        if self.settings.expires is not None:
            self.touch(self.clock())
        if not self._ready and not self._delta:
            return None
        entry = self._pop_head()
        if entry.seq > self._max_delivered:
            self._max_delivered = entry.seq
        if self.settings.delivery_limit_or_none is not None and entry.returns:
            entry.msg = entry.msg.with_header("x-delivery-count", entry.returns)
        entry.delivery_count += 1
        if not no_ack:
            self._unacked += 1
        self.stat_get += 1
        return entry

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        if self.index is not None:
            items = entries if isinstance(entries, list) else list(entries)
            self._settle_on_disk(items)
            n = len(items)
        else:
            n = 0
            for _ in entries:
                n += 1
        self._unacked -= n
        assert self._unacked >= 0, "settled more than was handed out"
        self.stat_acked += n

    def _settle_on_disk(self, entries: list[QueueEntry]) -> None:
        index = self.index
        assert index is not None
        seqs = [e.seq for e in entries if e.on_disk]
        if seqs:
            index.mark_delivered(self._max_delivered)
            index.ack(seqs)
            for e in entries:
                e.on_disk = False

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        items = sorted(entries, key=_seq_of, reverse=True)
        if not items:
            return
        self._unacked -= len(items)
        assert self._unacked >= 0, "settled more than was handed out"
        if self.deleted:
            return
        limit = self.settings.delivery_limit_or_none
        for entry in items:
            entry.returns += 1  # a failed delivery (reject/nack with requeue, or its consumer went)
        if limit is not None:
            over = [e for e in items if e.returns > limit]
            if over:
                items = [e for e in items if e.returns <= limit]
                self._remove_dead(sorted(over, key=_seq_of), "delivery_limit")
                if not items:
                    return
            if self.index is not None:  # the count survives paging and restarts
                for e in items:
                    if e.on_disk:
                        self.index.record_returns(e.seq, e.returns)
        if self.index is not None:
            # remember across a restart that these were delivered
            self.index.mark_delivered(self._max_delivered)
            self.index.flush_delivered()
        ready = self._ready
        for entry in items:  # highest seq first, so each appendleft keeps order
            entry.redelivered = True
            self._ready_bytes += entry.msg.size
            self.stat_redelivered += 1
            if isinstance(ready, PriorityReady):
                ready.insert_by_seq(entry)
            elif not ready or entry.seq < ready[0].seq:
                ready.appendleft(entry)
            elif entry.seq > ready[-1].seq:
                ready.append(entry)
            else:
                ready.insert(_bisect_seq(ready, entry.seq), entry)
        st = self.settings
        if st.max_length is not None or st.max_length_bytes is not None:
            self._drop_over_limit(st)  # drop-head counts requeued messages too (RabbitMQ's requeue_and_run)
        self.deliver_pending()

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        items = list(entries)
        self._unacked -= len(items)
        assert self._unacked >= 0, "settled more than was handed out"
        if not self.deleted:
            self._remove_dead(items, "rejected")
        elif self.index is not None:
            self._settle_on_disk(items)

    def purge(self) -> int:
        n = len(self._ready) + self._delta
        if self.index is not None:
            self._settle_on_disk(list(self._ready))
            if self._delta:
                self.index.ack_from(self._delta_from)
        self._ready.clear()
        self._ready_bytes = 0
        self._delta = self._delta_bytes = 0
        self.release_flow()
        return n

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        if self.settings.single_active_consumer:
            self._sac.append(consumer)
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
                if consumer in self._sac:
                    self._sac.remove(consumer)
                    if self._sac:
                        self.deliver_pending()  # the next consumer in line becomes the active one
                if not self._consumer_count:
                    self.release_flow()
                    if self.settings.expires is not None:
                        self.touch(self.clock())
                return

    @property
    def active_consumer(self) -> Consumer | None:
        """With single active consumer: the one that gets the messages."""
        return self._sac[0] if self._sac else None

    def consumers(self) -> list[Consumer]:
        return [c for _p, g in self._groups for c in g]

    @property
    def consumer_count(self) -> int:
        return self._consumer_count

    @property
    def message_count(self) -> int:
        return len(self._ready) + self._delta

    @property
    def messages_ram(self) -> int:
        return len(self._ready)

    @property
    def messages_paged_out(self) -> int:
        return self._delta

    @property
    def unacked_count(self) -> int:
        return self._unacked

    @property
    def message_bytes(self) -> int:
        return self._ready_bytes + self._delta_bytes

    def delete(self) -> int:
        n = len(self._ready) + self._delta
        if self.index is not None and not self.deleted:
            self.index.delete()
        self.deleted = True
        self._ready.clear()
        self._ready_bytes = 0
        self._delta = self._delta_bytes = 0
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
