# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The compiled hot path: the frame reader and the per-message codec helpers, in Cython.

Owns nothing of its own: every function and class here has a pure-Python twin in `frames.py` (the
reference) with the same interface, and gives the same output, the same errors with the same codes
and texts, for the same input (tests/codec/test_speedups.py, Hypothesis). `speedups` chooses between
the two. Built by `pip install` (setup.py, an optional extension); when it cannot be built the pure
path runs.

What is here is what measurement showed is spent per message in Python: splitting frames out of the
read buffer, decoding basic.publish's exchange, routing key and flags, reading the content header,
reading basic.ack, and encoding basic.deliver + content header + body into one bytes object.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy

from hutch.amqp import frames as _pure
from hutch.amqp.errors import FRAME_ERROR, FrameError

cdef enum:
    FRAME_END = 0xCE
    SMALL_BODY = 4096
    FLAG_DELIVERY_MODE = 0x1000
    FLAG_PRIORITY = 0x0800
    FLAG_TIMESTAMP = 0x0040
    VARIABLE_PROPS = 0xFFFF & ~(FLAG_DELIVERY_MODE | FLAG_PRIORITY | FLAG_TIMESTAMP)

# the constants above are the reference's, compiled in
assert _pure.DELIVER_SMALL_BODY == SMALL_BODY and _pure.FRAME_END == FRAME_END
assert (_pure.FLAG_DELIVERY_MODE, _pure.FLAG_PRIORITY, _pure.FLAG_TIMESTAMP) == (
    FLAG_DELIVERY_MODE, FLAG_PRIORITY, FLAG_TIMESTAMP)
_append_body = _pure.append_body


cdef inline unsigned int _u16(const unsigned char* p) noexcept:
    return (p[0] << 8) | p[1]


