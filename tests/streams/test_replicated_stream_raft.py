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
from tests.streams.stream_world import World, records
from tests.streams.test_replicated_stream import until

from hutch.cluster import messages as cm
from hutch.cluster import stream_coordinator as sc

pytestmark = pytest.mark.asyncio


async def test_coordinator_in_raft_survives_the_writers_node(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.start()
    await until(lambda: w.state().stable, "the first epoch stable")
    writer = w.writer().stream
    assert writer is not None
    first = [writer.publish([b"a%d" % i]) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in first)), 20)

    dead = w.writer()
    w.kill(dead)
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


async def test_malformed_replica_records_are_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = World(tmp_path)
    await w.start()
    await until(lambda: w.state().stable, "the first epoch stable")
    node = w.nodes[2]
    for bad in ([99], [3, 1, [[1, 2]], 0], [0, "n2", 1]):  # the codec checks the field is a list
        node.deliver("n1", cm.encode(cm.StreamReplica(7, bad)))
    assert "dropped a stream replica message from n1" in caplog.text
    writer = w.writer().stream
    assert writer is not None
    done = writer.publish([b"still fine"])
    await asyncio.wait_for(done.settled, 20)
    await w.stop()
