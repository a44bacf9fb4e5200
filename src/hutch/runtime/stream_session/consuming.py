"""Subscriptions of a stream-protocol connection: subscribe with credit, deliver chunks, offsets, SAC.

Owns: the connection's subscriptions (id → stream, reader, credit, filter), the delivery pump (a chunk
per credit, read from the files by the handle's `StreamReader` and sent as osiris sends it: the chunk's
48-byte header then its entry data, without the bloom filter or the trailer; `Deliver` version 2 with
the committed chunk id when the client asked for it), waking on the handle's commits, server-side
offset tracking (store/query offset by reference; stored offsets coalesced, `coalesce_offsets`), and single active consumer (groups in sac.py,
on this node or on the stream's writer's, through sac_router.py: a passive subscription reads nothing until a ConsumerUpdate made it active and its client
answered with where to start).

Rules: the pump sends at most `PUMP_CHUNKS` chunks per turn (then yields to the loop), hands what it
read to the transport every `FLUSH_BYTES`, and stops while the transport's write buffer is full; a filter skips chunks whose bloom filter cannot match, at most
`PUMP_SKIPS` units of work per turn (a chunk looked at costs one per filter value, at most 2,049:
`BloomQuery.cost`); a subscribe of many filter values is prepared in steps before it is applied (`prepare`). A subscription holds a reader (a position), never the log.
The bytes a subscription keeps for its properties and filter values (`properties_cost`, in proportion to
what Python keeps for them) are counted against the connection's and the process's budget
(hub.PropertiesBudget): a subscribe past it is refused with PRECONDITION_FAILED, as RabbitMQ answers a
subscribe past its subscriptions per connection, and logged (throttled); `prepare` stops at once when a
frame is over what the connection may still take. A subscription to a
stream whose one copy on a node of workers is another worker's (`StreamCatalog.home`) reads there
(home_link.py, `StreamReaderLink`): its chunks arrive as stored, each for a credit the client gave, and
wait (`backlog`) while the client's socket is full.

Stored offsets (`store_offset` has no answer, so nothing paces a client that floods it) are kept per
(stream, reference), the last one winning, and written by `coalesce_offsets`: before the connection
handles any other command (so a `query_offset`, or any later command, sees them; rstream and the js
client query right after they store) and at the end of every turn of its input. Each stream gets one
TRACKING_DELTA chunk a turn with one entry per reference, so a flood of `store_offset` for one reference
writes one entry a turn, not one chunk a command (before: each was a chunk of its own, and a flood filled
the log until retention). osiris writes tracking the same way: its writer batches what arrived while it
wrote, and the tracking of a batch goes in one chunk. A stored offset is written in the turn it
arrived, so it survives a restart once that chunk is synced, as before.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hutch.core.logsafe import suppressed_note
from hutch.queues.stream import chunk as ck
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamReader
from hutch.runtime.stream_session import super_streams
from hutch.runtime.stream_session.home_link import (
    CONNECTION_REMOTE_WINDOW,
    REMOTE_WINDOW,
    RemoteRead,
    core_spec,
    filter_query,
    next_match,
    reader_for,
)
from hutch.runtime.stream_session.ports import StreamSession
from hutch.runtime.stream_session.sac import GroupKey, Member, Notify
from hutch.storage.errors import StorageError
from hutch.streamproto import commands as c
from hutch.streamproto.codes import MAX_REFERENCE_CHARS, Code, OffsetType
from hutch.streamproto.errors import CommandError
from hutch.streamproto.wire import OffsetSpec, Steps

log = logging.getLogger("hutch.stream")

PUMP_CHUNKS = 64
PUMP_SKIPS = 4096
PREPARE_ITEMS = 2048  # a subscribe's properties looked at in one step of `prepare`
PROPERTY_BYTES = 160  # what a kept property costs beyond its characters: a dict slot and two str objects
#                       (tracemalloc: 140-165 bytes an entry of a decoded subscribe's map)
FILTER_VALUE_BYTES = 48  # and a filter value, beyond its length: its bytes object and its place in two lists
FLUSH_BYTES = 1 << 20  # chunk data put in the output before it is handed to the transport (whose high
#                        mark then pauses the pump): without it one turn of 256 subscriptions × PUMP_CHUNKS
#                        chunks of a stream of large chunks would be read into memory before any write


def properties_cost(properties: dict[str, str], keys: Iterable[str]) -> int:
    """The bytes a subscription keeps for the properties `keys` of `properties` (and for their filter
    values, `filter.N`): their characters and what Python keeps for each (`PROPERTY_BYTES`,
    `FILTER_VALUE_BYTES`). A 1 MiB subscribe of 45,000 short `filter.N` costs ~10 MiB (tracemalloc
    counted 9.6 MiB), a subscribe of a handful of properties ~1 KiB."""
    return pairs_cost((key, properties[key]) for key in keys)


def pairs_cost(pairs: Iterable[tuple[str, str]]) -> int:
    """`properties_cost` of (key, value) pairs (a map as its decoding reads it, repeated keys and all)."""
    cost = 0
    for key, value in pairs:
        cost += len(key) + len(value) + PROPERTY_BYTES
        if key.startswith("filter."):
            cost += len(value) + FILTER_VALUE_BYTES
    return cost


@dataclass(eq=False)
class Prepared:
    """A subscribe's work done ahead (`Consuming.decode_subscribe`, `prepare`): its filter values and
    query and its cost, reserved in the budget; or why it is refused (nothing reserved)."""

    cmd: c.Subscribe
    values: list[bytes] = field(default_factory=list)
    query: ck.BloomQuery | None = None
    cost: int = 0
    refused: str | None = None


@dataclass(eq=False)
class Subscription:
    subscription_id: int
    stream: str
    handle: StreamHandle | None  # None: read in the stream's home worker (`remote`)
    spec: OffsetSpec
    credit: int
    properties: dict[str, str]
    filter_values: list[bytes] = field(default_factory=list)
    match_unfiltered: bool = False
    query: ck.BloomQuery | None = None  # the filter as matched against chunks (None: no filter)
    reader: StreamReader | None = None
    unwatch: Callable[[], None] | None = None
    sac_key: GroupKey | None = None
    sac_member: Member | None = None
    wake_scheduled: bool = False
    chunks_sent: int = 0
    records_sent: int = 0
    home: str | None = None  # the worker holding the stream's copy, when it is not this one
    remote: RemoteRead | None = None  # its reader there, while active
    backlog: deque[tuple[bytes, int]] = field(default_factory=deque)  # (chunk, committed) for a full socket
    granted: int = 0  # read remotely: chunks the home may still send (home_link.REMOTE_WINDOW at most)
    next_offset: int | None = None  # read remotely: the offset after the last chunk delivered
    committed_offset: int = -1  # read remotely: the stream's committed chunk id as last told
    kept_bytes: int = 0  # its properties and filter values, as counted by `properties_cost`

    @property
    def active(self) -> bool:
        return self.reader is not None or self.remote is not None


class Consuming:
    """The consuming half of one connection."""

    def __init__(self, conn: StreamSession) -> None:
        self.conn = conn
        self.subscriptions: dict[int, Subscription] = {}
        self.deliver_version = 1
        self.pending_updates: dict[int, tuple[Subscription, bool]] = {}  # correlation id → (sub, active)
        self._next_remote = 0  # where `_top_up` starts next (round-robin over the remote subscriptions)
        # stream → reference → offset, stored since the last `coalesce_offsets` (at most a turn's commands)
        self.pending_offsets: dict[str, dict[bytes, int]] = {}
        self._prepared: Prepared | None = None  # a subscribe's work done ahead
        self.kept_bytes = 0  # Invariant: the subscriptions' `kept_bytes` + `reserved`, as the budget counts it
        self.reserved = 0  # of them, a subscribe's being decoded or prepared (`decode_subscribe`, `prepare`)

    # -- the bytes kept for properties (hub.PropertiesBudget) ------------------------------------------
    def _reserve(self, cost: int) -> str | None:
        """Count `cost` more bytes of a subscribe in hand; else why not (nothing counted)."""
        refused = self.conn.hub.properties.admit(self.kept_bytes, cost)
        if refused is None:
            self.kept_bytes += cost
            self.reserved += cost
        return refused

    def _unreserve(self, cost: int | None = None) -> None:
        """Give back `cost` (all, by default) of what a subscribe in hand counted."""
        cost = self.reserved if cost is None else cost
        assert 0 <= cost <= self.reserved
        if cost:
            self.conn.hub.properties.release(self.kept_bytes, cost)
            self.kept_bytes -= cost
            self.reserved -= cost

    def decode_subscribe(self, frame: bytes) -> Steps:
        """A large subscribe's decoding in steps (`commands.decode_steps`), with what its properties hold
        so far counted against the budget as they are read (`pairs_cost`): past it the decoding stops
        (what it read is dropped) and the command is its fields before the properties
        (`commands.subscribe_head`), which `subscribe` refuses after its other checks. So a flood of
        such frames from many connections holds at most the budget in decoded properties, not a frame's
        ~10 MiB each."""
        self._unreserve()
        steps = c.decode_steps(frame)
        seen = 0
        try:
            while True:
                read = next(steps)
                if isinstance(read, list):
                    refused = self._reserve(pairs_cost(read[seen:]))
                    seen = len(read)
                    if refused is not None:
                        steps.close()
                        self._unreserve()
                        head = c.subscribe_head(frame)
                        self._prepared = Prepared(head, refused=refused)
                        return head
                yield
        except StopIteration as done:
            return done.value

    def prepare(self, cmd: c.Subscribe) -> Steps:
        """The work of a subscribe in proportion to its properties, done ahead in steps that the
        connection spreads over loop turns as it decodes a large frame (connection.py, `STEP_BYTES`): its
        exact cost (`properties_cost`; what `decode_subscribe` reserved is settled to it) and filter
        values (`PREPARE_ITEMS` properties a step) and their `BloomQuery` (`BloomQuery.build`), hashed
        for the stream's filter size when the stream is read here (`BloomQuery.prepare`). Past what the connection may
        take it stops. `subscribe` takes what was prepared for that command; anything it refuses is
        refused there, as for any subscribe."""
        if self._prepared is not None and self._prepared.cmd is cmd:
            return  # refused while it was decoded
        props = cmd.properties
        keys = list(props)
        values: list[bytes] = []
        limit = self.reserved + self.conn.hub.properties.room(self.kept_bytes)
        cost = 0
        for start in range(0, len(keys), PREPARE_ITEMS):
            if start:
                yield
            part = keys[start:start + PREPARE_ITEMS]
            cost += properties_cost(props, part)
            if cost > limit:
                break
            values += [props[k].encode() for k in part if k.startswith("filter.")]
        refused = self._reserve(cost - self.reserved) if cost > self.reserved else None
        if refused is not None:
            self._unreserve()
            self._prepared = Prepared(cmd, refused=refused)
            return
        self._unreserve(self.reserved - cost)
        query = None
        if values:
            yield
            query = yield from ck.BloomQuery.build(values, props.get("match-unfiltered", "").lower() == "true")
        handle = self.conn.catalog.lookup(self.conn.vhost.name, cmd.stream)
        if query is not None and handle is not None and not handle.closed:
            yield from query.prepare(handle.options.filter_size_bytes * 8)
        self._prepared = Prepared(cmd, values, query, cost)

    # -- subscribe / unsubscribe --------------------------------------------------------------------
    def subscribe(self, cmd: c.Subscribe) -> None:
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared.cmd is not cmd:
            prepared = None
            self._unreserve()  # (a subscribe in hand is this one)
        try:
            self._subscribe(cmd, prepared)
        finally:
            self._unreserve()  # refused: nothing kept (taken: `reserved` is the subscription's now)

    def _subscribe(self, cmd: c.Subscribe, prepared: Prepared | None) -> None:
        conn = self.conn
        if cmd.subscription_id in self.subscriptions:
            raise CommandError(f"subscription {cmd.subscription_id} exists", Code.SUBSCRIPTION_ID_ALREADY_EXISTS)
        home = conn.hub.reader_link.home(conn.vhost.name, cmd.stream)
        handle = None if home is not None else conn.stream_handle(cmd.stream)
        conn.check_permission("read", cmd.stream)
        props = cmd.properties
        sac = props.get("single-active-consumer", "").lower() == "true"
        name = props.get("name", "")
        if sac and not name:
            raise CommandError("single active consumer needs a name", Code.PRECONDITION_FAILED)
        if prepared is None:  # (a frame of at most STEP_BYTES: a few hundred properties)
            cost = properties_cost(props, props)
            prepared = Prepared(cmd, cost=cost, refused=self._reserve(cost))
            if prepared.refused is None:
                prepared.values = [v.encode() for k, v in props.items() if k.startswith("filter.")]
                prepared.query = filter_query(prepared.values, props.get("match-unfiltered", "").lower() == "true")
        if prepared.refused is not None:
            left_out = conn.hub.properties.refusals_log.admit(conn.clock.time())
            if left_out is not None:
                log.warning("stream connection %s: subscribe %d to %s refused: %s%s", conn.name,
                            cmd.subscription_id, cmd.stream, prepared.refused, suppressed_note(left_out))
            raise CommandError(f"subscription {cmd.subscription_id}: {prepared.refused}", Code.PRECONDITION_FAILED)
        assert self.reserved == prepared.cost
        sub = Subscription(cmd.subscription_id, cmd.stream, handle, cmd.offset, cmd.credit, props, prepared.values,
                           props.get("match-unfiltered", "").lower() == "true", query=prepared.query, home=home,
                           kept_bytes=prepared.cost)
        self.reserved = 0  # (the subscription's now: still in `kept_bytes`)
        self.subscriptions[sub.subscription_id] = sub
        if handle is not None:
            sub.unwatch = handle.on_commit(lambda: self._wake(sub))
        conn.respond(cmd, Code.OK)
        if not sac:
            self._start(sub, cmd.offset)
            return
        index = -1
        if "super-stream" in props:
            index = super_streams.partition_index(conn.vhost, props["super-stream"], cmd.stream)
        sub.sac_key = (conn.vhost.name, cmd.stream, name)
        sub.sac_member = conn.hub.sac_router.join(conn, sub.subscription_id, sub.sac_key, index)

    def unsubscribe(self, cmd: c.Unsubscribe) -> None:
        sub = self.subscriptions.get(cmd.subscription_id)
        if sub is None:
            raise CommandError(f"subscription {cmd.subscription_id} does not exist",
                               Code.SUBSCRIPTION_ID_DOES_NOT_EXIST)
        self._remove(sub)
        self.conn.respond(cmd, Code.OK)

    def _remove(self, sub: Subscription) -> None:
        if self.subscriptions.pop(sub.subscription_id, None) is sub:
            self.conn.hub.properties.release(self.kept_bytes, sub.kept_bytes)
            self.kept_bytes -= sub.kept_bytes
        if sub.unwatch is not None:
            sub.unwatch()
        self._stop_reading(sub)
        if sub.sac_key is not None and sub.sac_member is not None:
            self.conn.hub.sac_router.leave(sub.sac_key, sub.sac_member)

    def _stop_reading(self, sub: Subscription) -> None:
        if sub.reader is not None:
            sub.reader.close()
        sub.reader = None
        if sub.remote is not None:
            self.conn.hub.reader_link.close(sub.remote)
        sub.remote = None
        sub.backlog.clear()

    def close_all(self) -> None:
        for sub in list(self.subscriptions.values()):
            self._remove(sub)
        self._prepared = None
        self._unreserve()

    def info(self) -> list[dict[str, object]]:
        """What management shows of each subscription (RabbitMQ's stream consumer fields); `offset_lag`:
        the committed offsets past the one it reads next (0 when it is caught up; None while inactive).
        A stream's committed offset (which may read a chunk header) is read once per call."""
        committed: dict[int, int] = {}

        def lag(sub: Subscription) -> int | None:
            if sub.remote is not None and sub.next_offset is not None:
                return max(0, sub.committed_offset + 1 - sub.next_offset)
            if sub.reader is None or sub.handle is None:
                return None
            end = committed.get(id(sub.handle))
            if end is None:
                end = committed[id(sub.handle)] = sub.handle.committed_offset + 1
            return max(0, end - sub.reader.next_offset)

        def activity(sub: Subscription) -> str:  # RabbitMQ's: up, or single_active / waiting in a group
            if sub.sac_member is None:
                return "up"
            return "single_active" if sub.active else "waiting"

        return [{"subscription_id": s.subscription_id, "stream": s.stream, "credits": s.credit,
                 "offset": s.reader.next_offset if s.reader is not None else s.next_offset,
                 "offset_lag": lag(s),
                 "messages_consumed": s.records_sent, "chunks_delivered": s.chunks_sent,
                 "active": s.active, "activity_status": activity(s),
                 "properties": dict(s.properties)}
                for s in self.subscriptions.values()]

    def stream_gone(self, stream: str) -> bool:
        gone = [s for s in self.subscriptions.values() if s.stream == stream]
        for sub in gone:
            self._remove(sub)
        return bool(gone)

    # -- credit and delivery ------------------------------------------------------------------------
    def credit(self, cmd: c.Credit) -> None:
        sub = self.subscriptions.get(cmd.subscription_id)
        if sub is None:
            self.conn.send(c.CreditResponse(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST, cmd.subscription_id))
            return
        sub.credit = min(sub.credit + max(cmd.credit, 0), 1 << 20)
        self.pump(sub)

    def _start(self, sub: Subscription, spec: OffsetSpec) -> None:
        handle = sub.handle
        if handle is None:
            assert sub.home is not None
            self.conn.hub.reader_link.open(self, sub, sub.home, spec)
            self._top_up()
            return
        sub.reader = reader_for(handle, core_spec(spec), spec.type == OffsetType.LAST)
        # time to the first message: the subscribe's response leaves now, and the first chunk alone right
        # after it; the rest of the credit follows from the next loop turn (not up to PUMP_CHUNKS chunks
        # read, joined and written before the client sees anything)
        self.conn.flush()
        self.pump(sub, max_chunks=1)
        self.conn.flush()

    def _wake(self, sub: Subscription) -> None:
        if not sub.wake_scheduled and sub.reader is not None and sub.credit > 0:
            sub.wake_scheduled = True
            self.conn.clock.call_soon(lambda: self._woken(sub))

    def _woken(self, sub: Subscription) -> None:
        sub.wake_scheduled = False
        if self.subscriptions.get(sub.subscription_id) is sub:
            self.pump(sub)
            self.conn.flush()

    def pump_all(self) -> None:
        for sub in list(self.subscriptions.values()):
            self.pump(sub)

    def pump(self, sub: Subscription, max_chunks: int = PUMP_CHUNKS) -> None:
        """Send chunks while the subscription has credit and the transport takes them (at most
        `max_chunks` in this call; it goes on next loop turn)."""
        conn = self.conn
        if sub.handle is None:
            self._deliver_backlog(sub)
            return
        if sub.handle.closed or conn.catalog.lookup(conn.vhost.name, sub.stream) is not sub.handle:
            # deleted by another path (AMQP 0-9-1, management): tell every user of it
            conn.hub.stream_deleted(conn.vhost.name, sub.stream)
            return
        sent = skipped = unwritten = 0
        while sub.credit > 0 and sub.reader is not None and conn.can_deliver():
            if unwritten >= FLUSH_BYTES:  # to the transport now: past its high mark it pauses this pump
                conn.flush()
                unwritten = 0
                continue
            if sent >= max_chunks or skipped >= PUMP_SKIPS:
                self._wake(sub)  # go on next turn: other connections get the loop meanwhile
                return
            found, n = next_match(sub.reader, sub.query, PUMP_SKIPS - skipped)
            skipped += n
            if found is None:
                if skipped >= PUMP_SKIPS:
                    self._wake(sub)
                return
            header, head, data = found
            committed = sub.handle.committed_chunk_id if self.deliver_version == 2 else None
            conn.out.append(c.deliver_header(sub.subscription_id, ck.HEADER_SIZE + len(data), committed))
            conn.out.append(head)
            conn.out.append(data)  # a view of the chunk read: copied once, by the flush's join
            unwritten += len(data)
            sub.credit -= 1
            sub.chunks_sent += 1
            sub.records_sent += header.num_records
            conn.hub.counters.messages_delivered += header.num_records
            sent += 1

    def deliver_remote(self, sub: Subscription, chunks: list[bytes], committed: int) -> None:
        """Chunks read for `sub` in its stream's home (each took a credit there): to the client now, or
        once its socket has room."""
        if self.subscriptions.get(sub.subscription_id) is not sub or sub.remote is None:
            return
        sub.granted = max(0, sub.granted - len(chunks))
        sub.backlog.extend((raw, committed) for raw in chunks)
        self._deliver_backlog(sub)
        self.conn.want_flush()

    def remote_lost(self, sub: Subscription) -> None:
        """The home ended `sub`'s reader (its stream gone there, or the home worker gone): the
        subscription ends and its client is told, as for a stream deleted."""
        if self.subscriptions.get(sub.subscription_id) is not sub:
            return
        sub.remote = None  # (ended there: nothing to close)
        self._remove(sub)
        self.conn.send(c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, sub.stream))
        self.conn.want_flush()

    def _deliver_backlog(self, sub: Subscription) -> None:
        try:
            self._deliver_backlog_now(sub)
        finally:
            self._top_up()

    def _top_up(self) -> None:
        """Give the homes credit for what the clients' credit allows: at most REMOTE_WINDOW chunks ahead
        (in flight and waiting here) for a subscription and CONNECTION_REMOTE_WINDOW for the connection,
        starting from the next subscription each time (round-robin), and none while the socket is full."""
        if not self.conn.can_deliver():
            return
        remote = [s for s in self.subscriptions.values() if s.remote is not None]
        if not remote:
            return
        room = CONNECTION_REMOTE_WINDOW - sum(s.granted + len(s.backlog) for s in remote)
        self._next_remote = start = self._next_remote % len(remote)
        self._next_remote += 1
        for sub in remote[start:] + remote[:start]:
            if room <= 0:
                return
            give = min(min(sub.credit, REMOTE_WINDOW) - sub.granted - len(sub.backlog), room)
            if give > 0 and sub.remote is not None:
                sub.granted += give
                room -= give
                self.conn.hub.reader_link.credit(sub.remote, give)

    def _deliver_backlog_now(self, sub: Subscription) -> None:
        conn = self.conn
        unwritten = 0
        while sub.backlog and conn.can_deliver():
            if unwritten >= FLUSH_BYTES:
                conn.flush()
                unwritten = 0
                continue
            raw, committed = sub.backlog.popleft()
            unwritten += len(raw)
            header = ck.decode_header(raw)
            conn.out.append(c.deliver_header(sub.subscription_id, len(raw),
                                             committed if self.deliver_version == 2 else None))
            conn.out.append(raw)
            sub.credit = max(0, sub.credit - 1)
            sub.chunks_sent += 1
            sub.records_sent += header.num_records
            sub.next_offset = header.chunk_id + header.num_records
            sub.committed_offset = max(sub.committed_offset, committed)
            conn.hub.counters.messages_delivered += header.num_records

    # -- offsets ------------------------------------------------------------------------------------
    def store_offset(self, cmd: c.StoreOffset) -> None:
        """No response, as RabbitMQ: an unknown stream, a refused read or a too long reference is ignored
        (when it is written, `coalesce_offsets`). Kept until then; a later offset for the same
        reference replaces it."""
        if len(cmd.reference) > MAX_REFERENCE_CHARS or not cmd.reference:
            return
        self.pending_offsets.setdefault(cmd.stream, {})[cmd.reference.encode()] = cmd.offset

    def coalesce_offsets(self) -> None:
        """Write the offsets stored since the last call: one tracking chunk per stream. On a member
        that does not write a replicated stream they go to the writer (as RabbitMQ writes tracking
        through the leader); one that cannot be stored now (a writer being elected) is dropped, as the
        client stores again."""
        if not self.pending_offsets:
            return
        pending, self.pending_offsets = self.pending_offsets, {}
        for stream, offsets in pending.items():
            self._write_offsets(stream, offsets)

    def _write_offsets(self, stream: str, offsets: dict[bytes, int]) -> None:
        conn = self.conn
        handle = conn.catalog.lookup(conn.vhost.name, stream)
        home = conn.hub.reader_link.home(conn.vhost.name, stream) if handle is None else None
        if (handle is None and home is None) or (handle is not None and handle.closed) \
                or not conn.permitted("read", stream):
            return
        if home is not None:
            forward = conn.hub.reader_link.forwarder(home, conn.vhost.name, stream)
            for reference, offset in offsets.items():
                forward.store_offset(reference, offset)
            return
        assert handle is not None
        forwarder = conn.catalog.forwarder(conn.vhost.name, stream)
        if forwarder is not None and not forwarder.writes_here():
            for reference, offset in offsets.items():
                forwarder.store_offset(reference, offset)
            return
        try:
            conn.bound_append(handle.store_offsets(list(offsets.items())).settled)
        except (ValueError, StorageError) as exc:  # (NotWriter: the member stopped writing this very turn)
            log.debug("stream %s: %d offsets not stored: %r", stream, len(offsets), exc)

    def query_offset(self, cmd: c.QueryOffset) -> None:
        handle = self.conn.stream_handle(cmd.stream)
        self.conn.check_permission("read", cmd.stream)
        offset = handle.query_offset(cmd.reference.encode())
        if offset is None:
            raise CommandError(f"no offset stored for {cmd.reference}", Code.NO_OFFSET)
        self.conn.send(c.QueryOffsetResponse(cmd.correlation_id, Code.OK, offset))

    # -- single active consumer ---------------------------------------------------------------------
    def sac_notify(self, note: Notify) -> None:
        sub = self.subscriptions.get(note.member.subscription_id)
        if sub is None or sub.sac_member is not note.member:
            return  # removed meanwhile: its unregister already chose the next active one
        if not note.active and sub.active:
            self._stop_reading(sub)  # passive: stop reading at once, the client is told
        corr = self.conn.next_correlation_id()
        log.debug("single active consumer: subscription %d on %s %s", sub.subscription_id, sub.stream,
                  "activated" if note.active else "stepping down")
        self.pending_updates[corr] = (sub, note.active)
        self.conn.send(c.ConsumerUpdate(corr, sub.subscription_id, note.active))
        self.conn.want_flush()

    def consumer_update_answered(self, cmd: c.ConsumerUpdateResponse) -> None:
        pending = self.pending_updates.pop(cmd.correlation_id, None)
        if pending is None:
            return
        sub, active = pending
        log.debug("single active consumer: subscription %d on %s answered (%s)", sub.subscription_id, sub.stream,
                  cmd.offset)
        if self.subscriptions.get(sub.subscription_id) is not sub:
            return
        if active:
            spec = sub.spec if cmd.offset.type == OffsetType.NONE else cmd.offset
            self._start(sub, spec)
        elif sub.sac_key is not None and sub.sac_member is not None:
            self.conn.hub.sac_router.stepped_down(sub.sac_key, sub.sac_member)
