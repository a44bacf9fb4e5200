"""A stream as an AMQP 0-9-1 queue: `StreamQueue`, the `Queue` the channel programs against.

Owns: publishing into the stream's log (0-9-1 messages converted to AMQP 1.0 entries, one chunk per loop
turn, confirms settled on commit), consumers as readers of the log with manual acks as credit, the
`x-stream-offset` header on every delivery, filtering, and RabbitMQ's refusals (basic.get, no-ack
consumers, missing prefetch, nack/reject, purge). The log itself is a `StreamHandle` (handle.py).

Rules (RabbitMQ 3.10's stream queues, compared by hand with a running RabbitMQ; texts are its texts):
- basic.get: 540 "basic.get not supported by stream queues queue 'q' in vhost '/'" (connection).
- a consumer with no-ack: 540 "automatic acknowledgement not supported by stream queues …" (connection);
  without a (per-consumer) prefetch: 406 "consumer prefetch count is not set for 'queue 'q' in vhost
  '/''" (channel), also when only a global prefetch is set, as there; a consumer argument of another
  queue type (x-priority) or a bad `x-stream-offset` / `x-stream-filter`: 406. All of these before
  basic.consume-ok (`consumer_start`, asked through the queue type), as RabbitMQ refuses them.
- basic.nack / basic.reject on an open consumer: 540 "basic.nack and basic.reject not supported by
  stream queues …"; unacked deliveries of a closed channel simply go (a stream keeps every message).
- queue.purge: 540 "queue.purge not supported by stream queues …".
- A consumer reads from its `x-stream-offset` (default `next`), at most `prefetch - unacked` messages
  ahead; an ack returns credit. A consumer never holds more than one chunk's records in memory.
- Filtering (RabbitMQ 3.13's): `x-stream-filter-value` on a publish (a header) is the entry's filter
  value; a consumer with `x-stream-filter` (a string or a list) gets only messages with one of those
  values, plus those without a value when `x-stream-match-unfiltered` is true. Whole chunks are skipped
  by their bloom filter. A stream-protocol publisher's filter values are only in the chunk's bloom
  filter, not in its messages: an entry without the header in a chunk whose every entry had a value,
  and which matched the filter, is delivered (as RabbitMQ 3.13+ delivers every entry of a matching
  chunk to an AMQP 0-9-1 consumer; the client filters further).
- A stream-protocol publisher's sub-batches are split into their records (gzip, snappy, lz4 and zstd
  ones decoded, within `chunk.MAX_UNCOMPRESSED_BYTES` per chunk, checked against the declared length
  first); a sub-batch of an unknown codec or that is not what it declares is skipped, logged.
- Work per loop turn is bounded: a consumer delivers at most `DELIVER_BATCH` messages per call, reads a
  chunk `READ_SLICE` records at a time (a compressed sub-batch inflated only when reached: one small
  publish can hold millions of records), looks at most at `READ_WORK` records or chunks skipped by its
  filter (a chunk costs one per filter value, `BloomQuery.cost`) and loads at most `MAX_LOADS` slices
  per call, then yields the loop. Entries that are not AMQP 1.0 messages are logged one line per slice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from hutch.amqp.errors import NOT_IMPLEMENTED, PRECONDITION_FAILED, ChannelError, ConnectionError_
from hutch.core.arguments import validate_consumer_arguments
from hutch.core.confirms import Receipt, ReceiptRun
from hutch.core.message import Message
from hutch.core.queue_settings import QueueSettings
from hutch.core.queue_type import PENDING, SETTLED, Consumer, Deliverer, Published, Queue, QueueEntry
from hutch.core.vhost import rs
from hutch.queues.stream import amqp10
from hutch.queues.stream import chunk as ck
from hutch.queues.stream.offset_spec import OffsetSpec, interval_ms, parse_amqp
from hutch.queues.stream.retention import Retention
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.stream.handle import Appended, StreamHandle, StreamReader

log = logging.getLogger("hutch.stream")

DELIVER_BATCH = 256
READ_SLICE = 256  # records a consumer's chunk is read and converted by at once (ck.RecordCursor)
READ_WORK = 4096  # records (and chunks skipped, per filter value) one `_next_records` call may look at
MAX_LOADS = 4  # slices one consumer may load in a turn (a filter may take none of a slice's messages)
MAX_FORWARDS = 256  # publish batches of one replicated stream waiting for its writer on another node
MAX_CHUNK_ENTRIES = 4096  # publishes gathered in one loop turn go out as chunks of at most this many
FILTER_HEADER = "x-stream-filter-value"


class StreamEntry(QueueEntry):
    """A delivered record: its offset is its `seq`; `consumer` says who it went to."""

    __slots__ = ("consumer",)

    def __init__(self, seq: int, msg: Message, consumer: StreamConsumer) -> None:
        # QueueEntry's fields set here rather than through its __init__: one call fewer per delivery
        # (a stream entry is never redelivered, expires or sits in an index)
        self.seq = seq
        self.msg = msg
        self.redelivered = False
        self.delivery_count = 0
        self.enqueued_at_ms = 0
        self.expires_at_ms = 0
        self.on_disk = False
        self.returns = 0
        self.consumer = consumer


class StreamConsumer:
    """A consumer's reader and the messages of the chunk it is in the middle of.

    Invariant: `pending[next:]` are the chunk's messages not yet delivered (converted once per chunk)."""

    __slots__ = ("consumer", "reader", "pending", "next", "filters", "match_unfiltered", "chunk_all_valued",
                 "query", "cursor")

    def __init__(self, consumer: Consumer, reader: StreamReader, filters: list[bytes] | None,
                 match_unfiltered: bool) -> None:
        self.consumer = consumer
        self.reader = reader
        self.pending: list[tuple[int, Message]] = []
        self.next = 0
        self.filters = None if filters is None else frozenset(filters)  # (a message's test: one lookup)
        self.match_unfiltered = match_unfiltered
        self.query = None if filters is None else ck.BloomQuery(filters, match_unfiltered)  # chunks' test
        self.cursor: ck.RecordCursor | None = None  # the chunk being read, a slice at a time
        # Every entry of the pending chunk has a filter value (in the chunk's bloom filter, maybe not in
        # the message: a stream-protocol publish), and the chunk matched this consumer's filter.
        self.chunk_all_valued = False


