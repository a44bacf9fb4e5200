"""Compaction of load in a node of 2 workers (`workers.compaction`, runtime/compaction.py): an island (a
queue and the connections that use only it) moved to the other worker mid-flow, with pika.

The move is forced with the test hook (`SIGUSR1` to the worker that holds the island: it moves its busiest
movable island to the next worker), so it is certain and its moment known; the controller's own moves
are judged from the same reports (tests/unit/test_compaction.py). Connections are pinned to a worker
(`workers.own_ports`); which worker holds a client's socket is read from /proc, as in test_locality.py.
Waits poll with generous deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from tests.conftest import ServerInfo, start_server
from tests.workers.test_locality import connect, declare_in
from tests.workers.test_workers import (
    PERSISTENT,
    client_port,
    holders,
    queue_json,
    until,
    worker_of,
    worker_pid,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CONFIG = "workers.own_ports = true\nworkers.heartbeat_timeout = 30000\ncluster.tick_interval = 50\n" \
         "cluster.metadata_timeout = 5000\nworkers.compaction = true\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("compaction"), "--workers", "2", config_text=CONFIG)
    yield info
    info.stop()


def force_move(info: ServerInfo, source: int, queue: str, target: int) -> None:
    """SIGUSR1 to worker `source` (again each second: its island is judged from its last report) until
    `queue`'s record names worker `target`."""
    pid = worker_pid(info, source)
    assert pid is not None
    signalled = [0.0]

    def moved() -> bool:
        if worker_of(info, queue) == target:
            return True
        if time.monotonic() - signalled[0] >= 1.0:
            signalled[0] = time.monotonic()
            os.kill(pid, signal.SIGUSR1)
        return False
    until(moved, timeout=60, what=f"{queue} in worker {target}")


class Consumer:
    """A pika consumer that records each delivery (tag, body, redelivered) as it comes."""

    def __init__(self, conn: pika.BlockingConnection, queue: str, prefetch: int) -> None:
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bytes, bool]] = []
        self.ch.basic_consume(queue, self._on)
        self.conn = conn

    def _on(self, _ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.got.append((method.delivery_tag, body, method.redelivered))

    def wait_for(self, n: int) -> None:
        until(lambda: self.conn.process_data_events(time_limit=0.05) or len(self.got) >= n, timeout=60,
              what=f"{n} deliveries (have {len(self.got)})")


def test_a_publisher_and_consumer_move_with_their_queue_mid_flow(node: ServerInfo) -> None:
    """A publisher with confirms and a consumer (prefetch 10, 10 unacked) of one queue in worker 1,
    moved to worker 0: nothing lost or duplicated, order kept, delivery tags and confirms continue, the
    tags delivered before the move acked after it, both sockets now in worker 0, the management API
    listing the queue once, in worker 0."""
    queue = declare_in(node, 1, "isle")
    with connect(node, 1) as pub, connect(node, 1) as sub:
        pch = pub.channel()
        pch.confirm_delivery()
        for i in range(100):  # each returns once confirmed
            pch.basic_publish("", queue, b"%d" % i, PERSISTENT)
        consumer = Consumer(sub, queue, prefetch=10)
        consumer.wait_for(10)
        consumer.ch.basic_ack(consumer.got[4][0], multiple=True)  # 1..5 acked, 6..10 unacked
        consumer.wait_for(15)  # 5 more: 10 unacked across the move
        assert holders(node, client_port(pub)) == {1} and holders(node, client_port(sub)) == {1}
        force_move(node, 1, queue, 0)
        until(lambda: holders(node, client_port(pub)) == {0} and holders(node, client_port(sub)) == {0},
              what="both sockets in worker 0")
        for i in range(100, 200):  # confirms continue in worker 0
            pch.basic_publish("", queue, b"%d" % i, PERSISTENT)
        consumer.ch.basic_ack(consumer.got[-1][0], multiple=True)  # tags delivered before the move
        while len(consumer.got) < 200:
            n = len(consumer.got)
            consumer.wait_for(n + 1)
            consumer.ch.basic_ack(consumer.got[-1][0], multiple=True)
        consumer.conn.process_data_events(time_limit=0.2)
        assert [b for _t, b, _r in consumer.got] == [b"%d" % i for i in range(200)]  # once each, in order
        assert [t for t, _b, _r in consumer.got] == list(range(1, 201))  # tags continue across the move
        assert not any(r for _t, _b, r in consumer.got)
    doc = until(lambda: (lambda d: d if d["messages"] == 0 and d.get("worker") == 0 else None)(queue_json(node, queue)),
                what="the queue empty in worker 0")
    assert doc["node"] == "test@localhost"
    listed = [q for q in _queues(node) if q["name"] == queue]
    assert len(listed) == 1 and listed[0]["worker"] == 0


def _queues(info: ServerInfo) -> list[dict[str, Any]]:
    import json
    import urllib.request
    from base64 import b64encode
    req = urllib.request.Request(f"{info.mgmt_url}/api/queues",
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        out: list[dict[str, Any]] = json.loads(resp.read())
    return out
