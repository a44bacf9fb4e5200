"""Credit flow across the worker (or node) hop (runtime/queue_types/remote_queue.py, `needs_flow_control` /
`flow_still_needed`, `RemoteHold`): a `RemoteQueue` holds its publishers while the link to its home is
over its write high-water mark, and while the home says its queue holds publishers; it lets them go once
the link drains and the home lets go. Pure tests with a stand-in link, then pika against a node of 2
workers with connections pinned to each (the home's rule told to the publisher's worker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from tests.conftest import ServerInfo
from tests.mgmt.helpers import Api
from tests.workers.test_hop_semantics import declare_in
from tests.workers.test_workers import start_node, until
from tests.workers.test_workers_mgmt import pinned

from hutch.amqp.spec import BasicProperties
from hutch.cluster import messages as cm
from hutch.core.credit_flow import STALE_WINDOWS, WINDOW_S, LoopLoad, consumer_filled
from hutch.core.message import Message
from hutch.core.queue_type import SETTLED, Consumer, Published, Queue, QueueEntry
from hutch.core.vhost import VirtualHost
from hutch.runtime.queue_types.remote import QueueLink
from hutch.runtime.queue_types.remote_queue import RemoteQueue


class Transport:
    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.writable_hooks: list[Any] = []

    def writable(self, name: str) -> bool:
        return name not in self.paused


class Link:
    def __init__(self) -> None:
        self.transport = Transport()
        self.connected = {"n#w1"}

    def up(self, peer: str) -> bool:
        return peer in self.connected


class Conn:
    def __init__(self) -> None:
        self.unblocked: list[Any] = []

    def flow_unblock(self, queue: Any) -> None:
        self.unblocked.append(queue)


def test_a_backed_up_link_holds_publishers_until_it_drains() -> None:
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    assert not q.needs_flow_control()
    link.transport.paused.add("n#w1")  # the home reads slower than we write
    assert q.needs_flow_control() and q.flow_still_needed()
    conn = Conn()
    q.flow_waiters.add(conn)  # type: ignore[arg-type]
    q.release_flow_if_done()
    assert conn.unblocked == []  # still backed up: held
    link.transport.paused.clear()
    q.release_flow_if_done()
    assert conn.unblocked == [q] and not q.flow_waiters


def test_a_home_that_is_down_does_not_hold_publishers() -> None:
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    link.transport.paused.add("n#w1")
    link.connected.clear()  # the publishes are refused (404 / nack), not held forever
    assert not q.needs_flow_control()


def test_the_homes_hold_is_told_and_let_go() -> None:
    """`RemoteHold` from the home: publishers here are held at their next publish, and let go when the
    home lets go (unless the link itself is still backed up); a home that goes down lets them go."""
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    q.set_flow_hold(True)
    assert q.needs_flow_control() and q.flow_still_needed()
    conn = Conn()
    q.flow_waiters.add(conn)  # type: ignore[arg-type]
    link.transport.paused.add("n#w1")
    q.set_flow_hold(False)
    assert conn.unblocked == []  # the link is still over its high-water mark
    link.transport.paused.clear()
    q.release_flow_if_done()
    assert conn.unblocked == [q]
    q.set_flow_hold(True)
    q.flow_waiters.add(conn)  # type: ignore[arg-type]
    link.connected.clear()
    q.home_down()
    assert conn.unblocked == [q, q] and not q.flow_hold and not q.needs_flow_control()


def test_a_deleted_stand_in_lets_its_publishers_go() -> None:
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    q.set_flow_hold(True)
    q.delete()
    assert not q.flow_still_needed()


class HeldQueue(Queue):
    """A home's queue whose flow rule is a flag."""

    def __init__(self) -> None:
        super().__init__("/", "q", False, None, False, {})
        self.holds = False
        self.acked: list[int] = []
        self._consumers: list[Consumer] = []
        self.delivered_pending = 0

    def add_consumer(self, consumer: Consumer) -> None:
        self._consumers.append(consumer)

    def consumers(self) -> list[Consumer]:
        return list(self._consumers)

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        seqs = [e.seq for e in entries]
        self.acked.extend(seqs)
        self.stat_acked += len(seqs)

    def deliver_pending(self) -> None:
        self.delivered_pending += 1

    def publish(self, msg: Message, receipt: Any = None) -> Published:
        return SETTLED

    def needs_flow_control(self) -> bool:
        return self.holds

    def flow_still_needed(self) -> bool:
        return self.holds


class HomeTransport(Transport):
    def connected(self, name: str) -> bool:
        return True

    def connected_peers(self) -> list[str]:
        return ["n#w0", "other#w0"]


