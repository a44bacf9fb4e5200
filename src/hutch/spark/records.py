"""A stream's stored records (AMQP 1.0 messages as RabbitMQ stores them) -> the values of a read's row.

Owns: `stream_records_batch` (records -> one Arrow record batch in the stream read's schema) and
`RecordDecoder`, which turns one record into (key, value, exchange, timestamp µs, headers, the
property values in `schema.PROPERTY_COLUMNS` order): what an AMQP 0-9-1 consumer of the stream would
receive, by the broker's own mapping (`hutch.queues.stream.amqp10.to_091`), at a fraction of its cost.

How: a record is split into its sections by their size fields alone (nothing decoded). The sections
that repeat from message to message - header, message annotations (exchange, routing key, `x-`
headers), application properties - are mapped once per distinct byte string by `to_091` itself (a
bounded cache), so their meaning is exactly the broker's. The properties section, unique per message
when it carries a `message_id`, is decoded with the AMQP 1.0 value codec and its fields taken as
`to_091` takes them. The data sections are the body. A record with any other section (delivery
annotations, amqp-value, a footer...) or an unexpected encoding goes through `to_091` whole; one that
is not an AMQP 1.0 message at all is a row whose value is its bytes.

Rules: caches hold at most `CACHE_MAX` entries each (emptied when full); every length read is checked
against the record (a short or garbled record takes the slow path, whose decoder is bounded by its
input, and at worst becomes a raw row).
"""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, Any

from hutch.amqp.spec import BasicProperties
from hutch.queues.stream.amqp10 import _str as _text  # the broker's rule for a properties field as text
from hutch.queues.stream.amqp10 import decode_value, to_091
from hutch.queues.stream.chunk import record_list

from .schema import NO_PROPS_ROW, arrow_stream_schema, header_text, struct_column

if TYPE_CHECKING:
    import pyarrow as pa

CACHE_MAX = 4096
HEADER, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES, DATA = 0x70, 0x72, 0x73, 0x74, 0x75
_EMPTY_DATA = b"\x00\x53\x75\xa0\x00"
_U32 = struct.Struct(">I")
# constructor -> (width of its size field, bytes before the size counts); sizes of fixed-width values
_SIZED = {0xa0: 1, 0xa1: 1, 0xa3: 1, 0xc0: 1, 0xc1: 1, 0xb0: 4, 0xb1: 4, 0xb3: 4, 0xd0: 4, 0xd1: 4}
_FIXED = {0x40: 0, 0x45: 0}

Row = tuple[str | None, bytes, str | None, int | None, Any, tuple[Any, ...]]
Base = tuple[str, str, Any, BasicProperties]  # (routing key, exchange, headers column value, properties)
INT64_MAX = (1 << 63) - 1
_MICROS_MAX_S = INT64_MAX // 1_000_000  # the latest timestamp (in seconds) a timestamp[us] column holds


def micros(seconds: int) -> int:
    """A timestamp property (whole seconds) in the µs of the `timestamp` columns; ValueError past what they
    hold (a publisher's creation time of ±292,000 years)."""
    if not -_MICROS_MAX_S <= seconds <= _MICROS_MAX_S:
        raise ValueError(f"a message's timestamp of {seconds} s is out of range")
    return seconds * 1_000_000


def split(record: bytes) -> tuple[dict[int, bytes], bytes] | None:
    """({section code: its bytes} of the non-data sections, the body) of a record in the layouts
    AMQP 0-9-1 and stream clients write, or None (anything else: the caller takes the slow path)."""
    sections: dict[int, bytes] = {}
    body: list[bytes] = []
    pos, n = 0, len(record)
    while pos < n:
        if n - pos < 4 or record[pos] != 0x00 or record[pos + 1] != 0x53:
            return None
        code, ctor = record[pos + 2], record[pos + 3]
        start = pos + 4
        width = _SIZED.get(ctor)
        if width is None:
            if ctor not in _FIXED:
                return None
            end = start
        elif width == 1:
            if start >= n:
                return None
            end = start + 1 + record[start]
        else:
            if start + 4 > n:
                return None
            end = start + 4 + _U32.unpack_from(record, start)[0]
        if end > n:
            return None
        if code == DATA:
            if width is None or ctor not in (0xa0, 0xb0):
                return None
            body.append(record[start + width:end])
        elif code in (HEADER, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES) and code not in sections \
                and not body:
            sections[code] = record[pos:end]
        else:
            return None
        pos = end
    if not body:
        return None
    return sections, body[0] if len(body) == 1 else b"".join(body)


