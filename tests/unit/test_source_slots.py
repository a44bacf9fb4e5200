"""`listen.SourceSlots`: connections counted per source address under a total and a per-source cap (the
management listener's caps and the AMQP-over-TLS handshake slots; issue 21, findings 2 and 3)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.runtime.listen import SourceSlots


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