class HomeCluster:
    def __init__(self) -> None:
        self.transport = HomeTransport()
        self.sent: list[tuple[str, Any]] = []
        self.held: dict[str, Any] = {}

    def register(self, kind: Any, handler: Any) -> None:
        pass

    def send(self, peer: str, record: Any) -> bool:
        self.sent.append((peer, record))
        return True

    def hold(self, peer: str, release: Any) -> None:
        self.held[peer] = release


def home_link() -> tuple[QueueLink, HomeCluster, HeldQueue]:
    cluster = HomeCluster()
    node = SimpleNamespace(vhosts={}, cluster_peer_hooks=[], wall_ms=lambda: 1_000_000.0, name="n#w1",
                           loop_load=LoopLoad(lambda: 10.0))
    link = QueueLink(node, cluster)  # type: ignore[arg-type]
    q = HeldQueue()
    vhost = VirtualHost("/")
    vhost.queues["q"] = q
    node.vhosts["/"] = vhost
    return link, cluster, q


def test_the_home_tells_a_publishing_peer_once_and_lets_it_go() -> None:
    """At the home: a publish from worker 0 to a queue whose rule holds sends `RemoteHold(hold=True)` to
    worker 0 once (not per publish); the queue letting go (or its recheck finding the rule over) sends
    `RemoteHold(hold=False)`; worker 0 going away forgets the hold."""

    async def run() -> None:
        link, cluster, q = home_link()
        msg = Message("", "q", BasicProperties(), b"x")
        link._publish_here("n#w0", "/", "q", 1, msg)
        assert not link.flow_holds
        q.holds = True
        for pid in (2, 3, 4):
            link._publish_here("n#w0", "/", "q", pid, msg)
        flows = [r for _peer, r in cluster.sent if isinstance(r, cm.RemoteHold)]
        assert flows == [cm.RemoteHold("/", "q", True)] and len(q.flow_waiters) == 1
        q.release_flow()  # the queue's backlog drained
        flows = [r for _peer, r in cluster.sent if isinstance(r, cm.RemoteHold)]
        assert flows[-1] == cm.RemoteHold("/", "q", False) and not link.flow_holds
        link._publish_here("n#w0", "/", "q", 5, msg)  # held again; this time the recheck lets it go
        assert link.flow_holds
        q.holds = False
        while link.flow_holds:
            await asyncio.sleep(0.02)
        assert [r.hold for _peer, r in cluster.sent if isinstance(r, cm.RemoteHold)] == [True, False, True, False]
        q.holds = True
        link._publish_here("n#w0", "/", "q", 6, msg)
        link._peer_changed("n#w0", False)  # gone: nothing to tell it, nothing left waiting on the queue
        assert not link.flow_holds and not q.flow_waiters

    asyncio.run(run())


def test_the_home_judges_the_pace_of_a_consumer_across_the_hop() -> None:
    """The flow rule holds publishers only behind a consumer that keeps pace; a consumer in another worker
    is judged from its settlements as they arrive (as a channel judges its own), so its pace counts."""

    async def run() -> None:
        link, _cluster, q = home_link()
        link._on_consume("n#w0", cm.RemoteConsume("/", "q", 7, "ctag", False, False, 4, 0, []))
        (consumer,) = q.consumers()
        deliverer = consumer.channel
        msg = Message("", "q", BasicProperties(), b"x")
        for seq in range(4):  # as the queue delivers: the prefetch fills
            consumer.unacked += 1
            consumer.delivered += 1
            link.deliver_remote(deliverer, consumer, q, QueueEntry(seq, msg))  # type: ignore[arg-type]
        consumer_filled(consumer, 1_000_000 - 50, q.stat_published, q.stat_acked)
        assert consumer.pace_start_ms >= 0 and not consumer.keeping_up
        dids = list(link.out_entries["n#w0"])
        link._on_settle("n#w0", cm.RemoteSettle(cm.Outcome.ACK, dids[:2], ""))  # half a prefetch, 50 ms on
        assert q.acked == [0, 1] and consumer.unacked == 2
        assert consumer.pace_start_ms == -1 and consumer.keeping_up

    asyncio.run(run())


def test_a_saturated_worker_counts_for_the_whole_node() -> None:
    """A worker tells the other workers of its node (never another node) when its loop's saturation
    changes; theirs then count as saturated for the flow rule, until it says otherwise or goes away."""

    async def run() -> None:
        link, cluster, _q = home_link()
        load = link.node.loop_load
        link.load._on_loop_saturated("other#w0", cm.LoopSaturated(True))  # another node of a cluster: ignored
        assert not load.saturated()
        link.load._on_loop_saturated("n#w0", cm.LoopSaturated(True))
        assert load.saturated() and not load.own_saturated()
        link.load._on_loop_saturated("n#w0", cm.LoopSaturated(False))
        assert not load.saturated()
        link.load._on_loop_saturated("n#w0", cm.LoopSaturated(True))
        link._peer_changed("n#w0", False)
        assert not load.saturated()
        link.stop()

    asyncio.run(run())