class RecordDecoder:
    """Records -> row values, with its caches (one decoder per read task)."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        # (header, annotations, application properties) bytes -> (key, exchange, headers, props)
        self._base: dict[bytes, Base] = {}
        # properties section bytes -> (content_type, content_encoding, correlation_id, reply_to, message_id,
        # timestamp s, user_id, app_id)
        self._props: dict[bytes, tuple[Any, ...]] = {}
        self._routes: dict[bytes, tuple[str, str]] = {}  # annotations bytes -> (exchange, routing key)

    def row(self, record: bytes) -> Row:
        parts = split(record)
        if parts is None:
            return self._slow(record)
        sections, body = parts
        annotations = sections.get(MESSAGE_ANNOTATIONS)
        route = self.route(annotations)
        if route is not None:  # annotations say where it was published and nothing else: not in the key
            base = self.plain_base(sections.get(HEADER, b""), sections.get(APPLICATION_PROPERTIES, b""))
        else:
            base = self._base_cached(sections.get(HEADER, b"") + sections.get(MESSAGE_ANNOTATIONS, b"") +
                                     b"\x02" + sections.get(APPLICATION_PROPERTIES, b""), sections, True)
        if base is None:
            return self._slow(record)
        key, exchange, headers, p = base
        if route is not None:
            exchange, key = route
        raw_props = sections.get(PROPERTIES)
        if raw_props is None:
            if p.app_id is None and p.type is None and p.priority is None and p.expiration is None:
                return key, body, exchange, None, headers, _mode_only(p.delivery_mode)
            fields: tuple[Any, ...] = (None,) * 8
        else:
            got = self._props.get(raw_props)
            if got is None:
                got = self._properties(raw_props)
                if got is None:
                    return self._slow(record)
                if len(self._props) >= CACHE_MAX:
                    self._props.clear()
                self._props[raw_props] = got
            fields = got
        ctype, cenc, corr, reply_to, message_id, ts_s, user_id, app_id = fields
        ts = None if ts_s is None else micros(ts_s)
        return key, body, exchange, ts, headers, (
            ctype, cenc, p.delivery_mode, p.priority, corr, reply_to, p.expiration, message_id, ts, p.type,
            user_id, p.app_id if p.app_id is not None else app_id, None)

    def route(self, annotations: bytes | None) -> tuple[str, str] | None:
        """(exchange, routing key) of a message-annotations section that says only that (`_route`), cached."""
        if annotations is None:
            return None
        route = self._routes.get(annotations)
        if route is None:
            route = _route(annotations)
            if route is not None:
                if len(self._routes) >= CACHE_MAX:
                    self._routes.clear()
                self._routes[annotations] = route
        return route

    def plain_base(self, header: bytes, application_properties: bytes) -> Base | None:
        """What a record whose annotations hold only its route (`route`) takes from its header and
        application-properties sections (b"": absent): (routing key, exchange, headers, properties) by
        the broker's mapping, the first two replaced by the route's; None: not mapped (the slow path)."""
        return self._base_cached(header + b"\x01" + application_properties,
                                 {HEADER: header, APPLICATION_PROPERTIES: application_properties}, False)

    def _base_cached(self, key: bytes, sections: dict[int, bytes], annotations: bool) -> Base | None:
        base = self._base.get(key)
        if base is None:
            base = self._base_of(sections, annotations)
            if base is None:
                return None
            if len(self._base) >= CACHE_MAX:
                self._base.clear()
            self._base[key] = base
        return base

    def _base_of(self, sections: dict[int, bytes], annotations: bool) -> Base | None:
        """What the header, annotations (unless left out: they only said where the message was published)
        and application properties say, by the broker's mapping."""
        codes = (HEADER, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES) if annotations else (HEADER, APPLICATION_PROPERTIES)
        try:
            m = to_091(b"".join(sections.get(code, b"") for code in codes) + _EMPTY_DATA)
        except ValueError:
            return None
        p = m.properties
        assert p is not None
        headers = [(str(k), header_text(v)) for k, v in p.headers.items()] if self.include_headers and p.headers \
            else None
        return m.routing_key, m.exchange, headers, p

    @staticmethod
    def _properties(raw: bytes) -> tuple[Any, ...] | None:
        try:
            f = _simple_list(raw)
        except UnicodeDecodeError:
            return None
        if f is None:
            try:
                value, end = decode_value(memoryview(raw), 3)
            except ValueError:
                return None
            if end != len(raw) or not isinstance(value, list):
                return None
            f = value + [None] * (13 - len(value))
        ts = f[9]
        return (_text(f[6]), _text(f[7]), _text(f[5]), _text(f[4]), _text(f[0]),
                None if ts is None else int(ts) // 1000, _text(f[1]), _text(f[10]))

    def _slow(self, record: bytes) -> Row:
        try:
            m = to_091(record)
        except ValueError:
            return None, bytes(record), None, None, None, NO_PROPS_ROW
        p = m.properties
        assert p is not None
        ts = None if p.timestamp is None else micros(int(p.timestamp))
        headers = [(str(k), header_text(v)) for k, v in p.headers.items()] if self.include_headers and p.headers \
            else None
        return m.routing_key, bytes(m.body), m.exchange, ts, headers, (
            p.content_type, p.content_encoding, p.delivery_mode, p.priority, p.correlation_id, p.reply_to,
            p.expiration, p.message_id, ts, p.type, p.user_id, p.app_id, p.cluster_id)


_SYM_EXCHANGE = b"\xa3\x0ax-exchange"
_SYM_ROUTING_KEY = b"\xa3\x0dx-routing-key"


def _route(raw: bytes | None) -> tuple[str, str] | None:
    """(exchange, routing key) of message annotations (map8 or map32) that hold exactly `x-exchange` and
    `x-routing-key` with str8 values, in that order (what a 0-9-1 publish and the stream sink write);
    None otherwise."""
    if raw is None or len(raw) < 12:
        return None
    if raw[3] == 0xc1 and raw[5] == 4 and 5 + raw[4] == len(raw):
        pos = 6
    elif raw[3] == 0xd1 and _U32.unpack_from(raw, 8)[0] == 4 and 8 + _U32.unpack_from(raw, 4)[0] == len(raw):
        pos = 12
    else:
        return None
    out: list[str] = []
    for name in (_SYM_EXCHANGE, _SYM_ROUTING_KEY):
        if raw[pos:pos + len(name)] != name:
            return None
        pos += len(name)
        if pos + 1 >= len(raw) or raw[pos] != 0xa1:
            return None
        end = pos + 2 + raw[pos + 1]
        if end > len(raw):
            return None
        try:
            out.append(raw[pos + 2:end].decode("utf-8"))
        except UnicodeDecodeError:
            return None
        pos = end
    return (out[0], out[1]) if pos == len(raw) else None


def _simple_list(raw: bytes) -> list[Any] | None:
    """The fields of a properties section (at offset 3) that is a list8 or list32 of nulls, str8/sym8 (as text),
    and timestamps - what 0-9-1 publishers' properties become - padded to 13; None for anything else
    (the generic decoder takes it)."""
    n = len(raw)
    if n >= 6 and raw[3] == 0xc0 and 5 + raw[4] == n:
        count, pos = raw[5], 6
    elif n >= 12 and raw[3] == 0xd0 and 8 + _U32.unpack_from(raw, 4)[0] == n:
        count, pos = _U32.unpack_from(raw, 8)[0], 12
    else:
        return None
    if count > 13:
        return None
    out: list[Any] = []
    for _ in range(count):
        if pos >= n:
            return None
        ctor = raw[pos]
        if ctor == 0x40:
            out.append(None)
            pos += 1
        elif ctor == 0xa1 or ctor == 0xa3:
            end = pos + 2 + raw[pos + 1] if pos + 1 < n else n + 1
            if end > n:
                return None
            out.append(raw[pos + 2:end].decode("utf-8"))
            pos = end
        elif ctor == 0x83:
            if pos + 9 > n:
                return None
            out.append(int.from_bytes(raw[pos + 1:pos + 9], "big", signed=True))
            pos += 9
        else:
            return None
    if pos != n:
        return None
    return out + [None] * (13 - len(out))


_MODE_ROWS: dict[int | None, tuple[Any, ...]] = {}


def _mode_only(mode: int | None) -> tuple[Any, ...]:
    row = _MODE_ROWS.get(mode)
    if row is None:
        row = _MODE_ROWS[mode] = (None, None, mode) + (None,) * 10
    return row


def stream_records_batch(records: list[tuple[int, bytes]], stream: str, include_headers: bool,
                         partition: int = 0, decoder: RecordDecoder | None = None) -> pa.RecordBatch:
    """One record batch (`schema.STREAM_SCHEMA`) from (offset, stored record) in order. `timestamp` is the
    publisher's timestamp property (null when unset, so that a re-read gives the same rows); `headers`
    is null for a message without headers; a record that is not an AMQP 1.0 message (a stream client
    that published raw bytes) is a row with those bytes as `value` and nothing else."""
    row_of = (decoder or RecordDecoder(include_headers)).row
    return rows_batch([(offset, row_of(record)) for offset, record in records], stream, partition)


def rows_batch(rows: list[tuple[int, Row]], stream: str, partition: int) -> pa.RecordBatch:
    """One record batch (`schema.STREAM_SCHEMA`) of decoded rows, each (offset, `RecordDecoder.row`)."""
    import pyarrow as pa

    schema = arrow_stream_schema()
    n = len(rows)
    offsets = [o for o, _ in rows]
    keys, values, exchanges, timestamps, headers, props = zip(*(r for _, r in rows), strict=True) if n else ((),) * 6
    columns = [
        pa.array(keys, schema.field("key").type),
        pa.array(values, schema.field("value").type),
        pa.array([stream] * n, schema.field("stream").type),
        pa.array([partition] * n, schema.field("partition").type),
        pa.array(offsets, schema.field("offset").type),
        pa.array(timestamps, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(exchanges, schema.field("exchange").type),
        pa.array(headers, schema.field("headers").type),
        struct_column(list(props), schema.field("properties").type) if n
        else pa.nulls(0, schema.field("properties").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class PyBatchBuilder:
    """A read task's rows, chunk by chunk, into record batches (`schema.STREAM_SCHEMA`): the pure-Python
    reference of `_crecords.BatchBuilder` (the same interface, the same batches, the same errors: a
    Hypothesis property in tests/spark/test_records.py).

    `add_chunk(chunk, start, end)` decodes the records of a USER chunk with offsets in [start, end)
    (`record_list`: compressed sub-batches inflated within the chunk's budget, empty records and the
    records of unreadable sub-batches left out) and keeps their rows; `rows` and `nbytes` (the bodies'
    bytes) say how much is kept; `flush()` returns them as one record batch and starts again. A chunk
    that does not parse raises ValueError (and the builder is not used again: the read fails)."""

    def __init__(self, stream: str, partition: int, include_headers: bool) -> None:
        self.stream = stream
        self.partition = partition
        self.decoder = RecordDecoder(include_headers)
        self._rows: list[tuple[int, Row]] = []
        self.nbytes = 0

    @property
    def rows(self) -> int:
        return len(self._rows)

    def add_chunk(self, chunk: bytes, start: int, end: int) -> None:
        row_of, rows = self.decoder.row, self._rows
        for offset, record in record_list(chunk, start):
            if offset >= end:
                break
            if offset > INT64_MAX:
                raise ValueError(f"offset {offset} is out of range")
            row = row_of(record)
            rows.append((offset, row))
            self.nbytes += len(row[1])

    def flush(self) -> pa.RecordBatch:
        batch = rows_batch(self._rows, self.stream, self.partition)
        self._rows = []
        self.nbytes = 0
        return batch


def _select() -> tuple[Any, str]:
    """The batch builder to use - the compiled `_crecords.BatchBuilder` when it was built, else
    `PyBatchBuilder` - and, when it is the pure one, why. `HUTCH_PURE=1` forces the pure one (as for the
    broker's hot path, hutch/amqp/speedups.py)."""
    if os.environ.get("HUTCH_PURE", "") not in ("", "0"):
        return PyBatchBuilder, "HUTCH_PURE is set"
    try:
        from hutch.spark import _crecords
    except ImportError as exc:
        return PyBatchBuilder, f"compiled part not built: {exc}"
    built = getattr(_crecords, "BatchBuilder", None)
    if built is None or not all(hasattr(built, name) for name in ("add_chunk", "flush", "rows", "nbytes")):
        return PyBatchBuilder, "compiled part out of date (rebuild it: pip install -e .)"
    return built, ""


_builder, _REASON = _select()
COMPILED = _builder is not PyBatchBuilder


def batch_builder(stream: str, partition: int, include_headers: bool) -> PyBatchBuilder:
    """A read task's batch builder: the compiled one when built (the same interface and output)."""
    builder: PyBatchBuilder = _builder(stream, partition, include_headers)
    return builder


def describe() -> str:
    """Which decoder a read task runs, in one sentence for its log."""
    return "compiled chunk decoder: on" if COMPILED else f"pure-Python chunk decoder ({_REASON})"


__all__ = ["COMPILED", "PyBatchBuilder", "RecordDecoder", "batch_builder", "describe", "rows_batch", "split",
           "stream_records_batch"]
