"""pika and rstream on one stream, against a real hutch node, give what RabbitMQ gives (issue 23): the
steps and the expected reads (checked by hand against RabbitMQ 3.10.8; filtering per RabbitMQ 4.x's
documentation) are in tests/stream_protocol/equivalence.py."""

from __future__ import annotations

import pytest

from .conftest import StreamServer
from .equivalence import EXPECTED, READERS, run_steps

pytestmark = pytest.mark.asyncio


async def test_pika_and_rstream_read_one_stream_as_rabbitmq_does(stream_server: StreamServer) -> None:
    got = await run_steps(stream_server.info.url, "127.0.0.1", stream_server.port, "eq-stream")
    expected = {(name, reader): rows for name, rows in EXPECTED.items() for reader in READERS
                if not (name.startswith("interval") and reader == "rstream")}
    assert got == expected
