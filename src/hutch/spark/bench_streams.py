"""The streams part of the Spark connector's benchmark (`python -m hutch.spark.bench --super-streams`).

Owns: the measurements docs/BENCHMARKS.md records for streams, each the best of --repeat rounds:
- super stream -> memory sink and -> Parquet with 1, 2 and 4 partitions (a super stream of that many
  partitions, `minPartitions` = partitions), Trigger.AvailableNow;
- Spark's own cost of the same pipeline: the in-memory `rate-micro-batch` source shaped into the stream
  read's schema (same columns, same body size, same rows per batch and partitions) into the same sink;
- the floor of a Python data source (`floor_rate`, bench_floor.py: ready-made Arrow batches, no broker);
- DataFrame -> stream and DataFrame -> super stream (4 partitions), idempotent stream sink, beside the
  same rows into Spark's `noop` sink (Spark alone) and into a Python sink that drops them (the floor of a
  Python data source write);
and `pipeline_rate`, the rate over the time Spark spent in triggers (`triggerExecution`), so that start-up
is left out of every figure alike and the connector's share is (1/connector - 1/rate source) / (1/connector).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .client import AmqpClient
from .options import parse_uri
from .streamclient import StreamClient


def pipeline_rate(progress: list[dict[str, Any]]) -> tuple[float, int]:
    """(rows per second of trigger time, rows) over a query's progress reports."""
    rows = sum(p["numInputRows"] for p in progress)
    took_ms = sum((p.get("durationMs") or {}).get("triggerExecution", 0) for p in progress)
    return (rows * 1000 / took_ms if took_ms else 0.0), rows


def connector_share(pipeline_rate: float, spark_rate: float) -> float:
    """The connector's share of a pipeline's time per row: (1/pipeline - 1/Spark alone) / (1/pipeline)."""
    if not pipeline_rate or not spark_rate:
        return float("nan")
    return (1 / pipeline_rate - 1 / spark_rate) / (1 / pipeline_rate)


def create_super_stream(stream_uri: Any, name: str, partitions: int) -> None:
    client = StreamClient(stream_uri, "hutch-spark bench").connect()
    try:
        client.create_super_stream(name, [f"{name}-{i}" for i in range(partitions)],
                                   [str(i) for i in range(partitions)])
    finally:
        client.close()


def _timed_write(spark: Any, n: int, size: int, save: Callable[[Any], None]) -> float:
    """Rows per second of `save(df)` over n cached (key, value) rows in 2 Spark partitions, timed end
    to end (the caching left out)."""
    from pyspark.sql import functions as F

    df = spark.range(0, n, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        F.rpad(F.col("id").cast("string"), size, "x").alias("value")).cache()
    df.count()
    t = time.perf_counter()
    save(df)
    took = time.perf_counter() - t
    df.unpersist()
    return n / took


def write_stream_rate(spark: Any, uri: str, stream_port: int, target: str, n: int, size: int,
                      super_stream: bool) -> float:
    """DataFrame -> stream (or super stream)."""
    return _timed_write(spark, n, size, lambda df: df.write.format("hutch").mode("append").option("uri", uri)
                        .option("streamPort", str(stream_port))
                        .option("superStream" if super_stream else "stream", target).save())


def noop_write_rate(spark: Any, n: int, size: int) -> float:
    """Spark alone for the write: the same rows into Spark's `noop` sink (which runs the job and drops
    the rows): what any sink costs before it does anything."""
    return _timed_write(spark, n, size, lambda df: df.write.format("noop").mode("overwrite").save())


def python_noop_write_rate(spark: Any, n: int, size: int) -> float:
    """The floor of a Python data source write: the same rows into a Python sink whose tasks drop their
    Arrow batches (bench_floor.py's `hutch-floor` writer)."""
    from .bench_floor import FloorDataSource

    spark.dataSource.register(FloorDataSource)
    return _timed_write(spark, n, size, lambda df: df.write.format("hutch-floor").mode("append").save())


def _sink(df: Any, sink: str, work: Path) -> Any:
    w = df.writeStream.option("checkpointLocation", str(work / f"ck-{time.monotonic_ns()}"))
    if sink == "memory":
        return w.format("memory").queryName(f"bench_{time.monotonic_ns()}")
    return w.format("parquet").option("path", str(work / f"out-{time.monotonic_ns()}"))


def forget(spark: Any, q: Any) -> None:
    """Drop a finished memory-sink query's table: a sitting runs dozens of queries of 200,000 rows each, and
    the tables they keep filled the driver's heap (an OutOfMemoryError in the fourth pass's first run)."""
    if q.name:
        spark.catalog.dropTempView(q.name)


def _available_now_rate(df: Any, sink: str, work: Path) -> tuple[float, int]:
    q = _sink(df, sink, work).trigger(availableNow=True).start()
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    forget(df.sparkSession, q)
    return pipeline_rate(q.recentProgress)


