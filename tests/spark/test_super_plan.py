"""Planning a super stream's micro-batch (pure: no Spark session, no broker): `maxOffsetsPerTrigger`
spread over partitions, ranges split over tasks for `minPartitions`, and the options of a super stream read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.spark.options import EARLIEST, LATEST, OFFSET, HutchOptionError, Position, stream_read_options
from hutch.spark.super_source import cap_ends, plan_partitions

URI = "amqp://guest:guest@127.0.0.1:5673/%2F"


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1, max_size=8),
       st.integers(1, 10**6))
def test_cap_ends_admits_at_most_the_limit_and_moves(pairs: list[tuple[int, int]], limit: int) -> None:
    starts = [s for s, _ in pairs]
    ends = [s + w for s, w in pairs]
    capped = cap_ends(starts, ends, limit)
    taken = [c - s for c, s in zip(capped, starts, strict=True)]
    assert all(0 <= t <= e - s for t, s, e in zip(taken, starts, ends, strict=True))
    assert sum(taken) == min(limit, sum(e - s for s, e in zip(starts, ends, strict=True)))


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=6), st.integers(1, 20))
def test_plan_covers_every_range_once_in_enough_tasks(widths: list[int], min_partitions: int) -> None:
    ranges = [(i, f"s-{i}", 1000 * i, 1000 * i + w) for i, w in enumerate(widths)]
    tasks = plan_partitions(ranges, min_partitions)
    covered = sorted((t.partition, o) for t in tasks for o in range(t.start, t.end))
    assert covered == sorted((i, o) for i, _, s, e in ranges for o in range(s, e))
    assert [t.index for t in tasks] == list(range(len(tasks)))
    assert all(t.stream == f"s-{t.partition}" and t.end > t.start for t in tasks)
    live = sum(1 for w in widths if w)
    assert len(tasks) >= min(min_partitions, sum(widths)) or len(tasks) >= live


def test_super_stream_read_options() -> None:
    o = stream_read_options({"uri": URI, "superStream": "orders", "streamPort": "6000",
                             "startingOffsets": '{"orders": {"0": 5, "2": -2}}'}, True)
    assert (o.super_stream, o.stream, o.stream_port, o.name()) == ("orders", "", 6000, "orders")
    assert o.starting == Position(LATEST)  # partitions the map leaves out: the streaming default
    assert o.starting_by_partition == ((0, Position(OFFSET, 5)), (2, Position(EARLIEST)))
    b = stream_read_options({"uri": URI, "superStream": "orders", "endingOffsets": '{"1": 9}'}, False)
    assert b.starting == Position(EARLIEST) and b.ending_by_partition == ((1, Position(OFFSET, 9)),)


@pytest.mark.parametrize(("options", "fragment"), [
    ({"superStream": "o", "stream": "s"}, "exclude each other"),
    ({"superStream": "o", "queue": "q"}, "unknown option.*queue"),
    ({"superStream": "o", "startingOffsets": '{"o": {"x": 1}}'}, "JSON map of partition index"),
    ({"stream": "s", "streamPort": "70000"}, "between 1 and 65535"),
])
def test_super_stream_read_option_errors(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(HutchOptionError, match=fragment):
        stream_read_options({"uri": URI, **options}, True)
