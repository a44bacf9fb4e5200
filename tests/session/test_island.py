"""Compaction of load, the session's half (runtime/session/island.py): which connections belong to an
island and what of them moves, judged on real connections of an in-memory broker (pamqp for the
client), and the state's codec (round trips, hostile states refused)."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from hutch.core.queue_type import Queue, QueueEntry
from hutch.queues.classic.queue import ClassicQueue
from hutch.queues.classic.transfer import QueueTransfer, export_queue, import_queue
from hutch.runtime.broker.node import Node
from hutch.runtime.session.connection import AMQPConnection
from hutch.runtime.session.handover import ChannelState, HandoverState, channel_states
from hutch.runtime.session.island import (
    WAIT_REASONS,
    ChannelIsland,
    ConsumerState,
    IslandConnection,
    IslandScan,
    island_channels,
    island_reason,
    restore_island,
)

from .memory import ManualLoopClock, MemoryTransport, SessionPair, close_node, make_node


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = make_node(str(tmp_path / "a"))
    for name in ("q", "other"):
        n.declare_queue(n.vhosts["/"], name, False, False, False, {}, None)
    return n


async def consuming(node: Node, prefetch: int = 3) -> SessionPair:
    """A connection consuming from `q` with a prefetch, 5 messages published: `prefetch` unacked."""
    pair = SessionPair(node)
    await pair.open()
    pair.open_channel(1)
    pair.send(1, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.Consume(queue="q", consumer_tag="c1"))
    for i in range(5):
        pair.feed(pair.publish(1, "q", b"%d" % i))
    pair.received()
    return pair


@pytest.mark.asyncio
async def test_a_consumer_with_unacked_deliveries_belongs_to_its_queue_island(node: Node) -> None:
    pair = await consuming(node)
    q = node.vhosts["/"].queues["q"]
    assert island_reason(pair.conn, q) is None
    [ch] = island_channels(pair.conn.channels)
    assert ch.number == 1 and [c.tag for c in ch.consumers] == ["c1"] and ch.consumers[0].prefetch == 3
    assert [(tag, consumer) for tag, _seq, consumer in ch.deliveries] == [(1, "c1"), (2, "c1"), (3, "c1")]
    assert [seq for _t, seq, _c in ch.deliveries] == [1, 2, 3] and q.message_count == 2
    # the state as it would travel, with the connection's own
    conn_state = HandoverState("guest", "/", 131072, 2047, 60, {}, "PLAIN", ("127.0.0.1", 1), "n", 0, 0, 0, True,
                               channel_states(pair.conn.channels))
    state = IslandConnection("q", conn_state, [ch])
    assert IslandConnection.decode(state.encode()) == state
    # against another queue, the same connection is not of that island
    assert island_reason(pair.conn, node.vhosts["/"].queues["other"]) == "consumers of another queue"


@pytest.mark.asyncio
async def test_a_basic_get_delivery_and_a_cancelled_consumers_delivery_travel_by_tag(node: Node) -> None:
    pair = await consuming(node, prefetch=1)
    pair.send(1, commands.Basic.Cancel(consumer_tag="c1"))
    pair.send(1, commands.Basic.Get(queue="q"))
    pair.received()
    [ch] = island_channels(pair.conn.channels)
    assert ch.consumers == [] and [(t, c) for t, _s, c in ch.deliveries] == [(1, ""), (2, "")]


@pytest.mark.parametrize(("setup", "reason"), [
    ("tx", "a transaction"),
    ("reply_to", "Direct Reply-To"),
    ("exclusive", "exclusive queues"),
    ("other_consumer", "consumers of another queue"),
    ("alarm", "flow or alarm"),
    ("unconfirmed", "unconfirmed publishes"),
])
@pytest.mark.asyncio
async def test_what_keeps_a_connection_out_of_an_island(node: Node, setup: str, reason: str) -> None:
    pair = await consuming(node)
    pair.open_channel(2)
    if setup == "tx":
        pair.send(2, commands.Tx.Select())
    elif setup == "reply_to":
        pair.send(2, commands.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=True))
    elif setup == "exclusive":
        pair.send(2, commands.Queue.Declare(queue="mine", exclusive=True))
    elif setup == "other_consumer":
        pair.send(2, commands.Basic.Consume(queue="other"))
    elif setup == "alarm":
        node.alarms.add("memory")
    elif setup == "unconfirmed":
        pair.send(2, commands.Confirm.Select())
        pair.conn.channels[2].confirms.insert(1, ["a queue"])  # a publish its queue has not settled
    pair.received()
    assert island_reason(pair.conn, node.vhosts["/"].queues["q"]) == reason
    assert (reason in WAIT_REASONS) == (setup == "unconfirmed")
    node.alarms.clear()


_tags = st.text(min_size=1, max_size=12)
_consumers = st.lists(st.builds(ConsumerState, _tags, st.booleans(), st.booleans(), st.integers(0, 65535),
                                st.integers(-5, 5), st.dictionaries(st.text(min_size=1, max_size=5),
                                                                    st.integers(-3, 3), max_size=2),
                                st.integers(0, 2**40)), max_size=3, unique_by=lambda c: c.tag)


@st.composite
def _islands(draw: st.DrawFn) -> IslandConnection:
    numbers = draw(st.lists(st.integers(1, 65535), min_size=1, max_size=4, unique=True))
    next_tags = {n: draw(st.integers(1, 200)) for n in numbers}
    conn = HandoverState("guest", "/", 131072, 2047, 60, {}, "PLAIN", ("127.0.0.1", 1), "n", 0, 0, 0, False,
                         [ChannelState(n, next_tag=t) for n, t in next_tags.items()])
    channels = []
    for n in draw(st.lists(st.sampled_from(numbers), unique=True)):
        consumers = draw(_consumers)
        tags = sorted(draw(st.sets(st.integers(1, max(1, next_tags[n] - 1)), max_size=10)) - {next_tags[n]})
        who = [c.tag for c in consumers] + [""]
        deliveries = [(t, n * 1000 + t, draw(st.sampled_from(who))) for t in tags if t < next_tags[n]]
        channels.append(ChannelIsland(n, consumers, deliveries))
    return IslandConnection(draw(st.text(max_size=10)), conn, channels)


@settings(max_examples=150, deadline=None)
@given(_islands())
def test_an_island_state_round_trips(state: IslandConnection) -> None:
    assert IslandConnection.decode(state.encode()) == state


def _valid() -> list[object]:
    conn = HandoverState("guest", "/", 131072, 2047, 60, {}, "PLAIN", ("127.0.0.1", 1), "n", 0, 0, 0, False,
                         [ChannelState(1, next_tag=10)])
    state = IslandConnection("q", conn, [ChannelIsland(1, [ConsumerState("c1", False, False, 5)],
                                                       [(1, 11, "c1"), (2, 12, "")])])
    value = msgpack.unpackb(state.encode(), raw=False)
    assert isinstance(value, list)
    return value


@pytest.mark.parametrize("change", [
    lambda v: v.__setitem__(0, 2),  # version
    lambda v: v.__setitem__(2, b"not a connection"),
    lambda v: v[3][0].__setitem__(0, 2),  # a channel the connection does not have
    lambda v: v[3].append(v[3][0]),  # a channel twice
    lambda v: v[3][0][2].__setitem__(0, 10),  # a tag at the channel's next tag
    lambda v: v[3][0][2].__setitem__(3, 1),  # tags not ascending
    lambda v: v[3][0][2].__setitem__(4, 11),  # a message delivered twice
    lambda v: v[3][0][2].__setitem__(2, "c9"),  # a consumer the channel does not have
    lambda v: v[3][0][2].pop(),  # a delivery cut
    lambda v: v[3][0][1].append(v[3][0][1][0]),  # a consumer tag twice
    lambda v: v[3][0][1][0].__setitem__(0, ""),  # an empty consumer tag
    lambda v: v[3][0][1][0].__setitem__(3, 70000),  # prefetch out of range
    lambda v: v[3][0][1][0].__setitem__(5, b"\x00\x00\x00\x09abc"),  # arguments cut
])
def test_a_malformed_island_state_is_refused(change: object) -> None:
    v = _valid()
    change(v)  # type: ignore[operator]
    with pytest.raises(ValueError):
        IslandConnection.decode(msgpack.packb(v, use_bin_type=True))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_an_island_state_or_a_value_error(data: bytes) -> None:
    try:
        IslandConnection.decode(data)
    except ValueError:
        pass


def deliveries(pair: SessionPair) -> list[tuple[int, bytes]]:
    """(delivery tag, body) of each basic.deliver the server sent since the last look."""
    frames = [f for _, f in pair.received()]
    out = []
    for i, f in enumerate(frames):
        if isinstance(f, commands.Basic.Deliver):
            out.append((f.delivery_tag, frames[i + 2].value))
    return out


def confirms(pair: SessionPair) -> list[int]:
    return [f.delivery_tag for _, f in pair.received() if isinstance(f, commands.Basic.Ack)]


@pytest.mark.asyncio
async def test_an_island_moves_mid_flow_between_two_brokers(tmp_path: Path) -> None:
    """The benchmark's shape in memory: a publisher with confirms and a consumer (prefetch 4, acking
    one by one) of one queue, moved together to a fresh copy of the queue on another broker while
    messages are unacked. Nothing lost or duplicated, order kept, delivery tags and confirms continue,
    and a tag delivered before the move is acked after it."""
    here, there = make_node(str(tmp_path / "a")), make_node(str(tmp_path / "b"))
    for n in (here, there):
        n.declare_queue(n.vhosts["/"], "q", False, False, False, {}, None)
    pub, sub = SessionPair(here), SessionPair(here)
    for pair in (pub, sub):
        await pair.open()
        pair.open_channel(1)
    pub.send(1, commands.Confirm.Select())
    sub.send(1, commands.Basic.Qos(prefetch_count=4), commands.Basic.Consume(queue="q", consumer_tag="c1"))
    pub.received(), sub.received()
    pub.feed(b"".join(pub.publish(1, "q", b"%d" % i) for i in range(10)))
    assert confirms(pub)[-1] == 10
    got = deliveries(sub)
    sub.send(1, commands.Basic.Ack(delivery_tag=1))
    got += deliveries(sub)
    assert got == [(t, b"%d" % (t - 1)) for t in range(1, 6)]  # 1 acked, 2..5 unacked
    # the move: what the old worker exports, then forgets
    qa = here.vhosts["/"].queues["q"]
    assert all(island_reason(p.conn, qa) is None for p in (pub, sub))
    held = [u.entry for ch in sub.conn.channels.values() for u in ch.unacked.values()]
    queue_state = export_queue(qa, held).encode()
    states = [IslandConnection("q", p.conn.handover_state(b""), island_channels(p.conn.channels)).encode()
              for p in (pub, sub)]
    for p in (pub, sub):
        p.conn._forget_moved()
    # the new worker builds the queue, then adopts each connection with its consumers and deliveries
    qb = there.vhosts["/"].queues["q"]
    entries = import_queue(qb, QueueTransfer.decode(queue_state))
    pub2, sub2 = (adopt_island(there, qb, s, entries) for s in states)
    assert deliveries(sub2) == []  # its prefetch is still full: 4 unacked, moved with it
    sub2.send(1, commands.Basic.Ack(delivery_tag=3, multiple=True))  # tags delivered before the move
    got += deliveries(sub2)
    pub2.feed(b"".join(pub2.publish(1, "q", b"%d" % i) for i in range(10, 20)))
    acked = confirms(pub2)
    assert acked[-1] == 20 and min(acked) > 10  # the publisher's numbering continues (acks may be multiple)
    for _ in range(20):  # ack everything delivered so far, then take what that lets through
        sub2.send(1, commands.Basic.Ack(delivery_tag=got[-1][0], multiple=True))
        more = deliveries(sub2)
        if not more:
            break
        got += more
    assert [b for _t, b in got] == [b"%d" % i for i in range(20)]  # once each, in order
    assert [t for t, _b in got] == list(range(1, 21))  # tags continue after the move
    assert qb.message_count == 0 and qb.unacked_count == 0 and qb.consumer_count == 1


def adopt_island(node: Node, queue: Queue, data: bytes, entries: dict[int, QueueEntry]) -> SessionPair:
    """The adopting worker's side of one island connection, as a SessionPair (the client's end)."""
    state = IslandConnection.decode(data)
    unread, state.connection.unread = state.connection.unread, b""
    pair = SessionPair.__new__(SessionPair)
    pair.node, pair.clock, pair.transport, pair._read = node, ManualLoopClock(), MemoryTransport(), 0
    pair.conn = AMQPConnection(node, pair.clock)
    pair.conn.adopt(pair.transport, state.connection.encode())
    restore_island(pair.conn, queue, state.channels, entries)
    pair.conn.receive_data(unread)
    return pair


@pytest.mark.asyncio
async def test_a_durable_island_moved_is_in_its_new_brokers_storage(tmp_path: Path) -> None:
    """A durable queue's persistent messages, confirmed where they were published, moved with a
    consumer holding some unacked: once the new broker's group commit has synced the import, a
    restart of that broker finds every message, the unacked ones redelivered."""
    here = make_node(str(tmp_path / "a"), durable=True)
    there = make_node(str(tmp_path / "b"), durable=True)
    nodes = [here, there]
    try:
        pub, sub = SessionPair(here), SessionPair(here)
        for pair in (pub, sub):
            await pair.open()
            pair.open_channel(1)
        for n in (here, there):
            declarer = SessionPair(n)
            await declarer.open()
            declarer.open_channel(1)
            declarer.send(1, commands.Queue.Declare(queue="kept", durable=True))
            declarer.received()
        pub.send(1, commands.Confirm.Select())
        persistent = commands.Basic.Properties(delivery_mode=2)
        pub.feed(b"".join(pub.publish(1, "kept", b"%d" % i, properties=persistent) for i in range(10)))
        await pub.until(lambda: bool(pub.conn.channels[1].confirms is not None
                                     and not pub.conn.channels[1].confirms.unanswered))
        sub.send(1, commands.Basic.Qos(prefetch_count=3), commands.Basic.Consume(queue="kept", consumer_tag="c"))
        assert [t for t, _b in deliveries(sub)] == [1, 2, 3]
        qa = here.vhosts["/"].queues["kept"]
        held = [u.entry for u in sub.conn.channels[1].unacked.values()]
        queue_state = export_queue(qa, held).encode()
        states = [IslandConnection("kept", p.conn.handover_state(b""), island_channels(p.conn.channels)).encode()
                  for p in (pub, sub)]
        for p in (pub, sub):
            p.conn._forget_moved()
        qb = there.vhosts["/"].queues["kept"]
        entries = import_queue(qb, QueueTransfer.decode(queue_state))
        for s in states:
            adopt_island(there, qb, s, entries)
        persistence = there.persistence
        assert persistence is not None
        persistence.sink.sync_now()
        await sub.until(lambda: persistence.synced_seq >= persistence.last_enqueued)
        await close_node(there)
        nodes.remove(there)
        again = make_node(str(tmp_path / "b"), durable=True)
        nodes.append(again)
        q = again.vhosts["/"].queues["kept"]
        got = [q.get(None, True) for _ in range(10)]
        assert [e.msg.body for e in got if e is not None] == [b"%d" % i for i in range(10)]
        assert [e.redelivered for e in got if e is not None] == [True] * 3 + [False] * 7
    finally:
        for n in nodes:
            await close_node(n)


@pytest.mark.asyncio
async def test_a_scan_finds_each_queues_island_and_whether_it_can_move(node: Node) -> None:
    """q's publisher and consumer use only q: an island of 2, movable, its rate the messages published
    and delivered per second between two scans. A connection consuming from both queues belongs to
    neither, and q is then not movable (one of its consumers would stay behind); a queue no connection
    uses alone is not movable (nothing to gain)."""
    q, other = node.vhosts["/"].queues["q"], node.vhosts["/"].queues["other"]
    pub, sub = SessionPair(node), await consuming(node, prefetch=100)
    await pub.open()
    pub.open_channel(1)
    pub.feed(pub.publish(1, "q", b"first"))  # it publishes to q
    scan = IslandScan(worker=1)
    islands, members = scan.scan(0.0, node.connections, [q, other])
    assert [(i.name, i.worker, i.movable) for i in islands] == [("//q", 1, True), ("//other", 1, False)]
    assert {id(c) for c in members["//q"]} == {id(pub.conn), id(sub.conn)} and members["//other"] == []
    pub.feed(b"".join(pub.publish(1, "q", b"%d" % i) for i in range(10)))
    islands, _members = scan.scan(2.0, node.connections, [q, other])
    assert islands[0].msgs_per_s == pytest.approx(10.0)  # 10 published and 10 delivered in 2 s
    mixed = SessionPair(node)
    await mixed.open()
    mixed.open_channel(1)
    mixed.send(1, commands.Basic.Consume(queue="q"), commands.Basic.Consume(queue="other"))
    islands, members = scan.scan(3.0, node.connections, [q, other])
    assert not islands[0].movable and id(mixed.conn) not in {id(c) for c in members["//q"]}


@pytest.mark.asyncio
async def test_a_restore_that_does_not_fit_the_adopted_connection_attaches_nothing(node: Node) -> None:
    """A channel the connection was not adopted with, or a delivery whose message the moved queue does
    not hold: ValueError before any consumer is attached or delivery held."""
    q = node.vhosts["/"].queues["q"]
    conn_state = HandoverState("guest", "/", 131072, 2047, 0, {}, "PLAIN", ("127.0.0.1", 1), "n", 0, 0, 0, False,
                               [ChannelState(1, next_tag=5)])
    pair = adopt_island(node, q, IslandConnection("q", conn_state, []).encode(), {})
    c1 = ConsumerState("c1", False, False, 10)
    with pytest.raises(ValueError, match="channel 2 was not adopted"):
        restore_island(pair.conn, q, [ChannelIsland(2, [c1], [])], {})
    with pytest.raises(ValueError, match="message 7 has no entry"):
        restore_island(pair.conn, q, [ChannelIsland(1, [c1], [(1, 7, "c1")])], {})
    assert pair.conn.channels[1].consumers == {} and pair.conn.channels[1].unacked == {} and q.consumer_count == 0


def move_island(pairs: list[SessionPair], src: Node, dst: Node) -> list[SessionPair]:
    """Move queue q and the connections of `pairs` from broker `src` to a fresh q on broker `dst`, as the
    two workers would (export, forget, import, adopt, the bytes read and not handled going along);
    `src`'s copy is dropped, as the record naming the new home drops it."""
    qa = src.vhosts["/"].queues["q"]
    held = [u.entry for p in pairs for ch in p.conn.channels.values() for u in ch.unacked.values()]
    queue_state = export_queue(qa, held).encode()
    unread = [bytes(memoryview(p.conn.reader._buf)[p.conn.reader._pos:]) for p in pairs]
    states = [IslandConnection("q", p.conn.handover_state(u), island_channels(p.conn.channels)).encode()
              for p, u in zip(pairs, unread, strict=True)]
    for p in pairs:
        p.conn._forget_moved()
    src.delete_queue(src.vhosts["/"], qa)
    vhost = dst.vhosts["/"]
    if "q" in vhost.queues:
        dst.delete_queue(vhost, vhost.queues["q"])
    qb = dst.declare_queue(vhost, "q", False, False, False, {}, None)
    assert isinstance(qb, ClassicQueue)
    entries = import_queue(qb, QueueTransfer.decode(queue_state))
    return [adopt_island(dst, qb, s, entries) for s in states]


