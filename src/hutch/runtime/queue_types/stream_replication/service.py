"""Replicated streams on a clustered node: `StreamReplicationService` hosts, for each replicated stream this
node is a member of, the coordinator's Raft group (hutch.cluster.stream_coordinator's `CoordinatorMachine`
on the node's Raft driver) and the member (`ReplicatedStream`), and carries their traffic as records of
`hutch.cluster.messages` (`StreamReplica`, `StreamPropose`), and publishes from nodes that do not write
a stream (`StreamAppend` from AMQP 0-9-1, `StreamPublish` from the stream protocol).

Owns: opening a stream's group and member (`attach`) and closing them (`detach`); the `ReplicaLink` of each
member (replica messages to the other members' nodes; coordinator commands proposed on this node's group
when it leads, else forwarded to the leader's node); the failure detector (a peer that goes down while it
writes a stream whose group this node leads: `WriterDown`); the read barrier before a member starts.

Rules:
- A member starts only after a read barrier (`_barrier`: a `Barrier` entry of its own applied on this
  node), so the epoch it is fenced at (`fenced`) and the views it then acts on are current, never a past
  state replayed while the group catches up (which made a restarted member write as a past epoch's
  writer: found by the Jepsen-style run).
- A forwarded proposal is proposed only by a leader and never forwarded again (no loops); one lost is
  made again by the member (ReplicatedStream re-acts on its view while an election is under way).
- Malformed records from peers are logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hutch.cluster import messages as cm
from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.queues.stream import chunk as ck
from hutch.runtime.clustering.raft_driver import RaftDriver
from hutch.runtime.clustering.raft_group import Group, GroupClosed, NotLeader, ProposalTimeout
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.stream.handle import Appended, StreamHandle, StreamOptions
from hutch.runtime.queue_types.stream_replication.member import NotWriter, ReplicatedStream
from hutch.storage.errors import StorageError
from hutch.storage.fs import FileSystem

log = logging.getLogger("hutch.stream.replication")

BARRIER_POLL_S = 0.02
BARRIER_RETRY_S = 0.5
APPEND_TIMEOUT_S = 30.0  # a publish waits this long for a writer and a majority, then is refused (nacked)
APPEND_RETRY_S = 0.05    # while no writer takes it (an election), tried again this often
DETECT_S = 0.5           # the failure detector's sweep
LOOKUP_TIMEOUT_S = 2.0   # a member asked by a node that is not one (StreamLookup) answers within this
LOOKUPS = ("writer", "offset", "sequence")
ENDPOINT_RETRY_S, ENDPOINT_TRIES = 0.5, 120  # asking a booting peer for its stream listener


class ReplicationHost(Protocol):
    """What the service needs of the node's cluster service (runtime/clustering/service.py)."""

    name: str
    driver: RaftDriver | None

    def send(self, peer: str, record: cm.Record) -> bool: ...

    def register(self, kind: type[Any], handler: Callable[[str, Any], Any]) -> None: ...

    def raft_id_of(self, name: str) -> int: ...

    def name_of(self, raft_id: int) -> str | None: ...

    def connected(self, peer: str) -> bool: ...

    async def call(self, peer: str, request: cm.Request, timeout: float = 5.0) -> Any: ...


@dataclass
class Hosted:
    """One replicated stream on this node: its group, its coordinator copy, its member (once started)."""

    gid: int
    members: tuple[str, ...]
    directory: str
    machine: sc.CoordinatorMachine
    group: Group
    stream: ReplicatedStream | None = None
    started: asyncio.Task[None] | None = None
    waiting: list[Callable[[], None]] = field(default_factory=list)


