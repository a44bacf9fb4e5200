"""A map or array in a client's command holds any count its frame holds, as RabbitMQ's `parse_map` reads
it (session 16 refused past 1,024 entries: a drop-in difference), and a large one is decoded in steps
(`commands.decode_steps`, `wire.STEP_ENTRIES` entries each) that the connection spreads over loop turns
(`connection.STEP_BYTES`, `TURN_S`), with a subscribe's filter prepared in steps too
(`Consuming.prepare`, `BloomQuery.prepare`), and so is a remote reader's at the stream's home worker
(home_link.py): the codec (pure, with a Hypothesis property: the stepped decoding is the plain one), the
connection (in memory, on a clock that ticks with every look) and the home's end of the worker link. The stall a
flood of such frames makes on a real node is measured in test_security_stream.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster import messages as cm
from hutch.queues.stream.chunk import DEFAULT_FILTER_SIZE
from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.connection import StreamConnection
from hutch.runtime.stream_session.home_link import StreamReaderLink
from hutch.runtime.turns import scheduler_of
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.errors import UnknownFrame
from hutch.streamproto.wire import STEP_ENTRIES, OffsetSpec
from session.memory import ManualLoopClock, make_node

from .memory import StreamPair, make_hub

FIRST = OffsetSpec(OffsetType.FIRST)


def properties(count: int) -> dict[str, str]:
    return {f"filter.{i}": f"v{i}" for i in range(count)}


def body(cmd: c.Command) -> bytes:
    return c.encode(cmd)[4:]  # decode takes a frame's content, after its size


def stepped(frame: bytes) -> tuple[c.Command, int]:
    """The record `decode_steps` returns, and how many times it yielded."""
    steps = c.decode_steps(frame)
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, yields
        yields += 1


def test_a_subscribe_of_45000_properties_decodes_whole_and_in_steps() -> None:
    cmd = c.Subscribe(7, 1, "s", FIRST, 10, properties(45_000))
    assert c.decode(body(cmd)) == cmd
    assert stepped(body(cmd)) == (cmd, 45_000 // STEP_ENTRIES)


@pytest.mark.parametrize("cmd", [
    c.PeerProperties(3, properties(3000)),
    c.Metadata(3, [f"s{i}" for i in range(3000)]),
    c.Create(3, "s", properties(3000)),
    c.CreateSuperStream(3, "x", [f"p{i}" for i in range(3000)], [f"k{i}" for i in range(3000)], properties(3000)),
    c.ExchangeCommandVersions(3, [(1, 1, 1)] * 3000),
    c.ResolveOffsetSpec(3, "s", FIRST, properties(3000)),
    c.PublishConfirm(1, list(range(3000))),
    c.Publish(1, [c.PublishedEntry(i, b"m") for i in range(3000)]),  # (its own `read`: one step)
])
def test_every_map_and_array_holds_what_its_frame_holds(cmd: c.Command) -> None:
    decoded, yields = stepped(body(cmd))
    assert decoded == c.decode(body(cmd)) == cmd
    assert yields >= 3000 // STEP_ENTRIES - 1 or isinstance(cmd, c.PublishConfirm | c.Publish)


def test_a_huge_count_fails_at_the_frame_end_without_allocating_for_it() -> None:
    frame = bytearray(body(c.Subscribe(7, 1, "s", FIRST, 10, {})))
    frame += (2**31 - 1).to_bytes(4, "big") + b"\x00\x01k\x00\x01v"  # a count of 2 billion, one entry there
    for decode in (c.decode, lambda f: stepped(f)[0]):
        with pytest.raises(UnknownFrame, match="ends inside a field"):
            decode(bytes(frame))


texts = st.text(max_size=6)


@settings(max_examples=60, deadline=None)
@given(props=st.dictionaries(texts, texts, max_size=1500), streams=st.lists(texts, max_size=1500))
def test_the_stepped_decoding_is_the_plain_one(props: dict[str, str], streams: list[str]) -> None:
    for cmd in (c.Subscribe(1, 2, "s", FIRST, 3, props), c.Metadata(4, streams),
                c.CreateSuperStream(5, "x", streams, streams, props)):
        frame = body(cmd)
        assert stepped(frame)[0] == c.decode(frame) == cmd
        with pytest.raises(UnknownFrame):  # and a frame cut short fails the same way in both
            stepped(frame[:-1] if frame[-1:] else frame[:-3])


class TickingClock(ManualLoopClock):
    """Each look at the time moves it on by `tick_s`: a turn's `TURN_S` is spent after a few steps.
    `run_turn` runs the call_soon work scheduled so far (one loop turn)."""

    def __init__(self, now: float, tick_s: float) -> None:
        super().__init__()
        self.now, self.tick_s = now, tick_s

    def time(self) -> float:
        self.now += self.tick_s
        return self.now

    def run_turn(self) -> bool:
        batch, self._soon = self._soon, []
        for callback in batch:
            callback()
        return bool(batch)

    def drive(self, conn: StreamConnection) -> None:
        """Make `conn` run on this clock, and take its steps from this clock's scheduler (runtime/turns.py)."""
        conn.clock = self
        conn.turns = scheduler_of(self)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


