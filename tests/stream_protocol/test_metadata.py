"""The stream protocol's metadata (runtime/stream_session/metadata.py): `placement`, pure (a stream's leader
and replicas as broker references, this node reference 0, the workers of a node one node, a node that is
not a member referring to every member by its listener), and, in memory, a connection on a node that is
not a member of a stream: metadata, query offset and query publisher sequence answered once a member
answers, in the order they were asked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.catalog import QueueCatalog
from hutch.runtime.stream_session.hub import StreamHub
from hutch.runtime.stream_session.metadata import NO_BROKER, placement
from hutch.runtime.stream_session.ports import Members
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code
from session.memory import make_node

from .memory import StreamPair

A, B, C = ("127.0.0.1", 5552), ("10.0.0.2", 5552), ("10.0.0.3", 5552)


def brokers() -> dict[tuple[str, int], int]:
    return {A: 0}


def test_a_stream_of_this_node_only_is_led_here_without_replicas() -> None:
    assert placement("s", None, brokers()) == ("s", Code.OK, 0, [])


def test_a_member_names_the_writer_and_the_other_members_once() -> None:
    known = brokers()
    entry = placement("s", ("n1", "n2", [("n2", B), ("n1", A), ("n3", C)]), known)
    assert entry == ("s", Code.OK, 1, [0, 2]) and known == {A: 0, B: 1, C: 2}


def test_the_workers_of_this_node_are_this_node_once() -> None:
    members = ("n#w1", "n#w0", [("n#w0", A), ("n#w1", A), ("n#w2", A)])
    assert placement("s", members, brokers()) == ("s", Code.OK, 0, [])


def test_a_node_that_is_not_a_member_refers_to_the_members_listeners() -> None:
    known = brokers()
    assert placement("s", ("n3", "n1", [("n1", B), ("n2", C)]), known) == ("s", Code.OK, 1, [2])
    assert known == {A: 0, B: 1, C: 2}  # (this node stays reference 0, named by no stream)


def test_no_writer_or_an_unknown_writer_listener_is_not_available() -> None:
    assert placement("s", ("n1", None, [("n1", A), ("n2", B)]), brokers()) == ("s", Code.STREAM_NOT_AVAILABLE,
                                                                               NO_BROKER, [])
    assert placement("s", ("n1", "n2", [("n2", None), ("n1", A)]), brokers())[1] == Code.STREAM_NOT_AVAILABLE


# -- another node's stream, driven in memory: a connection on a node that is not a member -----------------

class FarCatalog(QueueCatalog):
    """This node's streams, and "far", another node's replicated stream (members n1, n2; n1 writes):
    each `locate` or `ask` waits for the test to answer it."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.pending: list[tuple[str, asyncio.Future[Any]]] = []

    def elsewhere(self, vhost: str, name: str) -> bool:
        return name == "far"

    async def _wait(self, what: str) -> Any:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((what, answer))
        return await answer

    async def locate(self, vhost: str, name: str) -> Members | None:
        writer = await self._wait("writer")
        return "n3", writer, [("n1", B), ("n2", C)]

    async def ask(self, vhost: str, name: str, what: str, reference: str) -> Any:
        return await self._wait(f"{what} {reference}")


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def far_pair(node: Node) -> tuple[FarCatalog, StreamPair]:
    catalog = FarCatalog(node)
    pair = StreamPair(StreamHub(node, catalog))
    await pair.open()
    await pair.create("here")
    return catalog, pair


@pytest.mark.asyncio
async def test_metadata_of_another_nodes_stream_waits_for_a_member_and_keeps_the_order(node: Node) -> None:
    catalog, pair = await far_pair(node)
    pair.send(c.Metadata(7, ["here", "far", "nope"]), c.Metadata(8, ["here"]))
    await pair.until(lambda: len(catalog.pending) == 1)
    assert pair.received() == []  # neither answer before the member's (the second waits behind it)
    catalog.pending[0][1].set_result("n1")
    first, second = await pair.expect(2)
    assert isinstance(first, c.MetadataResponse) and isinstance(second, c.MetadataResponse)
    assert first.correlation_id == 7 and second.correlation_id == 8
    brokers = {ref: (host, port) for ref, host, port in first.brokers}
    assert [(s, code) for s, code, _l, _r in first.streams] == [
        ("here", Code.OK), ("far", Code.OK), ("nope", Code.STREAM_DOES_NOT_EXIST)]
    _s, _code, leader, replicas = first.streams[1]
    assert brokers[leader] == B and [brokers[r] for r in replicas] == [C]
    pair.send(c.Metadata(9, ["far"]))  # no writer named (an election): not available
    await pair.until(lambda: len(catalog.pending) == 2)
    catalog.pending[1][1].set_result(None)
    [third] = await pair.expect(1)
    assert isinstance(third, c.MetadataResponse) and third.streams == [("far", Code.STREAM_NOT_AVAILABLE,
                                                                        NO_BROKER, [])]


@pytest.mark.asyncio
async def test_queries_of_another_nodes_stream_answer_as_a_member_does(node: Node) -> None:
    catalog, pair = await far_pair(node)
    for answer, want in (([7], (Code.OK, 7)), ([], (Code.NO_OFFSET, 0)), (None, (Code.STREAM_NOT_AVAILABLE, 0))):
        pair.send(c.QueryOffset(11, "reader", "far"))
        await pair.until(lambda: catalog.pending != [] and not catalog.pending[-1][1].done())
        assert catalog.pending[-1][0] == "offset reader"
        catalog.pending[-1][1].set_result(answer)
        assert await pair.expect(1) == [c.QueryOffsetResponse(11, *want)]
    pair.send(c.QueryPublisherSequence(12, "app", "far"))
    await pair.until(lambda: not catalog.pending[-1][1].done())
    assert catalog.pending[-1][0] == "sequence app"
    catalog.pending[-1][1].set_result(42)
    assert await pair.expect(1) == [c.QueryPublisherSequenceResponse(12, Code.OK, 42)]
    assert await pair.request(c.QueryOffset(13, "reader", "here")) == c.QueryOffsetResponse(13, Code.NO_OFFSET, 0)
