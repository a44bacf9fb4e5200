"""The streaming ledger (pure): offsets, what is acknowledged and what is requeued.

The property at the heart of the at-least-once guarantee: a delivery is acknowledged only if its rows
were emitted to Spark and Spark finished the batch holding it; every handed-out delivery is settled
exactly once (acked or requeued), in delivery-tag order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.spark.ledger import Ledger, LedgerError, Settle


def _feed(ledger: Ledger, first_tag: int, n: int) -> None:
    ledger.append((t, f"d{t}") for t in range(first_tag, first_tag + n))


def test_batches_number_messages_from_the_start_offset() -> None:
    led = Ledger(0)
    assert led.room(0, 3) == 3
    _feed(led, 1, 5)
    items, end = led.batch(0, 3)
    assert items == ["d1", "d2", "d3"] and end == 3


def test_emitted_batches_are_acked_with_one_multiple_ack() -> None:
    led = Ledger(0)
    _feed(led, 1, 3)
    led.batch(0, 3)
    led.mark_emitted(0, 3)
    assert led.settle(3) == [Settle(True, 3, 3)]
    assert led.entries == type(led.entries)() and led.settled_seq == 3


def test_never_emitted_deliveries_are_requeued_not_acked() -> None:
    led = Ledger(10)
    _feed(led, 1, 4)          # seqs 11..14
    led.batch(10, 2)          # batch (10, 12] handed to Spark ...
    led.mark_emitted(10, 12)  # ... and emitted
    led.batch(12, 2)          # batch (12, 14] handed out but its rows never reached Spark
    assert led.settle(14) == [Settle(True, 2, 2), Settle(False, 4, 2)]


def test_settling_is_idempotent_and_partial() -> None:
    led = Ledger(0)
    _feed(led, 7, 4)  # tags 7..10 -> seqs 1..4
    led.mark_emitted(0, 4)
    assert led.settle(2) == [Settle(True, 8, 2)]
    assert led.settle(2) == []
    assert led.settle(1) == []
    assert led.settle(4) == [Settle(True, 10, 2)]


def test_a_restarted_query_resumes_numbering_at_its_checkpoint() -> None:
    led = Ledger(0)
    assert led.settle(500) == []  # fresh reader, first start offset from the checkpoint
    _feed(led, 1, 2)
    assert led.batch(500, 10) == (["d1", "d2"], 502)


def test_rereading_a_handed_out_range_serves_the_same_deliveries() -> None:
    led = Ledger(0)
    _feed(led, 1, 4)
    assert led.batch(0, 4) == (["d1", "d2", "d3", "d4"], 4)
    assert led.room(0, 4) == 0
    assert led.batch(0, 4) == (["d1", "d2", "d3", "d4"], 4)
    assert led.batch(2, 4) == (["d3", "d4"], 4)


def test_asking_below_the_settled_offset_is_an_error() -> None:
    led = Ledger(0)
    _feed(led, 1, 2)
    led.mark_emitted(0, 2)
    led.settle(2)
    with pytest.raises(LedgerError, match="cannot be re-read"):
        led.batch(1, 5)


def test_tags_must_ascend() -> None:
    led = Ledger(0)
    _feed(led, 5, 1)
    with pytest.raises(LedgerError):
        led.append([(5, "again")])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5), st.booleans(), st.booleans()), max_size=40))
def test_every_delivery_is_settled_once_and_acked_only_if_emitted(
        steps: list[tuple[int, int, bool, bool]]) -> None:
    """Drive the ledger as the reader does (settle start, take new, cut a batch, maybe emit it, maybe
    let Spark finish it) and check conservation and the ack rule."""
    led = Ledger(0)
    next_tag = 1
    start = 0
    emitted: set[int] = set()
    settled: dict[int, bool] = {}  # tag -> acked?
    finished = 0

    def apply(settles: list[Settle]) -> None:
        unsettled = [t for t in range(1, next_tag) if t not in settled]
        for s in settles:
            run = [t for t in unsettled if t <= s.delivery_tag and t not in settled]
            assert len(run) == s.count
            for t in run:
                assert (t in emitted) == s.ack, "ack iff emitted"
                settled[t] = s.ack

    for new, limit, emit, finish in steps:
        apply(led.settle(finished))
        start = max(start, finished)
        want = min(new, led.room(start, limit))
        _feed(led, next_tag, want)
        next_tag += want
        items, end = led.batch(start, limit)
        if items and emit:
            led.mark_emitted(start, end)
            emitted.update(int(i[1:]) for i in items)
        if finish:
            finished = end
            start = end
    apply(led.settle(10**9))
    assert sorted(settled) == list(range(1, next_tag)), "every delivery settled exactly once"
