"""Exchanges through pika: the four types and the default exchange, built-ins, exchange-to-exchange
bindings, alternate and internal exchanges, auto-delete, and RabbitMQ's errors for declare/delete."""

from __future__ import annotations

import pika
import pytest

from .helpers import connect, get_all, refused, temp_queue, unique

BUILTINS = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
            "amq.headers": "headers", "amq.match": "headers"}


def test_default_exchange_routes_by_queue_name(ch):
    q = unique()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"one")
    ch.basic_publish("", unique("nobody"), b"lost")
    assert get_all(ch, q) == [b"one"]
    ch.queue_delete(q)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_exchanges_exist(ch, name):
    ch.exchange_declare(name, BUILTINS[name], passive=True)


@pytest.mark.parametrize(("name", "xtype"), BUILTINS.items())
def test_builtin_exchange_equivalent_redeclare_is_ok(ch, name, xtype):
    # applications commonly "ensure" amq.topic & co exist; RabbitMQ only checks equivalence
    ch.exchange_declare(name, xtype, durable=True)
    assert ch.is_open


@pytest.mark.parametrize(("name", "xtype"), BUILTINS.items())
def test_builtin_exchanges_have_their_type(ch, name, xtype):
    other = "topic" if xtype != "topic" else "direct"
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                      f"received '{other}' but current is '{xtype}'"):
        ch.exchange_declare(name, other, durable=True)


def test_default_exchange_cannot_be_declared(conn):
    for passive in (False, True):
        with refused(403, "ACCESS_REFUSED - operation not permitted on the default exchange"):
            conn.channel().exchange_declare("", "direct", passive=passive)


def test_direct_exchange(ch):
    x = unique("x")
    ch.exchange_declare(x, "direct", auto_delete=True)
    qa, qb = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(qa, x, "a")
    ch.queue_bind(qb, x, "b")
    ch.queue_bind(qb, x, "both")
    ch.queue_bind(qa, x, "both")
    for key in ("a", "b", "both", "none"):
        ch.basic_publish(x, key, key.encode())
    assert get_all(ch, qa) == [b"a", b"both"]
    assert get_all(ch, qb) == [b"b", b"both"]


def test_fanout_exchange_ignores_routing_key(ch):
    x = unique("x")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    queues = [temp_queue(ch) for _ in range(3)]
    for q in queues:
        ch.queue_bind(q, x, "ignored")
    ch.basic_publish(x, "anything", b"m")
    assert [get_all(ch, q) for q in queues] == [[b"m"]] * 3


def test_topic_exchange_wildcards(ch):
    x = unique("x")
    ch.exchange_declare(x, "topic", auto_delete=True)
    patterns = {"star": "stock.*.nyse", "hash": "stock.#", "all": "#", "exact": "stock.usd.nyse",
                "mid": "*.eur.*", "tail": "#.nyse"}
    queues = {}
    for label, pattern in patterns.items():
        queues[label] = temp_queue(ch)
        ch.queue_bind(queues[label], x, pattern)
    keys = ["stock.usd.nyse", "stock.eur.nyse", "stock", "stock.eur.lse.extra", "bond.eur.lse", "nyse", ""]
    for key in keys:
        ch.basic_publish(x, key, key.encode())
    got = {label: [b.decode() for b in get_all(ch, q)] for label, q in queues.items()}
    assert got == {
        "star": ["stock.usd.nyse", "stock.eur.nyse"],
        "hash": ["stock.usd.nyse", "stock.eur.nyse", "stock", "stock.eur.lse.extra"],
        "all": keys,
        "exact": ["stock.usd.nyse"],
        "mid": ["stock.eur.nyse", "bond.eur.lse"],
        "tail": ["stock.usd.nyse", "stock.eur.nyse", "nyse"],
    }


def test_headers_exchange_all_and_any(ch):
    x = unique("x")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q_all, q_any, q_default = temp_queue(ch), temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q_all, x, "", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, x, "", arguments={"x-match": "any", "format": "pdf", "type": "report"})
    ch.queue_bind(q_default, x, "", arguments={"format": "pdf", "type": "report"})  # all by default
    cases = {
        b"both": {"format": "pdf", "type": "report"},
        b"both+extra": {"format": "pdf", "type": "report", "other": 1},
        b"format": {"format": "pdf"},
        b"wrong": {"format": "zip", "type": "log"},
        b"none": None,
    }
    for body, headers in cases.items():
        ch.basic_publish(x, "", body, pika.BasicProperties(headers=headers))
    assert get_all(ch, q_all) == [b"both", b"both+extra"]
    assert get_all(ch, q_default) == [b"both", b"both+extra"]
    assert get_all(ch, q_any) == [b"both", b"both+extra", b"format"]


