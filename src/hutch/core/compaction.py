"""Compaction of load over a node's workers: when to move an island of work from one worker to another.

Owns: `Compactor`, the pure controller of Erlang's `+scl` ("scheduler compaction of load") for a node of
workers (docs/scaling.md, "Compaction of load"). Each worker reports its busy share (`WorkerLoad`:
the share of a core it took over the report window, measured by `LoadMeter`s: the larger of its
process's CPU share and its loop's wall-clock input share, runtime/compaction.py) and its **islands**
(`Island`: a queue and the connections of its home worker that use only that queue, with their message
rate and whether they can move now). A worker is **hot** while its busy
share over its report window (a second) is at least `hot` (`HOT`, 0.85 of a core; not credit flow's
saturation flag, which judges the last 100 ms window alone). The controller answers at most one `Move`
at a time:

- **Pack** while the whole node is far below its capacity (the workers' busy shares add up to less than
  `pack_below` of a core for `pack_hold_s` in a row, so no worker is hot) and really moving messages (at
  least `min_rate` msg/s, so an idle node or a test node never moves anything): move an island of the
  least busy worker with islands to the busiest other worker that holds islands (never into an empty
  one), only when every island of that source can move and all of them together would leave the target
  at most `target_max` (below `hot`), so the source ends empty and sleeps. A pack under way
  (`packing`) moves the source's next island as soon as the last one is done, without the settling
  pause, until the source is empty (or an island of it is no longer free). Fewer loops then take the
  same input: fewer sleeps per message, the cost the measurements put on splitting (docs/scaling.md,
  "What the rest is").
- **Spread** when a worker has been hot for `spread_hold_s` while moving at least `min_rate` msg/s (a loop
  busy with anything else gains nothing from a move), holds two islands or more (a worker with one
  keeps it: moving it would only move the load), and another worker has not been hot for as long (the
  reports of two workers are up to a report apart: as a load starts or ends, one worker's report may
  say so a second before the other's): to the least busy of those, move the movable island of the hot
  worker whose estimated cost `c` is nearest half the difference of their busy shares, among those that
  **strictly narrow it**: `c > 0` and
  `target + c <= source - c` (the target ends no busier than the source keeps; `<=`, so that two equal
  islands of a hot worker next to an idle one split). The target may end above half a core when the
  source is at full speed (39 % and 97 % of a core share better as 63 % and 73 %); what the rule keeps
  is that the busier of the two stays the source, so no spread undoes another.

Hysteresis, so it never flaps, under a load that holds (the estimate right):
- a spread never undoes a spread: a move from s to t (busy shares, c > 0, t + c <= s - c) leaves t no
  busier than s, so a move back (t + c + c' <= s - c - c', c' > 0) cannot qualify; and every spread
  strictly shrinks the difference between the two workers it touches (|(s - c) - (t + c)| = s - t - 2c
  < s - t); over any number of workers the sum of the squared busy shares falls by 2c(s - t - c) >= 2c²
  at each spread, so a node's spreads end;
- a pack never leaves a hot worker: its target ends at most `target_max` < `hot` (an estimate: the
  islands' costs as measured on two loops, which after the pack share one loop's sleeps, so the target
  ends lower still), so no spread follows a pack until the load grows by a factor of
  `hot / target_max` (1.13 by the estimate; 1.4 or more as measured, below) or more;
- a spread is never undone by a pack: a spread needs a hot worker, so the node's summed busy share is at
  least `hot`, at least `pack_below`, and a move does not change the sum;
- every move starts a pause of `settle_s` (the reports must show the move before the next is judged);
  an island that moved stays where it went for `pin_s`, doubled at each of its moves up to `pin_max_s`
  (an estimate that misleads the controller makes it move an island back and forth at most
  log2(t / pin_s) times in t seconds); an island whose move failed (it could not get quiet, or its
  target did not commit) is not tried again for `retry_s`, doubled at each failure in a row up to
  `pin_max_s` (a busy island is not held again and again at every report); and at most one move is in
  flight (`move_done` ends it, whether it succeeded or not).

The thresholds (`hot` 0.85, `pack_below` 0.8, `target_max` 0.75) are measured (docs/BENCHMARKS.md,
"Goals (a) and (b) and the single queue on session 21's compaction marks"): the estimate of a pack's
target is the node's summed busy share. On this VM 20,000 msg/s over 8 queues takes one process
0.48-0.61 of a core and a spread node's two workers 0.59-0.74 summed: it packs (12 runs of 12, both load
generators), and the packed worker runs at 0.53-0.59, a third below the hot mark, with one process's
latency and 1.03 times its CPU per message. Session 20's marks (0.75, 0.7, 0.65) left the spread node
summing 0.74 unpacked in 1 run of 6 (1.195 times the CPU); its first cut (hot at half a core, as credit
flow's saturation, `target_max` 0.45) packed 8,000 msg/s but not 20,000. A packed worker is not a
saturated one: credit flow's own mark (`SATURATED`, 0.5 of each 100 ms window) still paces its publishers
when a burst fills the loop, as in a node of one process.

An island's cost is estimated from its worker's (`island_costs`): the worker's busy share times the
island's share of the worker's messages (per-message cost is about the same for every island of one
shape; the estimate is refreshed by every report).

Rules: pure (time is passed in, seconds, monotonic); O(workers + islands) per observation; no IO.
Invariants: `in_flight` is None or the one move answered and not yet done; `pinned_until` only grows
per island; a `Move`'s island was movable
and in its `source` when answered, and `source != target`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

HOT = 0.85  # a worker is hot at this busy share over its report window (a spread's trigger)
PACK_BELOW = 0.8  # a node packs while its workers' busy shares sum to less than this (<= HOT)
TARGET_MAX = 0.75  # a pack's target ends at most this busy, as estimated (< HOT)


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's report: `busy` is the share of a core its loop spent handling input over the last
    report window (0..1), `saturated` what its `LoopLoad` says (the last 100 ms window: logged, not judged;
the controller judges by `busy`), `msgs_per_s` every message it handled."""

    worker: int
    busy: float
    saturated: bool
    msgs_per_s: float


