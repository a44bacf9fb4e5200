"""x-consistent-hash, x-random and x-local-random through pika against a real hutch node.

The ring itself (RabbitMQ's exact key → queue choice) is tested pure in tests/unit/test_routing_plugins.py;
here the same table is checked end to end, with the declare/bind errors a client sees.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pika
import pytest

from chx_golden import AFTER_UNBIND_Q2, MESSAGE_ID, ROUTING_KEY_TO_QUEUE, WEIGHTS
from conftest import ServerInfo

from .helpers import connect, get_all


def refused(conn: pika.BlockingConnection, call: Callable[[], object], text: str) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        call()
    assert (info.value.reply_code, info.value.reply_text) == (406, f"PRECONDITION_FAILED - {text}")
    conn.close()


def bound_queues(ch: pika.adapters.blocking_connection.BlockingChannel, x: str, type_: str, key: str,
                 n: int) -> list[str]:
    ch.exchange_declare(x, type_, auto_delete=True)
    queues = [f"{x}-{i}" for i in range(n)]
    for q in queues:
        ch.queue_declare(q, auto_delete=True)
        ch.queue_bind(q, x, key)
    return queues


def landed(ch: pika.adapters.blocking_connection.BlockingChannel, queues: dict[str, str]) -> dict[str, str]:
    return {body.decode(): short for short, q in queues.items() for body in get_all(ch, q)}


def weighted(ch: pika.adapters.blocking_connection.BlockingChannel, x: str, **arguments: str) -> dict[str, str]:
    ch.exchange_declare(x, "x-consistent-hash", auto_delete=True, arguments=arguments or None)
    queues = {}
    for short, weight in WEIGHTS:
        q = f"{x}-{short}"
        ch.queue_declare(q, auto_delete=True)
        ch.queue_bind(q, x, str(weight))
        queues[short] = q
    return queues


def test_consistent_hash_puts_each_key_where_rabbitmq_does(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    x = f"chx-{uuid.uuid4().hex[:8]}"
    queues = weighted(ch, x)
    for key in ROUTING_KEY_TO_QUEUE:
        ch.basic_publish(x, key, key.encode(), mandatory=True)
    assert landed(ch, queues) == {key: f"q{n}" for key, n in ROUTING_KEY_TO_QUEUE.items()}
    ch.queue_unbind(queues["q2"], x, "5")
    for key in AFTER_UNBIND_Q2:
        ch.basic_publish(x, key, key.encode())
    assert landed(ch, queues) == {key: f"q{n}" for key, n in AFTER_UNBIND_Q2.items()}

    by_id = f"{x}-id"
    id_queues = weighted(ch, by_id, **{"hash-property": "message_id"})
    for message_id in MESSAGE_ID:
        ch.basic_publish(by_id, "any", message_id.encode(), pika.BasicProperties(message_id=message_id))
    assert landed(ch, id_queues) == {m: f"q{n}" for m, n in MESSAGE_ID.items()}
    conn.close()


def test_consistent_hash_spreads_by_weight_and_keeps_a_key_on_one_queue(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"chx-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(x, "x-consistent-hash", auto_delete=True, arguments={"hash-header": "user"})
    for name, weight in (("light", 1), ("heavy", 3)):
        ch.queue_declare(f"{x}-{name}", auto_delete=True)
        ch.queue_bind(f"{x}-{name}", x, str(weight))
    for i in range(4000):
        ch.basic_publish(x, "", b"%d" % (i % 400), pika.BasicProperties(headers={"user": f"u{i % 400}"}))
    light, heavy = get_all(ch, f"{x}-light"), get_all(ch, f"{x}-heavy")
    assert len(light) + len(heavy) == 4000
    assert 0.15 < len(light) / 4000 < 0.35  # weight 1 of 4
    assert not set(light) & set(heavy)  # a user's messages all go to one queue
    conn.close()


@pytest.mark.parametrize(("arguments", "text"), [
    ({"hash-header": "a", "hash-property": "message_id"}, "hash-header and hash-property are mutually exclusive"),
    ({"hash-property": "priority"}, "Unsupported property: priority"),
])
def test_consistent_hash_refuses_bad_arguments(server: ServerInfo, arguments: dict, text: str) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    refused(conn, lambda: ch.exchange_declare(f"chx-{uuid.uuid4().hex[:8]}", "x-consistent-hash",
                                              arguments=arguments), text)


@pytest.mark.parametrize(("key", "text"), [
    ("ten", 'The binding key must be an integer: <<"ten">>'),
    ("0", "The binding key must be greater than 0"),
    ("20000", "The binding key must not exceed 10000"),
])
def test_consistent_hash_refuses_bad_weights(server: ServerInfo, key: str, text: str) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"chx-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(x, "x-consistent-hash", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    refused(conn, lambda: ch.queue_bind(q, x, key), text)


def test_random_exchange_delivers_each_message_to_one_queue(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"rnd-{uuid.uuid4().hex[:8]}"
    queues = bound_queues(ch, x, "x-random", "any key", 3)
    for i in range(3000):
        ch.basic_publish(x, f"k{i}", b"%d" % i)
    got = {q: get_all(ch, q) for q in queues}
    assert sorted(int(b) for bodies in got.values() for b in bodies) == list(range(3000))  # each once
    assert all(700 < len(bodies) < 1300 for bodies in got.values()), Counter({q: len(b) for q, b in got.items()})
    conn.close()


def test_local_random_exchange_binds_classic_queues_with_an_empty_key(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"lrnd-{uuid.uuid4().hex[:8]}"
    queues = bound_queues(ch, x, "x-local-random", "", 2)
    for i in range(400):
        ch.basic_publish(x, "ignored", b"%d" % i)
    counts = [len(get_all(ch, q)) for q in queues]
    assert sum(counts) == 400 and min(counts) > 120
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(queues[0], x, "k")
    assert info.value.args == (406, "PRECONDITION_FAILED - Non empty binding 'k' key not permitted")
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_bind("amq.fanout", x, "")
    assert info.value.args == (406, "PRECONDITION_FAILED - Destination not found")
    conn.close()
