"""The quorum machine's RabbitMQ 4.x behaviours (issue 16, item 3): message priorities (two levels, high
ahead of normal 2 to 1), requeues re-appended so the release cursor moves on, the delivery limit's
default and -1, the dead-letter strategy from a policy, and compatibility of old entries and snapshots."""

from __future__ import annotations

from collections import deque

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.core.policy import effective_settings, make_policy
from hutch.core.queue_settings import QueueSettings
from hutch.queues.quorum import (
    Deliver,
    Meta,
    QueueState,
    QuorumConfig,
    apply,
    decode,
    encode,
    make_checkout,
    make_dequeue,
    make_enqueue,
    make_enqueue_batch,
    make_requeue,
    make_return,
    make_settle,
)
from hutch.queues.quorum.commands import _HEAD, VERSION, Enqueue, EnqueueBatch
from hutch.queues.quorum.config import DEFAULT_DELIVERY_LIMIT
from hutch.queues.quorum.messages import SHIFT


class Q:
    def __init__(self, **config: object) -> None:
        self.st = QueueState(QuorumConfig(**config))  # type: ignore[arg-type]
        self.index = 0

    def do(self, cmd: object) -> list[object]:
        self.index += 1
        return apply(Meta(self.index, 1, 1000), cmd, self.st).effects  # type: ignore[arg-type]

    def pub(self, priority: int = 0) -> int:
        self.do(make_enqueue(None, 0, 10, None, b"", priority))
        return self.index << SHIFT

    def get(self) -> int | None:
        self.index += 1
        reply = apply(Meta(self.index, 1, 1000), make_dequeue("g", True, "n", "ch"), self.st).reply
        return None if reply.message is None else reply.message[0]


def test_high_priority_is_delivered_two_to_one_ahead_of_normal_fifo_within_a_level() -> None:
    q = Q()
    normal = [q.pub(i % 5) for i in range(6)]  # 0-4: normal
    high = [q.pub(5 + i) for i in range(6)]  # above 4: high, whatever the value
    order = [q.get() for _ in range(12)]
    n, h = normal, high
    assert order == [h[0], h[1], n[0], h[2], h[3], n[1], h[4], h[5], n[2], n[3], n[4], n[5]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([0, 3, 4, 5, 9, 255])), max_size=80))
def test_priority_order_follows_a_model_of_rabbit_fifo_q(steps: list[int | None]) -> None:
    """An independent model of rabbit_fifo_q (two FIFOs, a dequeue counter 0..2 that moves on every
    take; at 2 with both waiting the older head goes, else high first): a step is a publish with that
    priority, or (None) a basic.get."""
    q = Q()
    high: deque[int] = deque()
    normal: deque[int] = deque()
    counter = 0
    for step in steps:
        if step is not None:
            (high if step > 4 else normal).append(q.pub(step))
            continue
        got = q.get()
        if not high and not normal:
            assert got is None
            continue
        turn, counter = counter, (0 if counter == 2 else counter + 1)
        take_high = bool(high) and (not normal or turn < 2 or high[0] < normal[0])
        assert got == (high if take_high else normal).popleft()
    assert q.st.ready_count() == len(high) + len(normal)


def test_the_third_take_goes_to_the_older_head_so_a_newer_normal_message_waits() -> None:
    q = Q()
    h = [q.pub(9) for _ in range(4)]
    n0 = q.pub(0)  # newer than every high one: the weighted turn still picks the older head (high)
    assert [q.get() for _ in range(5)] == [h[0], h[1], h[2], h[3], n0]


def test_a_returned_high_priority_message_goes_back_to_the_high_queue() -> None:
    q = Q()
    n = q.pub(0)
    hi = q.pub(7)
    q.do(make_checkout("c", 1))
    assert q.st.checked_out("c") == [hi]
    q.do(make_return("c", [hi]))  # no delivery limit: to the back of its own level
    assert q.st.checked_out("c") == [hi] and q.st.hi_out == {hi}
    q.do(make_settle("c", [hi]))
    assert q.st.checked_out("c") == [n] and not q.st.hi_out