cdef inline unsigned int _u32(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


cdef inline uint64_t _u64(const unsigned char* p) noexcept:
    return (<uint64_t>_u32(p) << 32) | _u32(p + 4)


cdef inline unsigned char* _put_frame_header(unsigned char* w, unsigned char ftype, unsigned int channel,
                                             unsigned int size) noexcept:
    w[0] = ftype
    w[1] = (channel >> 8) & 0xFF
    w[2] = channel & 0xFF
    w[3] = (size >> 24) & 0xFF
    w[4] = (size >> 16) & 0xFF
    w[5] = (size >> 8) & 0xFF
    w[6] = size & 0xFF
    return w + 7


cdef inline const unsigned char* _contents(object buf, Py_ssize_t* n) noexcept:
    """The reader's buffer (bytes, or a bytearray once a partial frame was left over): its data, and its
    size in `n`."""
    if type(buf) is bytes:
        n[0] = PyBytes_GET_SIZE(buf)
        return <const unsigned char*>PyBytes_AS_STRING(buf)
    n[0] = PyByteArray_GET_SIZE(buf)
    return <const unsigned char*>PyByteArray_AS_STRING(buf)


cdef inline Py_ssize_t _fixed_len(unsigned int flags) noexcept:
    """The encoded length of a property list of fixed-size properties only, by its flag word."""
    cdef Py_ssize_t fixed_len = 2
    if flags & FLAG_DELIVERY_MODE:
        fixed_len += 1
    if flags & FLAG_PRIORITY:
        fixed_len += 1
    if flags & FLAG_TIMESTAMP:
        fixed_len += 8
    return fixed_len


cdef inline unsigned char* _put(unsigned char* w, bytes data) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    memcpy(w, PyBytes_AS_STRING(data), n)
    return w + n


cdef class FrameReader:
    """Incremental frame parser; the same buffering, checks and errors as `frames.FrameReader`."""

    cdef readonly object _buf  # bytes, or a bytearray once a partial frame was left over
    cdef readonly Py_ssize_t _pos
    cdef public long long frame_max
    cdef public long long tolerance

    def __init__(self, long long frame_max, long long tolerance=0):
        self._buf = b""
        self._pos = 0
        self.frame_max = frame_max
        self.tolerance = tolerance

    def feed(self, data) -> None:
        cdef object buf = self._buf
        cdef Py_ssize_t pos = self._pos
        cdef Py_ssize_t n = len(buf)
        if pos >= n:  # nothing left over: take the new bytes as they are
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
        elif type(buf) is bytearray:
            if pos and pos * 2 >= n:
                del buf[:pos]
                self._pos = 0
            buf += data
        else:  # a partial frame left in an immutable buffer: copy it once into a growable one
            grown = bytearray(memoryview(buf)[pos:])
            grown += data
            self._buf = grown
            self._pos = 0

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def frames(self):
        return _FrameIter(self)

    cpdef long long _limit(self):
        """The largest payload size accepted (`frames.FrameReader._limit`); one C call from take_content
        and the frame iterator."""
        return self.frame_max - 8 + self.tolerance if self.frame_max else 0xFFFFFFFF

    def take_content(self, long long channel):
        """See `frames.FrameReader.take_content`."""
        cdef object buf = self._buf
        cdef const unsigned char* p
        cdef Py_ssize_t n, pos, end, bpos, bend
        cdef unsigned int size, bsize
        cdef long long limit
        p = _contents(buf, &n)
        pos = self._pos
        if n - pos < 21:
            return None
        limit = self._limit()
        size = _u32(p + pos + 3)
        end = pos + 7 + size
        if p[pos] != 2 or <long long>_u16(p + pos + 1) != channel or size < 14 or <long long>size > limit \
                or end + 8 >= n or p[end] != FRAME_END:
            return None
        bpos = end + 1
        bsize = _u32(p + bpos + 3)
        bend = bpos + 7 + bsize
        if p[bpos] != 3 or <long long>_u16(p + bpos + 1) != channel or <uint64_t>bsize != _u64(p + pos + 11) \
                or bsize == 0 or <long long>bsize > limit or bend >= n or p[bend] != FRAME_END:
            return None
        header = PyBytes_FromStringAndSize(<const char*>p + pos + 7, size)
        body = PyBytes_FromStringAndSize(<const char*>p + bpos + 7, bsize)
        self._pos = bend + 1
        return (header, body)

    def take_publishes(self, long long channel, bytes method not None, long long max_body, Py_ssize_t max_count):
        """See `frames.FrameReader.take_publishes`."""
        cdef object buf = self._buf
        cdef const unsigned char* p
        cdef const unsigned char* m = <const unsigned char*>PyBytes_AS_STRING(method)
        cdef Py_ssize_t mlen = PyBytes_GET_SIZE(method)
        cdef Py_ssize_t n, pos, hpos, end, bpos, bend
        cdef unsigned int size, bsize, flags
        cdef long long limit = self._limit()
        cdef list out = []
        p = _contents(buf, &n)
        pos = self._pos
        while PyList_GET_SIZE(out) < max_count:
            hpos = pos + 7 + mlen + 1
            if n - hpos < 22 or p[pos] != 1 or <long long>_u16(p + pos + 1) != channel \
                    or _u32(p + pos + 3) != <unsigned int>mlen or memcmp(p + pos + 7, m, mlen) != 0 \
                    or p[hpos - 1] != FRAME_END:
                break
            size = _u32(p + hpos + 3)
            end = hpos + 7 + size
            if p[hpos] != 2 or <long long>_u16(p + hpos + 1) != channel or size < 14 or <long long>size > limit \
                    or end + 8 >= n or p[end] != FRAME_END or _u32(p + hpos + 7) != 0x003C0000:
                break
            flags = _u16(p + hpos + 19)
            if flags & VARIABLE_PROPS or size - 12 != _fixed_len(flags):
                break
            bpos = end + 1
            bsize = _u32(p + bpos + 3)
            bend = bpos + 7 + bsize
            if p[bpos] != 3 or <long long>_u16(p + bpos + 1) != channel or <uint64_t>bsize != _u64(p + hpos + 11) \
                    or bsize == 0 or <long long>bsize > limit or <long long>bsize > max_body or bend >= n \
                    or p[bend] != FRAME_END:
                break
            out.append((PyBytes_FromStringAndSize(<const char*>p + hpos + 7, size),
                        PyBytes_FromStringAndSize(<const char*>p + bpos + 7, bsize)))
            pos = bend + 1
        self._pos = pos
        return out


    def cut_unfinished_publish(self):
        """See `frames.FrameReader.cut_unfinished_publish`."""
        cdef object buf = self._buf
        cdef const unsigned char* p
        cdef Py_ssize_t n, pos, end
        p = _contents(buf, &n)
        pos = self._pos
        while n - pos >= 7:
            end = pos + 8 + <Py_ssize_t>_u32(p + pos + 3)
            if end > n:
                break
            if p[pos] == 1 and end - pos >= 12 and _u32(p + pos + 7) == 0x003C0028 \
                    and not _content_whole(p, n, end, _u16(p + pos + 1)):
                tail = PyBytes_FromStringAndSize(<const char*>p + pos, n - pos)
                if type(buf) is bytearray:
                    del buf[pos:]
                else:
                    self._buf = buf[:pos]
                return tail
            pos = end
        return b""


cdef bint _content_whole(const unsigned char* p, Py_ssize_t n, Py_ssize_t pos, unsigned int channel) noexcept:
    """Whether p[pos:n] starts with a whole content on `channel` (`frames._content_whole`)."""
    cdef Py_ssize_t end
    cdef uint64_t left
    cdef unsigned int size
    if n - pos < 7:
        return False
    size = _u32(p + pos + 3)
    end = pos + 8 + size
    if p[pos] != 2 or _u16(p + pos + 1) != channel or size < 14 or end > n:
        return False
    left = _u64(p + pos + 11)
    pos = end
    while left > 0:
        if n - pos < 7:
            return False
        size = _u32(p + pos + 3)
        if p[pos] != 3 or _u16(p + pos + 1) != channel:
            return False
        pos += 8 + size
        if pos > n:
            return False
        left -= size if size < left else left
    return True


cdef class _FrameIter:
    """What `FrameReader.frames()` returns: reads the reader's state afresh on every step, so feeding
    (and compacting) the reader between steps loses nothing; done after the first incomplete frame or
    error, as the pure generator is."""

    cdef FrameReader reader
    cdef bint done

    def __cinit__(self, FrameReader reader):
        self.reader = reader
        self.done = False

    def __iter__(self):
        return self

    def __next__(self):
        cdef FrameReader r = self.reader
        cdef object buf = r._buf
        cdef const unsigned char* p
        cdef Py_ssize_t n, pos, end
        cdef unsigned int ftype, channel, size
        cdef long long limit
        if self.done:
            raise StopIteration
        p = _contents(buf, &n)
        pos = r._pos
        if n - pos < 7:
            self.done = True
            raise StopIteration
        ftype = p[pos]
        channel = _u16(p + pos + 1)
        size = _u32(p + pos + 3)
        if ftype != 1 and ftype != 2 and ftype != 3 and ftype != 8:
            self.done = True
            raise FrameError(f"unknown frame type {ftype}")
        limit = r._limit()
        if <long long>size > limit:
            self.done = True
            raise FrameError(f"frame size {<long long>size + 8} larger than negotiated maximum {r.frame_max}",
                             FRAME_ERROR)
        end = pos + 7 + size
        if end >= n:
            self.done = True
            raise StopIteration
        if p[end] != FRAME_END:
            self.done = True
            marker = p[end]
            raise FrameError(f"bad frame end marker {marker:#x}")
        payload = PyBytes_FromStringAndSize(<const char*>p + pos + 7, size)
        r._pos = end + 1
        return (ftype, channel, payload)


def parse_publish(bytes payload not None):
    """See `frames.parse_publish`."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t ex_end, rk_end
    if n <= 6:
        return None
    ex_end = 7 + p[6]
    if ex_end >= n:
        return None
    rk_end = ex_end + 1 + p[ex_end]
    if rk_end >= n:
        return None
    try:
        exchange = PyUnicode_DecodeUTF8(<const char*>p + 7, ex_end - 7, NULL)
        routing_key = PyUnicode_DecodeUTF8(<const char*>p + ex_end + 1, rk_end - ex_end - 1, NULL)
    except UnicodeDecodeError:
        return None
    return (exchange, routing_key, p[rk_end], PyBytes_FromStringAndSize(<const char*>p + 6, rk_end - 6))


def parse_content_header(bytes payload not None):
    """See `frames.parse_content_header`."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef unsigned int flags
    cdef Py_ssize_t fixed_len
    if n < 14:
        raise FrameError("content header frame too short")
    flags = _u16(p + 12)
    fixed_len = _fixed_len(flags)
    cdef bint fixed_only = not (flags & VARIABLE_PROPS) and n - 12 == fixed_len
    return (_u16(p), _u64(p + 4), PyBytes_FromStringAndSize(<const char*>p + 12, n - 12), fixed_only)


def parse_ack(bytes payload not None):
    """See `frames.parse_ack`."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    if PyBytes_GET_SIZE(payload) != 13:
        return None
    cdef bint multiple = p[12] & 1
    return (_u64(p + 4), multiple)


def append_delivery(list out not None, unsigned int channel, prefix, uint64_t tag, unsigned char redelivered,
                    route_tail, header_payload, body, long long frame_max):
    """See `frames.append_delivery`: the same bytes, written with one allocation for a small body."""
    if channel > 0xFFFF or type(prefix) is not bytes or type(route_tail) is not bytes \
            or type(header_payload) is not bytes or type(body) is not bytes:
        _pure.append_delivery(out, channel, prefix, tag, redelivered, route_tail, header_payload, body,
                              frame_max)
        return
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix)
    cdef Py_ssize_t tlen = PyBytes_GET_SIZE(route_tail)
    cdef Py_ssize_t hlen = PyBytes_GET_SIZE(header_payload)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(body)
    cdef bint small = 0 < size <= SMALL_BODY
    cdef Py_ssize_t total = 8 + plen + 9 + tlen + 8 + hlen + (8 + size if small else 0)
    cdef bytes result = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* w = <unsigned char*>PyBytes_AS_STRING(result)
    cdef int i
    w = _put_frame_header(w, 1, channel, <unsigned int>(plen + 9 + tlen))
    w = _put(w, prefix)
    for i in range(8):
        w[i] = (tag >> (56 - 8 * i)) & 0xFF
    w[8] = redelivered
    w = _put(w + 9, route_tail)
    w[0] = FRAME_END
    w = _put_frame_header(w + 1, 2, channel, <unsigned int>hlen)
    w = _put(w, header_payload)
    w[0] = FRAME_END
    if small:
        w = _put_frame_header(w + 1, 3, channel, <unsigned int>size)
        w = _put(w, body)
        w[0] = FRAME_END
        out.append(result)
        return
    out.append(result)
    _append_body(out, channel, body, frame_max)


def stream_plain_run(list records not None, Py_ssize_t i, bytes prefix not None, bytes head not None,
                     bytes tail not None, exchange, routing_key, route_tail, message, list out not None):
    """See `frames.stream_plain_run`: the same messages, each record read with no Python-level slicing."""
    cdef Py_ssize_t n = len(records)
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix)
    cdef Py_ssize_t hlen = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t tlen = PyBytes_GET_SIZE(tail)
    cdef Py_ssize_t rlen = hlen + 8 + tlen
    cdef const unsigned char* p
    cdef const unsigned char* pre = <const unsigned char*>PyBytes_AS_STRING(prefix)
    cdef Py_ssize_t size, pos, length
    cdef long long offset
    cdef unsigned char* w
    cdef bytes raw, header, body
    cdef tuple rec
    cdef object entry, off
    cdef int k
    while i < n:
        rec = <tuple?>records[i]
        if len(rec) != 2:
            break
        off = rec[0]
        entry = rec[1]
        if type(entry) is not bytes or type(off) is not int or not 0 <= off < (1 << 63):
            break
        offset = off
        size = PyBytes_GET_SIZE(entry)
        p = <const unsigned char*>PyBytes_AS_STRING(entry)
        if plen + 5 > size or memcmp(p, pre, plen) != 0:
            break
        if p[plen] != 0x00 or p[plen + 1] != 0x53 or p[plen + 2] != 0x75:
            break
        if p[plen + 3] == 0xa0:
            length = p[plen + 4]
            pos = plen + 5
        elif p[plen + 3] == 0xb0 and plen + 8 <= size:
            length = _u32(p + plen + 4)
            pos = plen + 8
        else:
            break
        if pos + length != size:
            break
        body = PyBytes_FromStringAndSize(<const char*>p + pos, length)
        raw = PyBytes_FromStringAndSize(NULL, rlen)
        w = <unsigned char*>PyBytes_AS_STRING(raw)
        memcpy(w, PyBytes_AS_STRING(head), hlen)
        for k in range(8):
            w[hlen + k] = (<uint64_t>offset >> (56 - 8 * k)) & 0xFF
        memcpy(w + hlen + 8, PyBytes_AS_STRING(tail), tlen)
        header = PyBytes_FromStringAndSize(NULL, 12 + rlen)
        w = <unsigned char*>PyBytes_AS_STRING(header)
        w[0] = 0
        w[1] = 60
        w[2] = 0
        w[3] = 0
        for k in range(8):
            w[4 + k] = (<uint64_t>length >> (56 - 8 * k)) & 0xFF
        memcpy(w + 12, PyBytes_AS_STRING(raw), rlen)
        out.append((off, message(exchange, routing_key, None, body, raw, route_tail, header)))
        i += 1
    return i
