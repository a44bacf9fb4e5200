"""Pure tests of the flow rule (core/credit_flow.py and the classic queue's use of it): consumer pace,
loop load, and a Hypothesis machine over a classic queue with a publisher held by it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hutch.amqp.spec import BasicProperties
from hutch.core import credit_flow
from hutch.core.credit_flow import KEEP_UP_MS, LoopLoad, consumer_filled, consumer_settled, keeps_pace
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Queue, QueueEntry
from hutch.queues.classic.queue import FLOW_HIGH, FLOW_LOW, ClassicQueue


class Conn:
    """A publishing connection's side of the contract (runtime/session/connection.py): flow_block adds
    it to the queue's waiters, the queue's release_flow calls flow_unblock."""

    def __init__(self) -> None:
        self.write_paused = False
        self.flow_queues: set[Any] = set()

    def flow_block(self, queue: Any) -> None:
        queue.flow_waiters.add(self)
        self.flow_queues.add(queue)

    def flow_unblock(self, queue: Any) -> None:
        self.flow_queues.discard(queue)

    def recheck(self) -> None:
        for queue in list(self.flow_queues):
            if not queue.flow_still_needed():
                queue.flow_waiters.discard(self)
                self.flow_unblock(queue)


class Channel:
    def __init__(self) -> None:
        self.conn = Conn()
        self.delivered: list[tuple[Consumer, QueueEntry]] = []

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.delivered.append((consumer, entry))

    def can_take(self) -> bool:
        return True

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        raise AssertionError("not expected")


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


class Load(LoopLoad):
    """A loop load a test sets directly."""

    def __init__(self) -> None:
        super().__init__(lambda: 0.0)
        self.value = False

    def saturated(self) -> bool:
        return self.value


def msg(i: int) -> Message:
    return Message("", "q", BasicProperties(), str(i).encode())


def consumer(prefetch: int) -> Consumer:
    return Consumer("c", Channel(), None, False, False, prefetch)  # type: ignore[arg-type]


# -- consumer pace -------------------------------------------------------------------------------------

def test_a_consumer_that_gives_back_half_its_prefetch_in_time_keeps_pace() -> None:
    c = consumer(100)
    c.unacked = c.delivered = 100
    consumer_filled(c, 1000, 0, 0)
    c.unacked = 60
    consumer_settled(c, 1050, 0, 0)  # 40 back: not half yet, no judgement
    assert not c.keeping_up and c.pace_start_ms == 1000
    c.unacked = 50
    consumer_settled(c, 1100, 0, 0)
    assert c.keeping_up and c.pace_start_ms == -1
    assert keeps_pace(c, 1100)


def test_a_consumer_refilled_after_every_ack_is_judged_on_what_it_settled_since_the_fill() -> None:
    c = consumer(10)
    c.unacked = c.delivered = 10
    consumer_filled(c, 0, 0, 0)
    for i in range(1, 5):  # one ack, one new delivery: unacked stays at the prefetch
        c.delivered += 1
        consumer_settled(c, 10 * i, 0, 0)
        assert c.pace_start_ms == 0
    c.delivered += 1
    consumer_settled(c, 50, 0, 0)
    assert c.keeping_up and c.pace_start_ms == -1


def test_a_consumer_slower_than_keep_up_does_not_keep_pace() -> None:
    c = consumer(100)
    c.unacked = c.delivered = 100
    consumer_filled(c, 0, 0, 0)
    c.unacked = 0
    consumer_settled(c, KEEP_UP_MS + 1, 0, 0)
    assert not c.keeping_up and not keeps_pace(c, KEEP_UP_MS + 1)


def test_a_consumer_that_stops_acking_stops_keeping_pace() -> None:
    c = consumer(10)
    c.keeping_up = True
    consumer_filled(c, 0, 0, 0)
    assert keeps_pace(c, KEEP_UP_MS)
    assert not keeps_pace(c, KEEP_UP_MS + 1)
    assert not c.keeping_up


def test_a_consumer_whose_queue_takes_less_than_half_of_what_arrives_does_not_keep_pace() -> None:
    """A prefetch-1 consumer acking at once, behind a publisher ten times faster: prompt, but truly slower."""
    c = consumer(1)
    c.unacked = c.delivered = 1
    consumer_filled(c, 0, published=100, acked=0)
    c.unacked = 0
    consumer_settled(c, 1, published=110, acked=1)
    assert not c.keeping_up
    consumer_filled(c, 1, published=110, acked=1)
    consumer_settled(c, 2, published=111, acked=2)  # one in, one out: a close race
    assert c.keeping_up


def test_filling_twice_keeps_the_first_start() -> None:
    c = consumer(10)
    consumer_filled(c, 5, 0, 0)
    consumer_filled(c, 50, 0, 0)
    assert c.pace_start_ms == 5


# -- loop load ---------------------------------------------------------------------------------------------

def test_loop_load_is_saturated_after_a_busy_window_and_goes_stale_when_idle() -> None:
    now = [0.0]
    load = LoopLoad(lambda: now[0])
    load.note_busy(0.04, 0.05)
    assert not load.saturated()  # the window has not closed yet
    load.note_busy(0.04, 0.1)
    now[0] = 0.1
    assert load.saturated()  # 0.08 busy of 0.1 s
    load.note_busy(0.01, 0.2)
    assert not load.saturated()  # 0.01 of 0.1 s
    load.note_busy(0.1, 0.3)
    now[0] = 0.3 + credit_flow.STALE_WINDOWS * credit_flow.WINDOW_S + 0.01
    assert not load.saturated()  # nothing handled for several windows: idle


@given(st.lists(st.tuples(st.floats(0.0, 0.2), st.floats(0.0, 0.2)), max_size=60))
def test_on_saturated_fires_exactly_when_a_window_closes_saturated_after_one_that_was_not(
        inputs: list[tuple[float, float]]) -> None:
    """The hook a worker tells the others by (runtime/queue_types/remote_stats.py) is the only way a loop
    becomes saturated: it fires once per rise of the saturated flag, never while it stays up."""
    now = [0.0]
    load = LoopLoad(lambda: now[0])
    fired: list[float] = []
    load.on_saturated = lambda: fired.append(now[0])
    rises = 0
    for busy, gap in inputs:
        now[0] += gap + busy
        was = load.saturated_flag
        load.note_busy(busy, now[0])
        rises += int(load.saturated_flag and not was)
    assert len(fired) == rises


def test_the_default_loop_load_is_never_saturated() -> None:
    assert not ClassicQueue.loop_load.saturated()


# -- the classic queue's rule ------------------------------------------------------------------------------

def _queue(clock: Clock, load: Load) -> ClassicQueue:
    q = ClassicQueue("/", "q", False, None, False, {})
    q.clock = clock  # type: ignore[method-assign]
    q.loop_load = load
    return q


def _ack_all(q: ClassicQueue, c: Consumer, now_ms: int) -> None:
    """The consumer acks everything it holds (as a channel's settle does), then the queue refills it."""
    ch: Channel = c.channel  # type: ignore[assignment]
    entries = [e for _c, e in ch.delivered]
    ch.delivered.clear()
    c.unacked -= len(entries)
    q.ack(entries)
    consumer_settled(c, now_ms, q.stat_published, q.stat_acked)
    q.deliver_pending()


def _publish(q: ClassicQueue, conn: Conn, n: int, start: int) -> None:
    for i in range(start, start + n):
        q.publish(msg(i))
        if q.needs_flow_control():
            conn.flow_block(q)


def test_a_saturated_loop_holds_the_publisher_of_a_backlog_behind_a_consumer_that_keeps_pace() -> None:
    clock, load = Clock(), Load()
    q = _queue(clock, load)
    c = consumer(100)
    q.add_consumer(c)
    pub = Conn()
    load.value = True
    published = 0
    # a close race: 150 published for every 100 the consumer takes back at once; the backlog grows
    for _ in range(40):
        _publish(q, pub, 150, published)
        published += 150
        clock.ms += 5
        _ack_all(q, c, clock.ms)
        if pub.flow_queues:
            break
    assert c.keeping_up
    assert pub.flow_queues == {q} and q.message_count > FLOW_LOW  # held when it passed FLOW_HIGH
    # the consumer drains the backlog: at FLOW_LOW the publisher goes
    while q.message_count > FLOW_LOW:
        clock.ms += 1
        _ack_all(q, c, clock.ms)
    assert not pub.flow_queues and not q.flow_waiters


def test_a_fast_publisher_is_not_held_behind_a_consumer_far_slower_than_it() -> None:
    clock, load = Clock(), Load()
    q = _queue(clock, load)
    c = consumer(100)
    q.add_consumer(c)
    pub = Conn()
    load.value = True
    published = 0
    for _ in range(40):  # 1000 published for every 100 taken back: truly slower
        _publish(q, pub, 1000, published)
        published += 1000
        clock.ms += 5
        _ack_all(q, c, clock.ms)
    assert not c.keeping_up and not pub.flow_queues and q.message_count > 30_000


def test_no_publisher_is_held_on_an_idle_loop_or_without_a_consumer() -> None:
    clock, load = Clock(), Load()
    q = _queue(clock, load)
    pub = Conn()
    load.value = True
    _publish(q, pub, 5 * FLOW_HIGH, 0)  # no consumer
    assert not pub.flow_queues
    c = consumer(10)
    c.keeping_up = True
    q.add_consumer(c)
    load.value = False
    _publish(q, pub, 5 * FLOW_HIGH, 10_000)  # a consumer keeping pace, but the loop has time to spare
    assert not pub.flow_queues


def test_the_recheck_lets_a_publisher_go_once_the_consumer_stops_keeping_pace() -> None:
    clock, load = Clock(), Load()
    q = _queue(clock, load)
    c = consumer(10)
    q.add_consumer(c)
    load.value = True
    pub = Conn()
    _publish(q, pub, 10, 0)
    c.keeping_up = True
    _publish(q, pub, 2 * FLOW_HIGH, 10)
    assert pub.flow_queues == {q}
    pub.recheck()
    assert pub.flow_queues == {q}  # still within KEEP_UP_MS of the fill
    clock.ms += KEEP_UP_MS + 1
    pub.recheck()
    assert not pub.flow_queues and not q.flow_waiters


class FlowMachine(RuleBasedStateMachine):
    """Publishes, acks, time and loop load in any order. Invariants: the pace fields stay consistent,
    unacked never goes negative, a held publisher is one the queue knows, and every held publisher is
    let go when the queue drains to FLOW_LOW (deliveries) or when a recheck finds it not needed."""

    def __init__(self) -> None:
        super().__init__()
        self.clock, self.load = Clock(), Load()
        self.q = _queue(self.clock, self.load)
        self.c = consumer(50)
        self.q.add_consumer(self.c)
        self.pub = Conn()
        self.n = 0

    @rule(n=st.integers(1, 700))
    def publish(self, n: int) -> None:
        _publish(self.q, self.pub, n, self.n)
        self.n += n

    @rule(k=st.integers(1, 60))
    def ack(self, k: int) -> None:
        ch: Channel = self.c.channel  # type: ignore[assignment]
        taken = ch.delivered[:k]
        del ch.delivered[:k]
        self.c.unacked -= len(taken)
        self.q.ack([e for _c, e in taken])
        consumer_settled(self.c, self.clock.ms, self.q.stat_published, self.q.stat_acked)
        self.q.deliver_pending()

    @rule(ms=st.integers(0, 400))
    def advance(self, ms: int) -> None:
        self.clock.ms += ms

    @rule(value=st.booleans())
    def loop_load(self, value: bool) -> None:
        self.load.value = value

    @rule()
    def recheck(self) -> None:
        self.pub.recheck()
        if self.q.message_count <= FLOW_LOW or not self.load.value:
            assert not self.pub.flow_queues

    @invariant()
    def consistent(self) -> None:
        c = self.c
        assert c.unacked >= 0 and self.q.unacked_count >= 0
        assert c.pace_start_ms == -1 or c.pace_start_ms <= self.clock.ms
        assert (self.q in self.pub.flow_queues) == (self.pub in self.q.flow_waiters)
        if self.pub.flow_queues and self.q.message_count <= FLOW_LOW:
            # held only until the next delivery attempt, which releases it
            self.q.deliver_pending()
            assert not self.pub.flow_queues


TestFlowMachine = FlowMachine.TestCase
TestFlowMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


@pytest.mark.slow  # the long run (`make test-slow`); `make test` runs 50 examples of the same machine
class TestFlowMachineLong(FlowMachine.TestCase):
    settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
