"""One member of a replicated stream on this node at run time: `ReplicatedStream` runs the pure replica
machine (hutch.cluster.stream_replica) over the stream's `StreamHandle` (the core's seam,
runtime/queue_types/stream/handle.py) and a `ReplicaLink` to the other members and the coordinator.

Owns: turning the machine's effects into IO (ship chunks read from the files, append the writer's chunks
as they are, cut or empty the log, move the handle's commit point), feeding the machine what the
handle reports (chunks made durable), the writer's publishes, and the periodic tick.

Rules:
- The handle runs with `auto_commit` off: an append settles when the machine's commit point (a majority of
  the members have it on disk) passes it, not after the local fdatasync.
- The machine counts offsets; the handle's chunk ids and the chunks it writes by itself (a tracking
  snapshot at a segment roll) are reconciled here: after every local write the machine is told the new
  end (`StreamMember.append` with the records added), and `_ends` maps a chunk id to the offset after it.
- A cut or an emptying of the log closes the handle, changes the files (storage/stream_epochs.py) and
  opens it again, so recovery rebuilds everything in memory (tracking included) from the files; inputs
  that arrive meanwhile wait in `_backlog` and run in order afterwards.
- The coordinator's answers (a tail report, "stable") travel as Raft proposals that can be lost with a
  leader; while an election or a new epoch is under way the member acts on the last view again every
  `REOBSERVE_TICKS` ticks (the machine's `observe` is idempotent), so an election never waits forever.
- A storage failure (a write, a sync, a cut) stops the member, as a crash would (`_fail`); a writer asks
  the coordinator for a new election first, since its node is still up.
- The member's commit point is appended to its commit file (storage/stream_epochs.py) before the handle
  settles what it commits, and read back when the member opens: a restarted member that knew its whole
  log committed carries nothing when it next writes (its readers see the whole log at once); one that
  did not carries its older chunks through its epoch's recorded start (stream_replica.py), which takes
  no offset either.
- `ship_bytes` bounds one shipment, `max_inflight` the shipments unacknowledged per replica: a replica far
  behind costs the writer at most their product in memory, read from the files as it goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from hutch.cluster import stream_replica as sr
from hutch.cluster.stream_tail import Tail
from hutch.queues.stream import chunk as ck
from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.stream.handle import Appended, StreamHandle, StreamOptions
from hutch.storage.errors import StorageError
from hutch.storage.fs import FileSystem
from hutch.storage.stream_epochs import CommitFile, empty_files, extent, read_commit, truncate_files

log = logging.getLogger("hutch.stream.replication")

TICK_S = 0.1
REOBSERVE_TICKS = 10  # while an election or a new epoch is under way, the view is acted on again this often


class ReplicaLink(Protocol):
    """How a member reaches the other members and the stream's coordinator."""

    def send(self, peer: str, message: sr.Message) -> None: ...

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable | sr.Begin) -> None: ...


class NotWriter(ValueError):
    """A publish reached a member that is not the stream's writer (the caller redirects)."""

    def __init__(self, writer: str | None) -> None:
        super().__init__(f"not the stream's writer (the writer is {writer or 'being elected'})")
        self.writer = writer


