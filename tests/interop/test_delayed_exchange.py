"""x-delayed-message through pika against real hutch processes: delay order, confirms, kill -9, deletion.

Delays are chosen so the order is unambiguous (hundreds of ms apart); bounds on elapsed time are only
generous lower limits (a message never comes out before its delay).
"""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.request
import uuid
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server

from .helpers import connect, wait_for


def get_json(server: ServerInfo, path: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{server.management_port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def delayed_count(server: ServerInfo, exchange: str) -> int:
    return int(get_json(server, f"/api/exchanges/%2F/{exchange}")["messages_delayed"])


def take(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int,
         timeout: float = 60.0) -> list[tuple[bytes, dict]]:
    out: list[tuple[bytes, dict]] = []
    deadline = time.monotonic() + timeout
    for method, props, body in ch.consume(queue, inactivity_timeout=0.2):
        if method is not None:
            ch.basic_ack(method.delivery_tag)
            out.append((body, props.headers or {}))
        if len(out) == n or time.monotonic() > deadline:
            break
    ch.cancel()
    return out


def declare(ch: pika.adapters.blocking_connection.BlockingChannel, x: str, durable: bool = False,
            delayed_type: str = "direct") -> str:
    ch.exchange_declare(x, "x-delayed-message", durable=durable, arguments={"x-delayed-type": delayed_type})
    q = f"{x}-q"
    ch.queue_declare(q, durable=durable)
    ch.queue_bind(q, x, "k")
    return q


def test_messages_come_out_in_delay_order_with_x_delay_negated(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    x = f"delay-{uuid.uuid4().hex[:8]}"
    q = declare(ch, x)
    started = time.monotonic()
    for delay in (1500, 300, 900, 600, 1200):
        ch.basic_publish(x, "k", b"%d" % delay, pika.BasicProperties(headers={"x-delay": delay}), mandatory=True)
    ch.basic_publish(x, "k", b"now")  # no x-delay: routed at once
    ch.basic_publish(x, "k", b"zero", pika.BasicProperties(headers={"x-delay": 0}))
    # unroutable once released; its delay outlasts the count below however loaded the machine is
    ch.basic_publish(x, "other", b"unroutable", pika.BasicProperties(headers={"x-delay": 1000}))
    assert delayed_count(server, x) == 6
    got = take(ch, q, 7)
    assert [body for body, _ in got] == [b"now", b"zero", b"300", b"600", b"900", b"1200", b"1500"]
    assert time.monotonic() - started >= 1.5
    assert [h.get("x-delay") for _, h in got[2:]] == [-300, -600, -900, -1200, -1500]
    assert wait_for(lambda: delayed_count(server, x) == 0, timeout=10)  # a release's ack settles after its delivery
    conn.close()


def test_delay_routes_with_the_delayed_type(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"delay-{uuid.uuid4().hex[:8]}"
    q = declare(ch, x, delayed_type="topic")
    ch.queue_bind(q, x, "orders.*")
    ch.basic_publish(x, "orders.eu", b"a", pika.BasicProperties(headers={"x-delay": "200"}))  # a string delay
    ch.basic_publish(x, "invoices.eu", b"b", pika.BasicProperties(headers={"x-delay": 100}))
    assert [body for body, _ in take(ch, q, 1, timeout=5)] == [b"a"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(f"{x}-bad", "x-delayed-message")
    assert info.value.args == (406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an "
                                    "existing exchange type")
    conn.close()


def test_a_transaction_holds_its_delayed_publishes_from_the_commit(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"delay-{uuid.uuid4().hex[:8]}"
    q = declare(ch, x, durable=True)
    ch.tx_select()
    ch.basic_publish(x, "k", b"rolled back", pika.BasicProperties(headers={"x-delay": 200}))
    ch.tx_rollback()
    ch.basic_publish(x, "k", b"committed", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 300}))
    assert wait_for(lambda: delayed_count(server, x) == 0, timeout=10)  # a release's ack settles after its delivery
    ch.tx_commit()
    assert delayed_count(server, x) == 1
    other = conn.channel()
    assert [body for body, _ in take(other, q, 1, timeout=10)] == [b"committed"]
    time.sleep(0.5)
    assert other.basic_get(q, auto_ack=True)[0] is None
    conn.close()


def test_a_delayed_exchange_behind_an_exchange_binding_holds_too(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    x = f"delay-{uuid.uuid4().hex[:8]}"
    q = declare(ch, x)
    front = f"{x}-front"
    ch.exchange_declare(front, "topic", auto_delete=True)
    ch.exchange_bind(x, front, "#")
    ch.basic_publish(front, "k", b"through", pika.BasicProperties(headers={"x-delay": 300}), mandatory=True)
    assert delayed_count(server, x) == 1
    got = take(ch, q, 1, timeout=10)
    assert [(body, headers["x-delay"]) for body, headers in got] == [(b"through", -300)]
    conn.close()


def test_deleting_the_exchange_drops_what_it_holds(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    x = f"delay-{uuid.uuid4().hex[:8]}"
    q = declare(ch, x)
    ch.basic_publish(x, "k", b"never", pika.BasicProperties(headers={"x-delay": 500}))
    ch.exchange_delete(x)
    declare(ch, x)
    time.sleep(1.0)
    assert ch.basic_get(q, auto_ack=True)[0] is None
    assert wait_for(lambda: delayed_count(server, x) == 0, timeout=10)  # a release's ack settles after its delivery
    conn.close()


@pytest.mark.parametrize(("how", "cluster"), [
    pytest.param(signal.SIGKILL, False, id="kill-9"),
    pytest.param(signal.SIGTERM, False, id="graceful", marks=pytest.mark.slow),  # kill -9 is the harder case
    pytest.param(signal.SIGKILL, True, id="kill-9-cluster-of-one"),
])
def test_delayed_messages_survive_a_restart_and_keep_their_order(tmp_path: Path, how: int, cluster: bool) -> None:
    """Without clustering they are in the exchange's own store; a cluster of one (hutch-server's default)
    keeps them in the exchange's replica, a quorum queue."""
    server = start_server(tmp_path, cluster=cluster)
    x = "delayed-durable"
    n = 200
    try:
        conn = connect(server.amqp_port)
        ch = conn.channel()
        q = declare(ch, x, durable=True)
        # four groups of delays a second apart, published in reverse order: the groups must come out in order
        for i in reversed(range(n)):
            delay = 3000 + 1000 * (i // 50)
            ch.basic_publish(x, "k", b"%d" % i, pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
        marker = conn.channel()
        marker.confirm_delivery()  # confirmed once on disk, with everything published before it
        marker.basic_publish(x, "k", b"last", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 8000}))
        assert delayed_count(server, x) == n + 1
        if cluster:  # held in the exchange's replica, a quorum queue
            replica = get_json(server, f"/api/queues/%2F/amq.delayed-message.{x}")
            assert (replica["type"], replica["messages"]) == ("quorum", n + 1)
    finally:
        server.stop(how)
    again = start_server(tmp_path, cluster=cluster)
    try:
        # a replica (quorum queue) counts what it holds once its log is applied again after the start; on a
        # loaded machine the restart can outlast the first delays, so what was released already counts too
        def all_there() -> bool:
            return delayed_count(again, x) + get_json(again, f"/api/queues/%2F/{q}")["messages"] == n + 1

        assert wait_for(all_there, timeout=30)
        conn = connect(again.amqp_port)
        ch = conn.channel()
        got = take(ch, q, n + 1)
        bodies = [body for body, _ in got]
        assert bodies[-1] == b"last" and sorted(int(b) for b in bodies[:-1]) == list(range(n))  # all of them
        groups = [int(b) // 50 for b in bodies[:-1]]
        assert groups == sorted(groups)  # in delay order
        assert wait_for(lambda: delayed_count(again, x) == 0, timeout=10)  # the replica's ack settles after the delivery
        conn.close()
    finally:
        again.stop()
    third = start_server(tmp_path, cluster=cluster)  # released messages were acked: nothing comes back
    try:
        assert delayed_count(third, x) == 0
        conn = connect(third.amqp_port)
        assert conn.channel().queue_declare(q, passive=True).method.message_count == 0
        conn.close()
    finally:
        third.stop()


def test_kombu_retries_with_back_off_through_a_delayed_exchange(server: ServerInfo) -> None:
    """What a Celery/kombu application does for delayed retries: publish with an x-delay header to an
    x-delayed-message exchange declared by kombu, with publisher confirms."""
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    name = f"kombu-delay-{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="x-delayed-message", arguments={"x-delayed-type": "direct"}, durable=True)
    queue = Queue(f"{name}-q", exchange, routing_key="task", durable=True)
    got: list[str] = []
    with Connection(f"amqp://guest:guest@127.0.0.1:{server.amqp_port}//", transport_options={"confirm_publish": True}) as conn:
        producer = Producer(conn.channel())
        for attempt, back_off in (("retry-3", 1200), ("retry-1", 200), ("retry-2", 600)):
            producer.publish({"task": attempt}, exchange=exchange, routing_key="task", declare=[queue],
                             headers={"x-delay": back_off}, serializer="json")
        with Consumer(conn.channel(), [queue], accept=["json"],
                      callbacks=[lambda body, message: (got.append(body["task"]), message.ack())]):
            deadline = time.monotonic() + 30
            while len(got) < 3 and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
    assert got == ["retry-1", "retry-2", "retry-3"]
