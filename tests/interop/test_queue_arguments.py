"""Queue x-arguments through pika against a real node: each argument refused with 406 and a text that
names it and what it allows; arguments of other queue types refused; unknown arguments, valid values and
equivalent redeclarations accepted; consumer x-priority checked on basic.consume."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from hutch.amqp import spec
from hutch.amqp.table import Timestamp, TypedInt

from .helpers import connect, raw_session, refused, unique

LOCATORS = "client-local, balanced, random, least-leaders, min-masters"

# (arguments, argument named in the error, detail after "...in vhost '/': ")
INVALID = [
    ({"x-message-ttl": -1}, "x-message-ttl", "-1 is negative; expected an integer from 0 to 315360000000 (ms)"),
    ({"x-message-ttl": 315_360_000_001}, "x-message-ttl",
     "315360000001 is too large; expected an integer from 0 to 315360000000 (ms)"),
    ({"x-message-ttl": "60000"}, "x-message-ttl",
     "'60000' is a string, not an integer; expected an integer from 0 to 315360000000 (ms)"),
    ({"x-expires": 0}, "x-expires", "0 is too small; expected an integer from 1 to 315360000000 (ms)"),
    ({"x-expires": Decimal("2.5")}, "x-expires",
     "2.5 is a decimal, not an integer; expected an integer from 1 to 315360000000 (ms)"),
    ({"x-max-length": -1}, "x-max-length", "-1 is negative; expected an integer >= 0"),
    ({"x-max-length": True}, "x-max-length", "true is a boolean, not an integer; expected an integer >= 0"),
    ({"x-max-length": None}, "x-max-length", "no value (void); expected an integer >= 0"),
    ({"x-max-length-bytes": -(2**40)}, "x-max-length-bytes",
     "-1099511627776 is negative; expected an integer >= 0"),
    ({"x-max-length-bytes": Decimal("1.5")}, "x-max-length-bytes",
     "1.5 is a decimal, not an integer; expected an integer >= 0"),
    ({"x-overflow": "drop-tail"}, "x-overflow",
     "'drop-tail' is not one of drop-head, reject-publish, reject-publish-dlx"),
    ({"x-dead-letter-exchange": 5}, "x-dead-letter-exchange",
     "5 is an integer, not a string; expected an exchange name"),
    ({"x-dead-letter-routing-key": "rk"}, "x-dead-letter-routing-key",
     "'rk' is set but x-dead-letter-exchange is not; a dead-letter routing key needs x-dead-letter-exchange"),
    ({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 1}, "x-dead-letter-routing-key",
     "1 is an integer, not a string; expected a dead-letter routing key"),
    ({"x-max-priority": 256}, "x-max-priority", "256 is too large; expected an integer from 0 to 255"),
    ({"x-max-priority": -1}, "x-max-priority", "-1 is negative; expected an integer from 0 to 255"),
    ({"x-single-active-consumer": 1}, "x-single-active-consumer",
     "1 is an integer, not a boolean; expected true or false"),
    ({"x-single-active-consumer": "true"}, "x-single-active-consumer",
     "'true' is a string, not a boolean; expected true or false"),
    ({"x-delivery-limit": -2}, "x-delivery-limit", "-2 is negative; expected an integer >= -1"),
    ({"x-consumer-timeout": -1}, "x-consumer-timeout", "-1 is negative; expected an integer >= 0 (ms)"),
    ({"x-queue-mode": "eager"}, "x-queue-mode", "'eager' is not one of default, lazy"),
    ({"x-queue-version": 3}, "x-queue-version", "3 is not one of 1, 2"),
    ({"x-queue-master-locator": "nearest"}, "x-queue-master-locator", f"'nearest' is not one of {LOCATORS}"),
    ({"x-queue-leader-locator": 7}, "x-queue-leader-locator",
     f"7 is an integer, not a string; expected one of {LOCATORS}"),
    ({"x-max-length": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}, "x-max-length",
     "1704067200 is a timestamp, not an integer; expected an integer >= 0"),
    # arguments of other queue types
    ({"x-quorum-initial-group-size": 3}, "x-quorum-initial-group-size",
     "classic queues do not support it (it is a queue argument of quorum queues)"),
    ({"x-dead-letter-strategy": "at-least-once"}, "x-dead-letter-strategy",
     "classic queues do not support it (it is a queue argument of quorum queues)"),
    ({"x-max-in-memory-length": 10}, "x-max-in-memory-length",
     "classic queues do not support it (it is a queue argument of quorum queues)"),
    ({"x-max-age": "1D"}, "x-max-age",
     "classic queues do not support it (it is a queue argument of stream queues)"),
    ({"x-stream-max-segment-size-bytes": 1000}, "x-stream-max-segment-size-bytes",
     "classic queues do not support it (it is a queue argument of stream queues)"),
]


@pytest.mark.parametrize(("arguments", "arg", "detail"), INVALID,
                         ids=[f"{a}:{next(iter(args.values()))!r}" for args, a, _ in INVALID])
def test_invalid_argument_is_406_naming_it(conn, arguments: dict[str, Any], arg: str, detail: str):
    q = unique("args")
    ch = conn.channel()
    with refused(406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': {detail}"):
        ch.queue_declare(q, arguments=arguments)
    # the channel is closed, the connection is not, and no queue was created
    with refused(404):
        conn.channel().queue_declare(q, passive=True)
    assert conn.is_open


def test_channel_close_names_queue_declare(server):
    with raw_session(server.amqp_port) as raw:
        q = unique("args")
        raw.send_method(1, spec.Queue.Declare(queue=q, arguments={"x-overflow": "drop-tail"}))
        close = raw.expect(spec.Channel.Close, 1)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 50, 10)
        assert close.reply_text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-overflow' for queue '{q}'")


@pytest.mark.parametrize("letter", ["b", "B", "s", "u", "I", "i", "l"])
def test_every_amqp_integer_type_is_accepted(server, letter: str):
    with raw_session(server.amqp_port) as raw:
        q = unique("args")
        args = {"x-max-length": TypedInt(5, letter), "x-max-priority": TypedInt(5, letter),
                "x-message-ttl": TypedInt(100, letter)}
        ok = raw.rpc(1, spec.Queue.Declare(queue=q, auto_delete=True, arguments=args), spec.Queue.DeclareOk)
        assert ok.queue == q
        raw.rpc(1, spec.Queue.Delete(queue=q), spec.Queue.DeleteOk)


def test_float_is_not_an_integer(server):
    # pika cannot send floats; other clients (Java, amqplib) send doubles for numbers
    with raw_session(server.amqp_port) as raw:
        q = unique("args")
        raw.send_method(1, spec.Queue.Declare(queue=q, arguments={"x-message-ttl": 1000.0}))
        close = raw.expect(spec.Channel.Close, 1)
        assert close.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{q}' in "
                                    "vhost '/': 1000.0 is a float, not an integer; expected an integer from 0 "
                                    "to 315360000000 (ms)")


def test_timestamp_is_not_an_integer(server):
    with raw_session(server.amqp_port) as raw:
        q = unique("args")
        raw.send_method(1, spec.Queue.Declare(queue=q, arguments={"x-expires": Timestamp(60)}))
        close = raw.expect(spec.Channel.Close, 1)
        assert close.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-expires' for queue '{q}' in vhost "
                                    "'/': 60 is a timestamp, not an integer; expected an integer from 1 to "
                                    "315360000000 (ms)")


def test_valid_arguments_declare_a_working_queue(ch):
    q = unique("args")
    args = {"x-message-ttl": 60_000, "x-expires": 600_000, "x-max-length": 100, "x-max-length-bytes": 1 << 20,
            "x-overflow": "reject-publish", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",
            "x-max-priority": 10, "x-single-active-consumer": False, "x-delivery-limit": 5,
            "x-consumer-timeout": 60_000, "x-queue-mode": "lazy", "x-queue-version": 2,
            "x-queue-type": "classic", "x-queue-leader-locator": "client-local"}
    ok = ch.queue_declare(q, arguments=args).method
    assert ok.queue == q
    ch.basic_publish("", q, b"hello")
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hello"
    ch.queue_declare(q, arguments=args)  # an equivalent redeclare
    ch.queue_delete(q)


@pytest.mark.parametrize("arguments", [
    {"x-max-length": 2**40}, {"x-max-priority": 0}, {"x-max-priority": 255}, {"x-message-ttl": 0},
    {"x-expires": 1}, {"x-queue-version": 1}, {"x-queue-master-locator": "min-masters"},
    {"x-single-active-consumer": True}, {"x-overflow": "reject-publish-dlx"}, {"x-overflow": "drop-head"},
])
def test_boundary_values_are_accepted(ch, arguments: dict[str, Any]):
    q = unique("args")
    ch.queue_declare(q, auto_delete=True, arguments=arguments)
    ch.queue_delete(q)


def test_unknown_arguments_are_accepted(ch):
    q = unique("args")
    ch.queue_declare(q, auto_delete=True, arguments={"x-custom": "anything", "x-ha-policy": "all",
                                                     "no-prefix": Decimal("1.5"), "x-cancel-on-ha-failover": "x"})
    ch.queue_delete(q)


def test_redeclare_equivalence_still_applies(conn):
    q = unique("args")
    conn.channel().queue_declare(q, arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    conn.channel().queue_declare(q, arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    with refused(406, f"PRECONDITION_FAILED - inequivalent arg 'x-overflow' for queue '{q}' in vhost '/': "
                      "received 'drop-head' but current is 'reject-publish'"):
        conn.channel().queue_declare(q, arguments={"x-max-length": 10, "x-overflow": "drop-head"})
    # an invalid value for an equivalence-checked argument is reported as inequivalent, as RabbitMQ does
    with refused(406) as r:
        conn.channel().queue_declare(q, arguments={"x-max-length": -1, "x-overflow": "reject-publish"})
    assert r.text.startswith(f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}'")
    conn.channel().queue_delete(q)


def test_redeclare_does_not_revalidate_other_arguments(conn):
    # RabbitMQ validates arguments only when a declaration creates the queue (rabbit_amqqueue:declare/7)
    q = unique("args")
    ch = conn.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.queue_declare(q, auto_delete=True, arguments={"x-queue-mode": "eager"})
    ch.queue_delete(q)


def test_passive_declare_ignores_arguments(ch):
    q = unique("args")
    ch.queue_declare(q, auto_delete=True)
    assert ch.queue_declare(q, passive=True, arguments={"x-max-length": -1}).method.queue == q
    ch.queue_delete(q)


def test_server_named_queue_is_validated_too(conn):
    with refused(406) as r:
        conn.channel().queue_declare("", exclusive=True, arguments={"x-max-priority": 1000})
    assert r.text.startswith("PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'amq.gen-")
    assert r.text.endswith("': 1000 is too large; expected an integer from 0 to 255")


def test_durable_queue_with_invalid_arguments_is_not_recorded(conn):
    q = unique("args")
    with refused(406):
        conn.channel().queue_declare(q, durable=True, arguments={"x-expires": 0})
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-expires": 60_000})  # the name is free
    ch.queue_delete(q)


@pytest.mark.parametrize("value", ["high", True, Decimal("1.5"), None])
def test_invalid_consumer_priority_is_406(conn, value: Any):
    ch = conn.channel()
    q = unique("args")
    ch.queue_declare(q, auto_delete=True)
    with refused(406) as r:
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": value})
    assert "invalid arg 'x-priority'" in r.text
    conn.channel().queue_delete(q)


@pytest.mark.parametrize("value", [-5, 0, 2**40])
def test_consumer_priority_any_integer(conn, value: int):
    ch = conn.channel()
    q = unique("args")
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None, arguments={"x-priority": value})
    ch.close()


def test_other_connections_are_unaffected(server):
    c = connect(server.amqp_port)
    try:
        ch = c.channel()
        with refused(406):
            ch.queue_declare(unique("args"), arguments={"x-overflow": 1})
        ch2 = c.channel()
        q = unique("args")
        ch2.queue_declare(q, auto_delete=True, arguments={"x-overflow": "drop-head"})
        ch2.queue_delete(q)
    finally:
        c.close()
