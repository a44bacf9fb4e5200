"""Stream connection locality in memory (runtime/stream_session/handover.py and the connection's
`_hand_over`/`adopt`): a quiet connection whose first declare publisher or subscribe names a stream homed
in another worker hands over its state with the unread bytes, the triggering command first; the adopting
connection answers it and what follows as the first would have; every connection that is not quiet, or
was judged already, stays; the state's codec round-trips and refuses anything malformed.

The worker link and the supervisor are not here (tests/workers/test_handover_transfer.py has the
transfer, tests/workers/test_locality.py real clients and processes): a fake `StreamHandover` takes the
state, and the stream's home is named by a stub of the reader link's `home`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.runtime.broker.node import Node
from hutch.runtime.session.handover import HandoverState
from hutch.runtime.stream_session.connection import Phase, StreamConnection
from hutch.runtime.stream_session.handover import StreamHandoverState, is_stream_state
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.framer import FrameReader
from hutch.streamproto.wire import OffsetSpec
from session.memory import ManualLoopClock, make_node

from .memory import StreamMemoryTransport, StreamPair, make_hub


class FakeHandover:
    """The `StreamHandover` port: every other worker is up; `move` keeps what it was given."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.moved: list[tuple[Any, bytes, int]] = []

    def worker_of(self, name: str) -> int | None:
        return 1 if name == "test#w1" else None

    def move(self, sock: Any, state: bytes, to: int) -> bool:
        if self.accept:
            self.moved.append((sock, state, to))
        return self.accept


class BufferedTransport(StreamMemoryTransport):
    """An asyncio transport's write-buffer size and socket, as the judge reads them."""

    def __init__(self) -> None:
        super().__init__({"socket": object()})

    def get_write_buffer_size(self) -> int:
        return 0


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def armed_pair(node: Node, handover: FakeHandover, far: set[str]) -> StreamPair:
    """An open connection with locality on; the streams in `far` are homed in worker 1."""
    hub = make_hub(node)
    hub.handover = handover
    hub.reader_link.home = lambda vhost, stream: "test#w1" if stream in far else None  # type: ignore[method-assign]
    pair = StreamPair(hub)
    pair.transport = BufferedTransport()
    pair.conn.transport = pair.transport
    pair.conn.handover, pair.conn.locality_armed = handover, True
    await pair.open()
    return pair


def adopted(node: Node, state: bytes) -> StreamPair:
    """The connection as the worker taking it opens it: `adopt` instead of a handshake."""
    pair = StreamPair.__new__(StreamPair)
    pair.hub = make_hub(node)
    pair.clock = ManualLoopClock()
    pair.transport = BufferedTransport()
    pair.conn = StreamConnection(pair.hub, pair.clock)
    pair._reader, pair._read, pair.corr = FrameReader(0), 0, 100
    pair.conn.adopt(pair.transport, ("127.0.0.1", 5552), state)
    return pair


@pytest.mark.asyncio
async def test_a_quiet_subscriber_moves_with_its_unread_bytes_and_the_adopter_answers_them(node: Node) -> None:
    handover = FakeHandover()
    pair = await armed_pair(node, handover, {"far"})
    await pair.create("far")  # (in memory the stream is this node's too: the adopter reads it)
    assert await pair.request(c.ExchangeCommandVersions(pair.next_corr(), [(Key.DELIVER, 1, 2)]))
    credit = c.encode(c.Credit(1, 5))
    pair.feed(c.encode(c.Subscribe(pair.next_corr(), 1, "far", OffsetSpec(OffsetType.FIRST), 2)) + credit[:5])
    assert len(handover.moved) == 1 and handover.moved[0][2] == 1
    assert pair.conn.handed_over and pair.transport.closed and pair.conn not in pair.hub.connections
    assert pair.received() == []  # nothing answered here
    state = StreamHandoverState.decode(handover.moved[0][1])
    assert (state.user, state.vhost, state.deliver_version) == ("guest", "/", 2)
    assert state.unread.endswith(credit[:5])

    taker = adopted(node, handover.moved[0][1])
    assert taker.conn.phase == Phase.OPENED and taker.conn in taker.hub.connections
    [answer] = await taker.expect(1)
    assert answer == c.Response(Key.SUBSCRIBE, pair.corr, Code.OK)
    taker.feed(credit[5:])  # the rest of the partial frame, as the client sends it on
    assert taker.conn.consuming.subscriptions[1].credit == 7
    assert taker.conn.advertised() == pair.conn.advertised()  # told the same address as before