class Observer:
    """What the client sees: deliveries (tags must continue), confirms (must rise), acks it sent."""

    def __init__(self) -> None:
        self.last_tag = self.last_confirm = 0
        self.outstanding: list[tuple[int, bytes]] = []  # delivered, not settled: (tag, body)
        self.first_seen: list[bytes] = []
        self.acked: list[bytes] = []

    def look(self, pub: SessionPair, sub: SessionPair) -> None:
        for tag, body in deliveries(sub):
            assert tag == self.last_tag + 1, (tag, self.last_tag)
            self.last_tag = tag
            self.outstanding.append((tag, body))
            if body not in self.first_seen:
                self.first_seen.append(body)
        for tag in confirms(pub):
            assert tag > self.last_confirm
            self.last_confirm = tag

    def settle(self, sub: SessionPair, k: int, ack: bool) -> None:
        """Ack (or nack with requeue) the first `k` outstanding deliveries at once (multiple)."""
        tag = self.outstanding[k - 1][0]
        if ack:
            sub.send(1, commands.Basic.Ack(delivery_tag=tag, multiple=True))
            self.acked += [b for _t, b in self.outstanding[:k]]
        else:
            sub.send(1, commands.Basic.Nack(delivery_tag=tag, multiple=True, requeue=True))
        self.outstanding = self.outstanding[k:]


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(4))
async def test_an_island_moved_back_and_forth_mid_flow_keeps_every_promise(tmp_path: Path, seed: int) -> None:
    """Seeded runs of confirmed publishes (some cut mid-frame, the rest sent later), deliveries, acks
    and requeues (multiple), and moves of the queue with its publisher and consumer between two brokers
    whenever `island_reason` allows: every message delivered and acked once, none lost; first
    deliveries in publish order; delivery tags and confirms continue across every move."""
    rng = random.Random(seed)
    brokers = [make_node(str(tmp_path / "a")), make_node(str(tmp_path / "b"))]
    brokers[0].declare_queue(brokers[0].vhosts["/"], "q", False, False, False, {}, None)
    pub, sub = SessionPair(brokers[0]), SessionPair(brokers[0])
    for pair in (pub, sub):
        await pair.open()
        pair.open_channel(1)
    pub.send(1, commands.Confirm.Select())
    sub.send(1, commands.Basic.Qos(prefetch_count=rng.randint(1, 8)),
             commands.Basic.Consume(queue="q", consumer_tag="c"))
    pub.received(), sub.received()
    seen = Observer()
    where = sent = moves = 0
    rest = b""  # the end of a cut publish, not sent yet
    for _step in range(80):
        op = rng.random()
        if op < 0.35:
            n = rng.randint(1, 6)
            data = rest + b"".join(pub.publish(1, "q", b"%d" % (sent + i)) for i in range(n))
            sent += n
            cut = len(data) - rng.randint(1, 10) if rng.random() < 0.2 else len(data)
            pub.feed(data[:cut])
            rest = data[cut:]
        elif op < 0.65 and seen.outstanding:
            seen.settle(sub, rng.randint(1, len(seen.outstanding)), ack=rng.random() >= 0.25)
        elif op < 0.85:
            q = brokers[where].vhosts["/"].queues["q"]
            if all(island_reason(p.conn, q) is None for p in (pub, sub)):
                where = 1 - where
                pub, sub = move_island([pub, sub], brokers[1 - where], brokers[where])
                moves += 1
        elif rest:
            pub.feed(rest)
            rest = b""
        seen.look(pub, sub)
    pub.feed(rest)
    for _ in range(200):  # drain: ack everything until nothing more comes
        seen.look(pub, sub)
        if not seen.outstanding:
            break
        seen.settle(sub, len(seen.outstanding), ack=True)
    seen.look(pub, sub)
    assert moves >= 3
    assert seen.last_confirm == sent  # every publish confirmed, numbered across the moves
    assert sorted(seen.acked, key=int) == [b"%d" % i for i in range(sent)]  # each acked once, none lost
    assert seen.first_seen == [b"%d" % i for i in range(sent)]  # first deliveries in publish order