def test_amq_match_and_amq_headers_route(ch):
    q = temp_queue(ch)
    ch.queue_bind(q, "amq.match", "", arguments={"x-match": "any", "k": "v"})
    ch.basic_publish("amq.match", "", b"hit", pika.BasicProperties(headers={"k": "v"}))
    assert get_all(ch, q) == [b"hit"]


def test_exchange_to_exchange_binding(ch):
    src, dst = unique("src"), unique("dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, dst, "a.b")
    ch.exchange_bind(destination=dst, source=src, routing_key="a.*")
    ch.basic_publish(src, "a.b", b"via e2e")
    ch.basic_publish(src, "a.c", b"dropped at dst")
    assert get_all(ch, q) == [b"via e2e"]
    ch.exchange_unbind(destination=dst, source=src, routing_key="a.*")
    ch.basic_publish(src, "a.b", b"after unbind")
    assert get_all(ch, q) == []
    ch.exchange_delete(src)


def test_auto_delete_source_goes_after_last_exchange_unbind(conn):
    ch = conn.channel()
    src, dst = unique("src"), unique("dst")
    ch.exchange_declare(src, "fanout", auto_delete=True)
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src)
    ch.exchange_unbind(dst, src)
    ch.exchange_declare(dst, "fanout", passive=True)  # the destination is not auto-deleted
    with refused(404):
        ch.exchange_declare(src, "fanout", passive=True)
    conn.channel().exchange_delete(dst)


def test_exchange_binding_cycle_delivers_once(ch):
    a, b = unique("a"), unique("b")
    ch.exchange_declare(a, "fanout", auto_delete=True)
    ch.exchange_declare(b, "fanout", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, a)
    ch.queue_bind(q, b)
    ch.exchange_bind(a, b)
    ch.exchange_bind(b, a)
    ch.basic_publish(a, "", b"once")
    assert get_all(ch, q) == [b"once"]


def test_alternate_exchange(ch):
    x, ae = unique("x"), unique("ae")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(x, "direct", auto_delete=True, arguments={"alternate-exchange": ae})
    routed, unrouted = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(routed, x, "known")
    ch.queue_bind(unrouted, ae)
    ch.basic_publish(x, "known", b"routed")
    ch.basic_publish(x, "unknown", b"to ae")
    assert get_all(ch, routed) == [b"routed"]
    assert get_all(ch, unrouted) == [b"to ae"]


def test_alternate_exchange_missing_is_not_an_error(ch):
    x = unique("x")
    ch.exchange_declare(x, "direct", auto_delete=True, arguments={"alternate-exchange": unique("none")})
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.basic_publish(x, "other", b"dropped")
    ch.basic_publish(x, "k", b"kept")
    assert get_all(ch, q) == [b"kept"]


def test_publishing_to_internal_exchange_is_refused(conn):
    ch = conn.channel()
    x = unique("internal")
    ch.exchange_declare(x, "fanout", internal=True, auto_delete=True)
    with refused(403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'"):
        ch.basic_publish(x, "", b"nope")
        ch.queue_declare("", exclusive=True)  # a round trip to receive the channel close


def test_internal_exchange_receives_via_exchange_binding(ch):
    front, inner = unique("front"), unique("inner")
    ch.exchange_declare(front, "fanout", auto_delete=True)
    ch.exchange_declare(inner, "fanout", internal=True, auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, inner)
    ch.exchange_bind(inner, front)
    ch.basic_publish(front, "", b"through")
    assert get_all(ch, q) == [b"through"]


def test_auto_delete_exchange_goes_after_last_unbind(conn):
    ch = conn.channel()
    x = unique("ad")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k1")
    ch.queue_bind(q, x, "k2")
    ch.queue_unbind(q, x, "k1")
    ch.exchange_declare(x, "direct", passive=True)  # one binding left
    ch.queue_unbind(q, x, "k2")
    with refused(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, "direct", passive=True)


def test_auto_delete_exchange_goes_when_bound_queue_is_deleted(conn):
    ch = conn.channel()
    x = unique("ad")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, x)
    ch.queue_delete(q)
    with refused(404):
        ch.exchange_declare(x, "fanout", passive=True)