def test_a_message_requeued_many_times_lets_the_release_cursor_advance() -> None:
    q = Q()
    msg = q.pub()
    first = msg >> SHIFT
    q.do(make_checkout("c", 1))
    for _ in range(50):
        (held,) = q.st.checked_out("c")
        q.do(make_requeue("c", held, b"body"))
    (held,) = q.st.checked_out("c")
    assert held >> SHIFT == q.index  # the message lives at the last requeue's entry
    assert q.st.release_cursor() == q.index > first + 49
    q2 = Q()  # a plain return keeps the old entry: the cursor stays pinned (why the runtime re-appends)
    msg = q2.pub()
    q2.do(make_checkout("c", 1))
    for _ in range(50):
        q2.do(make_return("c", q2.st.checked_out("c")))
    assert q2.st.release_cursor() == msg >> SHIFT


def test_requeue_with_a_delivery_limit_goes_to_the_front_and_counts() -> None:
    q = Q(delivery_limit=20)
    a, b = q.pub(), q.pub()
    q.do(make_checkout("c", 1))
    eff = q.do(make_requeue("c", a, b"a"))
    delivered = [m for e in eff if isinstance(e, Deliver) for m in e.messages]
    assert delivered == [(q.index << SHIFT, q.index << SHIFT, True, 1)]  # a again (front), at its new entry
    assert q.st.ready_indexes() == [b]


def test_delivery_limit_default_is_20_and_minus_one_is_none() -> None:
    assert QuorumConfig.from_settings(QueueSettings()).delivery_limit == DEFAULT_DELIVERY_LIMIT == 20
    assert QuorumConfig.from_settings(QueueSettings(delivery_limit=-1)).delivery_limit is None
    assert QuorumConfig.from_settings(QueueSettings(delivery_limit=3)).delivery_limit == 3
    # an operator policy caps "no limit" (RabbitMQ 4.x resolve_delivery_limit: a negative one loses)
    op = make_policy("/", "op", ".*", {"delivery-limit": 5}, operator=True)
    s = effective_settings({"x-delivery-limit": -1}, None, op)
    assert s.delivery_limit == 5
    pol = make_policy("/", "p", ".*", {"delivery-limit": -1})
    assert effective_settings({}, pol, None).delivery_limit == -1
    assert QueueSettings(delivery_limit=-1).delivery_limit_or_none is None


def test_dead_letter_strategy_from_a_policy_or_operator_policy() -> None:
    pol = make_policy("/", "p", ".*", {"dead-letter-strategy": "at-least-once", "overflow": "reject-publish",
                                       "dead-letter-exchange": "dlx"})
    cfg = QuorumConfig.from_settings(effective_settings({}, pol, None))
    assert cfg.dead_letter_strategy == "at-least-once" and cfg.at_least_once
    op = make_policy("/", "o", ".*", {"dead-letter-strategy": "at-most-once"}, operator=True)
    cfg = QuorumConfig.from_settings(effective_settings({"x-dead-letter-strategy": "at-least-once"}, pol, op))
    assert cfg.dead_letter_strategy == "at-most-once"  # the operator policy beats the argument


def test_entries_written_before_priorities_still_decode() -> None:
    old = msgpack.packb((5, 0, "p", 1, 10, None), use_bin_type=True)  # an Enqueue without priority
    _t, cmd = decode(_HEAD.pack(VERSION, len(old)) + old + b"body")
    assert cmd == Enqueue("p", 1, 10, None, 0, memoryview(b"body"))
    old = msgpack.packb((5, 18, "p", 1, (10,), None, (4,)), use_bin_type=True)  # an EnqueueBatch
    _t, cmd = decode(_HEAD.pack(VERSION, len(old)) + old + b"body")
    assert type(cmd) is EnqueueBatch and cmd.priorities is None and bytes(cmd.payload) == b"body"
    new = make_enqueue_batch("p", 1, [10, 10], None, [1, 1], b"ab", [0, 9])
    assert decode(encode(new))[1].priorities == (0, 9)


def test_snapshots_round_trip_the_priority_state_and_old_snapshots_restore() -> None:
    q = Q()
    q.pub(0)
    q.pub(9)
    q.pub(9)
    q.do(make_checkout("c", 1))
    q.get()
    data = q.st.snapshot()
    assert QueueState.restore(data).snapshot() == data
    items = msgpack.unpackb(data, use_list=True, raw=False, strict_map_key=False)
    old = QueueState.restore(msgpack.packb(items[:13], use_bin_type=True))  # a snapshot from before
    assert old.hi.n == 0 and old.out_count == 0
