"""Content-header properties (class basic): every property, every presence combination, pamqp oracle.

pamqp differences handled here: it names `type` `message_type`; it returns the timestamp as a
datetime (milliseconds guessed above 0xFFFFFFFF, so oracle timestamps stay below); it treats an
empty string as "absent" when encoding (hutch sends a present, empty string), and its
`cluster_id` defaults to '' rather than None.
"""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from hutch.amqp import spec
from hutch.amqp.errors import FRAME_ERROR, FrameError
from hutch.amqp.frames import FrameReader, content_frames
from hutch.amqp.table import encode_table

from .support import (
    assert_same,
    canonical_tables,
    ci_settings,
    expected_after_roundtrip,
    from_pamqp,
    oracle_in_tables,
    oracle_out_tables,
    sample_properties,
    to_pamqp,
)

NAMES = spec.PROPERTY_NAMES
KINDS = dict(spec.PROPERTY_FIELDS)
PAMQP_NAME = {"type": "message_type"}
PamqpProperties = pamqp_commands.Basic.Properties


def flag(name: str) -> int:
    return 1 << (15 - NAMES.index(name))


def sstr(value: str) -> bytes:
    raw = value.encode()
    return bytes([len(raw)]) + raw


def fields(props: spec.BasicProperties) -> dict[str, Any]:
    """The properties as a dict, compared with `same` (a NaN in the headers equals itself)."""
    return {name: getattr(props, name) for name in spec.PROPERTY_NAMES}


def roundtrip(props: spec.BasicProperties) -> spec.BasicProperties:
    raw = props.encode()
    decoded = spec.BasicProperties.decode(raw, 0)
    # decode at an offset, as the header frame is read (class, weight and body size come first)
    assert_same(fields(spec.BasicProperties.decode(b"\x00" * 12 + raw, 12)), fields(decoded))
    assert_same(fields(spec.BasicProperties.decode(memoryview(raw), 0)), fields(decoded))
    return decoded


def header_frame(props: spec.BasicProperties, body_size: int = 0, channel: int = 1) -> bytes:
    if body_size <= 1024:  # the real encoder (test_frames covers it in depth)
        parts = content_frames(channel, 60, props.encode(), b"\x00" * body_size, 0)
        return b"".join(parts[:3])  # the header frame; body frames follow
    raw = props.encode()
    return struct.pack(">BHIHHQ", 2, channel, 12 + len(raw), 60, 0, body_size) + raw + b"\xce"


def pamqp_reads(props: spec.BasicProperties, body_size: int = 3) -> pamqp_header.ContentHeader:
    frame = header_frame(props, body_size, channel=4)
    consumed, channel, content_header = pamqp_frame.unmarshal(frame)
    assert (consumed, channel) == (len(frame), 4)
    assert (content_header.class_id, content_header.weight, content_header.body_size) == (60, 0, body_size)
    return content_header


def assert_pamqp_agrees(props: spec.BasicProperties, theirs: Any) -> None:
    for name in NAMES:
        ours, value = getattr(props, name), getattr(theirs, PAMQP_NAME.get(name, name))
        if ours is None:
            assert value in (None, ""), name  # pamqp's cluster_id defaults to ''
        elif name == "timestamp":
            assert int(value.timestamp()) == ours
        elif name == "headers":
            assert_same(from_pamqp(value), expected_after_roundtrip(ours))
        else:
            assert type(value) is type(ours) and value == ours, name


def hutch_reads(theirs: Any, body_size: int = 5) -> spec.BasicProperties:
    frame = pamqp_frame.marshal(pamqp_header.ContentHeader(0, body_size, theirs), 6)
    reader = FrameReader(131072)
    reader.feed(frame)
    ((ftype, channel, payload),) = list(reader.frames())
    assert (ftype, channel) == (spec.FRAME_HEADER, 6)
    assert struct.unpack_from(">HHQ", payload) == (60, 0, body_size)
    return spec.BasicProperties.decode(payload, 12)


def pamqp_properties(**values: Any) -> Any:
    """pamqp Properties with `values` (hutch names), bypassing its client-side validation
    (delivery_mode in {1, 2}, cluster_id empty), which is policy, not wire format."""
    theirs = PamqpProperties()
    for name, value in values.items():
        setattr(theirs, PAMQP_NAME.get(name, name), value)
    return theirs


