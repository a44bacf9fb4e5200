"""DelayedMessages without a network or an event loop: an in-memory file system, a manual group commit and
a clock the test moves (docs/delayed-messages.md)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from hutch.amqp.spec import BasicProperties
from hutch.core.confirms import Receipt
from hutch.core.message import Message
from hutch.core.queue_type import SETTLED, Published, Queue
from hutch.core.routing import message_delay
from hutch.core.vhost import VirtualHost
from hutch.runtime.queue_types import delayed
from hutch.runtime.queue_types.delayed import DelayedMessages
from hutch.storage.appendfile import ManualSink
from hutch.storage.memfs import MemoryFS


class Recorder(Queue):
    queue_type = "classic"

    def __init__(self, name: str) -> None:
        super().__init__("/", name, True, None, False, {})
        self.got: list[Message] = []

    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        self.got.append(msg)
        return SETTLED


class Owner:
    def __init__(self) -> None:
        self.settled: list[int] = []

    def settle(self, seq: int, queue: Any) -> None:
        self.settled.append(seq)

    def reject(self, seq: int, queue: Any, error: str | None) -> None:
        raise AssertionError("nothing is rejected here")

    def queue_deleted(self, queue: Any) -> None:
        raise AssertionError("no queue is deleted here")


class World:
    """A node with one vhost, a delayed exchange `dx` (direct) bound to queue `q`, and its storage."""

    def __init__(self, fs: MemoryFS | None = None, durable: bool = True) -> None:
        self.now = 1_000_000
        self.fs = fs or MemoryFS()
        self.sink = ManualSink()
        self.vhost = VirtualHost("/")
        self.x, _ = self.vhost.declare_exchange("dx", "x-delayed-message", durable, False, False,
                                                {"x-delayed-type": "direct"})
        self.q = Recorder("q")
        self.vhost.add_queue(self.q)
        self.vhost.bind(self.x, ("queue", "q"), "k", {})
        clock = SimpleNamespace(wall_ms=lambda: self.now)
        self.node = SimpleNamespace(vhosts={"/": self.vhost}, clock=clock, cluster=None, name="test@localhost")
        persistence = SimpleNamespace(fs=self.fs, data_dir="/data", sink=self.sink)
        self.delayed = DelayedMessages(self.node, persistence)  # type: ignore[arg-type]

    def publish(self, body: bytes, delay: object, receipt: Receipt | None = None) -> Any:
        headers = {"x-delay": delay}
        msg = Message("dx", "k", BasicProperties(headers=headers, delivery_mode=2), body)
        return self.delayed.hold(self.vhost, self.x, msg, headers, receipt)

    def release_all(self) -> None:
        held = self.delayed._held[("/", "dx")]
        while held.heap and held.heap[0][0] <= self.now:
            self.delayed._release(held)
        self.sink.commit()  # the publishes into the queues; the acks are written after it
        self.sink.commit()  # and synced by the next


def test_paged_bodies_come_back_in_release_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delayed, "RAM_MESSAGES", 5)
    monkeypatch.setattr(delayed, "SEGMENT_ENTRIES", 16)
    w = World()
    rng = random.Random(7)
    delays = [rng.randrange(1, 10_000) for _ in range(100)]
    owner = Owner()
    for i, d in enumerate(delays):
        assert w.publish(b"%d" % i, d, Receipt(owner, i + 1)) == [w.delayed._held[("/", "dx")]]
    held = w.delayed._held[("/", "dx")]
    assert len(held.ram) == 5 and w.delayed.count("/", "dx") == 100
    w.sink.commit()
    assert owner.settled == list(range(1, 101))  # confirmed once synced
    w.now += 5_000
    w.release_all()
    first = [int(m.body) for m in w.q.got]
    assert all(delays[i] <= 5_000 for i in first) and len(first) == sum(d <= 5_000 for d in delays)
    w.now += 5_000
    w.release_all()
    bodies = [int(m.body) for m in w.q.got]
    assert bodies == sorted(range(100), key=lambda i: (delays[i], i))  # release order; ties in publish order
    assert [m.properties.headers["x-delay"] for m in w.q.got] == [-delays[i] for i in bodies]
    assert w.delayed.count("/", "dx") == 0 and not held.ram
    again = World(w.fs)
    again.delayed.recover()
    assert again.delayed.count("/", "dx") == 0  # every released entry was acked


def test_recovery_puts_messages_back_on_the_heap() -> None:
    w = World()
    for i, d in enumerate([3000, 1000, 2000]):
        w.publish(b"%d" % i, d)
    w.sink.commit()
    again = World(w.fs)
    again.now = w.now
    again.delayed.recover()
    assert again.delayed.count("/", "dx") == 3
    again.now += 1500
    again.release_all()
    assert [m.body for m in again.q.got] == [b"1"]
    again.now += 5000
    again.release_all()
    assert [m.body for m in again.q.got] == [b"1", b"2", b"0"]


def test_a_transient_exchange_keeps_nothing_across_a_restart() -> None:
    w = World(durable=False)
    owner = Owner()
    assert w.publish(b"a", 100, Receipt(owner, 1)) == []  # not waited for
    w.sink.commit()
    again = World(w.fs, durable=False)
    again.delayed.recover()
    assert again.delayed.count("/", "dx") == 0
    assert again.fs.list_dir("/data/delayed") == []


def test_deleting_the_exchange_drops_its_files() -> None:
    w = World()
    w.publish(b"a", 100)
    w.sink.commit()
    assert w.fs.list_dir("/data/delayed")
    w.delayed.exchange_deleted("/", "dx")
    assert w.delayed.count("/", "dx") == 0
    assert w.fs.list_dir("/data/delayed") == []


def test_an_exchange_gone_without_a_delete_drops_what_it_held_at_the_next_release() -> None:
    w = World()
    w.publish(b"a", 100)
    w.sink.commit()
    del w.vhost.exchanges["dx"]  # as an auto-delete exchange or its vhost goes
    w.now += 200
    w.delayed._release(w.delayed._held[("/", "dx")])
    assert w.delayed.count("/", "dx") == 0 and w.q.got == []
    assert w.fs.list_dir("/data/delayed") == []


@pytest.mark.parametrize(("value", "expected"), [
    (5000, 5000), ("250", 250), (b"250", 250), (99.9, 99), (0, None), (-5, None), ("soon", None), (True, None),
    (None, None), ((1 << 32) - 1, (1 << 32) - 1), (1 << 32, None), ("+7", 7), ([1], None),
])
def test_x_delay_is_read_as_the_plugin_reads_it(value: object, expected: int | None) -> None:
    assert message_delay({"x-delay": value}) == expected
    assert message_delay(None) is None and message_delay({}) is None


class FakeLoop:
    """call_later / call_soon recorded, run by the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Any]] = []

    def call_later(self, delay: float, fn: Any, *args: Any) -> Any:
        handle = SimpleNamespace(fn=fn, delay=delay, cancelled=False)
        handle.cancel = lambda: setattr(handle, "cancelled", True)
        self.calls.append(handle)
        return handle

    def call_soon(self, fn: Any, *args: Any) -> Any:
        return self.call_later(0, fn)

    def pending(self) -> list[Any]:
        return [h for h in self.calls if not h.cancelled]


