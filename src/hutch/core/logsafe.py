"""Strings that clients control, made safe to put in a log line.

Owns: `safe` (one user string for a log line: control and line-separator characters escaped, length
capped at `MAX_LOGGED_CHARS` with a marker; call sites that log a name use it), `SafeArgsFilter` (a
`logging.Filter` on `hutch-server`'s log handler that escapes every argument of every record it emits
and caps it at `MAX_LOGGED_ARG_CHARS`: the net under call sites that pass a user string as it is), and
`LogThrottle` (at most `THROTTLE_LINES` lines of one kind per `log.throttle_interval`, 10 s by default, the next line
saying how many were left out: login refusals and update-secret lines, which any client can repeat at
will; before issue 21 they wrote 18,542 lines in 12 s).

Why: user names, vhost, queue and exchange names, client properties and AMQP reply texts reach the
log. Verbatim, a name with a newline forges a log entry of its own and a 100 KB user name makes a
100 KB line. Rules:
- Every character that is not printable (`str.isprintable`: C0/C1 controls, DEL, U+2028/U+2029 line
  and paragraph separators, other separators but the space) is written as `\\n`, `\\r`, `\\t`, `\\xNN`,
  `\\uNNNN` or `\\UNNNNNNNN`. `safe` also doubles a backslash, so its text is unambiguous; the filter
  does not (so it leaves `safe`'s output as it is).
- A string longer than the cap keeps its first characters followed by `...[truncated, N chars]`: a
  log line carrying user strings stays bounded.
- The filter touches strings and objects whose text is not ours (exceptions; not numbers); the format
  string itself is code, but one built with an f-string is escaped too (not truncated).
Stdlib only, no IO.
"""

from __future__ import annotations

import logging
from typing import Any

MAX_LOGGED_CHARS = 256
"""Longest user string a log line carries (RabbitMQ's names are at most 255 bytes)."""
MAX_LOGGED_ARG_CHARS = 4096
"""Longest argument the filter lets through (a whole detail text, an exception's text)."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str, backslash: bool = True) -> str:
    if ch == "\\":
        return "\\\\" if backslash else ch
    named = _NAMED.get(ch)
    if named is not None:
        return named
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe(value: object, limit: int = MAX_LOGGED_CHARS) -> str:
    """`value` as text for one log line: escaped and at most `limit` characters plus a marker."""
    text = value if isinstance(value, str) else str(value)
    size = len(text)
    if size <= limit and text.isprintable() and "\\" not in text:
        return text  # the common case: nothing to do
    head = text[:limit] if size > limit else text
    escaped = "".join(_escape_char(ch) for ch in head)
    if size > limit:
        escaped += f"...[truncated, {size} chars]"
    return escaped


def _escaped(text: str, limit: int) -> str:
    """The filter's escape: non-printable characters only (idempotent on `safe`'s output), capped."""
    size = len(text)
    if size <= limit and text.isprintable():
        return text
    head = text[:limit] if size > limit else text
    escaped = "".join(_escape_char(ch, backslash=False) for ch in head)
    return escaped + (f"...[truncated, {size} chars]" if size > limit else "")


def _safe_arg(arg: Any) -> Any:
    if isinstance(arg, str):
        return _escaped(arg, MAX_LOGGED_ARG_CHARS)
    if arg is None or isinstance(arg, int | float):
        return arg
    text = str(arg)
    if len(text) <= MAX_LOGGED_ARG_CHARS and text.isprintable():
        return arg  # harmless: keep the object, so a `%r` still shows its repr
    return _escaped(text, MAX_LOGGED_ARG_CHARS)


class SafeArgsFilter(logging.Filter):
    """Escapes and caps every argument of a record (see the module rules); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(_safe_arg(a) for a in args)
        elif isinstance(args, dict) and args:
            record.args = {k: _safe_arg(v) for k, v in args.items()}
        msg = record.msg
        if isinstance(msg, str) and not msg.isprintable():
            record.msg = "".join(_escape_char(ch, backslash=False) for ch in msg)
        return True


THROTTLE_LINES = 20
THROTTLE_INTERVAL_S = 10.0


class LogThrottle:
    """At most `max_lines` lines per window of `interval_s` (windows start at the first line after the
    previous one ended). `admit(now)` answers None for a line to leave out, else how many lines were
    left out since the last one written (the caller appends `suppressed_note` of it). Pure: the caller
    gives the time. Invariant: 0 <= written <= max_lines.

    A throttle made without `interval_s` follows the process's setting, `LogThrottle.default_interval_s`
    (the `log.throttle_interval` key; `hutch-server` sets it once at start-up, before any line is
    logged, through `set_default_interval`)."""

    __slots__ = ("_interval_s", "max_lines", "suppressed", "window_start", "written")
    default_interval_s = THROTTLE_INTERVAL_S

    def __init__(self, max_lines: int = THROTTLE_LINES, interval_s: float | None = None) -> None:
        assert max_lines > 0 and (interval_s is None or interval_s > 0)
        self.max_lines = max_lines
        self._interval_s = interval_s
        self.window_start: float | None = None
        self.written = 0
        self.suppressed = 0

    @property
    def interval_s(self) -> float:
        return LogThrottle.default_interval_s if self._interval_s is None else self._interval_s

    @staticmethod
    def set_default_interval(interval_s: float) -> None:
        assert interval_s > 0
        LogThrottle.default_interval_s = interval_s

    def admit(self, now: float) -> int | None:
        if self.window_start is None or not 0 <= now - self.window_start < self.interval_s:  # (a clock reset too)
            self.window_start = now
            self.written = 0
        if self.written >= self.max_lines:
            self.suppressed += 1
            return None
        self.written += 1
        left_out, self.suppressed = self.suppressed, 0
        assert 0 < self.written <= self.max_lines
        return left_out


def suppressed_note(left_out: int) -> str:
    """The tail of a throttled line that follows `left_out` lines left out ('' when none were)."""
    return f" ({left_out} similar lines suppressed before this one)" if left_out else ""


__all__ = ["MAX_LOGGED_ARG_CHARS", "MAX_LOGGED_CHARS", "THROTTLE_INTERVAL_S", "THROTTLE_LINES", "LogThrottle",
           "SafeArgsFilter", "safe", "suppressed_note"]
