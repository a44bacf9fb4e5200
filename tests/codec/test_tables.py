"""Field tables and arrays: every type letter, nesting, errors, and pamqp as an oracle.

Where pamqp's letters differ from hutch's (why the oracle strategies in `support` are shaped as
they are):

- Integers: pamqp writes the *smallest* letter that fits (b, s, u, I, i, l); hutch writes `I` for
  int32 and `l` beyond, like pika and the Java client, because every RabbitMQ version reads those
  two (pamqp itself has a "deprecated RabbitMQ" mode that avoids u/i). Both read all eight letters.
- Floats: pamqp writes `f` (float32, lossy), hutch `d` (float64). pamqp -> hutch uses float32 values.
- `L`: RabbitMQ and pamqp read it as a *signed* int64 (rabbitmq-server#1093); so does hutch since
  the codec tests found it reading unsigned.
- `D`: pamqp writes the mantissa signed and reads it unsigned, as RabbitMQ's parser does; hutch
  reads it signed (pika, Java). Negative decimals are checked only pamqp -> hutch.
- `T`: pamqp returns a datetime and treats values above 0xFFFFFFFF as milliseconds.
- `x`: pamqp encodes only `bytearray`; hutch encodes bytes, bytearray and memoryview.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from hutch.amqp import spec
from hutch.amqp.errors import FRAME_ERROR, FrameError
from hutch.amqp.table import MAX_NESTING_DEPTH, Timestamp, TypedInt, decode_table, encode_array, encode_table

from .support import (
    INT_RANGES,
    assert_same,
    canonical_tables,
    ci_settings,
    encodable_tables,
    expected_after_roundtrip,
    from_pamqp,
    oracle_in_tables,
    oracle_out_tables,
    to_pamqp,
)


def param_id(value: Any) -> str:
    """`repr` without memory addresses: a test's id must be the same in every pytest-xdist worker."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def wrap(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def one_field(letter: bytes, raw: bytes, key: bytes = b"k") -> bytes:
    return wrap(bytes([len(key)]) + key + letter + raw)


def decode_all(raw: bytes) -> dict[str, Any]:
    value, offset = decode_table(raw, 0)
    assert offset == len(raw)
    return value


