"""The JVM reader (`format("hutch-jvm")`) with what the Python source also reads: TLS (`amqps://` with
RabbitMQ's query parameters: the broker verified against a CA file, a client certificate presented),
`hosts` (the uri's node down: the next host answers; none answering: each named), and compressed
sub-batches of every codec (gzip, snappy, lz4, zstd; a sub-batch that cannot be read left out), each
against a real hutch node under `local[2]`, the rows compared with the Python source's where both read
the same thing. (Super streams on both paths: tests/spark/test_super_stream_read.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rstream import CompressionType
from rstream.compression import StreamCompressionCodecs
from tests.stream_protocol.test_sub_batch_codecs import COMPRESS, _FramedCodec
from tests.stream_protocol.test_sub_batches import send_batches
from tests.tls.conftest import start_tls_node

from conftest import ServerInfo, free_port

from .helpers import Broker, amqp_uri, declare_stream, unique


def _rows(spark: Any, fmt: str, uri: str, stream: str, **options: Any) -> list[tuple[int, bytes]]:
    r = spark.read.format(fmt).option("uri", uri).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, str(value))
    return sorted((row.offset, bytes(row.value)) for row in r.load().select("offset", "value").collect())


def test_tls_with_a_client_certificate_and_a_refused_ca(spark: Any, jvm_reader: str, tmp_path: Path) -> None:
    node = start_tls_node(tmp_path, "stream.listeners.ssl.default = 0\n", https=False, fail_if_no_peer_cert=True)
    broker = Broker(node.info.amqp_port)
    try:
        stream = declare_stream(broker, "tls")
        bodies = broker.publish(stream, 40)
        cert, key = node.pki.issue("client")
        uri = (f"amqps://guest:guest@localhost:{node.amqps_port}/%2F?cacertfile={node.pki.cacertfile}"
               f"&certfile={cert}&keyfile={key}")
        port = node.info.ports["stream_tls"]
        got = _rows(spark, jvm_reader, uri, stream, streamPort=port)
        assert [b.decode() for _, b in got] == bodies
        assert got == _rows(spark, "hutch-python", uri, stream, streamPort=port)
        # the broker's certificate is not of this CA: the handshake fails, and says so
        other = f"amqps://guest:guest@localhost:{node.amqps_port}/%2F?cacertfile={node.other.cacertfile}"
        with pytest.raises(Exception, match="handshake with rabbitmq-stream\\+tls://guest@localhost"):
            _rows(spark, jvm_reader, other, stream, streamPort=port)
    finally:
        broker.close()
        node.info.stop()


def test_hosts_pass_over_a_node_that_does_not_answer(spark: Any, jvm_reader: str, server: ServerInfo,
                                                     broker: Broker) -> None:
    stream = declare_stream(broker, "jh")
    bodies = broker.publish(stream, 30)
    dead, dead_stream = free_port(), free_port()
    live = f"127.0.0.1:{server.ports['stream']}"
    got = _rows(spark, jvm_reader, amqp_uri(dead), stream, streamPort=dead_stream, hosts=live, minPartitions=2)
    assert [b.decode() for _, b in got] == bodies
    other = free_port()
    with pytest.raises(Exception, match=rf"none of the 2 hosts answered.*127\.0\.0\.1:{dead_stream}: .*"
                                        rf"127\.0\.0\.1:{other}: "):
        _rows(spark, jvm_reader, amqp_uri(dead), stream, streamPort=dead_stream, hosts=f"127.0.0.1:{other}")
    with pytest.raises(Exception, match="option 'hosts': 'a:b:c' is not host"):
        _rows(spark, jvm_reader, amqp_uri(dead), stream, hosts="a:b:c")


@pytest.fixture
def codecs() -> Iterator[dict[CompressionType, Any]]:
    """rstream's codec table (global) with snappy, lz4 and zstd in the framings RabbitMQ's Java client writes,
    for this test; taken back after it."""
    table = StreamCompressionCodecs.available_compress_codecs
    before = {code: table.get(code) for code in COMPRESS}
    for code in COMPRESS:
        StreamCompressionCodecs.register_codec(code, _FramedCodec(code))
    yield table
    for code, codec in before.items():
        if codec is None:
            del table[code]
        else:
            table[code] = codec


def test_sub_batches_of_every_codec_and_one_that_cannot_be_read(spark: Any, jvm_reader: str, server: ServerInfo,
                                                                broker: Broker,
                                                                codecs: dict[CompressionType, Any]) -> None:
    stream = unique("jcodec")
    port = SimpleNamespace(port=server.ports["stream"])
    kinds = [CompressionType.No, CompressionType.Gzip, *COMPRESS]
    batches = [([f"{code.name}-{i}".encode() * (i + 1) for i in range(30)], code) for code in kinds]
    asyncio.run(send_batches(port, stream, batches))  # type: ignore[arg-type]  # only .port is used
    # a bomb: a zstd frame of 8 MiB of zeros declared as a few bytes, sent as snappy's number: left out
    codecs[CompressionType.Snappy] = _FramedCodec(CompressionType.Zstd, expand_to=8 * 1024 * 1024)
    asyncio.run(send_batches(port, stream, [([b"x", b"y"], CompressionType.Snappy),
                                            ([b"after"], CompressionType.No)]))  # type: ignore[arg-type]
    want = [body for bodies, _ in batches for body in bodies]
    uri = amqp_uri(server.amqp_port)
    got = _rows(spark, jvm_reader, uri, stream, streamPort=server.ports["stream"])
    assert [b for _, b in got] == [*want, b"after"]
    assert [o for o, _ in got] == [*range(len(want)), len(want) + 2]
    assert got == _rows(spark, "hutch-python", uri, stream, streamPort=server.ports["stream"])
