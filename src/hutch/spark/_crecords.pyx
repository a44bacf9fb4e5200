# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The compiled read path of a stream read task: chunks as stored -> Arrow columns, in Cython.

Owns nothing of its own: `BatchBuilder` is the twin of `records.PyBatchBuilder` (the reference), with
the same interface, and gives the same record batches and the same errors for the same chunks (a
Hypothesis property over any chunk, compressed sub-batches and damaged bytes included:
tests/spark/test_records.py). `records.batch_builder` chooses between the two. Built by `pip install`
(setup.py, an optional extension); when it cannot be built the pure path runs and the read task's log
says so once.

What is compiled is what the profile showed is spent per row in Python: walking a chunk's entries,
splitting a record into its AMQP 1.0 sections by their size fields, reading the route (x-exchange,
x-routing-key) of its message annotations, reading its properties list (nulls, strings, timestamps),
and building the Arrow columns, whose buffers (offsets + data, validity bitmaps) are written here
straight from the chunk's bytes: a row costs no Python object on this path. The sections that repeat
from record to record (header, application properties) are mapped by the reference decoder
(`RecordDecoder.plain_base`, the broker's own mapping), once per distinct pair and remembered while
the next record's are the same bytes. Anything else - a record in another layout, a properties field
of another type, text that is not UTF-8, a sub-batch, a chunk that does not parse - goes through the
reference (`RecordDecoder.row`, `record_list`) record by record or chunk by chunk, so its row or its
error is the reference's by construction.

Rules: every length read is checked against the record before it is used; a column's data stays under
2 GiB (Arrow's 32-bit offsets: ValueError past it, which the read task's bound on a batch's bytes
never reaches).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcmp, memcpy

import pyarrow as pa

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL

cdef enum:
    HEADER = 0x70
    MESSAGE_ANNOTATIONS = 0x72
    PROPERTIES = 0x73
    APPLICATION_PROPERTIES = 0x74
    DATA = 0x75
    MAX_BODY_PARTS = 8
    CHUNK_HEADER_SIZE = 48

cdef int64_t INT64_MAX = 0x7FFFFFFFFFFFFFFF
cdef int64_t MICROS_MAX_S = 9223372036854  # INT64_MAX // 1_000_000 (records.micros)
cdef Py_ssize_t COLUMN_MAX = 0x7FFFFFFF
cdef bytes SYM_EXCHANGE = b"\xa3\x0ax-exchange"
cdef bytes SYM_ROUTING_KEY = b"\xa3\x0dx-routing-key"


cdef inline uint64_t _u32(const unsigned char* p) noexcept:
    return (<uint64_t>p[0] << 24) | (<uint64_t>p[1] << 16) | (<uint64_t>p[2] << 8) | p[3]


cdef inline uint64_t _u64(const unsigned char* p) noexcept:
    return (_u32(p) << 32) | _u32(p + 4)


cdef bint _utf8(const unsigned char* p, Py_ssize_t n) except -1:
    """Is p[:n] text Python's strict UTF-8 decoder takes (what the reference decodes with)?"""
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 0x80:
            break
    else:
        return True
    try:
        PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return False
    return True


cdef class _Buf:
    """A growing byte buffer; `take` hands it to Arrow (no copy) and starts a new one."""
    cdef bytearray data
    cdef char* ptr
    cdef Py_ssize_t size

    def __cinit__(self):
        self._fresh()

    cdef void _fresh(self):
        self.data = bytearray(1024)
        self.ptr = PyByteArray_AS_STRING(self.data)
        self.size = 0

    cdef char* reserve(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t cap = PyByteArray_GET_SIZE(self.data)
        if self.size + n > cap:
            while cap < self.size + n:
                cap *= 2
            PyByteArray_Resize(self.data, cap)
            self.ptr = PyByteArray_AS_STRING(self.data)
        return self.ptr + self.size

    cdef inline int put(self, const void* src, Py_ssize_t n) except -1:
        memcpy(self.reserve(n), src, n)
        self.size += n
        return 0

    cdef object take(self):
        out = pa.py_buffer(self.data)
        self._fresh()
        return out


cdef class _Bits:
    """A validity bitmap, one bit a row (Arrow's layout), and its count of nulls."""
    cdef _Buf buf
    cdef Py_ssize_t n, nulls

    def __cinit__(self):
        self.buf = _Buf()

    cdef inline int add(self, bint valid) except -1:
        cdef char* w
        if (self.n & 7) == 0:
            w = self.buf.reserve(1)
            w[0] = 0
            self.buf.size += 1
        if valid:
            self.buf.ptr[self.n >> 3] |= <char>(1 << (self.n & 7))
        else:
            self.nulls += 1
        self.n += 1
        return 0

    cdef object take(self):
        out = self.buf.take() if self.nulls else None
        if not self.nulls:
            self.buf._fresh()
        self.n = self.nulls = 0
        return out


cdef class _Var:
    """A string or binary column: int32 offsets, data, validity."""
    cdef _Buf offsets, data
    cdef _Bits valid

    def __cinit__(self):
        self.offsets, self.data, self.valid = _Buf(), _Buf(), _Bits()
        self._start()

    cdef void _start(self):
        cdef int32_t zero = 0
        self.offsets.put(&zero, 4)

    cdef inline int _end(self) except -1:
        if self.data.size > COLUMN_MAX:
            raise ValueError("a record batch column over 2 GiB")
        cdef int32_t at = <int32_t>self.data.size
        self.offsets.put(&at, 4)
        return 0

    cdef inline int add(self, const void* p, Py_ssize_t n) except -1:
        self.data.put(p, n)
        self._end()
        return self.valid.add(True)

    cdef inline int add_null(self) except -1:
        self._end()
        return self.valid.add(False)

    cdef int add_obj(self, object value) except -1:
        cdef Py_ssize_t n
        cdef const char* p
        if value is None:
            return self.add_null()
        if type(value) is bytes:
            return self.add(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
        if type(value) is not str:
            raise TypeError(f"expected str, got {type(value).__name__}")
        p = PyUnicode_AsUTF8AndSize(value, &n)
        return self.add(p, n)

    cdef object finish(self, kind, Py_ssize_t n):
        nulls = self.valid.nulls
        bits = self.valid.take()
        out = pa.Array.from_buffers(kind, n, [bits, self.offsets.take(), self.data.take()], null_count=nulls)
        self._start()
        return out


cdef class _Fixed:
    """An int32 or int64 (or timestamp[us]) column: values, validity."""
    cdef _Buf data
    cdef _Bits valid
    cdef int width

    def __cinit__(self, int width):
        self.data, self.valid, self.width = _Buf(), _Bits(), width

    cdef inline int add(self, int64_t value) except -1:
        cdef int32_t small
        if self.width == 8:
            self.data.put(&value, 8)
        else:
            small = <int32_t>value
            self.data.put(&small, 4)
        return self.valid.add(True)

    cdef inline int add_null(self) except -1:
        cdef int64_t zero = 0
        self.data.put(&zero, self.width)
        return self.valid.add(False)

    cdef int add_obj(self, object value) except -1:
        cdef int64_t v
        if value is None:
            return self.add_null()
        v = value
        if self.width == 4 and not -0x80000000 <= v <= 0x7FFFFFFF:
            raise OverflowError(f"{v} does not fit an int32 column")
        return self.add(v)

    cdef object finish(self, kind, Py_ssize_t n):
        nulls = self.valid.nulls
        bits = self.valid.take()
        return pa.Array.from_buffers(kind, n, [bits, self.data.take()], null_count=nulls)


cdef class _Map:
    """The `headers` column: map<string, string> from [(key, text)] or None."""
    cdef _Buf offsets
    cdef _Bits valid
    cdef _Var keys, values
    cdef int32_t count

    def __cinit__(self):
        self.offsets, self.valid, self.keys, self.values = _Buf(), _Bits(), _Var(), _Var()
        self._start()

    cdef void _start(self):
        self.count = 0
        self.offsets.put(&self.count, 4)

    cdef int add_obj(self, object pairs) except -1:
        if pairs is not None:
            for k, v in pairs:
                if k is None:
                    raise TypeError("a header without a name")
                self.keys.add_obj(k)
                self.values.add_obj(v)
                self.count += 1
        self.offsets.put(&self.count, 4)
        return self.valid.add(pairs is not None)

    cdef object finish(self, kind, Py_ssize_t n):
        entries = pa.StructArray.from_arrays(
            [self.keys.finish(kind.key_field.type, self.count), self.values.finish(kind.item_field.type, self.count)],
            fields=[kind.key_field, kind.item_field])
        nulls = self.valid.nulls
        bits = self.valid.take()
        out = pa.Array.from_buffers(kind, n, [bits, self.offsets.take()], null_count=nulls, children=[entries])
        self._start()
        return out


cdef class _Props:
    """The `properties` struct column (schema.PROPERTY_COLUMNS): its 13 children and its validity."""
    cdef _Var content_type, content_encoding, correlation_id, reply_to, expiration, message_id, type_, user_id
    cdef _Var app_id, cluster_id
    cdef _Fixed delivery_mode, priority, timestamp
    cdef _Bits valid
    cdef list children

    def __cinit__(self):
        self.content_type, self.content_encoding = _Var(), _Var()
        self.delivery_mode, self.priority = _Fixed(4), _Fixed(4)
        self.correlation_id, self.reply_to, self.expiration, self.message_id = _Var(), _Var(), _Var(), _Var()
        self.timestamp = _Fixed(8)
        self.type_, self.user_id, self.app_id, self.cluster_id = _Var(), _Var(), _Var(), _Var()
        self.valid = _Bits()
        self.children = [self.content_type, self.content_encoding, self.delivery_mode, self.priority,
                         self.correlation_id, self.reply_to, self.expiration, self.message_id, self.timestamp,
                         self.type_, self.user_id, self.app_id, self.cluster_id]

    cdef int add_obj(self, object row, bint valid) except -1:
        """One row from a tuple in PROPERTY_COLUMNS order; a null struct when not `valid`."""
        cdef object child
        if len(row) != 13:
            raise ValueError("a properties row holds 13 values")
        for i in range(13):
            child = self.children[i]
            if type(child) is _Var:
                (<_Var>child).add_obj(row[i])
            else:
                (<_Fixed>child).add_obj(row[i])
        return self.valid.add(valid)

    cdef object finish(self, kind, Py_ssize_t n):
        arrays = []
        for i in range(13):
            child = self.children[i]
            if type(child) is _Var:
                arrays.append((<_Var>child).finish(kind.field(i).type, n))
            else:
                arrays.append((<_Fixed>child).finish(kind.field(i).type, n))
        nulls = self.valid.nulls
        bits = self.valid.take()
        return pa.Array.from_buffers(kind, n, [bits], null_count=nulls, children=arrays)


cdef struct Span:
    Py_ssize_t start
    Py_ssize_t end


cdef struct Fields:
    # the properties list's fields the row takes (message-id, user-id, reply-to, correlation-id,
    # content-type, content-encoding, group-id: start < 0 when null) and its creation time
    Span f[13]
    bint has_ts
    int64_t ts_s


cdef class BatchBuilder:
    """`records.PyBatchBuilder`, compiled: rows of a read task's chunks -> record batches."""
    cdef readonly object decoder
    cdef readonly str stream
    cdef readonly int partition
    cdef readonly Py_ssize_t nbytes
    cdef Py_ssize_t n
    cdef object _record_list, _no_props, _schema
    cdef bytes _stream_utf8
    cdef _Var key, value, stream_col, exchange
    cdef _Fixed partition_col, offset, timestamp
    cdef _Map headers
    cdef _Props props
    # the last base (records.RecordDecoder.plain_base) and the header and application properties it is for
    cdef bint _memo
    cdef bytes _memo_header, _memo_app
    cdef object _b_headers, _b_mode, _b_priority, _b_expiration, _b_type, _b_app_id

    def __init__(self, str stream, int partition, bint include_headers):
        from hutch.queues.stream.chunk import record_list

        from . import records
        from .schema import NO_PROPS_ROW, arrow_stream_schema

        self.decoder = records.RecordDecoder(include_headers)
        self.stream, self.partition = stream, partition
        self._stream_utf8 = stream.encode("utf-8")
        self._record_list, self._no_props, self._schema = record_list, NO_PROPS_ROW, arrow_stream_schema()
        self.key, self.value, self.stream_col, self.exchange = _Var(), _Var(), _Var(), _Var()
        self.partition_col, self.offset, self.timestamp = _Fixed(4), _Fixed(8), _Fixed(8)
        self.headers, self.props = _Map(), _Props()
        self._memo = False

    @property
    def rows(self):
        return self.n

    def add_chunk(self, chunk, start, end):
        """The rows of a USER chunk's records with offsets in [start, end) (records.PyBatchBuilder)."""
        cdef const unsigned char* p
        cdef Py_ssize_t size, pos, stop, q
        cdef uint64_t chunk_id, length, offset
        cdef uint64_t lo = 0 if start <= 0 else start if start < INT64_MAX else INT64_MAX  # fast-path offsets are below
        cdef uint64_t hi = end if end < INT64_MAX else INT64_MAX
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        p = <const unsigned char*>PyBytes_AS_STRING(chunk)
        size = PyBytes_GET_SIZE(chunk)
        if size < CHUNK_HEADER_SIZE or p[0] != 0x50 or p[1] > 2 or (p[2] == 0 and p[3] == 0) or _u32(p + 4) == 0:
            return self._by_reference(chunk, start, end)
        chunk_id = _u64(p + 24)
        pos = CHUNK_HEADER_SIZE + p[44]
        stop = pos + <Py_ssize_t>_u32(p + 36)
        if size < stop or chunk_id > <uint64_t>(INT64_MAX - stop):
            return self._by_reference(chunk, start, end)
        q = pos
        while q < stop:  # simple entries only, each within the data: else the reference reads the chunk
            if p[q] & 0x80 or q + 4 > stop:
                return self._by_reference(chunk, start, end)
            length = _u32(p + q)
            q += 4
            if <uint64_t>(stop - q) < length:
                return self._by_reference(chunk, start, end)
            q += length
        offset = chunk_id
        q = pos
        while q < stop and offset < hi:
            length = _u32(p + q)
            q += 4
            if length and offset >= lo:
                self._add(<int64_t>offset, p + q, length, None)
            q += length
            offset += 1

    def flush(self):
        """The rows kept, as one record batch (`schema.STREAM_SCHEMA`); the builder starts again empty."""
        schema, n = self._schema, self.n
        columns = [
            self.key.finish(schema.field("key").type, n),
            self.value.finish(schema.field("value").type, n),
            self.stream_col.finish(schema.field("stream").type, n),
            self.partition_col.finish(schema.field("partition").type, n),
            self.offset.finish(schema.field("offset").type, n),
            self.timestamp.finish(schema.field("timestamp").type, n),
            self.exchange.finish(schema.field("exchange").type, n),
            self.headers.finish(schema.field("headers").type, n),
            self.props.finish(schema.field("properties").type, n),
        ]
        self.n = self.nbytes = 0
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    cdef _by_reference(self, bytes chunk, start, end):
        """A chunk the fast walk does not take (sub-batches, damage): `record_list` reads it."""
        for offset, record in self._record_list(chunk, start):
            if offset >= end:
                break
            if offset > INT64_MAX:
                raise ValueError(f"offset {offset} is out of range")
            self._add(offset, <const unsigned char*>PyBytes_AS_STRING(record), PyBytes_GET_SIZE(record), record)

    cdef int _add(self, int64_t offset, const unsigned char* r, Py_ssize_t n, object record) except -1:
        """One record's row: the fast path, or the reference's row (`RecordDecoder.row`)."""
        cdef Span header, annotations, properties, application
        cdef Span body[MAX_BODY_PARTS]
        cdef Span exchange, routing_key
        cdef Fields fields
        cdef int parts = 0, i
        cdef Py_ssize_t pos = 0, begin, stop, width
        cdef unsigned char code, ctor
        header.start = annotations.start = properties.start = application.start = -1
        while pos < n:  # records.split
            if n - pos < 4 or r[pos] != 0 or r[pos + 1] != 0x53:
                return self._reference(offset, r, n, record)
            code, ctor = r[pos + 2], r[pos + 3]
            begin = pos + 4
            if ctor == 0xa0 or ctor == 0xa1 or ctor == 0xa3 or ctor == 0xc0 or ctor == 0xc1:
                width = 1
                if begin >= n:
                    return self._reference(offset, r, n, record)
                stop = begin + 1 + r[begin]
            elif ctor == 0xb0 or ctor == 0xb1 or ctor == 0xb3 or ctor == 0xd0 or ctor == 0xd1:
                width = 4
                if begin + 4 > n:
                    return self._reference(offset, r, n, record)
                stop = begin + 4 + <Py_ssize_t>_u32(r + begin)
            elif ctor == 0x40 or ctor == 0x45:
                width = 0
                stop = begin
            else:
                return self._reference(offset, r, n, record)
            if stop > n:
                return self._reference(offset, r, n, record)
            if code == DATA:
                if (ctor != 0xa0 and ctor != 0xb0) or parts == MAX_BODY_PARTS:
                    return self._reference(offset, r, n, record)
                body[parts].start, body[parts].end = begin + width, stop
                parts += 1
            elif parts == 0 and code == HEADER and header.start < 0:
                header.start, header.end = pos, stop
            elif parts == 0 and code == MESSAGE_ANNOTATIONS and annotations.start < 0:
                annotations.start, annotations.end = pos, stop
            elif parts == 0 and code == PROPERTIES and properties.start < 0:
                properties.start, properties.end = pos, stop
            elif parts == 0 and code == APPLICATION_PROPERTIES and application.start < 0:
                application.start, application.end = pos, stop
            else:
                return self._reference(offset, r, n, record)
            pos = stop
        if parts == 0 or annotations.start < 0 or not _route(r, annotations, &exchange, &routing_key):
            return self._reference(offset, r, n, record)
        if properties.start >= 0 and not _properties(r, properties, &fields):
            return self._reference(offset, r, n, record)
        if not self._base(r, header, application):
            return self._reference(offset, r, n, record)
        # the row: nothing above failed, so nothing is half-added
        self.key.add(r + routing_key.start, routing_key.end - routing_key.start)
        for i in range(parts):
            self.value.data.put(r + body[i].start, body[i].end - body[i].start)
            self.nbytes += body[i].end - body[i].start
        self.value._end()
        self.value.valid.add(True)
        self.stream_col.add(PyBytes_AS_STRING(self._stream_utf8), PyBytes_GET_SIZE(self._stream_utf8))
        self.partition_col.add(self.partition)
        self.offset.add(offset)
        self.exchange.add(r + exchange.start, exchange.end - exchange.start)
        self.headers.add_obj(self._b_headers)
        self._add_properties(r, properties.start >= 0, &fields)
        self.n += 1
        return 0

    cdef int _add_properties(self, const unsigned char* r, bint listed, Fields* f) except -1:
        """The row's properties struct and timestamp: the base's fields, and the properties list's."""
        cdef _Props props = self.props
        if listed and f.has_ts:
            self.timestamp.add(f.ts_s * 1000000)
            props.timestamp.add(f.ts_s * 1000000)
        else:
            self.timestamp.add_null()
            props.timestamp.add_null()
        _text(props.content_type, r, listed, f, 6)
        _text(props.content_encoding, r, listed, f, 7)
        props.delivery_mode.add_obj(self._b_mode)
        props.priority.add_obj(self._b_priority)
        _text(props.correlation_id, r, listed, f, 5)
        _text(props.reply_to, r, listed, f, 4)
        props.expiration.add_obj(self._b_expiration)
        _text(props.message_id, r, listed, f, 0)
        props.type_.add_obj(self._b_type)
        _text(props.user_id, r, listed, f, 1)
        if self._b_app_id is not None:
            props.app_id.add_obj(self._b_app_id)
        else:
            _text(props.app_id, r, listed, f, 10)
        props.cluster_id.add_null()
        return props.valid.add(True)

    cdef bint _base(self, const unsigned char* r, Span header, Span application) except -1:
        """The base (RecordDecoder.plain_base) for these header and application-properties sections,
        remembered while the next record's are the same bytes; False: the reference maps none."""
        cdef Py_ssize_t hn = header.end - header.start if header.start >= 0 else 0
        cdef Py_ssize_t an = application.end - application.start if application.start >= 0 else 0
        if self._memo and PyBytes_GET_SIZE(self._memo_header) == hn and PyBytes_GET_SIZE(self._memo_app) == an \
                and memcmp(PyBytes_AS_STRING(self._memo_header), r + header.start, hn) == 0 \
                and memcmp(PyBytes_AS_STRING(self._memo_app), r + application.start, an) == 0:
            return True
        h = PyBytes_FromStringAndSize(<const char*>r + header.start, hn) if hn else b""
        a = PyBytes_FromStringAndSize(<const char*>r + application.start, an) if an else b""
        base = self.decoder.plain_base(h, a)
        if base is None:
            self._memo = False
            return False
        _, _, headers, p = base
        self._memo_header, self._memo_app, self._memo = h, a, True
        self._b_headers, self._b_mode, self._b_priority = headers, p.delivery_mode, p.priority
        self._b_expiration, self._b_type, self._b_app_id = p.expiration, p.type, p.app_id
        return True

    cdef int _reference(self, int64_t offset, const unsigned char* r, Py_ssize_t n, object record) except -1:
        """The record's row by the reference decoder, added column by column."""
        if record is None:
            record = PyBytes_FromStringAndSize(<const char*>r, n)
        key, body, exchange, ts, headers, props = self.decoder.row(record)
        self.key.add_obj(key)
        self.value.add_obj(body)
        self.nbytes += len(body)
        self.stream_col.add(PyBytes_AS_STRING(self._stream_utf8), PyBytes_GET_SIZE(self._stream_utf8))
        self.partition_col.add(self.partition)
        self.offset.add(offset)
        self.timestamp.add_obj(ts)
        self.exchange.add_obj(exchange)
        self.headers.add_obj(headers)
        self.props.add_obj(props, props is not self._no_props)
        self.n += 1
        return 0


cdef inline int _text(_Var column, const unsigned char* r, bint listed, Fields* f, int i) except -1:
    if listed and f.f[i].start >= 0:
        return column.add(r + f.f[i].start, f.f[i].end - f.f[i].start)
    return column.add_null()


cdef bint _route(const unsigned char* r, Span a, Span* exchange, Span* routing_key) except -1:
    """records._route: message annotations holding exactly x-exchange and x-routing-key (str8 values, UTF-8),
    as a map8 or map32; their value spans."""
    cdef const unsigned char* raw = r + a.start
    cdef Py_ssize_t n = a.end - a.start, pos, end, k
    cdef Span* out
    cdef bytes name
    if n < 12:
        return False
    if raw[3] == 0xc1 and raw[5] == 4 and 5 + raw[4] == n:
        pos = 6
    elif raw[3] == 0xd1 and _u32(raw + 8) == 4 and 8 + <Py_ssize_t>_u32(raw + 4) == n:
        pos = 12
    else:
        return False
    for k in range(2):
        name = SYM_EXCHANGE if k == 0 else SYM_ROUTING_KEY
        out = exchange if k == 0 else routing_key
        if pos + PyBytes_GET_SIZE(name) > n or memcmp(raw + pos, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)):
            return False
        pos += PyBytes_GET_SIZE(name)
        if pos + 1 >= n or raw[pos] != 0xa1:
            return False
        end = pos + 2 + raw[pos + 1]
        if end > n or not _utf8(raw + pos + 2, end - pos - 2):
            return False
        out.start, out.end = a.start + pos + 2, a.start + end
        pos = end
    return pos == n


cdef bint _properties(const unsigned char* r, Span s, Fields* f) except -1:
    """records._simple_list, for the fields a row takes: a list8 or list32 of at most 13 nulls, str8/sym8
    (UTF-8) and timestamps, where every field the row reads as text is text or null and the creation time
    is a timestamp or null, within what the timestamp columns hold. False: the reference decides."""
    cdef const unsigned char* raw = r + s.start
    cdef Py_ssize_t n = s.end - s.start, pos, end
    cdef uint64_t count, i
    cdef unsigned char ctor
    cdef int64_t ms, sec
    for i in range(13):
        f.f[i].start = -1
    f.has_ts = False
    if n >= 6 and raw[3] == 0xc0 and 5 + raw[4] == n:
        count, pos = raw[5], 6
    elif n >= 12 and raw[3] == 0xd0 and 8 + <Py_ssize_t>_u32(raw + 4) == n:
        count, pos = _u32(raw + 8), 12
    else:
        return False
    if count > 13:
        return False
    for i in range(count):
        if pos >= n:
            return False
        ctor = raw[pos]
        if ctor == 0x40:
            pos += 1
        elif ctor == 0xa1 or ctor == 0xa3:
            if pos + 1 >= n:
                return False
            end = pos + 2 + raw[pos + 1]
            if end > n or i == 9 or not _utf8(raw + pos + 2, end - pos - 2):
                return False
            f.f[i].start, f.f[i].end = s.start + pos + 2, s.start + end
            pos = end
        elif ctor == 0x83:
            if pos + 9 > n or i != 9 and i != 2 and i != 3 and i != 8 and i != 11 and i != 12:
                return False
            if i == 9:
                ms = <int64_t>_u64(raw + pos + 1)
                sec = ms / 1000  # floor division (C's truncates toward zero: cdivision)
                if ms % 1000 < 0:
                    sec -= 1
                if not -MICROS_MAX_S <= sec <= MICROS_MAX_S:
                    return False
                f.has_ts, f.ts_s = True, sec
            pos += 9
        else:
            return False
    return pos == n