class StreamReplicationService:
    """The replicated streams of one node."""

    def __init__(self, host: ReplicationHost, fs: FileSystem, clock: Clock, incarnation: int,
                 options: StreamOptions | None = None, tick_s: float = 0.1) -> None:
        self.host = host
        self.fs = fs
        self.clock = clock
        self.incarnation = incarnation  # grows across the node's restarts: replica sessions grow with it
        self.options = options
        self.tick_s = tick_s
        self.streams: dict[int, Hosted] = {}
        # this node's stream listener (host, port), when it has one (set by runtime/app.py)
        self.local_endpoint: Callable[[], tuple[str, int] | None] = lambda: None
        # whether this node has a stream listener at all (configured), set by runtime/app.py: a node
        # without one answers so, and is not asked again every ENDPOINT_RETRY_S for a minute
        self.has_listener: Callable[[], bool] = lambda: True
        self.endpoints: dict[str, tuple[str, int]] = {}  # the other nodes' (asked when they come up)
        # this node's open stream of one member with a group id (set by runtime/app.py; StreamLookup)
        self.unreplicated: Callable[[int], StreamHandle | None] = lambda gid: None
        self._asking: set[str] = set()
        self._detector: asyncio.TimerHandle | None = None
        host.register(cm.StreamReplica, self._on_replica)
        host.register(cm.StreamPropose, self._on_propose)
        host.register(cm.StreamAppend, self._on_append)
        host.register(cm.StreamEndpoint, self._on_endpoint)
        host.register(cm.StreamMember, self._on_member)
        host.register(cm.StreamPublish, self._on_publish)
        host.register(cm.StreamStoreOffset, self._on_store_offset)
        host.register(cm.StreamLookup, self._on_lookup)

    # -- opening and closing ------------------------------------------------------------------------

    def attach(self, gid: int, members: tuple[str, ...], directory: str, *, founding: bool,
               handle: StreamHandle | None = None, fresh: bool = False) -> Hosted:
        """Open stream group `gid` here (from disk after a restart; `founding`: bootstrap it with
        `members`, on every member node when the stream is declared; not founding: a member being added
        opens it empty) and start the member once the read barrier passes. `members` are node names; a
        founding node must be one of them. With `handle` (the stream queue type opened the files: `fresh`
        when its directory did not exist before), the member runs over it, and until it starts the handle
        neither commits nor takes writes."""
        if founding and self.host.name not in members:
            raise ValueError(f"{self.host.name} is not a member of stream group {gid}")
        driver = self.host.driver
        if driver is None:
            raise RuntimeError("stream replication needs a clustered node")
        hosted: Hosted
        machine = sc.CoordinatorMachine(lambda state: self._changed(hosted, state))
        voters = [self.host.raft_id_of(m) for m in members]
        group = driver.open_group(gid, machine, bootstrap_voters=voters if founding else None)
        hosted = Hosted(gid, members, directory, machine, group)
        self.streams[gid] = hosted
        if handle is not None:
            handle.auto_commit = False
            handle.committed_chunk_id = -1  # nothing is known committed before the member says so
            handle.gate = _starting
            handle.retention_floor = lambda: 0  # (nothing goes before the member knows its commit point)
        hosted.started = asyncio.get_running_loop().create_task(self._start(hosted, handle, fresh))
        if self._detector is None:
            self._detector = asyncio.get_running_loop().call_later(DETECT_S, self._detect)
        return hosted

    async def _start(self, hosted: Hosted, handle: StreamHandle | None, fresh: bool) -> None:
        await self._barrier(hosted)
        state = hosted.machine.state
        link = _Link(self, hosted.gid)
        if handle is None:
            stream = await ReplicatedStream.open(
                self.host.name, self.fs, hosted.directory, link, clock=self.clock, fenced=state.epoch,
                session_base=self.incarnation << 32, options=self.options, tick_s=self.tick_s)
        else:
            stream = ReplicatedStream.over(
                self.host.name, self.fs, hosted.directory, handle, link, clock=self.clock, fenced=state.epoch,
                fresh=fresh, session_base=self.incarnation << 32, tick_s=self.tick_s)
        hosted.stream = stream
        if state.epoch:
            stream.observe(hosted.machine.state.view())
        for fn in hosted.waiting:
            fn()
        hosted.waiting.clear()

    async def _barrier(self, hosted: Hosted) -> None:
        """A read barrier: a `Barrier` with a token of this node's, proposed through the group's leader
        (again every BARRIER_RETRY_S while it is not seen), until this node applies it: its copy then holds
        every decision committed before. (Applied-up-to-the-known-commit is not enough: a node catching up
        learns the commit index a little at a time, and would take a past epoch for the current one.)"""
        token = secrets.randbits(62)
        seen = hosted.machine.barriers_seen
        loop = asyncio.get_running_loop()
        next_try = 0.0
        while token not in seen:
            if loop.time() >= next_try:
                self.propose(hosted.gid, sc.Barrier(token))
                next_try = loop.time() + BARRIER_RETRY_S
            await asyncio.sleep(BARRIER_POLL_S)
        seen.discard(token)

    async def declare(self, gid: int, writer: str) -> None:
        """Name epoch 1's writer (once, by the node that declared the stream)."""
        hosted = self.streams[gid]
        await self._barrier(hosted)
        if hosted.machine.state.epoch == 0:  # (once: a second Declare is refused by the machine)
            self.propose(gid, sc.Declare(hosted.members, writer))

    # -- membership (hutch-queues add_member / delete_member / grow / shrink) ---------------------------

    async def add_member(self, gid: int, name: str, timeout_s: float = 10.0) -> None:
        """On the group's leader: make node `name` a member. The node must have attached the stream
        (`attach(..., founding=False)`: its group opens empty and catches up); it becomes a Raft voter,
        then a member of the stream in a new epoch (the writer stays; the new member catches up from the
        writer's files). Raises NotLeader elsewhere, CoordinatorError while the stream is not settled."""
        hosted = self._leading(gid)
        state = hosted.machine.state
        if name in state.members:
            return
        await hosted.group.add_voter(self.host.raft_id_of(name), timeout_s)
        await hosted.group.propose(sc.encode_command(sc.ChangeMembers((*state.members, name))), timeout_s)

    async def delete_member(self, gid: int, name: str, timeout_s: float = 10.0) -> None:
        """On the group's leader: remove node `name` from the stream (a new epoch; an election if it was
        the writer), then from the Raft group. The removed node detaches the stream."""
        hosted = self._leading(gid)
        state = hosted.machine.state
        if name not in state.members:
            return
        rest = tuple(m for m in state.members if m != name)
        await hosted.group.propose(sc.encode_command(sc.ChangeMembers(rest)), timeout_s)
        await hosted.group.remove_voter(self.host.raft_id_of(name), timeout_s)

    async def change_member(self, gid: int, name: str, add: bool, timeout_s: float = 10.0) -> None:
        """`add_member` / `delete_member` at the group's leader: here, or asked of the leader's node."""
        hosted = self.streams.get(gid)
        if hosted is None:
            raise KeyError(f"stream group {gid} is not on {self.host.name}")
        if hosted.group.is_leader:
            await self._change_settled(gid, name, add, timeout_s)
            return
        lead = hosted.group.leader
        leader = self.host.name_of(lead) if lead else None
        if leader is None or leader == self.host.name:
            raise NotLeader(lead)
        await self.host.call(leader, cm.StreamMember(gid, name, add), timeout=timeout_s + 1)

    async def _on_member(self, peer: str, m: cm.StreamMember) -> bool:
        await self._change_settled(m.gid, m.node, m.add, 10.0)
        return True

    async def _change_settled(self, gid: int, name: str, add: bool, timeout_s: float) -> None:
        """add_member / delete_member, tried again while the coordinator says the writer is not settled
        in its epoch yet (a change right after another, or after an election), up to `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                await (self.add_member(gid, name, timeout_s) if add else self.delete_member(gid, name, timeout_s))
                return
            except sc.CoordinatorError as exc:
                if "not settled" not in str(exc) or loop.time() > deadline:
                    raise
            await asyncio.sleep(APPEND_RETRY_S * 4)

    def _leading(self, gid: int) -> Hosted:
        hosted = self.streams.get(gid)
        if hosted is None:
            raise KeyError(f"stream group {gid} is not on {self.host.name}")
        if not hosted.group.is_leader:
            raise NotLeader(hosted.group.leader)
        return hosted

    async def detach(self, gid: int, *, delete: bool = False) -> None:
        hosted = self.streams.pop(gid, None)
        if hosted is None:
            return
        if hosted.started is not None and not hosted.started.done():
            hosted.started.cancel()
        if hosted.stream is not None:
            await hosted.stream.close()
        if self.host.driver is not None:
            self.host.driver.close_group(gid, delete=delete)

    async def stop(self) -> None:
        if self._detector is not None:
            self._detector.cancel()
            self._detector = None
        for gid in list(self.streams):
            await self.detach(gid)

    # -- the coordinator ----------------------------------------------------------------------------

    def _changed(self, hosted: Hosted, state: sc.CoordState) -> None:
        if hosted.stream is not None:
            asyncio.get_running_loop().call_soon(hosted.stream.observe, state.view())

    def propose(self, gid: int, cmd: sc.Command) -> None:
        """Propose on this node's group when it leads, else forward to the leader's node."""
        hosted = self.streams.get(gid)
        if hosted is None:
            return
        entry = sc.encode_command(cmd)
        if hosted.group.is_leader:
            self._propose_here(hosted, entry)
            return
        lead = hosted.group.leader
        name = self.host.name_of(lead) if lead else None
        if name is not None and name != self.host.name:
            self.host.send(name, cm.StreamPropose(gid, entry))

    def _propose_here(self, hosted: Hosted, entry: bytes) -> None:
        try:
            fut = hosted.group.propose_nowait(entry)
        except (NotLeader, GroupClosed) as exc:  # lost: the member says it again (see the module rules)
            log.debug("stream group %d: not proposed: %s", hosted.gid, exc)
            return

        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and isinstance(f.exception(), sc.CoordinatorError | NotLeader
                                                | ProposalTimeout | GroupClosed):
                log.debug("stream group %d: proposal not applied: %s", hosted.gid, f.exception())
        fut.add_done_callback(done)

    def _on_propose(self, peer: str, m: cm.StreamPropose) -> None:
        hosted = self.streams.get(m.gid)
        if hosted is not None and hosted.group.is_leader:
            self._propose_here(hosted, bytes(m.command))

    def peer_changed(self, peer: str, up: bool) -> None:
        """The failure detector: a node went down; where this node leads a stream's group and that node
        writes the stream, elect another writer. (A node that comes up is asked for its stream listener.)"""
        if up:
            asyncio.get_running_loop().create_task(self._ask_endpoint(peer))
            return
        for hosted in self.streams.values():
            state = hosted.machine.state
            if hosted.group.is_leader and state.writer == peer:
                self._propose_here(hosted, sc.encode_command(sc.WriterDown(state.epoch)))

    # -- publishing from any node, and where the members listen ------------------------------------------

    def writes_here(self, gid: int) -> bool:
        hosted = self.streams.get(gid)
        stream = None if hosted is None else hosted.stream
        return stream is not None and stream.member.role is sr.Role.WRITER and stream._reopening is None

    def writer_of(self, gid: int) -> str | None:
        hosted = self.streams.get(gid)
        return None if hosted is None else hosted.machine.state.writer

    async def append(self, gid: int, entries: list[bytes], filters: list[bytes | None] | None,
                     timeout_s: float = APPEND_TIMEOUT_S) -> None:
        """Write `entries` through the stream's writer, here or on its node, and return once a majority
        has them. While the writer is being elected (or its node is not reachable) this waits, up to
        `timeout_s`; a refusal that may have been written anyway (a lost reply, a timeout) is raised, never
        retried, so a confirm always means the entries are in the stream once."""
        await self._through_writer(gid, lambda stream: stream.publish(entries, filter_values=filters),
                                   cm.StreamAppend(gid, entries, filters), timeout_s)

    async def publish(self, gid: int, data: bytes, ids: list[int], reference: bytes,
                      filters: list[bytes | None] | None, timeout_s: float = APPEND_TIMEOUT_S) -> None:
        """A stream-protocol publisher's entries (`data`: a chunk's data section, one publishing id per
        entry; with a `reference`, deduplicated by the writer) written through the stream's writer, here
        or on its node, as `append` does (the same waits and refusals); returns once a majority has
        what was stored."""
        await self._through_writer(
            gid, lambda stream: stream.publish(entries_of(data, ids, filters), publisher=reference or None,
                                               publishing_ids=ids if reference else None, filter_values=filters),
            cm.StreamPublish(gid, data, ids, reference, filters), timeout_s)

    async def _through_writer(self, gid: int, local: Callable[[ReplicatedStream], Appended],
                              request: cm.StreamAppend | cm.StreamPublish, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            hosted = self.streams.get(gid)
            if hosted is None:
                raise KeyError(f"stream group {gid} is not on {self.host.name}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no writer of stream group {gid} took the publishes in time")
            if self.writes_here(gid):
                assert hosted.stream is not None
                appended = local(hosted.stream)
                await asyncio.wait_for(asyncio.shield(appended.settled), remaining)
                return
            writer = hosted.machine.state.writer
            if writer is not None and writer != self.host.name and self.host.connected(writer):
                try:
                    await self.host.call(writer, request, timeout=remaining)
                    return
                except RemoteError as exc:
                    if exc.remote_type != NotWriter.__name__:  # (NotWriter: refused before anything was written)
                        raise
            await asyncio.sleep(APPEND_RETRY_S)

    async def _on_append(self, peer: str, m: cm.StreamAppend) -> bool:
        if not all(type(e) is bytes for e in m.entries) or (
                m.filters is not None and (len(m.filters) != len(m.entries)
                                           or not all(f is None or type(f) is bytes for f in m.filters))):
            raise ValueError("malformed stream append")
        stream = self._writer_here(m.gid)
        appended = stream.publish(m.entries, filter_values=m.filters)
        await asyncio.wait_for(asyncio.shield(appended.settled), APPEND_TIMEOUT_S)
        return True

    async def _on_publish(self, peer: str, m: cm.StreamPublish) -> bool:
        entries = entries_of(m.data, m.ids, m.filters)  # (ValueError: malformed, answered as an error)
        stream = self._writer_here(m.gid)
        appended = stream.publish(entries, publisher=m.reference or None,
                                  publishing_ids=m.ids if m.reference else None, filter_values=m.filters)
        await asyncio.wait_for(asyncio.shield(appended.settled), APPEND_TIMEOUT_S)
        return True

    def store_offset(self, gid: int, reference: bytes, offset: int) -> bool:
        """A consumer's offset stored through the stream's writer, here or on its node (no answer, as the
        stream protocol's store offset has none); False when it could not be sent (no writer, or its node
        is not reachable: the consumer stores again later, as its client does)."""
        hosted = self.streams.get(gid)
        if hosted is None:
            return False
        if self.writes_here(gid):
            return self._store_here(hosted, reference, offset)
        writer = hosted.machine.state.writer
        if writer is None or writer == self.host.name or not self.host.connected(writer):
            return False
        return self.host.send(writer, cm.StreamStoreOffset(gid, reference, offset))

    def _on_store_offset(self, peer: str, m: cm.StreamStoreOffset) -> None:
        hosted = self.streams.get(m.gid)
        if not 0 < len(m.reference) <= 255 or not 0 <= m.offset < 1 << 64:
            log.warning("dropped a malformed stored offset from %s", peer)
        elif hosted is not None and self.writes_here(m.gid):  # (else dropped: never forwarded again)
            self._store_here(hosted, m.reference, m.offset)

    @staticmethod
    def _store_here(hosted: Hosted, reference: bytes, offset: int) -> bool:
        assert hosted.stream is not None
        try:
            hosted.stream.handle.store_offset(reference, offset)
        except (NotWriter, StorageError) as exc:
            log.debug("stream group %d: offset of %r not stored: %r", hosted.gid, reference, exc)
            return False
        return True

    def _writer_here(self, gid: int) -> ReplicatedStream:
        """The member of stream group `gid` if it writes here; NotWriter (before anything is written)."""
        hosted = self.streams.get(gid)
        if hosted is None or hosted.stream is None or not self.writes_here(gid):
            raise NotWriter(None if hosted is None else hosted.machine.state.writer)
        return hosted.stream

    def _on_lookup(self, peer: str, m: cm.StreamLookup) -> Any:  # Any: the answer, by `what`
        hosted = self.streams.get(m.gid)
        if m.what not in LOOKUPS or len(m.reference) > 255:
            raise cm.MalformedMessage(f"StreamLookup from {peer}: {m.what!r}")
        if hosted is not None:
            if m.what == "writer":
                return hosted.machine.state.writer or ""
            handle = None if hosted.stream is None else hosted.stream.handle
        else:  # a stream of one member (not replicated) is its member's to write
            handle = self.unreplicated(m.gid)
            if handle is not None and m.what == "writer":
                return self.host.name
        if handle is None:
            return None
        if m.what == "offset":  # ([]: none stored, as None is "not answered")
            offset = handle.query_offset(m.reference)
            return [] if offset is None else [offset]
        return handle.query_publisher_sequence(m.reference)

    async def lookup(self, gid: int, members: Sequence[str], what: str, reference: bytes = b"") -> Any:
        """For a stream this node is not a member of: `what` (see `StreamLookup`) as the first member that
        is connected and has the stream open answers it (the record's first member, the writer it was
        declared with, is asked first); None if none does."""
        assert what in LOOKUPS
        for member in members:
            if member == self.host.name or not self.host.connected(member):
                continue
            try:
                answer = await self.host.call(member, cm.StreamLookup(gid, what, reference), timeout=LOOKUP_TIMEOUT_S)
            except (PeerUnavailable, RemoteError, TimeoutError, ConnectionError) as exc:
                log.debug("stream group %d: %s not answered by %s: %r", gid, what, member, exc)
                continue
            if answer is not None and answer != "":
                return answer
        return None

    def _on_endpoint(self, peer: str, m: cm.StreamEndpoint) -> list[Any] | bool:
        """[host, port]; [] while the listener is not up yet (asked again); False: this node has none."""
        endpoint = self.local_endpoint()
        if endpoint is not None:
            return list(endpoint)
        return [] if self.has_listener() else False

    async def _ask_endpoint(self, peer: str) -> None:
        """Ask `peer` where its stream listener is; a node that is booting answers before its listener is
        up (nothing): asked again every ENDPOINT_RETRY_S, ENDPOINT_TRIES times at most; a node that has no
        stream listener says so (False), and is asked again only when its endpoint is next wanted."""
        if peer in self._asking:
            return
        self._asking.add(peer)
        try:
            for _ in range(ENDPOINT_TRIES):
                value = await self.host.call(peer, cm.StreamEndpoint(), timeout=5.0)
                if value is False:
                    return
                if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
                        and isinstance(value[1], int):
                    self.endpoints[peer] = (value[0], value[1])
                    return
                await asyncio.sleep(ENDPOINT_RETRY_S)
        except Exception as exc:  # noqa: BLE001 - asked again when it is next wanted
            log.debug("stream listener of %s not known: %r", peer, exc)
        finally:
            self._asking.discard(peer)

    def endpoint_of(self, node: str) -> tuple[str, int] | None:
        """Where `node`'s stream listener is (None: not known yet; then it is asked, once at a time)."""
        if node == self.host.name:
            return self.local_endpoint()
        found = self.endpoints.get(node)
        if found is None and self.host.connected(node):
            asyncio.get_running_loop().create_task(self._ask_endpoint(node))
        return found

    def route(self, gid: int) -> StreamRoute:
        return StreamRoute(self, gid)

    async def wait_writer(self, gid: int, timeout_s: float) -> bool:
        """Until a member writes stream group `gid` (True), or `timeout_s` passed (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            hosted = self.streams.get(gid)
            if hosted is None:
                return False
            state = hosted.machine.state
            if state.writer is not None and (state.writer != self.host.name or self.writes_here(gid)):
                return True
            await asyncio.sleep(BARRIER_POLL_S)
        return False

    def placement(self, gid: int) -> tuple[str | None, tuple[str, ...]]:
        """(the writer's node, the members) as the coordinator's copy here has them."""
        hosted = self.streams.get(gid)
        if hosted is None:
            return None, ()
        state = hosted.machine.state
        return state.writer, state.members or hosted.members

    def when_started(self, gid: int, fn: Callable[[ReplicatedStream], None]) -> None:
        """`fn(member)` once the member of stream group `gid` runs here (now, if it does)."""
        hosted = self.streams[gid]
        if hosted.stream is not None:
            fn(hosted.stream)
        else:
            hosted.waiting.append(lambda: fn(hosted.stream) if hosted.stream is not None else None)

    def _detect(self) -> None:
        """The failure detector's sweep (every DETECT_S): where this node leads a stream's group and the
        writer's node is not connected, elect another writer. (`peer_changed` acts at once, but only
        where this node leads then: a writer's node that led its group too is found by the sweep once
        another leader is elected.)"""
        self._detector = asyncio.get_running_loop().call_later(DETECT_S, self._detect)
        for hosted in self.streams.values():
            state = hosted.machine.state
            writer = state.writer
            if hosted.group.is_leader and writer is not None and writer != self.host.name \
                    and not self.host.connected(writer):
                self._propose_here(hosted, sc.encode_command(sc.WriterDown(state.epoch)))

    # -- the members' messages ----------------------------------------------------------------------

    def _on_replica(self, peer: str, m: cm.StreamReplica) -> None:
        hosted = self.streams.get(m.gid)
        if hosted is None or hosted.stream is None:
            return
        try:
            message = sr.message_from_wire(m.message)
        except ValueError as exc:
            log.warning("dropped a stream replica message from %s: %s", peer, exc)
            return
        hosted.stream.receive(message)


class StreamRoute:
    """A replicated stream's queue's view of replication (the stream queue's `Replication` port,
    runtime/queue_types/stream/queue.py): where it is written, publishing through the writer, members."""

    def __init__(self, service: StreamReplicationService, gid: int) -> None:
        self.service, self.gid = service, gid

    def writes_here(self) -> bool:
        return self.service.writes_here(self.gid)

    async def append(self, entries: list[bytes], filters: list[bytes | None] | None) -> None:
        await self.service.append(self.gid, entries, filters)

    async def publish(self, data: bytes, ids: list[int], reference: bytes,
                      filters: list[bytes | None] | None) -> None:
        """A stream-protocol publisher's entries, through the writer (`StreamReplicationService.publish`)."""
        await self.service.publish(self.gid, data, ids, reference, filters)

    def store_offset(self, reference: bytes, offset: int) -> bool:
        """A consumer's stored offset, through the writer (`StreamReplicationService.store_offset`)."""
        return self.service.store_offset(self.gid, reference, offset)

    def nodes(self) -> tuple[str, str | None, list[tuple[str, tuple[str, int] | None]]]:
        """(this node, the writer's node, each member's node and stream listener, the writer first):
        what the stream protocol's metadata answers."""
        writer, members = self.service.placement(self.gid)
        order = ([writer] if writer in members else []) + [m for m in members if m != writer]
        return self.service.host.name, writer, [(m, self.service.endpoint_of(m)) for m in order]

    def placement(self) -> dict[str, Any]:
        """`leader`, `members`, `online` (management and hutch-queues), and this member's own view."""
        host = self.service.host
        writer, members = self.service.placement(self.gid)
        hosted = self.service.streams.get(self.gid)
        own = hosted.stream.status() if hosted is not None and hosted.stream is not None else {}
        return {"leader": writer or "", "members": list(members),
                "online": [m for m in members if m == host.name or host.connected(m)],
                "epoch": own.get("epoch", 0), "replication": own}


