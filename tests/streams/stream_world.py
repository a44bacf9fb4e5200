"""Three hutch nodes in one event loop, for stream replication tests: each a `RaftDriver` hosting the
stream coordinator's Raft group (`CoordinatorMachine`) and a `ReplicatedStream` on its own MemoryFS. Raft
traffic crosses tests/cluster/test_raft_driver.py's loopback network, replica messages their wire codec
(msgpack); the coordinator's decisions reach each member from its own node's copy of the group, and its
reports are proposed through the group's leader. Nodes can be killed (`kill -9`: unsynced bytes lost),
restarted (after a read barrier on the group, so the member learns the epoch it is fenced at), isolated
and healed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
from tests.cluster.test_raft_driver import Net
from tests.streams.test_replicated_stream import until

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.runtime.clock import ManualClock
from hutch.runtime.clustering.raft_driver import Group, NotLeader, ProposalTimeout, RaftDriver
from hutch.runtime.clustering.raft_group import GroupClosed
from hutch.runtime.queue_types.stream_replication.member import ReplicatedStream
from hutch.storage.memfs import MemoryFS

GID = 7
NAMES = {1: "n1", 2: "n2", 3: "n3"}
IDS = {v: k for k, v in NAMES.items()}


class Node:
    def __init__(self, world: World, raft_id: int) -> None:
        self.world, self.raft_id, self.name = world, raft_id, NAMES[raft_id]
        self.fs = MemoryFS(seed=raft_id)
        self.stream: ReplicatedStream | None = None
        self.group: Group | None = None
        self.machine = sc.CoordinatorMachine(self._changed)
        self.incarnation = 0

    @property
    def up(self) -> bool:
        return self.raft_id in self.world.net.drivers

    @property
    def reachable(self) -> bool:
        return self.up and self.raft_id not in self.world.isolated

    def _changed(self, state: sc.CoordState) -> None:
        if self.stream is not None:
            asyncio.get_running_loop().call_soon(self.stream.observe, state.view())

    # the ReplicaLink: members' messages as msgpack, coordinator effects proposed through the leader
    def send(self, peer: str, message: sr.Message) -> None:
        data = msgpack.packb(sr.message_to_wire(message))
        target = self.world.nodes[IDS[peer]]
        if self.reachable and target.reachable and target.stream is not None:
            asyncio.get_running_loop().call_soon(
                target.stream.receive, sr.message_from_wire(msgpack.unpackb(data)))

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable) -> None:
        if not self.reachable:
            return
        cmd = sc.command_for(effect)
        asyncio.get_running_loop().create_task(self.world.propose(cmd))


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.net = Net()
        self.nodes = {rid: Node(self, rid) for rid in NAMES}
        self.isolated: set[int] = set()

    async def _boot(self, node: Node) -> None:
        d = RaftDriver(node.raft_id, str(self.tmp / f"raft{node.raft_id}"), self.net.sender(node.raft_id),
                       tick_s=0.01, election_tick=10)
        await d.start()
        self.net.drivers[node.raft_id] = d
        for other in self.net.drivers:
            if other != node.raft_id:
                self.net.drivers[other].peer_up(node.raft_id)
                d.peer_up(other)
        node.machine = sc.CoordinatorMachine(node._changed)
        node.group = d.open_group(GID, node.machine, bootstrap_voters=list(NAMES))

    async def _open_stream(self, node: Node) -> None:
        node.incarnation += 1
        state = node.machine.state
        node.stream = await ReplicatedStream.open(
            node.name, node.fs, "/s", node, clock=ManualClock(), fenced=state.epoch,
            session_base=(node.raft_id << 40) + (node.incarnation << 32), tick_s=0.01)
        if state.epoch:
            node.stream.observe(state.view())

    async def start(self) -> None:
        for node in self.nodes.values():
            await self._boot(node)
        for node in self.nodes.values():
            await self._open_stream(node)
        self.nodes[1].group.campaign()  # type: ignore[union-attr]
        await until(lambda: self.leader() is not None, "a Raft leader")
        await self.propose(sc.Declare(tuple(NAMES.values()), "n1"))

    def kill(self, node: Node) -> None:
        """kill -9: the driver stops without syncing, the stream's unsynced bytes are lost."""
        stream, node.stream = node.stream, None
        if stream is not None:
            stream.closed = True
            if stream._timer is not None:
                stream._timer.cancel()
        node.fs.crash()
        driver = self.net.kill(node.raft_id)
        asyncio.get_running_loop().create_task(driver.stop(crash=True))
        node.group = None

    async def restart(self, node: Node) -> bool:
        """Boot a killed node; its member starts once its copy of the coordinator has caught up with the
        group's leader (a read barrier), so that it knows the epoch it is fenced at. False: no leader to
        catch up with (the node stays down)."""
        await self._boot(node)
        try:
            await until(lambda: (lead := self.leader()) is not None and lead is not node
                        and node.machine.state == lead.machine.state, "a read barrier", 3.0)
        except AssertionError:
            self.kill(node)
            return False
        await self._open_stream(node)
        return True

    def isolate(self, node: Node) -> None:
        self.isolated.add(node.raft_id)
        self.net.partition({node.raft_id})

    def heal(self) -> None:
        self.isolated.clear()
        self.net.heal()

    def leader(self) -> Node | None:
        for node in self.nodes.values():
            if node.reachable and node.group is not None and node.group.is_leader:
                return node
        return None

    async def propose(self, cmd: sc.Command) -> None:
        """Through the group's leader (the runtime forwards to it), retried while there is none."""
        for _ in range(100):
            leader = self.leader()
            if leader is not None and leader.group is not None:
                try:
                    await leader.group.propose(sc.encode_command(cmd), timeout=2.0)
                    return
                except sc.CoordinatorError:
                    return
                except (NotLeader, ProposalTimeout, GroupClosed):
                    pass  # the leader changed or its node died under the proposal: try again
            await asyncio.sleep(0.02)

    def state(self) -> sc.CoordState:
        lead = self.leader()
        if lead is not None:
            return lead.machine.state
        return next(n.machine.state for n in self.nodes.values() if n.up)

    def writer(self) -> Node:
        state = self.state()
        assert state.writer is not None
        return self.nodes[IDS[state.writer]]

    async def stop(self) -> None:
        for node in self.nodes.values():
            if node.stream is not None and not node.stream.closed:
                await node.stream.close()
            if node.up:
                await self.net.drivers[node.raft_id].stop()


def records(rs: ReplicatedStream) -> list[bytes]:
    r = rs.handle.reader(OffsetSpec.first())
    out: list[bytes] = []
    while (c := r.next_chunk()) is not None:
        out.extend(rec for _, rec in c.records())
    return out
