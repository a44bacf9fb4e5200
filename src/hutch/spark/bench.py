"""Benchmark of the Spark connector: messages per second hutch -> Spark and Spark -> hutch.

    python -m hutch.spark.bench --messages 200000 --size 100

Owns: the benchmark that docs/spark.md records. It starts a hutch node on free ports, the inter-node one
included, in a temporary directory it removes at the end (or uses --uri), and a local Spark session (`--master`, default local[2]), then measures, with `--size`-byte bodies:

- broker baselines without Spark: publishing with confirms, and consuming, with the connector's client;
- hutch -> memory sink and hutch -> Parquet: a streaming query with Trigger.AvailableNow over a queue
  prefilled with --messages messages, timed from start() to termination, with Spark's per-trigger
  durations (`latestOffset` is the driver-side reader: consuming and building Arrow batches;
  `addBatch` is Spark running the batch; the rest is planning and checkpointing);
- DataFrame -> hutch: `df.write.format("hutch")` of --messages rows, timed end to end (every message
  confirmed);
- the Arrow conversion alone (deliveries -> record batch), per message;
- with --super-streams, the stream measurements of bench_streams.py.

Quiet unless -v: Spark's JVM logs errors only (a log4j2 configuration given at its start).

Each figure is the best of --repeat runs. Nothing here is imported by the connector.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hutch.amqp.spec import BasicProperties
from hutch.portfile import NodeDidNotStart, wait_for_ports

from . import records
from .bench_streams import forget
from .client import AmqpClient, Delivery
from .options import parse_uri

# Spark's JVM logging when the benchmark runs without -v: errors only (Spark's defaults print INFO and
# WARN lines at start-up, before `setLogLevel` can act).
QUIET_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = error
"""


def start_node(work: Path, node_name: str = "bench@localhost",
               data_dir_name: str = "data") -> tuple[subprocess.Popen[bytes], str]:
    """Start a hutch node with its data and log under `work`, every listener on port 0: AMQP, management
    and the inter-node port of its cluster of one (a fixed 25672 would collide with `make run`'s node);
    returns (process, AMQP URI) once its ports file (hutch/portfile.py) says it listens."""
    proc, ports = start_node_ports(work, node_name, data_dir_name)
    return proc, f"amqp://guest:guest@127.0.0.1:{ports['amqp']}/%2F"


def start_node_ports(work: Path, node_name: str = "bench@localhost", data_dir_name: str = "data",
                     extra_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """`start_node` with more arguments (e.g. `--stream-port 0`), returning every listener's port."""
    data, log_path = work / data_dir_name, work / "hutch.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0",
                                 "--management-port", "0", "--cluster-port", "0", "--data-dir", str(data),
                                 "--node-name", node_name, "--workers", "1", *extra_args], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        ports = wait_for_ports(data, proc, 60)
    except NodeDidNotStart as exc:
        proc.kill()
        proc.wait()
        raise SystemExit(f"hutch did not start ({exc}); see {log_path}") from None
    return proc, ports


def declare(uri: str, queue: str) -> None:
    with AmqpClient(parse_uri(uri)).connect() as c:
        c.declare_queue(queue)
        c.purge_queue(queue)


def prefill(uri: str, queue: str, n: int, size: int) -> float:
    """Publish n messages with confirms (at most 10,000 unconfirmed); returns messages/s."""
    body = b"x" * size
    with AmqpClient(parse_uri(uri)).connect() as c:
        c.confirm_select()
        prefix = c.publish_frame_prefix("", queue, False)
        props = BasicProperties(delivery_mode=2).encode()
        t = time.perf_counter()
        sent = 0
        while sent < n:
            k = min(1000, n - sent)
            frames: list[bytes] = []
            for _ in range(k):
                frames.append(prefix)
                frames.extend(c.content(props, body))
            c.wait_confirms(10_000 - k, 60)
            c.send_publishes(frames, k)
            sent += k
        c.wait_confirms(0, 60)
        return n / (time.perf_counter() - t)