def assert_501(raw: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_table(raw, 0)
    assert info.value.code == FRAME_ERROR


# ---------------------------------------------------------------------------------------------------
# Every letter

NESTED_TABLE = one_field(b"S", wrap(b"v"), key=b"n")
LETTER_CASES: list[tuple[str, bytes, bytes, Any]] = [
    ("t-true", b"t", b"\x01", True),
    ("t-false", b"t", b"\x00", False),
    ("t-nonzero", b"t", b"\x02", True),
    ("b", b"b", b"\xff", -1),
    ("B", b"B", b"\xff", 255),
    ("s", b"s", b"\xff\xfe", -2),
    ("u", b"u", b"\xff\xfe", 65534),
    ("I", b"I", b"\xff\xff\xff\xfe", -2),
    ("i", b"i", b"\xff\xff\xff\xfe", 2**32 - 2),
    ("l", b"l", b"\xff" * 4 + b"\x00" * 4, -(2**32)),
    ("L-is-signed", b"L", b"\xff" * 8, -1),
    ("f", b"f", struct.pack(">f", 1.5), 1.5),
    ("d", b"d", struct.pack(">d", -2.5e-300), -2.5e-300),
    ("D", b"D", b"\x02" + struct.pack(">i", -12345), Decimal("-123.45")),
    ("D-scale0", b"D", b"\x00" + struct.pack(">i", 7), Decimal(7)),
    ("S-utf8", b"S", wrap("ünï".encode()), "ünï"),
    ("S-not-utf8", b"S", wrap(b"\xff\xfe"), b"\xff\xfe"),
    ("S-empty", b"S", wrap(b""), ""),
    ("x", b"x", wrap(b"\x00abc"), b"\x00abc"),
    ("A", b"A", wrap(b"I" + struct.pack(">i", 1) + b"S" + wrap(b"two") + b"V"), [1, "two", None]),
    ("A-empty", b"A", wrap(b""), []),
    ("T", b"T", struct.pack(">Q", 1_700_000_000), Timestamp(1_700_000_000)),
    ("T-max", b"T", b"\xff" * 8, Timestamp(2**64 - 1)),
    ("F", b"F", NESTED_TABLE, {"n": "v"}),
    ("F-empty", b"F", wrap(b""), {}),
    ("V", b"V", b"", None),
]


@pytest.mark.parametrize(("letter", "raw", "expected"), [c[1:] for c in LETTER_CASES],
                         ids=[c[0] for c in LETTER_CASES])
def test_each_letter_decodes(letter: bytes, raw: bytes, expected: Any) -> None:
    assert_same(decode_all(one_field(letter, raw)), {"k": expected})
    # The same value as an array element, and inside a nested table.
    assert_same(decode_all(one_field(b"A", wrap(letter + raw))), {"k": [expected]})
    assert_same(decode_all(one_field(b"F", one_field(letter, raw))), {"k": {"k": expected}})


@pytest.mark.parametrize(("letter", "raw", "expected"), [c[1:] for c in LETTER_CASES],
                         ids=[c[0] for c in LETTER_CASES])
def test_each_letter_roundtrips_by_value(letter: bytes, raw: bytes, expected: Any) -> None:
    """decode -> encode -> decode is stable for every letter (widths may change: see below)."""
    decoded = decode_all(one_field(letter, raw))
    assert_same(decode_all(encode_table(decoded)), decoded)


CANONICAL = {"t", "I", "l", "d", "D", "S", "x", "A", "T", "F", "V"}


@pytest.mark.parametrize(("letter", "raw", "expected"),
                         [c[1:] for c in LETTER_CASES if c[1].decode() in CANONICAL and c[0] not in
                          ("t-nonzero", "S-not-utf8")],
                         ids=[c[0] for c in LETTER_CASES if c[1].decode() in CANONICAL and c[0] not in
                              ("t-nonzero", "S-not-utf8")])
def test_canonical_letters_roundtrip_byte_exact(letter: bytes, raw: bytes, expected: Any) -> None:
    encoded = one_field(letter, raw)
    assert encode_table(decode_all(encoded)) == encoded


@pytest.mark.parametrize(("letter", "raw", "reencoded_as"), [
    (b"b", b"\xff", b"I"), (b"B", b"\xff", b"I"), (b"s", b"\xff\xfe", b"I"), (b"u", b"\xff\xfe", b"I"),
    (b"i", b"\xff\xff\xff\xfe", b"l"), (b"L", b"\x00" * 8, b"I"), (b"f", struct.pack(">f", 1.5), b"d"),
])
def test_non_canonical_letters_reencode_as_hutchs_letter(letter: bytes, raw: bytes, reencoded_as: bytes) -> None:
    """A decoded value does not remember its width: plain ints re-encode as I or l, floats as d.

    (Brokers forward the original header bytes; `TypedInt` is how hutch picks a width itself.)
    """
    decoded = decode_all(one_field(letter, raw))
    assert encode_table(decoded)[6:7] == reencoded_as


@pytest.mark.parametrize(("value", "encoded"), [
    (True, b"t\x01"),
    (False, b"t\x00"),
    (0, b"I\x00\x00\x00\x00"),
    (-(2**31), b"I\x80\x00\x00\x00"),
    (2**31 - 1, b"I\x7f\xff\xff\xff"),
    (2**31, b"l" + struct.pack(">q", 2**31)),
    (-(2**31) - 1, b"l" + struct.pack(">q", -(2**31) - 1)),
    (2**63 - 1, b"l" + struct.pack(">q", 2**63 - 1)),
    (1.5, b"d" + struct.pack(">d", 1.5)),
    (Decimal("1.23"), b"D\x02\x00\x00\x00\x7b"),
    (Decimal("-1.23"), b"D\x02\xff\xff\xff\x85"),
    (Decimal("1E+2"), b"D\x00\x00\x00\x00\x64"),
    ("é", b"S\x00\x00\x00\x02\xc3\xa9"),
    (b"\x00", b"x\x00\x00\x00\x01\x00"),
    (bytearray(b"\x01"), b"x\x00\x00\x00\x01\x01"),
    (memoryview(b"\x02"), b"x\x00\x00\x00\x01\x02"),
    ([1], b"A\x00\x00\x00\x05I\x00\x00\x00\x01"),
    ((True,), b"A\x00\x00\x00\x02t\x01"),
    ({}, b"F\x00\x00\x00\x00"),
    (None, b"V"),
    (Timestamp(5), b"T" + struct.pack(">Q", 5)),
    (dt.datetime(1970, 1, 1, 0, 0, 7, tzinfo=dt.UTC), b"T" + struct.pack(">Q", 7)),
    (dt.datetime(1970, 1, 1, 0, 0, 8), b"T" + struct.pack(">Q", 8)),  # naive means UTC
    (dt.datetime(1970, 1, 1, 1, 0, 9, tzinfo=dt.timezone(dt.timedelta(hours=1))), b"T" + struct.pack(">Q", 9)),
], ids=param_id)
def test_encoding_picks_the_letter(value: Any, encoded: bytes) -> None:
    assert encode_table({"k": value}) == one_field(encoded[:1], encoded[1:])
    assert encode_array([value]) == wrap(encoded)


@pytest.mark.parametrize("letter", sorted(INT_RANGES))
def test_typed_int_keeps_its_letter_at_both_ends_of_its_range(letter: str) -> None:
    for v in INT_RANGES[letter]:
        encoded = encode_table({"k": TypedInt(v, letter)})
        assert encoded[6:7] == letter.encode()
        assert_same(decode_all(encoded), {"k": v})


def test_empty_table() -> None:
    assert encode_table(None) == encode_table({}) == b"\x00\x00\x00\x00"
    assert decode_all(b"\x00\x00\x00\x00") == {}


def test_decode_at_an_offset_returns_the_next_offset() -> None:
    raw = encode_table({"a": [1, {"b": None}]})
    buf = b"junk" + raw + b"tail"
    value, offset = decode_table(buf, 4)
    assert value == {"a": [1, {"b": None}]} and offset == 4 + len(raw)
    assert decode_table(memoryview(buf), 4) == (value, offset)


def test_x_death_shape() -> None:
    """The nesting RabbitMQ clients see most: an array of tables holding arrays and typed ints."""
    headers = {
        "x-death": [{
            "count": TypedInt(3, "l"), "reason": "rejected", "queue": "q", "time": Timestamp(1_700_000_000),
            "exchange": "", "routing-keys": ["q", "r"],
        }],
        "x-first-death-queue": "q",
    }
    raw = encode_table(headers)
    assert b"\x05countl\x00\x00\x00\x00\x00\x00\x00\x03" in raw
    assert_same(decode_all(raw), expected_after_roundtrip(headers))
    # pamqp reads it the same way.
    consumed, theirs = pamqp_decode.field_table(raw)
    assert consumed == len(raw)
    assert_same(from_pamqp(theirs), expected_after_roundtrip(headers))


def test_nan_and_infinities_roundtrip() -> None:
    decoded = decode_all(encode_table({"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0": -0.0}))
    assert math.isnan(decoded["nan"])
    assert_same([decoded["inf"], decoded["-inf"], decoded["-0"]], [math.inf, -math.inf, -0.0])


# ---------------------------------------------------------------------------------------------------
# Nesting depth (regression: deep nesting used to escape as RecursionError, not a 501)


def nested_arrays(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = b"A" + wrap(inner)
    return one_field(inner[:1], inner[1:])


def nested_tables(depth: int) -> bytes:
    raw = wrap(b"")
    for _ in range(depth):
        raw = one_field(b"F", raw)
    return raw


def test_nesting_up_to_the_limit_decodes() -> None:
    value = decode_all(nested_arrays(MAX_NESTING_DEPTH))["k"]
    for _ in range(MAX_NESTING_DEPTH - 1):
        (value,) = value
    assert value == []
    assert decode_all(nested_tables(MAX_NESTING_DEPTH))  # the top-level table + MAX nested ones
    assert encode_table(decode_all(nested_arrays(MAX_NESTING_DEPTH))) == nested_arrays(MAX_NESTING_DEPTH)


def test_nesting_past_the_limit_is_501() -> None:
    assert_501(nested_arrays(MAX_NESTING_DEPTH + 1))
    assert_501(nested_tables(MAX_NESTING_DEPTH + 1))


@pytest.mark.parametrize("build", [nested_arrays, nested_tables])
def test_frame_sized_nesting_is_501_not_recursion_error(build: Any) -> None:
    """~26,000 levels fit in one 131072-byte frame; they must close the connection with 501."""
    deep = build(15_000)
    assert len(deep) < 131072
    assert_501(deep)
    payload = spec.Queue.Declare(queue="q").encode()[:-4] + deep  # as queue.declare's arguments
    with pytest.raises(FrameError) as info:
        spec.decode_method(payload)
    assert info.value.code == FRAME_ERROR
    props = b"\x20\x00" + deep  # headers flag + the table
    with pytest.raises(FrameError):
        spec.BasicProperties.decode(props, 0)


# ---------------------------------------------------------------------------------------------------
# Decode errors: all 501


@pytest.mark.parametrize("raw", [
    b"",
    b"\x00\x00\x00",
    b"\x00\x00\x00\x05\x01k",  # length beyond the buffer
    wrap(b"\x05k"),  # key overruns the table
    wrap(b"\x01kZ"),  # unknown letter
    wrap(b"\x01k\x00"),  # pamqp reads \x00 as void; RabbitMQ and hutch do not
    wrap(b"\x01k"),  # key without a value
    wrap(b"\x02\xff\xfeS\x00\x00\x00\x00"),  # key is not UTF-8
    wrap(b"\x01kS\x00\x00\x00\x09abc"),  # longstr overruns
    wrap(b"\x01kx\x00\x00\x00\x09abc"),
    wrap(b"\x01kA\x00\x00\x00\x09I"),  # array overruns
    wrap(b"\x01kA\x00\x00\x00\x02I\x00"),  # array element overruns the array
    wrap(b"\x01kF\x00\x00\x00\x09"),  # nested table overruns
    wrap(b"\x01kF\x00\x00\x00\x02\x05k"),  # nested key overruns the nested table
    wrap(b"\x01kI\x00\x00"),
    wrap(b"\x01kl\x00\x00"),
    wrap(b"\x01kT\x00\x00"),
    wrap(b"\x01kd\x00"),
    wrap(b"\x01kf\x00"),
    wrap(b"\x01kD\x00\x00"),
    wrap(b"\x01kt"),
    wrap(b"\x01kb"),
    wrap(b"\x01kS\x00\x00"),
], ids=param_id)
def test_malformed_tables_are_501(raw: bytes) -> None:
    assert_501(raw)


@pytest.mark.parametrize(("letter", "raw", "expected"), [c[1:] for c in LETTER_CASES if c[2]],
                         ids=[c[0] for c in LETTER_CASES if c[2]])
def test_a_value_cut_short_by_its_table_is_501(letter: bytes, raw: bytes, expected: Any) -> None:
    """The table's length ends inside the value, though the buffer goes on: still 501."""
    whole = one_field(letter, raw) + b"\x00" * 16
    for cut in range(1, len(raw) + 1):
        body = b"\x01k" + letter + raw[:-cut]
        assert_501(wrap(body) + raw[-cut:] + b"\x00" * 16)
    assert decode_table(whole, 0)[0] == {"k": expected}


# ---------------------------------------------------------------------------------------------------
# Encode errors: ValueError (a programming error, never a wire error)


@pytest.mark.parametrize("value", [
    2**63, -(2**63) - 1, object(), {1, 2}, 1j, Decimal("NaN"), Decimal("Infinity"),
    Decimal("1E-256"), Decimal(2**31), Decimal("0.1") ** 300,
], ids=param_id)
def test_unencodable_values_raise_value_error(value: Any) -> None:
    with pytest.raises(ValueError):
        encode_table({"k": value})


def test_key_longer_than_255_bytes_raises_value_error() -> None:
    encode_table({"k" * 255: 1})
    with pytest.raises(ValueError):
        encode_table({"k" * 256: 1})


# ---------------------------------------------------------------------------------------------------
# pamqp as the oracle

FIXED_OUT = {
    "bool": False, "i32": -7, "i64": -(2**62), "double": 0.1, "str": "ü", "bytes": b"\x00\xff",
    "decimal": Decimal("2.50"), "ts": Timestamp(0xFFFFFFFF), "void": None,
    "typed": [TypedInt(v, letter) for letter, (v, _) in sorted(INT_RANGES.items())],
    "nested": {"a": [{"b": [[], {}]}]},
}


def test_fixed_table_hutch_to_pamqp() -> None:
    raw = encode_table(FIXED_OUT)
    consumed, theirs = pamqp_decode.field_table(raw)
    assert consumed == len(raw)
    assert_same(from_pamqp(theirs), expected_after_roundtrip(FIXED_OUT))


FIXED_IN = {
    "small": [-128, 127, -32768, 32767, 65535, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63)],
    "f32": [0.5, -3.25, float("inf")], "decimal": [Decimal("-1.5"), Decimal("0.000")],
    "bytes": bytearray(b"ab"), "ts": dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=dt.UTC),
    "str": "", "void": None, "t": True, "nested": {"x": {"y": [None]}},
}