class ReplicatedStream:
    """One member of one replicated stream on this node. Build with `await ReplicatedStream.open(...)`."""

    def __init__(self, name: str, fs: FileSystem, directory: str, handle: StreamHandle, link: ReplicaLink,
                 clock: Clock, options: StreamOptions, member: sr.StreamMember) -> None:
        self.name = name
        self.fs = fs
        self.directory = directory
        self.handle = handle
        self.link = link
        self.clock = clock
        self.options = options
        self.member = member
        self._ends: deque[tuple[int, int]] = deque()  # (chunk id, offset after it), written, not committed
        self._backlog: deque[Callable[[], None]] = deque()
        self._reopening: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self._flush_scheduled = False
        self._view: sr.View | None = None
        self._ticks = 0
        # told the new handle after a cut or an emptying reopened the files (the stream queue moves its
        # readers there, at the offsets they had reached: a replica is never cut below its commit point)
        self.readers_moved: list[Callable[[StreamHandle], None]] = []
        self._commit_file: CommitFile | None = None
        try:
            self._commit_file = CommitFile(fs, directory)
        except StorageError as exc:  # the member works without it (a restart then carries its log)
            log.warning("stream %s: no commit file: %s", directory, exc)
        self._attach(handle)

    @classmethod
    async def open(cls, name: str, fs: FileSystem, directory: str, link: ReplicaLink, *, clock: Clock,
                   fenced: int, session_base: int, options: StreamOptions | None = None,
                   tick_s: float = TICK_S, **member_options: int) -> ReplicatedStream:
        """Open the member's files; `fenced` is the epoch the coordinator's state says this member is
        fenced at (the current epoch, or the one being elected), `session_base` grows across restarts."""
        opts = options or StreamOptions()
        fresh = not fs.exists(directory)  # a first open here: no earlier incarnation wrote anything
        handle = await StreamHandle.open(fs, directory, options=opts, clock=clock)
        return cls.over(name, fs, directory, handle, link, clock=clock, fenced=fenced, fresh=fresh,
                        session_base=session_base, tick_s=tick_s, **member_options)

    @classmethod
    def over(cls, name: str, fs: FileSystem, directory: str, handle: StreamHandle, link: ReplicaLink, *,
             clock: Clock, fenced: int, fresh: bool, session_base: int, tick_s: float = TICK_S,
             **member_options: int) -> ReplicatedStream:
        """The member over a handle already open (the stream queue type opened it at a declare or a
        restore: `held_back` kept it from committing or writing meanwhile); `fresh`: its directory did not
        exist before that open."""
        tail = Tail(*extent(handle.log)).check()
        known = 0 if fresh else read_commit(fs, directory)
        member = sr.StreamMember(name, tail, fenced, fresh=fresh, session_base=session_base, commit=known,
                                 **member_options)
        rs = cls(name, fs, directory, handle, link, clock, handle.options, member)
        rs._start_ticks(tick_s)
        return rs

    @property
    def reopening(self) -> bool:
        """A cut or an emptying is under way: `handle` is the old, closed one until it ends."""
        return self._reopening is not None

    def _attach(self, handle: StreamHandle) -> None:
        handle.auto_commit = False
        # what was on disk at open is committed only up to the member's commit point (0 unless its commit
        # file said more): the machine says when more is
        handle.committed_chunk_id = self._chunk_before(self.member.commit)
        handle.on_durable.append(self._on_durable)
        handle.gate = self._gate
        handle.on_written = self._on_written
        handle.retention_floor = lambda: self.member.commit
        handle.on_retained = self.member.retained

    def _gate(self) -> None:
        if self.closed or self.member.role is not sr.Role.WRITER or self._reopening is not None:
            raise NotWriter(self.member.writer)

    def _on_written(self, before: int) -> None:
        """The handle wrote a chunk by itself (a publish, a stored offset, a roll's snapshot): tell the
        machine, and ship it this loop turn."""
        self._wrote(before)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _chunk_before(self, next_offset: int) -> int:
        """The id of the last chunk that ends at or before `next_offset` (-1: none)."""
        found = self.handle.log.locate(next_offset - 1) if next_offset > 0 else None
        if found is None:
            return self.handle.log.last_chunk_id if next_offset >= self.handle.next_offset else -1
        seg, pos = found
        return self.handle.log.fmt.info(self.handle.log.read_at(seg, pos, ck.HEADER_SIZE)).chunk_id

    def _start_ticks(self, tick_s: float) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            if self.closed:
                return
            self._input(lambda: self._run(self.member.tick()))
            self._ticks += 1
            view = self._view
            if view is not None and self._ticks % REOBSERVE_TICKS == 0 and (
                    view.electing or not view.stable or self.member.awaiting_record):
                # an answer to the coordinator may have been lost with a proposal: say it again
                self._input(lambda: self._observe(view))
            self._timer = loop.call_later(tick_s, fire)
        self._timer = loop.call_later(tick_s, fire)

    # -- inputs -------------------------------------------------------------------------------------

    def _input(self, fn: Callable[[], None]) -> None:
        if self.closed:
            return
        if self._reopening is not None:
            self._backlog.append(fn)
        else:
            fn()

    def observe(self, view: sr.View) -> None:
        """The coordinator's state changed (or may have): act on it."""
        self._input(lambda: self._observe(view))

    def _observe(self, view: sr.View) -> None:
        self._view = view
        m = self.member
        was = (m.role, m.epoch)
        effects = m.observe(view)
        if m.role is sr.Role.WRITER:
            self.handle.epoch = m.epoch
            if was != (m.role, m.epoch) and m.carry:
                log.info("stream %s: writer of epoch %d carries offsets %d-%d not known committed (by its "
                         "recorded start or its first publish)", self.directory, m.epoch, m.commit, m.start - 1)
        self._run(effects)

    def receive(self, message: sr.Message) -> None:
        """A message from another member. Chunks that do not verify (CRC, lengths) or whose header does
        not say what the message says are dropped with the whole message, as if lost: the writer ships
        them again, and the log never takes a chunk the machine did not."""
        if isinstance(message, sr.Chunks) and not all(_intact(c) for c in message.chunks):
            log.warning("stream %s: dropped chunks from the writer that do not verify", self.directory)
            return
        self._input(lambda: self._run(self.member.step(message)))

    def publish(self, entries: Sequence[ck.Entry], *, publisher: bytes | None = None,
                publishing_ids: Sequence[int] | None = None,
                filter_values: Sequence[bytes | None] | None = None) -> Appended:
        """Append on the writer (NotWriter elsewhere); the answer's `settled` resolves once a majority has
        the chunk. (An append straight on `handle` is the same: the handle's hooks tell the member.)"""
        try:
            return self.handle.append(entries, publisher=publisher, publishing_ids=publishing_ids,
                                      filter_values=filter_values)
        except StorageError as exc:
            self._fail(exc)
            raise

    def _flush(self) -> None:
        """Once per loop turn with publishes: ship them (the replicas write while the writer syncs)."""
        self._flush_scheduled = False
        self._input(lambda: self._run(self.member.shipments()))

    def _wrote(self, before: int) -> None:
        after = self.handle.next_offset
        if after > before:
            self.member.append(after - before)
            self._ends.append((self.handle.log.last_chunk_id, after))

    def _on_durable(self, chunk_id: int) -> None:
        if self.handle.failed is not None:  # a sync failed: what it covered is not on disk
            self._fail(self.handle.failed)
            return
        nxt = -1
        for cid, end in self._ends:
            if cid > chunk_id:
                break
            nxt = end
        if nxt >= 0:
            self._input(lambda: self._run(self.member.written(nxt)))

    # -- effects ------------------------------------------------------------------------------------

    def _run(self, effects: list[sr.Effect]) -> None:
        try:
            self._run_effects(effects)
        except StorageError as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """The member's files failed (a write, a sync, a cut): it stops taking part, as a crashed node
        would, until the node restarts it; a writer first asks the coordinator for a new election (its
        node is alive, so no failure detector would)."""
        if self.closed:
            return
        log.error("stream %s: member %s stops after a storage failure: %s", self.directory, self.name, exc)
        if self.member.role is sr.Role.WRITER:
            self.link.to_coordinator(sr.Reelect(self.member.epoch))
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()

    def _run_effects(self, effects: list[sr.Effect]) -> None:
        for i, e in enumerate(effects):
            if isinstance(e, sr.Send):
                self.link.send(e.to, e.message)
            elif isinstance(e, sr.Ship):
                self._ship(e)
            elif isinstance(e, sr.Write):
                for c in e.chunks:
                    self.handle.accept_chunk(c.data)
                    self._ends.append((c.chunk_id, c.next_offset))
            elif isinstance(e, sr.Committed):
                self._commit(e.next_offset)
            elif isinstance(e, sr.Report | sr.Reelect | sr.Stable | sr.Begin):
                self.link.to_coordinator(e)
            else:
                assert isinstance(e, sr.Truncate | sr.Reset)
                rest = effects[i + 1:]
                self._reopening = asyncio.get_running_loop().create_task(self._cut(e, rest))
                return

    def _ship(self, e: sr.Ship) -> None:
        reader = self.handle.reader(OffsetSpec.offset(e.start), committed_only=False, include_tracking=True)
        chunks: list[sr.ChunkRef] = []
        size, nxt = 0, e.start
        limit = self.member.log.next
        while (c := reader.next_chunk()) is not None:
            h = c.header
            if h.next_offset > limit or (chunks and size + len(c.raw) > e.max_bytes):
                break
            chunks.append(sr.ChunkRef(h.epoch, h.chunk_id, h.next_offset, c.raw))
            size += len(c.raw)
            nxt = h.next_offset
        if chunks:
            assert chunks[0].chunk_id == e.start, (chunks[0].chunk_id, e.start)
            self.link.send(e.peer, sr.Chunks(self.member.epoch, tuple(chunks), self.member.commit))
        self._run(self.member.shipped(e.peer, nxt))

    def _commit(self, next_offset: int) -> None:
        if self._commit_file is not None:
            try:
                self._commit_file.record(next_offset)  # before anything is confirmed by it
            except StorageError as exc:
                log.warning("stream %s: commit file dropped: %s", self.directory, exc)
                self._commit_file = None
        last = -1
        ends = self._ends
        while ends and ends[0][1] <= next_offset:
            last = ends.popleft()[0]
        if last < 0:
            last = self._chunk_before(next_offset)
        self.handle.commit(last)

    async def _cut(self, e: sr.Truncate | sr.Reset, rest: list[sr.Effect]) -> None:
        """Close the handle, cut or empty the files, open it again, then carry on with what waited."""
        old = self.handle
        try:
            await old.close()
            loop = asyncio.get_running_loop()
            first = 0
            if self.closed:
                return  # closed while the handle closed: the files stay as they are
            if isinstance(e, sr.Truncate):
                await loop.run_in_executor(None, truncate_files, self.fs, self.directory, e.next_offset)
            else:
                await loop.run_in_executor(None, empty_files, self.fs, self.directory)
                first = e.first
            if self.closed:
                return
            handle = await StreamHandle.open(self.fs, self.directory, options=self.options,
                                             clock=self.clock, first_offset=first)
            if self.closed:
                await handle.close()
                return
            self.handle = handle
            self._ends = deque(x for x in self._ends if x[1] <= self.handle.next_offset)
            self._attach(self.handle)
            self.handle.epoch = self.member.epoch
            for fn in list(self.readers_moved):
                fn(handle)
        except (StorageError, OSError, ValueError) as exc:
            self._reopening = None
            self._fail(exc)
            return
        self._reopening = None
        self._run(rest)
        while self._backlog and self._reopening is None:
            self._backlog.popleft()()

    # -- the end ------------------------------------------------------------------------------------

    async def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._commit_file is not None:
            self._commit_file.close()
            self._commit_file = None
        if self._reopening is not None:
            await asyncio.gather(self._reopening, return_exceptions=True)
        await self.handle.close()

    def status(self) -> dict[str, object]:
        return {**self.member.status(), "committed_chunk_id": self.handle.committed_chunk_id}


def _intact(c: sr.ChunkRef) -> bool:
    """The chunk's bytes verify and its header names the epoch and offsets the message gives."""
    if not ck.verify(c.data):
        return False
    h = ck.decode_header(c.data)
    return (h.epoch, h.chunk_id, h.next_offset) == (c.epoch, c.chunk_id, c.next_offset)
