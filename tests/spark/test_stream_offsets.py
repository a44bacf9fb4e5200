"""Reads of a hutch *stream* by offset (`option("stream", ...)`) against a real hutch process.

What is proven here: a streaming query reads N messages into a memory sink as exactly N rows with the
offsets 0..N-1, in micro-batches bounded by `maxOffsetsPerTrigger` and split over `minPartitions` tasks;
a query restarted from its checkpoint continues exactly where it was (no duplicates, nothing lost), also
after a sink failure in the middle of a batch and after the node restarted during the query;
`startingOffsets` (earliest, latest, an offset) and `startingTimestamp`; batch reads of an offset range;
offsets past retention fail the query (`failOnDataLoss=true`) or are skipped (`false`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
import pytest

from conftest import ServerInfo, start_server

from .helpers import (
    JVM_NOW_PYTHON_SLOW,
    Broker,
    amqp_uri,
    offsets_after_a_node_kill,
    run_available_now,
    starting_position_offsets,
    unique,
)


@pytest.fixture
def stream(broker: Broker) -> str:
    name = unique("st")
    broker.ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    return name


def _read_stream(spark: Any, node: ServerInfo, name: str, fmt: str = "hutch", **options: Any) -> Any:
    reader = (spark.readStream.format(fmt).option("uri", amqp_uri(node.amqp_port)).option("stream", name)
              .option("streamPort", node.ports["stream"]))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _read_batch(spark: Any, node: ServerInfo, name: str, fmt: str = "hutch", **options: Any) -> Any:
    reader = (spark.read.format(fmt).option("uri", amqp_uri(node.amqp_port)).option("stream", name)
              .option("streamPort", node.ports["stream"]))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _rows(spark: Any, out: Path) -> Any:
    return spark.read.parquet(str(out)) if any(out.glob("*.parquet")) else None


def _offsets(spark: Any, out: Path) -> list[int]:
    df = _rows(spark, out)
    return [] if df is None else sorted(r.offset for r in df.select("offset").collect())


@JVM_NOW_PYTHON_SLOW  # 13-14 s a reader; the Python source's streaming reads stay in test_jvm_reader and below
def test_streaming_read_gives_each_offset_once_with_kafka_columns(spark: Any, server: ServerInfo,
                                                                  broker: Broker, stream: str,
                                                                  tmp_path: Path, stream_format: str) -> None:
    n = 1200
    bodies = broker.publish(stream, n)
    out = tmp_path / "out"
    df = _read_stream(spark, server, stream, stream_format, startingOffsets="earliest", maxOffsetsPerTrigger=500,
                      minPartitions=2)
    run_available_now(df, out, tmp_path / "ck")
    rows = _rows(spark, out).selectExpr("key", "cast(value as string) v", "stream", "partition", "offset",
                                        "properties.message_id mid", "headers").collect()
    assert sorted(r.offset for r in rows) == list(range(n))
    assert {r.v for r in rows} == set(bodies)
    assert {(r.key, r.stream, r.partition) for r in rows} == {(stream, stream, 0)}
    assert all(r.mid == str(r.offset) for r in rows)
    assert all("x-stream-offset" not in (r.headers or {}) for r in rows)
    batches = sorted((tmp_path / "ck" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(batches) == 3  # 500 + 500 + 200
    # the checkpoint's offset as the Python source writes it (json.dumps), whichever path wrote it
    assert batches[-1].read_text().splitlines()[-1] == f'{{"stream": "{stream}", "offset": {n}}}'
    # More data, same checkpoint: the restarted query reads only the new offsets.
    broker.publish(stream, 300, start=n)
    run_available_now(_read_stream(spark, server, stream, stream_format, startingOffsets="earliest"), out,
                       tmp_path / "ck")
    assert _offsets(spark, out) == list(range(n + 300))


@JVM_NOW_PYTHON_SLOW
def test_sink_failure_then_restart_reads_exactly_once(spark: Any, server: ServerInfo, broker: Broker,
                                                      stream: str, tmp_path: Path, stream_format: str) -> None:
    n = 1000
    broker.publish(stream, n)
    out = tmp_path / "out"
    out.mkdir()
    failed = []

    def write(df: Any, batch_id: int) -> None:
        offsets = [r.offset for r in df.select("offset").collect()]
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the sink fails in the middle of batch 1")
        (out / f"batch-{batch_id}.txt").write_text("".join(f"{o}\n" for o in offsets))

    def run() -> Any:
        df = _read_stream(spark, server, stream, stream_format, startingOffsets="earliest", maxOffsetsPerTrigger=300)
        q = (df.writeStream.foreachBatch(write).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(180)
        except Exception as exc:  # noqa: BLE001 - the query's failure is what this run returns
            return exc
        return q.exception()

    assert run() is not None and failed == [1]
    assert run() is None
    seen = [int(x) for f in out.glob("batch-*.txt") for x in f.read_text().split()]
    assert sorted(seen) == list(range(n))  # each offset once, none lost


@JVM_NOW_PYTHON_SLOW
def test_starting_positions(spark: Any, server: ServerInfo, broker: Broker, stream: str,
                            tmp_path: Path, stream_format: str) -> None:
    got = starting_position_offsets(spark, broker, stream, tmp_path,
                                    lambda **opts: _read_stream(spark, server, stream, stream_format, **opts))
    assert got["offset"] == list(range(120, 150))
    assert got["ts"] == list(range(100, 150))
    assert got["latest"] == []


@JVM_NOW_PYTHON_SLOW
def test_batch_read_of_an_offset_range_in_parallel(spark: Any, server: ServerInfo, broker: Broker,
                                                   stream: str, stream_format: str) -> None:
    broker.publish(stream, 500)
    df = _read_batch(spark, server, stream, stream_format, startingOffsets='{"0": 100}',
                     endingOffsets='{"0": 400}', minPartitions=3)
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(100, 400))
    everything = _read_batch(spark, server, stream, stream_format)
    assert everything.count() == 500 and everything.select("offset").distinct().count() == 500


def test_a_queue_name_with_the_stream_option_is_refused(spark: Any, server: ServerInfo, broker: Broker, stream_format: str) -> None:
    q = broker.declare()
    with pytest.raises(Exception, match="is not a stream"):
        _read_batch(spark, server, q, stream_format).collect()
    with pytest.raises(Exception, match="does not exist"):
        _read_batch(spark, server, unique("missing"), stream_format).collect()


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("hutch-st"), "--stream-port", "0")
    yield info
    info.stop()


def _publish(port: int, name: str, n: int, start: int = 0, body_size: int = 0,
             arguments: dict[str, Any] | None = None) -> None:
    b = Broker(port)
    try:
        if arguments is not None:
            b.ch.queue_declare(name, durable=True, arguments=arguments)
        b.publish(name, n, start=start, body_size=body_size)
    finally:
        b.close()


def test_node_killed_during_the_query_then_resume_exactly_once(spark: Any, tmp_path: Path) -> None:
    # the Python source (the JVM reader's: test_jvm_reader.py, slow)
    read = lambda node, name, **opts: _read_stream(spark, node, name, "hutch-python", **opts)  # noqa: E731
    assert offsets_after_a_node_kill(spark, tmp_path, read, "hutch source") == list(range(1000))


@pytest.mark.slow  # 17-21 s; `make test` keeps the same retention failure and skip without Spark (below)
def test_offsets_past_retention_fail_or_are_skipped(spark: Any, own_server: ServerInfo, tmp_path: Path) -> None:
    name = unique("st")
    args = {"x-queue-type": "stream", "x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 5_000}
    port = own_server.amqp_port
    _publish(port, name, 20, body_size=100, arguments=args)
    out = tmp_path / "out"
    run_available_now(_read_stream(spark, own_server, name, startingOffsets="earliest"), out, tmp_path / "ck")
    assert _offsets(spark, out) == list(range(20))
    for i in range(20, 2000, 20):  # many chunks and segments: retention removes the oldest
        _publish(port, name, 20, start=i, body_size=100)
    first = _read_batch(spark, own_server, name).agg({"offset": "min"}).collect()[0][0]
    assert first > 20
    with pytest.raises(Exception, match="no longer in the stream"):
        run_available_now(_read_stream(spark, own_server, name), out, tmp_path / "ck")
    run_available_now(_read_stream(spark, own_server, name, failOnDataLoss="false"), out, tmp_path / "ck")
    got = _offsets(spark, out)
    assert got[:20] == list(range(20)) and got[20] >= first  # retention may have moved on since
    assert got[20:] == list(range(got[20], 2000))


def test_the_row_timestamp_is_the_publishers(spark: Any, server: ServerInfo, broker: Broker, stream: str, stream_format: str) -> None:
    broker.ch.basic_publish("", stream, b"x", pika.BasicProperties(timestamp=1_700_000_000))
    broker.ch.basic_publish("", stream, b"y")
    rows = _read_batch(spark, server, stream, stream_format).orderBy("offset").collect()
    assert [r.value for r in rows] == [b"x", b"y"]
    assert rows[0].timestamp.timestamp() == 1_700_000_000 and rows[1].timestamp is None


def test_a_read_task_whose_range_retention_removed_after_planning(own_server: ServerInfo) -> None:
    """No Spark session: a range planned from offset 0, then retention removes its start before the
    task reads it."""
    from hutch.spark.options import stream_read_options
    from hutch.spark.stream_source import HutchStreamReadError, StreamRange, read_range

    name = unique("st")
    port = own_server.amqp_port
    _publish(port, name, 20, body_size=100, arguments={"x-queue-type": "stream", "x-max-length-bytes": 20_000,
                                                       "x-stream-max-segment-size-bytes": 5_000})
    for i in range(20, 2000, 20):
        _publish(port, name, 20, start=i, body_size=100)
    part = StreamRange(0, 0, 2000)
    sport = str(own_server.ports["stream"])
    with pytest.raises(HutchStreamReadError, match="offsets 0 to .* are no longer in the stream"):
        list(read_range(stream_read_options({"uri": amqp_uri(port), "stream": name, "streamPort": sport}, True),
                        part))
    lenient = stream_read_options({"uri": amqp_uri(port), "stream": name, "failOnDataLoss": "false",
                                   "streamPort": sport}, True)
    offsets = [o for rb in read_range(lenient, part) for o in rb.column("offset").to_pylist()]
    assert offsets and offsets[0] > 20 and offsets == list(range(offsets[0], 2000))


def test_the_end_probe_is_exact(server: ServerInfo, broker: Broker, stream: str) -> None:
    """No Spark session: the driver's end probe (what Trigger.AvailableNow reads up to) is one past the
    last committed message, whatever the last chunk holds: here chunks of 5,000 messages, sent as whole
    frames (an AMQP probe that waited 50 ms for the rest of the last chunk once ended an AvailableNow read
    at 59,256 of 60,000 rows under load). With nothing listening on streamPort the probe fails clearly."""
    from conftest import free_port
    from hutch.amqp.spec import BasicProperties
    from hutch.amqp.uri import parse_uri
    from hutch.core.message import Message
    from hutch.queues.stream.amqp10 import from_091
    from hutch.spark.options import stream_read_options
    from hutch.spark.stream_source import HutchStreamReadError, Probe
    from hutch.spark.streamclient import StreamClient

    def probe(stream_port: int) -> Probe:
        return Probe(stream_read_options({"uri": amqp_uri(server.amqp_port), "stream": stream,
                                          "streamPort": str(stream_port)}, True))

    assert probe(server.ports["stream"]).end() is None  # empty
    client = StreamClient(parse_uri(amqp_uri(server.ports["stream"]))).connect()
    try:
        client.declare_publisher(1, "", stream)
        sent = 0
        for _ in range(4):
            body = [(sent + i, from_091(Message("", stream, BasicProperties(), b"m%07d" % (sent + i))))
                    for i in range(5000)]
            client.publish(1, body)
            sent += len(body)
            client.wait_confirms(0)
            assert probe(server.ports["stream"]).end() == sent
    finally:
        client.close()
    broker.publish(stream, 3, start=sent)  # and small chunks from AMQP after them
    assert probe(server.ports["stream"]).end() == sent + 3
    assert probe(server.ports["stream"]).first() == 0
    with pytest.raises(HutchStreamReadError, match="is the stream protocol listener on"):
        probe(free_port()).end()


def test_connections_are_kept_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    """No Spark session: probes and read tasks in one process take their stream-protocol connections from
    the process's pool, so a second round opens none; when the node dies the kept connections are found
    dead (closed, never handed out: the probe fails on connecting), and after it restarts (same data, new
    ports) everything works on new ones."""
    from hutch.spark.options import stream_read_options
    from hutch.spark.pool import POOL
    from hutch.spark.stream_source import HutchStreamReadError, Probe, StreamRange, read_range

    node_dir = tmp_path / "node"
    node = start_server(node_dir, "--stream-port", "0")
    try:
        name = unique("st")
        _publish(node.amqp_port, name, 300, arguments={"x-queue-type": "stream"})

        def options(n: ServerInfo) -> Any:
            return stream_read_options({"uri": amqp_uri(n.amqp_port), "stream": name,
                                        "streamPort": str(n.ports["stream"])}, True)

        def one_round(n: ServerInfo) -> list[int]:
            opts = options(n)
            assert Probe(opts).end() == 300 and Probe(opts).first() == 0
            return [o for rb in read_range(opts, StreamRange(0, 10, 250)) for o in rb.column("offset").to_pylist()]

        assert one_round(node) == list(range(10, 250))
        opened = POOL.opened
        assert one_round(node) == list(range(10, 250)) and POOL.opened == opened  # all reused
        key = replace(options(node).uri, port=node.ports["stream"])
        assert POOL.idle(key) >= 1
        node.stop(signal.SIGKILL)
        with pytest.raises(HutchStreamReadError, match="cannot connect"):
            Probe(options(node)).end()
        assert POOL.idle(key) == 0
        node = start_server(node_dir, "--stream-port", "0")
        assert one_round(node) == list(range(10, 250))
    finally:
        node.stop()
        POOL.close()