def test_a_worker_tells_its_saturation_as_it_changes_and_runs_no_timer_while_idle() -> None:
    """The other workers are told as this loop's window of input closes saturated (once, however many
    saturated windows follow), and told again when it no longer is; while the loop is not saturated no
    timer runs (an idle worker's loop sleeps: docs/scaling.md, "Where a second worker's CPU goes")."""

    async def run() -> None:
        link, cluster, _q = home_link()
        now = [10.0]
        load = link.node.loop_load = LoopLoad(lambda: now[0])
        link.node.config = SimpleNamespace(worker_index=1)
        link.booted()
        assert load.on_saturated == link.load._loop_saturated and link.load._load_handle is None  # no timer

        def told() -> list[bool]:
            return [r.saturated for p, r in cluster.sent if isinstance(r, cm.LoopSaturated) and p == "n#w0"]

        load.note_busy(WINDOW_S / 10, now[0] + WINDOW_S)  # a window mostly idle: not saturated
        assert told() == [] and link.load._load_handle is None
        for window in range(2, 5):  # three windows busy throughout: saturated, told once
            load.note_busy(WINDOW_S, 10.0 + window * WINDOW_S)
        now[0] = 10.0 + 4 * WINDOW_S
        assert load.own_saturated() and told() == [True] and link.load._load_handle is not None
        link.load._tell_load()  # still saturated: keeps watching, tells nothing new
        assert told() == [True] and link.load._load_handle is not None
        now[0] += (STALE_WINDOWS + 1) * WINDOW_S  # no input since: the loop is idle again
        link.load._tell_load()
        assert told() == [True, False] and link.load._load_handle is None
        link.stop()
        assert load.on_saturated is None

    asyncio.run(run())


def test_a_consumer_with_a_full_socket_across_the_hop_is_paused_at_the_home() -> None:
    """At the home: `RemoteConsumerPaused` stops deliveries to that consumer and shows the queue's flow
    rule a consumer held by its socket; the resume lets it take deliveries again."""

    async def run() -> None:
        link, _cluster, q = home_link()
        link._on_consume("n#w0", cm.RemoteConsume("/", "q", 7, "ctag", True, False, 0, 0, []))
        (consumer,) = q.consumers()
        deliverer = consumer.channel
        assert deliverer.can_take() and not deliverer.conn.write_paused
        link._on_consumer_paused("n#w0", cm.RemoteConsumerPaused(7, True))
        assert not deliverer.can_take() and deliverer.conn.write_paused
        link._on_consumer_paused("n#w0", cm.RemoteConsumerPaused(7, False))
        assert deliverer.can_take() and not deliverer.conn.write_paused
        assert q.delivered_pending == 1  # delivers again at once
        (hook,) = link.transport.writable_hooks
        hook("n#w0")  # the link to the consumer's worker drained: deliver again
        hook("n#w9")  # no consumer there: nothing to do
        assert q.delivered_pending == 2

    asyncio.run(run())


class ConsumerConn:
    def __init__(self) -> None:
        self.write_paused = False


class ConsumerChannel:
    def __init__(self) -> None:
        self.conn = ConsumerConn()
        self.got: list[int] = []

    def deliver(self, consumer: Any, queue: Any, entry: QueueEntry) -> None:
        self.got.append(entry.seq)


def test_the_consumers_worker_tells_the_home_when_its_socket_fills_and_drains() -> None:
    """At the consumer's worker: a delivery that leaves the consumer's connection over its high-water mark
    sends `RemoteConsumerPaused(paused)` once; the connection draining (the channel asks its queues to
    deliver) sends the resume."""
    link, cluster, q, channel, _consumer, cid = consumer_worker(no_ack=True)
    msg = Message("", "q", BasicProperties(), b"x")
    link._deliver_here("n#w1", cid, 1, False, True, msg)
    channel.conn.write_paused = True
    link._deliver_here("n#w1", cid, 2, False, True, msg)
    link._deliver_here("n#w1", cid, 3, False, True, msg)
    assert channel.got == [1, 2, 3]
    q.deliver_pending()  # still full: nothing said
    channel.conn.write_paused = False
    q.deliver_pending()
    q.deliver_pending()
    told = [r for _peer, r in cluster.sent if isinstance(r, cm.RemoteConsumerPaused)]
    assert told == [cm.RemoteConsumerPaused(cid, True), cm.RemoteConsumerPaused(cid, False)]


