"""Queue features through aio-pika: dead-lettering with x-death, TTL expiry without a consumer, priorities,
and reject-publish nacks as aio-pika surfaces them."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pytest
import pytest_asyncio
from aio_pika import ExchangeType, Message

from .helpers import unique

pytestmark = pytest.mark.asyncio

TIMEOUT = 10


@pytest_asyncio.fixture
async def channel(server):
    conn = await aio_pika.connect(server.url, timeout=TIMEOUT)
    ch = await conn.channel()
    yield ch
    await conn.close()


async def _dlx(ch):
    dlx = await ch.declare_exchange(unique(), ExchangeType.FANOUT, auto_delete=True)
    dead = await ch.declare_queue(unique(), auto_delete=True)
    await dead.bind(dlx)
    return dlx, dead


async def _get(queue, timeout: float = TIMEOUT):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        msg = await queue.get(no_ack=True, fail=False)
        if msg is not None or asyncio.get_running_loop().time() > deadline:
            return msg
        await asyncio.sleep(0.05)


async def test_reject_dead_letters_with_x_death(channel):
    dlx, dead = await _dlx(channel)
    q = await channel.declare_queue(unique(), auto_delete=True, arguments={"x-dead-letter-exchange": dlx.name})
    await channel.default_exchange.publish(Message(b"bad", delivery_mode=2), routing_key=q.name)
    got = await q.get(no_ack=False)
    await got.reject(requeue=False)
    msg = await _get(dead)
    assert msg is not None and msg.body == b"bad" and msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    death = msg.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q.name and death["count"] == 1


async def test_ttl_expires_to_the_dlx_without_a_consumer(channel):
    dlx, dead = await _dlx(channel)
    q = await channel.declare_queue(unique(), auto_delete=True,
                                    arguments={"x-message-ttl": 100, "x-dead-letter-exchange": dlx.name})
    await channel.default_exchange.publish(Message(b"late"), routing_key=q.name)
    msg = await _get(dead)
    assert msg is not None and msg.headers["x-death"][0]["reason"] == "expired"


async def test_priorities(channel):
    q = await channel.declare_queue(unique(), auto_delete=True, arguments={"x-max-priority": 9})
    for body, prio in [(b"low", 1), (b"high", 9), (b"mid", 5)]:
        await channel.default_exchange.publish(Message(body, priority=prio), routing_key=q.name)
    got = [(await q.get(no_ack=True)).body for _ in range(3)]
    assert got == [b"high", b"mid", b"low"]


async def test_reject_publish_is_a_nack(server):
    conn = await aio_pika.connect(server.url, timeout=TIMEOUT)
    ch = await conn.channel(publisher_confirms=True)
    q = await ch.declare_queue(unique(), auto_delete=True,
                               arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    await ch.default_exchange.publish(Message(b"1"), routing_key=q.name)
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await ch.default_exchange.publish(Message(b"2"), routing_key=q.name)
    await conn.close()


async def test_invalid_argument_is_a_406(channel):
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as err:
        await channel.declare_queue(unique(), arguments={"x-overflow": "drop-tail"})
    assert "x-overflow" in str(err.value)
