"""Writes (`df.write` and `df.writeStream` with format("hutch")) and the round trip hutch -> Spark ->
hutch, against a real hutch process. Every task waits for the broker's confirms before it succeeds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from conftest import ServerInfo

from .helpers import Broker, amqp_uri


def test_batch_write_publishes_every_row_with_confirms_and_deterministic_ids(
        spark: Any, server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    df = spark.range(0, 1000, numPartitions=4).selectExpr(
        "concat('order-', cast(id as string)) as value",
        "map('n', cast(id as string), 'shop', 'eu') as headers",
        "named_struct('content_type', 'text/plain', 'priority', 4, 'correlation_id', cast(id as string))"
        " as properties")
    (df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port))
     .option("routing_key", q).option("writeId", "job42").save())
    got = broker.get_all(q)
    assert sorted(b.decode() for _, _, b in got) == sorted(f"order-{i}" for i in range(1000))
    ids = [p.message_id for _, p, _ in got]
    assert len(set(ids)) == 1000
    # <writeId>:<batch 0>:<partition>:<row in partition>
    assert {i.rsplit(":", 2)[0] for i in ids} == {"job42:0"}
    assert Counter(i.split(":")[2] for i in ids) == {"0": 250, "1": 250, "2": 250, "3": 250}
    assert {int(i.split(":")[3]) for i in ids} == set(range(250))
    _, p, body = got[0]
    assert p.headers["shop"] == "eu" and p.headers["n"] == body.decode().split("-")[1]
    assert p.content_type == "text/plain" and p.priority == 4 and p.delivery_mode == 2


def test_routing_by_columns_and_option_override(spark: Any, server: ServerInfo, broker: Broker) -> None:
    ex = f"x-{broker.declare()}"
    broker.ch.exchange_declare(ex, "direct")
    qa, qb = broker.declare(), broker.declare()
    broker.ch.queue_bind(qa, ex, "a")
    broker.ch.queue_bind(qb, ex, "b")
    df = spark.createDataFrame([(b"1", "a"), (b"2", "b"), (b"3", "b")], "value binary, routing_key string")
    df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port)).option("exchange", ex).save()
    assert (broker.ready(qa), broker.ready(qb)) == (1, 2)
    (df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port))
     .option("exchange", ex).option("routing_key", "a").save())
    assert (broker.ready(qa), broker.ready(qb)) == (4, 2)


def test_round_trip_hutch_spark_hutch_with_streaming_write(spark: Any, server: ServerInfo, broker: Broker,
                                                           tmp_path: Path) -> None:
    src, dst = broker.declare(), broker.declare()
    bodies = broker.publish(src, 900)
    uri = amqp_uri(server.amqp_port)
    df = (spark.readStream.format("hutch").option("uri", uri).option("queue", src)
          .option("maxMessagesPerTrigger", "300").load())
    shouted = df.selectExpr("upper(cast(value as string)) as value")
    query = (shouted.writeStream.format("hutch").option("uri", uri).option("routing_key", dst)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    got = broker.get_all(dst)
    assert sorted(b.decode() for _, _, b in got) == sorted(b.upper() for b in bodies)
    assert broker.ready(src) == 0
    # <query id>:<micro-batch>:<partition>:<row>; the query id survives restarts from the checkpoint
    ids = [p.message_id for _, p, _ in got]
    assert len(set(ids)) == 900
    assert {i.split(":")[0] for i in ids} == {query.id}
    assert {i.split(":")[1] for i in ids} == {"0", "1", "2"}


def test_a_hutch_stream_written_back_unchanged_keeps_message_ids(spark: Any, server: ServerInfo,
                                                                 broker: Broker, tmp_path: Path) -> None:
    src, dst = broker.declare(), broker.declare()
    broker.publish(src, 200)
    uri = amqp_uri(server.amqp_port)
    df = spark.readStream.format("hutch").option("uri", uri).option("queue", src).load()
    query = (df.writeStream.format("hutch").option("uri", uri).option("routing_key", dst)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    got = broker.get_all(dst)
    assert sorted(p.message_id for _, p, _ in got) == sorted(str(i) for i in range(200))


def test_typed_headers_and_properties_are_published_as_amqp_types(spark: Any, server: ServerInfo,
                                                                  broker: Broker) -> None:
    q = broker.declare()
    df = spark.createDataFrame(
        [("a", {"qty": 3, "big": 2**40}, ("corr-1", 7, None))],
        "value string, headers map<string, bigint>, properties struct<correlation_id: string, "
        "priority: int, message_id: string>")
    df = df.selectExpr("value", "headers", "named_struct('correlation_id', properties.correlation_id, "
                       "'priority', properties.priority, 'message_id', 'mine', "
                       "'timestamp', timestamp'2024-05-01 12:00:00') as properties")
    df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port)).option("routing_key", q) \
        .option("deliveryMode", "1").save()
    ((_, p, body),) = broker.get_all(q)
    assert body == b"a"
    assert p.headers == {"qty": 3, "big": 2**40}
    assert (p.correlation_id, p.priority, p.message_id, p.delivery_mode) == ("corr-1", 7, "mine", 1)
    assert p.timestamp == 1714564800  # UTC session time zone
