"""Compaction of load at full speed (issue 26): an island moved while its publishers stream as fast as
they can, with pika, in a node of 2 workers.

The publishers' bodies are large (a read of their socket nearly always ends mid-message) and one body
is larger than frame_max (several body frames), so a move that held reading mid-message could never
get quiet: it must hold each connection between messages (runtime/session/connection.py,
`hold_island`). The move is forced (`SIGUSR1`) a few times at most, each given far longer than its wait
for quiet; it must commit (the queue's record names the target), and every message arrives once, in
order per publisher. Each publisher keeps at most a window of messages ahead of the consumer (the queue
stays far below the 16 MiB a move carries, `not_movable`, however slow the consumer is on a loaded
machine), and within it sends as fast as it can. Nothing here asserts a duration. Paced so, the island
has quiet moments, so this test passes on the tree before the fix too (c3ad50a, checked once); what that
fix changed is pinned by tests/session/test_island.py's island-hold test (a publish not begun unless
whole, a transport left reading paused).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.conftest import ServerInfo, start_server
from tests.workers.test_compaction import CONFIG, assert_once_in_order, drain_quiet
from tests.workers.test_locality import connect, declare_in
from tests.workers.test_workers import until, worker_of, worker_pid

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

BODY = 3000  # bytes: reads end mid-message
BIG = 300_000  # bytes: larger than pika's frame_max (131,072), three body frames
WINDOW = {BODY: 400, BIG: 12}  # messages a publisher may be ahead of the consumer: ~1.2 MB and ~3.6 MB


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("compaction-quiet"), "--workers", "2", config_text=CONFIG)
    yield info
    info.stop()


class Publisher(threading.Thread):
    """Publishes `<name>:<n>:` padded to `size` bytes to `queue`, n = 0, 1, ..., as fast as pika can
    while at most `WINDOW[size]` of them are not yet consumed by `sink`, until stopped (no confirms)."""

    def __init__(self, info: ServerInfo, queue: str, name: str, size: int, sink: Sink) -> None:
        super().__init__(daemon=True)
        self.conn = connect(info, 1)
        self.ch = self.conn.channel()
        self.queue, self.name, self.size = queue, name, size
        self.sent = 0
        self.sink, self.window = sink, WINDOW[size]
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.sent - self.sink.got.get(self.name, 0) >= self.window:
                    self.conn.process_data_events(time_limit=0.01)  # (heartbeats) until the consumer catches up
                    continue
                head = b"%s:%d:" % (self.name.encode(), self.sent)
                self.ch.basic_publish("", self.queue, head + b"x" * (self.size - len(head)))
                self.sent += 1
            self.conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class Sink(threading.Thread):
    """A consumer of `queue` (prefetch 200, acking each) that keeps every body's head."""

    def __init__(self, info: ServerInfo, queue: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(info, 1)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=200)
        self.ch.basic_consume(queue, self._on)
        self.heads: list[bytes] = []
        self.got: dict[str, int] = {}  # publisher name -> messages of it consumed
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _on(self, ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.heads.append(body[:32])
        name = body.split(b":", 1)[0].decode()
        self.got[name] = self.got.get(name, 0) + 1
        ch.basic_ack(method.delivery_tag)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.conn.process_data_events(time_limit=0.05)
            self.conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_an_island_streaming_at_full_speed_moves(node: ServerInfo) -> None:
    queue = declare_in(node, 1, "fullspeed")
    sink = Sink(node, queue)
    pubs = [Publisher(node, queue, "a", BODY, sink), Publisher(node, queue, "b", BODY, sink),
            Publisher(node, queue, "c", BIG, sink)]
    for t in (*pubs, sink):
        t.start()
    try:
        until(lambda: all(p.sent >= 50 for p in pubs) and len(sink.heads) >= 50, what="the island streaming")
        pid = worker_pid(node, 1)
        assert pid is not None
        for _try in range(3):  # each try far longer than a wait for quiet (the old one waited 5 s)
            os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 8
            while worker_of(node, queue) != 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            if worker_of(node, queue) == 0:
                break
        moved = worker_of(node, queue) == 0
        # the island kept streaming through the move: more after it, on both sides
        sent = [p.sent for p in pubs]
        until(lambda: all(p.sent > s + 20 for p, s in zip(pubs, sent, strict=True)) or not moved,
              what="publishing after the move")
    finally:
        for p in pubs:
            p.stop.set()
        for p in pubs:
            p.join(60)
        sink.stop.set()
        sink.join(60)
    assert moved, "the island did not move (its connections never got quiet)"
    assert f"compaction: island of queue '{queue}'" in node.log()
    for t in (*pubs, sink):
        assert not t.is_alive() and t.error is None, t.error
    with connect(node, 0) as conn:
        rest = [b[:32] for b in drain_quiet(conn.channel(), queue)]
    heads = sink.heads + rest
    for p in pubs:
        mine = [int(h.split(b":")[1]) for h in heads if h.startswith(p.name.encode() + b":")]
        assert_once_in_order(mine, p.sent, f" of publisher {p.name}")
