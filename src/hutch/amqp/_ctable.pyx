# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The compiled decoder of AMQP field tables, in Cython: `decode_table`, the twin of `table.decode_table`.

Owns nothing of its own: `table.py` is the reference (the type letters, the Python mapping, the nesting
bound, the error texts) and chooses this decoder at import when it was built (setup.py, an optional
extension) and `HUTCH_PURE` is not set. For the same input it gives the same values (the same types:
`str` or `bytes` for `S`, `Timestamp`, `Decimal`, the float of a float32) or the same `FrameError` with
the same text, checked in the same order (tests/codec/test_table_compiled.py, Hypothesis, pamqp beside).

Why it exists: a content header may carry up to a `frame_max` (128 KiB) of headers table, decoded on
the event loop when it arrives (to validate it); the pure decoder spends ~0.25-0.5 us a byte, so one
such header held the loop ~30-60 ms and 256 connections sending one each stalled every client ~6 s
(docs/security.md, session 19). This one reads the bytes in C and builds the same objects through the
C API (docs/BENCHMARKS.md, "Field tables, compiled": the figures per kind of field).

`configure` is called once by `table.py` with the `Timestamp` type and `MAX_NESTING_DEPTH` (injected
rather than imported: `table.py` imports this module, not the other way round).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLong, PyLong_FromLongLong, PyLong_FromUnsignedLong, PyLong_FromUnsignedLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t

from decimal import Decimal

from hutch.amqp.errors import FrameError


cdef extern from "Python.h":
    double PyFloat_Unpack4(const char *p, int le) except? -1.0
    double PyFloat_Unpack8(const char *p, int le) except? -1.0


cdef object _Timestamp = None
cdef int _max_depth = -1


def configure(timestamp_type: type, int max_depth) -> None:
    """Set the `Timestamp` type values of `T` decode to, and the deepest nesting allowed."""
    global _Timestamp, _max_depth
    _Timestamp = timestamp_type
    _max_depth = max_depth


