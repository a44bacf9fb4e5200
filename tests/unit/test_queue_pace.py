"""Pure tests of the pace-by-key half of the flow rule (core/credit_flow.py: `QueuePace`, `Pace`,
`backlog_holds`), which a quorum queue's leader feeds with what its machine did, and a Hypothesis
property: fed the same events, a `QueuePace` judges a consumer exactly as the channel-side judgement
judges a channel's `Consumer`."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.core.credit_flow import (
    FLOW_HIGH,
    FLOW_LOW,
    KEEP_UP_MS,
    LoopLoad,
    QueuePace,
    backlog_holds,
    consumer_filled,
    consumer_settled,
    keeps_pace,
)
from hutch.core.queue_type import Consumer

KEY = ("n1", 7)


class Load(LoopLoad):
    """A loop load a test sets directly."""

    def __init__(self, saturated: bool) -> None:
        super().__init__(lambda: 0.0)
        self.value = saturated

    def saturated(self) -> bool:
        return self.value


def paced(prefetch: int = 100) -> QueuePace:
    """A queue with 1,000 messages published and one consumer that has just filled its prefetch."""
    pace = QueuePace()
    pace.enqueued(1000)
    pace.delivered(KEY, prefetch, prefetch, prefetch, 1000)
    return pace


def test_a_consumer_settling_half_its_prefetch_in_time_keeps_pace() -> None:
    pace = paced()
    assert pace.by_key[KEY].pace_start_ms == 1000  # full: timed from the fill
    pace.settled(KEY, 40, 60, 1050)  # 40 back: not half yet, no judgement
    assert not pace.keeps_pace(1050)
    pace.settled(KEY, 10, 50, 1100)
    assert pace.keeps_pace(1100)
    assert pace.acked == 50


def test_a_consumer_refilled_at_once_is_timed_again_from_the_settlement() -> None:
    """On a quorum queue a settlement's credit is spent by the deliveries the same command triggers, so
    the consumer is full again when the settle is seen: its next round is timed from then."""
    pace = paced()
    pace.delivered(KEY, 50, 100, 100, 1090)  # the refill, applied with the settle
    pace.settled(KEY, 50, 100, 1100)
    assert pace.keeps_pace(1100)
    assert pace.by_key[KEY].pace_start_ms == 1100  # full again: the next round is timed
    assert not pace.keeps_pace(1100 + KEEP_UP_MS + 1)  # and it gave nothing back since


def test_a_slow_consumer_does_not_keep_pace() -> None:
    pace = paced()
    pace.settled(KEY, 100, 0, 1000 + KEEP_UP_MS + 1)
    assert not pace.keeps_pace(1000 + KEEP_UP_MS + 1)


def test_a_consumer_whose_queue_takes_less_than_half_of_what_arrives_does_not_keep_pace() -> None:
    pace = paced()
    pace.enqueued(500)  # 500 published since the fill, 100 acked
    pace.settled(KEY, 100, 0, 1050)
    assert not pace.keeps_pace(1050)


def test_returns_and_discards_count_as_settlements_but_not_as_acks() -> None:
    pace = paced()
    pace.settled(KEY, 0, 0, 1050)  # all 100 returned (basic.nack requeue): prompt, but nothing acked
    assert pace.acked == 0
    assert pace.keeps_pace(1050)  # nothing published meanwhile: 0 >= 0


def test_consumers_without_a_prefetch_limit_are_never_recorded() -> None:
    pace = QueuePace()
    pace.delivered(KEY, 100, 0, 0, 1000)
    pace.settled(KEY, 100, 0, 1000)
    assert pace.by_key == {} and pace.acked == 100
    assert not pace.keeps_pace(1000)


def test_retain_forgets_the_consumers_gone() -> None:
    pace = paced()
    pace.delivered(("n2", 1), 10, 10, 10, 1000)
    pace.retain({("n2", 1): object()})
    assert list(pace.by_key) == [("n2", 1)]


def test_the_backlog_rule_needs_a_backlog_a_saturated_loop_and_a_consumer_that_keeps_pace() -> None:
    pace = paced()
    pace.settled(KEY, 100, 0, 1050)
    reads: list[int] = []

    def clock() -> int:
        reads.append(1)
        return 1050

    assert backlog_holds(FLOW_HIGH + 1, FLOW_HIGH, Load(True), pace, clock)
    assert not backlog_holds(FLOW_HIGH, FLOW_HIGH, Load(True), pace, clock)  # not over the limit
    assert not backlog_holds(FLOW_HIGH + 1, FLOW_HIGH, Load(False), pace, clock)  # time to spare
    assert not backlog_holds(FLOW_HIGH + 1, FLOW_HIGH, Load(True), QueuePace(), clock)  # no consumer
    assert len(reads) == 2  # the clock is read only when the backlog and the loop call for the pace
    assert backlog_holds(FLOW_LOW + 1, FLOW_LOW, Load(True), pace, clock)  # held until FLOW_LOW


# -- the same judgement as a channel's consumer --------------------------------------------------------

class _Chan:
    conn: Any = None

    def can_take(self) -> bool:
        return True


events = st.lists(st.tuples(st.sampled_from(["publish", "deliver", "settle"]), st.integers(1, 60),
                            st.integers(0, 150)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(prefetch=st.integers(1, 50), script=events)
def test_queue_pace_judges_a_consumer_as_the_channel_side_does(prefetch: int, script: list[tuple[str, int, int]]) -> None:
    """A `QueuePace` fed deliveries and settlements by key reaches the same verdicts as the channel-side
    judgement (`consumer_filled` at the fill, `consumer_settled` after each settle) on a `Consumer`
    given the same events, and its counters stay consistent."""
    pace = QueuePace()
    model = Consumer("t", _Chan(), None, False, False, prefetch)  # type: ignore[arg-type]
    published = acked = 0
    now = 0
    for kind, n, dt in script:
        now += dt
        if kind == "publish":
            published += n
            pace.enqueued(n)
        elif kind == "deliver":
            n = min(n, prefetch - model.unacked)
            if n <= 0:
                continue
            model.unacked += n
            model.delivered += n
            if model.unacked >= prefetch:
                consumer_filled(model, now, published, acked)
            pace.delivered(KEY, n, model.unacked, prefetch, now)
        else:
            n = min(n, model.unacked)
            if n <= 0:
                continue
            model.unacked -= n
            acked += n
            consumer_settled(model, now, published, acked)
            if model.unacked >= prefetch:
                consumer_filled(model, now, published, acked)
            pace.settled(KEY, n, model.unacked, now)
        p = pace.by_key.get(KEY)
        if p is not None:
            assert (p.keeping_up, p.pace_start_ms, p.unacked) == (model.keeping_up, model.pace_start_ms,
                                                                 model.unacked)
            assert pace.keeps_pace(now) == keeps_pace(model, now)
            assert p.pace_start_ms == -1 or p.pace_start_ms <= now
        assert pace.acked == acked and pace.published == published