class Replica:
    def __init__(self) -> None:
        self.acked: list[int] = []
        self.consumers: list[Any] = []
        self.message_count = 0  # entries ready, not yet given to the releaser

    def add_consumer(self, consumer: Any) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Any) -> None:
        self.consumers.remove(consumer)

    def ack(self, entries: list[Any]) -> None:
        self.acked += [e.seq for e in entries]


def test_a_releaser_made_active_with_a_backlog_releases_it_in_order() -> None:
    """After a restart or a failover the replica hands over overdue entries in publish order, over several
    loop turns: the releaser waits until they stop coming before releasing, so the order holds."""
    from hutch.core.queue_type import QueueEntry
    from hutch.runtime.queue_types.delayed import CATCH_UP_QUIET_MS, RELEASE_HEADER, Releaser

    w = World()
    loop = FakeLoop()
    w.delayed._loop = loop  # type: ignore[assignment]
    replica = Replica()
    releaser = Releaser(w.delayed, "/", "dx", replica)  # type: ignore[arg-type]
    assert replica.consumers == [releaser.consumer]
    for seq, release_at in enumerate([w.now - 100, w.now - 300, w.now - 200], start=1):  # all overdue
        headers = {RELEASE_HEADER: release_at, "x-delay": 1}
        msg = Message("dx", "k", BasicProperties(headers=headers), b"%d" % seq)
        releaser.deliver(releaser.consumer, replica, QueueEntry(seq, msg))  # type: ignore[arg-type]
        w.now += 50  # the next entry comes a little later
    (timer,) = loop.pending()
    assert timer.delay * 1000 == pytest.approx(CATCH_UP_QUIET_MS)  # counted from the last entry given
    assert w.q.got == []
    timer.fn()
    assert [m.body for m in w.q.got] == [b"2", b"3", b"1"]  # release-time order
    assert all(RELEASE_HEADER not in m.properties.headers for m in w.q.got)
    assert [m.properties.headers["x-delay"] for m in w.q.got] == [-1, -1, -1]
    assert sorted(replica.acked) == [1, 2, 3]
    releaser.stop()
    assert replica.consumers == []


