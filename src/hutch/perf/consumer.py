"""The consuming hot path: deliveries parsed in place, latencies histogrammed, acks batched.

Owns: `Consumer`, `ConsumePlan` and `ack_frame_parts`.

Per read (`data_received`): take the clock once (every message in the read arrived with it), walk the
frames; a Basic.Deliver gives the delivery tag (read at its offset, no method object), the header frame
the body size, the first body frame the 8-byte send timestamp. Latencies of the read are collected in a
list bounded by the read and recorded into the histogram in one call; acks made during the read are
written with one `write` at its end.

Acks: with `ack_every` N > 1, one Basic.Ack(multiple=true) per N messages; with N = 1, one plain ack
per message (still one write per read). On `stop()` the messages received since the last ack are acked
with one multiple ack. Auto-ack consumers send nothing.

Limit (`-D`): the `limit`-th delivery is the last one counted: it is acked at once (after the acks of
its read, in order), the consumer is cancelled (Basic.Cancel nowait, same write) and is done. Deliveries
after it (already prefetched, or in flight before the cancel) are neither counted nor acked: a
Basic.Nack(multiple, requeue) at the end of each read gives them back, so other consumers get them.

Invariant: `_remaining` is the number of body bytes still due for the delivery in progress (0 between
deliveries); `_unacked` counts deliveries received since the last ack (< ack_every).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from hutch.amqp import spec
from hutch.amqp.frames import method_frame

from .histogram import LatencyHistogram
from .options import AmqpUri
from .protocol import AmqpClient, AmqpClosed

CHANNEL = 1
TIMESTAMP_BYTES = 8
_Q = struct.Struct(">Q")
_clock = time.clock_gettime_ns
_MONOTONIC = time.CLOCK_MONOTONIC


@dataclass(frozen=True)
class ConsumePlan:
    queue: str
    qos: int = 0
    autoack: bool = False
    multi_ack_every: int = 0  # 0 or 1: ack each message
    limit: int = 0  # deliveries to receive, then done (0: unlimited)
    consume_at_start: bool = False  # Basic.Consume at the start instant, not in setup (a drain run)

    @property
    def ack_every(self) -> int:
        """0 for auto-ack, else the number of deliveries per ack."""
        return 0 if self.autoack else max(1, self.multi_ack_every)


def ack_frame_parts(multiple: bool, channel: int = CHANNEL) -> tuple[bytes, bytes]:
    """Basic.Ack encoded once by the codec, split around its 8-byte delivery tag."""
    frame = method_frame(channel, spec.Basic.Ack(delivery_tag=0, multiple=multiple))
    tag_at = 7 + 4  # frame header, class id + method id
    return frame[:tag_at], frame[tag_at + _Q.size :]


class Consumer(AmqpClient):
    """One connection, one channel, one consumer on `plan.queue`."""

    def __init__(self, uri: AmqpUri, plan: ConsumePlan, histogram: LatencyHistogram,
                 on_error: Callable[[AmqpClosed], None] | None = None,
                 on_done: Callable[[], None] | None = None) -> None:
        super().__init__(uri)
        self.plan = plan
        self.histogram = histogram
        self.received = 0
        # the run's start instant (CLOCK_MONOTONIC ns, set by the worker) and the deliveries that arrived
        # before it (a backlog): not counted in the run, whenever the worker's start-instant timer runs
        self.start_ns = 0
        self.received_before_start = 0
        self.consumer_tag = ""
        self.stopped = False
        self.done = False
        self._limit = plan.limit
        self._on_error = on_error
        self._on_done = on_done
        self._ack_every = plan.ack_every
        self._ack_prefix, self._ack_suffix = ack_frame_parts(self._ack_every > 1)
        self._multi_prefix, self._multi_suffix = ack_frame_parts(True)
        self._now = 0
        self._tag = 0
        self._requeue_tag = 0  # highest delivery tag past the limit, to give back at the end of the read
        self._last_acked = 0
        self._body_size = 0
        self._remaining = 0
        self._unacked = 0
        self._latencies: list[int] = []
        self._out: list[bytes] = []

    async def setup(self) -> None:
        await self.open_channel(CHANNEL)
        if self.plan.qos:
            await self.call(CHANNEL, spec.Basic.Qos(prefetch_count=self.plan.qos), spec.Basic.QosOk)
        if not self.plan.consume_at_start:
            await self.consume()

    async def consume(self) -> None:
        # registered before Consume: deliveries may follow ConsumeOk in the same read
        self.fast_methods[spec.Basic.Deliver.INDEX] = self._on_deliver
        # with a limit the tag is chosen here: the limit may be reached in the read that brings ConsumeOk
        tag = f"hutch-perf-{os.getpid()}-{id(self):x}" if self._limit else ""
        self.consumer_tag = tag
        ok = await self.call(CHANNEL, spec.Basic.Consume(queue=self.plan.queue, consumer_tag=tag,
                                                         no_ack=self.plan.autoack),
                             spec.Basic.ConsumeOk)
        self.consumer_tag = ok.consumer_tag

    def data_received(self, data: bytes) -> None:
        self._now = now = _clock(_MONOTONIC)
        received = self.received
        super().data_received(data)
        if self.received != received:
            self.last_activity_ns = now
            if self._latencies:
                self.histogram.record_many(self._latencies)
                self._latencies.clear()
        if self._requeue_tag:
            if not self.plan.autoack:
                self._out.append(method_frame(CHANNEL, spec.Basic.Nack(delivery_tag=self._requeue_tag,
                                                                       multiple=True, requeue=True)))
            self._requeue_tag = 0
        if self._out and self.transport is not None:
            self.transport.write(b"".join(self._out))
            self._out.clear()

    def _on_deliver(self, buf: bytes, start: int, end: int) -> None:
        # payload: class, method (4), consumer tag (shortstr), delivery tag (8), ...
        self._tag = _Q.unpack_from(buf, start + 5 + buf[start + 4])[0]

    def on_header(self, buf: bytes, start: int, end: int) -> None:
        # payload: class (2), weight (2), body size (8), properties
        size = _Q.unpack_from(buf, start + 4)[0]
        self._body_size = self._remaining = size
        if not size:
            self._delivered()

    def on_body(self, buf: bytes, start: int, end: int) -> None:
        remaining = self._remaining
        if remaining == self._body_size and end - start >= TIMESTAMP_BYTES and not self.done \
                and self._now >= self.start_ns:
            latency = self._now - _Q.unpack_from(buf, start)[0]
            self._latencies.append(latency if latency > 0 else 0)
        remaining -= end - start
        self._remaining = remaining
        if remaining <= 0:
            self._remaining = 0
            self._delivered()

    def _delivered(self) -> None:
        if self.done:  # past the limit: not counted, given back at the end of the read
            self._requeue_tag = self._tag
            return
        self.received += 1
        if self._now < self.start_ns:
            self.received_before_start += 1
        if self._ack_every:
            self._unacked += 1
            if self._unacked >= self._ack_every:
                self._out.append(self._ack_prefix + _Q.pack(self._tag) + self._ack_suffix)
                self._last_acked = self._tag
                self._unacked = 0
        if self._limit and self.received >= self._limit:
            self._reach_limit()

    def _reach_limit(self) -> None:
        self.done = True
        if self._unacked:  # queued behind this read's earlier acks: a multiple ack never precedes them
            self._out.append(self._multi_prefix + _Q.pack(self._tag) + self._multi_suffix)
            self._last_acked = self._tag
            self._unacked = 0
        self._out.append(method_frame(CHANNEL, spec.Basic.Cancel(consumer_tag=self.consumer_tag, nowait=True)))
        if self._on_done is not None:
            self._on_done()

    def stop(self) -> None:
        """Stop counting; ack what was received since the last ack."""
        self.stopped = True
        if self._unacked and self.transport is not None and not self.transport.is_closing():
            self.transport.write(self._multi_prefix + _Q.pack(self._tag) + self._multi_suffix)
            self._last_acked = self._tag
            self._unacked = 0

    def on_other_method(self, channel: int, method: spec.Method) -> None:
        if isinstance(method, spec.Basic.Cancel):
            self.fail(AmqpClosed(f"consumer {method.consumer_tag} cancelled by the server "
                                 "(queue deleted?)"))

    def on_failure(self, exc: AmqpClosed) -> None:
        if self._on_error is not None:
            self._on_error(exc)
