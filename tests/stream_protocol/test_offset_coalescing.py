"""Stored offsets are coalesced (runtime/stream_session/consuming.py, `coalesce_offsets`): a flood of
`store_offset` writes one tracking entry per reference and stream a turn, the last offset winning;
a `query_offset` (or any command) after a `store_offset` on the same connection sees it, in the same
write or not, as rstream's and the js client's tests expect. Driven in memory (a real `StreamConnection` on a real node and
stream); the flood against a real node, and a restart, are in test_security_stream.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch.runtime.broker.node import Node
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code
from session.memory import make_node

from .memory import StreamPair, make_hub

pytestmark = pytest.mark.asyncio


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def with_stream(node: Node, *streams: str) -> StreamPair:
    pair = StreamPair(make_hub(node))
    await pair.open()
    for stream in streams:
        await pair.create(stream)
    return pair


def handle(pair: StreamPair, stream: str) -> StreamHandle:
    found = pair.hub.catalog.lookup("/", stream)
    assert found is not None
    return found


async def test_a_flood_for_one_reference_writes_one_entry_with_the_last_offset(node: Node) -> None:
    pair = await with_stream(node, "s1")
    h = handle(pair, "s1")
    written = h.chunks_written
    pair.send(*(c.StoreOffset("app", "s1", i) for i in range(1000)))
    assert await pair.request(c.QueryOffset(pair.next_corr(), "app", "s1")) == c.QueryOffsetResponse(
        pair.corr, Code.OK, 999)
    assert h.chunks_written - written == 1  # one TRACKING_DELTA chunk for the 1,000 commands


async def test_references_and_streams_stored_together_take_one_chunk_a_stream(node: Node) -> None:
    pair = await with_stream(node, "s1", "s2")
    before = {s: handle(pair, s).chunks_written for s in ("s1", "s2")}
    pair.send(*(c.StoreOffset(f"app-{i % 10}", f"s{1 + i % 2}", i) for i in range(200)))
    for i in range(190, 200):  # the last offset of each (reference, stream)
        reply = await pair.request(c.QueryOffset(pair.next_corr(), f"app-{i % 10}", f"s{1 + i % 2}"))
        assert reply == c.QueryOffsetResponse(pair.corr, Code.OK, i)
    assert {s: handle(pair, s).chunks_written - before[s] for s in ("s1", "s2")} == {"s1": 1, "s2": 1}


async def test_a_query_in_the_same_write_as_the_store_answers_the_stored_offset(node: Node) -> None:
    pair = await with_stream(node, "s1")
    pair.send(c.StoreOffset("app", "s1", 5), c.QueryOffset(pair.next_corr(), "app", "s1"),
              c.StoreOffset("app", "s1", 6), c.QueryOffset(pair.next_corr(), "app", "s1"))
    assert await pair.expect(2) == [c.QueryOffsetResponse(pair.corr - 1, Code.OK, 5),
                                    c.QueryOffsetResponse(pair.corr, Code.OK, 6)]


async def test_another_connection_sees_the_offset_after_the_turn(node: Node) -> None:
    pair = await with_stream(node, "s1")
    other = StreamPair(pair.hub)
    await other.open()
    pair.send(*(c.StoreOffset("app", "s1", i) for i in range(50)))
    assert await other.request(c.QueryOffset(other.next_corr(), "app", "s1")) == c.QueryOffsetResponse(
        other.corr, Code.OK, 49)


async def test_the_coalesced_offsets_are_one_entry_a_reference(node: Node) -> None:
    pair = await with_stream(node, "s1")
    h = handle(pair, "s1")
    written, offset = h.chunks_written, h.log.next_offset
    pair.send(*(c.StoreOffset(ref, "s1", i) for i in range(3) for ref in ("a", "b")))
    assert await pair.request(c.QueryOffset(pair.next_corr(), "b", "s1")) == c.QueryOffsetResponse(
        pair.corr, Code.OK, 2)
    assert (h.chunks_written - written, h.log.next_offset - offset) == (1, 2)  # one chunk, an entry each