def test_a_releaser_catching_up_waits_while_the_replica_has_entries_ready_for_it() -> None:
    """On a loaded machine the backlog's entries can come further apart than the quiet spell: while the
    replica still has entries ready (not yet given), the first release waits another spell, up to
    `CATCH_UP_MAX_MS`, so an overdue entry still to come is released in its place in the order."""
    from hutch.core.queue_type import QueueEntry
    from hutch.runtime.queue_types.delayed import CATCH_UP_MAX_MS, CATCH_UP_QUIET_MS, RELEASE_HEADER, Releaser

    w, w2 = World(), World()
    loop = FakeLoop()
    w.delayed._loop = loop  # type: ignore[assignment]
    replica = Replica()
    releaser = Releaser(w.delayed, "/", "dx", replica)  # type: ignore[arg-type]

    def give(seq: int, release_at: int) -> None:
        headers = {RELEASE_HEADER: release_at, "x-delay": 1}
        msg = Message("dx", "k", BasicProperties(headers=headers), b"%d" % seq)
        releaser.deliver(releaser.consumer, replica, QueueEntry(seq, msg))  # type: ignore[arg-type]

    def fire(lp: FakeLoop, advance: bool = False) -> None:
        (timer,) = lp.pending()  # the one live timer (fired ones are marked below)
        timer.cancelled = True
        if advance:
            w2.now += int(timer.delay * 1000)
        timer.fn()

    replica.message_count = 1  # one more entry is ready, to come after a gap longer than the quiet spell
    give(1, w.now - 100)
    w.now += CATCH_UP_QUIET_MS + 50
    fire(loop)
    assert w.q.got == [], "nothing released while the replica has entries ready for it"
    replica.message_count = 0
    give(2, w.now - 1000)  # the late one is due earlier
    w.now += CATCH_UP_QUIET_MS
    fire(loop)
    assert [m.body for m in w.q.got] == [b"2", b"1"]
    # the bound: with entries ready for ever, the release waits at most CATCH_UP_MAX_MS
    loop2 = FakeLoop()
    w2.delayed._loop = loop2  # type: ignore[assignment]
    stuck = Replica()
    stuck.message_count = 5
    late = Releaser(w2.delayed, "/", "dx", stuck)  # type: ignore[arg-type]
    start = w2.now
    msg = Message("dx", "k", BasicProperties(headers={RELEASE_HEADER: w2.now - 10, "x-delay": 1}), b"x")
    late.deliver(late.consumer, stuck, QueueEntry(1, msg))  # type: ignore[arg-type]
    while not w2.q.got:
        fire(loop2, advance=True)
        assert w2.now - start <= CATCH_UP_MAX_MS + CATCH_UP_QUIET_MS
    assert [m.body for m in w2.q.got] == [b"x"] and w2.now - start >= CATCH_UP_MAX_MS
