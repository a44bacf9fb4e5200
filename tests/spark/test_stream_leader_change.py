"""A leader change of a stream during a Spark query (issue 24, "Done means" (d)), on a real 3-node cluster.

What is proven here: a replicated stream on three `hutch-server` nodes is read by a streaming query
(`option("stream")`, `local[2]`, two read tasks per micro-batch) through a node that does not write it,
while messages are published with confirms through the third node and the writer's node is killed
(`kill -9`) in the middle and started again; another node becomes the writer. The query (stopped and
restarted from its checkpoint with Trigger.AvailableNow, as a user would after a failure) ends with
every message of the stream exactly once: each confirmed message, no offset or body twice, nothing that
is not in the stream. A message nacked in the failover may still have been stored (as on RabbitMQ); it
is then read once, like every other.

Why the query reads through a replica and not the writer: the connector reads on the node it connects to
when that node holds the stream (docs/spark.md, "Several hosts"), and a replica keeps serving its
committed chunks while the writer changes, so the query never has to leave its node.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.nodes import Cluster, eventually
from tests.cluster.test_stream_cluster import (
    STREAM_CONF,
    declare,
    publish,
    read_first,
    stream_port,
    writer_of,
)

from .helpers import run_available_now


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_writer_killed_mid_query_every_message_read_once(spark: Any, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster")
    query = None
    try:
        for _ in range(3):
            cluster.add(config_text=STREAM_CONF)
        n1, n2, n3 = cluster.nodes
        declare(n1, "events")  # n1 writes; n2 and n3 replicate
        confirmed = publish(n3, "events", [f"m{i:04d}" for i in range(300)])
        out, ck = tmp_path / "out", tmp_path / "ck"

        def reader() -> Any:
            return (spark.readStream.format("hutch").option("uri", n2.url).option("stream", "events")
                    .option("streamPort", str(stream_port(n2))).option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", "100").option("minPartitions", "2").load()
                    .selectExpr("offset", "cast(value as string) as body"))

        query = (reader().writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
                 .trigger(processingTime="200 milliseconds").start())
        assert eventually(lambda: (out / "_spark_metadata" / "0").exists(), timeout=120)  # batch 0 done
        confirmed += publish(n3, "events", [f"m{i:04d}" for i in range(300, 700)], during={100: n1.kill})
        assert len(confirmed) >= 680  # a failover nacks at most the few in flight
        assert eventually(lambda: writer_of(n2, "events") in ("n2", "n3"), timeout=30)
        n1.start()
        cluster.wait_running({"n1", "n2", "n3"})
        time.sleep(1.0)  # a few more triggers against the new writer's stream
        query.stop()
        failure = query.exception()
        query = None
        run_available_now(reader(), out, ck)  # from the checkpoint, to the end as it is now
        rows = spark.read.parquet(str(out)).collect()
        stored = read_first(n2, "events", len(confirmed))
        print(f"\nleader change mid-query: {len(confirmed)} confirmed, {len(stored)} in the stream, "
              f"{len(rows)} rows; the running query {'failed: ' + str(failure)[:200] if failure else 'did not fail'}")
        offsets = Counter(r.offset for r in rows)
        bodies = Counter(r.body for r in rows)
        assert max(offsets.values()) == 1 and max(bodies.values()) == 1, "a row twice"
        assert sorted((r.offset, r.body) for r in rows) == sorted(stored), "the rows are not the stream"
        assert set(confirmed) <= set(bodies), "a confirmed message is missing"
    finally:
        if query is not None:
            query.stop()
        cluster.stop()
