"""A classic queue's contents moving to a fresh queue (queues/classic/transfer.py): pure, on memfs.

The round trip (export, encode, decode, import) must keep what a client can observe: the ready messages
in their order with their flags and counts, the unacked ones settleable (ack, requeue to their place),
the counters, the sequence numbering; a durable queue's persistent messages survive a crash right after
the import once synced. Hostile states are refused with a ValueError, and nothing else."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_classic_queue import FakeChannel
from test_classic_queue_paging import Env, msg

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, QueueEntry
from hutch.queues.classic.queue import ClassicQueue
from hutch.queues.classic.transfer import (
    MAX_STATE_BYTES,
    MAX_TRANSFER_BYTES,
    STAT_FIELDS,
    QueueTransfer,
    export_queue,
    import_queue,
    not_movable,
)


def moved(q: ClassicQueue, unacked: list[QueueEntry], into: ClassicQueue) -> dict[int, QueueEntry]:
    return import_queue(into, QueueTransfer.decode(export_queue(q, unacked).encode()))


def ready_view(q: ClassicQueue) -> list[tuple[int, bytes, bool, int, int, int]]:
    return [(e.seq, e.msg.body, e.redelivered, e.delivery_count, e.expires_at_ms, e.returns) for e in q._ready]


OPS = st.lists(st.one_of(st.tuples(st.just("publish"), st.booleans()), st.tuples(st.just("get"), st.booleans()),
                         st.tuples(st.just("ack"), st.integers(0, 50)),
                         st.tuples(st.just("requeue"), st.integers(0, 50))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_a_queue_moves_whole(ops: list[tuple[str, object]]) -> None:
    """Any history of publishes, gets, acks and requeues: the moved queue holds the same ready messages
    in the same order, the same unacked ones (which settle there as they would have here), the same
    counters, and numbers its next publish after the last."""
    q = ClassicQueue("/", "q", False, None, False, {"x-delivery-limit": 1000})
    ch = FakeChannel()
    held: list[QueueEntry] = []
    n = 0
    for op, arg in ops:
        if op == "publish":
            q.publish(msg(n, persistent=bool(arg)))
            n += 1
        elif op == "get":
            e = q.get(ch, no_ack=bool(arg))
            if e is not None and not arg:
                held.append(e)
        elif held:
            picked = held.pop(int(arg) % len(held))  # type: ignore[call-overload]
            (q.ack if op == "ack" else q.requeue)([picked])
    fresh = ClassicQueue("/", "q", False, None, False, {"x-delivery-limit": 1000})
    adopted = moved(q, held, fresh)
    assert ready_view(fresh) == ready_view(q)
    assert sorted(adopted) == sorted(e.seq for e in held)
    assert fresh.unacked_count == q.unacked_count == len(held)
    assert {f: getattr(fresh, f) for f in STAT_FIELDS} == {f: getattr(q, f) for f in STAT_FIELDS}
    # settle the same way on both sides: half acked, half requeued; the queues stay equal
    for i, e in enumerate(sorted(held, key=lambda e: e.seq)):
        (q.ack if i % 2 else q.requeue)([e])
        (fresh.ack if i % 2 else fresh.requeue)([adopted[e.seq]])
    assert ready_view(fresh) == ready_view(q) and fresh.unacked_count == q.unacked_count == 0
    q.publish(msg(n))
    fresh.publish(msg(n))
    assert ready_view(fresh) == ready_view(q)


def test_a_consumer_attached_after_the_move_gets_the_rest_in_order() -> None:
    q = ClassicQueue("/", "q", False, None, False, {})
    for i in range(10):
        q.publish(msg(i))
    ch = FakeChannel()
    c = Consumer("c", ch, q, no_ack=False, exclusive=False, prefetch=4)
    q.add_consumer(c)
    held = [e for _c, e in ch.delivered]
    q.remove_consumer(c)
    fresh = ClassicQueue("/", "q", False, None, False, {})
    adopted = moved(q, held, fresh)
    ch2 = FakeChannel()
    c2 = Consumer("c", ch2, fresh, no_ack=False, exclusive=False, prefetch=4)
    c2.unacked = len(adopted)  # the adopted channel's consumer holds what it held before
    fresh.add_consumer(c2)
    assert ch2.delivered == []  # still at its prefetch
    c2.unacked = 0
    fresh.ack(adopted.values())
    fresh.deliver_pending()
    assert [int(e.msg.body) for _c, e in ch2.delivered] == [4, 5, 6, 7]


def test_a_priority_queue_keeps_its_order() -> None:
    args = {"x-max-priority": 5}
    q = ClassicQueue("/", "p", False, None, False, args)
    for i, prio in enumerate([1, 5, 3, 5, 0, 1]):
        q.publish(Message("", "p", BasicProperties(priority=prio), str(i).encode()))
    fresh = ClassicQueue("/", "p", False, None, False, args)
    moved(q, [], fresh)
    ch = FakeChannel()
    got = [fresh.get(ch, no_ack=True) for _ in range(6)]
    assert [int(e.msg.body) for e in got if e] == [1, 3, 2, 0, 5, 4]


def test_a_durable_queue_moved_survives_a_crash_once_synced() -> None:
    """The importing side writes the persistent messages (ready and unacked) to its own index; once the
    sync is done (the commit point waits for it), a power cut loses none of them, and the unacked ones
    come back redelivered. Transient messages are not written, as for any publish."""
    src = Env(durable=True, ram_limit=1000)
    for i in range(20):
        src.q.publish(msg(i, persistent=i % 4 != 0))
    ch = FakeChannel()
    held = [e for e in (src.q.get(ch, no_ack=False) for _ in range(5)) if e is not None]
    dst = Env(durable=True, ram_limit=1000)
    moved(src.q, held, dst.q)
    dst.sink.commit()
    q = dst.restart(crash=True)
    got = [q.get(ch, no_ack=True) for _ in range(20)]
    bodies = [int(e.msg.body) for e in got if e is not None]
    assert bodies == [i for i in range(20) if i % 4 != 0]
    # 1, 2, 3 were held unacked (0 and 4 too, transient: gone with the crash); the rest never delivered
    assert [e.redelivered for e in got if e is not None] == [True] * 3 + [False] * 12


def test_what_cannot_move_says_why() -> None:
    env = Env(durable=True, ram_limit=5)
    for i in range(10):
        env.q.publish(msg(i))
    assert not_movable(env.q) == "paged to disk"
    with pytest.raises(ValueError, match="paged"):
        export_queue(env.q, [])
    assert not_movable(ClassicQueue("/", "x", False, object(), False, {})) == "exclusive"
    gone = ClassicQueue("/", "g", False, None, False, {})
    gone.delete()
    assert not_movable(gone) == "deleted"
    sac = ClassicQueue("/", "s", False, None, False, {"x-single-active-consumer": True})
    assert not_movable(sac) == "single active consumer"
    q = ClassicQueue("/", "q", False, None, False, {})
    q.publish(msg(1))
    e = q.get(FakeChannel(), no_ack=False)
    assert e is not None
    with pytest.raises(ValueError, match="1 counted"):
        export_queue(q, [])  # an unacked entry held elsewhere: not the whole island
    big = ClassicQueue("/", "big", False, None, False, {})
    for _ in range(3):
        big.publish(Message("", "big", BasicProperties(), b"x" * (MAX_TRANSFER_BYTES // 2)))
    held_big = big.get(FakeChannel(), no_ack=False)
    assert held_big is not None and not_movable(big) is None  # the ready bytes alone are within the bound
    with pytest.raises(ValueError, match="too many bytes"):
        export_queue(big, [held_big])  # with the unacked ones they are not
    fresh = ClassicQueue("/", "q", False, None, False, {})
    fresh.publish(msg(2))
    with pytest.raises(ValueError, match="not fresh"):
        import_queue(fresh, export_queue(q, [e]))


def valid_state() -> list[object]:
    q = ClassicQueue("/", "q", False, None, False, {})
    for i in range(3):
        q.publish(msg(i))
    value = msgpack.unpackb(export_queue(q, []).encode(), raw=False)
    assert isinstance(value, list)
    return value


@pytest.mark.parametrize("change", [
    lambda v: v.__setitem__(0, 99),  # version
    lambda v: v.pop(),  # a field short
    lambda v: v.__setitem__(1, 5),  # vhost not a string
    lambda v: v.__setitem__(3, -1),  # negative counter
    lambda v: v.__setitem__(4, 10**6),  # delivered past the counter
    lambda v: v.__setitem__(5, 1),  # flag not a bool
    lambda v: v.__setitem__(8, [0] * 3),  # statistics short
    lambda v: v.__setitem__(9, v[9][:-1]),  # an entry cut
    lambda v: v.__setitem__(9, v[9][:12] + v[9][:12]),  # a seq twice
    lambda v: v.__setitem__(9, v[9][12:24] + v[9][:12]),  # out of order
    lambda v: v[9].__setitem__(0, 10**6),  # seq past the counter
    lambda v: v[9].__setitem__(0, 0),  # seq 0
    lambda v: v[9].__setitem__(3, b"x"),  # properties too short
    lambda v: v[9].__setitem__(3, b"\x80\x00\x05ab"),  # a content-type cut short
    lambda v: v[9].__setitem__(4, "text"),  # body not bytes
    lambda v: v.__setitem__(10, v[9][:12]),  # the same seq ready and unacked
])
def test_a_malformed_state_is_refused(change: object) -> None:
    v = valid_state()
    change(v)  # type: ignore[operator]
    with pytest.raises(ValueError):
        QueueTransfer.decode(msgpack.packb(v, use_bin_type=True))


def test_an_oversized_state_is_refused_unread() -> None:
    with pytest.raises(ValueError, match="over"):
        QueueTransfer.decode(b"\x00" * (MAX_STATE_BYTES + 1))


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=200),
                      st.builds(lambda v: msgpack.packb(v, use_bin_type=True),
                                st.lists(st.one_of(st.integers(-2, 2**64 - 1), st.text(max_size=3), st.binary(max_size=3),
                                                   st.booleans(), st.none(), st.lists(st.integers(0, 5), max_size=24)),
                                         max_size=12))))
def test_hostile_bytes_are_a_value_error_or_a_valid_state(data: bytes) -> None:
    try:
        t = QueueTransfer.decode(data)
    except ValueError:
        return
    assert QueueTransfer.decode(t.encode()).encode() == t.encode()
