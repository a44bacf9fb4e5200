"""Options of a read of a stream, the planning of offset ranges, a read task's credit and the decoding
of stored records into rows (pure: no Spark session, no broker)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.queues.stream.amqp10 import from_091
from hutch.spark.options import HutchOptionError, Position, duration_ms, stream_read_options
from hutch.spark.records import stream_records_batch
from hutch.spark.stream_source import admit, credit_chunks, split_range
from hutch.spark.streamclient import MAX_CREDIT

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


@settings(deadline=None)  # the first example imports pyarrow
@given(st.integers(0, 2**40), _text, _text, _text, st.one_of(st.none(), st.sampled_from([1, 2])),
       st.one_of(st.none(), st.integers(0, 2**31)), st.dictionaries(st.text(min_size=1, max_size=8).filter(
           lambda k: not k.startswith("x-")), st.one_of(st.text(max_size=8), st.integers(-5, 5)), max_size=3),
       st.binary(max_size=300), st.text(max_size=12))
def test_stored_records_become_the_rows_a_0_9_1_publish_gives(
        offset: int, content_type: str | None, message_id: str | None, app_id: str | None, mode: int | None,
        timestamp: int | None, headers: dict[str, object], body: bytes, key: str) -> None:
    """A message published over AMQP 0-9-1 and stored as RabbitMQ stores it (AMQP 1.0) reads back, through
    the read tasks' decoder, with the key, body, exchange, properties and headers it was published with."""
    props = BasicProperties(content_type=content_type, message_id=message_id, app_id=app_id, delivery_mode=mode,
                            timestamp=timestamp, headers=headers or None)
    record = from_091(Message("ex", key, props, body))
    batch = stream_records_batch([(offset, record), (offset + 1, from_091(Message("", "k2", BasicProperties(), b"")))],
                                 "s", True, 3)
    row, plain = batch.to_pylist()
    assert (row["key"], row["value"], row["exchange"], row["offset"], row["partition"], row["stream"]) == \
        (key, body, "ex", offset, 3, "s")
    p = row["properties"]
    assert (p["content_type"], p["message_id"], p["app_id"], p["delivery_mode"]) == \
        (content_type, message_id, app_id, mode)
    assert (row["timestamp"] is None) == (timestamp is None)
    if timestamp is not None:
        assert int(row["timestamp"].timestamp()) == timestamp == int(p["timestamp"].timestamp())
    assert dict(row["headers"] or []) == {k: v if isinstance(v, str) else str(v) for k, v in headers.items()}
    assert (plain["key"], plain["value"], plain["offset"], plain["headers"]) == ("k2", b"", offset + 1, None)
    assert plain["properties"] is not None and plain["properties"]["delivery_mode"] is None


def test_a_record_that_is_not_an_amqp_1_0_message_is_kept_as_bytes() -> None:
    row = stream_records_batch([(7, b"\xffraw")], "s", True).to_pylist()[0]
    assert (row["value"], row["key"], row["properties"], row["offset"]) == (b"\xffraw", None, None, 7)


def test_read_credit_is_bounded() -> None:
    assert credit_chunks(1) == 2 and credit_chunks(20_000) == 5 and credit_chunks(10**9) == MAX_CREDIT


