"""The orders pipeline on streams: super stream `orders.s` (4 partitions) -> Spark -> Parquet + stream.

    orders.s (super stream, 4 partitions, routed by customer) --readStream hutch superStream-->
        parse JSON --> count and sum per 10-second window and region (update mode: each micro-batch
        emits the (window, region) totals it changed, with their new values)
        --> foreachBatch: Parquet (one directory per micro-batch, overwritten on replay)
                          + stream `orders.totals.s` (idempotent stream sink, writeId = the batch id)

Exactly-once end to end, with no de-duplication step: the source reads offsets planned in Spark's
checkpoint (a replayed micro-batch reads the same offsets), the aggregation state is Spark's
(checkpointed per batch), the Parquet directory of a batch is overwritten when it is replayed, and the
stream sink's publisher reference and publishing ids (writeId `totals-<batch>`, row positions in a
sorted single partition) make a replayed batch's results deduplicated by the broker. The final total of
a (window, region) is the one from the highest batch that emitted it.

Orders are published by `publish_stream_orders` with pika to the super stream's exchange, routed to the
partition the RabbitMQ stream clients' hash strategy picks for the customer (murmur3, hutch.spark.routing).

    python stream_pipeline.py --uri amqp://guest:guest@localhost:5672/%2F --stream-port 5552
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from orders import WINDOW_S, Ledger, connect, publish_orders

from hutch.spark.routing import partition_of

ORDERS_SUPER_STREAM = "orders.s"
PARTITIONS = 4
TOTALS_STREAM = "orders.totals.s"
ORDER_SCHEMA = ("order_id string, customer string, region string, amount_cents long, items int, "
                "created_ms long")


def declare_stream_topology(uri: str, partitions: int = PARTITIONS) -> list[str]:
    """The super stream as RabbitMQ lays it out (an exchange with `x-super-stream`, a stream per partition
    bound with its index and partition order) and the results stream. Returns the partition streams."""
    streams = [f"{ORDERS_SUPER_STREAM}-{i}" for i in range(partitions)]
    with connect(uri) as conn:
        ch = conn.channel()
        ch.exchange_declare(ORDERS_SUPER_STREAM, "direct", durable=True, arguments={"x-super-stream": True})
        for i, stream in enumerate(streams):
            ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(stream, ORDERS_SUPER_STREAM, str(i), arguments={"x-stream-partition-order": i})
        ch.queue_declare(TOTALS_STREAM, durable=True, arguments={"x-queue-type": "stream"})
    return streams


def publish_stream_orders(uri: str, count: int, ledger: Ledger | None = None, seed: int = 11, first: int = 0,
                          partitions: int = PARTITIONS) -> float:
    """Publish `count` orders to the super stream with confirms, each to its customer's partition; every
    order is in `ledger` once confirmed. Returns the seconds it took."""
    return publish_orders(uri, count, 0, ledger, seed, first, route=lambda order: (
        ORDERS_SUPER_STREAM, str(partition_of(order["customer"], partitions))))


def totals_stream(spark: Any, uri: str, stream_port: int, max_per_trigger: int = 5000) -> Any:
    raw = (spark.readStream.format("hutch").option("uri", uri).option("superStream", ORDERS_SUPER_STREAM)
           .option("streamPort", str(stream_port)).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(max_per_trigger)).option("minPartitions", str(PARTITIONS))
           .option("includeHeaders", "false").load())
    return totals(raw)


def totals(raw: Any) -> Any:
    """The aggregation: orders and cents per (window, region) of the super stream's rows `raw` (a
    streaming read, or a batch read with `spark.read`)."""
    from pyspark.sql import functions as F

    orders = (raw.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
              .withColumn("created_at", F.timestamp_millis("created_ms")))
    return (orders.groupBy(F.window("created_at", f"{WINDOW_S} seconds"), "region")
            .agg(F.count("*").alias("orders"), F.sum("amount_cents").alias("amount_cents"))
            .select(F.col("window.start").alias("window_start"), "region", "orders", "amount_cents"))


def write_batch(uri: str, stream_port: int, out_dir: str, pause_s: float = 0.0, marker_dir: str = "",
                pause_after: str = "parquet") -> Any:
    """foreachBatch: the batch's changed totals to Parquet, then to the results stream. With `pause_s`
    (the crash demo), the batch announces itself (`<marker_dir>/inflight-<batch>-<pid>`) and waits, to
    be killed in the middle of the batch: after its Parquet (`pause_after="parquet"`), or after its
    results are in the stream too but before Spark commits the batch (`"results"`)."""

    def pause(where: str, batch_id: int) -> None:
        if pause_s and pause_after == where:
            Path(marker_dir, f"inflight-{batch_id}-{os.getpid()}").touch()
            time.sleep(pause_s)
    from pyspark.sql import functions as F

    def write(totals: Any, batch_id: int) -> None:
        totals = totals.withColumn("batch", F.lit(batch_id)).orderBy("window_start", "region").coalesce(1)
        totals = totals.persist()
        try:
            if totals.isEmpty():
                return
            totals.write.mode("overwrite").parquet(os.path.join(out_dir, f"batch={batch_id:08d}"))
            pause("parquet", batch_id)
            # One sorted partition: a replay has the same rows at the same positions, so the broker
            # deduplicates what the killed attempt already stored (writeId per batch).
            (totals.select(F.to_json(F.struct("window_start", "region", "orders", "amount_cents", "batch"))
                           .alias("value"), F.col("region").alias("key"))
             .write.format("hutch").mode("append").option("uri", uri).option("streamPort", str(stream_port))
             .option("stream", TOTALS_STREAM).option("writeId", f"totals-{batch_id}").save())
            pause("results", batch_id)
        finally:
            totals.unpersist()

    return write


def start(spark: Any, uri: str, stream_port: int, out_dir: str, checkpoint: str, available_now: bool = False,
          max_per_trigger: int = 5000, pause_s: float = 0.0, marker_dir: str = "",
          pause_after: str = "parquet") -> Any:
    writer = (totals_stream(spark, uri, stream_port, max_per_trigger).writeStream.outputMode("update")
              .foreachBatch(write_batch(uri, stream_port, out_dir, pause_s, marker_dir, pause_after))
              .option("checkpointLocation", checkpoint).queryName("orders_stream_totals"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="1 second")
    return writer.start()


def final_totals(spark: Any, out_dir: str) -> dict[tuple[int, str], tuple[int, int]]:
    """(window start, region) -> (orders, cents) from the Parquet output: the value of the latest batch."""
    got: dict[tuple[int, str], tuple[int, int, int]] = {}
    for r in spark.read.parquet(out_dir).collect():
        key = (int(r.window_start.timestamp()), r.region)
        if key not in got or got[key][0] < r.batch:
            got[key] = (r.batch, r.orders, r.amount_cents)
    return {k: (v[1], v[2]) for k, v in got.items()}


def stream_totals(messages: list[bytes]) -> tuple[dict[tuple[int, str], tuple[int, int]], int]:
    """The results stream's final totals (latest batch per key) and how many messages repeat a
    (key, batch) another message already carries (0 when the sink stored each once)."""
    latest: dict[tuple[int, str], tuple[int, int, int]] = {}
    seen: set[tuple[int, str, int]] = set()
    repeats = 0
    for raw in messages:
        t = json.loads(raw)
        # to_json writes a timestamp in the session's time zone (UTC here) with its offset
        start_s = int(dt.datetime.fromisoformat(t["window_start"].replace("Z", "+00:00")).timestamp())
        key = (start_s, t["region"])
        if (*key, t["batch"]) in seen:
            repeats += 1
        seen.add((*key, t["batch"]))
        if key not in latest or latest[key][0] < t["batch"]:
            latest[key] = (t["batch"], t["orders"], t["amount_cents"])
    return {k: (v[1], v[2]) for k, v in latest.items()}, repeats


def ledger_totals(ledger: Ledger) -> dict[tuple[int, str], tuple[int, int]]:
    return {k: (ledger.orders[k], ledger.cents[k]) for k in ledger.orders}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default="amqp://guest:guest@localhost:5672/%2F")
    ap.add_argument("--stream-port", type=int, default=5552)
    ap.add_argument("--out", default="/tmp/hutch-orders-stream/totals", help="Parquet output directory")
    ap.add_argument("--checkpoint", default="/tmp/hutch-orders-stream/checkpoint")
    ap.add_argument("--available-now", action="store_true", help="read to the end, then stop")
    ap.add_argument("--max-per-trigger", type=int, default=5000)
    ap.add_argument("--pause-in-batch", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--marker-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--pause-after", choices=("parquet", "results"), default="parquet", help=argparse.SUPPRESS)
    ap.add_argument("-v", "--verbose", action="store_true", help="Spark's own logs (INFO and WARN)")
    args = ap.parse_args()
    from pipeline import spark_session

    spark = spark_session(verbose=args.verbose)
    query = start(spark, args.uri, args.stream_port, args.out, args.checkpoint, args.available_now,
                  args.max_per_trigger, args.pause_in_batch, args.marker_dir, args.pause_after)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    spark.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
