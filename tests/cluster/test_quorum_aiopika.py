"""Quorum queues on a real 3-node cluster, used with aio-pika (issue 7; docs/quorum-queues.md).

The pika tests (test_quorum_queues.py) cover the same features through a blocking client; these go through
aio-pika's asyncio consumers, its publisher confirms (a nack raises `DeliveryError`) and its connection
errors. The failover test kills a node and restarts it, so it comes last. One test found a bug, now fixed:
basic.cancel-ok was sent before the cancel was committed.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions
import pytest
from aio_pika import DeliveryMode, Message

from .nodes import Cluster, Node

pytestmark = pytest.mark.asyncio

QQ = {"x-queue-type": "quorum"}
TIMEOUT = 10.0  # any single client operation
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path_factory.mktemp("qq-aiopika"), 3)
    yield c
    c.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def connect(node: Node) -> aio_pika.abc.AbstractConnection:
    """A plain (not robust) connection: a broker error must surface, not be reconnected away."""
    return await asyncio.wait_for(aio_pika.connect(node.url, timeout=TIMEOUT), TIMEOUT)


async def within(aw: Awaitable[T], timeout: float = TIMEOUT) -> T:
    return await asyncio.wait_for(aw, timeout)


async def api(node: Node, path: str) -> Any:
    code, doc = await asyncio.to_thread(node.api, "GET", path, None, "guest", "guest", 5.0)
    assert code == 200, (path, code, doc)
    return doc


async def queue_info(node: Node, name: str) -> dict[str, Any]:
    return await api(node, f"/api/queues/%2F/{name}")


async def until(check: Callable[[], Awaitable[Any]], timeout: float = TIMEOUT, interval: float = 0.1,
                what: str = "condition") -> Any:
    """Await `check()` until it returns something truthy (exceptions count as not yet); return it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        try:
            last = await within(check(), max(0.1, deadline - loop.time()))
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        await asyncio.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s (last: {last!r})")


async def message_count(ch: aio_pika.abc.AbstractChannel, name: str) -> int:
    q = await within(ch.declare_queue(name, passive=True))
    return q.declaration_result.message_count


async def publish(ch: aio_pika.abc.AbstractChannel, name: str, body: bytes, **props: Any) -> Any:
    """Publish to the default exchange with confirms; returns the confirm frame (raises on a nack)."""
    msg = Message(body, delivery_mode=DeliveryMode.PERSISTENT, **props)
    return await within(ch.default_exchange.publish(msg, routing_key=name, timeout=TIMEOUT))


