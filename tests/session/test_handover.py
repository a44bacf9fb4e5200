"""Connection locality in memory (runtime/session/handover.py and the connection's `_hand_over` /
`adopt`): two brokers stand for two workers, a fake `Handover` port carries the state from one to the
other, and pamqp speaks for the client. The real transfer (descriptors, the supervisor) is tested with
processes in tests/workers/test_locality.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from hutch.core.confirms import ConfirmLedger
from hutch.runtime.broker.node import Node
from hutch.runtime.session.connection import AMQPConnection, State
from hutch.runtime.session.handover import ChannelState, HandoverState

from .memory import ManualLoopClock, MemoryTransport, SessionPair, make_node


class FakeHandover:
    """Queues named `there-*` live in worker 1; `move` keeps what it was given."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.moved: list[tuple[bytes, int]] = []

    def home_of(self, queue: Any) -> int | None:
        return 1 if queue.name.startswith("there-") else None

    def move(self, sock: Any, state: bytes, to: int) -> bool:
        if self.accept:
            self.moved.append((state, to))
        return self.accept


class BufferedTransport(MemoryTransport):
    def get_write_buffer_size(self) -> int:
        return 0


async def armed(node: Node, handover: FakeHandover) -> SessionPair:
    pair = SessionPair(node)
    pair.transport = BufferedTransport({"socket": object()})
    pair.conn = AMQPConnection(node, pair.clock, None, handover)
    pair.conn.connection_made(pair.transport, ("127.0.0.1", 50000), ("127.0.0.1", 5672))
    await pair.open()
    pair.open_channel(1)
    return pair


def adopt(node: Node, state: bytes) -> SessionPair:
    """The other worker's side: a connection adopted from `state`, as a SessionPair."""
    pair = SessionPair.__new__(SessionPair)
    pair.node, pair.clock, pair.transport, pair._read = node, ManualLoopClock(), BufferedTransport(), 0
    pair.conn = AMQPConnection(node, pair.clock)
    pair.conn.adopt(pair.transport, state)
    return pair


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[Node, Node]:
    here, there = make_node(str(tmp_path / "a")), make_node(str(tmp_path / "b"))
    for node in (here, there):
        vhost = node.vhosts["/"]
        for name in ("there-q", "here-q"):
            node.declare_queue(vhost, name, False, False, False, {}, None)
    return here, there


