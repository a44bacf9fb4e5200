"""A Spark driver the crash test runs in its own process group and kills with SIGKILL.

    python crash_driver.py <amqp uri> <queue> <out dir> <checkpoint> <run: first|restart>
        [queue|stream <stream port>]

It streams the queue (250 messages per micro-batch) into files out/batch-<id>.txt, one body per line,
written atomically (a replayed batch overwrites its file). In the first run, batch 2 announces itself
(out/inflight-2) and then waits to be killed in the middle of the batch. The restart runs with
Trigger.AvailableNow and exits when the queue is drained. With `stream`, <queue> names a stream read by
offset from `earliest` (250 offsets per micro-batch, 2 read tasks each), its end probed on <stream port>.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession

from hutch.spark import HutchDataSource


def main() -> None:
    uri, queue, out, ck, run = sys.argv[1:6]
    kind = sys.argv[6] if len(sys.argv) > 6 else "queue"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName(f"crash-{run}")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HutchDataSource)

    def write(df, batch_id):  # noqa: ANN001, ANN202
        bodies = [r.v for r in df.selectExpr("cast(value as string) v").collect()]
        if run == "first" and batch_id == 2:
            open(os.path.join(out, "inflight-2"), "w").close()
            time.sleep(120)  # killed here, in the middle of the batch
        tmp = os.path.join(out, f".batch-{batch_id}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(b + "\n" for b in bodies))
        os.replace(tmp, os.path.join(out, f"batch-{batch_id}.txt"))

    if kind == "stream":
        df = (spark.readStream.format("hutch").option("uri", uri).option("stream", queue)
              .option("streamPort", sys.argv[7]).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "250")
              .option("minPartitions", "2").load())
    else:
        df = (spark.readStream.format("hutch").option("uri", uri).option("queue", queue)
              .option("maxMessagesPerTrigger", "250").load())
    w = df.writeStream.foreachBatch(write).option("checkpointLocation", ck)
    w = w.trigger(availableNow=True) if run == "restart" else w.trigger(processingTime="100 milliseconds")
    w.start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
