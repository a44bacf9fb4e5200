"""Every AMQP method: hutch round trip, and pamqp as an oracle in both directions.

The method set is generated from `spec.METHODS`; these tests check it against an independent
implementation (pamqp 3/4, generated from the RabbitMQ codegen JSON) field by field, so a wrong type,
a wrong order, a wrong bit position or a wrong method id shows up as a disagreement.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame

from hutch.amqp import spec
from hutch.amqp.errors import COMMAND_INVALID, FRAME_ERROR, ConnectionError_, FrameError
from hutch.amqp.frames import FrameReader, method_frame
from hutch.amqp.table import Timestamp

from .support import (
    ALL_METHODS,
    FIELD_KINDS,
    PAMQP_FIELD_NAMES,
    any_method,
    assert_same,
    ci_settings,
    expected_after_roundtrip,
    from_pamqp,
    method_strategy,
    oracle_in_tables,
    same,
    sample_method,
    sample_value,
)

# pamqp warns when it builds basic.recover-async; the warning is about clients, not the wire format.
pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")

IDS = [cls.NAME for cls in ALL_METHODS]
CONTENT_METHODS = {"basic.publish", "basic.return", "basic.deliver", "basic.get_ok"}


def pamqp_class(cls: type[spec.Method]) -> Any:
    return pamqp_commands.INDEX_MAPPING[cls.INDEX]


def pamqp_attr(cls: type[spec.Method], field: str) -> str:
    return PAMQP_FIELD_NAMES.get((cls.NAME, field), field)


def assert_field_equal(kind: str, hutch_value: Any, pamqp_value: Any, what: str) -> None:
    """`hutch_value` is what hutch holds (or decoded); `pamqp_value` what pamqp holds (or decoded)."""
    if kind == "longstr":
        raw = pamqp_value.encode() if isinstance(pamqp_value, str) else bytes(pamqp_value)
        assert hutch_value == raw, what
    elif kind == "table":
        assert same(expected_after_roundtrip(hutch_value), from_pamqp(pamqp_value)), (
            f"{what}: hutch {hutch_value!r} != pamqp {pamqp_value!r}")
    else:
        assert type(hutch_value) is type(pamqp_value) and hutch_value == pamqp_value, (
            f"{what}: hutch {hutch_value!r} != pamqp {pamqp_value!r}")


def decode_with_pamqp(frame: bytes, channel: int) -> Any:
    consumed, got_channel, obj = pamqp_frame.unmarshal(frame)
    assert consumed == len(frame)
    assert got_channel == channel
    return obj


def compare_with_pamqp(method: spec.Method, pamqp_obj: Any) -> None:
    cls = type(method)
    assert pamqp_obj.index == cls.INDEX
    for name, kind in FIELD_KINDS[cls.INDEX]:
        assert_field_equal(kind, getattr(method, name), getattr(pamqp_obj, pamqp_attr(cls, name)),
                           f"{cls.NAME}.{name}")


def marshal_with_pamqp(cls: type[spec.Method], values: dict[str, Any], channel: int) -> bytes:
    """pamqp's encoding of `cls` with `values` (hutch field names).

    pamqp's `validate()` enforces client-side policy that is not wire format (deprecated fields
    fixed to '' / '0' / False, ticket 0, a name regex), so it is switched off: we compare encodings.
    """
    pcls = pamqp_class(cls)
    obj = pcls.__new__(pcls)
    for name, value in values.items():
        setattr(obj, pamqp_attr(cls, name), value)
    with mock.patch.object(pcls, "validate", lambda self: None):
        return pamqp_frame.marshal(obj, channel)


def read_one_frame(data: bytes) -> tuple[int, int, bytes]:
    reader = FrameReader(0)
    reader.feed(data)
    frames = list(reader.frames())
    assert len(frames) == 1 and reader.buffered == 0
    return frames[0]


# ---------------------------------------------------------------------------------------------------
# The method table itself


def test_method_set_is_pamqps() -> None:
    assert {cls.INDEX for cls in ALL_METHODS} == set(pamqp_commands.INDEX_MAPPING)


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_fields_match_pamqp_in_name_type_and_order(cls: type[spec.Method]) -> None:
    pcls = pamqp_class(cls)
    ours = [(pamqp_attr(cls, name), kind) for name, kind in FIELD_KINDS[cls.INDEX]]
    theirs = [(attr, pcls.amqp_type(attr)) for attr in pcls.__slots__]
    assert ours == theirs
    assert tuple(name for name, _ in FIELD_KINDS[cls.INDEX]) == cls.FIELDS


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_class_metadata(cls: type[spec.Method]) -> None:
    assert cls.INDEX == (cls.CLASS_ID << 16) | cls.METHOD_ID
    assert spec.METHOD_CLASSES[cls.INDEX] is cls
    assert spec.method_name(cls.CLASS_ID, cls.METHOD_ID) == cls.NAME
    assert (cls.NAME in CONTENT_METHODS) is cls.HAS_CONTENT
    pamqp_name = pamqp_class(cls).name  # e.g. "Basic.Return", "Connection.UpdateSecretOk"
    class_name, method_part = pamqp_name.split(".")
    assert getattr(getattr(spec, class_name), method_part) is cls  # spec.Basic.Return, ...
    assert cls.NAME.replace("_", "") == pamqp_name.lower()


def test_method_name_of_unknown_ids() -> None:
    assert spec.method_name(30, 10) == "30.10"


# ---------------------------------------------------------------------------------------------------
# hutch round trip


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_roundtrip_with_every_field_set(cls: type[spec.Method]) -> None:
    method = sample_method(cls)
    payload = method.encode()
    assert payload[:4] == cls.INDEX.to_bytes(4, "big")
    decoded = spec.decode_method(payload)
    assert type(decoded) is cls
    assert decoded == method
    for name in cls.FIELDS:  # typed comparison: a bool must not come back as 1
        assert_same(getattr(decoded, name), expected_after_roundtrip(getattr(method, name)))
    assert decoded.encode() == payload
    assert spec.decode_method(memoryview(payload)) == method
    assert spec.decode_method(bytearray(payload)) == method


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_roundtrip_through_a_method_frame(cls: type[spec.Method]) -> None:
    method = sample_method(cls)
    ftype, channel, payload = read_one_frame(method_frame(2047, method))
    assert (ftype, channel) == (spec.FRAME_METHOD, 2047)
    assert spec.decode_method(payload) == method


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_defaults_roundtrip(cls: type[spec.Method]) -> None:
    """Defaults encode; an absent (None) table decodes as {} and a longstr as bytes."""
    decoded = spec.decode_method(cls().encode())
    for name, kind in FIELD_KINDS[cls.INDEX]:
        expected = {"table": {}, "longstr": b""}.get(kind, getattr(cls(), name))
        assert_same(getattr(decoded, name), expected)


BIT_CASES = [
    (cls, name)
    for cls in ALL_METHODS
    for name, kind in FIELD_KINDS[cls.INDEX]
    if kind == "bit"
]


@pytest.mark.parametrize(("cls", "bit"), BIT_CASES, ids=[f"{c.NAME}.{b}" for c, b in BIT_CASES])
def test_each_bit_alone(cls: type[spec.Method], bit: str) -> None:
    """One bit set, the others clear: catches swapped bit positions, in hutch and against pamqp."""
    values = {name: sample_value(kind, i, name, oracle=True)
              for i, (name, kind) in enumerate(FIELD_KINDS[cls.INDEX])}
    for name, kind in FIELD_KINDS[cls.INDEX]:
        if kind == "bit":
            values[name] = name == bit
    method = cls(**values)
    decoded = spec.decode_method(method.encode())
    assert decoded == method
    pamqp_obj = decode_with_pamqp(method_frame(1, method), 1)
    compare_with_pamqp(method, pamqp_obj)


# ---------------------------------------------------------------------------------------------------
# pamqp as the oracle


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_hutch_encoding_decodes_with_pamqp(cls: type[spec.Method]) -> None:
    method = sample_method(cls, oracle=True)
    compare_with_pamqp(method, decode_with_pamqp(method_frame(5, method), 5))


PAMQP_SAMPLE_TABLE: dict[str, Any] = {
    # pamqp picks the smallest integer letter, so these arrive as b, s, u, I, i and l.
    "b": -5, "s": -300, "u": 60000, "I": -70000, "i": 3_000_000_000, "l": -(2**40),
    "float32": 1.5,  # pamqp writes floats as 'f' (float32): exact only for float32 values
    "decimal": Decimal("-12.345"),  # pamqp writes the mantissa signed
    "bytes": bytearray(b"\x00\x01\xff"),
    "timestamp": dt.datetime(2024, 2, 29, 12, 0, 0, tzinfo=dt.UTC),
    "bool": True,
    "none": None,
    "str": "ünï",
    "array": [1, "a", [None, False], {"k": 2.25}],
    "table": {"x": {"y": "z"}},
}


def pamqp_sample_value(kind: str, index: int, field: str) -> Any:
    if kind == "longstr":
        return f"{field}-\u2603-{index}"  # pamqp encodes only str
    if kind == "table":
        return dict(PAMQP_SAMPLE_TABLE, field=field)
    return sample_value(kind, index, field, oracle=True)


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_pamqp_encoding_decodes_with_hutch(cls: type[spec.Method]) -> None:
    fields = FIELD_KINDS[cls.INDEX]
    values = {name: pamqp_sample_value(kind, i, name) for i, (name, kind) in enumerate(fields)}
    frame = marshal_with_pamqp(cls, values, channel=9)
    ftype, channel, payload = read_one_frame(frame)
    assert (ftype, channel) == (spec.FRAME_METHOD, 9)
    decoded = spec.decode_method(payload)
    assert type(decoded) is cls
    for name, kind in fields:
        got = getattr(decoded, name)
        if kind == "longstr":
            assert got == values[name].encode()
        elif kind == "table":
            assert_same(got, from_pamqp(values[name]))
        else:
            assert_same(got, values[name])


TABLELESS = [cls for cls in ALL_METHODS if all(kind != "table" for _, kind in FIELD_KINDS[cls.INDEX])]


@pytest.mark.parametrize("cls", TABLELESS, ids=[cls.NAME for cls in TABLELESS])
def test_frames_are_byte_identical_to_pamqps(cls: type[spec.Method]) -> None:
    """Without tables (where the two pick different integer letters) the encodings are the same bytes."""
    method = sample_method(cls, oracle=True)
    values = {name: getattr(method, name) for name in cls.FIELDS}
    for name, kind in FIELD_KINDS[cls.INDEX]:
        if kind == "longstr":
            values[name] = values[name].decode()
    assert method_frame(11, method) == marshal_with_pamqp(cls, values, 11)


def test_pamqp_table_letters_decode_to_hutch_types() -> None:
    """The integer letters pamqp chooses (b s u I i l) all decode to plain ints in hutch."""
    values = {"ticket": 0, "queue": "q", "passive": False, "durable": True, "exclusive": False,
              "auto_delete": False, "nowait": False, "arguments": PAMQP_SAMPLE_TABLE}
    payload = read_one_frame(marshal_with_pamqp(spec.Queue.Declare, values, 1))[2]
    args = spec.decode_method(payload).arguments
    assert [type(args[k]) for k in ("b", "s", "u", "I", "i", "l")] == [int] * 6
    assert args["timestamp"] == Timestamp(1709208000)


@ci_settings(max_examples=300)
@given(any_method)
def test_roundtrip_property(method: spec.Method) -> None:
    payload = method.encode()
    decoded = spec.decode_method(payload)
    assert decoded == method
    for name in type(method).FIELDS:
        assert_same(getattr(decoded, name), getattr(method, name))
    assert decoded.encode() == payload


@ci_settings(max_examples=300)
@given(st.sampled_from(ALL_METHODS).flatmap(lambda cls: method_strategy(cls, oracle=True)))
def test_pamqp_agrees_with_hutch_encoding_property(method: spec.Method) -> None:
    compare_with_pamqp(method, decode_with_pamqp(method_frame(3, method), 3))


@st.composite
def pamqp_values(draw: st.DrawFn) -> tuple[type[spec.Method], dict[str, Any]]:
    cls = draw(st.sampled_from(ALL_METHODS))
    per_kind: dict[str, st.SearchStrategy[Any]] = {
        "octet": st.integers(0, 2**8 - 1),
        "short": st.integers(0, 2**16 - 1),
        "long": st.integers(0, 2**32 - 1),
        "longlong": st.integers(0, 2**63 - 1),
        "bit": st.booleans(),
        "shortstr": st.text(max_size=63),
        "longstr": st.text(max_size=20),
        "table": oracle_in_tables,
    }
    return cls, {name: draw(per_kind[kind]) for name, kind in FIELD_KINDS[cls.INDEX]}


@ci_settings(max_examples=300)
@given(pamqp_values())
def test_hutch_agrees_with_pamqp_encoding_property(case: tuple[type[spec.Method], dict[str, Any]]) -> None:
    cls, values = case
    decoded = spec.decode_method(read_one_frame(marshal_with_pamqp(cls, values, 1))[2])
    assert type(decoded) is cls
    for name, kind in FIELD_KINDS[cls.INDEX]:
        expected = values[name]
        if kind == "longstr":
            expected = expected.encode()
        elif kind == "table":
            expected = from_pamqp(expected)
        assert_same(getattr(decoded, name), expected)


# ---------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(("class_id", "method_id"), [(30, 10), (99, 10), (60, 999), (0, 0), (65535, 65535)])
def test_unknown_method_is_503_with_its_ids(class_id: int, method_id: int) -> None:
    with pytest.raises(ConnectionError_) as info:
        spec.decode_method(class_id.to_bytes(2, "big") + method_id.to_bytes(2, "big") + b"\x00" * 8)
    err = info.value
    assert (err.code, err.class_id, err.method_id) == (COMMAND_INVALID, class_id, method_id)
    assert not isinstance(err, FrameError)


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x3c\x00"])
def test_payload_shorter_than_method_id_is_501(payload: bytes) -> None:
    with pytest.raises(FrameError) as info:
        spec.decode_method(payload)
    assert info.value.code == FRAME_ERROR


@pytest.mark.parametrize("cls", ALL_METHODS, ids=IDS)
def test_every_truncation_is_501(cls: type[spec.Method]) -> None:
    payload = sample_method(cls).encode()
    for cut in range(len(payload)):
        with pytest.raises(FrameError) as info:
            spec.decode_method(payload[:cut])
        assert info.value.code == FRAME_ERROR, cut


SHORTSTR_CASES = [
    (cls, name) for cls in ALL_METHODS for name, kind in FIELD_KINDS[cls.INDEX] if kind == "shortstr"
]


@pytest.mark.parametrize(("cls", "field"), SHORTSTR_CASES, ids=[f"{c.NAME}.{f}" for c, f in SHORTSTR_CASES])
def test_bad_utf8_in_a_shortstr_is_501(cls: type[spec.Method], field: str) -> None:
    marker = "\x01" * 7  # a shortstr no other field produces
    method = sample_method(cls)
    setattr(method, field, marker)
    payload = method.encode()
    assert payload.count(b"\x07" + marker.encode()) == 1
    bad = payload.replace(b"\x07" + marker.encode(), b"\x07\xff\xfe\x01\x01\x01\x01\x01")
    with pytest.raises(FrameError) as info:
        spec.decode_method(bad)
    assert info.value.code == FRAME_ERROR


def test_shortstr_longer_than_255_bytes_does_not_encode() -> None:
    spec.Queue.Declare(queue="é" * 127).encode()  # 254 bytes: fine
    with pytest.raises(ValueError):
        spec.Queue.Declare(queue="é" * 128).encode()


def test_longstr_accepts_str_and_decodes_to_bytes() -> None:
    decoded = spec.decode_method(spec.Connection.StartOk(response="\x00guest\x00guest").encode())
    assert decoded.response == b"\x00guest\x00guest"
