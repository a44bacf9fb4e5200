"""Queues through pika: declare flags and counts, server-named queues, equivalence errors, exclusive
and auto-delete lifecycles, purge and delete with RabbitMQ's errors, idempotent delete/unbind."""

from __future__ import annotations

import pika.exceptions
import pytest

from .helpers import connect, get_all, refused, temp_queue, unique, wait_for

LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{}' in vhost '/'. It could be "
          "originally declared on another connection or the exclusive property value does not match that "
          "of the original declaration.")


def test_server_named_queue(ch):
    ok = ch.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-") and len(ok.queue) > len("amq.gen-")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    assert ch.queue_declare("", exclusive=True).method.queue != ok.queue


def test_declare_ok_counts(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_consume(q, lambda *a: None)  # prefetch 0: the consumer takes all three
    other = conn.channel()
    ok = other.queue_declare(q, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 1)
    other.queue_declare(unique(), auto_delete=True)  # unrelated
    ch2 = connect(conn._impl.params.port)
    try:
        c2 = ch2.channel()
        c2.basic_publish("", q, b"more")
        ok = c2.queue_declare(q, auto_delete=True).method  # non-passive redeclare also reports counts
        assert ok.consumer_count == 1
    finally:
        ch2.close()


def test_declare_ok_message_count_of_ready_messages(ch):
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    ch.confirm_delivery()  # publishes are enqueued once confirmed
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (5, 0)
    ch.basic_get(q, auto_ack=False)
    assert ch.queue_declare(q, passive=True).method.message_count == 4  # unacked are not counted
    ch.queue_delete(q)


def test_durable_queue(ch):
    q = unique("durable")
    ch.queue_declare(q, durable=True)
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"kept")
    assert ch.queue_delete(q).method.message_count == 1


def test_passive_declare_missing_is_404(ch):
    q = unique("missing")
    with refused(404, f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_declare(q, passive=True)


def test_passive_declare_missing_literal_q(ch):
    ch.queue_delete("q")
    with refused(404, "NOT_FOUND - no queue 'q' in vhost '/'"):
        ch.queue_declare("q", passive=True)


def test_inequivalent_durable_is_406(conn):
    q = unique()
    conn.channel().queue_declare(q, durable=True)
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': "
                      "received 'false' but current is 'true'"):
        conn.channel().queue_declare(q, durable=False)
    conn.channel().queue_delete(q)


def test_inequivalent_auto_delete_is_406(conn):
    q = unique()
    conn.channel().queue_declare(q, auto_delete=True)
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{q}' in vhost "
                      "'/': received 'false' but current is 'true'"):
        conn.channel().queue_declare(q, auto_delete=False)
    conn.channel().queue_delete(q)


def test_inequivalent_x_argument_is_406(conn):
    q = unique()
    conn.channel().queue_declare(q, arguments={"x-max-length": 10})
    with refused(406) as r:
        conn.channel().queue_declare(q, arguments={"x-max-length": 20})
    assert r.text.startswith(f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' "
                             "in vhost '/': received ")
    with refused(406):
        conn.channel().queue_declare(q)
    conn.channel().queue_delete(q)


def test_missing_queue_type_equals_classic(ch):
    q = unique()
    ch.queue_declare(q, auto_delete=True, arguments={"x-queue-type": "classic"})
    ch.queue_declare(q, auto_delete=True)
    ch.queue_delete(q)


def test_non_equivalence_arguments_may_differ(ch):
    q = unique()
    ch.queue_declare(q, auto_delete=True, arguments={"x-custom": 1})
    ch.queue_declare(q, auto_delete=True, arguments={"x-custom": 2})
    ch.queue_delete(q)


def test_reserved_queue_name_is_403(ch):
    with refused(403, "ACCESS_REFUSED - queue name 'amq.x' contains reserved prefix 'amq.*'"):
        ch.queue_declare("amq.x")


def test_passive_declare_of_amq_name_is_allowed(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert ch.queue_declare(q, passive=True).method.queue == q


def test_exclusive_queue_from_another_connection_is_405(server, conn):
    ch = conn.channel()
    q = unique("excl")
    ch.queue_declare(q, exclusive=True)
    other = connect(server.amqp_port)
    try:
        for op in ("declare", "passive", "consume", "get", "purge", "delete", "bind"):
            c = other.channel()
            with refused(405, LOCKED.format(q)):
                if op == "declare":
                    c.queue_declare(q, exclusive=True)
                elif op == "passive":
                    c.queue_declare(q, passive=True)
                elif op == "consume":
                    c.basic_consume(q, lambda *a: None)
                elif op == "get":
                    c.basic_get(q)
                elif op == "purge":
                    c.queue_purge(q)
                elif op == "delete":
                    c.queue_delete(q)
                else:
                    c.queue_bind(q, "amq.direct", "k")
        # publishing to it is allowed from anywhere
        c = other.channel()
        c.basic_publish("", q, b"from elsewhere")
        c.queue_declare("", exclusive=True)
    finally:
        other.close()
    assert get_all(ch, q) == [b"from elsewhere"]


def test_exclusive_flag_mismatch_is_405(conn):
    q = unique()
    conn.channel().queue_declare(q, auto_delete=True)
    with refused(405, LOCKED.format(q)):
        conn.channel().queue_declare(q, auto_delete=True, exclusive=True)
    conn.channel().queue_delete(q)


def test_exclusive_queue_deleted_when_connection_closes(server):
    q = unique("excl")
    owner = connect(server.amqp_port)
    owner.channel().queue_declare(q, exclusive=True)
    assert not _queue_missing(server, q)
    owner.close()
    assert wait_for(lambda: _queue_missing(server, q), 5)


def _queue_missing(server, name: str) -> bool:
    """True when a passive declare from a new connection says 404 (405 means it exists, exclusive)."""
    conn = connect(server.amqp_port)
    try:
        conn.channel().queue_declare(name, passive=True)
        return False
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code == 404
    finally:
        if conn.is_open:
            conn.close()


def test_exclusive_queue_deleted_when_connection_drops(server):
    q = unique("excl")
    owner = connect(server.amqp_port)
    owner.channel().queue_declare(q, exclusive=True)
    assert not _queue_missing(server, q)
    owner._impl._transport._sock.close()  # the TCP connection dies without connection.close
    assert wait_for(lambda: _queue_missing(server, q), 5)


def test_auto_delete_queue_deleted_after_last_consumer_cancels(conn):
    ch = conn.channel()
    q = unique("ad")
    ch.queue_declare(q, auto_delete=True)
    ch.queue_declare(q, passive=True)  # never consumed: stays
    tag1 = ch.basic_consume(q, lambda *a: None)
    tag2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag1)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    ch.basic_cancel(tag2)
    with refused(404):
        ch.queue_declare(q, passive=True)


