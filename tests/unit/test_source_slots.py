"""`listen.SourceSlots`: connections counted per source address under a total and a per-source cap (the
management listener's caps and the AMQP-over-TLS handshake slots; issue 21, findings 2 and 3); and
`HandshakeGate` / `HeldSlot`, one connection's slot from the accept to its login or TLS handshake
(every listener's unproven connections, session 16)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.runtime.listen import HandshakeGate, HeldSlot, SourceSlots


class FakeTransport:
    def __init__(self, source: str) -> None:
        self.source = source
        self.closed = False

    def get_extra_info(self, name: str) -> Any:
        return (self.source, 50000) if name == "peername" else None

    def close(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_a_held_slot_is_taken_at_the_accept_and_released_once() -> None:
    gate = HandshakeGate(SourceSlots(max_total=3, max_per_source=2), "AMQP", "before login")
    first, second, third = (HeldSlot(gate) for _ in range(3))
    transports = [FakeTransport("10.0.0.1") for _ in range(3)]
    assert first.take(transports[0]) and second.take(transports[1])
    assert not third.take(transports[2]) and third.refused and transports[2].closed  # the newest refused
    assert not transports[0].closed and gate.slots.refused == 1
    first.release()
    first.release()  # (its end after its login: harmless)
    assert gate.slots.per_source == {"10.0.0.1": 1}
    third.release()  # a refused one holds nothing
    assert gate.slots.held == 1
    assert HeldSlot(gate).take(FakeTransport("10.0.0.2"))  # another source meanwhile


def test_one_source_cannot_take_every_slot() -> None:
    slots = SourceSlots(max_total=8, max_per_source=2)
    assert [slots.admit("10.0.0.1") for _ in range(3)] == [None, None, "per source"]
    assert slots.admit("10.0.0.2") is None and slots.held == 3 and slots.refused == 1
    slots.release("10.0.0.1")
    assert slots.admit("10.0.0.1") is None


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c", "d"])), max_size=200))
def test_the_caps_hold_and_every_admission_is_counted_once(steps: list[tuple[bool, str]]) -> None:
    slots = SourceSlots(max_total=5, max_per_source=2)
    held: dict[str, int] = {}
    for admit, source in steps:
        if admit:
            if slots.admit(source) is None:
                held[source] = held.get(source, 0) + 1
        elif held.get(source):
            slots.release(source)
            held[source] -= 1
        assert slots.held == sum(held.values()) <= 5
        assert slots.per_source == {s: n for s, n in held.items() if n}
        assert all(n <= 2 for n in slots.per_source.values())
