"""The JVM reader of streams (`format("hutch-jvm")`, src/hutch/spark/jvm/) against a real hutch process.

What is proven here (the streaming reads, exactly-once and restarted from a checkpoint, in micro-batches
bounded by `maxOffsetsPerTrigger`, run on both paths in tests/spark/test_stream_offsets.py): the rows are the Python source's rows, value for value (one
batch read by each, over messages with properties, headers of several types and a record that is not
an AMQP 1.0 message); `startingOffsets` (an offset, latest) and `startingTimestamp`; a query begun by
the Python source continues with the JVM reader from the same checkpoint, exactly once; offsets past
retention fail the query (`failOnDataLoss=true`) or are skipped (`false`); options the JVM reader does
not take are refused with a clear error. Without Spark: the jar builder's refusal without javac. The
starting positions, the switch between sources, the retention case and a node killed under a running
query (which then resumes from its checkpoint on the restarted node, each offset once) are slow
(`make test-slow`).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pika
import pytest

from conftest import ServerInfo, start_server
from hutch.amqp.uri import AmqpUri
from hutch.queues.stream.amqp10 import (
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    AmqpTimestamp,
    Described,
    Symbol,
    ULong,
    section,
)
from hutch.spark import jvm
from hutch.spark.streamclient import StreamClient

from .helpers import (
    Broker,
    amqp_uri,
    declare_stream,
    offsets_after_a_node_kill,
    parquet_offsets,
    run_available_now,
    starting_position_offsets,
    stream_reader,
    unique,
)


@pytest.fixture
def stream(broker: Broker) -> str:
    return declare_stream(broker, "jst")


_read = stream_reader


def _by_offset(df: Any) -> dict[int, dict[str, Any]]:
    return {r.offset: r.asDict(recursive=True) for r in df.collect()}


# what an AMQP 1.0 client may write that an AMQP 0-9-1 publish never does: floats, symbols, a ulong past
# 2^63, a UUID, binary, a timestamp, a described value, nested lists and maps; two data sections
_AMQP10_MESSAGE = b"".join((
    section(HEADER, [True, 4, 1000]),
    section(MESSAGE_ANNOTATIONS, {Symbol("x-opt-thing"): 1.5, Symbol("x-basic-type"): "kind"}),
    section(PROPERTIES, [ULong(12), b"user", None, None, "reply", uuid.UUID(int=7), "ct", "ce", None,
                         AmqpTimestamp(1_700_000_000_123), "app"]),
    section(APPLICATION_PROPERTIES, {"f": 1e20, "g": 1e-7, "h": -0.0, "i": 123.456, "sym": Symbol("s"),
                                     "ul": ULong(2**64 - 1), "u": uuid.UUID(int=1), "bin": b"\x80ok",
                                     "ts": AmqpTimestamp(1_700_000_000_999), "desc": Described(ULong(9), "v"),
                                     "nested": [1.0, {"a": [None, True]}, "q\"uote"]}),
    section(DATA, b"two "), section(DATA, b"parts"),
))


def test_the_rows_are_the_python_sources(spark: Any, jvm_reader: str, server: ServerInfo, broker: Broker,
                                          stream: str) -> None:
    kinds = [
        pika.BasicProperties(),
        pika.BasicProperties(message_id="m-1", delivery_mode=2, content_type="text/plain", priority=3,
                             correlation_id="c", reply_to="r", expiration="60000", timestamp=1_700_000_000,
                             type="t", user_id="guest", app_id="a", content_encoding="gzip"),
        pika.BasicProperties(headers={"n": 7, "neg": -2, "d": Decimal("1.25"), "b": True, "s": "é", "none": None,
                                      "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC), "bytes": b"\xff\x00a",
                                      "list": [1, "two", {"x": 1}], "table": {"k": "v", "n": [False]}}),
        pika.BasicProperties(delivery_mode=1, headers={"x-custom": "y"}),
    ]
    for i, props in enumerate(kinds):
        broker.ch.basic_publish("", stream, f"body-{i}".encode(), props)
    broker.ch.basic_publish("", stream, b"", pika.BasicProperties())  # an empty body
    raw = StreamClient(AmqpUri(host="127.0.0.1", port=server.ports["stream"]), "hutch-spark test").connect()
    try:
        raw.declare_publisher(1, "", stream)
        raw.publish(1, [(1, b"\xffnot an amqp 1.0 message"),  # a stream client's raw bytes
                        (2, _AMQP10_MESSAGE), (3, section(AMQP_VALUE, "a string body"))])
        raw.wait_confirms(0)
        raw.delete_publisher(1)
    finally:
        raw.close()
    python = _by_offset(_read(spark, "hutch-python", server, stream, streaming=False))
    java = _by_offset(_read(spark, jvm_reader, server, stream, streaming=False, minPartitions=3))
    assert sorted(python) == list(range(len(kinds) + 4))
    for offset, row in python.items():
        assert java[offset] == row, offset
    assert python[len(kinds) + 1]["properties"] is None  # the raw record: its bytes and nothing else
    assert python[len(kinds) + 2]["headers"]["f"] == "1e+20"  # Python's float repr, in JSON


@pytest.mark.slow  # four queries and a second's wait: ~12 s on a loaded machine (the Python source's is in make test)
def test_starting_positions(spark: Any, jvm_reader: str, server: ServerInfo, broker: Broker, stream: str,
                            tmp_path: Path) -> None:
    got = starting_position_offsets(spark, broker, stream, tmp_path,
                                    lambda **opts: _read(spark, jvm_reader, server, stream, **opts))
    assert got == {"offset": list(range(120, 150)), "ts": list(range(100, 150)), "latest": []}
    batch = _read(spark, jvm_reader, server, stream, streaming=False, startingOffsets='{"0": 10}',
                  endingOffsets='{"0": 40}', minPartitions=4)
    assert sorted(r.offset for r in batch.select("offset").collect()) == list(range(10, 40))


@pytest.mark.slow  # three queries, two of them by the Python source: ~40 s on a loaded machine
def test_a_query_switches_from_the_python_source_to_the_jvm_reader(
        spark: Any, jvm_reader: str, server: ServerInfo, broker: Broker, stream: str, tmp_path: Path) -> None:
    broker.publish(stream, 400)
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_available_now(_read(spark, "hutch-python", server, stream, startingOffsets="earliest"), out, ck)
    broker.publish(stream, 250, start=400)
    run_available_now(_read(spark, jvm_reader, server, stream, startingOffsets="earliest"), out, ck)
    broker.publish(stream, 50, start=650)
    run_available_now(_read(spark, "hutch-python", server, stream, startingOffsets="earliest"), out, ck)
    assert parquet_offsets(spark, out) == list(range(700))


@pytest.mark.slow  # a node killed and restarted under a running query: ~30 s
def test_node_killed_during_the_query_then_resume_exactly_once(spark: Any, jvm_reader: str, tmp_path: Path) -> None:
    read = lambda node, name, **opts: _read(spark, jvm_reader, node, name, **opts)  # noqa: E731
    assert offsets_after_a_node_kill(spark, tmp_path, read, "hutch-jvm source") == list(range(1000))


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("hutch-jst"), "--stream-port", "0")
    yield info
    info.stop()


@pytest.mark.slow  # 2,000 messages published in 100 rounds and four queries: ~40 s on a loaded machine
def test_offsets_past_retention_fail_or_are_skipped(spark: Any, jvm_reader: str, own_server: ServerInfo,
                                                    tmp_path: Path) -> None:
    name = unique("jst")
    b = Broker(own_server.amqp_port)
    try:
        b.ch.queue_declare(name, durable=True, arguments={
            "x-queue-type": "stream", "x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 5_000})
        b.publish(name, 20, body_size=100)
        out, ck = tmp_path / "out", tmp_path / "ck"
        run_available_now(_read(spark, jvm_reader, own_server, name, startingOffsets="earliest"), out, ck)
        assert parquet_offsets(spark, out) == list(range(20))
        for i in range(20, 2000, 20):  # many chunks and segments: retention removes the oldest
            b.publish(name, 20, start=i, body_size=100)
    finally:
        b.close()
    first = _read(spark, jvm_reader, own_server, name, streaming=False).agg({"offset": "min"}).collect()[0][0]
    assert first > 20
    with pytest.raises(Exception, match="no longer in the stream"):
        run_available_now(_read(spark, jvm_reader, own_server, name), out, ck)
    run_available_now(_read(spark, jvm_reader, own_server, name, failOnDataLoss="false"), out, ck)
    got = parquet_offsets(spark, out)
    assert got[:20] == list(range(20)) and got[20] >= first  # retention may have moved on since
    assert got[20:] == list(range(got[20], 2000))


def test_what_the_jvm_reader_does_not_take_is_refused(spark: Any, jvm_reader: str, server: ServerInfo,
                                                      stream: str) -> None:
    with pytest.raises(Exception, match="options 'stream' and 'superStream' exclude each other"):
        spark.read.format(jvm_reader).option("uri", amqp_uri(server.amqp_port)).option("superStream", "s") \
            .option("stream", "s").load().collect()
    with pytest.raises(Exception, match="does not exist"):
        _read(spark, jvm_reader, server, unique("missing"), streaming=False).collect()
    with pytest.raises(Exception, match="option 'startingOffsets' must be"):
        _read(spark, jvm_reader, server, stream, streaming=False, startingOffsets="soon").collect()


def test_the_jar_is_not_built_without_javac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_SPARK_JVM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(jvm.JvmReaderUnavailable, match="javac"):
        jvm.jar_path()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("*.jar"))
