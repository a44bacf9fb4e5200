"""Credit flow's rule for one event loop: when does a queue's backlog hold its publishers back?

Owns: the two judgements the classic queue's flow rule (queues/classic/queue.py, `needs_flow_control`)
is made of, as pure state with time passed in:

- **Consumer pace** (fields on `Consumer`, functions below). A consumer *keeps pace* when, after it
  filled its prefetch, it settled at least half a prefetch's worth within `KEEP_UP_MS`, and meanwhile
  its queue's consumers acked at least half as many messages as were published to it: what the
  consumer is given it returns at once, and the queue's consumers are in a close race with its
  publishers, so the rate they get is set by how fast the node hands messages on, and every message a
  publisher adds to the backlog only adds latency. A consumer that sits on a full prefetch (acks lagging), or whose queue's consumers take
  less than half of what arrives (a prefetch-1 consumer behind a fast publisher), does not keep pace:
  it is truly slower than the publishers, and its queue may grow, as in RabbitMQ. A consumer with no
  prefetch limit is never full and never judged. The judgement is O(1) per fill and per settle call
  (not per message): it compares counters with those at the fill.
- **Loop load** (`LoopLoad`). RabbitMQ's credit flow holds a publisher back only when a process
  downstream (the queue) is busy: an idle queue process grants credit at once. Here every queue shares
  one event loop, so "busy" is the loop's: `LoopLoad` adds up the time the loop spends handling input
  over windows of `WINDOW_S` and calls the loop *saturated* while that is at least `SATURATED` of the
  window. With spare time on the loop, a backlog means the consumers are slower than the publishers,
  and nothing is held back.

Invariants: `pace_start_ms` is -1 exactly when no fill is being timed; `LoopLoad.busy_s` never exceeds
the time elapsed since its window started plus the last input's duration (input is counted once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue_type import Consumer

KEEP_UP_MS = 200  # a full consumer settling half its prefetch within this keeps pace with the node
WINDOW_S = 0.1  # loop load is judged over windows this long
SATURATED = 0.5  # the loop is saturated while handling input takes at least this share of a window
STALE_WINDOWS = 3  # no input for this many windows: the loop is idle, whatever the last window said


def consumer_filled(consumer: Consumer, now_ms: int, published: int, acked: int) -> None:
    """The consumer has just reached its prefetch: start timing how soon it gives half of it back.
    `published` / `acked`: its queue's message counters now."""
    if consumer.pace_start_ms < 0:
        consumer.pace_start_ms = now_ms
        consumer.pace_delivered = consumer.delivered
        consumer.pace_published = published
        consumer.pace_queue_settled = acked


def consumer_settled(consumer: Consumer, now_ms: int, published: int, acked: int) -> None:
    """The consumer's channel settled some of its deliveries: once half a prefetch's worth has come back
    since it filled up, judge its pace (`published` / `acked`: its queue's counters now)."""
    start = consumer.pace_start_ms
    if start < 0:
        return
    prefetch = consumer.prefetch
    # settled since the fill = delivered since the fill + unacked at the fill (the prefetch) - unacked now
    settled = consumer.delivered - consumer.pace_delivered + prefetch - consumer.unacked
    if settled * 2 >= prefetch:
        # prompt, and the queue's consumers acked at least half as many as its publishers sent meanwhile
        consumer.keeping_up = (now_ms - start <= KEEP_UP_MS and
                               2 * (acked - consumer.pace_queue_settled) >= published - consumer.pace_published)
        consumer.pace_start_ms = -1


def keeps_pace(consumer: Consumer, now_ms: int) -> bool:
    """Judged keeping pace, and not sitting on a full prefetch for longer than `KEEP_UP_MS` since."""
    if not consumer.keeping_up:
        return False
    start = consumer.pace_start_ms
    if start >= 0 and now_ms - start > KEEP_UP_MS:
        consumer.keeping_up = False  # it stopped giving messages back: truly slower now
        return False
    return True


class LoopLoad:
    """How busy the event loop is with input, from the durations the runtime reports (`note_busy`).

    `clock` is a monotonic clock in seconds (the node's `Clock.monotonic`, a test's fake)."""

    __slots__ = ("clock", "window_start", "busy_s", "saturated_flag")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.window_start = clock()
        self.busy_s = 0.0
        self.saturated_flag = False

    def note_busy(self, seconds: float, now: float) -> None:
        """`seconds` of input handling just ended at `now`."""
        self.busy_s += seconds
        elapsed = now - self.window_start
        if elapsed >= WINDOW_S:
            self.saturated_flag = self.busy_s >= SATURATED * elapsed
            self.window_start = now
            self.busy_s = 0.0

    def saturated(self) -> bool:
        """The last full window was saturated, and input has been handled since (an idle loop reports
        nothing, so a window that never closes means idle)."""
        if not self.saturated_flag:
            return False
        if self.clock() - self.window_start > STALE_WINDOWS * WINDOW_S:
            self.saturated_flag = False
        return self.saturated_flag


IDLE_LOOP = LoopLoad(lambda: 0.0)  # never saturated: the classic queue's default outside a node
