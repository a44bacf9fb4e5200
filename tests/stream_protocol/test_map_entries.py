"""The entries of a map or array in a client's command are bounded (`wire.MAX_MAP_ENTRIES`), checked at
the count before any entry is read: the codec (pure) and the connection's answer (in memory: a request
answered by a plain response is refused with PRECONDITION_FAILED and the connection goes on; anything
else closes it). The stall it removed is measured against a real node in test_security_stream.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch.runtime.broker.node import Node
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.errors import TooManyEntries
from hutch.streamproto.wire import MAX_MAP_ENTRIES, OffsetSpec
from session.memory import make_node

from .memory import StreamPair, make_hub

FIRST = OffsetSpec(OffsetType.FIRST)


def properties(count: int) -> dict[str, str]:
    return {f"filter.{i}": "v" for i in range(count)}


def body(cmd: c.Command) -> bytes:
    return c.encode(cmd)[4:]  # decode takes a frame's content, after its size


def test_the_most_entries_decode_and_one_more_is_refused_at_the_count() -> None:
    at_most = c.Subscribe(7, 1, "s", FIRST, 10, properties(MAX_MAP_ENTRIES))
    assert c.decode(body(at_most)) == at_most
    with pytest.raises(TooManyEntries) as refused:
        c.decode(body(c.Subscribe(7, 1, "s", FIRST, 10, properties(MAX_MAP_ENTRIES + 1))))
    assert (refused.value.key, refused.value.correlation_id, refused.value.code) == (
        Key.SUBSCRIBE, 7, Code.UNKNOWN_FRAME)


@pytest.mark.parametrize("cmd", [
    c.PeerProperties(3, properties(MAX_MAP_ENTRIES + 1)),
    c.Metadata(3, [f"s{i}" for i in range(MAX_MAP_ENTRIES + 1)]),
    c.Create(3, "s", properties(MAX_MAP_ENTRIES + 1)),
    c.CreateSuperStream(3, "x", [f"p{i}" for i in range(MAX_MAP_ENTRIES + 1)], ["k"], {}),
    c.ExchangeCommandVersions(3, [(1, 1, 1)] * (MAX_MAP_ENTRIES + 1)),
    c.ResolveOffsetSpec(3, "s", FIRST, properties(MAX_MAP_ENTRIES + 1)),
])
def test_every_map_and_array_a_client_sends_is_bounded(cmd: c.Command) -> None:
    with pytest.raises(TooManyEntries) as refused:
        c.decode(body(cmd))
    assert refused.value.correlation_id == 3


def test_a_huge_count_is_refused_before_anything_is_read() -> None:
    frame = bytearray(body(c.Subscribe(7, 1, "s", FIRST, 10, {})))
    frame += (2**31 - 1).to_bytes(4, "big")  # a count of 2 billion entries, none there
    with pytest.raises(TooManyEntries):
        c.decode(bytes(frame))


def test_what_the_server_sends_is_not_bounded() -> None:
    confirm = c.PublishConfirm(1, list(range(5 * MAX_MAP_ENTRIES)))
    assert c.decode(body(confirm)) == confirm


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


@pytest.mark.asyncio
async def test_a_subscribe_of_too_many_properties_is_refused_and_the_connection_goes_on(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("s")
    pair.send(c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, properties(MAX_MAP_ENTRIES + 1)))
    assert await pair.expect(1) == [c.Response(Key.SUBSCRIBE, pair.corr, Code.PRECONDITION_FAILED)]
    assert await pair.request(c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, properties(3))) == c.Response(
        Key.SUBSCRIBE, pair.corr, Code.OK)
    assert not pair.transport.closed


@pytest.mark.asyncio
async def test_a_metadata_of_too_many_streams_closes_the_connection(node: Node) -> None:
    """Its answer is not a plain response: as a frame that does not parse, the connection is closed."""
    pair = StreamPair(make_hub(node))
    await pair.open()
    pair.send(c.Metadata(pair.next_corr(), [f"s{i}" for i in range(MAX_MAP_ENTRIES + 1)]))
    (close,) = await pair.expect(1)
    assert isinstance(close, c.Close) and close.closing_code == Code.UNKNOWN_FRAME


@pytest.mark.asyncio
async def test_peer_properties_of_too_many_entries_before_open_drop_the_socket(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    pair.send(c.PeerProperties(pair.next_corr(), properties(MAX_MAP_ENTRIES + 1)))
    await pair.until(lambda: pair.transport.closed)