def test_fixed_table_pamqp_to_hutch() -> None:
    assert_same(decode_all(pamqp_encode.field_table(FIXED_IN)), from_pamqp(FIXED_IN))


@ci_settings(max_examples=150)  # `make test`; the 300 of the long run below are in the slow set
@given(oracle_out_tables)
def test_pamqp_reads_what_hutch_writes(value: dict[str, Any]) -> None:
    raw = encode_table(value)
    consumed, theirs = pamqp_decode.field_table(raw)
    assert consumed == len(raw)
    assert_same(from_pamqp(theirs), expected_after_roundtrip(value))


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(max_examples=300)
@given(oracle_out_tables)
def test_pamqp_reads_what_hutch_writes_long(value: dict[str, Any]) -> None:
    test_pamqp_reads_what_hutch_writes.hypothesis.inner_test(value)


@ci_settings(max_examples=150)  # `make test`; the 300 of the long run below are in the slow set
@given(oracle_in_tables)
def test_hutch_reads_what_pamqp_writes(value: dict[str, Any]) -> None:
    assert_same(decode_all(pamqp_encode.field_table(value)), from_pamqp(value))


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(max_examples=300)
@given(oracle_in_tables)
def test_hutch_reads_what_pamqp_writes_long(value: dict[str, Any]) -> None:
    test_hutch_reads_what_pamqp_writes.hypothesis.inner_test(value)


