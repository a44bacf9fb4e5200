"""The loop's budget for work done in steps: one `TurnScheduler` per event loop, shared by every
connection on it (the stream protocol's and AMQP's).

Owns: how much of one loop turn the steps of all connections together may take (`budget_s`), and the
order in which connections that have steps left take them (round-robin, one step each at a time).

Why: a connection that decodes a large frame in steps (a stream `subscribe` of 45,000 properties, an
AMQP content header of a huge table) used to stop at its own `TURN_S` (10 ms) a turn and go on at the
next. That bounds one connection, not the loop: 64 such connections each spent their 10 ms in the same
turn, 640 ms before the loop served anyone else (1.3-3.5 s stalls measured, docs/security.md). Here the
steps of all connections share one budget a turn; past it a connection's rest waits, read-held, in a
queue served round-robin at the start of the next turn, so a publish or a heartbeat from any other
client waits about one budget at most, and one connection's many large frames cannot starve another's.

Rules:
- A turn's window opens at the first `deadline()` asked in it and closes at the next turn (a
  `call_soon`, which also serves the queue first thing in that turn, with a fresh window).
- A connection steps inline (no queue, no extra turn: the ordinary case of one large frame) only while
  no other waits and the window is not spent (`busy()` is False); a resumed one takes one step and
  waits again if another waits (`yield_now()`), so steps are dealt one per connection at a time.
- `wait(resume)` calls `resume` once in a later turn; the caller keeps its input held meanwhile, and
  `resume` of a connection closed meanwhile must do nothing.
- One scheduler per loop (`scheduler_of`): a registry keyed by the loop, so every connection of a loop,
  whoever built it (the listeners, the worker link's adopt, the shovels' in-process pipes, the tests'
  memory clocks), shares the same budget without the composition root threading it through.
- The steps taken in a served turn are the loop's input work as much as those taken inline in a socket's
  callback: they are counted in the node's `LoopLoad` (`timed`, given by the first connection of the
  node that asks, `scheduler_of`), which the saturation judgement (credit flow across workers) and
  compaction of load's busy share read. Uncounted, a loaded node's input, nearly all of it served
  here, looked idle (busy 0.003 at 56,000 msg/s a worker) and compaction packed it into one worker.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from hutch.runtime.session.ports import LoopClock

TURN_BUDGET_S = 0.01  # the steps of all connections together, per loop turn


class TurnScheduler:
    """One loop's budget of step work a turn and the queue of connections waiting for their next step.

    Invariant: `_turn` is scheduled (`_scheduled`) whenever the window is open or someone waits, so the
    window is closed and the queue served at the next turn."""

    def __init__(self, clock: LoopClock, budget_s: float = TURN_BUDGET_S) -> None:
        assert budget_s > 0
        self.clock = clock
        self.budget_s = budget_s
        self._deadline: float | None = None  # this turn's window (None: no step work in this turn yet)
        self._scheduled = False
        self._waiting: deque[Callable[[], None]] = deque()
        # counts a served turn as loop work (the node's `LoopLoad.timed`); None: not counted (a bare loop)
        self.timed: Callable[..., None] | None = None
        self.turns_served = 0  # turns in which the queue was served (a test reads it)

    def deadline(self) -> float:
        """The loop time at which this turn's step work must stop (the window opens at the first ask)."""
        if self._deadline is None:
            self._deadline = self.clock.time() + self.budget_s
            self._schedule()
        return self._deadline

    def spent(self) -> bool:
        return self.clock.time() >= self.deadline()

    def busy(self) -> bool:
        """Another connection waits, or the turn's budget is spent: a new step must wait its turn."""
        return bool(self._waiting) or self.spent()

    yield_now = busy  # after a step: give way to the next waiting connection (round-robin), or to the loop

    def waiting(self) -> int:
        return len(self._waiting)

    def wait(self, resume: Callable[[], None]) -> None:
        """Call `resume` in a later turn, after those waiting already (round-robin)."""
        self._waiting.append(resume)
        self._schedule()

    def run_steps(self, steps: Iterator[Any], resumed: bool) -> tuple[bool, Any]:
        """Take the steps of `steps` (a generator) as the budget allows: (True, its return value) when it
        is done; else (False, None) and the caller, its input held, `wait`s. A new one (not `resumed`)
        takes no step while `busy()`; a resumed one takes at least one, then goes on until `yield_now()`."""
        try:
            if not resumed and self.busy():
                return False, None
            while True:
                next(steps)
                if self.yield_now():
                    return False, None
        except StopIteration as done:
            return True, done.value

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.clock.call_soon(self._turn)

    def _turn(self) -> None:
        """A new turn: a fresh window, in which those waiting take their steps in order until it is spent
        (each resume takes at least one step, and waits again when it has more and others wait)."""
        self._scheduled = False
        self._deadline = None
        if not self._waiting:
            return
        if self.timed is not None:
            self.timed(self._serve)
        else:
            self._serve()

    def _serve(self) -> None:
        waiting = self._waiting
        self.turns_served += 1
        deadline = self.deadline()
        while waiting and self.clock.time() < deadline:  # (one who waits again goes to the back)
            waiting.popleft()()
        if waiting:
            self._schedule()


_SCHEDULERS: weakref.WeakKeyDictionary[LoopClock, TurnScheduler] = weakref.WeakKeyDictionary()


def scheduler_of(clock: LoopClock, timed: Callable[..., None] | None = None) -> TurnScheduler:
    """The one scheduler of `clock`'s loop (made at the first ask); `timed` (the node's
    `LoopLoad.timed`) counts its served turns as loop work, from the first ask that gives one."""
    found = _SCHEDULERS.get(clock)
    if found is None:
        found = _SCHEDULERS[clock] = TurnScheduler(clock)
    if found.timed is None and timed is not None:
        found.timed = timed
    return found
