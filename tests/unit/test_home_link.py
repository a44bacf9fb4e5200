"""The pure part of runtime/stream_session/home_link.py: `simple_entries`, which lets a stream's home
append a forwarded data section as it came only when it is exactly simple entries (anything else is
decoded and checked entry by entry)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.queues.stream import chunk as ck
from hutch.runtime.stream_session.home_link import simple_entries


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30))
def test_a_data_section_of_simple_entries_counts_them(bodies: list[bytes]) -> None:
    data, _ = ck.encode_entries(bodies)
    assert simple_entries(data) == len(bodies)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.integers(min_value=1, max_value=3))
def test_a_cut_data_section_is_not_simple_entries(bodies: list[bytes], cut: int) -> None:
    data, _ = ck.encode_entries(bodies)
    assert simple_entries(data[:-cut]) == -1  # (a cut of at most 3 bytes is inside the last entry)
    assert simple_entries(data + b"\x00") == -1


def test_a_sub_batch_is_not_a_simple_entry() -> None:
    data, _ = ck.encode_entries([b"a", ck.SubBatch(2, 0, 10, b"\x00\x00\x00\x01b\x00\x00\x00\x01c")])
    assert simple_entries(data) == -1