def test_auto_delete_queue_deleted_when_consumer_channel_closes(conn):
    q = unique("ad")
    consumer_ch = conn.channel()
    consumer_ch.queue_declare(q, auto_delete=True)
    consumer_ch.basic_consume(q, lambda *a: None)
    consumer_ch.close()
    with refused(404):
        conn.channel().queue_declare(q, passive=True)


def test_purge(ch):
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_purge(q).method.message_count == 4
    assert ch.queue_purge(q).method.message_count == 0
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)


def test_purge_keeps_unacked(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"unacked")
    ch.basic_publish("", q, b"ready")
    method, _p, _b = ch.basic_get(q, auto_ack=False)
    assert ch.queue_purge(q).method.message_count == 1
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert get_all(ch, q) == [b"unacked"]
    ch.queue_delete(q)


def test_purge_missing_is_404(ch):
    q = unique("missing")
    with refused(404, f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_purge(q)


def test_delete_returns_message_count(ch):
    q = unique()
    ch.queue_declare(q)
    for _ in range(3):
        ch.basic_publish("", q, b"x")
    assert ch.queue_delete(q).method.message_count == 3
    with refused(404):
        ch.queue_declare(q, passive=True)


def test_delete_if_unused_is_406(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    tag = ch.basic_consume(q, lambda *a: None)
    with refused(406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use"):
        conn.channel().queue_delete(q, if_unused=True)
    ch.basic_cancel(tag)
    ch.queue_delete(q, if_unused=True)


def test_delete_if_empty_is_406(conn):
    ch = conn.channel()
    q = unique()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x")
    with refused(406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty"):
        conn.channel().queue_delete(q, if_empty=True)
    ch.queue_purge(q)
    ch.queue_delete(q, if_empty=True)


def test_delete_missing_is_ok(ch):
    assert ch.queue_delete(unique("missing")).method.message_count == 0
    assert ch.is_open


def test_unbind_missing_is_ok(ch):
    q = temp_queue(ch)
    ch.queue_unbind(q, "amq.direct", "never-bound")
    ch.queue_unbind(unique("missing"), "amq.direct", "k")
    ch.queue_unbind(q, unique("missing-x"), "k")
    assert ch.is_open


def test_bind_missing_queue_is_404(ch):
    q = unique("missing")
    with refused(404, f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_bind(q, "amq.direct", "k")


def test_unbind_stops_routing(ch):
    q = temp_queue(ch)
    ch.queue_bind(q, "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.b", b"1")
    ch.queue_unbind(q, "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.b", b"2")
    assert get_all(ch, q) == [b"1"]


def test_deleted_queue_bindings_are_gone(ch):
    q = unique()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.fanout")
    ch.queue_delete(q)
    ch.queue_declare(q)
    ch.basic_publish("amq.fanout", "", b"not for the new queue")
    assert get_all(ch, q) == []
    ch.queue_delete(q)


def test_empty_name_means_last_declared_queue(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind("", "amq.direct", "to-last")
    ch.basic_publish("amq.direct", "to-last", b"x")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    assert ch.queue_purge("").method.message_count == 1


def test_empty_name_without_declared_queue_is_404(conn):
    with refused(404, "NOT_FOUND - no previously declared queue"):
        conn.channel().basic_get("")


def test_long_queue_name(ch):
    q = ("long-" + unique())[:5] + "x" * 250
    assert len(q) == 255
    assert ch.queue_declare(q, auto_delete=True).method.queue == q
    ch.queue_delete(q)


@pytest.mark.parametrize("count", [200])
def test_many_queues_and_bindings(ch, count):
    x = unique("x")
    ch.exchange_declare(x, "topic", auto_delete=True)
    queues = [temp_queue(ch) for _ in range(count)]
    for i, q in enumerate(queues):
        ch.queue_bind(q, x, f"k.{i % 10}")
    ch.basic_publish(x, "k.3", b"m")
    hits = [q for q in queues if ch.queue_declare(q, passive=True).method.message_count == 1]
    assert len(hits) == count // 10


def test_exclusive_queue_survives_its_channel(conn):
    ch = conn.channel()
    q = unique("excl")
    ch.queue_declare(q, exclusive=True)
    ch.close()
    other = conn.channel()
    assert other.queue_declare(q, passive=True).method.queue == q  # owned by the connection
    other.queue_delete(q)
