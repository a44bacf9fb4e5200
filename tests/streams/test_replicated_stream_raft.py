"""The stream coordinator hosted in a real Raft group: three `RaftDriver`s in one event loop
(tests/cluster/test_raft_driver.py's loopback network, msgpack on every hop), each hosting the
coordinator's group (`CoordinatorMachine`) and one `ReplicatedStream` whose messages cross the same kind of
network as msgpack (`message_to_wire`). The members learn the coordinator's decisions from their own
node's copy of the group; their reports and elections are proposed through the group's leader. The
writer's node dies: the Raft group and the stream each elect again, and publishing goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.streams.stream_world import GID, IDS, World, records
from tests.streams.test_replicated_stream import until

from hutch.cluster import messages as cm
from hutch.cluster import stream_coordinator as sc
from hutch.runtime.clustering.raft_group import NotLeader

pytestmark = pytest.mark.asyncio


async def started_with(w: World, count: int) -> World:
    """The world started, and `count` records a0, a1, ... published and confirmed."""
    await w.start()
    writer = await w.writing()
    first = [writer.publish([b"a%d" % i]) for i in range(count)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in first)), 20)
    return w


async def test_coordinator_in_raft_survives_the_writers_node(tmp_path: Path) -> None:
    w = await started_with(World(tmp_path), 20)

    dead = w.writer()
    w.kill(dead)
    await w.propose(sc.WriterDown(w.state().epoch))  # the failure detector's verdict
    await until(lambda: w.state().writer not in (None, dead.name), "a new writer", 30)
    new = await w.writing(30)
    second = [new.publish([b"b%d" % i]) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in second)), 20)
    want = [*(b"a%d" % i for i in range(20)), *(b"b%d" % i for i in range(20))]
    for node in w.nodes.values():
        if node is not dead:
            assert node.stream is not None
            await until(lambda s=node.stream: records(s) == want, f"{node.name} holding every record")
    await w.stop()


async def test_malformed_replica_records_are_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = World(tmp_path)
    await w.start()
    await w.writing()
    node = w.nodes[2]
    for bad in ([99], [3, 1, [[1, 2]], 0], [0, "n2", 1]):  # the codec checks the field is a list
        node.deliver("n1", cm.encode(cm.StreamReplica(7, bad)))
    assert "dropped a stream replica message from n1" in caplog.text
    writer = await w.writing()
    done = writer.publish([b"still fine"])
    await asyncio.wait_for(done.settled, 20)
    await w.stop()


async def test_members_added_and_removed_through_the_service(tmp_path: Path) -> None:
    w = await started_with(World(tmp_path, spare=True), 30)
    leader = w.leader()
    assert leader is not None and leader.service is not None
    with pytest.raises(NotLeader):
        follower = next(n for n in w.nodes.values() if n.service is not None and n is not leader)
        await follower.service.add_member(GID, "n4")
    n4 = await w.boot_spare()
    await leader.service.add_member(GID, "n4")
    await until(lambda: w.state().members == ("n1", "n2", "n3", "n4") and w.state().stable, "n4 a member")
    await until(lambda: n4.stream is not None and records(n4.stream) == [b"a%d" % i for i in range(30)],
                "n4 caught up from the writer's files")
    # remove the writer: the others elect one of themselves, and publishing goes on
    old = w.state().writer
    leader = w.leader()
    assert leader is not None and leader.service is not None
    await leader.service.delete_member(GID, old)
    await until(lambda: w.state().writer not in (None, old), "a new writer", 20)
    new = await w.writing()
    assert old not in w.state().members
    done = new.publish([b"after"])
    await asyncio.wait_for(done.settled, 20)
    for name in w.state().members:
        node = w.nodes[IDS[name]]
        await until(lambda n=node: n.stream is not None and records(n.stream)[-1:] == [b"after"],
                    f"{name} holding the new record")
    await w.stop()


async def test_a_node_without_a_stream_listener_says_so_and_is_not_asked_again(tmp_path: Path) -> None:
    """A node asks a peer that came up where its stream listener is; a peer still booting answers [] and is
    asked again every ENDPOINT_RETRY_S (for a minute), but one that has no stream listener at all (a node
    started without --stream-port) answers False, and the asking ends at once: an idle node of workers
    does not keep waking each other twice a second (docs/scaling.md, "Where a second worker's CPU goes")."""
    w = World(tmp_path)
    await w.start()
    n1, n2, n3 = (w.nodes[IDS[name]].service for name in ("n1", "n2", "n3"))
    assert n1 is not None and n2 is not None and n3 is not None
    n2.has_listener = lambda: False
    n3.local_endpoint = lambda: ("127.0.0.1", 5552)
    assert n2._on_endpoint("n1", cm.StreamEndpoint()) is False
    await asyncio.wait_for(n1._ask_endpoint("n2"), 2)  # one answer, no retries
    assert "n2" not in n1.endpoints and "n2" not in n1._asking
    await asyncio.wait_for(n1._ask_endpoint("n3"), 2)
    assert n1.endpoints["n3"] == ("127.0.0.1", 5552)
    await w.stop()