MAX_PUBLISH_ENTRIES = 0xFFFF  # a chunk's entries (the stream-protocol session sends at most 4,096 at once)


def entries_of(data: bytes, ids: list[int], filters: list[bytes | None] | None) -> list[ck.Entry]:
    """The entries of a `StreamPublish`'s data section, checked against its ids and filter values;
    ValueError if they do not match or the data is not a data section."""
    if not 0 < len(ids) <= MAX_PUBLISH_ENTRIES or not all(type(i) is int and 0 <= i < 1 << 64 for i in ids):
        raise ValueError("malformed stream publish: publishing ids")
    if filters is not None and (len(filters) != len(ids) or not all(f is None or type(f) is bytes for f in filters)):
        raise ValueError("malformed stream publish: filter values")
    try:
        entries = list(ck.iter_entries(memoryview(data)))
    except (ValueError, IndexError, struct.error) as exc:
        raise ValueError(f"malformed stream publish: {exc}") from None
    if len(entries) != len(ids):
        raise ValueError(f"malformed stream publish: {len(entries)} entries for {len(ids)} publishing ids")
    return entries


def _starting() -> None:
    raise NotWriter(None)


class _Link:
    """A member's `ReplicaLink`: its messages as records to the other members' nodes."""

    def __init__(self, service: StreamReplicationService, gid: int) -> None:
        self.service, self.gid = service, gid

    def send(self, peer: str, message: sr.Message) -> None:
        self.service.host.send(peer, cm.StreamReplica(self.gid, sr.message_to_wire(message)))

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable | sr.Begin) -> None:
        self.service.propose(self.gid, sc.command_for(effect))