@pytest.mark.asyncio
async def test_an_island_hold_stops_between_messages_and_pauses_a_transport_left_reading(node: Node) -> None:
    """`hold_island` (runtime/session/connection.py), what a move's wait for quiet relies on: a publish
    whose content is not wholly in is not begun (its bytes stay buffered, to travel as unread bytes), a
    publish begun before the hold is read on to its end and then reading is held, the transport is paused
    even when a hold taken before did not pause it (uvloop reads after `connection_made` whatever it was
    told), and `release_island` handles what was held back."""
    pair = SessionPair(node)
    await pair.open()
    pair.open_channel(1)
    q = node.vhosts["/"].queues["q"]
    whole = pair.publish(1, "q", b"first")
    second = pair.publish(1, "q", b"second" * 100)
    third = pair.publish(1, "q", b"third")
    # the second publish begun: its method and header in, its body still arriving
    pair.feed(whole + second[:-40])
    assert q.message_count == 1
    assert island_reason(pair.conn, q) == "unfinished content"
    pair.transport.reading = True
    pair.conn._read_holds.add("turn")  # a hold the transport did not honour (read on regardless)
    pair.conn.hold_island()
    assert pair.transport.reading, "reading goes on while a publish already begun is still arriving"
    # the rest of the second and the whole third arrive in one read: the second completes, the third is
    # not begun, and reading is held
    pair.feed(second[-40:] + third[:-3])
    pair.conn._read_holds.discard("turn")
    assert q.message_count == 2
    assert island_reason(pair.conn, q) is None, "quiet between messages"
    assert pair.conn.reader.buffered == len(third) - 3, "the unfinished third publish stays as unread bytes"
    assert not pair.transport.reading
    # a transport reading despite the hold is paused at the next look
    pair.transport.reading = True
    pair.conn.hold_island()
    assert not pair.transport.reading
    # the rest of the third: whole now, so handled even under the hold
    pair.feed(third[-3:])
    assert q.message_count == 3 and not pair.conn.reader.buffered
    # deliveries are held under the hold: a consumer attached now gets nothing yet
    pair.send(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    assert [type(f) for _c, f in pair.received()] == [commands.Basic.ConsumeOk]
    pair.conn.release_island()
    delivered: list[commands.Basic.Deliver] = []

    def more() -> bool:
        delivered.extend(f for _c, f in pair.received() if isinstance(f, commands.Basic.Deliver))
        return len(delivered) == 3

    await pair.until(more)
    assert q.message_count == 0 and pair.transport.reading
