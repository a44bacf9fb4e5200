"""The loop's budget for step work (runtime/turns.py), in memory: a clock that each step moves on, jobs
that decode in steps as a connection does (`run_steps`, `wait` when the rest must wait), and loop turns
run by hand. What must hold: the steps of all jobs in one turn take at most the budget and one step
more (the loop-wide bound), jobs that wait are served round-robin (one step each at a time: no job is
more than one step ahead of another that waited as long), a new frame never jumps the queue, and every
job finishes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.runtime.turns import TurnScheduler, scheduler_of


class Clock:
    """Time moves only when a step costs it; `call_soon` callbacks wait for `run_turn`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[Callable[[], object]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object]) -> Any:
        raise AssertionError("the scheduler sets no timers")

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.soon.append(callback)

    def run_turn(self) -> bool:
        batch, self.soon = self.soon, []
        for callback in batch:
            callback()
        return bool(batch)


class Job:
    """A connection's large frame: `steps` steps of `cost_s` each, decoded as connection.py does."""

    def __init__(self, name: int, scheduler: TurnScheduler, clock: Clock, steps: int, cost_s: float,
                 log: list[tuple[int, int]]) -> None:
        self.name, self.scheduler, self.clock = name, scheduler, clock
        self.cost_s = cost_s
        self.log = log  # (turn, job) of every step taken
        self.turn = 0
        self.taken = 0
        self.result: Any = None
        self.waits = 0
        self.queued_at: int | None = None  # where in `log` it first waited
        self._steps = self._run(steps)

    def _run(self, steps: int) -> Iterator[None]:
        for _ in range(steps - 1):
            self._step()
            yield
        self._step()
        return f"done {self.name}"

    def _step(self) -> None:
        self.clock.now += self.cost_s
        self.taken += 1
        self.log.append((self.turn, self.name))

    def arrive(self) -> None:
        self._go(resumed=False)

    def _go(self, resumed: bool) -> None:
        done, value = self.scheduler.run_steps(self._steps, resumed)
        if done:
            self.result = value
        else:
            self.waits += 1
            if self.queued_at is None:
                self.queued_at = len(self.log)
            self.scheduler.wait(lambda: self._go(resumed=True))


def run(jobs: list[Job], clock: Clock, arrivals: dict[int, list[Job]], turns_max: int = 100_000) -> int:
    """Turns until every job is done; jobs arrive (a read of their frame) at their turn's start."""
    turn = 0
    while turn < turns_max:
        for job in jobs:
            job.turn = turn
        clock.run_turn()
        for job in arrivals.get(turn, []):
            job.arrive()
        if all(job.result is not None for job in jobs):
            return turn
        turn += 1
    raise AssertionError("the jobs did not finish")


def test_one_frame_alone_is_decoded_at_once_within_the_budget() -> None:
    clock = Clock()
    scheduler = TurnScheduler(clock, 0.01)
    log: list[tuple[int, int]] = []
    small = Job(1, scheduler, clock, 3, 0.001, log)
    small.arrive()
    assert small.result == "done 1" and small.waits == 0  # no queue, no extra turn: the ordinary case


def test_a_frame_past_the_budget_waits_for_the_next_turns() -> None:
    clock = Clock()
    scheduler = TurnScheduler(clock, 0.01)
    log: list[tuple[int, int]] = []
    big = Job(1, scheduler, clock, 50, 0.001, log)
    turns = run([big], clock, {0: [big]})
    assert big.result == "done 1"
    per_turn = [sum(1 for t, _ in log if t == n) for n in range(turns + 1)]
    assert max(per_turn) <= 11 and turns >= 4  # 10 steps of 1 ms a turn (+ the one that crosses it)


def test_many_connections_share_one_budget_round_robin() -> None:
    """64 connections' frames of 40 steps arrive in the same turn: each turn takes at most the budget and
    one step; one step per connection at a time."""
    clock = Clock()
    scheduler = TurnScheduler(clock, 0.01)
    log: list[tuple[int, int]] = []
    jobs = [Job(i, scheduler, clock, 40, 0.001, log) for i in range(64)]
    run(jobs, clock, {0: jobs})
    assert all(job.result == f"done {job.name}" for job in jobs)
    by_turn: dict[int, list[int]] = {}
    for turn, name in log:
        by_turn.setdefault(turn, []).append(name)
    assert max(len(names) for names in by_turn.values()) <= 11  # before: 64 × 10 steps in one turn
    # the first to arrive stepped until the budget was spent, then everyone in turn, one step each
    order = [name for _, name in log]
    assert order[:10] == [0] * 10
    assert order[10:10 + 128] == [*range(64), *range(64)]  # 0 waited first, the others behind it


