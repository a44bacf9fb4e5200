"""The stream protocol's errors: each carries the response code a client sees.

Owns two families, as h2 separates stream errors from connection errors:
- `FrameError` and its kinds: the bytes cannot be a frame of this protocol (too large, unknown key or
  version, a body that does not parse). The connection answers what it can and closes.
- `CommandError`: a well-formed command the server refuses; the request gets a response with `code`
  and the connection stays open.
"""

from __future__ import annotations

from hutch.streamproto.codes import Code


class StreamProtocolError(Exception):
    """Any error of the stream protocol; `code` is the response code (codes.Code)."""

    code: Code = Code.INTERNAL_ERROR

    def __init__(self, text: str, code: Code | None = None) -> None:
        super().__init__(text)
        self.text = text
        if code is not None:
            self.code = code


class FrameError(StreamProtocolError):
    """The connection cannot go on: the frame is too large, unknown, or malformed."""

    code = Code.UNKNOWN_FRAME


class FrameTooLarge(FrameError):
    code = Code.FRAME_TOO_LARGE

    def __init__(self, size: int, frame_max: int) -> None:
        super().__init__(f"frame of {size} bytes is larger than frame_max ({frame_max} bytes)")
        self.size = size
        self.frame_max = frame_max


class UnknownFrame(FrameError):
    """A key/version this codec does not know, or a body that does not parse for its key."""

    code = Code.UNKNOWN_FRAME


class CommandError(StreamProtocolError):
    """A request refused with `code`; the connection stays open."""
