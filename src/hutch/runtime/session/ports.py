"""The ports of the AMQP session: what a connection is given instead of a socket, a loop and a cluster.

Owns four small `Protocol`s and nothing else:
- `Transport`: where a connection writes its bytes and the switch for its input (an asyncio transport
  satisfies it; so does `MemoryTransport` in tests/session/memory.py);
- `LoopClock`: the time and the timers a connection uses (heartbeats, the handshake timeout, the close
  grace period, the deferred flush); an asyncio loop satisfies it, and tests drive a manual one. It is
  not the runtime's `Clock` (runtime/ports.py, implemented in runtime/clock.py), which only reads the
  wall and monotonic clocks and has no timers: a connection reads the wall clock (message timestamps,
  `connected_at`) through its broker (`BrokerPort.wall_ms`) and schedules on its `LoopClock`;
- `MethodGate`: what a method must wait for before it runs and before its reply may leave (a
  clustered node's read barrier, a queue on another node, the commit of a replicated change);
- `Handover`: connection locality in a node of workers (session/handover.py, runtime/workers/handover.py):
  which other worker a queue lives in, and moving a quiet connection's socket and state there.

Rules: no imports from hutch; these are shapes, not implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Transport(Protocol):
    """The output side of a connection (bytes out) and its input switch (pause/resume reading)."""

    def write(self, data: bytes) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class LoopClock(Protocol):
    """Monotonic time in seconds and callbacks later or soon (asyncio's loop has this shape).

    `time()` is the base `call_later` counts from (the loop's own time: whole milliseconds under uvloop),
    so a deadline computed from it and a timer armed with it agree."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle: ...

    def call_soon(self, callback: Callable[[], object]) -> Any: ...


class MethodGate(Protocol):
    """Waiting for the world outside the node before a channel method runs and before its reply leaves.

    `wants` is asked for every method on an open channel and must be cheap. For a method it wants, the
    connection stops reading and awaits `barrier` (the node's view is brought up to date), then, if
    the channel is still there, `prepare` (answers fetched from another node; may raise
    `ChannelError`), runs the method, and, when `holds_replies()` then says so, keeps the method's
    output back until `after` returns (the change is committed). `barrier` and `after` raise
    `hutch.runtime.errors.ClusterUnavailable` when the answer cannot come in time."""

    def wants(self, channel: Any, method: Any) -> bool: ...

    async def barrier(self, method: Any) -> None: ...

    async def prepare(self, channel: Any, method: Any) -> None: ...

    def holds_replies(self) -> bool: ...

    async def after(self) -> None: ...


class Handover(Protocol):
    """Moving a connection to the worker of the queue it uses (a node of workers, `workers.locality`).

    `home_of` names the other worker that is home to `queue` and can take a connection now (None: this
    worker, another node, or a worker that is down). `move` hands the connection's socket (duplicated:
    the caller then drops its transport without closing the TCP connection) and its encoded state to
    worker `to`; False when it could not be sent (the connection stays, nothing was handed over). `relay`
    hands over a TLS connection: its TLS session (`transport`) stays in this worker, which pumps the
    plaintext to worker `to` (the relay owns `transport` once it returns True)."""

    def home_of(self, queue: Any) -> int | None: ...

    def move(self, sock: Any, state: bytes, to: int) -> bool: ...

    def relay(self, transport: Any, state: bytes, to: int) -> bool: ...