def test_a_new_frame_waits_behind_those_waiting() -> None:
    clock = Clock()
    scheduler = TurnScheduler(clock, 0.01)
    log: list[tuple[int, int]] = []
    first, second = Job(1, scheduler, clock, 30, 0.001, log), Job(2, scheduler, clock, 30, 0.001, log)
    first.arrive()  # takes the turn's budget, waits
    clock.now += 0.02  # (the turn goes on: the window stays spent until the next turn)
    second.arrive()
    assert second.taken == 0 and scheduler.waiting() == 2
    clock.run_turn()
    assert first.taken > 10 and second.taken >= 1


def test_one_scheduler_per_loop() -> None:
    one, other = Clock(), Clock()
    assert scheduler_of(one) is scheduler_of(one)
    assert scheduler_of(one) is not scheduler_of(other)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5), st.sampled_from([0.0005, 0.001, 0.004])),
                min_size=1, max_size=40))
def test_the_loop_wide_bound_fairness_and_completion(specs: list[tuple[int, int, float]]) -> None:
    """Any mix of frames (steps, arrival turn, step cost): in every turn the steps of all connections
    take at most the budget plus one step (the one that crosses it), jobs that arrived are served
    round-robin (in a turn where more than one waits, no job takes a second step before every waiting
    job took one), and all finish."""
    clock = Clock()
    budget = 0.01
    scheduler = TurnScheduler(clock, budget)
    log: list[tuple[int, int]] = []
    jobs = [Job(i, scheduler, clock, steps, cost, log) for i, (steps, _, cost) in enumerate(specs)]
    arrivals: dict[int, list[Job]] = {}
    for job, (_, turn, _) in zip(jobs, specs, strict=True):
        arrivals.setdefault(turn, []).append(job)
    run(jobs, clock, arrivals)
    assert all(job.result == f"done {job.name}" for job in jobs)
    cost = {job.name: job.cost_s for job in jobs}
    turns: dict[int, list[int]] = {}
    for turn, name in log:
        turns.setdefault(turn, []).append(name)
    longest_step = max(cost.values())
    for names in turns.values():
        assert sum(cost[n] for n in names) <= budget + longest_step + 1e-9
    # round-robin: once two jobs both wait, their steps alternate (each resume takes one step while
    # another waits) until one of them is done
    last = {name: i for i, (_, name) in enumerate(log)}
    queued = [job for job in jobs if job.queued_at is not None]
    for a in queued:
        for b in queued:
            if a.name >= b.name:
                continue
            assert a.queued_at is not None and b.queued_at is not None
            window = log[max(a.queued_at, b.queued_at):min(last[a.name], last[b.name]) + 1]
            assert abs(sum(n == a.name for _, n in window) - sum(n == b.name for _, n in window)) <= 1


def test_a_served_turn_is_counted_as_the_nodes_loop_work() -> None:
    """The steps a served turn takes are input work of the loop (the node's `LoopLoad`, which judges
    saturation and compaction's busy share): `timed` wraps the turn, from the first `scheduler_of` that
    gives one; a turn with nobody waiting counts nothing."""
    from hutch.core.credit_flow import LoopLoad

    clock = Clock()
    load = LoopLoad(clock.time)
    s = scheduler_of(clock, load.timed)
    assert s.timed == load.timed and scheduler_of(clock, None).timed == load.timed
    ran: list[int] = []

    def resume() -> None:
        clock.now += 0.004  # a step of 4 ms
        ran.append(1)

    s.wait(resume)
    s.wait(resume)
    assert clock.run_turn()
    assert ran == [1, 1] and abs(load.busy_total_s - 0.008) < 1e-9
    s.deadline()  # a window opened with nobody waiting: its turn serves and counts nothing
    assert clock.run_turn()
    assert abs(load.busy_total_s - 0.008) < 1e-9