def _filter_spec(arguments: dict[str, Any], what: str) -> tuple[list[bytes] | None, bool]:
    raw = arguments.get("x-stream-filter")
    match_unfiltered = bool(arguments.get("x-stream-match-unfiltered", False))
    if raw is None:
        return None, match_unfiltered
    values = raw if isinstance(raw, list) else [raw]
    out: list[bytes] = []
    for v in values:
        if isinstance(v, str):
            out.append(v.encode())
        elif isinstance(v, bytes):
            out.append(v)
        else:
            raise ChannelError(PRECONDITION_FAILED, f"invalid x-stream-filter for {what}", 60, 20)
    return out, match_unfiltered


def retention_of(arguments: dict[str, Any], policy: dict[str, Any]) -> Retention:
    """The retention limits: a policy's `max-length-bytes` / `max-age` over the x-arguments (as RabbitMQ
    resolves them for streams: the policy wins only where the argument is absent)."""
    max_bytes = arguments.get("x-max-length-bytes", policy.get("max-length-bytes"))
    age = arguments.get("x-max-age", policy.get("max-age"))
    age_ms = None
    if isinstance(age, str | bytes):
        age_ms = interval_ms(age.decode() if isinstance(age, bytes) else age)
    return Retention(int(max_bytes) if isinstance(max_bytes, int) else None, age_ms)


class Replication(Protocol):
    """What a replicated stream's queue asks of the node's stream replication (its `StreamRoute`,
    runtime/queue_types/stream_replication/service.py)."""

    def writes_here(self) -> bool: ...

    async def append(self, entries: list[bytes], filters: list[bytes | None] | None) -> None: ...

    def placement(self) -> dict[str, Any]: ...


def _position(sc: StreamConsumer) -> int:
    """The offset a consumer gets next: the first record of its chunk in hand, else its reader's."""
    return sc.pending[sc.next][0] if sc.next < len(sc.pending) else sc.reader.next_offset


