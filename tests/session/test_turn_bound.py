"""The AMQP frame loop's time bound (runtime/session/connection.py, `TURN_S`): after a content header
larger than `TABLE_CHECK_BYTES` (a table, decoded to validate it) the connection looks at the clock,
and past the turn's time the rest of its input waits for the next loop turn. Driven in memory with a
clock that moves a second at every look, so each large header ends a turn; publishes without a table
never look. The stall it removed is measured against a real node in
tests/interop/test_security_header_tables.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pamqp import commands

from hutch.runtime.broker.node import Node

from .memory import SessionPair, make_node

pytestmark = pytest.mark.asyncio

BIG = commands.Basic.Properties(headers={f"k{i}": i for i in range(2000)})  # ~20 KB of table


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


async def ready(node: Node) -> SessionPair:
    pair = SessionPair(node)
    await pair.open()
    pair.open_channel(1)
    pair.send(1, commands.Queue.Declare(queue="q"))
    pair.received()

    def moving() -> float:  # every look at the clock finds the turn's time spent
        pair.clock.now += 1.0
        return pair.clock.now

    pair.clock.time = moving  # type: ignore[method-assign]  # (the connection's LoopClock)
    return pair


def queued(node: Node) -> int:
    return int(node.vhosts["/"].queues["q"].message_count)


async def test_publishes_with_large_header_tables_take_a_turn_each(node: Node) -> None:
    pair = await ready(node)
    data = b"".join(pair.publish(1, "q", b"x", properties=BIG) for _ in range(3))
    pair.conn.receive_data(data)
    assert queued(node) == 1  # the rest waits for the next turn, reading held
    assert "turn" in pair.conn._read_holds
    pair.clock.run_soon()  # the next turns
    assert queued(node) == 3 and not pair.conn._read_holds


async def test_publishes_without_a_table_never_look_at_the_clock(node: Node) -> None:
    pair = await ready(node)
    data = b"".join(pair.publish(1, "q", b"x", properties=commands.Basic.Properties(delivery_mode=2))
                    for _ in range(50))
    pair.conn.receive_data(data)
    assert queued(node) == 50
