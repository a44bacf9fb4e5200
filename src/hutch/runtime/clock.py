"""The runtime's clock for readings: the wall clock and the monotonic clock, no timers.

Owns: the wall clock (milliseconds since the epoch, for message timestamps, TTLs, x-expires, statistics)
and the monotonic clock (seconds, for timeouts and intervals) that every runtime object reads. The
composition root (`runtime/app.py`) builds one `SystemClock` and hands it to the node; the node hands it
to queue types and sessions. Tests build a `ManualClock` and move time themselves.

It is one of two time ports, on purpose. This one (the `Clock` protocol of runtime/ports.py) only reads
time; nothing here schedules. An AMQP connection's timers (heartbeats, the handshake timeout, the close
grace, the deferred flush) need `call_later`/`call_soon` and a `time()` on the same base as those timers:
that is the event loop itself, typed as `LoopClock` in runtime/session/ports.py. One protocol for both
would make this clock hold a loop (and a manual clock keep a timer queue) for callers that never
schedule, and would put an adapter call between a connection and the loop on every deferred flush;
and the two readings are not interchangeable (uvloop's loop time counts whole milliseconds; asyncio
leaves each loop's epoch and precision unspecified).

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
