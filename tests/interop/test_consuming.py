"""Consuming through pika: ordering, round robin, prefetch (per consumer and global), acks, nacks,
rejects and requeue position, basic.get, basic.recover, exclusive consumers, consumer priorities,
cancellation (client and broker), requeue on channel/connection close, delivery-tag errors."""

from __future__ import annotations

from typing import Any

import pika

from hutch.amqp import spec

from .helpers import connect, drain, get_all, raw_session, refused, settle, temp_queue, unique


class Sink:
    """Collects deliveries of one consumer: (delivery_tag, redelivered, body)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, bool, bytes]] = []

    def __call__(self, _ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.items.append((method.delivery_tag, method.redelivered, body))

    def __len__(self) -> int:
        return len(self.items)

    @property
    def bodies(self) -> list[bytes]:
        return [b for _t, _r, b in self.items]


def _publish(ch: Any, q: str, n: int, prefix: str = "") -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    for body in bodies:
        ch.basic_publish("", q, body)
    return bodies


def test_fifo_order(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    bodies = _publish(ch, q, 100)
    sink = Sink()
    ch.basic_consume(q, sink, auto_ack=True)
    drain(conn, sink.items, 100)
    assert sink.bodies == bodies
    assert not any(r for _t, r, _b in sink.items)
    assert [t for t, _r, _b in sink.items] == list(range(1, 101))


def test_round_robin_across_two_consumers(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    a, b = Sink(), Sink()
    ch.basic_consume(q, a, auto_ack=True)
    ch.basic_consume(q, b, auto_ack=True)
    bodies = _publish(ch, q, 10)
    drain(conn, a.items, 5)
    drain(conn, b.items, 5)
    settle(conn)
    assert sorted(a.bodies + b.bodies) == sorted(bodies)
    assert (len(a), len(b)) == (5, 5)
    assert {a.bodies[0], b.bodies[0]} == {b"0", b"1"}
    assert a.bodies in ([b"0", b"2", b"4", b"6", b"8"], [b"1", b"3", b"5", b"7", b"9"])


def test_round_robin_across_connections(server):
    conns = [connect(server.amqp_port) for _ in range(3)]
    try:
        q = unique()
        conns[0].channel().queue_declare(q, auto_delete=True)
        sinks = []
        for c in conns:
            s = Sink()
            c.channel().basic_consume(q, s, auto_ack=True)
            sinks.append(s)
        pub = conns[0].channel()
        _publish(pub, q, 30)
        for c, s in zip(conns, sinks, strict=True):
            drain(c, s.items, 10)
        assert [len(s) for s in sinks] == [10, 10, 10]
    finally:
        for c in conns:
            c.close()


def test_per_consumer_prefetch(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_qos(prefetch_count=3)
    _publish(ch, q, 10)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 3)
    settle(conn, 0.3)
    assert len(sink) == 3
    acked = 0
    while acked < 10:  # ack one at a time: each ack releases exactly one more delivery
        tag = sink.items[acked][0]
        ch.basic_ack(tag)
        acked += 1
        drain(conn, sink.items, min(acked + 3, 10))
        settle(conn, 0.05)
        assert len(sink) - acked <= 3
    assert sink.bodies == [str(i).encode() for i in range(10)]


def test_prefetch_is_per_consumer_on_one_channel(conn):
    ch = conn.channel()
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_qos(prefetch_count=2)
    _publish(ch, q1, 5)
    _publish(ch, q2, 5)
    s1, s2 = Sink(), Sink()
    ch.basic_consume(q1, s1)
    ch.basic_consume(q2, s2)
    drain(conn, s1.items, 2)
    drain(conn, s2.items, 2)
    settle(conn, 0.3)
    assert (len(s1), len(s2)) == (2, 2)


def test_global_prefetch_is_channel_wide(conn):
    ch = conn.channel()
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    _publish(ch, q1, 5)
    _publish(ch, q2, 5)
    s1, s2 = Sink(), Sink()
    ch.basic_consume(q1, s1)
    ch.basic_consume(q2, s2)
    settle(conn, 0.4)
    assert len(s1) + len(s2) == 3
    ch.basic_ack(0, multiple=True)
    settle(conn, 0.4)
    assert len(s1) + len(s2) == 6


def test_global_and_per_consumer_prefetch_together(conn):
    ch = conn.channel()
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_qos(prefetch_count=2)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    _publish(ch, q1, 5)
    _publish(ch, q2, 5)
    s1, s2 = Sink(), Sink()
    ch.basic_consume(q1, s1)
    settle(conn, 0.2)
    assert len(s1) == 2  # the per-consumer limit
    ch.basic_consume(q2, s2)
    settle(conn, 0.3)
    assert (len(s1), len(s2)) == (2, 1)  # the channel-wide limit


def test_prefetch_does_not_limit_no_ack_consumers(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_qos(prefetch_count=1)
    _publish(ch, q, 20)
    sink = Sink()
    ch.basic_consume(q, sink, auto_ack=True)
    drain(conn, sink.items, 20)
    assert len(sink) == 20


def test_no_ack_consumer_leaves_nothing_to_requeue(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q, auto_delete=False)
    _publish(ch, q, 5)
    sink = Sink()
    ch.basic_consume(q, sink, auto_ack=True)
    drain(conn, sink.items, 5)
    ch.close()
    ch2 = conn.channel()
    assert ch2.queue_declare(q, passive=True).method.message_count == 0
    ch2.queue_delete(q)


def test_manual_ack_removes_messages(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 3)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 3)
    for tag, _r, _b in sink.items:
        ch.basic_ack(tag)
    ch.close()
    ch2 = conn.channel()
    assert ch2.queue_delete(q).method.message_count == 0


def test_ack_multiple(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 5)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 5)
    ch.basic_ack(sink.items[2][0], multiple=True)  # tags 1..3
    ch.close()
    ch2 = conn.channel()
    assert get_all(ch2, q) == [b"3", b"4"]
    ch2.queue_delete(q)


def test_ack_multiple_zero_acks_everything(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 4)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 4)
    ch.basic_ack(0, multiple=True)
    ch.close()
    ch2 = conn.channel()
    assert ch2.queue_delete(q).method.message_count == 0


def test_nack_multiple_requeue(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_qos(prefetch_count=5)
    _publish(ch, q, 5)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 5)
    ch.basic_nack(sink.items[-1][0], multiple=True, requeue=True)
    drain(conn, sink.items, 10)
    redelivered = sink.items[5:]
    assert [b for _t, _r, b in redelivered] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(r for _t, r, _b in redelivered)
    assert not any(r for _t, r, _b in sink.items[:5])


def test_nack_without_requeue_drops(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 3)
    method, _p, _b = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=False)
    assert get_all(ch, q) == [b"1", b"2"]


def test_reject_requeue_returns_to_original_position(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 4)  # 0 1 2 3
    first, _p, _b = ch.basic_get(q)
    second, _p, _b = ch.basic_get(q)
    ch.basic_reject(second.delivery_tag, requeue=True)  # 1 goes back before 2
    ch.basic_reject(first.delivery_tag, requeue=True)  # 0 goes back before 1
    got = []
    while True:
        method, _props, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    assert got == [(b"0", True), (b"1", True), (b"2", False), (b"3", False)]


def test_reject_requeue_to_consumer_keeps_order(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_qos(prefetch_count=1)
    _publish(ch, q, 3)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 1)
    ch.basic_reject(sink.items[0][0], requeue=True)
    drain(conn, sink.items, 2)
    assert sink.items[1][1:] == (True, b"0")
    ch.basic_ack(sink.items[1][0])
    drain(conn, sink.items, 3)
    assert sink.items[2][1:] == (False, b"1")


def test_basic_get_and_get_empty(ch):
    q = temp_queue(ch)
    method, props, body = ch.basic_get(q)
    assert (method, props, body) == (None, None, None)
    _publish(ch, q, 3)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.message_count, method.redelivered, method.routing_key) == (b"0", 2, False, q)
    method, _props, body = ch.basic_get(q, auto_ack=False)
    assert (body, method.message_count) == (b"1", 1)
    ch.basic_ack(method.delivery_tag)


def test_basic_get_unacked_requeued_on_channel_close(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 2)
    ch.basic_get(q)
    ch.close()
    ch2 = conn.channel()
    method, _p, body = ch2.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)
    ch2.queue_delete(q)


def test_basic_recover_requeue(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 3)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 3)
    ch.basic_recover(requeue=True)
    drain(conn, sink.items, 6)
    assert [(r, b) for _t, r, b in sink.items[3:]] == [(True, b"0"), (True, b"1"), (True, b"2")]
    assert len({t for t, _r, _b in sink.items}) == 6  # new delivery tags


def test_basic_recover_without_requeue_is_540(conn):
    ch = conn.channel()
    with refused(540, connection=True):
        ch.basic_recover(requeue=False)


def test_exclusive_consumer_blocks_others(server, conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    other = connect(server.amqp_port)
    try:
        with refused(403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"):
            other.channel().basic_consume(q, lambda *a: None)
    finally:
        other.close()


def test_exclusive_consume_on_queue_with_consumers_is_403(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_consume(q, lambda *a: None)
    with refused(403):
        conn.channel().basic_consume(q, lambda *a: None, exclusive=True)


def test_consumer_priorities(server):
    high_conn, low_conn = connect(server.amqp_port), connect(server.amqp_port)
    try:
        high, low = high_conn.channel(), low_conn.channel()
        q = unique()
        high.queue_declare(q, auto_delete=True)
        high.basic_qos(prefetch_count=5)
        hs, ls = Sink(), Sink()
        low.basic_consume(q, ls, arguments={"x-priority": 0})
        high.basic_consume(q, hs, arguments={"x-priority": 10})
        _publish(low, q, 8)
        drain(high_conn, hs.items, 5)
        drain(low_conn, ls.items, 3)
        settle(high_conn, 0.1)
        assert (hs.bodies, ls.bodies) == ([b"0", b"1", b"2", b"3", b"4"], [b"5", b"6", b"7"])
    finally:
        high_conn.close()
        low_conn.close()


def test_invalid_consumer_priority_is_406(ch):
    q = temp_queue(ch)
    with refused(406):
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})


def test_cancel_by_client(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    sink = Sink()
    tag = ch.basic_consume(q, sink, auto_ack=True)
    ch.basic_publish("", q, b"before")
    drain(conn, sink.items, 1)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"after")
    settle(conn, 0.2)
    assert sink.bodies == [b"before"]
    assert ch.queue_declare(q, passive=True).method.consumer_count == 0
    assert get_all(ch, q) == [b"after"]


def test_cancel_unknown_tag_is_ok(server):
    with raw_session(server.amqp_port) as raw:
        ok = raw.rpc(1, spec.Basic.Cancel(consumer_tag="never-used"), spec.Basic.CancelOk)
        assert ok.consumer_tag == "never-used"


def test_broker_cancels_consumer_when_queue_deleted(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    cancels = []
    ch.add_on_cancel_callback(cancels.append)
    tag = ch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    drain(conn, cancels, 1)
    assert len(cancels) == 1
    assert cancels[0].method.consumer_tag == tag
    assert ch.is_open and ch.consumer_tags == []


def test_broker_cancel_not_sent_without_capability(server):
    with raw_session(server.amqp_port, capabilities={"consumer_cancel_notify": False}) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        raw.rpc(1, spec.Basic.Consume(queue=q, consumer_tag="c1"), spec.Basic.ConsumeOk)
        raw.rpc(1, spec.Queue.Delete(queue=q), spec.Queue.DeleteOk)
        ok = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
        assert ok.queue.startswith("amq.gen-")  # no basic.cancel came in between


def test_generated_consumer_tag(server):
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        ok = raw.rpc(1, spec.Basic.Consume(queue=q, consumer_tag=""), spec.Basic.ConsumeOk)
        assert ok.consumer_tag.startswith("amq.ctag-")


def test_reused_consumer_tag_is_530(server):
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        raw.rpc(1, spec.Basic.Consume(queue=q, consumer_tag="dup"), spec.Basic.ConsumeOk)
        raw.send_method(1, spec.Basic.Consume(queue=q, consumer_tag="dup"))
        close = raw.expect_connection_close(530)
        assert "reuse consumer tag 'dup'" in close.reply_text


def test_consume_missing_queue_is_404(ch):
    q = unique("missing")
    with refused(404, f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.basic_consume(q, lambda *a: None)


def test_unacked_requeued_when_channel_closes(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 4)
    sink = Sink()
    ch.basic_consume(q, sink)
    drain(conn, sink.items, 4)
    ch.basic_ack(sink.items[1][0])  # "1" is done
    ch.close()
    ch2 = conn.channel()
    got = []
    while True:
        method, _props, body = ch2.basic_get(q, auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    assert got == [(b"0", True), (b"2", True), (b"3", True)]
    ch2.queue_delete(q)


def test_unacked_requeued_when_connection_closes(server, conn):
    q = unique()
    conn.channel().queue_declare(q)
    consumer = connect(server.amqp_port)
    ch = consumer.channel()
    sink = Sink()
    ch.basic_consume(q, sink)
    _publish(conn.channel(), q, 3)
    drain(consumer, sink.items, 3)
    consumer.close()
    ch2 = conn.channel()
    method, _p, body = ch2.basic_get(q, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"0", True, 2)
    ch2.queue_delete(q)


def test_unacked_requeued_to_other_consumer(server, conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    waiting = Sink()
    ch.basic_qos(prefetch_count=10)
    first = connect(server.amqp_port)
    fch = first.channel()
    fch.basic_qos(prefetch_count=10)
    taken = Sink()
    fch.basic_consume(q, taken)
    _publish(ch, q, 3)
    drain(first, taken.items, 3)
    ch.basic_consume(q, waiting)
    first.close()
    drain(conn, waiting.items, 3)
    assert [(r, b) for _t, r, b in waiting.items] == [(True, b"0"), (True, b"1"), (True, b"2")]


def test_unknown_delivery_tag_is_406(ch):
    with refused(406, "PRECONDITION_FAILED - unknown delivery tag 99"):
        ch.basic_ack(99)
        ch.queue_declare("", exclusive=True)


def test_double_ack_is_406(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 1)
    method, _p, _b = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    with refused(406, f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"):
        ch.basic_ack(method.delivery_tag)
        ch.queue_declare("", exclusive=True)


def test_ack_of_no_ack_delivery_is_406(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 1)
    method, _p, _b = ch.basic_get(q, auto_ack=True)
    with refused(406):
        ch.basic_ack(method.delivery_tag)
        ch.queue_declare("", exclusive=True)


def test_reject_unknown_tag_is_406(ch):
    with refused(406, "PRECONDITION_FAILED - unknown delivery tag 7"):
        ch.basic_reject(7)
        ch.queue_declare("", exclusive=True)


def test_qos_prefetch_size_is_540(ch):
    with refused(540, connection=True) as r:
        ch.basic_qos(prefetch_size=10)
    assert r.text == "NOT_IMPLEMENTED - prefetch_size!=0 (10)"


def test_deliveries_carry_properties(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    props = pika.BasicProperties(content_type="text/plain", delivery_mode=2, priority=3,
                                 correlation_id="c1", message_id="m1", app_id="tests", type="t",
                                 timestamp=1700000000, headers={"h": "v"})
    ch.basic_publish("", q, b"p", props)
    received = []
    ch.basic_consume(q, lambda _c, m, p, b: received.append((m, p, b)), auto_ack=True)
    drain(conn, received, 1)
    method, got, body = received[0]
    assert (method.exchange, method.routing_key, body) == ("", q, b"p")
    for name in ("content_type", "delivery_mode", "priority", "correlation_id", "message_id", "app_id",
                 "type", "timestamp", "headers"):
        assert getattr(got, name) == getattr(props, name), name


def test_settling_deliveries_of_a_deleted_queue(conn):
    ch, admin = conn.channel(), conn.channel()
    q = unique()
    ch.queue_declare(q)
    _publish(ch, q, 3)
    m1 = ch.basic_get(q)[0]
    m2 = ch.basic_get(q)[0]
    assert admin.queue_delete(q).method.message_count == 1
    admin.queue_declare(q)  # a new queue with the same name
    ch.basic_ack(m1.delivery_tag)  # fine: RabbitMQ accepts settling deliveries of a deleted queue
    ch.basic_nack(m2.delivery_tag, requeue=True)  # must not land in the new queue
    ch.close()
    assert admin.queue_declare(q, passive=True).method.message_count == 0
    admin.queue_delete(q)


def test_nack_all_with_tag_zero(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    _publish(ch, q, 3)
    for _ in range(3):
        ch.basic_get(q)
    ch.basic_nack(0, multiple=True, requeue=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 3
    ch.basic_ack(0, multiple=True)  # nothing outstanding: not an error
    assert [b for b in (ch.basic_get(q, auto_ack=True)[2] for _ in range(3))] == [b"0", b"1", b"2"]


def test_channel_flow(conn):
    ch = conn.channel()
    assert ch.flow(True) is True
    with refused(540, "NOT_IMPLEMENTED - active=false", connection=True):
        ch.flow(False)


def test_large_backlog_is_delivered_completely(conn):
    """20 MB queued, then consumed: deliveries pause on the socket's back-pressure and resume."""
    ch = conn.channel()
    q = temp_queue(ch)
    body = b"z" * 100_000
    for _ in range(200):
        ch.basic_publish("", q, body)
    sink = Sink()
    ch.basic_consume(q, sink, auto_ack=True)
    drain(conn, sink.items, 200, timeout=30)
    assert len(sink) == 200 and all(b == body for b in sink.bodies)


