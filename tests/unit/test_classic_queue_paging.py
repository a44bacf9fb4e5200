"""The classic queue paging to its index (seed 004's alpha/delta idea): pure, on an in-memory file system."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_classic_queue import FakeChannel

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, QueueEntry
from hutch.queues.classic.queue import ClassicQueue
from hutch.storage.appendfile import ManualSink
from hutch.storage.memfs import MemoryFS
from hutch.storage.msg_store import MessageStore
from hutch.storage.queue_index import QueueIndex

PERSISTENT = BasicProperties(delivery_mode=2)
TRANSIENT = BasicProperties()


def msg(i: int, persistent: bool = True, size: int = 0) -> Message:
    body = str(i).encode()
    if size:
        body = body + b"." * (size - len(body))
    return Message("", "q", PERSISTENT if persistent else TRANSIENT, body)


def body(entry: QueueEntry) -> int:
    return int(entry.msg.body.rstrip(b"."))


class Env:
    """A queue with an index and a store on one MemoryFS, as the node wires them."""

    def __init__(self, durable: bool = True, ram_limit: int = 10, segment_entries: int = 8,
                 embed_below: int = 100) -> None:
        self.fs = MemoryFS()
        self.sink = ManualSink()
        self.durable = durable
        self.segment_entries = segment_entries
        self.embed_below = embed_below
        self.store = MessageStore(self.fs, "/data/store", self.sink)
        self.store.recover()
        self.q = self.new_queue(ram_limit)
        if durable:
            self.q.index = self.new_index()
            self.q.persist = True
        else:
            self.q.index_factory = self.new_index

    def new_index(self) -> QueueIndex:
        return QueueIndex(self.fs, "/data/queues/q", self.sink, store=self.store,
                          segment_entries=self.segment_entries, embed_below=self.embed_below)

    def new_queue(self, ram_limit: int) -> ClassicQueue:
        q = ClassicQueue("/", "q", self.durable, None, False, {})
        q.ram_limit = ram_limit  # per instance, instead of the class-wide default
        return q

    def restart(self, crash: bool = False) -> ClassicQueue:
        """Stop (cleanly or by power cut) and recover the queue from disk."""
        if not crash:
            self.q.close_storage()
            self.sink.commit()
        else:
            self.fs.crash()
        self.sink = ManualSink()
        self.store = MessageStore(self.fs, "/data/store", self.sink)
        self.store.recover()
        index = self.new_index()
        found = index.recover()
        self.store.set_refs(_count(found.refs.values()))
        q = self.new_queue(self.q.ram_limit)
        q.index = index
        q.persist = True
        q.recover_index(found)
        self.q = q
        return q


def _count(ids: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in ids:
        out[i] = out.get(i, 0) + 1
    return out


def drain(q: ClassicQueue, ack: bool = True) -> list[int]:
    ch = FakeChannel()
    out = []
    while True:
        e = q.get(ch, no_ack=False)
        if e is None:
            return out
        out.append(body(e))
        if ack:
            q.ack([e])


@pytest.mark.parametrize("durable", [True, False])
def test_a_backlog_beyond_the_ram_limit_is_paged_and_comes_back_in_order(durable: bool) -> None:
    env = Env(durable=durable, ram_limit=10)
    for i in range(100):
        env.q.publish(msg(i, persistent=i % 3 != 0))
    q = env.q
    assert q.message_count == 100
    assert q.messages_ram == 10 and q.messages_paged_out == 90
    assert drain(q) == list(range(100))
    assert q.message_count == 0
    env.sink.commit()
    assert env.fs.list_dir("/data/queues/q") == [] or q.index is not None and q.index.live_count == 0


def test_consumers_receive_paged_messages_in_order() -> None:
    env = Env(ram_limit=5)
    q = env.q
    for i in range(40):
        q.publish(msg(i))
    ch = FakeChannel()
    c = Consumer("c", ch, q, no_ack=False, exclusive=False, prefetch=7)
    q.add_consumer(c)
    got: list[int] = []
    while ch.delivered:
        batch = [e for _c, e in ch.delivered]
        ch.delivered.clear()
        got.extend(body(e) for e in batch)
        c.unacked -= len(batch)
        q.ack(batch)
        q.deliver_pending()
    assert got == list(range(40))


def test_persistent_messages_survive_restart_paged_or_not_and_transient_ones_do_not() -> None:
    env = Env(ram_limit=10)
    for i in range(50):
        env.q.publish(msg(i, persistent=i % 2 == 0))
    first = [env.q.get(FakeChannel(), no_ack=False) for _ in range(3)]  # delivered, not acked: 0, 1, 2
    env.q.ack([e for e in first if e is not None and body(e) == 0])
    q = env.restart()
    ch = FakeChannel()
    got = []
    while (e := q.get(ch, no_ack=True)) is not None:
        got.append((body(e), e.redelivered))
    assert got == [(2, True)] + [(i, False) for i in range(4, 50, 2)]


def test_power_cut_keeps_what_was_committed() -> None:
    env = Env(ram_limit=10)
    for i in range(30):
        env.q.publish(msg(i))
    env.sink.commit()
    for i in range(30, 60):
        env.q.publish(msg(i))
    q = env.restart(crash=True)
    got = drain(q)
    assert got[:30] == list(range(30))
    assert got == list(range(len(got)))


def test_large_messages_go_to_the_store_once_for_several_queues() -> None:
    env = Env(ram_limit=10, embed_below=100)
    other = ClassicQueue("/", "q2", True, None, False, {})
    other.index = QueueIndex(env.fs, "/data/queues/q2", env.sink, store=env.store, segment_entries=8,
                             embed_below=100)
    other.persist = True
    for i in range(5):
        m = msg(i, size=500)
        env.q.publish(m)
        other.publish(m)
    assert env.store.message_count == 5
    assert all(env.store.refcount(i) == 2 for i in range(1, 6))
    assert drain(env.q) == list(range(5))
    assert drain(other) == list(range(5))
    env.sink.commit()
    assert env.store.message_count == 0


def test_page_out_under_memory_pressure_moves_transient_messages_too() -> None:
    env = Env(durable=False, ram_limit=1000)
    q = env.q
    for i in range(100):
        q.publish(msg(i, persistent=False))
    first = q.get(FakeChannel(), no_ack=False)
    assert first is not None
    assert q.page_out(5) == 94
    assert q.messages_ram == 5 and q.messages_paged_out == 94
    q.requeue([first])
    assert drain(q) == list(range(100))


def test_purge_and_delete_clear_the_paged_part() -> None:
    env = Env(ram_limit=5)
    for i in range(50):
        env.q.publish(msg(i))
    assert env.q.purge() == 50
    env.q.publish(msg(99))
    q = env.restart()
    assert drain(q, ack=False) == [99]
    q.delete()
    env.sink.commit()
    assert not env.fs.exists("/data/queues/q")


def test_a_congested_store_pauses_publishers_of_durable_queues_only() -> None:
    env = Env(ram_limit=10)
    transient = Env(durable=False, ram_limit=10)
    env.q.publish(msg(1))
    assert not env.q.needs_flow_control()
    env.sink.congested = transient.sink.congested = True
    assert env.q.needs_flow_control()
    assert not transient.q.needs_flow_control()


class PagingMachine(RuleBasedStateMachine):
    """Order and conservation with paging, page-out, requeue and restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.env = Env(ram_limit=6, segment_entries=8)
        self.ch = FakeChannel()
        self.next = 0
        self.held: list[QueueEntry] = []
        self.acked: set[int] = set()
        self.transient_lost: set[int] = set()

    @rule(n=st.integers(1, 12), persistent=st.booleans())
    def publish(self, n: int, persistent: bool) -> None:
        for _ in range(n):
            self.env.q.publish(msg(self.next, persistent=persistent))
            self.next += 1

    @rule()
    def get(self) -> None:
        e = self.env.q.get(self.ch, no_ack=False)
        if e is not None:
            self.held.append(e)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack_one(self, data: st.DataObject) -> None:
        e = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.env.q.ack([e])
        self.acked.add(body(e))

    @precondition(lambda self: self.held)
    @rule(k=st.integers(1, 4))
    def requeue_some(self, k: int) -> None:
        back, self.held = self.held[:k], self.held[k:]
        self.env.q.requeue(back)

    @rule(keep=st.integers(0, 4))
    def page_out(self, keep: int) -> None:
        self.env.q.page_out(keep)

    @rule()
    def restart(self) -> None:
        """A clean restart: unacked come back; transient messages are gone."""
        q = self.env.q
        for e in self.held:
            if not e.msg.persistent:
                self.transient_lost.add(body(e))
        self.held.clear()
        for e in q._ready:
            if not e.msg.persistent:
                self.transient_lost.add(body(e))
        # paged-out transient messages are gone too: find them by what the index holds as persistent
        ready_ids = {body(e) for e in q._ready}
        on_disk = set(range(self.next)) - ready_ids - self.acked - self.transient_lost
        self.env.restart()
        survivors = set(drain_peek(self.env.q))
        self.transient_lost |= on_disk - survivors

    @invariant()
    def conservation(self) -> None:
        q = self.env.q
        assert q.unacked_count == len(self.held)
        assert q.message_count == len(q._ready) + q.messages_paged_out

    @invariant()
    def ready_in_publish_order(self) -> None:
        seqs = [e.seq for e in self.env.q._ready]
        assert seqs == sorted(seqs)

    def teardown(self) -> None:
        for e in self.held:
            self.env.q.requeue([e])
        rest = drain(self.env.q)
        assert rest == sorted(rest)
        expected = set(range(self.next)) - self.acked - self.transient_lost
        assert set(rest) == expected
        assert len(rest) == len(set(rest))


def drain_peek(q: ClassicQueue) -> list[int]:
    """Every ready message id, leaving the queue as it was (get, then requeue all)."""
    ch = FakeChannel()
    got = []
    while (e := q.get(ch, no_ack=False)) is not None:
        got.append(e)
    q.requeue(got)
    return [body(e) for e in got]


TestPagingMachine = PagingMachine.TestCase
TestPagingMachine.settings = settings(max_examples=60, stateful_step_count=30, derandomize=True, deadline=None)
