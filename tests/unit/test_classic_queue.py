"""Pure tests of the classic queue machine: no event loop, no sockets."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Queue, QueueEntry
from hutch.queues.classic.queue import ClassicQueue


class FakeChannel:
    """Records deliveries the way a channel would; global prefetch optional."""

    def __init__(self, global_prefetch: int = 0) -> None:
        self.delivered: list[tuple[Consumer, QueueEntry]] = []
        self.global_prefetch = global_prefetch
        self.open = True
        self.cancelled: list[Consumer] = []

    def unacked(self) -> int:
        return sum(1 for c, _ in self.delivered if not c.no_ack)

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.delivered.append((consumer, entry))

    def can_take(self) -> bool:
        return self.open and (not self.global_prefetch or self.unacked() < self.global_prefetch)

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer)


def msg(i: int) -> Message:
    return Message("", "q", BasicProperties(), str(i).encode())


def body(entry: QueueEntry) -> int:
    return int(entry.msg.body)


def new_queue() -> ClassicQueue:
    return ClassicQueue("/", "q", False, None, False, {})


def test_fifo_and_counts() -> None:
    q = new_queue()
    for i in range(5):
        q.publish(msg(i))
    assert q.message_count == 5
    ch = FakeChannel()
    got = [q.get(ch, no_ack=False) for _ in range(5)]
    assert [body(e) for e in got if e] == [0, 1, 2, 3, 4]
    assert q.get(ch, no_ack=False) is None
    assert q.unacked_count == 5
    q.ack(got[:2])  # type: ignore[arg-type]
    assert q.unacked_count == 3


def test_round_robin_two_consumers() -> None:
    q = new_queue()
    ch = FakeChannel()
    a = Consumer("a", ch, q, no_ack=True, exclusive=False, prefetch=0)
    b = Consumer("b", ch, q, no_ack=True, exclusive=False, prefetch=0)
    q.add_consumer(a)
    q.add_consumer(b)
    for i in range(6):
        q.publish(msg(i))
    assert [c.tag for c, _ in ch.delivered] == ["a", "b", "a", "b", "a", "b"]


def test_prefetch_limits_and_resume() -> None:
    q = new_queue()
    ch = FakeChannel()
    c = Consumer("c", ch, q, no_ack=False, exclusive=False, prefetch=2)
    q.add_consumer(c)
    for i in range(5):
        q.publish(msg(i))
    assert len(ch.delivered) == 2 and q.message_count == 3
    entries = [e for _, e in ch.delivered]
    c.unacked -= 2
    q.ack(entries)
    q.deliver_pending()
    assert [body(e) for _, e in ch.delivered] == [0, 1, 2, 3]


def test_global_prefetch_shared_across_consumers() -> None:
    q = new_queue()
    ch = FakeChannel(global_prefetch=3)
    for tag in ("a", "b"):
        q.add_consumer(Consumer(tag, ch, q, no_ack=False, exclusive=False, prefetch=0))
    for i in range(10):
        q.publish(msg(i))
    assert len(ch.delivered) == 3


def test_requeue_restores_original_position() -> None:
    q = new_queue()
    ch = FakeChannel()
    for i in range(5):
        q.publish(msg(i))
    e0, e1, e2 = (q.get(ch, no_ack=False) for _ in range(3))
    assert e0 and e1 and e2
    q.requeue([e2, e0])
    order = []
    while (e := q.get(ch, no_ack=True)) is not None:
        order.append((body(e), e.redelivered))
    assert order == [(0, True), (2, True), (3, False), (4, False)]


def test_consumer_priorities() -> None:
    q = new_queue()
    ch = FakeChannel()
    low = Consumer("low", ch, q, no_ack=False, exclusive=False, prefetch=1, priority=0)
    high = Consumer("high", ch, q, no_ack=False, exclusive=False, prefetch=1, priority=10)
    q.add_consumer(low)
    q.add_consumer(high)
    q.publish(msg(0))
    q.publish(msg(1))
    q.publish(msg(2))
    # high takes first; when it is full, low gets the next; the rest waits
    assert [c.tag for c, _ in ch.delivered] == ["high", "low"]


def test_delete_and_purge() -> None:
    q = new_queue()
    for i in range(3):
        q.publish(msg(i))
    assert q.purge() == 3
    q.publish(msg(9))
    assert q.delete() == 1 and q.deleted


class QueueMachine(RuleBasedStateMachine):
    """Conservation and order: every published message is ready, unacked or acked, exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.q = new_queue()
        self.ch = FakeChannel()
        self.next = 0
        self.held: list[QueueEntry] = []
        self.acked: set[int] = set()

    @rule(n=st.integers(1, 5))
    def publish(self, n: int) -> None:
        for _ in range(n):
            self.q.publish(msg(self.next))
            self.next += 1

    @rule()
    def get(self) -> None:
        e = self.q.get(self.ch, no_ack=False)
        if e is not None:
            self.held.append(e)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack_one(self, data: st.DataObject) -> None:
        e = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.q.ack([e])
        self.acked.add(body(e))

    @precondition(lambda self: self.held)
    @rule(k=st.integers(1, 4))
    def requeue_some(self, k: int) -> None:
        back, self.held = self.held[:k], self.held[k:]
        self.q.requeue(back)

    @invariant()
    def conservation(self) -> None:
        ready = [body(e) for e in self.q._ready]
        held = [body(e) for e in self.held]
        assert sorted(ready + held + sorted(self.acked)) == list(range(self.next))
        assert self.q.unacked_count == len(self.held)
        assert self.q.message_count == len(ready)

    @invariant()
    def ready_in_publish_order(self) -> None:
        seqs = [e.seq for e in self.q._ready]
        assert seqs == sorted(seqs)


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=60, stateful_step_count=40, derandomize=True, deadline=None)
