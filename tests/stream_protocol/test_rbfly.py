"""rbfly (PyPI), a second stream client with its own (Cython) codec, against a real hutch node: publish
with a named publisher (confirms, message ids from the node's publisher sequence), subscribe from first
and from an offset, and store an offset that a subscription by reference then starts after."""

from __future__ import annotations

import asyncio

import pytest
from rbfly.amqp import get_message_ctx
from rbfly.streams import Offset, streams_client

from .conftest import StreamServer

pytestmark = pytest.mark.asyncio
WAIT_S = 30.0


def uri(server: StreamServer) -> str:
    return f"rabbitmq-stream://guest:guest@127.0.0.1:{server.port}/"


async def take(client: object, stream: str, offset: Offset, count: int) -> list[tuple[int, object]]:
    got: list[tuple[int, object]] = []

    async def run() -> None:
        async for body in client.subscribe(stream, offset=offset):  # type: ignore[attr-defined]
            got.append((get_message_ctx().stream_offset, body))
            if len(got) == count:
                return
    await asyncio.wait_for(run(), WAIT_S)
    return got


async def test_publish_subscribe_and_offsets(stream_server: StreamServer) -> None:
    client = streams_client(uri(stream_server))
    try:
        await client.create_stream("rb-basic")
        async with client.publisher("rb-basic", name="rb-app") as publisher:
            for i in range(20):
                await publisher.send(b"m%d" % i)
        async with client.publisher("rb-basic", name="rb-app") as publisher:
            assert publisher.message_id == 21  # the node's sequence for "rb-app" is 20
        got = await take(client, "rb-basic", Offset.FIRST, 20)
        assert got == [(i, b"m%d" % i) for i in range(20)]
        got = await take(client, "rb-basic", Offset.offset(15), 5)
        assert got == [(15 + i, b"m%d" % (15 + i)) for i in range(5)]
        await client.write_offset("rb-basic", "rb-reader", 9)
        for _ in range(100):  # store offset has no answer: wait until it is committed
            try:
                got = await take(client, "rb-basic", Offset.reference("rb-reader"), 1)
                if got == [(10, b"m10")]:
                    break
            except Exception:  # rbfly raises while the reference is not stored yet
                await asyncio.sleep(0.05)
        assert got == [(10, b"m10")]
    finally:
        await client.disconnect()