def test_auto_delete_exchange_without_bindings_stays(ch):
    x = unique("ad")
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.exchange_declare(x, "direct", passive=True)
    ch.exchange_delete(x)


def test_passive_declare_of_missing_exchange_is_404(ch):
    x = unique("missing")
    with refused(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, "direct", passive=True)


def test_redeclare_with_other_type_is_406(conn):
    ch = conn.channel()
    x = unique("x")
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.exchange_declare(x, "direct", auto_delete=True)  # equivalent: fine
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
                      "received 'fanout' but current is 'direct'"):
        ch.exchange_declare(x, "fanout", auto_delete=True)
    conn.channel().exchange_delete(x)


def test_redeclare_with_other_durability_is_406(conn):
    ch = conn.channel()
    x = unique("x")
    ch.exchange_declare(x, "direct", durable=False)
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{x}' in vhost "
                      "'/': received 'true' but current is 'false'"):
        ch.exchange_declare(x, "direct", durable=True)
    conn.channel().exchange_delete(x)


def test_reserved_exchange_name_is_403(ch):
    with refused(403, "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved prefix 'amq.*'"):
        ch.exchange_declare("amq.custom", "direct")


def test_passive_declare_of_missing_amq_exchange_is_404(ch):
    with refused(404):
        ch.exchange_declare("amq.nosuch", "direct", passive=True)


def test_deleting_builtin_exchange_is_403(ch):
    with refused(403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"):
        ch.exchange_delete("amq.direct")


def test_deleting_default_exchange_is_403(ch):
    with refused(403):
        ch.exchange_delete("")


def test_binding_to_default_exchange_is_403(ch):
    q = temp_queue(ch)
    with refused(403, "ACCESS_REFUSED - operation not permitted on the default exchange"):
        ch.queue_bind(q, "", q)


def test_unknown_exchange_type_is_406(ch):
    with refused(406) as r:
        ch.exchange_declare(unique("x"), "no-such-type")
    assert r.text == "PRECONDITION_FAILED - unknown exchange type 'no-such-type'"


def test_delete_missing_exchange_is_ok(ch):
    ch.exchange_delete(unique("missing"))
    assert ch.is_open


def test_delete_if_unused(conn):
    ch = conn.channel()
    x = unique("x")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    with refused(406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use"):
        ch.exchange_delete(x, if_unused=True)
    ch = conn.channel()
    ch.queue_unbind(q, x, "k")
    ch.exchange_delete(x, if_unused=True)
    with refused(404):
        ch.exchange_declare(x, "direct", passive=True)


def test_deleted_exchange_bindings_are_removed(ch):
    x = unique("x")
    ch.exchange_declare(x, "fanout")
    q = temp_queue(ch)
    ch.queue_bind(q, x)
    ch.exchange_delete(x)
    ch.exchange_declare(x, "fanout")
    ch.basic_publish(x, "", b"not bound any more")
    assert get_all(ch, q) == []
    ch.exchange_delete(x)


def test_bind_to_missing_exchange_is_404(ch):
    q = temp_queue(ch)
    x = unique("missing")
    with refused(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.queue_bind(q, x, "k")


def test_exchange_bind_missing_source_is_404(ch):
    x = unique("x")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    with refused(404):
        ch.exchange_bind(x, unique("missing"))


def test_publish_to_missing_exchange_is_404(ch):
    x = unique("missing")
    with refused(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.basic_publish(x, "k", b"")
        ch.queue_declare("", exclusive=True)


def test_exchange_unbind_missing_is_ok(ch):
    a, b = unique("a"), unique("b")
    ch.exchange_declare(a, "fanout", auto_delete=True)
    ch.exchange_declare(b, "fanout", auto_delete=True)
    ch.exchange_unbind(a, b, "never-bound")
    ch.exchange_unbind(unique("gone"), unique("gone"))
    assert ch.is_open


def test_duplicate_binding_delivers_once(ch):
    q = temp_queue(ch)
    ch.queue_bind(q, "amq.direct", q)
    ch.queue_bind(q, "amq.direct", q)
    ch.basic_publish("amq.direct", q, b"once")
    assert get_all(ch, q) == [b"once"]


def test_durable_exchange_declare_and_passive(server):
    conn = connect(server.amqp_port)
    try:
        ch = conn.channel()
        x = unique("durable")
        ch.exchange_declare(x, "topic", durable=True)
        ch.exchange_declare(x, "topic", passive=True)
        ch.exchange_delete(x)
    finally:
        conn.close()