@ci_settings(max_examples=100)
@given(oracle_out_tables)
def test_pamqp_reencoding_of_hutch_tables_decodes_back(value: dict[str, Any]) -> None:
    """hutch -> pamqp decode -> pamqp encode -> hutch decode is the identity (modulo types)."""
    _, theirs = pamqp_decode.field_table(encode_table(value))
    expected = expected_after_roundtrip(value)
    if any(isinstance(v, float) for v in _leaves(expected)):
        return  # pamqp re-encodes floats as float32: lossy by design
    assert_same(decode_all(pamqp_encode.field_table(to_pamqp(from_pamqp(theirs)))), expected)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


# ---------------------------------------------------------------------------------------------------
# Hypothesis round trips over recursive field values


@ci_settings(max_examples=150)  # `make test`; the 300 of the long run below are in the slow set
@given(canonical_tables)
@example({"deep": [[[[{"x": [None]}]]]]})
def test_canonical_values_roundtrip_exactly(value: dict[str, Any]) -> None:
    raw = encode_table(value)
    assert_same(decode_all(raw), value)
    assert encode_table(decode_all(raw)) == raw


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(max_examples=300)
@given(canonical_tables)
@example({"deep": [[[[{"x": [None]}]]]]})
def test_canonical_values_roundtrip_exactly_long(value: dict[str, Any]) -> None:
    test_canonical_values_roundtrip_exactly.hypothesis.inner_test(value)


@ci_settings(max_examples=150)  # `make test`; the 300 of the long run below are in the slow set
@given(encodable_tables)
def test_every_encodable_value_roundtrips(value: dict[str, Any]) -> None:
    assert_same(decode_all(encode_table(value)), expected_after_roundtrip(value))


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(max_examples=300)
@given(encodable_tables)
def test_every_encodable_value_roundtrips_long(value: dict[str, Any]) -> None:
    test_every_encodable_value_roundtrips.hypothesis.inner_test(value)