# ---------------------------------------------------------------------------------------------------
# Layout


def test_layout_matches_pamqp() -> None:
    assert [PAMQP_NAME.get(n, n) for n in NAMES] == PamqpProperties.__slots__
    for name, kind in spec.PROPERTY_FIELDS:
        pamqp_name = PAMQP_NAME.get(name, name)
        assert PamqpProperties.amqp_type(pamqp_name) == kind
        assert PamqpProperties.flags[pamqp_name] == flag(name)
    for name in ("headers", "delivery_mode", "priority", "expiration", "user_id", "reply_to", "timestamp"):
        assert getattr(spec, f"FLAG_{name.upper()}") == flag(name)


def test_no_properties() -> None:
    props = spec.BasicProperties()
    assert props.encode() == spec.EMPTY_PROPERTIES_RAW == b"\x00\x00"
    assert roundtrip(props) == props
    assert props.to_dict() == {}


def test_every_property_golden_bytes() -> None:
    props = sample_properties()
    expected = (
        b"\xff\xfc"
        + sstr("application/json") + sstr("gzip")
        + encode_table(props.headers)
        + b"\x02" + b"\x09"
        + sstr("corr-ü") + sstr("amq.rabbitmq.reply-to") + sstr("60000") + sstr("msg-1")
        + struct.pack(">Q", 1_700_000_000)
        + sstr("order.created") + sstr("guest") + sstr("hutch-tests") + sstr("cluster-x")
    )
    assert props.encode() == expected
    decoded = roundtrip(props)
    assert decoded == props
    for name in NAMES:
        assert_same(getattr(decoded, name), expected_after_roundtrip(getattr(props, name)))


@pytest.mark.parametrize("name", NAMES)
def test_each_property_alone(name: str) -> None:
    value = getattr(sample_properties(), name)
    props = spec.BasicProperties(**{name: value})
    raw = props.encode()
    assert struct.unpack_from(">H", raw)[0] == flag(name)
    decoded = roundtrip(props)
    assert decoded == props
    assert decoded.to_dict() == {name: expected_after_roundtrip(value)}
    assert_pamqp_agrees(props, pamqp_reads(props).properties)


@pytest.mark.parametrize("name", [n for n, k in spec.PROPERTY_FIELDS if k == "shortstr"])
def test_empty_strings_are_present(name: str) -> None:
    props = spec.BasicProperties(**{name: ""})
    assert props.encode() == struct.pack(">H", flag(name)) + b"\x00"
    assert getattr(roundtrip(props), name) == ""
    # pamqp does the opposite when it encodes: '' means absent.
    assert getattr(hutch_reads(pamqp_properties(**{name: ""})), name) is None


# ---------------------------------------------------------------------------------------------------
# All 2**14 presence combinations


def with_mask(mask: int, values: dict[str, Any]) -> spec.BasicProperties:
    return spec.BasicProperties(**{n: values[n] for i, n in enumerate(NAMES) if mask & (1 << (13 - i))})


def test_all_presence_combinations_exhaustively() -> None:
    values = sample_properties().to_dict()
    for mask in range(1 << 14):
        props = with_mask(mask, values)
        raw = props.encode()
        assert struct.unpack_from(">H", raw)[0] == mask << 2
        assert spec.BasicProperties.decode(raw, 0) == props, mask


def test_all_presence_combinations_against_pamqp() -> None:
    values = sample_properties().to_dict()
    for mask in range(0, 1 << 14, 7):  # every 7th mask: covers each bit on and off in every context
        props = with_mask(mask, values)
        assert_pamqp_agrees(props, pamqp_reads(props).properties)


def properties(*, oracle: bool) -> st.SearchStrategy[spec.BasicProperties]:
    shortstr = st.text(max_size=63)  # <= 252 UTF-8 bytes
    per_kind: dict[str, st.SearchStrategy[Any]] = {
        "shortstr": shortstr,
        "table": oracle_out_tables if oracle else canonical_tables,
        "octet": st.integers(0, 255),
        "timestamp": st.integers(0, 2**32 - 1 if oracle else 2**64 - 1),
    }

    @st.composite
    def build(draw: st.DrawFn) -> spec.BasicProperties:
        mask = draw(st.integers(0, (1 << 14) - 1))
        values = {n: draw(per_kind[KINDS[n]]) for i, n in enumerate(NAMES) if mask & (1 << (13 - i))}
        return spec.BasicProperties(**values)

    return build()


