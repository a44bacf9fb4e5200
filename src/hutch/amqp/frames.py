"""Sans-I/O framing: bytes in, frames out; frames in, bytes out.

Owns: `FrameReader`, which buffers received bytes and yields complete frames, judging a frame's size
from its 7-byte header before reading the payload (501 FRAME_ERROR past frame_max), and checking the
frame-end octet and frame type; and the encoders that build method, content and heartbeat frames,
splitting bodies by frame_max.

Rules: no sockets, no asyncio, no clocks. A `FrameReader` never raises anything but `AMQPError`
subclasses. The buffer is a bytearray consumed with an offset and compacted once per `feed`, so a
batch of small frames costs one copy, not one per frame.
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
_VALID_TYPES = (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT)


class FrameReader:
    """Incremental frame parser.

    `feed(data)` appends bytes; iterating `frames()` yields `(frame_type, channel, payload)` for every
    complete frame, where payload is a `bytes` copy. Invariant: `_buf[_pos:]` holds the bytes not yet
    consumed.
    """

    __slots__ = ("_buf", "_pos", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.frame_max = frame_max

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        buf = self._buf
        unpack = _HDR.unpack_from
        frame_max = self.frame_max
        while True:
            pos = self._pos
            avail = len(buf) - pos
            if avail < 7:
                return
            ftype, channel, size = unpack(buf, pos)
            if ftype not in _VALID_TYPES:
                raise FrameError(f"unknown frame type {ftype}")
            if frame_max and size + FRAME_OVERHEAD > frame_max:
                raise FrameError(
                    f"frame size {size + FRAME_OVERHEAD} larger than negotiated maximum {frame_max}",
                    FRAME_ERROR,
                )
            end = pos + 7 + size
            if end + 1 > len(buf):
                return
            if buf[end] != FRAME_END:
                raise FrameError(f"bad frame end marker {buf[end]:#x}")
            payload = bytes(buf[pos + 7 : end])
            self._pos = end + 1
            yield ftype, channel, payload


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