def consume_rate(uri: str, queue: str, n: int) -> float:
    with AmqpClient(parse_uri(uri)).connect() as c:
        c.consume(queue, 20_000)
        t = time.perf_counter()
        got = 0
        while got < n:
            chunk = c.take(10_000, 5.0)
            if not chunk:
                break
            got += len(chunk)
            c.ack(chunk[-1].delivery_tag)
        return got / (time.perf_counter() - t)


def pika_rates(uri: str, queue: str, n: int, size: int) -> tuple[float, float]:
    """The same baselines with pika's BlockingConnection (publish waits for each confirm; consume with
    prefetch 20000 and one multiple ack per 10000), for the client comparison in docs/spark.md."""
    import pika

    body = b"x" * size
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.confirm_delivery()
    k = min(n, 20_000)
    t = time.perf_counter()
    for _ in range(k):
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    pub = k / (time.perf_counter() - t)
    prefill(uri, queue, n - k, size)
    ch.basic_qos(prefetch_count=20_000)
    got = [0]

    def on_message(channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        got[0] += 1
        if got[0] % 10_000 == 0 or got[0] == n:
            channel.basic_ack(method.delivery_tag, multiple=True)

    ch.basic_consume(queue, on_message)
    t = time.perf_counter()
    while got[0] < n:
        conn.process_data_events(0.1)
    con = n / (time.perf_counter() - t)
    conn.close()
    return pub, con


def arrow_rate(n: int, size: int) -> float:
    from .schema import to_record_batch

    raw = BasicProperties(delivery_mode=2).encode()
    ds = [Delivery(i + 1, False, "", "q", raw, b"x" * size, 1_700_000_000_000_000) for i in range(n)]
    t = time.perf_counter()
    for lo in range(0, n, 10_000):
        to_record_batch(ds[lo:lo + 10_000], "q", True)
    return n / (time.perf_counter() - t)


def _durations(progress: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in progress:
        for key, ms in (p.get("durationMs") or {}).items():
            out[key] = out.get(key, 0.0) + ms / 1000
    return out


def stream_rate(spark: Any, uri: str, queue: str, n: int, sink: str, work: Path, per_trigger: int,
                stream_partitions: int = 0, stream_port: int = 5552,
                fmt: str = "hutch") -> tuple[float, dict[str, float], int, float]:
    """A Trigger.AvailableNow query from the queue (or, with `stream_partitions`, from the stream of that
    name read by offset in that many tasks per batch, by the Python source (fmt="hutch-python") or the JVM
    reader (fmt="hutch" in a session whose `register` found its jar, or "hutch-jvm")) into a sink; (rows/s from start to end, durations, batches, rows/s of trigger time: what
    the rate source's figure is comparable with)."""
    ck = work / f"ck-{sink}-{time.monotonic_ns()}"
    reader = spark.readStream.format(fmt).option("uri", uri)
    if stream_partitions:
        reader = (reader.option("stream", queue).option("streamPort", str(stream_port))
                  .option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(per_trigger)).option("minPartitions", str(stream_partitions)))
    else:
        reader = (reader.option("queue", queue).option("maxMessagesPerTrigger", str(per_trigger))
                  .option("prefetch", str(min(65535, 2 * per_trigger))))
    df = reader.load()
    w = df.writeStream.option("checkpointLocation", str(ck)).trigger(availableNow=True)
    if sink == "memory":
        w = w.format("memory").queryName(f"bench_{time.monotonic_ns()}")
    else:
        w = w.format("parquet").option("path", str(work / f"out-{time.monotonic_ns()}"))
    t = time.perf_counter()
    q = w.start()
    q.awaitTermination()
    took = time.perf_counter() - t
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    forget(spark, q)
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    durations = _durations(q.recentProgress)
    trigger_s = durations.get("triggerExecution", 0.0)
    return (rows / took, durations, len([p for p in q.recentProgress if p["numInputRows"]]),
            rows / trigger_s if trigger_s else 0.0)


def write_rate(spark: Any, uri: str, queue: str, n: int, size: int) -> float:
    from pyspark.sql import functions as F

    df = spark.range(0, n, numPartitions=2).select(
        F.rpad(F.col("id").cast("string"), size, "x").alias("value")).cache()
    df.count()
    t = time.perf_counter()
    df.write.format("hutch").mode("append").option("uri", uri).option("routing_key", queue).save()
    took = time.perf_counter() - t
    df.unpersist()
    return n / took


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _best(repeat: int, run: Callable[[], Any]) -> Any:
    results = [run() for _ in range(repeat)]
    return max(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="an existing broker (default: start a hutch node on free ports)")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--per-trigger", type=int, default=20_000, help="maxMessagesPerTrigger")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    ap.add_argument("--compare-pika", action="store_true", help="also measure pika's BlockingConnection")
    ap.add_argument("--streams", action="store_true",
                    help="also read a stream by offset (1, 2 and 4 tasks per batch) into each sink")
    ap.add_argument("--super-streams", action="store_true",
                    help="also: super streams of 1, 2 and 4 partitions into each sink, beside the rate source "
                    "(Spark alone), and DataFrame -> stream / super stream (bench_streams.py)")
    ap.add_argument("--partitions", default="1,2,4", help="stream read tasks / super stream partitions to measure")
    ap.add_argument("--sinks", default="memory,parquet", help="sinks to measure: memory, parquet or both")
    ap.add_argument("--jvm", action="store_true",
                    help="with --streams: also the JVM reader (format 'hutch' with its jar on the class path, "
                    "built if needed); the Python source's stream reads as format 'hutch-python'")
    ap.add_argument("--no-write", action="store_true", help="leave out the DataFrame -> hutch measurements")
    ap.add_argument("-v", "--verbose", action="store_true", help="Spark's own WARN and INFO lines")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hutch-spark-bench-"))
    node = None
    uri = args.uri
    n, size = args.messages, args.size
    stream_port = 5552
    try:
        if uri is None:
            node, ports = start_node_ports(work, extra_args=("--stream-port", "0"))
            uri, stream_port = f"amqp://guest:guest@127.0.0.1:{ports['amqp']}/%2F", ports["stream"]
        from pyspark.sql import SparkSession

        from . import register

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (SparkSession.builder.master(args.master).appName("hutch-spark-bench")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                   .config("spark.ui.showConsoleProgress", "false"))
        if args.jvm:
            from .jvm import jar_path

            builder = builder.config("spark.jars", jar_path())
        for setting in args.conf:
            key, _, value = setting.partition("=")
            builder = builder.config(key, value)
        if not args.verbose:
            # errors only, from the JVM's start (setLogLevel below comes after Spark's start-up WARN lines)
            quiet = work / "log4j2-quiet.properties"
            quiet.write_text(QUIET_LOG4J)
            builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={quiet.as_uri()}")
            for name in ("py4j", "pyspark"):
                logging.getLogger(name).setLevel(logging.ERROR)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        path = register(spark)  # with --jvm: format("hutch") reads streams with the JVM reader
        q = "bench"
        declare(uri, q)
        print(f"# hutch Spark connector benchmark: {n} messages of {size} bytes, {args.master}, "
              f"maxMessagesPerTrigger={args.per_trigger}, best of {args.repeat}"
              + (f", {' '.join(args.conf)}" if args.conf else ""))
        print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"PySpark {spark.version}; load average {_load()} at the start; {records.describe()}")
        print(f"arrow conversion (deliveries -> record batch): {arrow_rate(min(n, 100_000), size):,.0f} msg/s")

        def declare_and_prefill() -> float:
            declare(uri, q)
            return prefill(uri, q, n, size)

        pub = _best(args.repeat, declare_and_prefill)
        con = consume_rate(uri, q, n)
        print(f"broker only, connector client: publish+confirm {pub:,.0f} msg/s, consume+ack {con:,.0f} msg/s")
        if args.compare_pika:
            declare(uri, q)
            ppub, pcon = pika_rates(uri, q, n, size)
            print(f"broker only, pika BlockingConnection: publish+confirm {ppub:,.0f} msg/s, "
                  f"consume+ack {pcon:,.0f} msg/s")
        for sink in args.sinks.split(","):
            def one(sink: str = sink) -> tuple[float, dict[str, float], int, float]:
                declare(uri, q)
                prefill(uri, q, n, size)
                return stream_rate(spark, uri, q, n, sink, work, args.per_trigger)
            rate, durations, batches, trigger_rate = _best(args.repeat, one)
            parts = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(durations.items(), key=lambda kv: -kv[1]))
            print(f"hutch -> {sink} sink: {rate:,.0f} msg/s, {trigger_rate:,.0f} msg/s of trigger time "
                  f"({batches} batches; {parts})")
        if args.streams:
            from .bench_streams import connector_share, floor_rate, rate_source_rate

            st = "bench-stream"
            with AmqpClient(parse_uri(uri)).connect() as c:
                c.declare_queue(st, arguments={"x-queue-type": "stream"})
            prefill(uri, st, n, size)
            for sink in args.sinks.split(","):
                for tasks in (int(t) for t in args.partitions.split(",")):
                    def by_offset(sink: str = sink, tasks: int = tasks) -> tuple[float, dict[str, float], int, float]:
                        return stream_rate(spark, uri, st, n, sink, work, args.per_trigger, tasks,
                                           stream_port, "hutch-python")

                    def spark_only(sink: str = sink, tasks: int = tasks) -> tuple[float, int]:
                        return rate_source_rate(spark, n, size, tasks, sink, work, args.per_trigger)
                    def python_floor(sink: str = sink, tasks: int = tasks) -> tuple[float, int]:
                        return floor_rate(spark, n, size, tasks, sink, work, args.per_trigger)
                    rate, durations, batches, trigger_rate = _best(args.repeat, by_offset)
                    base, _ = _best(args.repeat, spark_only)
                    floor, _ = _best(args.repeat, python_floor)
                    parts = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(durations.items(), key=lambda kv: -kv[1]))
                    print(f"stream -> {sink} sink, {tasks} task(s) per batch: {rate:,.0f} msg/s, {trigger_rate:,.0f} "
                          f"msg/s of trigger time; rate source -> {sink}: {base:,.0f} msg/s; Python source floor: "
                          f"{floor:,.0f} msg/s; connector's share {connector_share(trigger_rate, base):.0%} (beyond "
                          f"the Python floor: {connector_share(trigger_rate, floor):.0%}) ({batches} batches; {parts})")
                    if args.jvm:
                        def spark_only_same_rows(sink: str = sink, tasks: int = tasks) -> tuple[float, int]:
                            return rate_source_rate(spark, n, size, tasks, sink, work, args.per_trigger, st)
                        same, _ = _best(args.repeat, spark_only_same_rows)
                        print(f"rate source with the stream's rows -> {sink}, {tasks} task(s): {same:,.0f} msg/s; "
                              f"Python source's share against it {connector_share(trigger_rate, same):.0%}")

                        def by_jvm(sink: str = sink, tasks: int = tasks) -> tuple[float, dict[str, float], int, float]:
                            return stream_rate(spark, uri, st, n, sink, work, args.per_trigger, tasks, stream_port,
                                               "hutch" if path == "jvm" else "hutch-jvm")
                        rate, durations, batches, jvm_rate = _best(args.repeat, by_jvm)
                        parts = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(durations.items(), key=lambda kv: -kv[1]))
                        print(f"stream -> {sink} sink, {tasks} task(s) per batch, JVM reader: {rate:,.0f} msg/s, "
                              f"{jvm_rate:,.0f} msg/s of trigger time; rate source -> {sink}: {base:,.0f} msg/s; "
                              f"connector's share {connector_share(jvm_rate, base):.0%}, against the rate source with "
                              f"the stream's rows {connector_share(jvm_rate, same):.0%} ({batches} batches; {parts})")
        if not args.no_write:
            declare(uri, q)
            wr = _best(args.repeat, lambda: write_rate(spark, uri, q, n, size))
            print(f"DataFrame -> hutch (2 partitions, confirms): {wr:,.0f} msg/s")
        if args.super_streams:
            from . import bench_streams

            stream_uri = replace(parse_uri(uri), port=stream_port)
            bench_streams.run(spark, uri, stream_port, stream_uri, n, size, args.per_trigger, work,
                              lambda f: _best(args.repeat, f), [int(p) for p in args.partitions.split(",")],
                              args.sinks.split(","), not args.no_write)
        print(f"# load average {_load()} at the end")
        spark.stop()
    finally:
        if node is not None:
            node.terminate()
            node.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