@dataclass
class LoadMeter:
    """A worker's `WorkerLoad` from a cumulative busy time sampled at each report (the host gives its
    process's CPU time; `LoopLoad.busy_total_s` counts the same way): the busy share is the busy time
    added since the last sample over the time elapsed (0 at the first sample), at most 1."""

    worker: int
    last: tuple[float, float] | None = None  # (time, cumulative busy seconds) at the last sample

    def sample(self, now: float, busy_total_s: float, saturated: bool, msgs_per_s: float) -> WorkerLoad:
        last, self.last = self.last, (now, busy_total_s)
        busy = 0.0
        if last is not None and now > last[0]:
            busy = min(1.0, max(0.0, (busy_total_s - last[1]) / (now - last[0])))
        return WorkerLoad(self.worker, busy, saturated, msgs_per_s)


@dataclass(frozen=True)
class Island:
    """A queue and the connections of its home worker that use only it (`name` is the queue's
    vhost-qualified name). `movable` is False for whatever the move does not carry (docs/scaling.md)."""

    name: str
    worker: int
    msgs_per_s: float
    movable: bool


@dataclass(frozen=True)
class Move:
    island: str
    source: int
    target: int
    reason: str  # "pack" or "spread"


@dataclass
class Compactor:
    hot: float = HOT  # a worker is hot while its busy share is at least this
    pack_below: float = PACK_BELOW  # the node's summed busy share under which it packs (of one core; <= hot)
    pack_hold_s: float = 3.0  # ... held this long (three reports)
    min_rate: float = 2000.0  # msg/s the node must move for any pack (an idle or test node never packs)
    target_max: float = TARGET_MAX  # a pack's target stays at or below this busy share (< hot)
    spread_hold_s: float = 2.0  # a worker hot (busy >= hot) this long spreads, to one not hot this long
    settle_s: float = 3.0  # no move judged for this long after one ends
    pin_s: float = 30.0  # an island that moved is not moved again for this long, doubled at each move
    pin_max_s: float = 3600.0  # ... up to this
    retry_s: float = 10.0  # an island whose move failed is not tried again for this long, doubled per failure in a row
    in_flight: Move | None = None
    low_since: float | None = None
    # worker -> (hot: its busy share >= `hot`, since when it has been so)
    level_since: dict[int, tuple[bool, float]] = field(default_factory=dict)
    last_move_end: float | None = None
    pinned_until: dict[str, float] = field(default_factory=dict)
    moves_of: dict[str, int] = field(default_factory=dict)
    failures_of: dict[str, int] = field(default_factory=dict)  # an island's failed moves since its last move
    packing: tuple[int, int] | None = None  # (source, target) of a pack under way: its next island follows at once

    def __post_init__(self) -> None:
        assert 0 < self.target_max < self.hot, "a pack's target must stay below the hot mark"
        assert self.pack_below <= self.hot, "a node with a hot worker must never pack"

    def observe(self, now: float, loads: Sequence[WorkerLoad], islands: Sequence[Island]) -> Move | None:
        """The reports of every running worker at `now`: the move to make, or None. A move answered is in
        flight until `move_done`; meanwhile nothing else is answered."""
        node_busy = sum(w.busy for w in loads)
        node_rate = sum(w.msgs_per_s for w in loads)
        any_hot = any(w.busy >= self.hot for w in loads)
        if node_busy < self.pack_below and node_rate >= self.min_rate and not any_hot:
            if self.low_since is None:
                self.low_since = now
        else:
            self.low_since = None
        for w in loads:
            hot = w.busy >= self.hot
            was = self.level_since.get(w.worker)
            if was is None or was[0] != hot:
                self.level_since[w.worker] = (hot, now)
        if self.in_flight is not None or len(loads) < 2:
            return None
        free = [i for i in islands if i.movable and now >= self.pinned_until.get(i.name, now)]
        if self.packing is not None:  # a pack empties its source: its next island goes without a pause
            source, target = self.packing
            rest = [i for i in free if i.worker == source]
            if rest and not any_hot and any(w.worker == target for w in loads):
                island = max(rest, key=lambda i: (i.msgs_per_s, i.name))
                self.in_flight = Move(island.name, source, target, "pack")
                return self.in_flight
            self.packing = None
        if self.last_move_end is not None and now - self.last_move_end < self.settle_s:
            return None
        costs = island_costs(loads, islands)
        move = self._spread(now, loads, islands, free, costs)
        if move is None and self.low_since is not None and now - self.low_since >= self.pack_hold_s:
            move = self._pack(loads, islands, free, costs)
        if move is not None:
            assert move.source != move.target, move
            self.in_flight = move
            if move.reason == "pack":
                self.packing = (move.source, move.target)
        return move

    def move_done(self, now: float, moved: bool) -> None:
        """The move in flight ended (`moved`: the island is in its target now; else it stayed)."""
        move = self.in_flight
        assert move is not None, "no move in flight"
        self.in_flight = None
        self.last_move_end = now
        self.low_since = None  # the figures before the move no longer say anything
        self.level_since.clear()
        if not moved:
            self.packing = None
            k = self.failures_of[move.island] = self.failures_of.get(move.island, 0) + 1
            wait = min(self.pin_max_s, self.retry_s * 2 ** min(k - 1, 32))
        else:
            self.failures_of.pop(move.island, None)
            n = self.moves_of[move.island] = self.moves_of.get(move.island, 0) + 1
            wait = min(self.pin_max_s, self.pin_s * 2 ** min(n - 1, 32))
        self.pinned_until[move.island] = max(self.pinned_until.get(move.island, now), now + wait)

    def _pack(self, loads: Sequence[WorkerLoad], islands: Sequence[Island], free: list[Island],
              costs: dict[str, float]) -> Move | None:
        held: dict[int, list[Island]] = {}
        for i in islands:
            held.setdefault(i.worker, []).append(i)
        sources = sorted((w for w in loads if held.get(w.worker)), key=lambda w: (w.busy, -w.worker))
        free_names = {i.name for i in free}
        for source in sources:
            mine = held[source.worker]
            if not all(i.name in free_names for i in mine):
                continue  # it could not be emptied: packing part of it saves no sleep
            # the target holds islands (an empty worker is what packing makes) and is at least as busy
            others = [w for w in loads if w.worker != source.worker and w.busy < self.hot and held.get(w.worker)
                      and (w.busy, -w.worker) >= (source.busy, -source.worker)]
            if not others:
                continue
            target = max(others, key=lambda w: (w.busy, -w.worker))
            cost = sum(costs[i.name] for i in mine)
            if target.busy + cost > self.target_max:
                continue
            island = max(mine, key=lambda i: (i.msgs_per_s, i.name))
            return Move(island.name, source.worker, target.worker, "pack")
        return None

    def _held(self, worker: int, hot: bool, now: float) -> bool:
        """`worker` has been hot (or, `hot` False, not hot) for at least `spread_hold_s` at `now`."""
        was = self.level_since.get(worker)
        return was is not None and was[0] == hot and now - was[1] >= self.spread_hold_s

    def _spread(self, now: float, loads: Sequence[WorkerLoad], islands: Sequence[Island], free: list[Island],
                costs: dict[str, float]) -> Move | None:
        # (a target cool for the hold too: the reports of two workers are up to a report apart, so as a load
        # ends, a source's last hot report may meet a target's first cool one)
        cool = [w for w in loads if self._held(w.worker, False, now)]
        if not cool:
            return None
        target = min(cool, key=lambda w: (w.busy, w.worker))
        for source in sorted(loads, key=lambda w: (-w.busy, w.worker)):
            if not self._held(source.worker, True, now) or source.msgs_per_s < self.min_rate:
                continue  # (a loop hot with anything but messages gains nothing from a move)
            if sum(1 for i in islands if i.worker == source.worker) < 2:
                continue
            # only a move that strictly narrows the difference: the target ends no busier than the source
            fits = [i for i in free if i.worker == source.worker and costs[i.name] > 0
                    and target.busy + costs[i.name] <= source.busy - costs[i.name]]
            if not fits:
                continue
            half = (source.busy - target.busy) / 2
            island = min(fits, key=lambda i: (abs(costs[i.name] - half), i.name))
            return Move(island.name, source.worker, target.worker, "spread")
        return None


def island_costs(loads: Sequence[WorkerLoad], islands: Sequence[Island]) -> dict[str, float]:
    """The busy share each island is estimated to cost: its worker's busy share times the island's share
    of that worker's messages (split evenly over the worker's islands when it reported no messages; 0
    for an island of a worker that did not report)."""
    by_worker = {w.worker: w for w in loads}
    counts: dict[int, int] = {}
    for i in islands:
        counts[i.worker] = counts.get(i.worker, 0) + 1
    out: dict[str, float] = {}
    for i in islands:
        w = by_worker.get(i.worker)
        if w is None:
            out[i.name] = 0.0
        elif w.msgs_per_s > 0:
            out[i.name] = w.busy * min(1.0, i.msgs_per_s / w.msgs_per_s)
        else:
            out[i.name] = w.busy / counts[i.worker]
    return out
