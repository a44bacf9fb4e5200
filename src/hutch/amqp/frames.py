"""Sans-I/O framing: bytes in, frames out; frames in, bytes out.

Owns: `FrameReader`, which buffers received bytes and yields complete frames, judging a frame's size
from its 7-byte header before reading the payload (501 FRAME_ERROR past frame_max), and checking the
frame-end octet and frame type; the encoders that build method, content and heartbeat frames,
splitting bodies by frame_max; and the per-message hot-path helpers (`parse_publish`,
`parse_content_header`, `parse_ack`, `append_delivery`).

This module is the pure-Python reference. `_cframes.pyx` compiles the same reader and hot-path helpers
with the same interface and the same output for the same input (tests/codec/test_speedups.py);
`speedups` picks one of the two. Code above the codec imports them from `speedups`.

Rules: no sockets, no asyncio, no clocks. A `FrameReader` never raises anything but `AMQPError`
subclasses. The buffer is consumed with an offset; bytes received are copied at most once more
than the payload slices themselves (see `FrameReader`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from .errors import FRAME_ERROR, FrameError
from .spec import (
    FLAG_DELIVERY_MODE,
    FLAG_PRIORITY,
    FLAG_TIMESTAMP,
    FRAME_BODY,
    FRAME_END,
    FRAME_END_BYTE,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    Method,
)

_HDR = struct.Struct(">BHI")
_CONTENT_HDR = struct.Struct(">BHIHHQ")  # frame header + class, weight, body size
_BODY_HDR = struct.Struct(">BHI")
_HEADER_FIELDS = struct.Struct(">HHQ")  # content header payload: class, weight, body size
_U64 = struct.Struct(">Q")  # the body size alone
_TAG_REDELIVERED = struct.Struct(">QB")
DELIVER_SMALL_BODY = 4096  # deliveries with a body up to this size are written as one bytes object

# the encoded length of a property list holding only fixed-size properties, by its flag word (8 entries)
_FIXED_PROPS_LEN = {
    dm | pr | ts: 2 + (1 if dm else 0) + (1 if pr else 0) + (8 if ts else 0)
    for dm in (0, FLAG_DELIVERY_MODE) for pr in (0, FLAG_PRIORITY) for ts in (0, FLAG_TIMESTAMP)
}

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_VALID_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))


class FrameReader:
    """Incremental frame parser.

    `feed(data)` appends bytes; iterating `frames()` yields `(frame_type, channel, payload)` for every
    complete frame, where payload is `bytes`. Invariant: `_buf[_pos:]` holds the bytes not yet consumed.

    Buffering: while nothing is left over, a fed `bytes` object becomes the buffer as it is (no copy),
    and each payload is one slice of it. A partial frame left over is moved once into a `bytearray`
    that later feeds are appended to (amortised O(len(data)), never a copy of the whole buffer per
    feed); the consumed front of that bytearray is dropped only when it is at least half of it.

    `tolerance` (bytes) lets a frame be that much longer than `frame_max` before it is refused:
    RabbitMQ's reader accepts frames up to 8 bytes over (`?FRAME_SIZE_FUDGE` in rabbit_reader),
    because several clients fill a frame with `frame_max` payload bytes.
    """

    __slots__ = ("_buf", "_pos", "frame_max", "tolerance")

    def __init__(self, frame_max: int, tolerance: int = 0) -> None:
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self.frame_max = frame_max
        self.tolerance = tolerance

    def feed(self, data: bytes) -> None:
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):  # nothing left over: take the new bytes as they are
            self._buf = bytes(data)
            self._pos = 0
        elif isinstance(buf, bytearray):
            if pos and pos * 2 >= len(buf):
                del buf[:pos]  # CPython moves the start pointer; the remainder is not copied each feed
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

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        unpack = _HDR.unpack_from
        buf = self._buf
        n = len(buf)
        pos = self._pos
        limit = self._limit()
        while n - pos >= 7:
            ftype, channel, size = unpack(buf, pos)
            if ftype not in _VALID_TYPES:
                raise FrameError(f"unknown frame type {ftype}")
            if size > limit:
                raise FrameError(
                    f"frame size {size + FRAME_OVERHEAD} larger than negotiated maximum {self.frame_max}",
                    FRAME_ERROR,
                )
            end = pos + 7 + size
            if end >= n:
                return
            if buf[end] != FRAME_END:
                raise FrameError(f"bad frame end marker {buf[end]:#x}")
            payload = buf[pos + 7 : end] if type(buf) is bytes else bytes(memoryview(buf)[pos + 7 : end])
            self._pos = end + 1
            yield ftype, channel, payload
            # the reader may have been fed (and compacted) while this iterator was suspended
            buf = self._buf
            n = len(buf)
            pos = self._pos
            limit = self._limit()  # a tune-ok may have set frame_max

    def take_content(self, channel: int) -> tuple[bytes, bytes] | None:
        """A publish's content taken in one step: when the next two frames are complete and well formed,
        a content header on `channel` (class 60 or not, at least 14 bytes) and one body frame on `channel`
        holding exactly the body size the header declares (more than 0 bytes), consume both and return
        (header payload, body payload). Otherwise None, and nothing is consumed: `frames()` yields them
        (and raises their errors) as before. Lets the session skip two turns of its frame loop per message.
        """
        buf = self._buf
        n = len(buf)
        pos = self._pos
        if n - pos < 21:
            return None
        limit = self._limit()
        ftype, ch, size = _HDR.unpack_from(buf, pos)
        end = pos + 7 + size
        if ftype != FRAME_HEADER or ch != channel or size < 14 or size > limit or end + 8 >= n \
                or buf[end] != FRAME_END:
            return None
        (body_size,) = _U64.unpack_from(buf, pos + 11)
        bpos = end + 1
        ftype, ch, bsize = _HDR.unpack_from(buf, bpos)
        bend = bpos + 7 + bsize
        if ftype != FRAME_BODY or ch != channel or bsize != body_size or not bsize or bsize > limit \
                or bend >= n or buf[bend] != FRAME_END:
            return None
        if type(buf) is bytes:
            header, body = buf[pos + 7:end], buf[bpos + 7:bend]
        else:
            view = memoryview(buf)
            header, body = bytes(view[pos + 7:end]), bytes(view[bpos + 7:bend])
        self._pos = bend + 1
        return header, body

    def take_publishes(self, channel: int, method: bytes, max_body: int, max_count: int) -> list[tuple[bytes, bytes]]:
        """A run of publishes like the one just handled, taken in one step (the session's publish lane):
        while the next three frames are complete and are, on `channel`, a method frame whose payload is
        exactly `method` (the same basic.publish: exchange, routing key, flags), a content header of
        class 60 and weight 0 whose property list holds only fixed-size properties and has exactly their
        length, declaring a body of 1 to `max_body` bytes, and one body frame of exactly that size; at
        most `max_count` of them. Returns their (header payload, body payload) and consumes them; stops,
        consuming nothing more, at the first frame that differs or is incomplete (`frames()` and the
        generic path judge it, and raise its errors)."""
        buf = self._buf
        n = len(buf)
        pos = self._pos
        limit = self._limit()
        mlen = len(method)
        view = memoryview(buf) if type(buf) is not bytes else None
        out: list[tuple[bytes, bytes]] = []
        while len(out) < max_count:
            hpos = pos + 7 + mlen + 1
            if n - hpos < 22 or _HDR.unpack_from(buf, pos) != (FRAME_METHOD, channel, mlen) \
                    or buf[pos + 7:hpos - 1] != method or buf[hpos - 1] != FRAME_END:
                break
            ftype, ch, size = _HDR.unpack_from(buf, hpos)
            end = hpos + 7 + size
            if ftype != FRAME_HEADER or ch != channel or size < 14 or size > limit or end + 8 >= n \
                    or buf[end] != FRAME_END or buf[hpos + 7:hpos + 11] != b"\x00\x3c\x00\x00" \
                    or _FIXED_PROPS_LEN.get((buf[hpos + 19] << 8) | buf[hpos + 20]) != size - 12:
                break
            (body_size,) = _U64.unpack_from(buf, hpos + 11)
            bpos = end + 1
            ftype, ch, bsize = _HDR.unpack_from(buf, bpos)
            bend = bpos + 7 + bsize
            if ftype != FRAME_BODY or ch != channel or bsize != body_size or not bsize or bsize > limit \
                    or bsize > max_body or bend >= n or buf[bend] != FRAME_END:
                break
            if view is None:
                out.append((bytes(buf[hpos + 7:end]), bytes(buf[bpos + 7:bend])))
            else:
                out.append((bytes(view[hpos + 7:end]), bytes(view[bpos + 7:bend])))
            pos = bend + 1
        self._pos = pos
        return out

    def _limit(self) -> int:
        """The largest payload size accepted."""
        return self.frame_max - FRAME_OVERHEAD + self.tolerance if self.frame_max else 0xFFFFFFFF

    def cut_unfinished_publish(self) -> bytes:
        """Cut the buffer before the first complete basic.publish method frame whose content does not
        follow it whole: its content header frame on its channel (complete, at least 14 bytes) and then
        body frames on its channel (complete) adding up to the body size the header declares (a frame of
        anything else first, or the buffer's end, is not whole). Returns the bytes cut (b"" when every
        complete publish buffered is whole); `feed` them back to go on. Frames are judged only by their
        lengths here (`frames()` raises their errors); a frame not yet complete stays. An island's move
        (runtime/session/connection.py) hands a connection over only between messages."""
        buf = self._buf
        n = len(buf)
        pos = self._pos
        unpack = _HDR.unpack_from
        while n - pos >= 7:
            ftype, channel, size = unpack(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if ftype == FRAME_METHOD and buf[pos + 7:pos + 11] == _PUBLISH_ID and not _content_whole(buf, n, end, channel):
                tail = bytes(buf[pos:])
                if type(buf) is bytearray:
                    del buf[pos:]
                else:
                    self._buf = buf[:pos]
                return tail
            pos = end
        return b""


_PUBLISH_ID = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40


def _content_whole(buf: bytes | bytearray, n: int, pos: int, channel: int) -> bool:
    """Whether `buf[pos:n]` starts with a whole content on `channel` (`FrameReader.cut_unfinished_publish`)."""
    if n - pos < 7:
        return False
    ftype, ch, size = _HDR.unpack_from(buf, pos)
    end = pos + 8 + size
    if ftype != FRAME_HEADER or ch != channel or size < 14 or end > n:
        return False
    (left,) = _U64.unpack_from(buf, pos + 11)
    pos = end
    while left > 0:
        if n - pos < 7:
            return False
        ftype, ch, size = _HDR.unpack_from(buf, pos)
        pos += 8 + size
        if ftype != FRAME_BODY or ch != channel or pos > n:
            return False
        left -= size
    return True


def method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return _HDR.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def method_frame_raw(channel: int, payload: bytes) -> bytes:
    return _HDR.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def content_frames(channel: int, class_id: int, properties_raw: bytes, body: bytes,
                   frame_max: int) -> list[bytes]:
    """Header frame followed by body frames, each at most `frame_max` bytes long."""
    out = [
        _CONTENT_HDR.pack(FRAME_HEADER, channel, 12 + len(properties_raw), class_id, 0, len(body)),
        properties_raw,
        FRAME_END_BYTE,
    ]
    append_body(out, channel, body, frame_max)
    return out


def append_body(out: list[bytes], channel: int, body: bytes, frame_max: int) -> None:
    """Append body frames for `body` to `out`, split so each frame fits frame_max."""
    size = len(body)
    if not size:
        return
    chunk = frame_max - FRAME_OVERHEAD if frame_max else size
    if size <= chunk:
        out.append(_BODY_HDR.pack(FRAME_BODY, channel, size))
        out.append(body)
        out.append(FRAME_END_BYTE)
        return
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        out.append(_BODY_HDR.pack(FRAME_BODY, channel, len(piece)))
        out.append(bytes(piece))
        out.append(FRAME_END_BYTE)


# -- per-message hot path: publish in, delivery out, ack in --------------------------------------------
def parse_publish(payload: bytes) -> tuple[str, str, int, bytes] | None:
    """A basic.publish method payload decoded in place: (exchange, routing key, bits, route tail).

    `bits` is the flags octet (1 mandatory, 2 immediate). The route tail is the exchange and
    routing-key short strings as they were sent, laid out exactly as the tail of basic.deliver.
    None when the payload is truncated or a name is not UTF-8: the generic decoder then judges it.
    """
    try:
        ex_end = 7 + payload[6]
        rk_end = ex_end + 1 + payload[ex_end]
        bits = payload[rk_end]
        exchange = payload[7:ex_end].decode()
        routing_key = payload[ex_end + 1 : rk_end].decode()
    except (IndexError, UnicodeDecodeError):
        return None
    return exchange, routing_key, bits, payload[6:rk_end]


def parse_content_header(payload: bytes) -> tuple[int, int, bytes, bool]:
    """A content header frame payload: (class id, body size, property list, fixed_only).

    `fixed_only` is True when the property list holds only fixed-size properties (none,
    delivery-mode, priority, timestamp: what most publishers send) and has exactly their length, so
    it needs no decoding to be valid. A payload shorter than 14 bytes is a 501.
    """
    if len(payload) < 14:
        raise FrameError("content header frame too short")
    class_id, _weight, body_size = _HEADER_FIELDS.unpack_from(payload, 0)
    props_raw = payload[12:]
    fixed_only = _FIXED_PROPS_LEN.get((props_raw[0] << 8) | props_raw[1]) == len(props_raw)
    return class_id, body_size, props_raw, fixed_only


def parse_ack(payload: bytes) -> tuple[int, bool] | None:
    """A basic.ack method payload: (delivery tag, multiple); None unless it is exactly 13 bytes long."""
    if len(payload) != 13:
        return None
    tag, bits = _TAG_REDELIVERED.unpack_from(payload, 4)
    return tag, bits & 1 == 1


def append_delivery(out: list[bytes], channel: int, prefix: bytes, tag: int, redelivered: bool,
                    route_tail: bytes, header_payload: bytes, body: bytes, frame_max: int) -> None:
    """Append basic.deliver (or any method whose payload is `prefix` + tag + redelivered + route tail)
    with its content header and body frames to `out`.

    `prefix` is the method's class and method ids and the arguments before the delivery tag (a
    consumer's pre-encoded `frame_prefix`). A body of at most `DELIVER_SMALL_BODY` bytes goes out
    with the method and header as one bytes object; a larger one is split by `append_body`.
    """
    head = b"".join((
        _HDR.pack(FRAME_METHOD, channel, len(prefix) + 9 + len(route_tail)), prefix,
        _TAG_REDELIVERED.pack(tag, redelivered), route_tail, FRAME_END_BYTE,
        _HDR.pack(FRAME_HEADER, channel, len(header_payload)), header_payload, FRAME_END_BYTE,
    ))
    size = len(body)
    if 0 < size <= DELIVER_SMALL_BODY:
        out.append(head + _BODY_HDR.pack(FRAME_BODY, channel, size) + body + FRAME_END_BYTE)
    else:
        out.append(head)
        append_body(out, channel, body, frame_max)


_OFFSET = struct.Struct(">q")


def stream_plain_run(records: list[tuple[int, bytes]], i: int, prefix: bytes, head: bytes, tail: bytes,
                     exchange: str, routing_key: str, route_tail: bytes, message: Any,
                     out: list[tuple[int, Any]]) -> int:
    """A stream consumer's messages for a run of records that share one plain prefix (the AMQP 0-9-1
    consumer's hot path, queues/stream/amqp10.py `to_091_list`).

    From `records[i]` on, each (offset, entry) whose entry is bytes, starts with `prefix` and continues
    with exactly one AMQP 1.0 data section that fills it (constructor 0x00 0x53 0x75, then vbin8 or
    vbin32) becomes (offset, message(exchange, routing_key, None, body, raw, route_tail, header)), appended
    to `out`, where raw = `head` + the offset as a signed 64-bit integer + `tail` (the 0-9-1 property
    list: flags, the x-stream-offset table, maybe the delivery mode) and header is the content header's
    payload (class 60, weight 0, the body's size, raw). Returns the index of the first record not taken
    (`len(records)` when every one was): the caller reads that one the general way.
    """
    n = len(records)
    plen = len(prefix)
    while i < n:
        offset, entry = records[i]
        if type(entry) is not bytes or not entry.startswith(prefix) or not 0 <= offset < 1 << 63:
            break
        size = len(entry)
        if plen + 5 > size or entry[plen:plen + 3] != b"\x00\x53\x75":
            break
        ctor = entry[plen + 3]
        if ctor == 0xa0:
            length, pos = entry[plen + 4], plen + 5
        elif ctor == 0xb0 and plen + 8 <= size:
            length, pos = int.from_bytes(entry[plen + 4:plen + 8], "big"), plen + 8
        else:
            break
        if pos + length != size:
            break
        body = entry[pos:]
        raw = head + _OFFSET.pack(offset) + tail
        out.append((offset, message(exchange, routing_key, None, body, raw, route_tail,
                                    _HEADER_FIELDS.pack(60, 0, length) + raw)))
        i += 1
    return i
