"""Streaming reads (`spark.readStream.format("hutch")`) against a real hutch process.

What is proven here: a query reads N messages into a memory sink and Spark sees exactly N distinct
messages, all acknowledged; micro-batches are acknowledged once finished even when no further data
comes; a query stopped in the middle of a batch, a query whose sink fails in the middle of a batch,
and a query whose broker connection goes away mid-query, each restarted from its checkpoint, still see
every message (duplicates are counted and reported, none is lost).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo

from .helpers import Broker, Proxy, amqp_uri, unique, wait_for


def _stream(spark: Any, port: int, queue: str, **options: Any) -> Any:
    reader = spark.readStream.format("hutch").option("uri", amqp_uri(port)).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _report(record_property: Any, name: str, seen: Counter[str], expected: list[str]) -> int:
    duplicates = sum(c - 1 for c in seen.values())
    lost = sorted(set(expected) - set(seen))
    record_property(f"{name}_duplicates", duplicates)
    print(f"\n{name}: {len(expected)} messages published, {sum(seen.values())} rows seen, "
          f"{len(seen)} distinct, {duplicates} duplicates, {len(lost)} lost")
    assert not lost, f"lost {len(lost)} messages, e.g. {lost[:5]}"
    assert set(seen) == set(expected)
    return duplicates


def test_memory_sink_sees_exactly_n_distinct_messages(spark: Any, server: ServerInfo, broker: Broker,
                                                      tmp_path: Path) -> None:
    q = broker.declare()
    n = 2000
    bodies = broker.publish(q, n)
    table = unique("mem").replace("-", "_")
    query = (_stream(spark, server.amqp_port, q, maxMessagesPerTrigger=500)
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the AvailableNow query did not finish"
    assert query.exception() is None
    rows = spark.sql(f"select cast(value as string) v, redelivered, queue, properties.message_id mid, "
                     f"delivery_tag from {table}").collect()
    assert len(rows) == n
    assert {r.v for r in rows} == set(bodies)
    assert {r.mid for r in rows} == {str(i) for i in range(n)}
    assert {r.queue for r in rows} == {q} and not any(r.redelivered for r in rows)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == n and max(sizes) <= 500 and len(sizes) >= 4
    # Every batch, the last one included, was acknowledged: nothing went back to the queue when the
    # query's connection closed.
    assert broker.ready(q) == 0


def test_batches_are_acknowledged_without_waiting_for_more_data(spark: Any, server: ServerInfo,
                                                                broker: Broker, tmp_path: Path) -> None:
    q = broker.declare()
    table = unique("cont").replace("-", "_")
    query = (_stream(spark, server.amqp_port, q, maxMessagesPerTrigger=100)
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        bodies = []
        for wave in range(3):
            bodies += broker.publish(q, 120, start=wave * 120)
            time.sleep(0.3)
        assert wait_for(lambda: spark.sql(f"select count(*) c from {table}").first().c >= 360, 60)
        # A trigger that found no new data has run since: its read() settled the last batch.
        assert wait_for(lambda: not query.status["isDataAvailable"]
                        and query.status["message"].startswith("Waiting"), 30)
    finally:
        query.stop()
    rows = spark.sql(f"select cast(value as string) v from {table}").collect()
    assert sorted(r.v for r in rows) == sorted(bodies)
    assert broker.ready(q) == 0, "the last batch was not acknowledged before the query stopped"


@pytest.mark.slow  # 13 s; `make test` keeps the broker going away mid-query and the restart (below)
def test_sink_failing_mid_batch_then_restart_loses_nothing(spark: Any, server: ServerInfo, broker: Broker,
                                                           tmp_path: Path, record_property: Any) -> None:
    q = broker.declare()
    bodies = broker.publish(q, 1000)
    seen: Counter[str] = Counter()
    redelivered_seen: list[str] = []

    def sink(fail_in_batch: int | None) -> Any:
        def write(df: Any, batch_id: int) -> None:
            rows = df.selectExpr("cast(value as string) v", "redelivered").collect()
            seen.update(r.v for r in rows)
            redelivered_seen.extend(r.v for r in rows if r.redelivered)
            if batch_id == fail_in_batch and rows:
                raise RuntimeError("sink crashed in the middle of batch 1")
        return write

    ck = str(tmp_path / "ck")
    first = (_stream(spark, server.amqp_port, q, maxMessagesPerTrigger=250).writeStream
             .foreachBatch(sink(1)).option("checkpointLocation", ck).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="sink crashed"):
        first.awaitTermination(120)
    assert sum(seen.values()) == 500  # batch 0, and batch 1 whose sink failed after writing
    second = (_stream(spark, server.amqp_port, q, maxMessagesPerTrigger=250).writeStream
              .foreachBatch(sink(None)).option("checkpointLocation", ck).trigger(availableNow=True).start())
    assert second.awaitTermination(120) and second.exception() is None
    duplicates = _report(record_property, "sink_failure", seen, bodies)
    # Batch 0 was acknowledged; batch 1 was not, so its 250 messages came back (redelivered) once.
    # (Messages the first run had prefetched but not yet handed to Spark come back redelivered too.)
    assert duplicates == 250
    assert {b for b, c in seen.items() if c == 2} <= set(redelivered_seen)
    assert broker.ready(q) == 0


@pytest.mark.slow  # 16-26 s; `make test` keeps the broker going away mid-query and the restart (below)
def test_query_stopped_mid_batch_then_restarted_loses_nothing(spark: Any, server: ServerInfo, broker: Broker,
                                                              tmp_path: Path, record_property: Any) -> None:
    from pyspark.sql.functions import udf

    q = broker.declare()
    bodies = broker.publish(q, 1000)
    hold = tmp_path / "hold"        # while it exists, the task holding m0000300 blocks
    holding = tmp_path / "holding"  # created by that task once it blocks: the batch is in flight
    hold.touch()

    def hold_m300(v):  # no type hints: PySpark would take them for a pandas UDF
        text = v.decode()
        if text == "m0000300":
            while hold.exists():
                holding.touch()
                time.sleep(0.05)
        return text

    slow = udf(hold_m300, "string", useArrow=False)

    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def start() -> Any:
        df = _stream(spark, server.amqp_port, q, maxMessagesPerTrigger=250)
        return (df.select(slow("value").alias("v"), "redelivered").writeStream.format("json")
                .option("path", out).option("checkpointLocation", ck).trigger(availableNow=True).start())

    first = start()
    assert wait_for(holding.exists, 90), "batch 1 never started"
    first.stop()  # cancels the running batch's tasks
    hold.unlink()
    assert first.exception() is None
    second = start()
    assert second.awaitTermination(120) and second.exception() is None
    rows = spark.read.json(out).collect()
    seen = Counter(r.v for r in rows)
    duplicates = _report(record_property, "stopped_mid_batch", seen, bodies)
    # The stopped batch wrote nothing the file sink committed, so nothing is seen twice.
    assert duplicates == 0
    assert sum(1 for r in rows if r.redelivered) >= 1, "the stopped batch's messages were redelivered"
    assert broker.ready(q) == 0


def test_broker_going_away_fails_the_query_and_the_restart_loses_nothing(
        spark: Any, server: ServerInfo, broker: Broker, tmp_path: Path, record_property: Any) -> None:
    q = broker.declare()
    bodies = broker.publish(q, 600)
    proxy = Proxy(server.amqp_port)
    seen: Counter[str] = Counter()

    def write(df: Any, batch_id: int) -> None:
        seen.update(r.v for r in df.selectExpr("cast(value as string) v").collect())
        if batch_id == 1:
            proxy.cut()  # the broker goes away while batch 1 is being written

    ck = str(tmp_path / "ck")
    try:
        first = (_stream(spark, proxy.port, q, maxMessagesPerTrigger=200, pollTimeoutMs=50).writeStream
                 .foreachBatch(write).option("checkpointLocation", ck)
                 .trigger(processingTime="100 milliseconds").start())
        with pytest.raises(Exception, match="hutch source") as err:
            first.awaitTermination(60)
        text = str(err.value)
        assert "closed the connection" in text or "lost" in text, text
        assert "restart the query from its checkpoint" in text
        proxy.restore()
        second = (_stream(spark, proxy.port, q, maxMessagesPerTrigger=200).writeStream
                  .foreachBatch(write).option("checkpointLocation", ck).trigger(availableNow=True).start())
        assert second.awaitTermination(120) and second.exception() is None
    finally:
        proxy.close()
    duplicates = _report(record_property, "broker_gone", seen, bodies)
    assert duplicates == 200  # batch 1 finished in Spark but its acknowledgement never reached the broker
    assert broker.ready(q) == 0


def test_available_now_stops_at_what_was_ready(spark: Any, server: ServerInfo, broker: Broker,
                                               tmp_path: Path) -> None:
    q = broker.declare()
    broker.publish(q, 300)
    table = unique("an").replace("-", "_")
    query = (_stream(spark, server.amqp_port, q, maxMessagesPerTrigger=100)
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    broker.publish(q, 50, start=300)  # may or may not be counted, but the query must end
    assert query.awaitTermination(60) and query.exception() is None
    count = spark.sql(f"select count(*) c from {table}").first().c
    assert 300 <= count <= 350
    assert broker.ready(q) == 350 - count
    assert os.path.isdir(tmp_path / "ck" / "commits")
