"""Sub-entry batches of a stream-protocol publisher (rstream's `send_sub_entry`) read by an AMQP 0-9-1
consumer (pika): uncompressed and gzip sub-batches give their messages with their offsets; a sub-batch
that lies about its uncompressed length (a gzip bomb) is skipped, and what follows it is delivered."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from rstream import AMQPMessage, CompressionType, ConfirmationStatus, Producer
from rstream.compression import GzipCompressionCodec, StreamCompressionCodecs

from .conftest import StreamServer
from .equivalence import _pika_read

pytestmark = pytest.mark.asyncio
WAIT_S = 30.0


async def send_batches(server: StreamServer, stream: str, batches: Sequence[tuple[list[bytes], CompressionType]]
                       ) -> None:
    """Each batch as one sub-entry (rstream), every message confirmed."""
    confirmed = asyncio.Event()
    want = len(batches)
    got: list[bool] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        got.append(status.is_confirmed)
        if len(got) == want:
            confirmed.set()

    async with Producer("127.0.0.1", port=server.port, username="guest", password="guest") as p:
        await p.create_stream(stream, exists_ok=True)
        for bodies, codec in batches:
            await p.send_sub_entry(stream, [AMQPMessage(body=b) for b in bodies], compression_type=codec,
                                   on_publish_confirm=on_confirm)
        await asyncio.wait_for(confirmed.wait(), WAIT_S)
    assert all(got)


def pika_read(server: StreamServer, stream: str, count: int) -> list[tuple[int, bytes]]:
    """The first `count` (x-stream-offset, body) pika gets from `first`."""
    return _pika_read(server.info.url, stream, count, {"x-stream-offset": "first"})


async def test_uncompressed_and_gzip_sub_batches_reach_an_amqp_consumer(stream_server: StreamServer) -> None:
    plain = [f"plain-{i}".encode() for i in range(3)]
    zipped = [f"gzip-{i}".encode() * (i + 1) for i in range(50)]
    await send_batches(stream_server, "sub-batches", [(plain, CompressionType.No), (zipped, CompressionType.Gzip)])
    got = await asyncio.to_thread(pika_read, stream_server, "sub-batches", 53)
    assert [b for _, b in got] == plain + zipped
    assert [o for o, _ in got] == list(range(53))


class _LyingGzip(GzipCompressionCodec):
    """A hostile publisher's codec: 4 MiB of zeros gzip'd, declared as 16 bytes uncompressed."""

    def compress(self, messages: Sequence[Any]) -> None:
        super().compress(messages)
        self.buffer = gzip.compress(b"\0" * (4 * 1024 * 1024))
        self.compressed_data_size = len(self.buffer)
        self.uncompressed_data_size = 16


@pytest.fixture
def lying_codec() -> Iterator[CompressionType]:
    """rstream's codec table is global: the lie is registered under lz4 for one test and taken back."""
    codecs = StreamCompressionCodecs.available_compress_codecs
    before = codecs.get(CompressionType.Lz4)
    StreamCompressionCodecs.register_codec(CompressionType.Lz4, _LyingGzip())
    yield CompressionType.Lz4
    if before is None:
        del codecs[CompressionType.Lz4]
    else:
        codecs[CompressionType.Lz4] = before


async def test_a_sub_batch_that_lies_about_its_size_is_skipped(stream_server: StreamServer,
                                                               lying_codec: CompressionType) -> None:
    await send_batches(stream_server, "sub-batch-bomb", [
        ([b"before"], CompressionType.Gzip), ([b"x", b"y"], lying_codec), ([b"after"], CompressionType.Gzip)])
    got = await asyncio.to_thread(pika_read, stream_server, "sub-batch-bomb", 2)
    assert got == [(0, b"before"), (3, b"after")]
