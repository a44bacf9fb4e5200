"""AMQP 0-9-1 reply codes and the two kinds of protocol error.

Owns: the reply-code constants and the exception types the protocol layer and the broker raise.
Rule: a `ChannelError` closes one channel (Channel.Close); a `ConnectionError_` closes the whole
connection (Connection.Close). Codes 311-313 and 403-406 are channel errors; 320, 402, 501-506, 530,
540 and 541 are connection errors (REFERENCE.md), and `error_for_code` picks the right type.
"""

from __future__ import annotations

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

CHANNEL_ERROR_CODES = frozenset({311, 312, 313, 403, 404, 405, 406})


class AMQPError(Exception):
    """A protocol-level error carrying the AMQP reply code, text and the offending method."""

    code: int = INTERNAL_ERROR

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """The reply text RabbitMQ sends: the code's name, a dash, then the detail, cut to the 255 bytes a
        short string holds (as RabbitMQ does; a longer text could not be encoded at all)."""
        text = f"{REPLY_NAMES.get(self.code, 'ERROR')} - {self.text}"
        raw = text.encode()
        if len(raw) <= 255:
            return text
        return raw[:252].decode(errors="ignore") + "..."

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.text!r}, {self.class_id}, {self.method_id})"


class ChannelError(AMQPError):
    """Closes the channel it occurred on; the connection stays open."""


class ConnectionError_(AMQPError):  # noqa: N801 - avoid shadowing the builtin ConnectionError
    """Closes the connection."""


class FrameError(ConnectionError_):
    """Malformed framing: always 501 unless said otherwise."""

    def __init__(self, text: str, code: int = FRAME_ERROR) -> None:
        super().__init__(code, text)


def error_for_code(code: int, text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    """Build the right error type (channel or connection) for a reply code."""
    cls = ChannelError if code in CHANNEL_ERROR_CODES else ConnectionError_
    return cls(code, text, class_id, method_id)