def consumer_worker(no_ack: bool) -> tuple[QueueLink, HomeCluster, RemoteQueue, ConsumerChannel, Consumer, int]:
    """The consumer's worker: a stand-in for a queue in n#w1 with one consumer added, as basic.consume does."""
    cluster = HomeCluster()
    node = SimpleNamespace(vhosts={}, cluster_peer_hooks=[], name="n#w0", loop_load=LoopLoad(lambda: 0.0))
    link = QueueLink(node, cluster)  # type: ignore[arg-type]
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})
    channel = ConsumerChannel()
    consumer = Consumer("ctag", channel, q, no_ack, False, 0, 0)  # type: ignore[arg-type]
    q.add_consumer(consumer)
    (cid,) = link.consumers
    return link, cluster, q, channel, consumer, cid


def test_deliveries_before_consume_ok_wait_for_it_in_order() -> None:
    """The home delivers as soon as it registers the consumer; the gate holds consume-ok until the home's
    answer: what arrives meanwhile is held, then delivered in order once consume-ok is out."""
    link, _cluster, q, channel, _consumer, cid = consumer_worker(no_ack=True)
    assert q.take_consume_sent()  # the gate holds consume-ok for this consumer
    msg = Message("", "q", BasicProperties(), b"x")
    link._deliver_here("n#w1", cid, 1, False, True, msg)
    link._deliver_here("n#w1", cid, 2, False, True, msg)
    assert channel.got == []
    q._consume_ok_sent([cid])  # what consumer_registered schedules for the turn after consume-ok went out
    link._deliver_here("n#w1", cid, 3, False, True, msg)
    assert channel.got == [1, 2, 3]


def test_deliveries_held_for_a_consumer_cancelled_before_consume_ok_go_back_to_the_home() -> None:
    link, cluster, q, channel, consumer, cid = consumer_worker(no_ack=False)
    assert q.take_consume_sent()
    msg = Message("", "q", BasicProperties(), b"x")
    link._deliver_here("n#w1", cid, 7, False, False, msg)
    q.remove_consumer(consumer)  # e.g. the connection closed while consume-ok waited
    q._consume_ok_sent([cid])
    assert channel.got == []
    settled = [r for _peer, r in cluster.sent if isinstance(r, cm.RemoteSettle)]
    assert settled == [cm.RemoteSettle(cm.Outcome.REQUEUE, [7], "")]


# -- the home's rule across the hop, with pika and a node of 2 workers ---------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_node(tmp_path_factory.mktemp("hop-flow"))
    yield info
    info.stop()


def states(info: ServerInfo, names: set[str]) -> list[str]:
    return [c.get("state", "?") for c in Api(info.mgmt_url).get("/api/connections").body
            if c.get("user_provided_name") in names]


@pytest.mark.parametrize("consumer_worker", [1, 0], ids=["consumer-in-home", "consumer-across-the-hop"])
def test_a_publisher_in_one_worker_is_held_by_a_full_consumer_socket(node: ServerInfo, consumer_worker: int) -> None:
    """The queue lives in worker 1, the publisher is in worker 0, and the queue's consumer (no prefetch
    limit) does not read its socket: in worker 1 (the home sees the full socket) or in worker 0 (its
    worker tells the home, `RemoteConsumerPaused`, and the home stops delivering to it). The home's flow
    rule (a backlog behind a consumer held only by its full socket) holds the publisher in worker 0,
    shown as `flow` in /api/connections; once the consumer reads, every message arrives and the
    publisher runs again."""
    with pinned(node, 1, "hop-flow-setup") as setup:
        queue = declare_in(node, setup.channel(), f"hop-flow-{consumer_worker}", 1)
    consumer_conn = pinned(node, consumer_worker, "hop-flow-consumer")
    got: list[int] = []
    consumer_conn.channel().basic_consume(queue, lambda ch, m, _p, _b: got.append(1), auto_ack=True)
    publisher = pinned(node, 0, "hop-flow-publisher")
    pch = publisher.channel()
    body = b"x" * 8192
    sent = 0
    for _ in range(6000):  # bounded: ~49 MB, far past the socket buffers, the write buffer and the link's
        pch.basic_publish("", queue, body)
        sent += 1
        if sent % 500 == 0:
            publisher.process_data_events(0)
            if "flow" in states(node, {"hop-flow-publisher"}):
                break
    until(lambda: states(node, {"hop-flow-publisher"}) == ["flow"], timeout=20, what="the publisher held")
    deadline = time.monotonic() + 60
    while len(got) < sent and time.monotonic() < deadline:
        consumer_conn.process_data_events(0.1)
        publisher.process_data_events(0)
    assert len(got) == sent
    until(lambda: states(node, {"hop-flow-publisher"}) == ["running"], timeout=10, what="the publisher running")
    pch.queue_delete(queue)
    consumer_conn.close()
    publisher.close()
