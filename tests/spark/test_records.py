"""A read task's chunk decoder: the compiled `_crecords.BatchBuilder` against its pure-Python reference
(`records.PyBatchBuilder`): the same record batches, `rows` and `nbytes`, and the same errors (type and
text), for any chunk - 0-9-1 publishes as RabbitMQ stores them, hand-made AMQP 1.0 layouts (properties
of every field type, annotations in map8 and map32, text that is not UTF-8), raw bytes, empty records,
sub-batches plain, gzip'd and zstd'd (and lying about their size), chunk ids near the top of the range,
and damaged chunks (a byte changed, cut short). And the other way: the stream sink's record of a plain
row is the broker's encoding byte for byte. Pure: no Spark session, no broker.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.queues.stream import chunk as ch
from hutch.queues.stream.amqp10 import from_091
from hutch.spark import records
from hutch.spark.records import PyBatchBuilder
from hutch.spark.stream_sink import PlainRecords

try:
    from hutch.spark import _crecords as compiled
except ImportError as exc:  # not built (no compiler or headers): the pure path runs; nothing to compare
    compiled = None
    NOT_BUILT = f"the compiled chunk decoder is not built ({exc}); `pip install -e .` builds it"
else:
    NOT_BUILT = ""

needs_compiled = pytest.mark.skipif(compiled is None, reason=NOT_BUILT or "built")
ci_like = settings(derandomize=True, database=None, deadline=None, max_examples=200)

_short = st.text(max_size=6)
_opt = st.one_of(st.none(), _short)


@st.composite
def published(draw: st.DrawFn) -> bytes:
    """A message published over AMQP 0-9-1, as the broker stores it."""
    props = BasicProperties(
        content_type=draw(_opt), content_encoding=draw(_opt), correlation_id=draw(_opt), reply_to=draw(_opt),
        message_id=draw(_opt), app_id=draw(_opt), type=draw(_opt), user_id=draw(_opt),
        expiration=draw(st.one_of(st.none(), st.sampled_from(["0", "60000", "x"]))),
        priority=draw(st.one_of(st.none(), st.integers(0, 9))),
        delivery_mode=draw(st.one_of(st.none(), st.sampled_from([1, 2]))),
        timestamp=draw(st.one_of(st.none(), st.integers(0, 2**40), st.integers(2**50, 2**52))),
        headers=draw(st.one_of(st.none(), st.dictionaries(_short, st.one_of(_short, st.integers(-5, 5)),
                                                          max_size=2))))
    return from_091(Message(draw(st.sampled_from(["", "ex"])), draw(_short), props, draw(st.binary(max_size=12))))


def _str8(raw: bytes, ctor: int = 0xa1) -> bytes:
    return bytes((ctor, len(raw))) + raw


_text_bytes = st.one_of(st.text(max_size=5).map(str.encode), st.binary(max_size=5))  # UTF-8 or not
_field = st.one_of(
    st.just(b"\x40"),
    _text_bytes.map(_str8),
    _text_bytes.map(lambda raw: _str8(raw, 0xa3)),
    st.integers(-2**63, 2**63 - 1).map(lambda ms: b"\x83" + struct.pack(">q", ms)),
    st.binary(max_size=4).map(lambda raw: _str8(raw, 0xa0)),  # binary (a user-id is): the generic decoder
    st.just(b"\x52\x07"),  # a small uint
)


@st.composite
def hand_made(draw: st.DrawFn) -> bytes:
    """An AMQP 1.0 record in the layouts the fast path reads, and near them."""
    parts = [draw(st.sampled_from([b"", b"\x00\x53\x70\xc0\x02\x01\x41", b"\x00\x53\x70\xc0\x02\x01\x42"]))]
    pairs = b"\xa3\x0ax-exchange" + _str8(draw(_text_bytes)) + b"\xa3\x0dx-routing-key" + _str8(draw(_text_bytes))
    count = 4
    if draw(st.booleans()):
        pairs += b"\xa3\x03x-y" + _str8(b"z")
        count = 6
    if draw(st.booleans()):
        parts.append(b"\x00\x53\x72\xc1" + bytes((len(pairs) + 1, count)) + pairs)
    else:
        parts.append(b"\x00\x53\x72\xd1" + struct.pack(">II", len(pairs) + 4, count) + pairs)
    if draw(st.booleans()):
        listed = draw(st.lists(_field, max_size=14))
        fields = b"".join(listed)
        count_field = len(listed) if draw(st.integers(0, 4)) else draw(st.integers(0, 14))  # sometimes wrong
        if draw(st.booleans()) and len(fields) + 1 < 256:
            parts.append(b"\x00\x53\x73\xc0" + bytes((len(fields) + 1, count_field)) + fields)
        else:
            parts.append(b"\x00\x53\x73\xd0" + struct.pack(">II", len(fields) + 4, count_field) + fields)
    if draw(st.booleans()):
        parts.append(b"\x00\x53\x74\xc1\x01\x00")  # empty application properties
    for body in draw(st.lists(st.binary(max_size=8), min_size=0, max_size=3)):
        parts.append(b"\x00\x53\x75\xa0" + bytes((len(body),)) + body if draw(st.booleans())
                     else b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body)
    return b"".join(parts)


_record = st.one_of(published(), hand_made(), st.binary(max_size=24), st.just(b""))


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` as it is, with one byte changed, or cut short."""
    how = draw(st.sampled_from(["as is", "as is", "byte", "cut"]))
    if not data or how == "as is":
        return data
    at = draw(st.integers(0, len(data) - 1))
    if how == "cut":
        return data[:at]
    return data[:at] + bytes((draw(st.integers(0, 255)),)) + data[at + 1:]


