"""Bad options and bad DataFrames fail when the read, write or query starts, with a message that says
what is wrong (and before any message is consumed or published)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo

from .helpers import Broker, amqp_uri, unique


def _fails(fragment: str) -> Any:
    return pytest.raises(Exception, match=re.escape(fragment))


def test_read_options_fail_at_load(spark: Any, server: ServerInfo) -> None:
    uri = amqp_uri(server.amqp_port)
    with _fails("option 'queue' is required"):
        spark.read.format("hutch").option("uri", uri).load()
    with _fails("option 'uri' is required"):
        spark.readStream.format("hutch").option("queue", "orders").load()
    with _fails("option 'uri': bad URI 'http://localhost/': it must start with amqp://"):
        spark.read.format("hutch").option("uri", "http://localhost/").option("queue", "q").load()
    with _fails("unknown option(s) for a hutch source: maxmessagespertriger"):
        spark.readStream.format("hutch").option("uri", uri).option("queue", "q") \
            .option("maxMessagesPerTriger", "10").load()
    with _fails("'maxMessagesPerTrigger' (500) must not exceed 'prefetch' (100)"):
        spark.readStream.format("hutch").option("uri", uri).option("queue", "q").option("prefetch", "100") \
            .option("maxMessagesPerTrigger", "500").load()


def test_missing_queue_or_unreachable_broker_fail_the_read(spark: Any, server: ServerInfo, tmp_path: Path) -> None:
    uri = amqp_uri(server.amqp_port)
    with _fails("queue 'no-such-queue' does not exist in vhost '/'"):
        spark.read.format("hutch").option("uri", uri).option("queue", "no-such-queue").load().collect()
    df = spark.readStream.format("hutch").option("uri", uri).option("queue", "no-such-queue").load()
    query = df.writeStream.format("memory").queryName("never").option(
        "checkpointLocation", str(tmp_path / "ck")).start()
    with _fails("queue 'no-such-queue' does not exist"):
        query.awaitTermination(60)
    closed = amqp_uri(1, connection_timeout=2000)
    with _fails("cannot connect to amqp://guest@127.0.0.1:1/%2F"):
        spark.read.format("hutch").option("uri", closed).option("queue", "q").load().collect()


def test_a_custom_read_schema_is_refused(spark: Any, server: ServerInfo) -> None:
    with _fails("the schema of a hutch read is fixed"):
        spark.read.format("hutch").schema("value string").option("uri", amqp_uri(server.amqp_port)) \
            .option("queue", "q").load().collect()


def test_bad_dataframes_fail_the_write_before_any_task(spark: Any, server: ServerInfo, broker: Broker,
                                                       tmp_path: Path) -> None:
    q = broker.declare()
    uri = amqp_uri(server.amqp_port)

    def write(df: Any, **options: str) -> None:
        w = df.write.format("hutch").mode("append").option("uri", uri)
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    with _fails("column 'value' must be binary or string, got bigint"):
        write(spark.range(3).withColumnRenamed("id", "value"), routing_key=q)
    with _fails("the DataFrame needs a 'value' column"):
        write(spark.range(3).selectExpr("cast(id as string) as body"), routing_key=q)
    with _fails("unexpected column 'id'"):
        write(spark.range(3).selectExpr("id", "cast(id as string) as value"), routing_key=q)
    with _fails("column 'routing_key' must be string, got int"):
        write(spark.range(3).selectExpr("cast(id as string) as value", "1 as routing_key"))
    with _fails("column 'headers' must be a map with string keys"):
        write(spark.range(3).selectExpr("cast(id as string) as value", "array(1) as headers"), routing_key=q)
    with _fails("unknown field 'properties.color'"):
        write(spark.range(3).selectExpr("cast(id as string) as value", "named_struct('color', 'red') as properties"),
              routing_key=q)
    with _fails("field 'properties.priority' must be an integer type, got string"):
        write(spark.range(3).selectExpr("cast(id as string) as value", "named_struct('priority', 'hi') as properties"),
              routing_key=q)
    with _fails("nothing says where messages go"):
        write(spark.range(3).selectExpr("cast(id as string) as value"))
    with _fails("a broker cannot be overwritten"):
        spark.range(3).selectExpr("cast(id as string) as value").write.format("hutch").mode("overwrite") \
            .option("uri", uri).option("routing_key", q).save()
    assert broker.ready(q) == 0
    df = spark.readStream.format("hutch").option("uri", uri).option("queue", q).load()
    query = (df.selectExpr("delivery_tag as value").writeStream.format("hutch").option("uri", uri)
             .option("routing_key", q).option("checkpointLocation", str(tmp_path / "ck")).start())
    with _fails("column 'value' must be binary or string, got bigint"):
        query.awaitTermination(60)


def test_unroutable_messages_fail_the_write(spark: Any, server: ServerInfo) -> None:
    df = spark.range(2).selectExpr("cast(id as string) as value")
    with _fails("2 of 2 messages were unroutable"):
        df.coalesce(1).write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port)) \
            .option("routing_key", "no-such-queue").save()
    # mandatory=false: the broker drops them, and the write succeeds
    df.write.format("hutch").mode("append").option("uri", amqp_uri(server.amqp_port)) \
        .option("routing_key", "no-such-queue").option("mandatory", "false").save()


def test_a_stream_is_refused_with_a_clear_message(spark: Any, server: ServerInfo, broker: Broker,
                                                  tmp_path: Path) -> None:
    stream = unique() + "-stream"
    broker.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    uri = amqp_uri(server.amqp_port)
    with _fails(f"queue '{stream}' in vhost '/' is a stream"):
        spark.read.format("hutch").option("uri", uri).option("queue", stream).load().collect()
    df = spark.readStream.format("hutch").option("uri", uri).option("queue", stream).load()
    query = df.writeStream.format("memory").queryName("stream_refused").option(
        "checkpointLocation", str(tmp_path / "ck")).start()
    with _fails("is a stream"):
        query.awaitTermination(60)
    broker.ch.queue_delete(stream)