def super_stream_read_rate(spark: Any, uri: str, stream_port: int, name: str, partitions: int, sink: str,
                           work: Path, per_trigger: int) -> tuple[float, int]:
    df = (spark.readStream.format("hutch").option("uri", uri).option("superStream", name)
          .option("streamPort", str(stream_port)).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", str(per_trigger)).option("minPartitions", str(partitions)).load())
    return _available_now_rate(df, sink, work)


def rate_source_rate(spark: Any, n: int, size: int, partitions: int, sink: str, work: Path,
                     per_trigger: int, like_stream: str = "") -> tuple[float, int]:
    """Spark alone: `rate-micro-batch` rows shaped as a stream read (the same columns and body size), the
    same rows per batch and partitions, into the same sink, until n rows went through. With `like_stream`
    (the name of the stream `--streams` fills), the rows are also the same values as that stream's: `key`
    and `stream` its name, `exchange` "", no timestamp, and a `properties` struct with delivery_mode 2
    (the others null), where the plain shaping leaves `exchange` and `properties` null (a null struct is
    cheaper for Spark to carry than one with 13 fields)."""
    from pyspark.sql import functions as F

    from .schema import PROPERTIES_TYPE, STREAM_SCHEMA

    raw = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(per_trigger))
           .option("numPartitions", str(partitions)).load())
    exprs = {
        "key": F.col("value").cast("string"),
        "value": F.rpad(F.col("value").cast("string"), size, "x").cast("binary"),
        "stream": F.lit("rate"),
        "partition": (F.col("value") % partitions).cast("int"),
        "offset": F.col("value"),
        "timestamp": F.col("timestamp"),
    }
    if like_stream:
        exprs.update({
            "key": F.lit(like_stream), "stream": F.lit(like_stream), "exchange": F.lit(""),
            "timestamp": F.lit(None).cast("timestamp"),
            "properties": F.struct(*[(F.lit(2) if f.name == "delivery_mode" else F.lit(None)).cast(f.dataType)
                                     .alias(f.name) for f in PROPERTIES_TYPE.fields]),
        })
    df = raw.select(*[exprs.get(f.name, F.lit(None).cast(f.dataType)).alias(f.name) for f in STREAM_SCHEMA.fields])
    # a trigger a second (the rate is per second of trigger time, so the idle time between does not
    # count), stopped between two triggers: stopping one mid-batch fills stderr with cancelled tasks
    q = _sink(df, sink, work).trigger(processingTime="1 second").start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and sum(p["numInputRows"] for p in q.recentProgress) < n:
        time.sleep(0.2)
    while time.monotonic() < deadline and q.status["isTriggerActive"]:
        time.sleep(0.05)
    q.stop()
    forget(spark, q)
    return pipeline_rate(q.recentProgress)


def floor_rate(spark: Any, n: int, size: int, partitions: int, sink: str, work: Path,
               per_trigger: int) -> tuple[float, int]:
    """A Python data source that yields ready-made Arrow batches of the stream read's schema
    (bench_floor.py), planned like the stream source, into the same sink: what the Python Data Source
    API costs before the connector does anything."""
    from .bench_floor import FloorDataSource

    spark.dataSource.register(FloorDataSource)
    df = (spark.readStream.format("hutch-floor").option("rows", str(n)).option("size", str(size))
          .option("perTrigger", str(per_trigger)).option("tasks", str(partitions)).load())
    return _available_now_rate(df, sink, work)


def run(spark: Any, uri: str, stream_port: int, stream_uri: Any, n: int, size: int, per_trigger: int,
        work: Path, best: Callable[[Callable[[], Any]], Any], partition_counts: list[int], sinks: list[str],
        writes: bool) -> None:
    """Every stream measurement, printed as it completes."""
    for partitions in partition_counts:
        name = f"bench-ss{partitions}-{time.monotonic_ns()}"
        create_super_stream(stream_uri, name, partitions)
        fill = write_stream_rate(spark, uri, stream_port, name, n, size, super_stream=True)
        print(f"DataFrame -> super stream of {partitions} (filling it): {fill:,.0f} msg/s")
        for sink in sinks:
            def read(sink: str = sink, partitions: int = partitions, name: str = name) -> tuple[float, int]:
                return super_stream_read_rate(spark, uri, stream_port, name, partitions, sink, work, per_trigger)

            def spark_only(sink: str = sink, partitions: int = partitions) -> tuple[float, int]:
                return rate_source_rate(spark, n, size, partitions, sink, work, per_trigger)

            rate, rows = best(read)
            base, base_rows = best(spark_only)
            share = connector_share(rate, base)
            print(f"super stream of {partitions} -> {sink}: {rate:,.0f} msg/s ({rows} rows); rate source -> "
                  f"{sink}: {base:,.0f} msg/s ({base_rows} rows); connector's share {share:.0%}")
    if not writes:
        return
    one = f"bench-st-{time.monotonic_ns()}"
    with AmqpClient(parse_uri(uri)).connect() as c:
        c.declare_queue(one, arguments={"x-queue-type": "stream"})
    wr = best(lambda: write_stream_rate(spark, uri, stream_port, one, n, size, False))
    noop = best(lambda: noop_write_rate(spark, n, size))
    floor = best(lambda: python_noop_write_rate(spark, n, size))
    print(f"DataFrame -> stream (2 Spark partitions, idempotent, confirmed): {wr:,.0f} msg/s; Spark alone (noop "
          f"sink): {noop:,.0f} msg/s; Python sink floor: {floor:,.0f} msg/s; connector's share "
          f"{connector_share(wr, noop):.0%} (beyond the Python floor: {connector_share(wr, floor):.0%})")
    name4 = f"bench-w4-{time.monotonic_ns()}"
    create_super_stream(stream_uri, name4, 4)
    wr4 = best(lambda: write_stream_rate(spark, uri, stream_port, name4, n, size, True))
    print(f"DataFrame -> super stream of 4 (routed by key): {wr4:,.0f} msg/s; connector's share "
          f"{connector_share(wr4, noop):.0%} (beyond the Python floor: {connector_share(wr4, floor):.0%})")


__all__ = ["connector_share", "floor_rate", "pipeline_rate", "rate_source_rate", "run", "super_stream_read_rate"]
