"""Where a group commit's fdatasync runs: on the event loop's own thread, or handed to the executor.

Owns: `SyncPlacement`, the rule both group-commit drivers follow (the classic queues' `GroupCommit`,
runtime/queue_types/classic/persistence.py, and the Raft driver's WAL sync, runtime/clustering/
raft_driver.py), and the measure it is taken from (how long the last sync took).

Rules:
- A sync runs on the loop thread while the loop has time (`has_time`: the runtime's judgement, the
  node's loop load not saturated) **and** the last sync took under the driver's `inline_max_s` (a fast
  disk; `INLINE_SYNC_MAX_S` unless the driver says otherwise). A stream's log does not use this rule:
  its syncs run on a writer thread of its own (runtime/queue_types/stream/writer.py says why).
  Otherwise it runs in the default executor, so a saturated loop keeps working while the disk syncs and
  a slow disk never stalls every connection of the node.
- Why: handing a job to a thread and back costs two thread wake-ups; on the machines measured
  (docs/BENCHMARKS.md, "Issue 17: syncs on the loop") that cost more CPU than a fast fdatasync itself.
- The first sync, with nothing measured yet, goes to the executor; every sync, wherever it ran, updates
  the measure, so a disk that slows down moves syncs off the loop at the next job, and back once fast.
- The drivers run an inline sync last in its loop turn (after the callbacks the same input scheduled,
  such as the writes of deliveries), so the deliveries of a publish do not wait for its fdatasync.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hutch.core.credit_flow import LoopLoad

INLINE_SYNC_MAX_S = 0.001  # a sync that took longer than this goes to the executor next time

T = TypeVar("T")


class SyncPlacement:
    """One driver's placement of its syncs. `has_time` None: always the executor (a driver outside a node)."""

    __slots__ = ("has_time", "busy", "last_sync_s", "inline_syncs", "inline_max_s")

    def __init__(self, has_time: Callable[[], bool] | None = None, inline_max_s: float = INLINE_SYNC_MAX_S) -> None:
        self.has_time = has_time
        self.inline_max_s = inline_max_s  # a sync that took longer than this goes to the executor next time
        # told how long each sync on the loop took, when the driver's own loop work is not timed already
        # (the classic GroupCommit's; the Raft driver times its whole cycle): loop time spent syncing
        # counts towards saturation, so a loop busy with syncs hands them off
        self.busy: Callable[[float], None] | None = None
        self.last_sync_s = 1.0  # pessimistic until measured: the first sync goes to the executor
        self.inline_syncs = 0  # syncs run on the loop thread (tests, the benchmark)

    def follow_loop(self, load: LoopLoad, *, count_busy: bool) -> None:
        """Judge `has_time` by the node's loop load (not saturated); `count_busy`: report each sync on the
        loop to it as loop work (a driver whose loop work the load does not time already)."""
        self.has_time = lambda: not load.saturated()
        if count_busy:
            self.busy = lambda seconds: load.note_busy(seconds, load.clock())

    def inline(self) -> bool:
        """Run the next sync on the loop thread."""
        has_time = self.has_time
        return has_time is not None and self.last_sync_s < self.inline_max_s and has_time()

    def run_inline(self, fn: Callable[..., T], *args: object) -> T:
        """Run a sync on the loop thread: measured, counted, and reported to `busy`."""
        self.inline_syncs += 1
        try:
            return self.measure(fn, *args)
        finally:
            if self.busy is not None:
                self.busy(self.last_sync_s)

    def measure(self, fn: Callable[..., T], *args: object) -> T:
        """Run a sync (on any thread) and keep its duration, also when it fails."""
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.last_sync_s = time.perf_counter() - started
