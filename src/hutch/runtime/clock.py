"""The runtime's one clock.

Owns: the wall clock (milliseconds since the epoch, for message timestamps, TTLs, x-expires, statistics)
and the monotonic clock (seconds, for timeouts and intervals) that every runtime object reads. The
composition root (`runtime/app.py`) builds one `SystemClock` and hands it to the node; the node hands it
to queue types and sessions. Tests build a `ManualClock` and move time themselves.

Rules:
- Nothing in the runtime calls `time.time()` for a wall-clock reading: it asks its clock.
- `ManualClock` never goes backwards (`advance` refuses a negative step).
"""

from __future__ import annotations

import time


class SystemClock:
    """The process's clocks."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wall_s(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests drive: `advance(seconds)` moves both readings."""

    __slots__ = ("_mono", "_wall_ns")

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic: float = 1000.0) -> None:
        self._wall_ns = wall_ms * 1_000_000
        self._mono = monotonic

    def wall_ms(self) -> int:
        return self._wall_ns // 1_000_000

    def wall_s(self) -> float:
        return self._wall_ns / 1e9

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a clock never goes backwards"
        self._wall_ns += int(seconds * 1e9)
        self._mono += seconds


SYSTEM_CLOCK = SystemClock()
