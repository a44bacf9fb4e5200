"""kombu (the transport under celery) over py-amqp against hutch: AMQPLAIN login, Producer/Consumer
with the exchange types, SimpleQueue, declarations and their errors, prefetch, reject/requeue,
publisher confirms and the serializers."""

from __future__ import annotations

import amqp.exceptions
import kombu
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from .helpers import unique

TIMEOUT = 10


def _url(server, password: str = "guest") -> str:
    return f"amqp://guest:{password}@127.0.0.1:{server.amqp_port}//"


@pytest.fixture
def kconn(server):
    conn = Connection(_url(server), connect_timeout=TIMEOUT)
    conn.connect()
    yield conn
    conn.release()


def _drain(conn: Connection, sink: list, count: int, timeout: float = TIMEOUT) -> list:
    import time

    deadline = time.monotonic() + timeout
    while len(sink) < count and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
    return sink


@pytest.mark.parametrize("login_method", [None, "AMQPLAIN", "PLAIN"])
def test_login_methods(server, login_method):
    conn = Connection(_url(server), login_method=login_method, connect_timeout=TIMEOUT)
    try:
        conn.connect()
        raw = conn.connection  # the py-amqp connection
        assert set(raw.mechanisms) >= {b"PLAIN", b"AMQPLAIN"}
        if login_method:
            assert raw.authentication[0].mechanism == login_method.encode()
        assert raw.server_properties["product"] == "hutch"
        assert raw.server_properties["capabilities"]["consumer_cancel_notify"] is True
        with conn.channel() as ch:
            assert Queue("", exclusive=True)(ch).declare().startswith("amq.gen-")
    finally:
        conn.release()


@pytest.mark.parametrize("login_method", ["AMQPLAIN", "PLAIN"])
def test_wrong_password_is_access_refused(server, login_method):
    conn = Connection(_url(server, "bad"), login_method=login_method, connect_timeout=TIMEOUT)
    with pytest.raises(amqp.exceptions.AccessRefused) as info:
        conn.connect()
    assert f"Login was refused using authentication mechanism {login_method}" in str(info.value)
    conn.release()


def test_producer_consumer_direct(kconn):
    x = Exchange(unique("kx"), "direct", auto_delete=True)
    q = Queue(unique("kq"), x, routing_key="rk", auto_delete=True)
    with kconn.channel() as ch:
        producer = Producer(ch, exchange=x)
        q(ch).declare()
        for i in range(5):
            producer.publish({"n": i}, routing_key="rk", serializer="json")
        got = []

        def on_message(body, message):
            got.append(body)
            message.ack()

        with Consumer(ch, queues=[q], callbacks=[on_message], accept=["json"]):
            _drain(kconn, got, 5)
        assert got == [{"n": i} for i in range(5)]


def test_fanout_and_topic(kconn):
    fan = Exchange(unique("fan"), "fanout", auto_delete=True)
    top = Exchange(unique("top"), "topic", auto_delete=True)
    q1 = Queue("", fan, exclusive=True)
    q2 = Queue("", fan, exclusive=True)
    q3 = Queue("", top, routing_key="logs.*.error", exclusive=True)
    with kconn.channel() as ch:
        bound = [q(ch) for q in (q1, q2, q3)]
        for b in bound:
            b.declare()
        producer = Producer(ch)
        producer.publish("to all", exchange=fan, serializer="json")
        producer.publish("err", exchange=top, routing_key="logs.web.error", serializer="json")
        producer.publish("info", exchange=top, routing_key="logs.web.info", serializer="json")
        bodies = []
        for b in bound:
            message = b.get(no_ack=True)
            bodies.append(message.decode() if message else None)
            assert b.get(no_ack=True) is None
        assert bodies == ["to all", "to all", "err"]


def test_simple_queue(kconn):
    name = unique("simple")
    sq = kconn.SimpleQueue(name, queue_opts={"auto_delete": True})
    try:
        for i in range(3):
            sq.put({"i": i})
        assert sq.qsize() == 3
        message = sq.get(block=True, timeout=TIMEOUT)
        assert message.payload == {"i": 0}
        message.ack()
        message = sq.get(block=True, timeout=TIMEOUT)
        assert message.payload == {"i": 1}
        message.requeue()
        # the SimpleQueue consumer has no prefetch limit, so {"i": 2} may already be buffered
        # client-side ahead of the requeued {"i": 1}
        rest = [sq.get(block=True, timeout=TIMEOUT) for _ in range(2)]
        assert sorted((m.payload["i"], m.delivery_info["redelivered"]) for m in rest) == [
            (1, True), (2, False)]
        for m in rest:
            m.ack()
        assert sq.clear() == 0
        with pytest.raises(sq.Empty):
            sq.get(block=True, timeout=0.3)
    finally:
        sq.close()


def test_simple_buffer_no_ack(kconn):
    sb = kconn.SimpleBuffer(unique("buf"), queue_opts={"auto_delete": True})
    try:
        sb.put("x")
        assert sb.get(timeout=TIMEOUT).payload == "x"
        assert sb.qsize() == 0
    finally:
        sb.close()


