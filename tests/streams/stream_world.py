"""Three nodes in one event loop, for stream replication tests: each a `RaftDriver` and a
`StreamReplicationService` (runtime/queue_types/stream_replication/service.py) hosting one replicated
stream on its own MemoryFS. Raft traffic crosses tests/cluster/test_raft_driver.py's loopback network; the
service's records (`StreamReplica`, `StreamPropose`) cross the same kind of network through the cluster
message codec (`cm.encode` / `cm.decode`). Nodes can be killed (`kill -9`: unsynced bytes lost),
restarted (the service's read barrier decides when the member starts), isolated and healed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.test_raft_driver import Net
from tests.streams.test_replicated_stream import records, until

from hutch.cluster import messages as cm
from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.runtime.clock import ManualClock
from hutch.runtime.clustering.raft_driver import RaftDriver
from hutch.runtime.clustering.raft_group import Group
from hutch.runtime.clustering.transport import PeerUnavailable
from hutch.runtime.queue_types.stream_replication.member import ReplicatedStream
from hutch.runtime.queue_types.stream_replication.service import Hosted, StreamReplicationService
from hutch.storage.memfs import MemoryFS

__all__ = ["GID", "IDS", "World", "records"]

GID = 7
NAMES = {1: "n1", 2: "n2", 3: "n3", 4: "n4"}
IDS = {v: k for k, v in NAMES.items()}
FOUNDERS = ("n1", "n2", "n3")


class Node:
    """One node: what the cluster service would give the stream replication service (`ReplicationHost`)."""

    def __init__(self, world: World, raft_id: int) -> None:
        self.world, self.raft_id, self.name = world, raft_id, NAMES[raft_id]
        self.fs = MemoryFS(seed=raft_id)
        self.driver: RaftDriver | None = None
        self.service: StreamReplicationService | None = None
        self.hosted: Hosted | None = None
        self.handlers: dict[type, Callable[[str, Any], Any]] = {}
        self.incarnation = 0

    @property
    def up(self) -> bool:
        return self.raft_id in self.world.net.drivers

    @property
    def reachable(self) -> bool:
        return self.up and self.raft_id not in self.world.isolated

    @property
    def stream(self) -> ReplicatedStream | None:
        return self.hosted.stream if self.hosted is not None and self.up else None

    @property
    def group(self) -> Group | None:
        return self.hosted.group if self.hosted is not None and self.up else None

    @property
    def machine(self) -> sc.CoordinatorMachine:
        assert self.hosted is not None
        return self.hosted.machine

    # -- ReplicationHost ------------------------------------------------------------------------------
    def send(self, peer: str, record: cm.Record) -> bool:
        data = cm.encode(record)
        target = self.world.nodes[IDS[peer]]
        if not (self.reachable and target.reachable):
            return False
        asyncio.get_running_loop().call_soon(target.deliver, self.name, data)
        return True

    def deliver(self, peer: str, data: bytes) -> None:
        if self.reachable:
            record = cm.decode(data)
            self.handlers[type(record)](peer, record)

    def register(self, kind: type[Any], handler: Callable[[str, Any], Any]) -> None:
        self.handlers[kind] = handler

    def raft_id_of(self, name: str) -> int:
        return IDS[name]

    def name_of(self, raft_id: int) -> str | None:
        return NAMES.get(raft_id)

    def connected(self, peer: str) -> bool:
        return self.reachable and self.world.nodes[IDS[peer]].reachable

    async def call(self, peer: str, request: cm.Request, timeout: float = 5.0) -> Any:
        target = self.world.nodes[IDS[peer]]
        if not (self.reachable and target.reachable):
            raise PeerUnavailable(peer)
        result = target.handlers[type(request)](self.name, cm.decode(cm.encode(request)))
        return await asyncio.wait_for(result, timeout) if inspect.isawaitable(result) else result


class World:
    def __init__(self, tmp: Path, spare: bool = False) -> None:
        """The three founding members, and with `spare` a fourth node (booted by `boot_spare`)."""
        self.tmp = tmp
        self.net = Net()
        self.nodes = {rid: Node(self, rid) for rid in NAMES if spare or NAMES[rid] in FOUNDERS}
        self.isolated: set[int] = set()

    async def boot_spare(self) -> Node:
        """Start node n4, not a member: its group opens empty (to be added with `add_member`)."""
        node = self.nodes[4]
        await self._boot(node, joining=True)
        return node

    async def _boot(self, node: Node, joining: bool = False) -> None:
        founding = node.incarnation == 0 and node.name in FOUNDERS and not joining  # else: from disk, or empty
        node.incarnation += 1
        d = node.driver = RaftDriver(node.raft_id, str(self.tmp / f"raft{node.raft_id}"),
                                     self.net.sender(node.raft_id), tick_s=0.01, election_tick=10)
        await d.start()
        self.net.drivers[node.raft_id] = d
        for other in self.net.drivers:
            if other != node.raft_id:
                self.net.drivers[other].peer_up(node.raft_id)
                d.peer_up(other)
        node.handlers = {}
        node.service = StreamReplicationService(node, node.fs, ManualClock(), node.incarnation, tick_s=0.01)
        node.hosted = node.service.attach(GID, FOUNDERS, "/s", founding=founding)

    async def start(self) -> None:
        for node in self.nodes.values():
            if node.name in FOUNDERS:
                await self._boot(node)
        self.nodes[1].group.campaign()
        await until(lambda: self.leader() is not None, "a Raft leader")
        assert self.nodes[1].service is not None
        await self.nodes[1].service.declare(GID, "n1")
        await until(lambda: all(n.stream is not None for n in self.nodes.values() if n.name in FOUNDERS),
                    "the members started")

    def kill(self, node: Node) -> None:
        """kill -9: the driver stops without syncing, the stream's unsynced bytes are lost."""
        hosted = node.hosted
        if hosted is not None:
            if hosted.started is not None:
                hosted.started.cancel()
            if hosted.stream is not None:  # the process is gone: nothing of it runs any more
                hosted.stream.closed = True
                if hosted.stream._timer is not None:
                    hosted.stream._timer.cancel()
                if hosted.stream._reopening is not None:
                    hosted.stream._reopening.cancel()
        node.fs.crash()
        driver = self.net.kill(node.raft_id)
        for other in self.nodes.values():
            if other.up and other.service is not None:
                other.service.peer_changed(node.name, False)
        asyncio.get_running_loop().create_task(driver.stop(crash=True))

    async def restart(self, node: Node, timeout_s: float = 3.0) -> bool:
        """Boot a killed node; True once its member started (the service's read barrier passed), False if
        it could not within `timeout_s` (no leader to catch up with: the node is killed again)."""
        await self._boot(node)
        try:
            await until(lambda: node.stream is not None, "the member started", timeout_s)
        except AssertionError:
            self.kill(node)
            return False
        return True

    def isolate(self, node: Node) -> None:
        self.isolated.add(node.raft_id)
        self.net.partition({node.raft_id})

    def heal(self) -> None:
        self.isolated.clear()
        self.net.heal()

    def leader(self) -> Node | None:
        for node in self.nodes.values():
            if node.reachable and node.hosted is not None and node.group is not None and node.group.is_leader:
                return node
        return None

    async def propose(self, cmd: sc.Command) -> None:
        """A command to the stream's coordinator, from a reachable node (the service forwards it to the
        group's leader), made again while it changes nothing, for up to 2 s (a leader may be changing)."""
        before = self.state()
        for _ in range(40):
            node = next((n for n in self.nodes.values() if n.reachable and n.service is not None), None)
            if node is None:
                return
            node.service.propose(GID, cmd)
            await asyncio.sleep(0.05)
            if self.state() != before:
                return

    def state(self) -> sc.CoordState:
        lead = self.leader()
        if lead is not None:
            return lead.machine.state
        return next(n.machine.state for n in self.nodes.values() if n.up and n.hosted is not None)

    async def writing(self, timeout_s: float = 20.0) -> ReplicatedStream:
        """The writer's member, once the coordinator has a stable writer and that member writes."""
        def ready() -> bool:
            stream = self.writer().stream if self.state().stable else None
            return stream is not None and stream.member.role is sr.Role.WRITER
        await until(ready, "a stable writer, writing", timeout_s)
        stream = self.writer().stream
        assert stream is not None
        return stream

    def describe(self) -> str:
        """Every node's view and member, for a failing run's message."""
        lines = []
        for n in self.nodes.values():
            state = n.hosted.machine.state if n.hosted is not None else None
            lines.append(f"{n.name}: up={n.up} isolated={n.raft_id in self.isolated} coordinator={state}")
            if n.stream is not None:
                m = n.stream.member
                lines.append(f"  member {m.status()} session={m.session} started={m.started} "
                             f"closed={n.stream.closed} files_next={n.stream.handle.next_offset}")
                for peer, p in m.progress.items():
                    lines.append(f"    progress {peer}: {p}")
        return "\n".join(lines)

    def writer(self) -> Node:
        state = self.state()
        assert state.writer is not None
        return self.nodes[IDS[state.writer]]

    async def stop(self) -> None:
        for node in self.nodes.values():
            if node.up and node.service is not None:
                await node.service.stop()
                await self.net.drivers[node.raft_id].stop()

