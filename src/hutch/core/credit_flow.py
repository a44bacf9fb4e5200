"""Credit flow's rule for one event loop: when does a queue's backlog hold its publishers back?

Owns: the judgements the flow rules of the queue types are made of (classic: queues/classic/queue.py,
quorum: runtime/queue_types/quorum/queue.py, both `needs_flow_control`), as pure state with time passed in:

- **Consumer pace** (fields on `Consumer` or a `Pace`, functions below). A consumer *keeps pace* when, after it
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

- **The backlog rule** (`backlog_holds`, `FLOW_HIGH` / `FLOW_LOW`): publishers are held while a queue's
  ready backlog is over a limit, the loop is saturated and a consumer keeps pace; they are held from
  `FLOW_HIGH` on and let go at `FLOW_LOW` (hysteresis, so a held connection is not released and held
  again at every message). The classic queue adds its own links (a consumer's full socket, the store).
- **Pace by consumer key** (`Pace`, `QueuePace`). A queue type whose consumers are served by a replicated
  machine (a quorum queue: its leader hands messages to consumers on any node, and gets their
  settlements back as applied commands) judges pace where the machine runs, not at the channel: it keeps
  one `Pace` per consumer key, fed with what the machine did (`delivered`, `settled`, `enqueued`), and
  the same `consumer_filled` / `consumer_settled` / `keeps_pace` judgement applies to it as to a
  channel's `Consumer`. A stream queue's consumers (credit-based too) would be fed the same way.

Invariants: `pace_start_ms` is -1 exactly when no fill is being timed; `LoopLoad.busy_s` never exceeds
the time elapsed since its window started plus the last input's duration (input is counted once);
`QueuePace.acked` is the sum of the acks it was told of (never negative), and its `by_key` holds only
consumers with a prefetch limit (the others are never judged).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

KEEP_UP_MS = 200  # a full consumer settling half its prefetch within this keeps pace with the node
WINDOW_S = 0.1  # loop load is judged over windows this long
SATURATED = 0.5  # the loop is saturated while handling input takes at least this share of a window
STALE_WINDOWS = 3  # no input for this many windows: the loop is idle, whatever the last window said
FLOW_HIGH = 1000  # ready messages behind a consumer that keeps pace on a saturated loop: publishers held
FLOW_LOW = 500  # held publishers read again at or below this


class Paced(Protocol):
    """What the pace judgement reads and writes: a channel's `Consumer` (core/queue_type.py) or a `Pace`."""

    prefetch: int
    unacked: int
    delivered: int
    pace_start_ms: int
    pace_delivered: int
    pace_published: int
    pace_queue_settled: int
    keeping_up: bool


def consumer_filled(consumer: Paced, now_ms: int, published: int, acked: int) -> None:
    """The consumer has just reached its prefetch: start timing how soon it gives half of it back.
    `published` / `acked`: its queue's message counters now."""
    if consumer.pace_start_ms < 0:
        consumer.pace_start_ms = now_ms
        consumer.pace_delivered = consumer.delivered
        consumer.pace_published = published
        consumer.pace_queue_settled = acked


def consumer_settled(consumer: Paced, now_ms: int, published: int, acked: int) -> None:
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