@pytest.mark.asyncio
async def test_a_large_subscribe_is_decoded_across_turns_and_what_follows_waits_in_order(node: Node) -> None:
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("s")
    clock = TickingClock(pair.clock.now, 0.004)
    clock.drive(pair.conn)
    big = c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, properties(20 * STEP_ENTRIES))
    after = c.StreamStats(pair.next_corr(), "s")
    pair.conn.receive_data(c.encode(big) + c.encode(after))
    assert pair.received() == [] and not pair.transport.reading  # the rest of its decoding waits, input held
    turns = 1
    while clock.run_turn():
        turns += 1
    assert turns >= 5  # 20 steps, a few a turn
    subscribed, stats = pair.received()
    assert subscribed == c.Response(Key.SUBSCRIBE, big.correlation_id, Code.OK)
    assert isinstance(stats, c.StreamStatsResponse) and stats.correlation_id == after.correlation_id
    assert pair.transport.reading
    sub = pair.conn.consuming.subscriptions[1]
    assert sub.properties == big.properties and len(sub.filter_values) == 20 * STEP_ENTRIES
    assert sub.query is not None and list(sub.query.prepare(DEFAULT_FILTER_SIZE * 8)) == []  # hashed ahead, in steps


@pytest.mark.asyncio
async def test_peer_properties_of_thousands_of_entries_are_taken_before_open(node: Node) -> None:
    """Before open the frame limit is `stream_initial_frame_max`: a map as large as it holds is read."""
    pair = StreamPair(make_hub(node))
    props = properties(200)
    pair.send(c.PeerProperties(pair.next_corr(), props))
    (answer,) = await pair.expect(1)
    assert isinstance(answer, c.PeerPropertiesResponse) and answer.code == Code.OK
    assert pair.conn.client_properties == props


class LinkHost:
    """The worker link as the home's `StreamReaderLink` sees it: records sent are kept."""

    name = "w0"

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, peer: str, record: Any) -> bool:
        self.sent.append(record)
        return True

    def register(self, kind: type[Any], handler: Any) -> None:
        pass

    def connected(self, peer: str) -> bool:
        return True

    async def call(self, peer: str, request: Any, timeout: float = 5.0) -> Any:
        raise AssertionError("not asked here")


@pytest.mark.asyncio
async def test_a_remote_reader_of_45000_filter_values_is_prepared_at_the_home_in_steps(node: Node) -> None:
    """The home of a stream (a node of workers) gets a reader of 45,000 filter values from another
    worker: its filter is hashed for the stream's filter size in steps of `BloomQuery.PREPARE_STEP`
    values across loop turns, within the loop's step budget (runtime/turns.py; before: in one call,
    ~30 ms), nothing is read meanwhile, then the matching chunk is sent."""
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("s")
    pair.send(c.DeclarePublisher(pair.next_corr(), 1, "", "s"), c.Publish(1, [c.PublishedEntry(1, b"m", "a")], 2))
    await pair.expect(2)  # declared, confirmed
    link = StreamReaderLink(pair.hub.catalog)
    host = LinkHost()
    link.start(host)
    values = [f"{i:x}".encode() for i in range(45_000)]  # ("a" among them)
    link._on_open("w1", cm.StreamReadOpen(1, "/", "s", int(OffsetType.FIRST), 0, 10, values, False))
    served = link.served[("w1", 1)]
    assert served.preparing is not None and host.sent == []
    turns = 0
    while not host.sent:
        await asyncio.sleep(0)
        turns += 1
    assert turns > 1 and served.preparing is None  # (each turn's steps bounded: tests/unit/test_turns.py)
    (chunks,) = host.sent
    assert isinstance(chunks, cm.StreamReadChunks) and len(chunks.chunks) == 1
    assert served.query is not None and list(served.query.prepare(DEFAULT_FILTER_SIZE * 8)) == []
