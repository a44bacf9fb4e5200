"""Reads of a super stream (`option("superStream", ...)`) against a real hutch process: every partition
read by offset in parallel, exactly-once through Spark's checkpoint, with the partition index in the
`partition` column and the partition stream's name in `stream`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo

from .helpers import Broker, declare_super_stream, hutch_load, unique

SIZES = (300, 0, 450, 150)  # messages per partition; partition 1 stays empty


@pytest.fixture
def sbroker(stream_server: ServerInfo) -> Any:
    b = Broker(stream_server.amqp_port)
    yield b
    b.close()


def _reader(reader: Any, server: ServerInfo, name: str, **options: Any) -> Any:
    return hutch_load(reader, server.amqp_port, superStream=name, streamPort=server.ports["stream"], **options)


def _run_available_now(df: Any, out: Path, ck: Path) -> None:
    query = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise query.exception()


def test_streaming_read_of_a_super_stream_is_exactly_once_per_partition(
        spark: Any, stream_server: ServerInfo, sbroker: Broker, tmp_path: Path) -> None:
    name = unique("ssr")
    streams = declare_super_stream(sbroker, name, 4)
    for stream, n in zip(streams, SIZES, strict=True):
        sbroker.publish(stream, n)
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = _reader(spark.readStream, stream_server, name, startingOffsets="earliest", maxOffsetsPerTrigger=400,
                 minPartitions=4)
    _run_available_now(df, out, ck)
    rows = spark.read.parquet(str(out)).select("partition", "stream", "offset", "key").collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        sorted((p, o) for p, n in enumerate(SIZES) for o in range(n))
    assert {(r.partition, r.stream) for r in rows} == {(p, streams[p]) for p, n in enumerate(SIZES) if n}
    # More in two partitions, the same checkpoint: only the new offsets.
    sbroker.publish(streams[1], 100, start=0)
    sbroker.publish(streams[3], 50, start=150)
    _run_available_now(_reader(spark.readStream, stream_server, name, startingOffsets="earliest"), out, ck)
    rows = spark.read.parquet(str(out)).select("partition", "offset").collect()
    sizes = (300, 100, 450, 200)
    assert sorted((r.partition, r.offset) for r in rows) == \
        sorted((p, o) for p, n in enumerate(sizes) for o in range(n))


def test_batch_read_of_a_super_stream_by_offsets_per_partition(
        spark: Any, stream_server: ServerInfo, sbroker: Broker) -> None:
    name = unique("ssb")
    streams = declare_super_stream(sbroker, name, 4)
    for stream, n in zip(streams, SIZES, strict=True):
        sbroker.publish(stream, n)
    everything = _reader(spark.read, stream_server, name).select("partition", "offset").collect()
    assert len(everything) == sum(SIZES)
    df = _reader(spark.read, stream_server, name, minPartitions=6,
                 startingOffsets=json.dumps({name: {"0": 100, "2": -2}}),
                 endingOffsets=json.dumps({name: {"0": 200, "2": 10, "3": -1}}))
    assert df.rdd.getNumPartitions() >= 2
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    # partition 3 is not named in startingOffsets: it starts at earliest (the batch default)
    assert got == sorted([(0, o) for o in range(100, 200)] + [(2, o) for o in range(10)] +
                         [(3, o) for o in range(150)])


def test_a_missing_super_stream_fails_clearly(spark: Any, stream_server: ServerInfo) -> None:
    with pytest.raises(Exception, match="does not exist"):
        _reader(spark.read, stream_server, unique("nope")).collect()
