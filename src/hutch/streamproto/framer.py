"""Splitting a byte stream into stream-protocol frames, with a size limit.

Owns: the input buffer (a bytearray consumed with an offset, compacted when half is consumed so a
frame is copied at most once more) and the frame_max rule (a frame's size field, without its own 4
bytes, must not exceed `frame_max`; 0 means no limit, as in rabbit_stream_core). A frame that is too
large raises `FrameTooLarge` as soon as its size field arrives: its bytes are never buffered.

`frames()` yields each frame as bytes of its own (one copy); `frame_views()` yields views of the
buffer instead (no copy: the stream-protocol connection's publish path reads them and copies what it
keeps), valid until the next `feed`. A view still held at that `feed` does not break the reader: the
buffer is then replaced, not resized (a bytearray with a live view cannot be).

Invariant: `buffered()` never exceeds frame_max + 4 plus one `feed` call's bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from hutch.streamproto.errors import FrameTooLarge

_SIZE = struct.Struct(">I")


class FrameReader:
    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        try:
            if self._pos and self._pos * 2 >= len(self._buf):
                del self._buf[:self._pos]
                self._pos = 0
            self._buf += data
        except BufferError:  # a view from `frame_views` is still alive: leave it its buffer
            self._buf = self._buf[self._pos:] + data
            self._pos = 0

    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def unread(self) -> bytes:
        """A copy of the bytes fed and not yet consumed as frames (a partial frame's included)."""
        return bytes(memoryview(self._buf)[self._pos:])

    def frames(self) -> Iterator[bytes]:
        """Every complete frame's content (key, version, body) in order; stops at the first partial
        frame. Raises FrameTooLarge for a size past frame_max (the reader is then unusable)."""
        buf = self._buf
        for start, end in self._spans():
            with memoryview(buf) as view:  # one copy (a bytearray slice would be a second); released
                frame = bytes(view[start:end])  # before `feed` may resize the buffer
            yield frame

    def frame_views(self) -> Iterator[memoryview]:
        """`frames()` as views of the input buffer, without a copy; a view is valid until the next
        `feed` (take `bytes(view)` of what must outlive it)."""
        view = memoryview(self._buf)
        for start, end in self._spans():
            yield view[start:end]

    def push_back(self, frame: memoryview) -> None:
        """Un-consume `frame`, the last one `frame_views` yielded: it is the next frame again (the caller
        stopped before handling it)."""
        start = self._pos - len(frame) - 4
        assert start >= 0 and frame.obj is self._buf and _SIZE.unpack_from(self._buf, start)[0] == len(frame)
        self._pos = start

    def _spans(self) -> Iterator[tuple[int, int]]:
        """(start, end) in the buffer of each complete frame's content, consuming it."""
        buf = self._buf
        while True:
            pos = self._pos
            if len(buf) - pos < 4:
                return
            (size,) = _SIZE.unpack_from(buf, pos)
            if self.frame_max and size > self.frame_max:
                raise FrameTooLarge(size, self.frame_max)
            end = pos + 4 + size
            if len(buf) < end:
                return
            self._pos = end
            yield pos + 4, end
