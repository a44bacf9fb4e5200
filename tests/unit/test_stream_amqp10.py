"""Stream entries as AMQP 1.0 messages (queues/stream/amqp10.py): 0-9-1 → 1.0 → 0-9-1 is the identity
for what pika can send, AMQP 1.0 messages of other clients read as 0-9-1, garbage is a ValueError."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.spec import BasicProperties
from hutch.amqp.table import Timestamp, TypedInt
from hutch.core.message import Message
from hutch.queues.stream import amqp10 as a

short = st.text(max_size=20)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), short,
              st.binary(max_size=20), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(short, inner, max_size=4)),
    max_leaves=8)
headers = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=5)
opt = st.one_of(st.none(), st.text(max_size=20))
props = st.builds(
    BasicProperties, content_type=opt, content_encoding=opt, headers=st.one_of(st.none(), headers.filter(bool)),
    delivery_mode=st.sampled_from([None, 1, 2]), priority=st.one_of(st.none(), st.integers(0, 255)),
    correlation_id=opt, reply_to=opt, expiration=st.one_of(st.none(), st.integers(0, 10**9).map(str)),
    message_id=opt, timestamp=st.one_of(st.none(), st.integers(0, 2**40)), type=opt, user_id=opt, app_id=opt)


@settings(deadline=None, max_examples=100)  # `make test`; the 200 of the long run below are in the slow set
@given(props, st.binary(max_size=300), short, short)
def test_091_round_trip(p: BasicProperties, body: bytes, exchange: str, routing_key: str) -> None:
    back = a.to_091(a.from_091(Message(exchange, routing_key, p, body)))
    assert (back.exchange, back.routing_key, back.body) == (exchange, routing_key, body)
    assert back.properties == p


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 200 examples
@settings(deadline=None, max_examples=200)
@given(props, st.binary(max_size=300), short, short)
def test_091_round_trip_long(p: BasicProperties, body: bytes, exchange: str, routing_key: str) -> None:
    test_091_round_trip.hypothesis.inner_test(p, body, exchange, routing_key)


def test_x_headers_go_to_annotations_and_the_rest_to_application_properties() -> None:
    entry = a.from_091(Message("", "q", BasicProperties(headers={"x-k": 1, "k": "v"}, type="t"), b"b"))
    sections = {code: value for code, value, _ in a.decode_sections(entry)}
    assert sections[a.MESSAGE_ANNOTATIONS][a.Symbol("x-k")] == 1
    assert sections[a.MESSAGE_ANNOTATIONS][a.Symbol("x-basic-type")] == "t"
    assert sections[a.MESSAGE_ANNOTATIONS][a.Symbol("x-routing-key")] == "q"
    assert sections[a.APPLICATION_PROPERTIES] == {"k": "v"}
    assert sections[a.DATA] == b"b"


def test_a_message_of_an_amqp_10_client_reads_as_091() -> None:
    msg_id = uuid.uuid4()
    entry = b"".join((
        a.section(a.PROPERTIES, [msg_id, None, None, None, None, None, a.Symbol("text/plain"), None, None,
                                 a.AmqpTimestamp(1_700_000_000_123)]),
        a.section(a.APPLICATION_PROPERTIES, {"region": "eu", "n": a.ULong(7)}),
        a.section(a.AMQP_VALUE, "hello"),
    ))
    m = a.to_091(entry, "", "s1")
    assert m.body == b"hello" and m.routing_key == "s1"
    assert m.properties.message_id == f"urn:uuid:{msg_id}"
    assert m.properties.content_type == "text/plain"
    assert m.properties.timestamp == Timestamp(1_700_000_000)
    assert m.properties.headers == {"region": "eu", "n": 7}


def test_arrays_and_described_values_decode() -> None:
    # an array of three uints (0xe0 size count ctor items) inside a list
    array = bytes([0xe0, 1 + 1 + 3 * 4, 3, 0x70]) + b"".join(i.to_bytes(4, "big") for i in (1, 2, 3))
    value, end = a.decode_value(memoryview(bytes([0xc0, 1 + len(array), 1]) + array), 0)
    assert value == [[1, 2, 3]] and end == 3 + len(array)


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_is_a_value_error(data: bytes) -> None:
    try:
        a.to_091(data)
    except ValueError:
        pass


def test_deep_nesting_is_refused() -> None:
    deep = b"\xc0\x02\x01" * 40 + b"\x40"
    with pytest.raises(ValueError):
        a.decode_value(memoryview(deep), 0)


@settings(deadline=None, max_examples=100)
@given(props, st.binary(max_size=300), short, st.integers(0, 2**63 - 1))
def test_delivering_at_an_offset_adds_the_header_and_nothing_else(p: BasicProperties, body: bytes, rk: str,
                                                                 offset: int) -> None:
    entry = a.from_091(Message("", rk, p, body))
    got = a.to_091_at(entry, offset, rk)
    want = dict(p.headers or {})
    want["x-stream-offset"] = offset
    assert got.properties.headers == want and got.body == body and got.routing_key == rk
    for name in ("delivery_mode", "content_type", "message_id", "timestamp", "priority", "expiration"):
        assert getattr(got.properties, name) == getattr(p, name), name


@settings(deadline=None, max_examples=100)
@given(st.sampled_from([None, 1, 2]), st.binary(max_size=300), short, short)
def test_the_fast_path_writes_the_bytes_of_the_generic_one(mode: int | None, body: bytes, x: str, rk: str) -> None:
    msg = Message(x, rk, BasicProperties(delivery_mode=mode), body)
    assert a.from_091(msg) == a._from_091(msg)
    assert a.to_091(a.from_091(msg)).properties == msg.properties


@settings(deadline=None, max_examples=100)
@given(st.sampled_from([None, 1, 2]), st.binary(max_size=300), short, short)
def test_the_publish_lanes_entry_is_the_generic_one(mode: int | None, body: bytes, x: str, rk: str) -> None:
    """What the channel's publish lane stores (`plain_mode` + `plain_entry`, from the raw property list)
    is what `from_091` of the message stores."""
    props = BasicProperties(delivery_mode=mode)
    raw = props.encode()
    assert a.plain_mode(raw) == mode
    assert a.plain_entry(x, rk, a.plain_mode(raw), body) == a._from_091(Message(x, rk, props, body))


@pytest.mark.parametrize("props", [BasicProperties(priority=3), BasicProperties(delivery_mode=2, timestamp=7),
                                   BasicProperties(delivery_mode=3), BasicProperties(headers={"k": 1})])
def test_a_property_list_with_more_than_the_delivery_mode_is_not_plain(props: BasicProperties) -> None:
    assert a.plain_mode(props.encode()) is False


# What RabbitMQ 3.10.8 stored for a pika publish to a stream (read back raw over its stream protocol with
# rstream, 2026-11-28): its 3.x layout, no header section, x-basic-* among annotations and application
# properties (it dropped the table and array headers "nested" and "arr" the publish also carried).
RABBITMQ_310_ENTRY = bytes.fromhex(
    "005372c16f0aa30d782d726f7574696e672d6b6579a107683233702d7273a30a782d65786368616e6765a100a310782d62617369632d7072696f726974795003a315782d62617369632d64656c69766572792d6d6f64655002a312782d62617369632d65787069726174696f6ea1053630303030005373c0340da103696430a00567756573744040a10172a10163a30a746578742f706c61696ea3047574663840830000018bcfe56800404040005374c13e0aa10c782d62617369632d74797065a10174a10e782d62617369632d6170702d6964a10161a1016b5401a10173a103737472a105782d666f6fa103626172005375a005626f647930")


def test_an_entry_written_by_rabbitmq_310_reads_as_what_pika_published() -> None:
    m = a.to_091(RABBITMQ_310_ENTRY)
    assert (m.exchange, m.routing_key, m.body) == ("", "h23p-rs", b"body0")
    assert m.properties == BasicProperties(
        headers={"k": 1, "s": "str", "x-foo": "bar"}, content_type="text/plain", delivery_mode=2, message_id="id0",
        priority=3, timestamp=1700000000, correlation_id="c", reply_to="r", expiration="60000", type="t",
        app_id="a", user_id="guest", content_encoding="utf8")


def test_the_prefix_memos_stay_bounded_and_every_entry_still_reads_back() -> None:
    a._prefixes.clear()
    a._heads.clear()
    for i in range(a.PREFIX_MEMO_MAX + 50):
        entry = a.from_091(Message("ex", f"rk-{i}", BasicProperties(delivery_mode=2), b"body %d" % i))
        got = a.to_091_at(entry, i)
        assert (got.exchange, got.routing_key, got.body) == ("ex", f"rk-{i}", b"body %d" % i)
        assert got.route_tail == b"\x02ex" + bytes([len(f"rk-{i}")]) + f"rk-{i}".encode()
        assert len(a._prefixes) <= a.PREFIX_MEMO_MAX and len(a._heads) <= a.PREFIX_MEMO_MAX


@settings(deadline=None, max_examples=300)
@given(st.sampled_from([None, 1, 2]), st.sampled_from([b"", b"x" * 255, b"y" * 256, b"z" * 70000]), short,
       st.integers(0, 400), st.integers(0, 255), st.booleans())
def test_a_memo_hit_reads_an_entry_as_a_memo_miss_does(mode: int | None, body: bytes, rk: str, at: int,
                                                       value: int, truncate: bool) -> None:
    """The memo only skips parsing a prefix already seen: a damaged or cut entry reads (or fails) the same
    way whether its prefix was memoized or not."""
    entry = bytearray(a.from_091(Message("x", rk, BasicProperties(delivery_mode=mode), body)))
    if truncate:
        del entry[min(at, len(entry)):]
    elif at < len(entry):
        entry[at] = value
    data = bytes(entry)

    def read() -> tuple[str, str, bytes, bytes] | str:
        try:
            m = a.to_091_at(data, 7)
        except ValueError as exc:
            return type(exc).__name__
        return m.exchange, m.routing_key, m.body, m.properties_raw

    a._heads.clear()
    missed = read()
    assert read() == missed


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(props, st.binary(max_size=50), short), min_size=1, max_size=6),
       st.integers(0, 2**62), st.lists(st.binary(max_size=30), max_size=3))
def test_a_chunk_converted_at_once_is_each_entry_converted_alone(
        msgs: list[tuple[BasicProperties, bytes, str]], first: int, garbage: list[bytes]) -> None:
    records = [(first + i, a.from_091(Message("ex", rk, p, body))) for i, (p, body, rk) in enumerate(msgs)]
    records += [(first + len(msgs) + i, g) for i, g in enumerate(garbage)]
    bad: list[tuple[int, str]] = []
    got = a.to_091_list(records, "dflt", bad)
    want, want_bad = [], []
    for offset, entry in records:  # the generic decoder, entry by entry
        try:
            want.append((offset, a.to_091(entry, "", "dflt", {"x-stream-offset": TypedInt(offset, "l")})))
        except ValueError:
            want_bad.append(offset)
    assert [o for o, _ in bad] == want_bad
    assert [(o, m.exchange, m.routing_key, m.properties, m.body, m.route_tail) for o, m in got] == \
        [(o, m.exchange, m.routing_key, m.properties, m.body, m.route_tail) for o, m in want]


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 2]), st.sampled_from(["rk", "rk2"]),
                          st.sampled_from([b"", b"a", b"x" * 255, b"y" * 256])), min_size=1, max_size=8),
       st.integers(0, 7), st.integers(0, 300), st.integers(0, 255), st.booleans())
def test_records_after_one_with_the_same_prefix_read_as_each_read_alone(
        shapes: list[tuple[int | None, str, bytes]], which: int, at: int, value: int, truncate: bool) -> None:
    """`to_091_list` reads only the data section of a record that starts with the previous plain record's
    prefix: a chunk of records sharing prefixes, one of them damaged or cut (in its prefix, its data
    section's header or its body), converts exactly as each record converted alone."""
    records = [(10 + i, a.from_091(Message("ex", rk, BasicProperties(delivery_mode=mode), body)))
               for i, (mode, rk, body) in enumerate(shapes)]
    offset, entry = records[which % len(records)]
    damaged = bytearray(entry)
    if truncate:
        del damaged[min(at, len(damaged)):]
    elif at < len(damaged):
        damaged[at] = value
    records[which % len(records)] = (offset, bytes(damaged))

    def alone(offset: int, entry: bytes) -> tuple[int, str, str, bytes, bytes] | None:
        try:
            m = a.to_091_at(entry, offset)
        except ValueError:
            return None
        return offset, m.exchange, m.routing_key, m.body, m.properties_raw

    bad: list[tuple[int, str]] = []
    got = [(o, m.exchange, m.routing_key, m.body, m.properties_raw) for o, m in a.to_091_list(records, "", bad)]
    want = [alone(o, e) for o, e in records]
    assert got == [w for w in want if w is not None]
    assert [o for o, _ in bad] == [o for (o, _), w in zip(records, want, strict=True) if w is None]


@given(st.integers(0, 2**64 - 1))
def test_any_091_timestamp_converts_and_wraps_as_rabbitmq(seconds: int) -> None:
    ms = a.timestamp_ms(seconds)
    assert -(2**63) <= ms < 2**63
    back = a.timestamp_s(ms)
    assert 0 <= back < 2**64
    if seconds * 1000 < 2**63:
        assert ms == seconds * 1000 and back == seconds


def test_timestamp_wrapping_matches_rabbitmq() -> None:
    # RabbitMQ 3.10.8 by hand: published with these 0-9-1 timestamps, read back from the stream
    assert [a.timestamp_s(a.timestamp_ms(t)) for t in (2**62, 2**63, 2**64 - 1)] == [0, 0, 2**64 - 1]
    assert a.timestamp_s(-1500) == 2**64 - 1  # towards zero, as Erlang's div
