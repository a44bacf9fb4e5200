"""The stream coordinator hosted in a real Raft group: three `RaftDriver`s in one event loop
(tests/cluster/test_raft_driver.py's loopback network, msgpack on every hop), each hosting the
coordinator's group (`CoordinatorMachine`) and one `ReplicatedStream` whose messages cross the same kind of
network as msgpack (`message_to_wire`). The members learn the coordinator's decisions from their own
node's copy of the group; their reports and elections are proposed through the group's leader. The
writer's node dies: the Raft group and the stream each elect again, and publishing goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
from tests.cluster.test_raft_driver import Net
from tests.streams.test_replicated_stream import until

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.runtime.clock import ManualClock
from hutch.runtime.clustering.raft_driver import Group, NotLeader, RaftDriver
from hutch.runtime.queue_types.stream_replication.member import ReplicatedStream
from hutch.storage.memfs import MemoryFS

pytestmark = pytest.mark.asyncio
GID = 7
NAMES = {1: "n1", 2: "n2", 3: "n3"}
IDS = {v: k for k, v in NAMES.items()}


class Node:
    def __init__(self, world: World, raft_id: int) -> None:
        self.world, self.raft_id, self.name = world, raft_id, NAMES[raft_id]
        self.fs = MemoryFS(seed=raft_id)
        self.stream: ReplicatedStream | None = None
        self.driver: RaftDriver | None = None
        self.group: Group | None = None
        self.machine = sc.CoordinatorMachine(self._changed)

    def _changed(self, state: sc.CoordState) -> None:
        if self.stream is not None:
            asyncio.get_running_loop().call_soon(self.stream.observe, state.view())

    # the ReplicaLink: members' messages as msgpack, coordinator effects proposed through the leader
    def send(self, peer: str, message: sr.Message) -> None:
        data = msgpack.packb(sr.message_to_wire(message))
        target = self.world.nodes.get(IDS[peer])
        if target is not None and target.stream is not None and IDS[peer] in self.world.net.drivers:
            asyncio.get_running_loop().call_soon(
                target.stream.receive, sr.message_from_wire(msgpack.unpackb(data)))

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable) -> None:
        if isinstance(effect, sr.Report):
            cmd: sc.Command = sc.TailReport(effect.sender, effect.epoch, effect.tail)
        elif isinstance(effect, sr.Reelect):
            cmd = sc.WriterDown(effect.epoch)
        else:
            cmd = sc.EpochStable(effect.epoch)
        asyncio.get_running_loop().create_task(self.world.propose(cmd))


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.net = Net()
        self.nodes: dict[int, Node] = {}

    async def start(self) -> None:
        for rid in NAMES:
            node = self.nodes[rid] = Node(self, rid)
            d = node.driver = RaftDriver(rid, str(self.tmp / f"raft{rid}"), self.net.sender(rid),
                                         tick_s=0.01, election_tick=10)
            await d.start()
            self.net.drivers[rid] = d
        for rid, node in self.nodes.items():
            for other in self.nodes:
                if other != rid:
                    self.net.drivers[rid].peer_up(other)
            node.stream = await ReplicatedStream.open(node.name, node.fs, "/s", node, clock=ManualClock(),
                                                      fenced=0, session_base=rid << 32, tick_s=0.01)
            assert node.driver is not None
            node.group = node.driver.open_group(GID, node.machine, bootstrap_voters=list(NAMES))
        self.nodes[1].group.campaign()  # type: ignore[union-attr]
        await until(lambda: self.leader() is not None, "a Raft leader")
        await self.propose(sc.Declare(tuple(NAMES.values()), "n1"))

    def leader(self) -> Node | None:
        for rid, node in self.nodes.items():
            if rid in self.net.drivers and node.group is not None and node.group.is_leader:
                return node
        return None

    async def propose(self, cmd: sc.Command) -> None:
        """Through the group's leader (the runtime forwards to it), retried while there is none."""
        for _ in range(200):
            leader = self.leader()
            if leader is not None and leader.group is not None:
                try:
                    await leader.group.propose(sc.encode_command(cmd), timeout=2.0)
                    return
                except (NotLeader, sc.CoordinatorError):
                    return
            await asyncio.sleep(0.02)

    def writer(self) -> Node:
        state = next(n.machine.state for rid, n in self.nodes.items() if rid in self.net.drivers)
        assert state.writer is not None
        return self.nodes[IDS[state.writer]]

    def state(self) -> sc.CoordState:
        return next(n.machine.state for rid, n in self.nodes.items() if rid in self.net.drivers)

    async def stop(self) -> None:
        for rid, node in self.nodes.items():
            if node.stream is not None and not node.stream.closed:
                await node.stream.close()
            if rid in self.net.drivers:
                await self.net.drivers[rid].stop()


def records(rs: ReplicatedStream) -> list[bytes]:
    r = rs.handle.reader(OffsetSpec.first())
    out: list[bytes] = []
    while (c := r.next_chunk()) is not None:
        out.extend(rec for _, rec in c.records())
    return out


async def test_coordinator_in_raft_survives_the_writers_node(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.start()
    await until(lambda: w.state().stable, "the first epoch stable")
    writer = w.writer().stream
    assert writer is not None
    first = [writer.publish([b"a%d" % i]) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in first)), 20)

    dead = w.writer()
    assert dead.stream is not None
    dead.stream.closed = True  # kill -9 of the writer's node: its driver, its stream, its unsynced bytes
    if dead.stream._timer is not None:
        dead.stream._timer.cancel()
    dead.fs.crash()
    w.net.kill(dead.raft_id)
    await w.propose(sc.WriterDown(w.state().epoch))  # the failure detector's verdict
    await until(lambda: w.state().writer not in (None, dead.name) and w.state().stable, "a new writer", 30)
    new = w.writer().stream
    assert new is not None
    second = [new.publish([b"b%d" % i]) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in second)), 20)
    want = [*(b"a%d" % i for i in range(20)), *(b"b%d" % i for i in range(20))]
    for node in w.nodes.values():
        if node is not dead:
            assert node.stream is not None
            await until(lambda s=node.stream: records(s) == want, f"{node.name} holding every record")
    await w.stop()
