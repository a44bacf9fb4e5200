"""The publishing hot path: pre-encoded publishes written in batches, with confirms and a rate limit.

Owns: `encode_publish` (one publish as bytes, encoded once with the codec) and `Producer`.

How a batch is made: the publish's method frame, content header frame and body frame are encoded once
into `prefix + timestamp + suffix`, where the 8 timestamp bytes are the first 8 bytes of the body. A
batch of n messages is `b"".join([prefix, ts, suffix] * n)`: one list repeat and one join in C, no
Python work per message, then one `transport.write`. Every message of a batch carries the same send
timestamp (CLOCK_MONOTONIC ns, system-wide on Linux, so a consumer in another process can subtract it):
they leave in the same write.

Rules:
- Never more than `confirm_window` unconfirmed messages (when confirms are on): a batch is cut to the
  room left, and acks arriving in `data_received` restart publishing.
- Never write while the transport is paused (`pause_writing`); `resume_writing` restarts.
- The rate limit is a token bucket refilled by a `loop.call_later` tick, never a sleep per message.
- Between two batches the producer yields to the event loop (`call_soon`) so acks and flow control are
  read; a batch is capped at BATCH_BYTES so one write stays a socket-buffer-sized chunk.
- Confirm accounting is `ConfirmTracker`'s: each publish sequence number is counted once, whether it
  is settled by a multiple ack, a single ack, out of order, or twice.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from hutch.amqp import spec
from hutch.amqp.frames import content_frames, method_frame

from .options import AmqpUri
from .protocol import AmqpClient, AmqpClosed

BATCH_BYTES = 1 << 16
MAX_BATCH_MESSAGES = 1024
RATE_TICK_S = 0.01
CLASS_BASIC = 60
CHANNEL = 1

_TS = struct.Struct(">Q")
_ACK = struct.Struct(">QB")
_clock = time.clock_gettime_ns
_MONOTONIC = time.CLOCK_MONOTONIC


@dataclass(frozen=True)
class PublishPlan:
    """What a producer sends. `limit` 0 = unlimited, `rate` 0 = as fast as allowed."""

    exchange: str
    routing_key: str
    size_bytes: int
    mandatory: bool = False
    persistent: bool = False
    confirm_window: int = 0
    rate: float = 0.0
    limit: int = 0
    priorities: int = 0  # > 0: messages carry priorities 0..priorities-1 in turn (priority queues)


def encode_publish(plan: PublishPlan, frame_max: int, channel: int = CHANNEL,
                   priority: int | None = None) -> tuple[bytes, bytes]:
    """The publish as (prefix, suffix): the 8 bytes between them are the body's first 8 bytes."""
    method = method_frame(channel, spec.Basic.Publish(exchange=plan.exchange, routing_key=plan.routing_key,
                                                      mandatory=plan.mandatory))
    props = spec.BasicProperties(delivery_mode=2 if plan.persistent else 1, priority=priority)
    parts = content_frames(channel, CLASS_BASIC, props.encode(), bytes(plan.size_bytes), frame_max)
    # parts: header frame (header, properties, end), then (body header, body, end) per body frame
    whole = method + b"".join(parts)
    ts_offset = len(method) + len(parts[0]) + len(parts[1]) + len(parts[2]) + len(parts[3])
    return whole[:ts_offset], whole[ts_offset + _TS.size :]


class ConfirmTracker:
    """Which publish sequence numbers (delivery tags, from 1) the broker has settled (ack or nack).

    Invariant: every tag below `low` is settled and `singles` holds exactly the settled tags above it
    (single acks that arrived out of order), so memory is bounded by the confirm window.
    """

    __slots__ = ("low", "singles")

    def __init__(self) -> None:
        self.low = 1
        self.singles: set[int] = set()

    def settle(self, tag: int, multiple: int | bool, published: int) -> int:
        """Settle `tag` (and all below it if multiple); return how many tags were newly settled.
        Tags never published, or already settled, count 0."""
        low = self.low
        singles = self.singles
        if tag < low or tag > published:
            return 0
        if multiple:
            count = tag - low + 1
            if singles:
                done = [t for t in singles if t <= tag]
                count -= len(done)
                singles.difference_update(done)
            self.low = tag + 1
            return count
        if tag in singles:
            return 0
        if tag == low:
            low += 1
            while low in singles:
                singles.remove(low)
                low += 1
            self.low = low
        else:
            singles.add(tag)
        return 1