@ci_settings(max_examples=300)
@given(properties(oracle=False))
def test_roundtrip_property(props: spec.BasicProperties) -> None:
    raw = props.encode()
    present = sum(1 << (15 - i) for i, n in enumerate(NAMES) if getattr(props, n) is not None)
    assert struct.unpack_from(">H", raw)[0] == present
    decoded = roundtrip(props)
    for name in NAMES:
        assert_same(getattr(decoded, name), getattr(props, name))
    assert decoded.encode() == raw


@ci_settings(max_examples=250)
@given(properties(oracle=True), st.integers(0, 2**64 - 1))
def test_pamqp_reads_what_hutch_writes(props: spec.BasicProperties, body_size: int) -> None:
    assert_pamqp_agrees(props, pamqp_reads(props, body_size).properties)


@st.composite
def pamqp_values(draw: st.DrawFn) -> dict[str, Any]:
    per_kind: dict[str, st.SearchStrategy[Any]] = {
        "shortstr": st.text(min_size=1, max_size=63),  # pamqp drops ''
        "table": oracle_in_tables,
        "octet": st.integers(0, 255),
        "timestamp": st.integers(0, 2**32 - 1).map(lambda s: dt.datetime.fromtimestamp(s, dt.UTC)),
    }
    mask = draw(st.integers(0, (1 << 14) - 1))
    return {n: draw(per_kind[KINDS[n]]) for i, n in enumerate(NAMES) if mask & (1 << (13 - i))}


@ci_settings(max_examples=250)
@given(pamqp_values())
def test_hutch_reads_what_pamqp_writes(values: dict[str, Any]) -> None:
    decoded = hutch_reads(pamqp_properties(**values))
    for name in NAMES:
        expected = values.get(name)
        if name == "timestamp" and expected is not None:
            expected = int(expected.timestamp())
        elif name == "headers" and expected is not None:
            expected = from_pamqp(expected)
        assert_same(getattr(decoded, name), expected)


def test_pamqp_sample_both_ways() -> None:
    props = sample_properties()
    theirs = pamqp_reads(props).properties
    assert_pamqp_agrees(props, theirs)
    theirs.headers = to_pamqp(from_pamqp(theirs.headers))
    assert hutch_reads(theirs) == spec.BasicProperties(**expected_after_roundtrip(props.to_dict()))


# ---------------------------------------------------------------------------------------------------
# Errors


def assert_501(buf: bytes, offset: int = 0) -> None:
    with pytest.raises(FrameError) as info:
        spec.BasicProperties.decode(buf, offset)
    assert info.value.code == FRAME_ERROR


def test_flag_continuation_is_501() -> None:
    assert_501(b"\x00\x01")
    assert_501(b"\x80\x01" + sstr("text/plain") + b"\x00\x00")


def test_every_truncation_is_501() -> None:
    raw = sample_properties().encode()
    for cut in range(len(raw)):
        assert_501(raw[:cut])
        assert_501(b"\x00" * 12 + raw[:cut], 12)


@pytest.mark.parametrize("name", [n for n, k in spec.PROPERTY_FIELDS if k == "shortstr"])
def test_bad_utf8_in_a_shortstr_property_is_501(name: str) -> None:
    assert_501(struct.pack(">H", flag(name)) + b"\x02\xc3\x28")


def test_bad_headers_table_is_501() -> None:
    assert_501(struct.pack(">H", flag("headers")) + b"\x00\x00\x00\x03\x01kZ")


# ---------------------------------------------------------------------------------------------------
# The object


def test_object_api() -> None:
    props = sample_properties()
    copy = props.copy()
    assert copy == props and copy is not props
    copy.priority = 1
    assert props.priority == 9
    assert props != copy and props != object()
    assert "priority=9" in repr(props) and "None" not in repr(props)
    assert set(props.to_dict()) == set(NAMES)
    with pytest.raises(TypeError):
        spec.BasicProperties(typo=1)
