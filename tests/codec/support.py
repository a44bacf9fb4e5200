"""Shared helpers for the codec tests: Hypothesis settings, field-value strategies, sample methods,
and the normalisation that lets pamqp act as an oracle.

pamqp and hutch map some wire types to different Python types, so oracle comparisons go through
`from_pamqp` / `to_pamqp`:

- 'T' timestamp: pamqp uses `datetime` (and guesses milliseconds above 0xFFFFFFFF), hutch a
  `Timestamp` int of seconds. Oracle timestamps therefore stay <= 0xFFFFFFFF.
- 'x' byte array: pamqp uses `bytearray` (and refuses `bytes`), hutch `bytes`.
- longstr method fields: pamqp encodes only `str` and decodes to `str` when the bytes are UTF-8;
  hutch keeps them as `bytes`.
- 'D' decimal: pamqp *encodes* the mantissa signed but *decodes* it unsigned (so does RabbitMQ,
  which never interprets it); hutch, pika and the Java client read it signed. Negative decimals
  are therefore only checked in the pamqp -> hutch direction.
- longlong method fields (delivery tags): pamqp reads and writes them signed; the spec and hutch
  say unsigned. Oracle delivery tags stay below 2**63.
"""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hutch.amqp import spec
from hutch.amqp.table import Timestamp, TypedInt

# ---------------------------------------------------------------------------------------------------
# Hypothesis: derandomized (same examples on every run and machine), no example database, bounded.


def ci_settings(max_examples: int) -> settings:
    return settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------------------------------
# Typed deep equality: `True == 1 == 1.0` would hide a wrong type letter, so compare types too.


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):  # bitwise: NaN equals itself, -0.0 differs from 0.0
        return struct.pack(">d", a) == struct.pack(">d", b)
    return bool(a == b)


def assert_same(actual: Any, expected: Any) -> None:
    assert same(actual, expected), f"\nactual:   {actual!r}\nexpected: {expected!r}"


# ---------------------------------------------------------------------------------------------------
# Field-value strategies

INT_RANGES = {
    "b": (-(2**7), 2**7 - 1),
    "B": (0, 2**8 - 1),
    "s": (-(2**15), 2**15 - 1),
    "u": (0, 2**16 - 1),
    "I": (-(2**31), 2**31 - 1),
    "i": (0, 2**32 - 1),
    "l": (-(2**63), 2**63 - 1),
    "L": (-(2**63), 2**63 - 1),  # signed, as RabbitMQ reads it
}

keys = st.text(max_size=12)  # <= 48 UTF-8 bytes: under pamqp's 128-byte key truncation
int64s = st.integers(-(2**63), 2**63 - 1)
decimals = st.builds(lambda m, s: Decimal(m).scaleb(-s), st.integers(-(2**31), 2**31 - 1), st.integers(0, 255))
typed_ints = st.sampled_from(sorted(INT_RANGES)).flatmap(
    lambda letter: st.integers(*INT_RANGES[letter]).map(lambda v: TypedInt(v, letter))
)


def _nested(scalars: st.SearchStrategy[Any], list_type: type = list) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=3).map(list_type)
        | st.dictionaries(keys, children, max_size=3),
        max_leaves=6,
    )


# Canonical hutch values: exactly what hutch's decoder returns, so decode(encode(v)) is v itself.
canonical_scalars = st.one_of(
    st.booleans(),
    int64s,
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
    decimals,
    st.integers(0, 2**64 - 1).map(Timestamp),
    st.none(),
)
canonical_values = _nested(canonical_scalars)
canonical_tables = st.dictionaries(keys, canonical_values, max_size=4)

# Everything hutch accepts for encoding (adds TypedInt letters, tuples, bytearray, datetime).
datetimes = st.integers(0, 2**32 - 1).map(lambda s: dt.datetime.fromtimestamp(s, dt.UTC))
naive_datetimes = st.integers(0, 2**32 - 1).map(
    lambda s: dt.datetime.fromtimestamp(s, dt.UTC).replace(tzinfo=None)
)
encodable_scalars = st.one_of(
    canonical_scalars, typed_ints, st.binary(max_size=10).map(bytearray), datetimes, naive_datetimes
)
encodable_values = _nested(encodable_scalars, list_type=tuple) | _nested(encodable_scalars)
encodable_tables = st.dictionaries(keys, encodable_values, max_size=4)


