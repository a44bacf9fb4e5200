"""A dynamic shovel on a cluster of three runs on one node (the metadata leader) and moves to another
when that node is killed; quorum queues at both ends, so nothing is lost on the way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from .nodes import Cluster, Node, eventually

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path, 3)
    yield c
    c.stop()


def shovels(c: Cluster, via: Node | None = None) -> list[dict[str, Any]]:
    """The cluster's shovels as one node lists them (it gathers every running member's)."""
    node = via or next(n for n in c.nodes if n.running())
    code, doc = node.api("GET", "/api/shovels")
    assert code == 200, doc
    return list(doc)


def publish(n: Node, queue: str, first: int, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(n.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", queue, b"%d" % i, PERSISTENT)
    conn.close()


def bodies(n: Node, queue: str) -> set[bytes]:
    conn = pika.BlockingConnection(pika.URLParameters(n.url))
    ch = conn.channel()
    out = set()
    while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
        out.add(got[2])
    conn.close()
    return out


def depth(n: Node, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(n.url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def test_the_shovel_moves_when_its_node_goes(cluster: Cluster) -> None:
    first = cluster[0]
    conn = pika.BlockingConnection(pika.URLParameters(first.url))
    ch = conn.channel()
    for q in ("cs-src", "cs-dst"):
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    code, doc = first.api("PUT", "/api/parameters/shovel/%2F/cs", {"value": {
        "src-uri": "amqp://", "src-queue": "cs-src", "dest-uri": "amqp://", "dest-queue": "cs-dst",
        "reconnect-delay": 1}})
    assert code == 201, doc
    (running,) = eventually(lambda: [s for s in shovels(cluster) if s["state"] == "running"], timeout=30)
    home = next(n for n in cluster.nodes if n.full_name == running["node"])
    other = next(n for n in cluster.nodes if n is not home)
    assert [s["name"] for s in shovels(cluster, via=other)] == ["cs"]  # listed by a node that does not run it
    publish(other, "cs-src", 0, 100)
    eventually(lambda: depth(other, "cs-dst") == 100, timeout=30)
    home.kill()
    moved = eventually(lambda: [s for s in shovels(cluster) if s["state"] == "running"], timeout=60)
    assert [s["node"] for s in moved] != [home.full_name] and len(moved) == 1
    publish(other, "cs-src", 100, 100)
    eventually(lambda: depth(other, "cs-dst") >= 200, timeout=60)
    assert bodies(other, "cs-dst") == {b"%d" % i for i in range(200)}
    home.start()
    # back in the cluster, the old node does not run a second copy
    eventually(lambda: len([s for s in shovels(cluster) if s["name"] == "cs"]) == 1, timeout=30)
