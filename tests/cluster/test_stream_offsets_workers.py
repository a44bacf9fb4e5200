"""A node of 2 worker processes holds a replica of every stream in each worker (docs/scaling.md, "The
stream protocol in every worker"), so its streams are replicated ones: their first message is at offset
0, as on RabbitMQ and on a node of one process (stream_replica.py, "No marker when there is nothing to
commit"). Read with pika (`x-stream-offset`) and with rstream (the chunk's offsets)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from .nodes import Cluster
from .test_stream_cluster import (
    STREAM_CONF,
    declare,
    publish,
    read_first,
    rstream_publish,
    rstream_read_offsets,
    stream_port,
)


@pytest.fixture
def node_of_workers(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.add(join=False, workers="2", config_text=STREAM_CONF)
    yield c
    c.stop()


def test_a_fresh_stream_starts_at_offset_0_on_a_node_of_workers(node_of_workers: Cluster) -> None:
    node = node_of_workers.nodes[0]
    declare(node, "w-events")
    confirmed = publish(node, "w-events", [f"m{i}" for i in range(5)])
    assert len(confirmed) == 5
    assert read_first(node, "w-events", 5) == [(i, f"m{i}") for i in range(5)]
    port = stream_port(node)
    asyncio.run(rstream_publish(port, "w-events", [b"r0", b"r1"]))
    got = asyncio.run(rstream_read_offsets(port, "w-events", 7))
    assert [o for o, _ in got] == list(range(7))
    assert [b for _, b in got[5:]] == [b"r0", b"r1"]