class StreamQueue(Queue):
    queue_type = "stream"

    def __init__(self, vhost: str, name: str, arguments: dict[str, Any], handle: StreamHandle, stream_id: int,
                 clock: Clock) -> None:
        super().__init__(vhost, name, True, None, False, arguments)
        self.handle = handle
        self.stream_id = stream_id
        self.clock = clock
        self.node_name = ""  # the node holding the log (set by the queue type; management shows it)
        self._what = rs("queue", name, vhost)
        self._consumers: dict[Consumer, StreamConsumer] = {}
        self._batch: list[bytes] = []
        self._batch_filters: list[bytes | None] = []
        self._batch_receipts: list[Receipt | ReceiptRun] = []
        self._flush_scheduled = False
        self._deliver_scheduled = False
        self._remove_listener: Callable[[], None] = handle.on_commit(self._committed)
        self.replication: Replication | None = None  # a replicated stream (None: one member, this node's)
        self.members: list[str] = []  # the nodes holding the stream (set by the queue type)
        self._forwards: set[asyncio.Task[None]] = set()
        handle.options.retention = retention_of(arguments, self.settings.effective_policy_definition)

    def apply_settings(self, settings: QueueSettings) -> None:
        super().apply_settings(settings)
        if hasattr(self, "handle"):  # (the base class's __init__ applies settings before the handle is set)
            policy = settings.effective_policy_definition
            size = self.arguments.get("x-stream-max-segment-size-bytes", policy.get("stream-max-segment-size-bytes"))
            if isinstance(size, int) and size > 0:
                self.handle.log.options.max_segment_size_bytes = size
            self.handle.set_retention(retention_of(self.arguments, policy))

    # -- publishing ---------------------------------------------------------------------------------
    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        if self.deleted:
            return SETTLED
        self.stat_published += 1
        raw = msg.properties_raw
        headers = msg.properties.headers if raw[0] & 0x20 else None  # the headers flag, before decoding
        value = headers.get(FILTER_HEADER) if headers else None
        self._batch.append(amqp10.from_091(msg))
        self._batch_filters.append(value.encode() if isinstance(value, str) else
                                   value if isinstance(value, bytes) else None)
        return self._queued(receipt)

    accepts_raw = True

    def publish_raw(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes, route_tail: bytes,
                    header: bytes, receipt: Receipt | None = None) -> Published:
        """The channel's publish lane: a plain message (no property but the delivery mode: no filter value
        to read) becomes its entry without a `Message`; any other goes through `publish`."""
        mode = amqp10.plain_mode(props_raw)
        if mode is False or self.deleted:
            return self.publish(Message(exchange, routing_key, None, body, props_raw, route_tail, header), receipt)
        self.stat_published += 1
        self._batch.append(amqp10.plain_entry(exchange, routing_key, mode, body))
        self._batch_filters.append(None)
        return self._queued(receipt)

    def publish_raw_run(self, exchange: str, routing_key: str, route_tail: bytes, contents: list[tuple[bytes, bytes]],
                        receipts: ReceiptRun | None = None) -> list[Published]:
        """The lane's run: its entries made in one pass (`amqp10.plain_entries`), its receipts kept as one."""
        if self.deleted:
            return super().publish_raw_run(exchange, routing_key, route_tail, contents, receipts)
        n = len(contents)
        self.stat_published += n
        self._batch += amqp10.plain_entries(exchange, routing_key, route_tail, contents)
        self._batch_filters += [None] * n
        return [self._queued(receipts)] * n

    def _queued(self, receipt: Receipt | ReceiptRun | None) -> Published:
        """What was just added to the batch waits for this turn's flush; `receipt`, if any, settles on commit."""
        if receipt is not None:
            self._batch_receipts.append(receipt)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return PENDING if receipt is not None else SETTLED

    def _flush(self) -> None:
        """Write what this loop turn published as chunks; their receipts settle on commit."""
        self._flush_scheduled = False
        batch, filters, receipts = self._batch, self._batch_filters, self._batch_receipts
        self._batch, self._batch_filters, self._batch_receipts = [], [], []
        if self.deleted or not batch:
            for r in receipts:
                r.settle(self)
            return
        use_filters = any(f is not None for f in filters)
        if self.replication is not None and not self.replication.writes_here():
            self._forward(batch, filters if use_filters else None, receipts)
            return
        last: Appended | None = None
        try:
            for i in range(0, len(batch), MAX_CHUNK_ENTRIES):
                last = self.handle.append(batch[i:i + MAX_CHUNK_ENTRIES],
                                          filter_values=filters[i:i + MAX_CHUNK_ENTRIES] if use_filters else None)
        except Exception as exc:  # noqa: BLE001 - a storage failure nacks the publishes (logged by the handle)
            for r in receipts:
                r.reject(self, str(exc))
            return
        if receipts and last is not None:
            last.settled.add_done_callback(lambda fut: self._settle(fut, receipts))

    def _forward(self, batch: list[bytes], filters: list[bytes | None] | None,
                 receipts: list[Receipt | ReceiptRun]) -> None:
        """A replicated stream written on another node: the batch goes to its writer (replication's
        `append`); the receipts settle once a majority has it, or are rejected (nack)."""
        assert self.replication is not None
        if len(self._forwards) >= MAX_FORWARDS:
            log.warning("stream %s: %d publish batches already wait for the writer; %d publishes refused",
                        self._what, len(self._forwards), len(batch))
            for r in receipts:
                r.reject(self, "the stream's writer is not keeping up")
            return
        task = asyncio.get_running_loop().create_task(self.replication.append(batch, filters))
        self._forwards.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._forwards.discard(t)
            error = "cancelled" if t.cancelled() else t.exception()
            if error is not None and not receipts:
                log.warning("stream %s: %d publishes not written: %r", self._what, len(batch), error)
            for r in receipts:
                if error is None:
                    r.settle(self)
                else:
                    r.reject(self, str(error))
        task.add_done_callback(done)

    def readers_moved(self, handle: StreamHandle) -> None:
        """Replication reopened the log (a cut, an emptying): go on with `handle`, every consumer from the
        offset its reader had reached (what was cut was never committed, so never delivered)."""
        self._remove_listener()
        self.handle = handle
        self._remove_listener = handle.on_commit(self._committed)
        for sc in self._consumers.values():
            sc.reader = handle.reader(OffsetSpec.offset(sc.reader.next_offset))
        self._schedule_delivery()

    def _settle(self, fut: asyncio.Future[None], receipts: list[Receipt | ReceiptRun]) -> None:
        error = None if fut.cancelled() else fut.exception()
        for r in receipts:
            if error is None:
                r.settle(self)
            else:
                r.reject(self, str(error))

    # -- refusals -----------------------------------------------------------------------------------
    def get(self, channel: Deliverer | None, no_ack: bool) -> QueueEntry | None:
        raise ConnectionError_(NOT_IMPLEMENTED, f"basic.get not supported by stream queues {self._what}", 60, 70)

    def purge(self) -> int:
        raise ConnectionError_(NOT_IMPLEMENTED, f"queue.purge not supported by stream queues {self._what}", 50, 30)

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        self.stat_acked += sum(1 for _ in entries)
        self._schedule_delivery()

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        if any(isinstance(e, StreamEntry) and e.consumer.consumer in self._consumers for e in entries):
            raise ConnectionError_(NOT_IMPLEMENTED,
                                   f"basic.nack and basic.reject not supported by stream queues {self._what}", 60, 120)
        # a closed channel's deliveries: nothing to give back, the log keeps them

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        raise ConnectionError_(NOT_IMPLEMENTED,
                               f"basic.nack and basic.reject not supported by stream queues {self._what}", 60, 120)

    # -- consumers ----------------------------------------------------------------------------------
    def consumer_start(self, consumer: Consumer) -> tuple[OffsetSpec, list[bytes] | None, bool]:
        """Where `consumer` starts reading and its filter, or the error that refuses it (the module's
        rules). The queue type asks this before basic.consume answers consume-ok; `add_consumer` again."""
        if consumer.no_ack:
            raise ConnectionError_(NOT_IMPLEMENTED,
                                   f"automatic acknowledgement not supported by stream queues {self._what}", 60, 20)
        if not consumer.prefetch:
            raise ChannelError(PRECONDITION_FAILED, f"consumer prefetch count is not set for '{self._what}'", 60, 20)
        args = consumer.arguments
        validate_consumer_arguments(self.name, self.vhost, "stream", args)
        try:
            spec = parse_amqp(args["x-stream-offset"], self.clock.wall_ms()) if "x-stream-offset" in args \
                else OffsetSpec.next()
        except ValueError as exc:
            raise ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for {self._what}: {exc}",
                               60, 20) from exc
        filters, match_unfiltered = _filter_spec(args, self._what)
        return spec, filters, match_unfiltered

    def add_consumer(self, consumer: Consumer) -> None:
        spec, filters, match_unfiltered = self.consumer_start(consumer)
        self._consumers[consumer] = StreamConsumer(consumer, self.handle.reader(spec), filters, match_unfiltered)
        self.had_consumers = True
        self._schedule_delivery()

    def remove_consumer(self, consumer: Consumer) -> None:
        sc = self._consumers.pop(consumer, None)
        if sc is not None:
            sc.reader.close()

    def consumers(self) -> list[Consumer]:
        return list(self._consumers)

    def consumer_offsets(self) -> dict[str, int]:
        """Each consumer's next offset (management)."""
        return {c.tag: _position(sc) for c, sc in self._consumers.items()}

    def consumer_info(self, consumer: Consumer) -> dict[str, Any]:
        """Where `consumer` reads (management): `offset`, the next it gets; `offset_lag`, the committed
        offsets past it; `credits`, how many more it may have unacknowledged (its prefetch less its unacked)."""
        sc = self._consumers.get(consumer)
        if sc is None:
            return {}
        offset = _position(sc)
        return {"offset": offset, "offset_lag": max(0, self.handle.committed_offset + 1 - offset),
                "credits": max(0, consumer.prefetch - consumer.unacked)}

    def max_offset_lag(self) -> int:
        """The largest `offset_lag` of this stream's consumers (0 without any)."""
        committed = self.handle.committed_offset + 1
        return max((max(0, committed - _position(sc)) for sc in self._consumers.values()), default=0)

    # -- delivering ---------------------------------------------------------------------------------
    def _committed(self) -> None:
        self._schedule_delivery()

    def _schedule_delivery(self) -> None:
        if not self._deliver_scheduled and self._consumers:
            self._deliver_scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver_soon)

    def _deliver_soon(self) -> None:
        self._deliver_scheduled = False
        self.deliver_pending()

    def deliver_pending(self) -> None:
        if self.deleted:
            return
        more = False
        for sc in list(self._consumers.values()):
            more |= self._deliver_to(sc)
        if more:
            self._schedule_delivery()

    def _deliver_to(self, sc: StreamConsumer) -> bool:
        """Deliver what the consumer's credit allows, at most DELIVER_BATCH; True if it could take more
        and more is there (so the caller comes back next loop turn). The messages of a chunk are built
        at once (`_next_records`); per message only the credit check and the channel's delivery remain."""
        consumer = sc.consumer
        channel = consumer.channel
        conn = channel.conn
        filters = sc.filters
        # a session channel's `deliver_run` (a run of a chunk in one call); other deliverers, one by one
        run = getattr(channel, "deliver_run", None)
        sent = loads = 0
        while not conn.write_paused and consumer.can_take():
            if sent >= DELIVER_BATCH:
                return True
            pending, i = sc.pending, sc.next
            if i >= len(pending):
                loaded = self._next_records(sc)
                if not loaded:
                    return loaded is None  # (None: this turn's reading is spent, more next turn)
                loads += 1
                if loads > MAX_LOADS:
                    return True
                continue
            # as many as the credit, the batch and this chunk allow, without asking again per message
            room = consumer.prefetch - consumer.unacked if consumer.prefetch else DELIVER_BATCH
            stop = min(len(pending), i + min(room, DELIVER_BATCH - sent))
            before = consumer.unacked
            if filters is None and run is not None:  # the channel delivers the run in one call
                reached = run(consumer, self, pending, i, stop, StreamEntry, sc)
                consumer.unacked += reached - i
                i = reached
            else:
                while i < stop and channel.can_take():
                    offset, msg = pending[i]
                    i += 1
                    if filters is not None and not self._wanted(sc, msg):
                        continue
                    consumer.unacked += 1
                    channel.deliver(consumer, self, StreamEntry(offset, msg, sc))
            sc.next = i
            n = consumer.unacked - before
            consumer.delivered += n
            self.stat_delivered += n
            sent += n
            if stop - i > 0:  # the channel's own limit stopped it
                return False
        return False

    @staticmethod
    def _wanted(sc: StreamConsumer, msg: Message) -> bool:
        """A filtering consumer's test (the properties are decoded only for such a consumer)."""
        headers = msg.properties.headers
        value = headers.get(FILTER_HEADER) if headers else None
        wanted = value.encode() if isinstance(value, str) else value
        assert sc.filters is not None
        return wanted in sc.filters if wanted else sc.match_unfiltered or sc.chunk_all_valued

    def _next_records(self, sc: StreamConsumer) -> bool | None:
        """Load the consumer's next slice of messages (a chunk is read `READ_SLICE` records at a time,
        skipping chunks its filter rules out): True when loaded, False when the log has no more now,
        None when this turn's `READ_WORK` is spent first (the caller comes back next turn)."""
        work = 0
        while work < READ_WORK:
            cursor = sc.cursor
            if cursor is None:
                chunk = sc.reader.next_chunk()
                if chunk is None:
                    return False
                work += 1 if sc.query is None else sc.query.cost
                if not ck.verify(chunk.raw):  # damaged on disk since it was written: never delivered as is
                    log.error("stream %s: chunk %d fails its CRC; its %d records are skipped", self._what,
                              chunk.header.chunk_id, chunk.header.num_records)
                    continue
                if sc.query is not None:
                    _, bits, _, _ = ck.parts(chunk.raw)
                    if not sc.query.may_match(bits):
                        continue
                    sc.chunk_all_valued = ck.bloom_all_valued(bytes(bits))
                if chunk.header.chunk_type != ck.USER:
                    continue
                cursor = sc.cursor = ck.RecordCursor(chunk.raw, chunk.start)
            skipped: list[tuple[int, int, str]] = []
            cursor.skipped = skipped
            records = cursor.take(READ_SLICE)
            work += READ_SLICE
            if cursor.done:
                sc.cursor = None
            bad: list[tuple[int, str]] = []
            sc.pending = amqp10.to_091_list(records, self.name, bad) if records else []
            sc.next = 0
            for offset, count, why in skipped:
                log.warning("stream %s: the sub-batch of %d records at offset %d is skipped: %s",
                            self._what, count, offset, why)
            if bad:  # (one line for a slice: a chunk may hold millions of such entries)
                log.warning("stream %s: %d entries from offset %d are not AMQP 1.0 messages (%s); skipped",
                            self._what, len(bad), bad[0][0], bad[0][1])
            if sc.pending:
                return True
        return None

    # -- counts and info ----------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """0, as RabbitMQ answers for a stream in declare-ok and queue.delete (so if-empty deletes it);
        management shows the log's length instead (`log_length`, info)."""
        return 0

    @property
    def log_length(self) -> int:
        """The offsets from the first to the last committed one (records and tracking entries)."""
        h = self.handle
        return max(0, h.committed_offset + 1 - h.first_offset)

    @property
    def unacked_count(self) -> int:
        return sum(c.unacked for c in self._consumers)

    @property
    def message_bytes(self) -> int:
        return self.handle.size_bytes

    def delete(self) -> int:
        self.deleted = True
        self._remove_listener()
        for task in list(self._forwards):
            task.cancel()
        for receipt in self._batch_receipts:
            receipt.settle(self)
        self._batch_receipts = []
        consumers = list(self._consumers)
        for sc in self._consumers.values():
            sc.reader.close()
        self._consumers.clear()
        for c in consumers:
            c.channel.consumer_cancelled_by_broker(c)
        return 0

    def info(self) -> dict[str, Any]:
        out = super().info()
        h = self.handle
        length = self.log_length
        out.update({
            "messages": length, "messages_ready": length, "messages_unacknowledged": 0,
            "segments": h.segment_count, "first_offset": h.first_offset, "committed_offset": h.committed_offset,
            "last_offset": h.next_offset - 1, "consumer_offsets": self.consumer_offsets(),
            "leader": self.node_name, "members": [self.node_name], "online": [self.node_name],
        })
        if self.replication is not None:
            out.update(self.replication.placement())
        return out
