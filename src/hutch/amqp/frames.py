"""Sans-I/O framing: bytes in, frames out; frames in, bytes out.

Owns: `FrameReader`, which buffers received bytes and yields complete frames, judging a frame's size
from its 7-byte header before reading the payload (501 FRAME_ERROR past frame_max), and checking the
frame-end octet and frame type; and the encoders that build method, content and heartbeat frames,
splitting bodies by frame_max.

Rules: no sockets, no asyncio, no clocks. A `FrameReader` never raises anything but `AMQPError`
subclasses. The buffer is consumed with an offset and rebuilt once per `feed`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from .errors import FRAME_ERROR, FrameError
from .spec import (
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

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_VALID_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))


class FrameReader:
    """Incremental frame parser.

    `feed(data)` appends bytes; iterating `frames()` yields `(frame_type, channel, payload)` for every
    complete frame, where payload is `bytes`. Invariant: `_buf[_pos:]` holds the bytes not yet consumed.
    The buffer is an immutable `bytes` object, so a payload is one slice (one copy); `feed` copies only
    the unconsumed remainder (a partial frame) in front of the new data.
    """

    __slots__ = ("_buf", "_pos", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self._buf = b""
        self._pos = 0
        self.frame_max = frame_max

    def feed(self, data: bytes) -> None:
        if self._pos < len(self._buf):
            self._buf = self._buf[self._pos :] + data
        else:
            self._buf = bytes(data)
        self._pos = 0

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        buf = self._buf
        unpack = _HDR.unpack_from
        limit = self.frame_max - FRAME_OVERHEAD if self.frame_max else 0xFFFFFFFF
        n = len(buf)
        pos = self._pos
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
            payload = buf[pos + 7 : end]
            pos = end + 1
            self._pos = pos
            yield ftype, channel, payload
            if self._buf is not buf:  # fed while this iterator was suspended: continue on the new buffer
                buf = self._buf
                n = len(buf)
                pos = self._pos


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
