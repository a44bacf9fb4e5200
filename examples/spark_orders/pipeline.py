"""The orders pipeline: hutch queue `orders` -> Spark Structured Streaming -> Parquet + hutch.

    orders (queue) --readStream hutch--> parse JSON --> watermark 5 s on created_at
        --> drop duplicate order ids within the watermark (the source is at-least-once)
        --> count and sum per 10-second window and region (append mode: a window is emitted once closed)
        --> foreachBatch: Parquet (one directory per micro-batch, overwritten on replay)
                          + hutch exchange `orders.totals` (routing key = region,
                            message_id = "<window start>|<region>", so replays are recognisable)

Delivery: at-least-once from the queue (a message is acknowledged only after the micro-batch holding it
finished), duplicates removed by order id before counting; each micro-batch's outputs are idempotent
(Parquet by batch directory, hutch by message_id). Run `python pipeline.py --help`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from orders import TOTALS_EXCHANGE, WINDOW_S

ORDER_SCHEMA = ("order_id string, customer string, region string, amount_cents long, items int, "
                "created_ms long")


QUIET_LOG4J = Path(__file__).resolve().with_name("log4j2-quiet.properties")


def spark_session(master: str = "local[2]", verbose: bool = False) -> Any:
    """A local Spark session with the hutch source registered. Quiet unless `verbose`: Spark's JVM logs
    errors only (log4j2-quiet.properties, from the JVM's start, so not even its start-up banner), and
    pyspark's own loggers too; `verbose` keeps Spark's defaults (INFO at start-up, then WARN)."""
    from pyspark.sql import SparkSession

    from hutch.spark import HutchDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName("hutch-orders-pipeline")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    # a deeper thread stack: stopping the query in the middle of a micro-batch (as run_demo.py does) made
    # Spark's stream thread die of a StackOverflowError in a regex over the interrupted batch's error text
    # (1,000 lines of java.util.regex frames on stderr) with the JVM's default stack
    java_options = "-Xss16m"
    if not verbose:
        java_options += f" -Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
    builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if not verbose:
        for name in ("py4j", "pyspark"):
            logging.getLogger(name).setLevel(logging.ERROR)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    _quiet_accumulator_eof(spark)
    spark.dataSource.register(HutchDataSource)
    return spark


def _quiet_accumulator_eof(spark: Any) -> None:
    """pyspark's accumulator server (pyspark/accumulators.py) prints an EOFError traceback when the JVM
    closes its connection at `spark.stop()`, a normal end; its other errors are still printed."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None:
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], EOFError):
            report(request, client_address)

    server.handle_error = handle_error


def totals_stream(spark: Any, uri: str, queue: str = "orders", max_per_trigger: int = 10_000) -> Any:
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("hutch")
           .option("uri", uri)
           .option("queue", queue)
           .option("maxMessagesPerTrigger", str(max_per_trigger))
           .option("includeHeaders", "false")
           .load())
    orders = (raw.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o"))
              .select("o.*")
              .withColumn("created_at", F.timestamp_millis("created_ms")))
    return (orders.withWatermark("created_at", "5 seconds")
            .dropDuplicatesWithinWatermark(["order_id"])
            .groupBy(F.window("created_at", f"{WINDOW_S} seconds"), "region")
            .agg(F.count("*").alias("orders"), F.sum("amount_cents").alias("amount_cents"),
                 F.sum("items").alias("items"))
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                    "region", "orders", "amount_cents", "items"))


def write_batch(uri: str, out_dir: str) -> Any:
    """foreachBatch function: the batch's closed windows to Parquet and to the `orders.totals` exchange."""
    from pyspark.sql import functions as F

    def write(totals: Any, batch_id: int) -> None:
        totals = totals.persist()
        try:
            if totals.isEmpty():
                return
            totals.write.mode("overwrite").parquet(os.path.join(out_dir, f"batch={batch_id:08d}"))
            message = totals.select(
                F.to_json(F.struct("window_start", "window_end", "region", "orders", "amount_cents",
                                   "items")).alias("value"),
                F.col("region").alias("routing_key"),
                F.struct(
                    F.concat_ws("|", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'"),
                                F.col("region")).alias("message_id"),
                    F.lit("application/json").alias("content_type"),
                ).alias("properties"))
            (message.write.format("hutch").mode("append")
             .option("uri", uri).option("exchange", TOTALS_EXCHANGE).save())
        finally:
            totals.unpersist()

    return write


def start(spark: Any, uri: str, out_dir: str, checkpoint: str, trigger_s: float = 1.0,
          available_now: bool = False, max_per_trigger: int = 10_000) -> Any:
    writer = (totals_stream(spark, uri, max_per_trigger=max_per_trigger).writeStream
              .outputMode("append")
              .foreachBatch(write_batch(uri, out_dir))
              .option("checkpointLocation", checkpoint)
              .queryName("orders_totals"))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_s} seconds")
    return writer.start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default="amqp://guest:guest@localhost:5672/%2F")
    ap.add_argument("--out", default="/tmp/hutch-orders/totals", help="Parquet output directory")
    ap.add_argument("--checkpoint", default="/tmp/hutch-orders/checkpoint")
    ap.add_argument("--trigger", type=float, default=1.0, help="seconds between micro-batches")
    ap.add_argument("--available-now", action="store_true", help="process what is queued, then stop")
    ap.add_argument("-v", "--verbose", action="store_true", help="Spark's own logs (INFO and WARN)")
    args = ap.parse_args()
    spark = spark_session(verbose=args.verbose)
    query = start(spark, args.uri, args.out, args.checkpoint, args.trigger, args.available_now)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()


if __name__ == "__main__":
    main()
