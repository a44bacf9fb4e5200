"""The bytes subscriptions keep for their properties and filter values (hub.PropertiesBudget,
consuming.properties_cost): the budget's rule as a pure state machine with a Hypothesis property (the
total never passes its bound, a connection never passes its own, a connection within its free bytes is
never refused for the others, everything given back when the subscriptions end), and the connection in
memory (a subscribe past the budget answered PRECONDITION_FAILED and nothing kept, its preparation
stopped early, the bytes given back on unsubscribe and on close). The same on a real node, with the
stall probe and the node's RSS, is in test_security_stream.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.consuming import FILTER_VALUE_BYTES, PROPERTY_BYTES, properties_cost
from hutch.runtime.stream_session.hub import PropertiesBudget
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key, OffsetType
from hutch.streamproto.wire import STEP_ENTRIES, OffsetSpec
from session.memory import make_node

from .memory import StreamPair, make_hub

FIRST = OffsetSpec(OffsetType.FIRST)
MIB = 1 << 20


def filters(count: int, prefix: str = "") -> dict[str, str]:
    return {f"filter.{i}": f"{prefix}{i:x}" for i in range(count)}


def test_the_cost_counts_characters_and_what_python_keeps_for_each() -> None:
    props = {"name": "app", "filter.0": "eu", "single-active-consumer": "true"}
    assert properties_cost(props, props) == (4 + 3 + 8 + 2 + 22 + 4 + 3 * PROPERTY_BYTES + 2 + FILTER_VALUE_BYTES)
    big = filters(45_000)
    assert 9 * MIB < properties_cost(big, big) < 11 * MIB  # (tracemalloc: 9.6 MiB kept for such a frame)
    assert properties_cost(filters(3_000), filters(3_000)) < PropertiesBudget.FREE_BYTES  # rstream's test


def test_a_connection_within_its_free_bytes_is_never_refused_for_the_others() -> None:
    budget = PropertiesBudget(connection_max=16 * MIB, total_max=8 * MIB)
    assert budget.admit(0, 9 * MIB) is None  # 8 MiB beyond its first one: the whole total
    assert budget.beyond_free == 8 * MIB
    refused = budget.admit(0, 2 * MIB)  # another connection: 1 MiB past its free bytes
    assert refused is not None and "stream.max_subscription_properties_bytes_total" in refused
    assert budget.admit(0, MIB) is None and budget.admit(MIB, 1) is not None  # its own first MiB: taken
    refused = budget.admit(9 * MIB, 8 * MIB)  # past the connection's own cap
    assert refused is not None and "over the connection's 16777216" in refused
    budget.release(9 * MIB, 9 * MIB)
    assert budget.beyond_free == 0 and budget.admit(MIB, 2 * MIB) is None


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 6 * MIB)), max_size=80),
       connection_max=st.integers(64 << 10, 16 * MIB), total_max=st.integers(0, 24 * MIB))
def test_the_budget_keeps_its_bounds_whatever_the_order(steps: list[tuple[int, bool, int]], connection_max: int,
                                                        total_max: int) -> None:
    """Connections subscribe (`cost` bytes) and end their oldest subscription in any order."""
    budget = PropertiesBudget(connection_max, total_max)
    kept: dict[int, list[int]] = {n: [] for n in range(6)}
    for conn, subscribe, cost in steps:
        held = sum(kept[conn])
        if subscribe:
            before, room = budget.beyond_free, budget.room(held)
            refused = budget.admit(held, cost)
            assert (refused is None) == (cost <= room)
            if held + cost <= budget.free:
                assert refused is None  # within its own first bytes: never refused for the others
            if refused is None:
                kept[conn].append(cost)
            else:
                assert budget.beyond_free == before  # nothing taken
        elif kept[conn]:
            budget.release(held, kept[conn].pop(0))
        assert budget.beyond_free == sum(max(0, sum(k) - budget.free) for k in kept.values()) <= total_max
        assert all(sum(k) <= connection_max for k in kept.values())
    for costs in kept.values():
        while costs:
            budget.release(sum(costs), costs.pop())
    assert budget.beyond_free == 0


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"), stream_max_subscription_properties_bytes=4 * MIB,
                     stream_max_subscription_properties_bytes_total=3 * MIB)


@pytest.mark.asyncio
async def test_a_subscribe_past_the_budget_is_refused_and_the_connection_goes_on(node: Node) -> None:
    hub = make_hub(node)
    pair = StreamPair(hub)
    await pair.open()
    await pair.create("s")
    first = c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, filters(16_000))  # 3.5 MiB of the connection's 4
    assert await pair.request(first) == c.Response(Key.SUBSCRIBE, first.correlation_id, Code.OK)
    kept = pair.conn.consuming.kept_bytes
    assert kept == properties_cost(first.properties, first.properties) and hub.properties.beyond_free == kept - MIB
    second = c.Subscribe(pair.next_corr(), 2, "s", FIRST, 10, filters(12_000, "b"))  # 2.6 MiB more
    assert await pair.request(second) == c.Response(Key.SUBSCRIBE, second.correlation_id, Code.PRECONDITION_FAILED)
    assert 2 not in pair.conn.consuming.subscriptions and pair.conn.consuming.kept_bytes == kept
    small = c.Subscribe(pair.next_corr(), 3, "s", FIRST, 10, {"filter.0": "eu", "name": "app"})
    assert await pair.request(small) == c.Response(Key.SUBSCRIBE, small.correlation_id, Code.OK)

    other = StreamPair(hub)  # 2.5 of the total's 3 MiB spent: another connection gets its first MiB, not 2
    await other.open()
    ordinary = c.Subscribe(other.next_corr(), 1, "s", FIRST, 10, filters(3_000))  # rstream's test: ~0.7 MiB
    assert await other.request(ordinary) == c.Response(Key.SUBSCRIBE, ordinary.correlation_id, Code.OK)
    large = c.Subscribe(other.next_corr(), 2, "s", FIRST, 10, filters(10_000, "c"))
    assert await other.request(large) == c.Response(Key.SUBSCRIBE, large.correlation_id, Code.PRECONDITION_FAILED)

    gone = c.Unsubscribe(pair.next_corr(), 1)
    assert await pair.request(gone) == c.Response(Key.UNSUBSCRIBE, gone.correlation_id, Code.OK)
    again = c.Subscribe(other.next_corr(), 2, "s", FIRST, 10, filters(10_000, "c"))
    assert await other.request(again) == c.Response(Key.SUBSCRIBE, again.correlation_id, Code.OK)
    other.conn.connection_lost()
    pair.conn.connection_lost()
    assert hub.properties.beyond_free == 0


@pytest.mark.asyncio
async def test_a_frame_over_what_the_connection_may_take_is_not_decoded_further(node: Node) -> None:
    """`decode_subscribe` counts the properties as they are read and stops at the step where they pass
    what the connection may take (its 4 MiB here): the rest of the frame is not decoded, nothing stays
    counted, and the subscribe is refused with its correlation id; `prepare` does nothing more."""
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("s")
    consuming = pair.conn.consuming
    frame = c.encode(c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, filters(45_000)))[4:]  # ~9.8 MiB
    steps = consuming.decode_subscribe(frame)
    yields = 0
    try:
        while True:
            next(steps)
            yields += 1
    except StopIteration as done:
        head = done.value
    assert yields < 45_000 // STEP_ENTRIES // 2  # stopped past 4 MiB (512 properties a step, ~0.11 MiB)
    assert head == c.Subscribe(pair.corr, 1, "s", FIRST, 10, {}) and consuming.reserved == consuming.kept_bytes == 0
    assert consuming._prepared is not None and consuming._prepared.refused is not None
    assert list(consuming.prepare(head)) == []
    answer = await pair.request(c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, filters(45_000)))
    assert answer == c.Response(Key.SUBSCRIBE, pair.corr, Code.PRECONDITION_FAILED)
    assert consuming.subscriptions == {} and consuming.kept_bytes == consuming.reserved == 0


@pytest.mark.asyncio
async def test_what_a_decoding_counted_is_given_back_when_its_connection_is_lost(node: Node) -> None:
    """A large subscribe decoded across loop turns holds its count meanwhile (so many connections
    decoding at once hold at most the budget); a connection lost midway gives it back."""
    from .test_map_entries import TickingClock

    hub = make_hub(node)
    pair = StreamPair(hub)
    await pair.open()
    await pair.create("s")
    clock = TickingClock(pair.clock.now, 0.004)
    clock.drive(pair.conn)
    pair.conn.receive_data(c.encode(c.Subscribe(pair.next_corr(), 1, "s", FIRST, 10, filters(12_000))))
    clock.run_turn()
    assert 0 < pair.conn.consuming.reserved < properties_cost(filters(12_000), filters(12_000))
    assert hub.properties.beyond_free == max(0, pair.conn.consuming.reserved - MIB)
    pair.conn.connection_lost()
    assert pair.conn.consuming.reserved == pair.conn.consuming.kept_bytes == hub.properties.beyond_free == 0