def test_queue_declare_counts_and_passive(kconn):
    name = unique("kq")
    with kconn.channel() as ch:
        q = Queue(name, durable=False, auto_delete=True)(ch)
        assert q.declare() == name
        Producer(ch).publish("a", routing_key=name, serializer="json")
        Producer(ch).publish("b", routing_key=name, serializer="json")
        result = q.queue_declare(passive=True)
        assert (result.queue, result.message_count, result.consumer_count) == (name, 2, 0)
        assert q.purge() == 2
        q.delete()


def test_passive_missing_queue_is_not_found(kconn):
    with kconn.channel() as ch:
        q = Queue(unique("missing"))(ch)
        with pytest.raises(amqp.exceptions.NotFound) as info:
            q.queue_declare(passive=True)
        assert "no queue" in str(info.value)


def test_exchange_redeclare_other_type_is_precondition_failed(kconn):
    name = unique("kx")
    with kconn.channel() as ch:
        Exchange(name, "direct", auto_delete=True)(ch).declare()
    with kconn.channel() as ch:
        with pytest.raises(amqp.exceptions.PreconditionFailed) as info:
            Exchange(name, "fanout", auto_delete=True)(ch).declare()
        assert "inequivalent arg 'type'" in str(info.value)
    with kconn.channel() as ch:
        Exchange(name)(ch).delete()


def test_prefetch_and_reject(kconn):
    name = unique("kq")
    q = Queue(name, auto_delete=True)
    with kconn.channel() as ch:
        q(ch).declare()
        producer = Producer(ch)
        for i in range(5):
            producer.publish(i, routing_key=name, serializer="json")
        got = []
        consumer = Consumer(ch, queues=[q], callbacks=[lambda body, message: got.append(message)],
                            accept=["json"])
        consumer.qos(prefetch_count=2)
        with consumer:
            _drain(kconn, got, 2)
            try:
                kconn.drain_events(timeout=0.3)
            except TimeoutError:
                pass
            assert len(got) == 2
            got[0].reject(requeue=True)
            got[1].ack()
            _drain(kconn, got, 3)
            while len(got) < 6:  # ack as they come; never more than 2 unacknowledged
                assert sum(not m.acknowledged for m in got) <= 2
                for m in got:
                    if not m.acknowledged:
                        m.ack()
                before = len(got)
                _drain(kconn, got, before + 1, timeout=2)
                assert len(got) > before
            assert [m.payload for m in got[:2]] == [0, 1]
            assert sorted(m.payload for m in got[2:]) == [0, 2, 3, 4]
            assert [m.delivery_info["redelivered"] for m in got if m.payload == 0] == [False, True]


def test_publisher_confirms(server):
    conn = Connection(_url(server), transport_options={"confirm_publish": True}, connect_timeout=TIMEOUT)
    try:
        name = unique("confirmed")
        q = Queue(name, auto_delete=True)
        with conn.channel() as ch:
            q(ch).declare()
            producer = Producer(ch)
            for i in range(10):
                producer.publish(i, routing_key=name, serializer="json")
            assert q(ch).queue_declare(passive=True).message_count == 10
            q(ch).delete()
    finally:
        conn.release()


@pytest.mark.parametrize("serializer", ["json", "pickle", "msgpack"])
def test_serializers_and_headers(kconn, serializer):
    name = unique("ser")
    payload = {"text": "héllo", "n": [1, 2, 3], "nested": {"ok": True}}
    with kconn.channel() as ch:
        Queue(name, auto_delete=True)(ch).declare()
        Producer(ch).publish(payload, routing_key=name, serializer=serializer,
                             headers={"task": "t1", "retries": 3, "eta": None})
        message = Queue(name)(ch).get(no_ack=True, accept=[serializer])
        assert message.decode() == payload
        assert message.headers == {"task": "t1", "retries": 3, "eta": None}
        assert message.content_type == kombu.serialization.registry._encoders[serializer].content_type
        Queue(name)(ch).delete()


def test_consumer_cancel(kconn):
    name = unique("kq")
    q = Queue(name, auto_delete=False)
    with kconn.channel() as ch:
        q(ch).declare()
        got = []
        consumer = Consumer(ch, queues=[q], callbacks=[lambda b, m: (got.append(b), m.ack())],
                            accept=["json"])
        consumer.consume()
        Producer(ch).publish("one", routing_key=name, serializer="json")
        _drain(kconn, got, 1)
        consumer.cancel()
        Producer(ch).publish("two", routing_key=name, serializer="json")
        try:
            kconn.drain_events(timeout=0.3)
        except TimeoutError:
            pass
        assert got == ["one"]
        assert q(ch).queue_declare(passive=True).message_count == 1
        q(ch).delete()


def test_exchange_to_exchange_and_bindings(kconn):
    src = Exchange(unique("src"), "topic")
    dst = Exchange(unique("dst"), "fanout", auto_delete=True)
    q = Queue("", dst, exclusive=True)
    with kconn.channel() as ch:
        bsrc, bdst = src(ch), dst(ch)
        bsrc.declare()
        bdst.declare()
        bq = q(ch)
        bq.declare()
        bdst.bind_to(bsrc, routing_key="a.#")
        Producer(ch).publish("via", exchange=src, routing_key="a.b", serializer="json")
        assert bq.get(no_ack=True).decode() == "via"
        bdst.unbind_from(bsrc, routing_key="a.#")
        Producer(ch).publish("gone", exchange=src, routing_key="a.b", serializer="json")
        assert bq.get(no_ack=True) is None
        bsrc.delete()
