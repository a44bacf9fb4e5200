"""Pure tests of hutch.core.arguments: every queue argument with valid and invalid values, every AMQP
integer width, bools/timestamps/floats/strings refused where integers are required, unsupported
arguments, unknown arguments ignored, consumer arguments, and the error texts (which name the argument,
the queue and what is allowed)."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.amqp.table import Timestamp, TypedInt, decode_table, encode_table
from hutch.core.arguments import (
    DECLARE_RULES,
    KNOWN_QUEUE_ARGUMENTS,
    MAX_EXPIRY_MS,
    QUEUE_TYPE_ARGUMENTS,
    validate_consumer_arguments,
    validate_queue_arguments,
)
from hutch.core.queue_settings import settings_from_arguments

PREFIX = "invalid arg '{arg}' for queue 'q' in vhost '/': "


def declare(arguments: dict[str, Any], queue_type: str = "classic", queue: str = "q") -> None:
    validate_queue_arguments(queue, "/", queue_type, arguments)


def refusal(arguments: dict[str, Any], queue_type: str = "classic", queue: str = "q") -> ChannelError:
    with pytest.raises(ChannelError) as info:
        declare(arguments, queue_type, queue)
    exc = info.value
    assert (exc.code, exc.class_id, exc.method_id) == (PRECONDITION_FAILED, 50, 10)
    return exc


# -- valid values ---------------------------------------------------------------------------------------
VALID = [
    ("x-message-ttl", 0), ("x-message-ttl", 60_000), ("x-message-ttl", MAX_EXPIRY_MS),
    ("x-expires", 1), ("x-expires", 1_800_000), ("x-expires", MAX_EXPIRY_MS),
    ("x-max-length", 0), ("x-max-length", 10), ("x-max-length", 2**63 - 1),
    ("x-max-length-bytes", 0), ("x-max-length-bytes", 1 << 30),
    ("x-overflow", "drop-head"), ("x-overflow", "reject-publish"), ("x-overflow", "reject-publish-dlx"),
    ("x-dead-letter-exchange", ""), ("x-dead-letter-exchange", "dlx"),
    ("x-max-priority", 0), ("x-max-priority", 1), ("x-max-priority", 10), ("x-max-priority", 255),
    ("x-single-active-consumer", True), ("x-single-active-consumer", False),
    ("x-delivery-limit", 0), ("x-delivery-limit", 20),
    ("x-consumer-timeout", 0), ("x-consumer-timeout", 3_600_000),
    ("x-queue-mode", "default"), ("x-queue-mode", "lazy"),
    ("x-queue-version", 1), ("x-queue-version", 2),
    ("x-queue-master-locator", "min-masters"), ("x-queue-master-locator", "client-local"),
    ("x-queue-master-locator", "random"),
    ("x-queue-leader-locator", "client-local"), ("x-queue-leader-locator", "balanced"),
    ("x-queue-type", "classic"),
]


@pytest.mark.parametrize(("arg", "value"), VALID)
def test_valid_values_are_accepted(arg: str, value: Any) -> None:
    declare({arg: value})


def test_all_together_and_settings_read_them() -> None:
    args = {"x-message-ttl": 1000, "x-expires": 5000, "x-max-length": 3, "x-max-length-bytes": 100,
            "x-overflow": "reject-publish", "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "rk",
            "x-max-priority": 5, "x-single-active-consumer": True, "x-delivery-limit": 2,
            "x-consumer-timeout": 9000, "x-queue-mode": "lazy", "x-queue-version": 2, "x-queue-type": "classic"}
    declare(args)
    s = settings_from_arguments(args)
    assert (s.message_ttl, s.expires, s.max_length, s.max_length_bytes, s.overflow) == (
        1000, 5000, 3, 100, "reject-publish")
    assert (s.dead_letter_exchange, s.dead_letter_routing_key, s.max_priority) == ("dlx", "rk", 5)
    assert (s.single_active_consumer, s.delivery_limit, s.consumer_timeout) == (True, 2, 9000)


def test_no_arguments() -> None:
    declare({})


@pytest.mark.parametrize("args", [
    {"x-custom": 1}, {"x-match": "all"}, {"alternate-exchange": 5}, {"x-note": b"\x00\x01"},
    {"x-cancel-on-ha-failover": "maybe"}, {"x-ha-policy": "all"}, {"": None},
])
def test_unknown_arguments_are_ignored(args: dict[str, Any]) -> None:
    declare(args)


# -- integer widths: any AMQP integer field decodes to an int and is accepted ----------------------------
@pytest.mark.parametrize("letter", ["b", "B", "s", "u", "I", "i", "l"])
def test_every_integer_field_type_is_accepted(letter: str) -> None:
    wire = encode_table({"x-max-length": TypedInt(7, letter), "x-max-priority": TypedInt(9, letter)})
    table, _ = decode_table(wire, 0)
    declare(table)
    assert table["x-max-length"] == 7


def test_signed_64_bit_L_field_is_accepted() -> None:
    # 'L' (what some clients send for uint64) is read signed, as RabbitMQ reads it
    entry = b"\x0cx-max-length" + b"L" + (1000).to_bytes(8, "big")
    wire = len(entry).to_bytes(4, "big") + entry
    table, _ = decode_table(wire, 0)
    declare(table)


@pytest.mark.parametrize("letter", ["b", "s", "I", "l"])
def test_negative_signed_integers_are_refused_by_value_not_type(letter: str) -> None:
    table, _ = decode_table(encode_table({"x-max-length": TypedInt(-1, letter)}), 0)
    assert refusal(table).text == PREFIX.format(arg="x-max-length") + "-1 is negative; expected an integer >= 0"


# -- invalid values: (argument, value, detail after the prefix) ------------------------------------------
INVALID = [
    ("x-message-ttl", -1, "-1 is negative; expected an integer from 0 to 315360000000 (ms)"),
    ("x-message-ttl", MAX_EXPIRY_MS + 1,
     "315360000001 is too large; expected an integer from 0 to 315360000000 (ms)"),
    ("x-message-ttl", "1000", "'1000' is a string, not an integer; expected an integer from 0 to 315360000000 (ms)"),
    ("x-message-ttl", 1.5, "1.5 is a float, not an integer; expected an integer from 0 to 315360000000 (ms)"),
    ("x-message-ttl", True, "true is a boolean, not an integer; expected an integer from 0 to 315360000000 (ms)"),
    ("x-expires", 0, "0 is too small; expected an integer from 1 to 315360000000 (ms)"),
    ("x-expires", -5, "-5 is negative; expected an integer from 1 to 315360000000 (ms)"),
    ("x-expires", MAX_EXPIRY_MS + 1, "315360000001 is too large; expected an integer from 1 to 315360000000 (ms)"),
    ("x-expires", Decimal("1.0"), "1.0 is a decimal, not an integer; expected an integer from 1 to 315360000000 (ms)"),
    ("x-max-length", -1, "-1 is negative; expected an integer >= 0"),
    ("x-max-length", "10", "'10' is a string, not an integer; expected an integer >= 0"),
    ("x-max-length", False, "false is a boolean, not an integer; expected an integer >= 0"),
    ("x-max-length", None, "no value (void); expected an integer >= 0"),
    ("x-max-length", 2**63, "9223372036854775808 does not fit in 64 bits; expected an integer >= 0"),
    ("x-max-length-bytes", -1, "-1 is negative; expected an integer >= 0"),
    ("x-max-length-bytes", 1e6, "1000000.0 is a float, not an integer; expected an integer >= 0"),
    ("x-max-length-bytes", Timestamp(5), "5 is a timestamp, not an integer; expected an integer >= 0"),
    ("x-overflow", "drop-tail", "'drop-tail' is not one of drop-head, reject-publish, reject-publish-dlx"),
    ("x-overflow", "", "'' is not one of drop-head, reject-publish, reject-publish-dlx"),
    ("x-overflow", 1, "1 is an integer, not a string; expected one of drop-head, reject-publish, reject-publish-dlx"),
    ("x-overflow", b"drop-head",
     "b'drop-head' is a byte string, not a string; expected one of drop-head, reject-publish, reject-publish-dlx"),
    ("x-dead-letter-exchange", 5, "5 is an integer, not a string; expected an exchange name"),
    ("x-dead-letter-exchange", True, "true is a boolean, not a string; expected an exchange name"),
    ("x-dead-letter-exchange", None, "no value (void); expected an exchange name"),
    ("x-max-priority", -1, "-1 is negative; expected an integer from 0 to 255"),
    ("x-max-priority", 256, "256 is too large; expected an integer from 0 to 255"),
    ("x-max-priority", "10", "'10' is a string, not an integer; expected an integer from 0 to 255"),
    ("x-max-priority", True, "true is a boolean, not an integer; expected an integer from 0 to 255"),
    ("x-single-active-consumer", 1, "1 is an integer, not a boolean; expected true or false"),
    ("x-single-active-consumer", "true", "'true' is a string, not a boolean; expected true or false"),
    ("x-single-active-consumer", 0, "0 is an integer, not a boolean; expected true or false"),
    ("x-delivery-limit", -2, "-2 is negative; expected an integer >= -1"),  # -1: no limit (RabbitMQ 4.x)
    ("x-delivery-limit", "5", "'5' is a string, not an integer; expected an integer >= -1"),
    ("x-consumer-timeout", -1, "-1 is negative; expected an integer >= 0 (ms)"),
    ("x-consumer-timeout", 30.0, "30.0 is a float, not an integer; expected an integer >= 0 (ms)"),
    ("x-queue-mode", "eager", "'eager' is not one of default, lazy"),
    ("x-queue-mode", 1, "1 is an integer, not a string; expected one of default, lazy"),
    ("x-queue-version", 3, "3 is not one of 1, 2"),
    ("x-queue-version", 0, "0 is not one of 1, 2"),
    ("x-queue-version", True, "true is a boolean, not an integer; expected the integer 1 or 2"),
    ("x-queue-version", "2", "'2' is a string, not an integer; expected the integer 1 or 2"),
    ("x-queue-master-locator", "nearest",
     "'nearest' is not one of client-local, balanced, random, least-leaders, min-masters"),
    ("x-queue-leader-locator", "nearest",
     "'nearest' is not one of client-local, balanced, random, least-leaders, min-masters"),
    ("x-queue-leader-locator", 1,
     "1 is an integer, not a string; expected one of client-local, balanced, random, least-leaders, min-masters"),
]


@pytest.mark.parametrize(("arg", "value", "detail"), INVALID, ids=[f"{a}={v!r}" for a, v, _ in INVALID])
def test_invalid_values_are_refused_with_a_readable_text(arg: str, value: Any, detail: str) -> None:
    args = {arg: value}
    exc = refusal(args)
    assert exc.text == PREFIX.format(arg=arg) + detail
    assert exc.reply_text.startswith("PRECONDITION_FAILED - invalid arg ")


@pytest.mark.parametrize("arg", [a for a in DECLARE_RULES if a in QUEUE_TYPE_ARGUMENTS["classic"]])
def test_every_classic_argument_has_valid_and_invalid_cases(arg: str) -> None:
    if arg == "x-dead-letter-routing-key":
        return  # covered below: it depends on x-dead-letter-exchange
    assert any(a == arg for a, _ in VALID), arg
    assert any(a == arg for a, _, _ in INVALID), arg


@pytest.mark.parametrize("arg", ["x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes",
                                 "x-max-priority", "x-delivery-limit", "x-consumer-timeout",
                                 "x-queue-version"])
@pytest.mark.parametrize("value", [True, False, 1.0, "1", b"1", Decimal(1), Timestamp(1), None,
                                   [1], {"v": 1}, datetime.datetime(2024, 1, 1)])
def test_integer_arguments_refuse_every_non_integer(arg: str, value: Any) -> None:
    exc = refusal({arg: value})
    assert exc.text.startswith(PREFIX.format(arg=arg))
    assert "integer" in exc.text


# -- the dead-letter routing key ---------------------------------------------------------------------------
def test_dead_letter_routing_key_with_exchange() -> None:
    declare({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "rk"})
    declare({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": ""})


def test_dead_letter_routing_key_without_exchange_is_refused() -> None:
    exc = refusal({"x-dead-letter-routing-key": "rk"})
    assert exc.text == (PREFIX.format(arg="x-dead-letter-routing-key") +
                        "'rk' is set but x-dead-letter-exchange is not; a dead-letter routing key needs "
                        "x-dead-letter-exchange")


def test_dead_letter_routing_key_type() -> None:
    exc = refusal({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 7})
    assert exc.text == (PREFIX.format(arg="x-dead-letter-routing-key") +
                        "7 is an integer, not a string; expected a dead-letter routing key")


def test_invalid_exchange_is_reported_before_the_routing_key() -> None:
    exc = refusal({"x-dead-letter-routing-key": 7, "x-dead-letter-exchange": 5})
    assert "'x-dead-letter-exchange'" in exc.text


# -- unsupported arguments -------------------------------------------------------------------------------
UNSUPPORTED = [
    ("x-quorum-initial-group-size", 3, "quorum"),
    ("x-max-in-memory-length", 10, "quorum"),
    ("x-max-in-memory-bytes", 10, "quorum"),
    ("x-dead-letter-strategy", "at-least-once", "quorum"),
    ("x-max-age", "1D", "stream"),
    ("x-stream-max-segment-size-bytes", 1000, "stream"),
    ("x-stream-filter-size-bytes", 16, "stream"),
    ("x-initial-cluster-size", 3, "stream"),
]


@pytest.mark.parametrize(("arg", "value", "owner"), UNSUPPORTED)
def test_arguments_of_other_queue_types_are_refused(arg: str, value: Any, owner: str) -> None:
    exc = refusal({arg: value})
    assert exc.text == (PREFIX.format(arg=arg) +
                        f"classic queues do not support it (it is a queue argument of {owner} queues)")


def test_unsupported_arguments_are_refused_whatever_their_value() -> None:
    # RabbitMQ runs no value check for an argument the queue type does not take; the key alone is refused
    assert "do not support it" in refusal({"x-quorum-initial-group-size": "three"}).text


def test_value_errors_come_before_unsupported_keys() -> None:
    exc = refusal({"x-max-age": "1D", "x-max-length": -1})
    assert "'x-max-length'" in exc.text


def test_checks_run_in_table_order_not_client_order() -> None:
    a = refusal({"x-overflow": "nope", "x-message-ttl": -1})
    b = refusal({"x-message-ttl": -1, "x-overflow": "nope"})
    assert a.text == b.text and "'x-message-ttl'" in a.text


def test_known_arguments_cover_every_type() -> None:
    assert "x-max-age" in KNOWN_QUEUE_ARGUMENTS and "x-delivery-limit" in QUEUE_TYPE_ARGUMENTS["classic"]
    assert all(arg in KNOWN_QUEUE_ARGUMENTS for arg in DECLARE_RULES)


def test_unsupported_queue_type() -> None:
    exc = refusal({"x-queue-type": "kafka"}, queue_type="kafka")
    assert exc.text == PREFIX.format(arg="x-queue-type") + "'kafka' is not one of classic, quorum, stream"


# -- the error text ---------------------------------------------------------------------------------------
def test_text_names_the_queue_and_vhost() -> None:
    with pytest.raises(ChannelError) as info:
        validate_queue_arguments("orders", "prod", "classic", {"x-max-length": -1})
    assert info.value.text == ("invalid arg 'x-max-length' for queue 'orders' in vhost 'prod': "
                               "-1 is negative; expected an integer >= 0")


def test_long_values_are_shortened() -> None:
    exc = refusal({"x-overflow": "x" * 500})
    assert "'" + "x" * 36 + "..." in exc.text
    assert len(exc.text) < 200


def test_reply_text_fits_a_shortstr_even_with_a_255_byte_queue_name() -> None:
    name = "é" * 127  # 254 bytes of UTF-8
    exc = refusal({"x-overflow": "nope"}, queue=name)
    assert len(exc.reply_text.encode("utf-8")) <= 255
    assert exc.reply_text.endswith("...")
    exc.reply_text.encode("utf-8").decode("utf-8")  # cut on a character boundary


def test_huge_integers_are_described_not_printed() -> None:
    exc = refusal({"x-overflow": 1 << 10_000})
    assert "a 10001-bit number is an integer" in exc.text


# -- consumer arguments (basic.consume) -------------------------------------------------------------------
def consume_refusal(arguments: dict[str, Any], queue_type: str = "classic") -> ChannelError:
    with pytest.raises(ChannelError) as info:
        validate_consumer_arguments("q", "/", queue_type, arguments)
    exc = info.value
    assert (exc.code, exc.class_id, exc.method_id) == (PRECONDITION_FAILED, 60, 20)
    return exc


@pytest.mark.parametrize("value", [0, 10, -10, 2**63 - 1, -(2**63)])
def test_consumer_priority_any_integer(value: int) -> None:
    validate_consumer_arguments("q", "/", "classic", {"x-priority": value})


@pytest.mark.parametrize(("value", "detail"), [
    ("high", "'high' is a string, not an integer; expected an integer"),
    (True, "true is a boolean, not an integer; expected an integer"),
    (1.5, "1.5 is a float, not an integer; expected an integer"),
    (None, "no value (void); expected an integer"),
    (2**63, "9223372036854775808 does not fit in 64 bits; expected an integer"),
])
def test_consumer_priority_must_be_an_integer(value: Any, detail: str) -> None:
    assert consume_refusal({"x-priority": value}).text == PREFIX.format(arg="x-priority") + detail


def test_stream_consumer_arguments_are_refused_on_classic_queues() -> None:
    exc = consume_refusal({"x-stream-offset": "first"})
    assert exc.text == (PREFIX.format(arg="x-stream-offset") +
                        "classic queues do not support it (it is a consumer argument of stream queues)")


def test_unknown_consumer_arguments_are_ignored() -> None:
    validate_consumer_arguments("q", "/", "classic", {"x-cancel-on-ha-failover": True, "x-custom": "1"})
    validate_consumer_arguments("q", "/", "classic", None)
