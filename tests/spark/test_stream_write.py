"""Idempotent writes to streams and super streams (`option("stream" | "superStream", ...)`) over the stream
protocol, against a real hutch process.

What is proven here: a batch write stores every row once; the same write again (what a task Spark re-runs
sends: same publisher reference, same publishing ids) stores nothing more, while a write with another
`writeId` is new data; a streaming write whose micro-batch fails after part of it was published, then is
replayed from the checkpoint, ends with each row once; a super stream write routes each row by the RabbitMQ
clients' murmur3 hash of its key; and the errors a user meets (missing stream, no key column).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo
from hutch.spark.routing import partition_of

from .helpers import Broker, amqp_uri, declare_super_stream, stream_messages, unique


@pytest.fixture
def sbroker(stream_server: ServerInfo) -> Any:
    b = Broker(stream_server.amqp_port)
    yield b
    b.close()


def _declare_stream(broker: Broker) -> str:
    name = unique("sw")
    broker.ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    return name


def _writer(df: Any, server: ServerInfo, **options: Any) -> Any:
    w = df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port)) \
        .option("streamPort", str(server.ports["stream"]))
    for k, v in options.items():
        w = w.option(k, str(v))
    return w


def test_batch_write_is_idempotent_per_write_id(spark: Any, stream_server: ServerInfo, sbroker: Broker) -> None:
    stream = _declare_stream(sbroker)
    n = 3000
    df = spark.range(0, n, numPartitions=3).selectExpr(
        "concat('row-', cast(id as string)) as value", "map('n', cast(id as string)) as headers")
    _writer(df, stream_server, stream=stream, writeId="w1").save()
    got = stream_messages(stream_server.amqp_port, stream, n)
    assert sorted(b.decode() for _, b in got) == sorted(f"row-{i}" for i in range(n))
    props = got[0][0]
    assert props.headers["n"] == got[0][1].decode().split("-")[1] and props.delivery_mode == 2
    assert {p.message_id.rsplit(":", 2)[0] for p, _ in got} == {"w1:0"}
    # The same write again - every task re-run with the same reference and ids: the broker stores nothing.
    _writer(df, stream_server, stream=stream, writeId="w1").save()
    assert len(stream_messages(stream_server.amqp_port, stream, n)) == n
    # Another writeId is another write.
    _writer(df.limit(10), stream_server, stream=stream, writeId="w2").save()
    assert len(stream_messages(stream_server.amqp_port, stream, n + 10)) == n + 10


@pytest.mark.slow  # ~40 s (its 4,000-row batch run twice); `make test` keeps the batch write replayed by write id
def test_replayed_micro_batch_after_a_failure_mid_publish_is_stored_once(
        spark: Any, stream_server: ServerInfo, sbroker: Broker, tmp_path: Path) -> None:
    src, dst = _declare_stream(sbroker), _declare_stream(sbroker)
    n = 4000
    sbroker.publish(src, n)
    marker = tmp_path / "failed-once"
    fail_at = "m0002500"

    from pyspark.sql.functions import udf

    @udf("string")
    def fail_once(value: str) -> str:
        # The first time, row 2500 is too large for a frame: the sink's task fails there, after it
        # published the rows of the chunks before it; the query stops with the batch not committed.
        if value == fail_at and not marker.exists():
            marker.write_text("x")
            return "x" * 2_000_000
        return value

    def run() -> Exception | None:
        df = (spark.readStream.format("hutch").option("uri", amqp_uri(stream_server.amqp_port))
              .option("stream", src).option("streamPort", str(stream_server.ports["stream"]))
              .option("startingOffsets", "earliest").load()
              .selectExpr("cast(value as string) as value").select(fail_once("value").alias("value"))
              .coalesce(1))
        query = (df.writeStream.format("hutch").option("uri", amqp_uri(stream_server.amqp_port))
                 .option("streamPort", str(stream_server.ports["stream"])).option("stream", dst)
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        try:
            query.awaitTermination(180)
        except Exception as exc:  # noqa: BLE001 - the query's failure is what this run returns
            return exc
        return query.exception()

    failure = run()
    assert failure is not None and "frame_max" in str(failure) and marker.exists()
    partial = stream_messages(stream_server.amqp_port, dst, 1, timeout=30)
    assert 0 < len(partial) < n  # the failed batch left part of its rows in the stream
    assert run() is None
    got = stream_messages(stream_server.amqp_port, dst, n)
    assert Counter(b.decode() for _, b in got) == Counter(f"m{i:07d}" for i in range(n))


def test_super_stream_write_routes_by_murmur3_of_the_key(spark: Any, stream_server: ServerInfo,
                                                         sbroker: Broker) -> None:
    name = unique("ss")
    streams = declare_super_stream(sbroker, name, 4)
    n = 2000
    df = spark.range(0, n, numPartitions=2).selectExpr(
        "concat('customer-', cast(id % 97 as string)) as key", "cast(id as string) as value")
    _writer(df, stream_server, superStream=name, writeId="ss1").save()
    _writer(df, stream_server, superStream=name, writeId="ss1").save()  # a re-run: deduplicated
    expected: dict[int, list[str]] = {i: [] for i in range(4)}
    for i in range(n):
        expected[partition_of(f"customer-{i % 97}", 4)].append(str(i))
    total = 0
    for index, stream in enumerate(streams):
        got = stream_messages(stream_server.amqp_port, stream, len(expected[index]))
        assert sorted(b.decode() for _, b in got) == sorted(expected[index])
        total += len(got)
    assert total == n and all(expected.values())


def test_errors_name_the_problem(spark: Any, stream_server: ServerInfo, sbroker: Broker) -> None:
    df = spark.createDataFrame([("a", "1")], "key string, value string")
    with pytest.raises(Exception, match="does not exist"):
        _writer(df, stream_server, stream=unique("missing")).save()
    with pytest.raises(Exception, match="routes each row by its 'key' column"):
        _writer(df.select("value"), stream_server, superStream="any").save()
    with pytest.raises(Exception, match="exclude each other"):
        _writer(df, stream_server, stream="a", superStream="b").save()
    with pytest.raises(Exception, match="are for writes to an exchange"):
        _writer(df, stream_server, stream="a", exchange="x").save()