def test_get_from_queue_with_consumer(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_qos(prefetch_count=1)
    sink = Sink()
    ch.basic_consume(q, sink)
    _publish(ch, q, 2)
    drain(conn, sink.items, 1)
    method, _p, body = ch.basic_get(q, auto_ack=True)  # the message the consumer cannot take yet
    assert (body, method.message_count) == (b"1", 0)


def test_many_publishers_and_consumers(server):
    """4 confirming publishers and 3 acking consumers on separate connections: every message is
    delivered exactly once (no loss, no duplicate) and per-publisher order holds per consumer."""
    import threading

    q = unique("busy")
    setup = connect(server.amqp_port)
    setup.channel().queue_declare(q)
    per_publisher, publishers = 500, 4
    received: list[bytes] = []
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            c = connect(server.amqp_port)
            ch = c.channel()
            ch.basic_qos(prefetch_count=50)
            seen: list[bytes] = []

            def on_message(channel, method, _props, body):
                seen.append(body)
                channel.basic_ack(method.delivery_tag)
                with lock:
                    received.append(body)
                    if len(received) == per_publisher * publishers:
                        done.set()

            ch.basic_consume(q, on_message)
            while not done.is_set():
                c.process_data_events(time_limit=0.05)
            for p in range(publishers):
                mine = [int(b.split(b":")[1]) for b in seen if b.startswith(b"%d:" % p)]
                assert mine == sorted(mine), f"publisher {p} out of order at one consumer"
            c.close()
        except BaseException as exc:
            errors.append(exc)
            done.set()

    def publish(p: int) -> None:
        try:
            c = connect(server.amqp_port)
            ch = c.channel()
            ch.confirm_delivery()
            for i in range(per_publisher):
                ch.basic_publish("", q, b"%d:%d" % (p, i))
            c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    threads += [threading.Thread(target=publish, args=(p,)) for p in range(publishers)]
    for t in threads:
        t.start()
    done.wait(60)
    for t in threads:
        t.join(30)
    try:
        assert not errors, errors
        assert len(received) == per_publisher * publishers
        assert len(set(received)) == len(received)
        assert setup.channel().queue_delete(q).method.message_count == 0
    finally:
        setup.close()
