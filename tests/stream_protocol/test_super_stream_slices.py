"""Creating a super stream declares its partitions one per loop turn (runtime/stream_session/
super_streams.py, `declare_in_slices`), and stays all or nothing though other commands run between the
turns: driven in memory (a real `StreamConnection` on a real node), the loop stepped by hand so that a
second client acts in the middle of a creation. The stall it removed is measured against a real node in
test_security_stream.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hutch.runtime.broker.node import Node
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key
from session.memory import make_node

from .memory import StreamPair, make_hub

pytestmark = pytest.mark.asyncio

PARTITIONS = 32


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


def names(super_stream: str, count: int = PARTITIONS) -> list[str]:
    return [f"{super_stream}-{i}" for i in range(count)]


def create(pair: StreamPair, name: str, partitions: list[str]) -> int:
    """Send a create_super_stream; returns its correlation id."""
    pair.send(c.CreateSuperStream(pair.next_corr(), name, partitions, [str(i) for i in range(len(partitions))], {}))
    return pair.corr


async def opened(node: Node) -> tuple[StreamPair, StreamPair]:
    hub = make_hub(node)
    a, b = StreamPair(hub), StreamPair(hub)
    await a.open()
    await b.open()
    return a, b


async def step_until_partway(node: Node, partitions: list[str]) -> None:
    """Step the loop one turn at a time until some partitions exist and not all."""
    queues = node.vhosts["/"].queues
    for _ in range(10 * len(partitions)):
        await asyncio.sleep(0)
        if partitions[0] in queues:
            assert partitions[-1] not in queues, "the partitions were declared in one turn"
            return
    raise AssertionError("the creation did not start")


def streams_left(node: Node, partitions: list[str]) -> list[str]:
    return [p for p in partitions if p in node.vhosts["/"].queues]


async def test_the_partitions_are_declared_one_per_loop_turn(node: Node) -> None:
    a, _b = await opened(node)
    loop = asyncio.get_running_loop()
    turns = 0
    done = False

    def tick() -> None:
        nonlocal turns
        turns += 1
        if not done:
            loop.call_soon(tick)

    loop.call_soon(tick)
    corr = create(a, "sliced", names("sliced"))
    (answer,) = await a.expect(1)
    done = True
    assert answer == c.Response(Key.CREATE_SUPER_STREAM, corr, Code.OK)
    assert turns >= PARTITIONS  # other work ran between the declares
    assert streams_left(node, names("sliced")) == names("sliced")  # the answer after every partition
    assert await a.request(c.Partitions(a.next_corr(), "sliced")) == c.PartitionsResponse(
        a.corr, Code.OK, names("sliced"))


async def test_a_second_create_of_the_same_name_meanwhile_is_refused(node: Node) -> None:
    a, b = await opened(node)
    first = create(a, "twice", names("twice"))
    await step_until_partway(node, names("twice"))
    second = create(b, "twice", names("twice"))
    assert await b.expect(1) == [c.Response(Key.CREATE_SUPER_STREAM, second, Code.STREAM_ALREADY_EXISTS)]
    assert await a.expect(1) == [c.Response(Key.CREATE_SUPER_STREAM, first, Code.OK)]
    assert streams_left(node, names("twice")) == names("twice")


async def test_a_delete_in_the_middle_of_a_creation_leaves_nothing(node: Node) -> None:
    a, b = await opened(node)
    corr = create(a, "gone", names("gone"))
    await step_until_partway(node, names("gone"))
    assert await b.request(c.DeleteSuperStream(b.next_corr(), "gone")) == c.Response(
        Key.DELETE_SUPER_STREAM, b.corr, Code.OK)
    assert await a.expect(1) == [c.Response(Key.CREATE_SUPER_STREAM, corr, Code.STREAM_DOES_NOT_EXIST)]
    await a.until(lambda: not streams_left(node, names("gone")))
    assert "gone" not in node.vhosts["/"].exchanges


async def test_a_partition_declared_by_someone_else_meanwhile_undoes_the_creation(node: Node) -> None:
    a, b = await opened(node)
    partitions = names("taken")
    corr = create(a, "taken", partitions)
    await step_until_partway(node, partitions)
    await b.create(partitions[-1])  # a plain stream of the last partition's name, declared meanwhile
    assert await a.expect(1) == [c.Response(Key.CREATE_SUPER_STREAM, corr, Code.STREAM_ALREADY_EXISTS)]
    assert streams_left(node, partitions) == [partitions[-1]]  # b's stream only: a's were undone
    assert "taken" not in node.vhosts["/"].exchanges
    reply = await a.request(c.Partitions(a.next_corr(), "taken"))
    assert isinstance(reply, c.PartitionsResponse) and reply.code == Code.STREAM_DOES_NOT_EXIST
