"""Reads of a super stream (`option("superStream", ...)`) against a real hutch process: every partition
read by offset in parallel, exactly-once through Spark's checkpoint, with the partition index in the
`partition` column and the partition stream's name in `stream`, by the Python source and by the JVM
reader alike (`fmt`: the same tests as `format("hutch-python")` and as `format("hutch")`, the JVM
reader); (slow) the node killed during a super
stream -> stream query, which resumes from its checkpoint with every message once in the destination."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo, start_server

from .helpers import (
    JVM_NOW_PYTHON_SLOW,
    Broker,
    amqp_uri,
    declare_super_stream,
    hutch_load,
    run_available_now,
    stream_messages,
    unique,
    wait_for,
)

SIZES = (300, 0, 450, 150)  # messages per partition; partition 1 stays empty


@pytest.fixture
def sbroker(stream_server: ServerInfo) -> Any:
    b = Broker(stream_server.amqp_port)
    yield b
    b.close()


@pytest.fixture
def fmt(stream_format: str) -> str:
    """The format that reads: "hutch" (the JVM reader, as `register` sets up a session with its jar) or
    "hutch-python" (the Python source); conftest's `stream_format`."""
    return stream_format


def _reader(reader: Any, server: ServerInfo, name: str, fmt: str = "hutch", **options: Any) -> Any:
    return hutch_load(reader, server.amqp_port, superStream=name, streamPort=server.ports["stream"], fmt=fmt,
                      **options)


@pytest.mark.timeout(300)  # with the Spark session's start when it runs first
@JVM_NOW_PYTHON_SLOW
def test_streaming_read_of_a_super_stream_is_exactly_once_per_partition(
        spark: Any, stream_server: ServerInfo, sbroker: Broker, tmp_path: Path, fmt: str) -> None:
    name = unique("ssr")
    streams = declare_super_stream(sbroker, name, 4)
    for stream, n in zip(streams, SIZES, strict=True):
        sbroker.publish(stream, n)
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = _reader(spark.readStream, stream_server, name, fmt, startingOffsets="earliest", maxOffsetsPerTrigger=400,
                 minPartitions=4)
    run_available_now(df, out, ck)
    rows = spark.read.parquet(str(out)).select("partition", "stream", "offset", "key").collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        sorted((p, o) for p, n in enumerate(SIZES) for o in range(n))
    assert {(r.partition, r.stream) for r in rows} == {(p, streams[p]) for p, n in enumerate(SIZES) if n}
    # More in two partitions, the same checkpoint: only the new offsets.
    sbroker.publish(streams[1], 100, start=0)
    sbroker.publish(streams[3], 50, start=150)
    run_available_now(_reader(spark.readStream, stream_server, name, fmt, startingOffsets="earliest"), out, ck)
    rows = spark.read.parquet(str(out)).select("partition", "offset").collect()
    sizes = (300, 100, 450, 200)
    assert sorted((r.partition, r.offset) for r in rows) == \
        sorted((p, o) for p, n in enumerate(sizes) for o in range(n))


def test_batch_read_of_a_super_stream_by_offsets_per_partition(
        spark: Any, stream_server: ServerInfo, sbroker: Broker, fmt: str) -> None:
    name = unique("ssb")
    streams = declare_super_stream(sbroker, name, 4)
    for stream, n in zip(streams, SIZES, strict=True):
        sbroker.publish(stream, n)
    everything = _reader(spark.read, stream_server, name, fmt).select("partition", "offset").collect()
    assert len(everything) == sum(SIZES)
    df = _reader(spark.read, stream_server, name, fmt, minPartitions=6,
                 startingOffsets=json.dumps({name: {"0": 100, "2": -2}}),
                 endingOffsets=json.dumps({name: {"0": 200, "2": 10, "3": -1}}))
    assert df.rdd.getNumPartitions() >= 2
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    # partition 3 is not named in startingOffsets: it starts at earliest (the batch default)
    assert got == sorted([(0, o) for o in range(100, 200)] + [(2, o) for o in range(10)] +
                         [(3, o) for o in range(150)])


def test_a_missing_super_stream_fails_clearly(spark: Any, stream_server: ServerInfo, fmt: str) -> None:
    with pytest.raises(Exception, match="does not exist"):
        _reader(spark.read, stream_server, unique("nope"), fmt).collect()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_node_killed_during_a_super_stream_to_stream_query_then_resumed_exactly_once(
        spark: Any, tmp_path: Path) -> None:
    """Super stream -> Spark -> stream, the node SIGKILLed after the first micro-batch committed and
    started again (new ports): the query fails clearly; restarted from its checkpoint it ends with every
    message once in the destination stream (the replayed batch's writes deduplicated by the broker)."""
    node_dir = tmp_path / "node"
    node = start_server(node_dir, "--stream-port", "0")
    try:
        name, dst = unique("ssk"), unique("dst")
        b = Broker(node.amqp_port)
        streams = declare_super_stream(b, name, 2)
        b.ch.queue_declare(dst, durable=True, arguments={"x-queue-type": "stream"})
        for i, stream in enumerate(streams):
            b.publish(stream, 600, start=i * 600)
        b.close()

        def start(server: ServerInfo, available_now: bool) -> Any:
            df = _reader(spark.readStream, server, name, startingOffsets="earliest", maxOffsetsPerTrigger=300)
            w = (df.select("value").writeStream.format("hutch").option("uri", amqp_uri(server.amqp_port))
                 .option("streamPort", str(server.ports["stream"])).option("stream", dst)
                 .option("checkpointLocation", str(tmp_path / "ck")))
            return (w.trigger(availableNow=True) if available_now
                    else w.trigger(processingTime="300 milliseconds")).start()

        query = start(node, False)
        assert wait_for((tmp_path / "ck" / "commits" / "0").exists, 180), "no micro-batch committed"
        node.stop(signal.SIGKILL)
        node = start_server(node_dir, "--stream-port", "0")  # back, on new ports
        with pytest.raises(Exception, match="hutch"):
            query.awaitTermination(120)
        query.stop()
        query = start(node, True)
        assert query.awaitTermination(300)
        assert query.exception() is None
        got = stream_messages(node.amqp_port, dst, 1200)
        assert Counter(body.decode() for _, body in got) == Counter(f"m{i:07d}" for i in range(1200))
    finally:
        node.stop()