def keeps_pace(consumer: Paced, now_ms: int) -> bool:
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

    `clock` is a monotonic clock in seconds (the node's `Clock.monotonic`, a test's fake).
    `saturated_peers`: the other worker processes of this node whose loops say they are saturated
    (runtime/queue_types/remote_stats.py tells them): a node of workers is one node, so a message's path
    through a saturated worker (its publisher's, its queue's or its consumer's) is held back as the one
    loop of a one-process node would be. `own_saturated` is this loop's judgement alone. `on_saturated`,
    when set, is called as a window closes saturated after one that was not (the only way this loop
    becomes saturated), so a worker tells the others at once and runs no timer while its loop is not."""

    __slots__ = ("clock", "window_start", "busy_s", "busy_total_s", "saturated_flag", "saturated_peers",
                 "on_saturated")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.window_start = clock()
        self.busy_s = 0.0
        self.busy_total_s = 0.0  # every input's duration since the start (compaction of load's busy share)
        self.saturated_flag = False
        self.saturated_peers: set[str] = set()
        self.on_saturated: Callable[[], None] | None = None

    def timed(self, fn: Callable[..., None], *args: object) -> None:
        """Run `fn(*args)` and count its duration as loop work (the AMQP input, the Raft driver's cycles,
        other nodes' input)."""
        started = self.clock()
        fn(*args)
        ended = self.clock()
        self.note_busy(ended - started, ended)

    def note_busy(self, seconds: float, now: float) -> None:
        """`seconds` of input handling just ended at `now`."""
        self.busy_s += seconds
        self.busy_total_s += seconds
        elapsed = now - self.window_start
        if elapsed >= WINDOW_S:
            was = self.saturated_flag
            self.saturated_flag = saturated = self.busy_s >= SATURATED * elapsed
            self.window_start = now
            self.busy_s = 0.0
            if saturated and not was and self.on_saturated is not None:
                self.on_saturated()

    def saturated(self) -> bool:
        """This loop is saturated (`own_saturated`), or another worker of the node says its loop is."""
        return self.own_saturated() or bool(self.saturated_peers)

    def own_saturated(self) -> bool:
        """The last full window was saturated, and input has been handled since (an idle loop reports
        nothing, so a window that never closes means idle)."""
        if not self.saturated_flag:
            return False
        if self.clock() - self.window_start > STALE_WINDOWS * WINDOW_S:
            self.saturated_flag = False
        return self.saturated_flag


IDLE_LOOP = LoopLoad(lambda: 0.0)  # never saturated: the classic queue's default outside a node


def backlog_holds(backlog: int, limit: int, loop: LoopLoad, pace: QueuePace, clock_ms: Callable[[], int]) -> bool:
    """The backlog rule: more than `limit` ready messages, on a saturated loop, behind a consumer that
    keeps pace. `limit` is FLOW_HIGH to start holding publishers, FLOW_LOW to keep holding them. The
    cheap tests come first: the clock is read only when the backlog and the loop call for the pace."""
    return backlog > limit and loop.saturated() and pace.keeps_pace(clock_ms())


class Pace:
    """One consumer's pace, kept where its queue's machine runs (see the module docstring). `unacked` is
    what the machine holds checked out to it, `delivered` what it was handed since the record began."""

    __slots__ = ("prefetch", "unacked", "delivered", "pace_start_ms", "pace_delivered", "pace_published",
                 "pace_queue_settled", "keeping_up")

    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.unacked = 0
        self.delivered = 0
        self.pace_start_ms = -1
        self.pace_delivered = self.pace_published = self.pace_queue_settled = 0
        self.keeping_up = False


class QueuePace:
    """The pace of one queue's consumers, by consumer key, fed with what the queue's machine did.

    `published` and `acked` are the queue's counters the judgement compares (messages enqueued, and
    settled by an ack). Only consumers with a prefetch limit are recorded: one without is never full,
    so never judged (as for a channel's consumer)."""

    __slots__ = ("published", "acked", "by_key")

    def __init__(self) -> None:
        self.published = 0
        self.acked = 0
        self.by_key: dict[Hashable, Pace] = {}

    def enqueued(self, n: int) -> None:
        self.published += n

    def delivered(self, key: Hashable, n: int, unacked: int, prefetch: int, now_ms: int) -> None:
        """`n` messages were handed to consumer `key`, which now holds `unacked` of its `prefetch`
        (0: no limit). At its limit, the timing of its next settlements starts."""
        if prefetch <= 0:
            return
        pace = self.by_key.get(key)
        if pace is None:
            pace = self.by_key[key] = Pace(prefetch)
        pace.prefetch = prefetch
        pace.delivered += n
        pace.unacked = unacked
        if unacked >= prefetch:
            consumer_filled(pace, now_ms, self.published, self.acked)

    def settled(self, key: Hashable, acked: int, unacked: int, now_ms: int) -> None:
        """Consumer `key` settled some messages (`acked` of them by an ack; the others were returned or
        discarded) and now holds `unacked`: judge it; if it is still at its limit (refilled at once),
        time the next round from now."""
        assert acked >= 0, acked
        self.acked += acked
        pace = self.by_key.get(key)
        if pace is None:
            return
        pace.unacked = unacked
        consumer_settled(pace, now_ms, self.published, self.acked)
        if unacked >= pace.prefetch:
            consumer_filled(pace, now_ms, self.published, self.acked)

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Forget the consumers not among `keys` (cancelled, or gone with their channel or node)."""
        live = set(keys)
        for key in [k for k in self.by_key if k not in live]:
            del self.by_key[key]

    def keeps_pace(self, now_ms: int) -> bool:
        """Some consumer keeps pace (`keeps_pace`); O(consumers)."""
        return any(keeps_pace(p, now_ms) for p in self.by_key.values())
