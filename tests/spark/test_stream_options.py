"""Options of a read of a stream, the planning of offset ranges and the offset of a delivery (pure: no
Spark session, no broker)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.amqp.spec import BasicProperties
from hutch.amqp.table import TypedInt
from hutch.spark.client import Delivery
from hutch.spark.options import HutchOptionError, Position, duration_ms, stream_read_options
from hutch.spark.schema import stream_offset
from hutch.spark.stream_source import admit, split_range

URI = "amqp://guest:guest@127.0.0.1:5673/%2F"



def test_defaults_follow_kafka() -> None:
    live = stream_read_options({"uri": URI, "stream": "s"}, True)
    assert live.starting == Position("latest") and live.max_offsets_per_trigger == 0
    assert live.min_partitions == 1 and live.fail_on_data_loss
    batch = stream_read_options({"uri": URI, "STREAM": "s"}, False)
    assert batch.starting == Position("earliest") and batch.ending == Position("latest")


@pytest.mark.parametrize(("text", "expected"), [
    ("earliest", Position("earliest")), ("LATEST", Position("latest")),
    ('{"s": {"0": 42}}', Position("offset", 42)), ('{"0": 7}', Position("offset", 7)),
    ('{"s": {"0": -2}}', Position("earliest")), ('{"0": -1}', Position("latest")),
])
def test_starting_offsets(text: str, expected: Position) -> None:
    assert stream_read_options({"uri": URI, "stream": "s", "startingOffsets": text}, True).starting == expected


def test_timestamps_and_ending_offsets() -> None:
    o = stream_read_options({"uri": URI, "stream": "s", "startingTimestamp": "1700000000000",
                             "endingOffsets": '{"0": 10}'}, False)
    assert o.starting == Position("timestamp", 1_700_000_000_000) and o.ending == Position("offset", 10)


@pytest.mark.parametrize(("options", "streaming", "fragment"), [
    ({"startingOffsets": "middle"}, True, "option 'startingOffsets' must be 'earliest', 'latest' or a JSON map"),
    ({"startingOffsets": '{"other": {"0": 1}}'}, True, "a stream has one partition"),
    ({"startingOffsets": '{"0": -3}'}, True, "startingOffsets"),
    ({"startingOffsets": "earliest", "startingTimestamp": "1"}, True, "exclude each other"),
    ({"endingOffsets": "latest"}, True, "are for batch reads"),
    ({"endingOffsets": "earliest"}, False, "cannot be 'earliest'"),
    ({"maxOffsetsPerTrigger": "10"}, False, "is for streaming reads"),
    ({"maxOffsetsPerTrigger": "0"}, True, "between 1 and"),
    ({"minOffsetsPerTrigger": "10"}, False, "is for streaming reads"),
    ({"maxTriggerDelay": "soon"}, True, "must be a duration such as 15m"),
    ({"maxTriggerDelay": "5 weeks"}, True, "must be a duration"),
    ({"minPartitions": "0"}, True, "between 1 and"),
    ({"failOnDataLoss": "maybe"}, True, "true or false"),
    ({"queue": "q"}, True, "unknown option"),
    ({"maxMessagesPerTrigger": "5"}, True, "unknown option"),
])
def test_bad_options(options: dict[str, str], streaming: bool, fragment: str) -> None:
    with pytest.raises(HutchOptionError, match=fragment):
        stream_read_options({"uri": URI, "stream": "s", **options}, streaming)


def test_stream_is_required() -> None:
    with pytest.raises(HutchOptionError, match="option 'stream' is required"):
        stream_read_options({"uri": URI, "stream": ""}, True)


@given(st.integers(0, 10**12), st.integers(0, 10_000), st.integers(1, 64))
def test_split_range_covers_the_range_once_in_order(start: int, width: int, parts: int) -> None:
    ranges = split_range(start, start + width, parts)
    assert len(ranges) == min(parts, width)
    flat = [o for s, e in ranges for o in (s, e)]
    assert flat == sorted(flat)
    assert all(e > s for s, e in ranges)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if ranges:
        assert ranges[0][0] == start and ranges[-1][1] == start + width
        sizes = [e - s for s, e in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_min_offsets_per_trigger_and_max_trigger_delay() -> None:
    o = stream_read_options({"uri": URI, "stream": "s", "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"},
                            True)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 30_000)
    assert stream_read_options({"uri": URI, "stream": "s"}, True).max_trigger_delay_ms == 15 * 60_000
    assert [duration_ms(t, "d") for t in ("15m", "500ms", "2h", "250", "1 s")] == [900_000, 500, 7_200_000, 250, 1000]
    assert not admit(50, 100, 30_000, 1_000)  # too few, not waited long enough: wait
    assert admit(50, 100, 30_000, 30_000)  # waited maxTriggerDelay: run what there is
    assert admit(100, 100, 30_000, 0)
    assert not admit(0, 100, 30_000, 10**9)  # nothing to read is never a batch


_text = st.one_of(st.none(), st.text(max_size=20))


@given(st.integers(0, 2**62), _text, _text, _text, st.booleans())
def test_the_offset_fast_path_agrees_with_decoding(offset: int, content_type: str | None, encoding: str | None,
                                                   message_id: str | None, other_header: bool) -> None:
    headers: dict[str, object] = {"x-stream-offset": TypedInt(offset, "l")}
    if other_header:
        headers["app"] = "x"
    raw = BasicProperties(content_type=content_type, content_encoding=encoding, headers=headers,
                          message_id=message_id, delivery_mode=2).encode()
    d = Delivery(1, False, "", "k", raw, b"", 0)
    cache: dict[bytes, BasicProperties] = {}
    fast, slow = stream_offset(d, cache), stream_offset(d)
    assert fast[0] == slow[0] == offset
    assert (fast[1].content_type, fast[1].message_id) == (slow[1].content_type, slow[1].message_id)
    assert len(cache) == (0 if other_header else 1)


def test_a_delivery_without_an_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="without an integer x-stream-offset"):
        stream_offset(Delivery(1, False, "", "k", BasicProperties(message_id="m").encode(), b"", 0), {})
