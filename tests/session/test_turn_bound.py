"""The AMQP frame loop's time bound (runtime/session/connection.py): the input work of every connection of
a loop takes its time from one budget a turn (runtime/turns.py, `TurnScheduler`). A connection looks at
it after every `STEP_FRAMES` frames and after a content header larger than `TABLE_CHECK_BYTES`; past the
budget, or while another connection waits, the rest of its input waits, reading held ("turn"), and is
resumed round-robin in a later turn. Driven in memory with a clock that moves at every look (MovingClock).
The stall it removed is measured
against a real node in tests/interop/test_security_turns.py and benchmarks/amqp_turn_flood.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame

from hutch.runtime.broker.node import Node
from hutch.runtime.session.connection import STEP_FRAMES
from hutch.runtime.turns import scheduler_of

from .memory import ManualLoopClock, SessionPair, make_node

pytestmark = pytest.mark.asyncio

BIG = commands.Basic.Properties(headers={f"k{i}": i for i in range(2000)})  # ~20 KB of table


class MovingClock(ManualLoopClock):
    """The loop of the test's connections: its scheduler's clock, on which every look at the time moves it
    on 6 ms of the 10 ms budget: a turn's input takes 3 steps when the window opens at its first look, one
    when a turn serves those waiting (the turn's own looks). `run_turn` runs one loop turn."""

    def time(self) -> float:
        self.now += 0.006
        return self.now

    def run_turn(self) -> None:
        batch: list[Any]
        batch, self._soon = self._soon, []
        for callback in batch:
            callback()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def ready(node: Node, clock: MovingClock | None = None) -> SessionPair:
    """An open connection with channel 1 and queue "q", taking its turns from `clock`'s scheduler (its
    own when not given), which `pair.clock` then is."""
    pair = SessionPair(node)
    await pair.open()
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="q"))
    pair.received()
    pair.clock = clock or MovingClock()
    pair.conn.turns = scheduler_of(pair.clock)
    return pair


def queued(node: Node) -> int:
    return int(node.vhosts["/"].queues["q"].message_count)


def declares(n: int) -> bytes:
    return b"".join(SessionPair.encode(1, commands.Queue.Declare(queue="q", passive=True)) for _ in range(n))


def answered(pair: SessionPair) -> int:
    """declare-oks written since `ready` (read without running the clock's turns, as `received` would)."""
    data = bytes(pair.transport.written)
    count = pos = 0
    while pos < len(data):
        used, _, value = frame.unmarshal(data[pos:])
        count += isinstance(value, commands.Queue.DeclareOk)
        pos += used
    return count - 1  # (ready's own queue.declare)


async def test_publishes_with_large_header_tables_take_a_step_each(node: Node) -> None:
    pair = await ready(node)
    data = b"".join(pair.publish(1, "q", b"x", properties=BIG) for _ in range(4))
    pair.conn.receive_data(data)
    assert queued(node) == 3  # the window opened at the first look, the third found it spent
    assert "turn" in pair.conn._read_holds and not pair.transport.reading
    pair.clock.run_soon()  # the next turns
    assert queued(node) == 4 and not pair.conn._read_holds and pair.transport.reading


async def test_small_frames_look_at_the_budget_every_step(node: Node) -> None:
    """Small method frames, which never looked at the clock before (a burst within the read budget was
    all handled in one turn): a look every STEP_FRAMES frames."""
    pair = await ready(node)
    pair.conn.receive_data(declares(5 * STEP_FRAMES + 3))
    assert answered(pair) == 3 * STEP_FRAMES and "turn" in pair.conn._read_holds
    pair.clock.run_turn()
    assert answered(pair) == 4 * STEP_FRAMES  # a step a turn
    pair.clock.run_soon()
    assert answered(pair) == 5 * STEP_FRAMES + 3 and not pair.conn._read_holds


async def test_a_few_small_publishes_never_look_at_the_clock(node: Node) -> None:
    pair = await ready(node)
    looks = pair.clock.now
    data = b"".join(pair.publish(1, "q", b"x", properties=commands.Basic.Properties(delivery_mode=2))
                    for _ in range(STEP_FRAMES - 1))
    pair.conn.receive_data(data)
    assert queued(node) == STEP_FRAMES - 1 and pair.clock.now == looks


async def test_input_arriving_while_another_waits_queues_behind_it(node: Node) -> None:
    clock = MovingClock()
    first, second = await ready(node, clock), await ready(node, clock)
    first.conn.receive_data(declares(4 * STEP_FRAMES))
    assert answered(first) == 3 * STEP_FRAMES  # then waits
    second.conn.receive_data(declares(1))
    assert answered(second) == 0 and not second.transport.reading  # behind `first`, before its first frame
    clock.run_turn()
    assert answered(first) == 4 * STEP_FRAMES and answered(second) == 0  # first's step, then the turn is spent
    clock.run_turn()
    assert answered(second) == 1 and second.transport.reading and first.transport.reading


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bursts=st.lists(st.integers(1, 6 * STEP_FRAMES), min_size=2, max_size=5))
async def test_connections_flooding_at_once_share_the_turns_and_all_finish(node: Node, bursts: list[int]) -> None:
    """Several connections each sending a burst of small frames in the same turn: the first takes the
    turn's budget, the others queue behind it before their first frame; then the turns serve those
    waiting one step at a time, round-robin (no one two steps ahead of another still waiting); every
    frame of every connection is answered and reading is released at the end."""
    clock = MovingClock()
    pairs = [await ready(node, clock) for _ in bursts]
    done = [0] * len(pairs)
    for pair, n in zip(pairs, bursts, strict=True):
        pair.conn.receive_data(declares(n))
    for i, pair in enumerate(pairs):
        done[i] = answered(pair)
    steps_taken = [0] * len(pairs)
    turns = 0
    while any(not p.transport.reading for p in pairs):
        turns += 1
        assert turns < 100
        before = list(done)
        clock.run_turn()
        for i, pair in enumerate(pairs):
            done[i] = answered(pair)
            assert done[i] - before[i] <= STEP_FRAMES  # a turn: at most a step of each
            steps_taken[i] += done[i] > before[i]
        waiting = [s for i, s in enumerate(steps_taken) if done[i] < bursts[i]]
        assert not waiting or max(waiting) - min(waiting) <= 1
    assert done == bursts
    assert all(not p.conn._read_holds for p in pairs)