cdef inline uint32_t _u32(const unsigned char* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t _u64(const unsigned char* p) noexcept:
    return (<uint64_t>_u32(p) << 32) | <uint64_t>_u32(p + 4)


cdef bint _utf8_valid(const unsigned char* p, Py_ssize_t n) noexcept:
    """Whether `p[:n]` is what Python's strict UTF-8 decoder accepts (Unicode's table 3-7: no overlong
    forms, no surrogates, nothing past U+10FFFF). Checked before decoding, so invalid text costs no
    exception object (a header of 20,000 six-byte invalid strings would otherwise raise 20,000)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c, lo, hi
    cdef int extra, k
    while i < n:
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        lo = 0x80
        hi = 0xBF
        if 0xC2 <= c <= 0xDF:
            extra = 1
        elif c == 0xE0:
            extra = 2
            lo = 0xA0
        elif 0xE1 <= c <= 0xEC or 0xEE <= c <= 0xEF:
            extra = 2
        elif c == 0xED:
            extra = 2
            hi = 0x9F
        elif c == 0xF0:
            extra = 3
            lo = 0x90
        elif 0xF1 <= c <= 0xF3:
            extra = 3
        elif c == 0xF4:
            extra = 3
            hi = 0x8F
        else:
            return False
        if i + extra >= n:  # the sequence is cut off by the end
            return False
        if not lo <= p[i + 1] <= hi:
            return False
        for k in range(2, extra + 1):
            if not 0x80 <= p[i + k] <= 0xBF:
                return False
        i += extra + 1
    return True


cdef dict _table(const unsigned char* p, Py_ssize_t n, Py_ssize_t offset, int depth, Py_ssize_t* out):
    """The table whose length is at `offset` (its container already checked by the caller); the offset
    after it in `out`. Mirrors `table._decode_table`."""
    cdef Py_ssize_t end, kend, klen
    cdef dict result
    cdef object key
    if offset + 4 > n:
        raise FrameError("truncated field table length")
    end = offset + 4 + <Py_ssize_t>_u32(p + offset)
    offset += 4
    if end > n:
        raise FrameError("field table longer than its frame")
    result = {}
    while offset < end:
        klen = p[offset]
        offset += 1
        kend = offset + klen
        if kend > end:
            raise FrameError("field table key overruns table")
        if not _utf8_valid(p + offset, klen):
            raise FrameError("field table key is not valid UTF-8")
        key = PyUnicode_DecodeUTF8(<const char*>p + offset, klen, NULL)
        result[key] = _value(p, n, kend, end, depth, &offset)
    if offset != end:
        raise FrameError("field table overruns its length")
    out[0] = offset
    return result


cdef list _array(const unsigned char* p, Py_ssize_t n, Py_ssize_t offset, Py_ssize_t limit, int depth,
                 Py_ssize_t* out):
    """Mirrors `table._decode_array` (`depth` is the array's own)."""
    cdef Py_ssize_t end
    cdef list items
    if depth > _max_depth:
        raise FrameError("field array nested too deeply")
    if offset + 4 > limit:
        raise FrameError("truncated field array length")
    end = offset + 4 + <Py_ssize_t>_u32(p + offset)
    offset += 4
    if end > limit:
        raise FrameError("field array longer than its container")
    items = []
    while offset < end:
        items.append(_value(p, n, offset, end, depth, &offset))
    if offset != end:
        raise FrameError("field array overruns its length")
    out[0] = offset
    return items


cdef object _value(const unsigned char* p, Py_ssize_t n, Py_ssize_t offset, Py_ssize_t limit, int depth,
                   Py_ssize_t* out):
    """One field value at `offset` (its type letter first), within `limit`. Mirrors `table._decode_value`:
    the same checks in the same order, so a malformed value gets the same text."""
    cdef unsigned char kind
    cdef Py_ssize_t size, end
    cdef uint64_t u
    if offset >= limit:
        raise FrameError("truncated field value")
    kind = p[offset]
    offset += 1
    if kind == b'S' or kind == b'x':
        if offset + 4 > n:  # the reference reads the length with struct against the buffer's end
            raise FrameError("truncated field value")
        end = offset + 4 + <Py_ssize_t>_u32(p + offset)
        offset += 4
        if end > limit:
            raise FrameError("long string overruns its container")
        out[0] = end
        if kind == b'S' and _utf8_valid(p + offset, end - offset):
            return PyUnicode_DecodeUTF8(<const char*>p + offset, end - offset, NULL)
        return PyBytes_FromStringAndSize(<const char*>p + offset, end - offset)
    if kind == b't':
        if offset + 1 > limit:
            raise FrameError("truncated boolean")
        out[0] = offset + 1
        return p[offset] != 0
    if kind == b'b' or kind == b'B':
        size = 1
    elif kind == b's' or kind == b'u':
        size = 2
    elif kind == b'I' or kind == b'i':
        size = 4
    elif kind == b'l' or kind == b'L':
        size = 8
    else:
        size = 0
    if size:
        if offset + size > limit:
            raise FrameError("truncated integer")
        out[0] = offset + size
        if kind == b'b':
            return PyLong_FromLong(<int8_t>p[offset])
        if kind == b'B':
            return PyLong_FromLong(p[offset])
        if kind == b's':
            return PyLong_FromLong(<int16_t>((p[offset] << 8) | p[offset + 1]))
        if kind == b'u':
            return PyLong_FromLong((p[offset] << 8) | p[offset + 1])
        if kind == b'I':
            return PyLong_FromLong(<int32_t>_u32(p + offset))
        if kind == b'i':
            return PyLong_FromUnsignedLong(_u32(p + offset))
        return PyLong_FromLongLong(<int64_t>_u64(p + offset))  # 'l', and 'L' read signed as RabbitMQ does
    if kind == b'F':
        depth += 1
        if depth > _max_depth:
            raise FrameError("field table nested too deeply")
        if offset + 4 > limit:
            raise FrameError("truncated nested table")
        if offset + 4 + <Py_ssize_t>_u32(p + offset) > limit:
            raise FrameError("nested table overruns its container")
        return _table(p, n, offset, depth, out)
    if kind == b'A':
        return _array(p, n, offset, limit, depth + 1, out)
    if kind == b'V':
        out[0] = offset
        return None
    if kind == b'T':
        if offset + 8 > limit:
            raise FrameError("truncated timestamp")
        out[0] = offset + 8
        return _Timestamp(PyLong_FromUnsignedLongLong(_u64(p + offset)))
    if kind == b'd':
        if offset + 8 > limit:
            raise FrameError("truncated double")
        out[0] = offset + 8
        return PyFloat_Unpack8(<const char*>p + offset, 0)
    if kind == b'f':
        if offset + 4 > limit:
            raise FrameError("truncated float")
        out[0] = offset + 4
        return PyFloat_Unpack4(<const char*>p + offset, 0)
    if kind == b'D':
        if offset + 5 > limit:
            raise FrameError("truncated decimal")
        out[0] = offset + 5
        return Decimal(PyLong_FromLong(<int32_t>_u32(p + offset + 1))).scaleb(-<int>p[offset])
    raise FrameError(f"unknown field value type {chr(kind)!r}")


def decode_table(buf: bytes | memoryview, Py_ssize_t offset) -> tuple[dict, int]:
    """Decode a length-prefixed field table at `offset`; return (table, new offset). Raises FrameError."""
    cdef Py_buffer view
    cdef Py_ssize_t end = 0
    cdef dict result
    if _max_depth < 0:
        raise RuntimeError("hutch.amqp._ctable used before table.py configured it")
    if offset < 0:
        raise FrameError("truncated field table length")
    if type(buf) is bytes:
        result = _table(<const unsigned char*>PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf), offset, 0, &end)
        return result, end
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        result = _table(<const unsigned char*>view.buf, view.len, offset, 0, &end)
    finally:
        PyBuffer_Release(&view)
    return result, end