def _sub_batch(draw: st.DrawFn, recs: list[bytes]) -> ch.SubBatch:
    plain = b"".join(struct.pack(">I", len(r)) + r for r in recs)
    codec = draw(st.sampled_from([ch.NO_COMPRESSION, ch.GZIP, ch.ZSTD]))
    if codec == ch.GZIP:
        gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        body = gz.compress(plain) + gz.flush()
    elif codec == ch.ZSTD:
        body = bytes(cramjam.zstd.compress(plain))
    else:
        body = plain
    declared = len(plain) + draw(st.sampled_from([0, 0, 0, 1, -1]))  # sometimes a lie
    return ch.SubBatch(len(recs), codec, max(0, declared), body)


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    entries: list[ch.Entry] = []
    for _ in range(draw(st.integers(1, 5))):
        recs = [draw(damaged(draw(_record))) for _ in range(draw(st.integers(1, 3)))]
        if draw(st.integers(0, 4)) == 0:
            entries.append(_sub_batch(draw, recs))
        else:
            entries.extend(recs)
    chunk_id = draw(st.one_of(st.integers(0, 2**40), st.integers(2**63 - 8, 2**63 + 8),
                              st.integers(2**64 - 16, 2**64 - 1)))
    chunk = ch.encode(entries, timestamp=draw(st.integers(0, 2**41)), epoch=1, chunk_id=chunk_id)
    return draw(damaged(chunk)) if draw(st.integers(0, 3)) == 0 else chunk


def run(builder: Any, work: list[tuple[bytes, int, int, bool]]) -> list[Any]:
    """What a builder gives for chunks added in turn (flushing where told): batches, counts, or the error."""
    out: list[Any] = []
    try:
        for chunk, start, end, flush in work:
            builder.add_chunk(chunk, start, end)
            out.append((builder.rows, builder.nbytes))
            if flush:
                out.append(builder.flush())
        out.append(builder.flush())
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        out.append((type(exc).__name__, str(exc)))
    return out


def same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if hasattr(x, "equals"):
            if not (hasattr(y, "equals") and x.schema == y.schema and x.equals(y)):
                return False
        elif x != y:
            return False
    return True