@pytest.mark.asyncio
async def test_a_burst_moves_unhandled_and_the_other_side_handles_it_in_order(nodes: tuple[Node, Node]) -> None:
    here, there = nodes
    handover = FakeHandover()
    pair = await armed(here, handover)
    pair.send(1, commands.Basic.Qos(prefetch_count=9), commands.Confirm.Select())
    assert [type(f) for _, f in pair.received()] == [commands.Basic.QosOk, commands.Confirm.SelectOk]
    burst = b"".join(pair.publish(1, "there-q", b"%d" % i) for i in range(50))
    pair.feed(burst[:len(burst) // 2 + 3])  # a partial frame left in the reader goes along too
    assert len(handover.moved) == 1 and handover.moved[0][1] == 1
    assert pair.conn.handed_over and pair.conn.state == State.CLOSED and pair.conn not in here.connections
    assert pair.transport.closed and pair.received() == []  # no close frame: the socket lives on there
    assert here.vhosts["/"].queues["there-q"].message_count == 0
    other = adopt(there, handover.moved[0][0])
    other.feed(burst[len(burst) // 2 + 3:])
    queue = there.vhosts["/"].queues["there-q"]
    assert queue.message_count == 50
    acks = [f for _, f in other.received() if isinstance(f, commands.Basic.Ack)]
    assert acks and acks[-1].delivery_tag == 50  # numbered from 1 there, as the client counts
    ch = other.conn.channels[1]
    assert ch.prefetch_count == 9 and ch.confirm and other.conn.user_name == "guest"
    assert other.conn in there.connections and other.conn.counts_for_limits
    got = [queue.get(None, True) for _ in range(50)]
    assert [e.msg.body for e in got if e is not None] == [b"%d" % i for i in range(50)]


@pytest.mark.asyncio
@pytest.mark.parametrize(("exchange", "kind", "keys", "moves"), [
    ("x-direct", "direct", ["there-q"], True),  # every queue it reaches is in worker 1
    ("x-topic", "topic", ["there-q"], True),
    ("x-fan", "fanout", ["there-q", "here-q"], False),  # queues in both workers: no hop saved
    ("x-headers", "headers", ["there-q"], False),  # its route needs the headers, not read yet
    ("x-empty", "direct", [], False),  # routed nowhere
])
async def test_a_first_publish_through_an_exchange_moves_when_its_route_is_one_other_worker(
        nodes: tuple[Node, Node], exchange: str, kind: str, keys: list[str], moves: bool) -> None:
    here, there = nodes
    for node in (here, there):
        vhost = node.vhosts["/"]
        x = node.declare_exchange(vhost, exchange, kind, False, False, False, {})
        for queue in keys:
            node.bind(vhost, x, ("queue", queue), "k", {"x-match": "any", "k": 1} if kind == "headers" else {})
    handover = FakeHandover()
    pair = await armed(here, handover)
    message = pair.publish(1, "k", b"routed", exchange=exchange,
                           properties=commands.Basic.Properties(headers={"k": 1}))
    pair.feed(message)
    assert [to for _state, to in handover.moved] == ([1] if moves else [])
    assert not pair.conn.locality_armed  # judged once, either way
    if moves:
        adopt(there, handover.moved[0][0])
        assert there.vhosts["/"].queues["there-q"].message_count == 1  # the triggering publish, handled there
    else:
        assert here.vhosts["/"].queues["there-q"].message_count == (1 if keys else 0)


@pytest.mark.asyncio
async def test_a_connection_moves_at_most_once_and_not_for_a_local_queue(nodes: tuple[Node, Node]) -> None:
    here, _there = nodes
    handover = FakeHandover()
    pair = await armed(here, handover)
    pair.feed(pair.publish(1, "here-q", b"local"))  # the first publish judges: here, so it stays
    pair.feed(pair.publish(1, "there-q", b"x"))
    assert handover.moved == [] and not pair.conn.locality_armed
    assert here.vhosts["/"].queues["there-q"].message_count == 1


@pytest.mark.asyncio
async def test_a_first_publish_handled_in_a_later_turn_moves(nodes: tuple[Node, Node]) -> None:
    """Under load a connection's frames wait their turn (the loop scheduler, reading held "turn") and
    its first publish is handled in a later turn, the hold still on until the turn ends: it moves all
    the same, with the frames it had not handled. A connection still waiting for its turn is busy."""
    here, there = nodes
    handover = FakeHandover()
    pair = await armed(here, handover)
    pair.conn._wait_turn()  # as a saturated loop does: this connection's next step waits its turn
    assert pair.conn.state_is_busy()  # (an island's move would wait for it)
    burst = b"".join(pair.publish(1, "there-q", b"%d" % i) for i in range(5))
    pair.feed(burst)  # buffered while it waits; its turn comes (the manual clock's call_soon) and moves it
    assert [to for _state, to in handover.moved] == [1] and pair.conn.handed_over
    adopt(there, handover.moved[0][0])
    assert there.vhosts["/"].queues["there-q"].message_count == 5
    assert here.vhosts["/"].queues["there-q"].message_count == 0


@pytest.mark.parametrize("busy", ["consumer", "unconfirmed", "tx", "exclusive", "content", "closing", "alarm"])
@pytest.mark.asyncio
async def test_a_connection_that_is_not_quiet_stays(nodes: tuple[Node, Node], busy: str) -> None:
    here, _there = nodes
    handover = FakeHandover()
    pair = await armed(here, handover)
    pair.open_channel(2)
    if busy == "consumer":
        pair.send(2, commands.Basic.Consume(queue="here-q"))
    elif busy == "unconfirmed":
        pair.send(2, commands.Confirm.Select())
        pair.received()
        pair.conn.channels[2].confirms.insert(1, ["a queue"])  # a publish its queue has not settled
    elif busy == "tx":
        pair.send(2, commands.Tx.Select())
    elif busy == "exclusive":
        pair.send(2, commands.Queue.Declare(queue="mine", exclusive=True))
    elif busy == "content":
        pair.send(2, commands.Basic.Publish(exchange="", routing_key="here-q"),
                  pheader.ContentHeader(0, 10, commands.Basic.Properties()))  # its body not sent yet
    elif busy == "closing":
        pair.send(2, commands.Basic.Consume(queue="no-such-queue"))  # 404: channel 2 closing, no close-ok yet
    elif busy == "alarm":
        here.alarms.add("memory")  # connection.blocked's state would have to travel
    pair.received()
    pair.feed(pair.publish(1, "there-q", b"stays"))
    assert handover.moved == [] and pair.conn.state == State.OPEN
    if busy == "alarm":
        assert pair.conn.alarm_blocked  # blocked here, as any publisher under an alarm
        here.alarms.clear()
        pair.conn.alarm_cleared()
    assert here.vhosts["/"].queues["there-q"].message_count == 1  # handled here, as before


@pytest.mark.asyncio
async def test_an_adopted_connection_keeps_the_negotiated_heartbeat(nodes: tuple[Node, Node]) -> None:
    here, there = nodes
    handover = FakeHandover()
    pair = SessionPair(here)
    pair.transport = BufferedTransport({"socket": object()})
    pair.conn = AMQPConnection(here, pair.clock, None, handover)
    pair.conn.connection_made(pair.transport, ("127.0.0.1", 50000), ("127.0.0.1", 5672))
    await pair.open(heartbeat=10)
    pair.open_channel(1)
    pair.feed(pair.publish(1, "there-q", b"x"))
    other = adopt(there, handover.moved[0][0])
    assert other.conn.heartbeat_s == 10
    other.clock.advance(6)  # half the interval: the server's heartbeat goes out
    assert any(isinstance(f, pheartbeat.Heartbeat) for _, f in other.received())
    other.clock.advance(25)  # and a client silent for two intervals is dropped, as before the move
    assert other.transport.closed


@pytest.mark.asyncio
async def test_a_refused_move_keeps_the_connection_working(nodes: tuple[Node, Node]) -> None:
    here, _there = nodes
    handover = FakeHandover(accept=False)
    pair = await armed(here, handover)
    pair.send(1, commands.Confirm.Select())
    pair.feed(pair.publish(1, "there-q", b"a") + pair.publish(1, "there-q", b"b"))
    acks = [f for _, f in pair.received() if isinstance(f, commands.Basic.Ack)]
    assert acks[-1].delivery_tag == 2 and here.vhosts["/"].queues["there-q"].message_count == 2


@pytest.mark.asyncio
async def test_an_adopted_connection_whose_state_is_bad_or_whose_vhost_is_gone_is_closed_320(
        nodes: tuple[Node, Node]) -> None:
    _here, there = nodes
    bad = adopt(there, b"\x93not a state")
    closes = [f for _, f in bad.received() if isinstance(f, commands.Connection.Close)]
    assert closes and closes[0].reply_code == 320
    state = HandoverState("guest", "gone", 131072, 2047, 60, {}, "PLAIN", ("127.0.0.1", 1), "n", 0, 0, 0, False,
                          [ChannelState(1)], b"")
    gone = adopt(there, state.encode())
    closes = [f for _, f in gone.received() if isinstance(f, commands.Connection.Close)]
    assert closes and closes[0].reply_code == 320


_names = st.text(max_size=20)
_ints = st.integers(min_value=0, max_value=2**31)
_channels = st.lists(st.builds(ChannelState, st.integers(1, 65535), st.integers(0, 65535), st.integers(0, 65535),
                               st.booleans(), _ints, st.integers(1, 2**40)),
                     max_size=5, unique_by=lambda c: c.number)
_states = st.builds(
    HandoverState, _names, _names, _ints, _ints, _ints,
    st.dictionaries(st.text(min_size=1, max_size=10), st.one_of(st.text(max_size=10), st.integers(-5, 5),
                                                               st.booleans()), max_size=4),
    _names, st.tuples(_names, st.integers(0, 65535)), _names, _ints, _ints, _ints, st.booleans(), _channels,
    st.binary(max_size=300), st.tuples(_names, st.integers(0, 65535)),
    # a relayed TLS connection's identity: (version, cipher) and a certificate only with TLS
    st.one_of(st.none(), st.tuples(_names, _names)), st.none())
_tls_states = st.builds(lambda s, tls, cert: HandoverState(**{**s.__dict__, "tls": tls, "peer_cert": cert}),
                        _states, st.tuples(_names, _names), st.one_of(st.none(), st.binary(min_size=1, max_size=50)))


@settings(max_examples=150, deadline=None)
@given(_states)
def test_a_state_round_trips(state: HandoverState) -> None:
    assert HandoverState.decode(state.encode()) == state


@given(_tls_states)
def test_a_tls_state_round_trips_with_its_identity(state: HandoverState) -> None:
    assert HandoverState.decode(state.encode()) == state


def test_a_client_certificate_without_tls_is_malformed() -> None:
    state = HandoverState("guest", "/", 131072, 2047, 60, {}, "EXTERNAL", ("127.0.0.1", 1), "n", 0, 0, 0, False,
                          peer_cert=b"der")
    with pytest.raises(ValueError, match="client certificate"):
        HandoverState.decode(state.encode())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_a_state_or_a_value_error(data: bytes) -> None:
    try:
        HandoverState.decode(data)
    except ValueError:
        pass


def test_a_ledger_continues_after_the_publishes_answered_elsewhere() -> None:
    ledger = ConfirmLedger()
    ledger.continue_after(41)
    assert ledger.last_seq == 41 and ledger.unanswered == 0
    ledger.insert(42, ())
    assert ledger.take_answers() == [(True, 42, False)]
    with pytest.raises(ValueError):
        ledger.insert(41, ())