class Producer(AmqpClient):
    """One connection, one channel, publishing `plan`. Counters are read by the worker every second."""

    def __init__(self, uri: AmqpUri, plan: PublishPlan, on_done: Callable[[], None] | None = None,
                 on_error: Callable[[AmqpClosed], None] | None = None) -> None:
        super().__init__(uri)
        self.plan = plan
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self.returned = 0
        self.done = False
        self.stopped = True
        self._on_done = on_done
        self._on_error = on_error
        self._window = plan.confirm_window
        self._limit = plan.limit
        self._rate = plan.rate
        self._confirms = ConfirmTracker()
        self._prefix = b""
        self._suffix = b""
        self._variants: list[tuple[bytes, bytes]] = []
        self._batch_max = 1
        self._pump_scheduled = False
        self._tokens = 0.0
        self._burst = 1.0
        self._tick_s = RATE_TICK_S
        self._last_refill = 0.0
        self._rate_timer: asyncio.TimerHandle | None = None

    async def setup(self) -> None:
        await self.open_channel(CHANNEL)
        self.fast_methods[spec.Basic.Return.INDEX] = self._on_return
        if self._window:
            self.fast_methods[spec.Basic.Ack.INDEX] = self._on_ack
            self.fast_methods[spec.Basic.Nack.INDEX] = self._on_nack
            await self.call(CHANNEL, spec.Confirm.Select(), spec.Confirm.SelectOk)
        self._prefix, self._suffix = encode_publish(self.plan, self.frame_max)
        # with priorities: one encoded publish per priority, sent in turn
        self._variants = [encode_publish(self.plan, self.frame_max, priority=p)
                          for p in range(self.plan.priorities)]
        message_bytes = len(self._prefix) + _TS.size + len(self._suffix)
        self._batch_max = max(1, min(MAX_BATCH_MESSAGES, BATCH_BYTES // message_bytes))

    def start(self) -> None:
        self.stopped = False
        if self._rate:
            self._tick_s = RATE_TICK_S if self._rate >= 1 / RATE_TICK_S else min(0.1, 1 / self._rate)
            self._burst = max(1.0, self._rate * self._tick_s * 2)
            self._tokens = 1.0
            self._last_refill = self.loop.time()
            self._rate_timer = self.loop.call_later(self._tick_s, self._refill)
        self._pump()

    def stop(self) -> None:
        self.stopped = True
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None

    @property
    def outstanding(self) -> int:
        return self.sent - self.confirmed - self.nacked

    # -- publishing ---------------------------------------------------------------------------------

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self.stopped or self.write_paused or self.transport is None or self.transport.is_closing():
            return
        n = self._batch_max
        if self._window:
            room = self._window - (self.sent - self.confirmed - self.nacked)
            if room < n:
                n = room
        if self._limit:
            left = self._limit - self.sent
            if left < n:
                n = left
        if self._rate:
            tokens = int(self._tokens)
            if tokens < n:
                n = tokens
        if n <= 0:
            return
        now = _clock(_MONOTONIC)
        if self._variants:
            ts = _TS.pack(now)
            variants = self._variants
            k = len(variants)
            self.transport.write(b"".join(b"".join((variants[i % k][0], ts, variants[i % k][1]))
                                          for i in range(self.sent, self.sent + n)))
        else:
            self.transport.write(b"".join([self._prefix, _TS.pack(now), self._suffix] * n))
        self.sent += n
        self.last_activity_ns = now
        if self._rate:
            self._tokens -= n
        if self._limit and self.sent >= self._limit:
            self._check_done()
        elif not self.write_paused:
            self._schedule_pump()

    def on_writable(self) -> None:
        self._schedule_pump()

    def _refill(self) -> None:
        now = self.loop.time()
        tokens = self._tokens + (now - self._last_refill) * self._rate
        self._tokens = tokens if tokens < self._burst else self._burst
        self._last_refill = now
        if self.stopped or (self._limit and self.sent >= self._limit):
            self._rate_timer = None
            return
        self._rate_timer = self.loop.call_later(self._tick_s, self._refill)
        self._pump()

    # -- confirms and returns -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        before = self.confirmed + self.nacked
        super().data_received(data)
        if self.confirmed + self.nacked != before:
            self.last_activity_ns = _clock(_MONOTONIC)
            if self._limit and self.sent >= self._limit:
                self._check_done()
            else:
                self._pump()

    def _on_ack(self, buf: bytes, start: int, end: int) -> None:
        tag, bits = _ACK.unpack_from(buf, start + 4)
        self.confirmed += self._confirms.settle(tag, bits & 1, self.sent)

    def _on_nack(self, buf: bytes, start: int, end: int) -> None:
        tag, bits = _ACK.unpack_from(buf, start + 4)
        self.nacked += self._confirms.settle(tag, bits & 1, self.sent)

    def _on_return(self, buf: bytes, start: int, end: int) -> None:
        self.returned += 1  # its header and body frames follow; the base class skips them

    def _check_done(self) -> None:
        if not self.done and (not self._window or self.outstanding == 0):
            self.done = True
            self.stop()
            if self._on_done is not None:
                self._on_done()

    def on_failure(self, exc: AmqpClosed) -> None:
        self.stop()
        if self._on_error is not None:
            self._on_error(exc)