def expected_after_roundtrip(value: Any) -> Any:
    """What hutch's decoder returns for a value hutch encoded."""
    if isinstance(value, dict):
        return {k: expected_after_roundtrip(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [expected_after_roundtrip(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, TypedInt):
        return int(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return Timestamp(int(value.timestamp()))
    return value


# hutch -> pamqp: values whose hutch encoding pamqp decodes to the same value (see module doc).
oracle_out_scalars = st.one_of(
    st.booleans(),
    int64s,
    typed_ints,
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.builds(lambda m, s: Decimal(m).scaleb(-s), st.integers(0, 2**31 - 1), st.integers(0, 255)),
    st.integers(0, 2**32 - 1).map(Timestamp),
    st.none(),
)
oracle_out_tables = st.dictionaries(keys, _nested(oracle_out_scalars), max_size=4)

# pamqp -> hutch: values pamqp can encode (float32 'f', bytearray 'x', datetime 'T', any decimal).
oracle_in_scalars = st.one_of(
    st.booleans(),
    int64s,
    st.floats(width=32, allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20).map(bytearray),
    decimals,
    datetimes,
    st.none(),
)
oracle_in_tables = st.dictionaries(keys, _nested(oracle_in_scalars), max_size=4)


def from_pamqp(value: Any) -> Any:
    """A value pamqp decoded (or an `oracle_in_*` value pamqp will encode), in hutch's Python types."""
    if isinstance(value, dict):
        return {k: from_pamqp(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_pamqp(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return Timestamp(int(value.timestamp()))
    return value


def to_pamqp(value: Any) -> Any:
    """A hutch-typed value as pamqp wants it for encoding."""
    if isinstance(value, dict):
        return {k: to_pamqp(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_pamqp(v) for v in value]
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, Timestamp):
        return dt.datetime.fromtimestamp(int(value), dt.UTC)
    return value


# ---------------------------------------------------------------------------------------------------
# Methods: every class, and a sample with a non-default, field-specific value for every field.

ALL_METHODS: list[type[spec.Method]] = sorted(spec.METHOD_CLASSES.values(), key=lambda c: c.INDEX)
FIELD_KINDS: dict[int, tuple[tuple[str, str], ...]] = {
    (class_id << 16) | method_id: tuple(fields)
    for class_id, _, methods in spec.METHODS
    for method_id, _, fields, _ in methods
}

# hutch field name -> pamqp attribute name, where they differ.
PAMQP_FIELD_NAMES = {("exchange.declare", "type"): "exchange_type"}

SAMPLE_TABLE: dict[str, Any] = {
    "str": "ünïcødé ✓",
    "bytes": b"\x00\xff\xfe",
    "true": True,
    "false": False,
    "int32": -(2**31),
    "int64": 2**40 + 7,
    "double": -1.25e300,
    "decimal": Decimal("3.14159"),
    "timestamp": Timestamp(1_700_000_000),
    "void": None,
    "array": [1, "two", [3.5, None], {"four": 4}],
    "table": {"nested": {"deeper": [True]}},
    "": "empty key",
}


def sample_value(kind: str, index: int, field: str, *, oracle: bool = False) -> Any:
    """A value distinct per field (so a transposition shows), never the default."""
    if kind == "octet":
        return 200 + index
    if kind == "short":
        return 0xFF00 + index
    if kind == "long":
        return 0xFFFF_0000 + index
    if kind == "longlong":
        return (2**63 - 1 - index) if oracle else (2**64 - 1 - index)
    if kind == "bit":
        return True
    if kind == "shortstr":
        return f"{field}-ü-{index}"
    if kind == "longstr":
        return f"{field}-\u2603-{index}".encode() + (b"" if oracle else b"\xff\x00")
    if kind == "table":
        return dict(SAMPLE_TABLE, field=field)
    raise AssertionError(kind)


def sample_method(cls: type[spec.Method], *, oracle: bool = False) -> spec.Method:
    fields = FIELD_KINDS[cls.INDEX]
    return cls(**{name: sample_value(kind, i, name, oracle=oracle) for i, (name, kind) in enumerate(fields)})


def method_strategy(cls: type[spec.Method], *, oracle: bool = False) -> st.SearchStrategy[spec.Method]:
    """Random values for every field of `cls`, within the field types' ranges."""
    per_kind: dict[str, st.SearchStrategy[Any]] = {
        "octet": st.integers(0, 2**8 - 1),
        "short": st.integers(0, 2**16 - 1),
        "long": st.integers(0, 2**32 - 1),
        "longlong": st.integers(0, 2**63 - 1 if oracle else 2**64 - 1),
        "bit": st.booleans(),
        "shortstr": st.text(max_size=63),  # <= 252 UTF-8 bytes
        "longstr": st.text(max_size=20).map(str.encode) if oracle else st.binary(max_size=40),
        "table": oracle_out_tables if oracle else canonical_tables,
    }
    fields = FIELD_KINDS[cls.INDEX]
    return st.builds(cls, **{name: per_kind[kind] for name, kind in fields})


any_method = st.sampled_from(ALL_METHODS).flatmap(method_strategy)


def sample_properties() -> spec.BasicProperties:
    return spec.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"x-death": [{"count": TypedInt(2, "l"), "reason": "expired", "time": Timestamp(1)}],
                 "x-match": "any"},
        delivery_mode=2,
        priority=9,
        correlation_id="corr-ü",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="guest",
        app_id="hutch-tests",
        cluster_id="cluster-x",
    )
