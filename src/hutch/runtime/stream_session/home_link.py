"""A stream's one copy in a node of workers, used from the node's other workers: `StreamReaderLink`.

Owns: both ends of the stream-protocol paths to a stream whose only copy on this node is another
worker's (its "home", `StreamCatalog.home`), over the worker link (records `StreamReadOpen` ..
`StreamHomeResolve`, tags 140-147 in hutch.cluster.messages):
- reading: a subscription in this worker opens a reader in the home (`open`); the home sends the chunks
  as stored (header and data, as the stream protocol delivers them: `StreamReadChunks`), one per credit;
  the subscription's client credit goes to the home as it comes (`StreamReadCredit`); an unsubscribe or
  a closed connection ends the reader (`StreamReadEnd`, code 0), a stream gone at the home ends the
  subscription (`StreamReadEnd` with the code; its client gets a metadata update);
- writing: a publisher's publishes go to the home with their publishing ids and reference
  (`StreamHomePublish`, deduplicated there, answered once committed) through `HomeForwarder`, the
  `StreamForwarder` of such a stream; a stored offset goes there too (`StreamHomeOffset`);
- asking: the stream protocol's stream stats and resolve offset spec are answered by the home
  (`StreamHomeStats`, `StreamHomeResolve`: `stats` and `resolve`), so every worker answers them as the
  home does (`stats_of`, `resolve_in`: one rule for both).

Rules:
- A reader's filter is made and hashed for the stream's filter size at the home in steps of
  `BloomQuery.PREPARE_STEP` values (`_prepare_step`), before it reads anything, as a local subscribe's
  is (consuming.py, `prepare`): 45,000 values are ~40 ms of checks, dedup and hashing, not one turn's
  work. The steps take turns with every connection's large frames within the loop's one budget a turn
  (runtime/turns.py), so many readers opened at once do not add up either.
- The home sends at most `PUMP_CHUNKS` chunks and `PUMP_BYTES` bytes per record and per loop turn (then
  goes on next turn), and never more chunks than the credit its reader was given. The subscription's
  worker gives the home at most `REMOTE_WINDOW` chunks of credit ahead of what its client's socket took
  (the client's own credit may be 65,535 chunks or more), `CONNECTION_REMOTE_WINDOW` for all of one
  connection's subscriptions (round-robin among them), and more only while that socket has room: what
  waits in either worker for a client that does not read is at most that many chunks a connection.
- A worker that goes away ends what it served and what it read: the home closes the readers of that
  worker; the subscriptions reading from a home that went away are ended and their clients told
  (STREAM_NOT_AVAILABLE, as for a stream gone), so they subscribe again.
- Records naming a reader this worker does not hold are ignored (it ended meanwhile).
- A question the home cannot answer (the stream not open there, the home gone or silent for
  `ASK_TIMEOUT_S`) is answered None: the client gets STREAM_NOT_AVAILABLE, as for a stream being opened.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hutch.cluster import messages as cm
from hutch.queues.stream import chunk as ck
from hutch.queues.stream.offset_spec import OffsetSpec as CoreSpec
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamReader
from hutch.runtime.queue_types.stream_replication.service import entries_of
from hutch.runtime.turns import scheduler_of
from hutch.storage.errors import StorageError
from hutch.streamproto.codes import Code, OffsetType
from hutch.streamproto.wire import OffsetSpec

if TYPE_CHECKING:
    from hutch.runtime.stream_session.ports import StreamCatalog, StreamSession

log = logging.getLogger("hutch.stream")

PUMP_CHUNKS = 64
PUMP_BYTES = 1 << 20
PUMP_SKIPS = 4096
REMOTE_WINDOW = 4  # chunks a subscription's worker lets the home send ahead of its client's socket
CONNECTION_REMOTE_WINDOW = 16  # and all the remote subscriptions of one connection together
PUBLISH_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 5.0


class HomeLinkHost(Protocol):
    """What the link needs of the node's cluster service: its name, records and requests to a peer,
    handlers of records, whether a peer is connected."""

    name: str

    def send(self, peer: str, record: Any) -> bool: ...

    def register(self, kind: type[Any], handler: Callable[[str, Any], Any]) -> None: ...

    def connected(self, peer: str) -> bool: ...

    async def call(self, peer: str, request: Any, timeout: float = 5.0) -> Any: ...


class ReadSubscription(Protocol):
    """What the link reads of a subscription (consuming.Subscription)."""

    subscription_id: int
    stream: str
    credit: int
    filter_values: list[bytes]
    match_unfiltered: bool
    remote: RemoteRead | None
    granted: int  # chunks the home may still send (Invariant: granted + backlog <= REMOTE_WINDOW)


class ReadingSide(Protocol):
    """The consuming half of a connection (consuming.Consuming), as the link feeds it."""

    conn: StreamSession

    def deliver_remote(self, sub: Any, chunks: list[bytes], committed: int) -> None: ...

    def remote_lost(self, sub: Any) -> None: ...


def core_spec(spec: OffsetSpec) -> CoreSpec:
    kind = spec.type
    if kind == OffsetType.FIRST:
        return CoreSpec.first()
    if kind == OffsetType.LAST:
        return CoreSpec.last()
    if kind == OffsetType.NEXT:
        return CoreSpec.next()
    if kind == OffsetType.OFFSET:
        return CoreSpec.offset(spec.value)
    return CoreSpec.timestamp(spec.value)


def next_match(reader: StreamReader, query: ck.BloomQuery | None,
               budget: int) -> tuple[tuple[ck.Header, memoryview | bytes, memoryview] | None, int]:
    """The next chunk `reader` has whose bloom filter may match `query` (any chunk, without one), as (its
    header, its header's bytes, its data section), and the work spent: each chunk looked at costs
    `query.cost` (1 without a query). None for the chunk when there is none now or `budget` is spent (the
    caller goes on next turn); one chunk is always looked at, whatever its cost."""
    spent = 0
    while spent < budget or not spent:
        chunk = reader.next_chunk()
        if chunk is None:
            break
        spent += 1 if query is None else query.cost
        header, bits, data, _ = ck.parts(chunk.raw)
        if query is None or query.may_match(bits):
            return (header, chunk.raw[:ck.HEADER_SIZE], data), spent
    return None, spent


def filter_query(values: list[bytes], match_unfiltered: bool) -> ck.BloomQuery | None:
    """A subscription's filter as a `BloomQuery`; None without filter values (it takes every chunk)."""
    return ck.BloomQuery(values, match_unfiltered) if values else None


def reader_for(handle: StreamHandle, spec: CoreSpec, last: bool) -> StreamReader:
    """A reader positioned by `spec`; for "last" (`last`), the newest chunk written even if its commit
    is still running, as RabbitMQ makes a chunk visible once written (the reader waits for its commit)."""
    if last and handle.last_chunk_id > handle.committed_chunk_id:
        return handle.reader(CoreSpec.offset(handle.last_chunk_id))
    return handle.reader(spec)


def stats_of(handle: StreamHandle) -> dict[str, int]:
    """The stream protocol's stream stats of a stream held here (RabbitMQ's keys: an empty stream's first
    chunk id is -1)."""
    return {"first_chunk_id": handle.first_offset if handle.last_chunk_id >= 0 else -1,
            "committed_chunk_id": handle.committed_chunk_id}


def resolve_in(handle: StreamHandle, spec: OffsetSpec) -> int:
    """The offset a reader attached at `spec` would read next (resolve offset spec)."""
    reader = handle.reader(core_spec(spec))
    try:
        return reader.next_offset
    finally:
        reader.close()


@dataclass(eq=False)
class RemoteRead:
    """A subscription's reader in its stream's home (the subscription's `remote`)."""

    home: str
    reader_id: int
    consuming: ReadingSide
    sub: ReadSubscription


@dataclass(eq=False)
class _Served:
    """A reader the home serves for a subscription in another worker."""

    peer: str
    reader_id: int
    vhost: str
    stream: str
    handle: StreamHandle
    reader: StreamReader
    credit: int
    query: ck.BloomQuery | None = None
    unwatch: Callable[[], None] | None = None
    scheduled: bool = False
    preparing: Iterator[None] | None = None  # the query's hashing, while it goes on (`_prepare_step`)


class StreamReaderLink:
    """One per worker's `StreamHub`: the reader ends of its subscriptions to streams homed elsewhere, and
    the home end of the other workers' readers of its streams."""

    def __init__(self, catalog: StreamCatalog) -> None:
        self.catalog = catalog
        self.host: HomeLinkHost | None = None
        self._ids = itertools.count(1)
        self.reading: dict[int, RemoteRead] = {}  # reader id -> this worker's subscription
        self.served: dict[tuple[str, int], _Served] = {}  # (peer, reader id) -> the reader here
        self._watched: dict[int, StreamHandle] = {}  # id -> a stream handle whose deletion is watched

    def start(self, host: HomeLinkHost) -> None:
        self.host = host
        host.register(cm.StreamReadOpen, self._on_open)
        host.register(cm.StreamReadChunks, self._on_chunks)
        host.register(cm.StreamReadCredit, self._on_credit)
        host.register(cm.StreamReadEnd, self._on_end)
        host.register(cm.StreamHomePublish, self._on_publish)
        host.register(cm.StreamHomeOffset, self._on_offset)
        host.register(cm.StreamHomeStats, self._on_stats)
        host.register(cm.StreamHomeResolve, self._on_resolve)

    def home(self, vhost: str, stream: str) -> str | None:
        """The worker holding the stream's one copy, if it is not this one and the link is up."""
        return None if self.host is None else self.catalog.home(vhost, stream)

    def forwarder(self, home: str, vhost: str, stream: str) -> HomeForwarder:
        """The way of a publisher (or a stored offset) on this worker to the stream's copy in `home`."""
        return HomeForwarder(self, home, vhost, stream)

    # -- questions to the home ---------------------------------------------------------------------

    async def stats(self, home: str, vhost: str, stream: str) -> dict[str, int] | None:
        """`stats_of` the stream in `home`; None if it cannot answer."""
        answer = await self._ask(home, cm.StreamHomeStats(vhost, stream))
        if not (isinstance(answer, list) and len(answer) == 2 and all(type(v) is int for v in answer)):
            return None
        return {"first_chunk_id": answer[0], "committed_chunk_id": answer[1]}

    async def resolve(self, home: str, vhost: str, stream: str, spec: OffsetSpec) -> int | None:
        """`resolve_in` the stream in `home`; None if it cannot answer."""
        answer = await self._ask(home, cm.StreamHomeResolve(vhost, stream, int(spec.type), int(spec.value or 0)))
        return answer if type(answer) is int and 0 <= answer < 1 << 64 else None

    async def _ask(self, home: str, request: cm.StreamHomeStats | cm.StreamHomeResolve) -> Any:
        if self.host is None:
            return None
        try:
            return await self.host.call(home, request, timeout=ASK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - home gone, silent or refusing: no answer (the port's errors)
            log.debug("stream %s: %s not answered by %s: %r", request.stream, type(request).__name__, home, exc)
            return None

    def _held(self, vhost: str, stream: str) -> StreamHandle | None:
        handle = self.catalog.lookup(vhost, stream)
        return None if handle is None or handle.closed or handle.failed is not None else handle

    def _on_stats(self, peer: str, m: cm.StreamHomeStats) -> list[int] | None:
        handle = self._held(m.vhost, m.stream)
        if handle is None:
            return None
        stats = stats_of(handle)
        return [stats["first_chunk_id"], stats["committed_chunk_id"]]

    def _on_resolve(self, peer: str, m: cm.StreamHomeResolve) -> int | None:
        handle = self._held(m.vhost, m.stream)
        if handle is None:
            return None
        try:
            return resolve_in(handle, OffsetSpec(OffsetType(m.offset_type), m.offset_value))
        except (ValueError, StorageError) as exc:
            log.warning("stream %s: a resolve from %s refused: %r", m.stream, peer, exc)
            return None

    # -- the subscription's worker -----------------------------------------------------------------

    def open(self, consuming: ReadingSide, sub: ReadSubscription, home: str, spec: OffsetSpec) -> None:
        """Start reading `sub`'s stream in `home` from `spec` with the subscription's credit."""
        assert self.host is not None
        conn = consuming.conn
        read = RemoteRead(home, next(self._ids), consuming, sub)
        self.reading[read.reader_id] = read
        sub.remote = read
        sub.granted = 0  # (the subscription's worker gives credit once it is open: Consuming._top_up)
        if not self.host.send(home, cm.StreamReadOpen(read.reader_id, conn.vhost.name, sub.stream, int(spec.type),
                                                      int(spec.value or 0), sub.granted, list(sub.filter_values),
                                                      sub.match_unfiltered)):
            self._lost(read, Code.STREAM_NOT_AVAILABLE)

    def credit(self, read: RemoteRead, credit: int) -> None:
        if self.host is not None and credit > 0:
            self.host.send(read.home, cm.StreamReadCredit(read.reader_id, credit))

    def close(self, read: RemoteRead) -> None:
        """The subscription is over (unsubscribed, stepped down, its connection closed)."""
        if self.reading.pop(read.reader_id, None) is not None and self.host is not None:
            self.host.send(read.home, cm.StreamReadEnd(read.reader_id, 0))

    def _on_chunks(self, peer: str, m: cm.StreamReadChunks) -> None:
        read = self.reading.get(m.reader_id)
        if read is None or read.home != peer:
            return
        if not all(type(raw) is bytes and len(raw) >= ck.HEADER_SIZE for raw in m.chunks):
            log.warning("dropped malformed stream chunks from %s", peer)
            return
        read.consuming.deliver_remote(read.sub, m.chunks, m.committed)

    def _on_end(self, peer: str, m: cm.StreamReadEnd) -> None:
        served = self.served.pop((peer, m.reader_id), None)
        if served is not None:  # (the reader's worker ended it)
            self._drop(served)
            return
        read = self.reading.get(m.reader_id)
        if read is not None and read.home == peer:
            self._lost(read, m.code)

    def _lost(self, read: RemoteRead, code: int) -> None:
        """The home ended the reader (or went away): the subscription ends, its client is told."""
        self.reading.pop(read.reader_id, None)
        log.debug("stream %s: subscription %d read from %s ended (%d)", read.sub.stream,
                  read.sub.subscription_id, read.home, code)
        read.consuming.remote_lost(read.sub)

    def peer_changed(self, peer: str, up: bool) -> None:
        if up:
            return
        for read in [r for r in self.reading.values() if r.home == peer]:
            self._lost(read, Code.STREAM_NOT_AVAILABLE)
        for key in [k for k in self.served if k[0] == peer]:
            self._drop(self.served.pop(key))

    # -- the home ----------------------------------------------------------------------------------

    def _on_open(self, peer: str, m: cm.StreamReadOpen) -> None:
        assert self.host is not None
        handle = self.catalog.lookup(m.vhost, m.stream)
        if handle is None or handle.closed or handle.failed is not None:
            self.host.send(peer, cm.StreamReadEnd(m.reader_id, int(Code.STREAM_DOES_NOT_EXIST if handle is None
                                                                   else Code.STREAM_NOT_AVAILABLE)))
            return
        if (peer, m.reader_id) in self.served or type(m.filters) is not list:
            log.warning("dropped a malformed stream read from %s", peer)
            return
        try:
            spec = OffsetSpec(OffsetType(m.offset_type), m.offset_value)
            reader = reader_for(handle, core_spec(spec), spec.type == OffsetType.LAST)
        except (ValueError, StorageError) as exc:
            log.warning("stream %s: a read from %s refused: %r", m.stream, peer, exc)
            self.host.send(peer, cm.StreamReadEnd(m.reader_id, int(Code.STREAM_NOT_AVAILABLE)))
            return
        served = _Served(peer, m.reader_id, m.vhost, m.stream, handle, reader, min(max(m.credit, 0), 1 << 20))
        self.served[(peer, m.reader_id)] = served
        served.unwatch = handle.on_commit(lambda: self._schedule(served))
        if id(handle) not in self._watched:  # (one callback per handle, whatever its readers)
            self._watched[id(handle)] = handle
            handle.on_delete(lambda: self._deleted(handle))
        if not m.filters:
            self._pump(served)
            return
        served.preparing = self._filter_steps(served, m.filters, bool(m.match_unfiltered),
                                              handle.options.filter_size_bytes * 8)
        self._prepare_step(served, resumed=False)

    @staticmethod
    def _filter_steps(served: _Served, filters: list[Any], match_unfiltered: bool, bit_size: int) -> Iterator[None]:
        """A reader's filter made (`BloomQuery.build`) and hashed for the stream's filter size
        (`BloomQuery.prepare`) in steps of `BloomQuery.PREPARE_STEP` values, its values checked as it
        goes; the reader's `query` once done (a malformed value: ValueError)."""
        step = ck.BloomQuery.PREPARE_STEP
        for start in range(0, len(filters), step):
            if start:
                yield
            if not all(type(v) is bytes for v in filters[start:start + step]):
                raise ValueError("a filter value that is not bytes")
        query = yield from ck.BloomQuery.build(filters, match_unfiltered)
        yield from query.prepare(bit_size)
        served.query = query

    def _prepare_step(self, served: _Served, resumed: bool = True) -> None:
        """Steps of making a reader's filter (`_filter_steps`) as the loop's step budget allows
        (runtime/turns.py: shared with every connection's large frames, round-robin); the rest in later
        turns. The reader is served once it is done (a filter of fewer than `BloomQuery.PREPARE_STEP`
        values: at once, unless others wait for their steps)."""
        if self.served.get((served.peer, served.reader_id)) is not served or served.preparing is None:
            return  # (ended meanwhile)
        turns = scheduler_of(asyncio.get_running_loop())
        try:
            done, _ = turns.run_steps(served.preparing, resumed)
        except ValueError as exc:
            log.warning("dropped a malformed stream read from %s: %s", served.peer, exc)
            self.served.pop((served.peer, served.reader_id), None)
            self._drop(served)
            return
        if done:
            served.preparing = None
            self._pump(served)
            return
        turns.wait(lambda: self._prepare_step(served))

    def _deleted(self, handle: StreamHandle) -> None:
        """The stream was deleted here (by any path): its readers for other workers end at once."""
        self._watched.pop(id(handle), None)
        for served in [v for v in self.served.values() if v.handle is handle]:
            self._end(served)

    def _end(self, served: _Served) -> None:
        """End a reader here and tell its worker (its subscription's client gets a metadata update)."""
        assert self.host is not None
        self.served.pop((served.peer, served.reader_id), None)
        self._drop(served)
        self.host.send(served.peer, cm.StreamReadEnd(served.reader_id, int(Code.STREAM_NOT_AVAILABLE)))

    def _on_credit(self, peer: str, m: cm.StreamReadCredit) -> None:
        served = self.served.get((peer, m.reader_id))
        if served is not None:
            served.credit = min(served.credit + max(m.credit, 0), 1 << 20)
            self._schedule(served)

    def _schedule(self, served: _Served) -> None:
        if not served.scheduled and served.credit > 0 and served.preparing is None:
            served.scheduled = True
            asyncio.get_running_loop().call_soon(self._woken, served)

    def _woken(self, served: _Served) -> None:
        served.scheduled = False
        if self.served.get((served.peer, served.reader_id)) is served:
            self._pump(served)

    def _pump(self, served: _Served) -> None:
        assert self.host is not None
        handle = served.handle
        if handle.closed or self.catalog.lookup(served.vhost, served.stream) is not handle:
            self._end(served)
            return
        chunks: list[bytes] = []
        size = skipped = 0
        found: Any = True
        while found is not None and served.credit > 0 and len(chunks) < PUMP_CHUNKS and size < PUMP_BYTES \
                and skipped < PUMP_SKIPS:
            found, n = next_match(served.reader, served.query, PUMP_SKIPS - skipped)
            skipped += n
            if found is not None:
                chunks.append(b"".join(found[1:]))
                size += len(chunks[-1])
                served.credit -= 1
        if served.credit > 0 and (len(chunks) >= PUMP_CHUNKS or size >= PUMP_BYTES or skipped >= PUMP_SKIPS):
            self._schedule(served)  # (the rest next turn: other work gets the loop meanwhile)
        if chunks:
            self.host.send(served.peer, cm.StreamReadChunks(served.reader_id, chunks, handle.committed_chunk_id))

    @staticmethod
    def _drop(served: _Served) -> None:
        served.preparing = None
        if served.unwatch is not None:
            served.unwatch()
            served.unwatch = None
        served.reader.close()

    async def _on_publish(self, peer: str, m: cm.StreamHomePublish) -> bool:
        handle = self.catalog.lookup(m.vhost, m.stream)
        if handle is None or handle.closed:
            raise ValueError(f"stream {m.stream} is not in this worker")
        if not m.reference and m.filters is None and simple_entries(m.data) == len(m.ids) > 0:
            appended = handle.append_encoded([m.data], len(m.ids))  # (the data section as it came: no copy)
        else:
            entries = entries_of(m.data, m.ids, m.filters)
            appended = handle.append(entries, publisher=m.reference or None,
                                     publishing_ids=m.ids if m.reference else None, filter_values=m.filters)
        await asyncio.wait_for(asyncio.shield(appended.settled), PUBLISH_TIMEOUT_S)
        return True

    def _on_offset(self, peer: str, m: cm.StreamHomeOffset) -> None:
        handle = self.catalog.lookup(m.vhost, m.stream)
        if not 0 < len(m.reference) <= 255 or not 0 <= m.offset < 1 << 64 or handle is None or handle.closed:
            return
        try:
            handle.store_offset(m.reference, m.offset)
        except (ValueError, StorageError) as exc:
            log.debug("stream %s: offset of %r from %s not stored: %r", m.stream, m.reference, peer, exc)


def simple_entries(data: bytes) -> int:
    """How many simple entries (u32 size with the top bit clear, then the message) `data` is exactly; -1
    if it is anything else (a sub-batch, a size past the end)."""
    count = pos = 0
    end = len(data)
    while pos < end:
        if end - pos < 4 or data[pos] & 0x80:
            return -1
        pos += 4 + int.from_bytes(data[pos:pos + 4], "big")
        count += 1
    return count if pos == end else -1


class HomeForwarder:
    """The `StreamForwarder` of a stream homed in another worker: publishes and stored offsets go there."""

    def __init__(self, link: StreamReaderLink, home: str, vhost: str, stream: str) -> None:
        self.link = link
        self.home = home
        self.vhost = vhost
        self.stream = stream

    def writes_here(self) -> bool:
        return False

    async def publish(self, data: bytes, ids: list[int], reference: bytes,
                      filters: list[bytes | None] | None) -> None:
        host = self.link.host
        assert host is not None
        await host.call(self.home, cm.StreamHomePublish(self.vhost, self.stream, data, ids, reference, filters),
                        timeout=PUBLISH_TIMEOUT_S)

    def store_offset(self, reference: bytes, offset: int) -> bool:
        host = self.link.host
        return host is not None and host.send(self.home, cm.StreamHomeOffset(self.vhost, self.stream, reference,
                                                                              offset))
