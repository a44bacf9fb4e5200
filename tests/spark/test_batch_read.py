"""Batch reads (`spark.read.format("hutch")`) against a real hutch process."""

from __future__ import annotations

from typing import Any

import pika

from conftest import ServerInfo

from .helpers import Broker, amqp_uri


def _read(spark: Any, port: int, queue: str, **options: Any) -> Any:
    reader = spark.read.format("hutch").option("uri", amqp_uri(port)).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_batch_read_drains_up_to_max_messages_and_acknowledges_them(spark: Any, server: ServerInfo,
                                                                   broker: Broker) -> None:
    q = broker.declare()
    props = lambda i: pika.BasicProperties(message_id=f"id-{i}", content_type="text/plain", priority=3,  # noqa: E731
                                           timestamp=1_700_000_000 + i, headers={"n": i, "who": "test"})
    bodies = broker.publish(q, 100, properties=props)
    rows = _read(spark, server.amqp_port, q, maxMessages=60).collect()
    assert [bytes(r.value).decode() for r in rows] == bodies[:60], "one partition keeps queue order"
    first = rows[0]
    assert first.queue == q and first.exchange == "" and first.routing_key == q and first.redelivered is False
    assert first.properties.message_id == "id-0" and first.properties.priority == 3
    assert first.properties.content_type == "text/plain" and first.headers == {"n": "0", "who": "test"}
    assert first.timestamp == first.properties.timestamp and first.timestamp.year == 2023
    assert first.delivery_count is None  # classic queues do not count deliveries
    assert broker.ready(q) == 40


def test_ack_mode_none_leaves_the_messages_in_the_queue(spark: Any, server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    broker.publish(q, 30)
    peek = _read(spark, server.amqp_port, q, ackMode="none").collect()
    assert len(peek) == 30
    assert broker.ready(q) == 30
    again = _read(spark, server.amqp_port, q).collect()
    assert len(again) == 30 and all(r.redelivered for r in again)
    assert broker.ready(q) == 0


def test_partitions_split_a_drain_larger_than_prefetch(spark: Any, server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    bodies = broker.publish(q, 500)
    df = _read(spark, server.amqp_port, q, prefetch=200)
    assert df.rdd.getNumPartitions() == 3  # ceil(500 / 200): a task holds at most `prefetch` unacked
    rows = df.collect()
    assert sorted(bytes(r.value).decode() for r in rows) == bodies
    assert broker.ready(q) == 0


def test_an_empty_queue_reads_no_rows(spark: Any, server: ServerInfo, broker: Broker) -> None:
    q = broker.declare()
    assert _read(spark, server.amqp_port, q).count() == 0
