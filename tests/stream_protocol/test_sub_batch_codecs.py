"""Snappy, lz4 and zstd sub-entry batches of a stream-protocol publisher (rstream's `send_sub_entry` with
`CompressionType.Snappy`, `Lz4` and `Zstd`) read by an AMQP 0-9-1 consumer (pika): each record at its own
offset. A sub-batch that declares a few bytes and expands to megabytes (a bomb) is skipped and what
follows it is delivered.

rstream numbers the three codecs but ships no codec for them (an application registers its own with
`StreamCompressionCodecs.register_codec`); the codecs registered here write what RabbitMQ's Java client
writes: snappy's framing format, the LZ4 frame format, a zstd frame (cramjam's `compress`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cramjam
import pytest
from rstream import CompressionType
from rstream.compression import NoneCompressionCodec, StreamCompressionCodecs

from .conftest import StreamServer
from .test_sub_batches import pika_read, send_batches

pytestmark = pytest.mark.asyncio

COMPRESS: dict[CompressionType, Callable[[bytes], Any]] = {
    CompressionType.Snappy: cramjam.snappy.compress,
    CompressionType.Lz4: cramjam.lz4.compress,
    CompressionType.Zstd: cramjam.zstd.compress,
}
BOMB = CompressionType.Gzip  # the slot the hostile codec takes for one test (hutch decodes gzip too)


class _FramedCodec(NoneCompressionCodec):
    """rstream's sub-entry framing (u32 length + bytes per message), compressed as a whole with
    `compress`; with `expand_to`, a hostile publisher's: that many zero bytes compressed instead, declared
    as the real (small) uncompressed size."""

    def __init__(self, code: CompressionType, expand_to: int = 0) -> None:
        super().__init__()
        self.code = code
        self.expand_to = expand_to

    def compress(self, messages: Sequence[Any]) -> None:
        super().compress(messages)
        plain = b"\0" * self.expand_to if self.expand_to else self.buffer
        self.buffer = bytes(COMPRESS[self.code](plain))
        self.compressed_data_size = len(self.buffer)

    def compression_type(self) -> int:
        return int(self.code.value)


@pytest.fixture
def framed_codecs() -> Iterator[None]:
    """rstream's codec table is global: snappy, lz4 and zstd are registered for one test and taken back,
    with a zstd bomb under gzip's number (hutch decodes by the number in the frame, so the bomb goes as
    codec 4)."""
    codecs = StreamCompressionCodecs.available_compress_codecs
    slots = [*COMPRESS, BOMB]
    before = {slot: codecs.get(slot) for slot in slots}
    for code in COMPRESS:
        StreamCompressionCodecs.register_codec(code, _FramedCodec(code))
    StreamCompressionCodecs.register_codec(BOMB, _FramedCodec(CompressionType.Zstd, expand_to=8 * 1024 * 1024))
    yield
    for slot, codec in before.items():
        if codec is None:
            del codecs[slot]
        else:
            codecs[slot] = codec


async def test_snappy_lz4_and_zstd_sub_batches_reach_an_amqp_consumer(stream_server: StreamServer,
                                                                     framed_codecs: None) -> None:
    batches = [([f"{code.name}-{i}".encode() * (i + 1) for i in range(40)], code) for code in COMPRESS]
    await send_batches(stream_server, "sub-batch-codecs", batches)
    want = [body for bodies, _ in batches for body in bodies]
    got = await asyncio.to_thread(pika_read, stream_server, "sub-batch-codecs", len(want))
    assert [b for _, b in got] == want
    assert [o for o, _ in got] == list(range(len(want)))


async def test_a_zstd_bomb_is_skipped_and_what_follows_is_delivered(stream_server: StreamServer,
                                                                   framed_codecs: None) -> None:
    await send_batches(stream_server, "sub-batch-zstd-bomb", [
        ([b"before"], CompressionType.Snappy), ([b"x", b"y"], BOMB), ([b"after"], CompressionType.Lz4)])
    got = await asyncio.to_thread(pika_read, stream_server, "sub-batch-zstd-bomb", 2)
    assert got == [(0, b"before"), (3, b"after")]