class Collector:
    """A consumer callback that hands messages to the test through an asyncio queue."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        self.received: list[bytes] = []

    async def __call__(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.received.append(message.body)
        await self.inbox.put(message)

    async def next(self, timeout: float = TIMEOUT) -> aio_pika.abc.AbstractIncomingMessage:
        return await within(self.inbox.get(), timeout)


# declare / publish / consume on three nodes -----------------------------------------------------------------
async def test_declare_publish_consume_on_three_different_nodes(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name = unique("aio-orders")
    c1, c2, c3 = await connect(n1), await connect(n2), await connect(n3)
    try:
        ch1 = await c1.channel()
        q1 = await within(ch1.declare_queue(name, durable=True, arguments=QQ))
        assert q1.declaration_result.message_count == 0

        async def leader_known() -> Any:  # n2 learns the leader from its first append: poll
            info = await queue_info(n2, name)
            return info if info.get("leader") else None

        info = await until(leader_known, what="the leader known on n2")
        assert info["type"] == "quorum" and info["durable"] is True
        assert sorted(m.split("@")[0] for m in info["members"]) == ["n1", "n2", "n3"]
        assert info["leader"] == n1.full_name  # client-local leader locator: n3 consumes through a follower

        ch2 = await c2.channel(publisher_confirms=True)
        bodies = [f"o{i}".encode() for i in range(60)]
        for body in bodies:
            confirm = await publish(ch2, name, body)
            assert isinstance(confirm, aiormq.spec.Basic.Ack)

        ch3 = await c3.channel()
        await ch3.set_qos(prefetch_count=20)
        q3 = await within(ch3.declare_queue(name, durable=True, arguments=QQ))
        assert q3.declaration_result.message_count == len(bodies)  # every confirmed message is there
        got = Collector()
        tag = await within(q3.consume(got, no_ack=False))
        seen = []
        for _ in bodies:
            msg = await got.next()
            assert msg.redelivered is False and msg.delivery_mode == DeliveryMode.PERSISTENT
            seen.append(msg.body)
            await within(msg.ack())
        assert seen == bodies  # FIFO across three nodes
        await asyncio.sleep(0.3)
        assert got.inbox.empty()  # nothing delivered twice
        await within(q3.cancel(tag))

        async def empty() -> bool:
            info = await queue_info(n1, name)
            return await message_count(ch1, name) == 0 and info.get("messages") == 0

        await until(empty, what="queue empty after the acks")
        assert await within(q3.get(no_ack=True, fail=False)) is None
    finally:
        for c in (c1, c2, c3):
            await within(c.close())


# prefetch and global QoS ------------------------------------------------------------------------------------
async def test_consumer_prefetch_is_respected(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name = unique("aio-prefetch")
    prefetch, total = 3, 20
    conn, cons = await connect(n1), await connect(n3)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await within(ch.declare_queue(name, durable=True, arguments=QQ))
        for i in range(total):
            await publish(ch, name, f"p{i}".encode())

        cch = await cons.channel()
        await cch.set_qos(prefetch_count=prefetch)  # per consumer (global=false)
        q = await within(cch.declare_queue(name, durable=True, arguments=QQ))
        got = Collector()
        await within(q.consume(got, no_ack=False))

        # without acks the broker stops at the prefetch
        held = [await got.next() for _ in range(prefetch)]
        await asyncio.sleep(1.0)
        assert len(got.received) == prefetch, got.received
        info = await queue_info(n1, name)
        assert info["messages_unacknowledged"] == prefetch and info["messages_ready"] == total - prefetch

        # then, acking slowly, never more than `prefetch` unacked: received - acks sent <= prefetch
        acked = 0
        pending = list(held)
        while acked < total:
            msg = pending.pop(0)
            await within(msg.ack())
            acked += 1
            await asyncio.sleep(0.02)
            while not got.inbox.empty():
                pending.append(got.inbox.get_nowait())
            assert len(got.received) - acked <= prefetch, (len(got.received), acked)
            if not pending and acked < total:
                pending.append(await got.next())
                assert len(got.received) - acked <= prefetch
        assert got.received == [f"p{i}".encode() for i in range(total)]
    finally:
        await within(conn.close())
        await within(cons.close())


async def test_global_qos_consume_is_refused_with_540(cluster: Cluster) -> None:
    node = cluster[1]
    name = unique("aio-global-qos")
    conn = await connect(node)
    try:
        ch = await conn.channel()
        q = await within(ch.declare_queue(name, durable=True, arguments=QQ))
        await within(ch.set_qos(prefetch_count=10, global_=True))
        # REFERENCE.md: 540 NOT_IMPLEMENTED "queue ... does not support global qos", a connection-level code,
        # so the broker closes the connection (as RabbitMQ does).
        # aiormq raises the Connection.Close's class for its code: ConnectionNotImplemented is 540 only.
        with pytest.raises(aiormq.exceptions.ConnectionNotImplemented) as info:
            await within(q.consume(Collector()))
        assert str(info.value) == f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos"
        await until(lambda: _true(not conn.connected.is_set()), timeout=5, what="connection closed")
        with pytest.raises(Exception):  # noqa: B017 - whichever error: the connection is gone
            await within(conn.channel(), 5)
    finally:
        await within(conn.close())
    # the queue is unharmed and a consumer without global QoS is fine
    conn = await connect(node)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=10)
        q = await within(ch.declare_queue(name, durable=True, arguments=QQ))
        tag = await within(q.consume(Collector()))
        await within(q.cancel(tag))
    finally:
        await within(conn.close())


async def _true(value: bool) -> bool:
    return value


# delivery limit ---------------------------------------------------------------------------------------------
async def test_delivery_limit_dead_letters_after_requeues(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name, dlq = unique("aio-poison"), unique("aio-poison-dlq")
    conn, cons = await connect(n1), await connect(n2)
    try:
        ch = await conn.channel(publisher_confirms=True)
        dead = await within(ch.declare_queue(dlq, durable=True))
        await within(ch.declare_queue(name, durable=True, arguments={
            **QQ, "x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}))
        await publish(ch, name, b"poison", headers={"app": "test"})
        await publish(ch, name, b"healthy")

        cch = await cons.channel()
        await cch.set_qos(prefetch_count=1)
        q = await within(cch.declare_queue(name, durable=True, arguments={
            **QQ, "x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}))
        got = Collector()
        await within(q.consume(got, no_ack=False))
        deliveries = []
        # returned messages go to the front with a delivery limit: the poison message comes back each time
        for _ in range(3):
            msg = await got.next()
            assert msg.body == b"poison"
            deliveries.append((msg.redelivered, (msg.headers or {}).get("x-delivery-count")))
            await within(msg.nack(requeue=True))
        assert deliveries == [(False, None), (True, 1), (True, 2)]
        # the third failed delivery passed the limit: dead-lettered, and the next message comes
        msg = await got.next()
        assert msg.body == b"healthy" and msg.redelivered is False
        await within(msg.ack())

        async def dead_letter() -> Any:
            return await dead.get(no_ack=True, fail=False)

        dl = await until(dead_letter, what="the dead letter")
        assert dl.body == b"poison" and dl.headers["app"] == "test"
        death = dl.headers["x-death"][0]
        assert death["reason"] == "delivery_limit" and death["queue"] == name and death["count"] == 1
        await until(lambda: _is_zero(message_count(ch, name)), what="quorum queue empty")
        await asyncio.sleep(0.3)
        assert got.inbox.empty()
    finally:
        await within(conn.close())
        await within(cons.close())


async def _is_zero(aw: Awaitable[int]) -> bool:
    return await aw == 0


# single active consumer -------------------------------------------------------------------------------------
async def test_single_active_consumer_takes_over_on_cancel(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name = unique("aio-sac")
    args = {**QQ, "x-single-active-consumer": True}
    conn, ca, cb = await connect(n1), await connect(n2), await connect(n3)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await within(ch.declare_queue(name, durable=True, arguments=args))
        cha, chb = await ca.channel(), await cb.channel()
        qa = await within(cha.declare_queue(name, durable=True, arguments=args))
        qb = await within(chb.declare_queue(name, durable=True, arguments=args))
        got_a, got_b = Collector(), Collector()
        tag_a = await within(qa.consume(got_a, no_ack=False))

        async def a_registered() -> bool:
            return (await queue_info(n1, name)).get("consumers") == 1

        await until(a_registered, what="first consumer registered")
        tag_b = await within(qb.consume(got_b, no_ack=False))

        async def both_registered() -> bool:
            return (await queue_info(n1, name)).get("consumers") == 2

        await until(both_registered, what="second consumer registered")

        first = [f"a{i}".encode() for i in range(10)]
        for body in first:
            await publish(ch, name, body)
        for body in first:
            msg = await got_a.next()
            assert msg.body == body
            await within(msg.ack())
        await asyncio.sleep(0.5)
        assert got_b.received == []  # the waiting consumer got nothing

        await within(qa.cancel(tag_a))

        async def cancel_applied() -> bool:  # the API's view (cancel-ok already waited for the commit)
            return (await queue_info(n1, name)).get("consumers") == 1

        await until(cancel_applied, what="the cancel applied at the leader")
        second = [f"b{i}".encode() for i in range(10)]
        for body in second:
            await publish(ch, name, body)
        for body in second:
            msg = await got_b.next()
            assert msg.body == body
            await within(msg.ack())
        await asyncio.sleep(0.3)
        assert got_a.received == first and got_b.received == second
        await within(qb.cancel(tag_b))
        await until(lambda: _is_zero(message_count(ch, name)), what="queue empty")
    finally:
        for c in (conn, ca, cb):
            await within(c.close())


# TTL and reject-publish -------------------------------------------------------------------------------------
async def test_message_ttl_and_max_length_reject_publish(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    ttl_name, full_name = unique("aio-ttl"), unique("aio-full")
    conn = await connect(n3)
    try:
        ch = await conn.channel(publisher_confirms=True)
        # the queue's TTL: the message is there at first, gone after the TTL (not before)
        loop = asyncio.get_running_loop()
        ttl_q = await within(ch.declare_queue(ttl_name, durable=True, arguments={**QQ, "x-message-ttl": 1500}))
        started = loop.time()
        await publish(ch, ttl_name, b"short-lived")
        assert await message_count(ch, ttl_name) == 1
        await until(lambda: _is_zero(message_count(ch, ttl_name)), what="message expired", interval=0.05)
        assert loop.time() - started >= 1.4
        assert await within(ttl_q.get(no_ack=True, fail=False)) is None

        # a per-message TTL (expiration) smaller than the queue's wins
        long_name = unique("aio-ttl-long")
        long_q = await within(ch.declare_queue(long_name, durable=True, arguments={**QQ, "x-message-ttl": 60000}))
        await publish(ch, long_name, b"shorter", expiration=timedelta(milliseconds=100))  # aio-pika: "100"
        await until(lambda: _is_zero(message_count(ch, long_name)), what="per-message TTL expiry")
        assert await within(long_q.get(no_ack=True, fail=False)) is None

        args = {**QQ, "x-max-length": 2, "x-overflow": "reject-publish"}
        full = await within(ch.declare_queue(full_name, durable=True, arguments=args))
        assert isinstance(await publish(ch, full_name, b"1"), aiormq.spec.Basic.Ack)
        assert isinstance(await publish(ch, full_name, b"2"), aiormq.spec.Basic.Ack)
        with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
            await publish(ch, full_name, b"3")
        assert isinstance(info.value.frame, aiormq.spec.Basic.Nack)
        assert ch.is_closed is False  # a nack, not a channel error
        assert await message_count(ch, full_name) == 2

        # room again after a message is consumed; a nacked publish was not enqueued, so retrying is safe
        head = await within(full.get(no_ack=False))
        assert head.body == b"1"
        await within(head.ack())

        async def accepted() -> bool:
            try:
                return isinstance(await publish(ch, full_name, b"4"), aiormq.spec.Basic.Ack)
            except aio_pika.exceptions.DeliveryError:
                return False

        await until(accepted, what="publish accepted after the queue drained", interval=0.2)
        rest = [(await within(full.get(no_ack=True))).body for _ in range(2)]
        assert rest == [b"2", b"4"]
        assert await message_count(ch, full_name) == 0
    finally:
        await within(conn.close())


# basic.cancel-ok comes once the cancel is committed ---------------------------------------------------------
async def test_message_published_after_cancel_ok_is_not_charged_to_the_cancelled_consumer(
        cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name = unique("aio-cancel-race")
    leader_conn, follower_conn = await connect(n1), await connect(n2)
    try:
        lch = await leader_conn.channel(publisher_confirms=True)
        lq = await within(lch.declare_queue(name, durable=True, arguments=QQ))  # leader n1 (client-local)
        fq = await within((await follower_conn.channel()).declare_queue(name, durable=True, arguments=QQ))
        seen_by_cancelled: list[bytes] = []

        async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
            seen_by_cancelled.append(msg.body)

        async def registered() -> bool:
            return (await queue_info(n1, name)).get("consumers") == 1

        # the race is cancel (follower -> leader) against publish (straight to the leader): about one
        # attempt in four loses it on a quiet machine, so a few dozen attempts show it
        for i in range(40):
            tag = await within(fq.consume(on_message, no_ack=False))
            await until(registered, what="consumer registered at the leader")
            await within(fq.cancel(tag))  # cancel-ok received: the consumer is gone for the client
            body = f"after-cancel-{i}".encode()
            await publish(lch, name, body)

            async def fetch() -> Any:
                return await lq.get(no_ack=True, fail=False)

            msg = await until(fetch, what=f"message {i} in the queue")
            assert msg.body == body
            assert (msg.redelivered, (msg.headers or {}).get("x-delivery-count")) == (False, None), (
                f"attempt {i}: a message published after cancel-ok came back as a failed delivery")
        assert seen_by_cancelled == []
    finally:
        await within(leader_conn.close())
        await within(follower_conn.close())


# failover (last: it kills a node and restarts it) -----------------------------------------------------------
async def test_leader_killed_while_consuming_from_a_follower(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    name = unique("aio-failover")
    setup = await connect(n2)
    try:
        ch = await setup.channel()
        await within(ch.declare_queue(name, durable=True, arguments=QQ))
    finally:
        await within(setup.close())
    leader, publisher_node, consumer_node = n2, n1, n3

    async def leader_known() -> Any:
        return (await queue_info(n1, name)).get("leader")

    assert await until(leader_known, what="the leader known on n1") == leader.full_name  # client-local

    cons, pub = await connect(consumer_node), await connect(publisher_node)
    killed = False
    try:
        cch = await cons.channel()
        await cch.set_qos(prefetch_count=10)
        q = await within(cch.declare_queue(name, durable=True, arguments=QQ))
        consumed: list[bytes] = []
        gate = asyncio.Event()

        async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
            consumed.append(msg.body)
            await gate.wait()  # held unacked until the leader is gone
            await msg.ack()

        pch = await pub.channel(publisher_confirms=True)
        confirmed: set[bytes] = set()
        counter = itertools.count()

        async def publish_batch(n: int) -> None:
            nonlocal pch
            for _ in range(n):
                body = f"f{next(counter)}".encode()
                for _attempt in range(3):  # a failed confirm is retried (at-least-once: may duplicate)
                    try:
                        await publish(pch, name, body)
                        confirmed.add(body)
                        break
                    except (TimeoutError, aio_pika.exceptions.DeliveryError, aiormq.exceptions.AMQPError):
                        if pch.is_closed:
                            pch = await pub.channel(publisher_confirms=True)

        await publish_batch(50)
        await within(q.consume(on_message, no_ack=False))
        await until(lambda: _true(len(consumed) == 10), what="a prefetch of deliveries")
        await asyncio.sleep(0.2)
        assert len(consumed) == 10  # 10 unacked at the consumer, 40 ready, when the leader dies

        await asyncio.to_thread(leader.kill)
        killed = True
        gate.set()  # the acks of the held messages go to whichever leader comes next

        async def new_leader() -> bool:
            lead = (await queue_info(n1, name)).get("leader")
            return lead not in (None, leader.full_name)

        # publish straight away: the confirms wait for the election
        await publish_batch(50)
        assert len(confirmed) >= 95, f"only {len(confirmed)} of 100 confirmed"
        await until(new_leader, what="a new leader")
        await publish_batch(50)
        assert len(confirmed) >= 145, f"only {len(confirmed)} of 150 confirmed"

        async def all_consumed() -> bool:
            return confirmed <= set(consumed)

        try:
            await until(all_consumed, timeout=20, what="every confirmed message consumed")
        except AssertionError as exc:
            missing = sorted(confirmed - set(consumed))
            raise AssertionError(f"{len(missing)} confirmed messages never consumed: {missing[:20]}") from exc
        assert set(consumed) <= {f"f{i}".encode() for i in range(150)}  # nothing that was never published
        assert cons.connected.is_set()  # the consumer on the follower went on with the new leader

        async def drained() -> bool:
            info = await queue_info(n1, name)
            return info.get("messages") == 0

        await until(drained, what="queue drained")
    finally:
        await within(cons.close())
        await within(pub.close())
        if killed:
            await asyncio.to_thread(leader.start)
            await asyncio.to_thread(cluster.wait_running, {"n1", "n2", "n3"}, n1, 30.0)

    async def rejoined() -> bool:
        info = await queue_info(n1, name)
        return info.get("leader") is not None and leader.full_name in info.get("members", [])

    await until(rejoined, what="restarted node back as a member")