@pytest.mark.asyncio
async def test_connections_that_are_not_quiet_or_judged_already_stay(node: Node) -> None:
    handover = FakeHandover()
    pair = await armed_pair(node, handover, {"far"})
    await pair.create("near")
    await pair.create("far")
    assert await pair.request(c.DeclarePublisher(pair.next_corr(), 1, "", "near")) == \
        c.Response(Key.DECLARE_PUBLISHER, pair.corr, Code.OK)  # judged here: its stream is this worker's
    assert await pair.request(c.DeclarePublisher(pair.next_corr(), 2, "", "far")) == \
        c.Response(Key.DECLARE_PUBLISHER, pair.corr, Code.OK)
    assert handover.moved == [] and not pair.conn.handed_over

    refused = FakeHandover(accept=False)  # the supervisor could not take it: the connection stays
    pair = await armed_pair(node, refused, {"far"})
    assert await pair.request(c.DeclarePublisher(pair.next_corr(), 1, "", "far")) == \
        c.Response(Key.DECLARE_PUBLISHER, pair.corr, Code.OK)  # (its publishes would take the link)
    assert refused.moved == [] and not pair.conn.handed_over and pair.conn.phase == Phase.OPENED

    busy = await armed_pair(node, handover, {"far"})
    busy.conn.hold_reading("output")  # a client not reading its socket
    busy.conn.receive_data(c.encode(c.DeclarePublisher(busy.next_corr(), 1, "", "far")))
    busy.conn.release_reading("output")
    assert handover.moved == [] and not busy.conn.handed_over


@settings(max_examples=50, deadline=None)
@given(user=st.text(max_size=20), props=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=5),
       numbers=st.lists(st.integers(0, 2**62), min_size=4, max_size=4), deliver=st.sampled_from([1, 2]),
       unread=st.binary(max_size=200),
       tls=st.one_of(st.none(), st.tuples(st.text(max_size=8), st.text(max_size=30))),
       cert=st.one_of(st.none(), st.binary(min_size=1, max_size=60)))
def test_the_state_round_trips(user: str, props: dict[str, str], numbers: list[int], deliver: int,
                               unread: bytes, tls: tuple[str, str] | None, cert: bytes | None) -> None:
    state = StreamHandoverState(user, "/", numbers[0], numbers[1], props, "PLAIN", ("10.0.0.1", 5000), "n",
                                numbers[2], deliver, numbers[3], ("localhost", 5552), unread, ("10.0.0.2", 5551),
                                tls, cert if tls is not None else None)
    data = state.encode()
    assert is_stream_state(data) and StreamHandoverState.decode(data) == state


def test_malformed_states_are_refused_and_an_amqp_state_is_told_apart() -> None:
    amqp = HandoverState("u", "/", 1, 1, 1, {}, "PLAIN", ("h", 1), "n", 1, 1, 1, False).encode()
    assert not is_stream_state(amqp)
    good = StreamHandoverState("u", "/", 1, 0, {}, "PLAIN", ("h", 1), "n", 1, 2, 0, ("h", 2), b"").encode()
    fields = msgpack.unpackb(good, raw=False)
    for i, bad in ((1, 9), (4, -1), (6, {"k": 1}), (8, ["h"]), (11, 3), (13, "h:2"), (14, "text"), (15, None),
                   (16, ["TLSv1.3"]), (17, b"a certificate without TLS")):
        broken = list(fields)
        broken[i] = bad
        with pytest.raises(ValueError):
            StreamHandoverState.decode(msgpack.packb(broken, use_bin_type=True))
    for data in (b"", b"\x00garbage", amqp, good[:-3]):
        with pytest.raises(ValueError):
            StreamHandoverState.decode(data)