_work = st.lists(st.tuples(chunks(), st.integers(0, 2**64), st.integers(0, 2**64 + 10), st.booleans()),
                 min_size=1, max_size=3)


def _settings(examples: int) -> settings:
    return settings(derandomize=True, database=None, deadline=None, max_examples=examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_same(work: list[tuple[bytes, int, int, bool]], include_headers: bool) -> None:
    work = [(c, s % (2**41) if s % 3 else s, e, f) for c, s, e, f in work]  # mostly ranges inside the chunk ids
    assert compiled is not None
    pure = run(PyBatchBuilder("s", 2, include_headers), work)
    fast = run(compiled.BatchBuilder("s", 2, include_headers), work)
    assert same(pure, fast), (pure, fast)


@needs_compiled
@_settings(60)
@given(_work, st.booleans())
def test_the_compiled_decoder_gives_the_references_batches_and_errors(
        work: list[tuple[bytes, int, int, bool]], include_headers: bool) -> None:
    check_same(work, include_headers)


@needs_compiled
@pytest.mark.slow
@_settings(3000)
@given(_work, st.booleans())
def test_the_compiled_decoder_gives_the_references_batches_and_errors_long(
        work: list[tuple[bytes, int, int, bool]], include_headers: bool) -> None:
    check_same(work, include_headers)


@needs_compiled
def test_the_read_tasks_use_the_compiled_decoder_when_it_is_built() -> None:
    assert records.COMPILED and records.describe() == "compiled chunk decoder: on"
    assert type(records.batch_builder("s", 0, True)) is not PyBatchBuilder


def test_a_batch_of_the_benchmarks_records_is_the_same_through_either_builder() -> None:
    """The two shapes the benchmark reads (a plain 0-9-1 publish; the stream sink's row with a message id
    and key each), 5,000 records in two chunks, read from offset 3 to 4,990: the rows a 0-9-1 consumer
    would get, through the builder the read tasks use."""
    plain = [from_091(Message("", "q", BasicProperties(delivery_mode=2), b"x" * 100)) for _ in range(2500)]
    sink = [from_091(Message("ss", str(i), BasicProperties(message_id=f"q:1:0:{i}", delivery_mode=2), b"y" * 100))
            for i in range(2500)]
    work = [(ch.encode(plain, timestamp=1, epoch=1, chunk_id=0), 3, 4990, False),
            (ch.encode(sink, timestamp=2, epoch=1, chunk_id=2500), 3, 4990, False)]
    pure = run(PyBatchBuilder("s", 1, True), work)
    used = run(records.batch_builder("s", 1, True), work)
    assert same(pure, used)
    batch = used[-1]
    assert batch.num_rows == 4987
    rows = batch.slice(0, 1).to_pylist() + batch.slice(4986, 1).to_pylist()
    assert (rows[0]["offset"], rows[0]["key"], rows[0]["value"], rows[0]["properties"]["delivery_mode"]) == \
        (3, "q", b"x" * 100, 2)
    assert (rows[1]["offset"], rows[1]["key"], rows[1]["exchange"], rows[1]["properties"]["message_id"]) == \
        (4989, "2489", "ss", "q:1:0:2489")


@ci_like
@given(st.text(max_size=8), st.text(max_size=300), st.text(max_size=300), st.binary(max_size=300),
       st.lists(st.tuples(st.sampled_from(["", "ss"]), st.text(max_size=4)), max_size=3))
def test_the_sinks_plain_record_is_the_brokers_encoding_byte_for_byte(
        exchange: str, routing_key: str, message_id: str, body: bytes, more: list[tuple[str, str]]) -> None:
    """The stream sink's record of a row without headers or properties is `from_091`'s, for any route,
    message id (str8 and str32) and body (data8 and data32), also after other routes (its kept prefix)."""
    plain = PlainRecords()
    for ex, rk in [*more, (exchange, routing_key)]:
        want = from_091(Message(ex, rk, BasicProperties(message_id=message_id, delivery_mode=2), body))
        assert plain.record(ex, rk, message_id, body) == want
