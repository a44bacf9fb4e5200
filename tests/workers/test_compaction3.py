"""Compaction of load in a node of 3 workers: a third worker's hop publishers keep their order across a move.

When an island moves from worker A to worker B, a worker C that is neither publishes to the queue
through the hop: what it sent to A before it applied the move's record reaches B through A (held there
during the move, or relayed once A applied the record), what it sends after goes straight to B. C's
marker (`QueueMoved`, sent to A behind its last publish there and forwarded by A behind everything of
C's) tells B when C's direct publishes may be taken (runtime/queue_types/remote_moves.py). Here each worker
has a pika publisher pinned to it (`workers.own_ports`) publishing a numbered sequence to one queue while
its island (an idle consumer, one unacked delivery) is moved round the workers with the test hook
(`SIGUSR1`: to the next worker), so every worker is A, B and C in turn. Every number arrives once, in
order per publisher, and with confirms every one is confirmed positively.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from tests.cluster.nodes import FAST, Cluster
from tests.conftest import ServerInfo, start_server
from tests.workers.test_compaction import CONFIG, assert_once_in_order, drain_quiet, force_move
from tests.workers.test_locality import connect, declare_in, own_port
from tests.workers.test_workers import until, worker_pid

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

WORKERS = 3


@pytest.fixture(scope="module")
def node3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("compaction3"), "--workers", str(WORKERS), config_text=CONFIG)
    yield info
    info.stop()


class Publisher:
    """A publisher pinned to one worker: its first publish goes to a queue of that worker (so connection
    locality keeps it there, and with that channel's last publish elsewhere it is never of the island),
    then it publishes `<worker>:<n>` to `queue` on another channel until told to stop. Without confirms a
    pika publisher (nothing waited for); with them an aio-pika one keeping up to `WINDOW` publishes
    unconfirmed, so several are in flight across a move (a nack raises: aio-pika's DeliveryError)."""

    WINDOW = 50

    def __init__(self, info: ServerInfo, worker: int, anchor: str, queue: str, confirms: bool) -> None:
        self.info, self.worker, self.anchor, self.queue = info, worker, anchor, queue
        self.sent = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        run = (lambda: asyncio.run(self._confirmed())) if confirms else self._unconfirmed
        self.thread = threading.Thread(target=self._guarded, args=(run,), daemon=True)
        self.thread.start()

    def _guarded(self, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _body(self) -> bytes:
        body = b"%d:%d" % (self.worker, self.sent)
        self.sent += 1
        return body

    def _unconfirmed(self) -> None:
        with connect(self.info, self.worker) as conn:
            conn.channel().basic_publish("", self.anchor, b"first")
            ch = conn.channel()
            while not self.stop.is_set():
                ch.basic_publish("", self.queue, self._body())
                conn.sleep(0.001)

    async def _confirmed(self) -> None:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{own_port(self.info, self.worker)}/")
        try:
            first = await conn.channel()
            await first.default_exchange.publish(aio_pika.Message(b"first"), routing_key=self.anchor)
            ch = await conn.channel(publisher_confirms=True)
            window: deque[asyncio.Future[Any]] = deque()
            while not self.stop.is_set():
                window.append(asyncio.ensure_future(
                    ch.default_exchange.publish(aio_pika.Message(self._body()), routing_key=self.queue)))
                if len(window) >= self.WINDOW:
                    await window.popleft()  # (a nack raises here)
                else:
                    await asyncio.sleep(0.001)
            for fut in window:
                await fut
        finally:
            await conn.close()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, repr(self.error)


@pytest.mark.parametrize("confirms", [False, True], ids=["no-confirms", "confirms"])
def test_third_worker_hop_publishers_keep_their_order_across_moves(node3: ServerInfo, confirms: bool) -> None:
    queue = declare_in(node3, 1, f"order3-{int(confirms)}")
    anchors = [declare_in(node3, w, f"anchor3-{int(confirms)}-{w}") for w in range(WORKERS)]
    with connect(node3, 1) as keeper:
        kch = keeper.channel()  # the island: a consumer (prefetch 1, never acking) that uses only the queue
        kch.basic_publish("", queue, b"-1")
        kch.basic_qos(prefetch_count=1)
        kch.basic_consume(queue, lambda *_a: None)
        publishers = [Publisher(node3, w, anchors[w], queue, confirms) for w in range(WORKERS)]
        try:
            until(lambda: all(p.sent >= 100 or p.error for p in publishers), what="the publishers started")
            home = 1
            for _move in range(2 * WORKERS):  # round the workers twice: each is A, B and C twice
                target = (home + 1) % WORKERS  # the hook's "next worker"
                force_move(node3, home, queue, target)
                home = target
        finally:
            for p in publishers:
                p.stop.set()
        for p in publishers:
            p.finish()
        keeper.close()  # its one unacked delivery, the first message, goes back to the head of the queue
    with connect(node3, home) as sub:
        bodies = drain_quiet(sub.channel(), queue)
    assert bodies[0] == b"-1"
    by_worker: dict[int, list[int]] = {w: [] for w in range(WORKERS)}
    for body in bodies[1:]:
        w, n = body.split(b":")
        by_worker[int(w)].append(int(n))
    for p in publishers:
        assert_once_in_order(by_worker[p.worker], p.sent, f" from worker {p.worker}")
    assert "no marker from" not in node3.log()  # every wait ended by its marker, not by the bound



@pytest.mark.slow  # two nodes of its own, ~13 s; `make test` keeps the third worker's hop publishers across moves
def test_another_nodes_hop_publisher_keeps_its_order_across_a_move(tmp_path: Path) -> None:
    """A cluster of a node of 2 workers (n1, compaction on) and a one-process node (n2): a pika publisher on
    n2 publishes a numbered sequence, without waiting for confirms, to a queue of n1's worker 1 (over the
    inter-node link) while the queue's island is moved 1→0, 0→1 and 1→0 inside n1. n2 applies each record
    and sends its marker to the old home, which forwards it: every number once, in order."""
    cluster = Cluster(tmp_path)
    try:
        n1 = cluster.add(workers="2", config_text=FAST + CONFIG)
        n2 = cluster.add()
        cluster.wait_running({"n1", "n2"})
        info = n1.info

        def worker_in_n1(queue: str) -> int | None:
            code, doc = n1.api("GET", f"/api/queues/%2F/{queue}")
            return int(doc["worker"]) if code == 200 and doc.get("worker") is not None else None

        with connect(info, 0) as conn:
            ch = conn.channel()
            queue = next(q for q in (f"nodes-{i}" for i in range(8))
                         if ch.queue_declare(q) and worker_in_n1(q) == 1)
        with connect(info, 1) as keeper, pika.BlockingConnection(pika.URLParameters(n2.url)) as pub:
            kch = keeper.channel()  # the island: a consumer (prefetch 1, never acking) that uses only the queue
            kch.basic_publish("", queue, b"-1")
            kch.basic_qos(prefetch_count=1)
            kch.basic_consume(queue, lambda *_a: None)
            pch = pub.channel()
            sent = 0
            home = 1
            for target in (0, 1, 0):
                pid = worker_pid(info, home)
                assert pid is not None
                signalled = 0.0
                while worker_in_n1(queue) != target:  # the hook each second until the record names the target
                    if time.monotonic() - signalled >= 1.0:
                        signalled = time.monotonic()
                        os.kill(pid, signal.SIGUSR1)
                    for _ in range(20):
                        pch.basic_publish("", queue, b"%d" % sent)
                        sent += 1
                    pub.sleep(0.005)
                    assert sent < 2_000_000, "the island did not move"
                home = target
            for _ in range(200):
                pch.basic_publish("", queue, b"%d" % sent)
                sent += 1
            pub.sleep(0.2)
        with connect(info, home) as sub:
            bodies = drain_quiet(sub.channel(), queue)
        assert bodies[0] == b"-1"
        assert_once_in_order([int(b) for b in bodies[1:]], sent)
    finally:
        cluster.stop()


def test_a_third_workers_declares_gets_and_purges_are_answered_across_moves(node3: ServerInfo) -> None:
    """A pika client pinned to worker 0 passively declares, gets (rejecting what it gets) and every tenth
    round purges a queue whose island goes round the workers twice: a declare or get that reaches the old
    home after it applied the move, before worker 0 did, is answered from its stand-in (the counts, or
    get-empty) and a purge relayed to the new home, never 404 "no queue"; the one refusal left is a purge
    during the move itself (404 "moving between workers; try again", as built), after which the client
    opens a channel and goes on."""
    queue = declare_in(node3, 1, "asks3")
    anchor = declare_in(node3, 0, "asks3-anchor")
    with connect(node3, 1) as keeper:
        kch = keeper.channel()
        for i in range(50):
            kch.basic_publish("", queue, b"%d" % i)
        kch.basic_qos(prefetch_count=1)
        kch.basic_consume(queue, lambda *_a: None)
        stop = threading.Event()
        asked = [0]
        purged = [0]
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                with connect(node3, 0) as conn:
                    conn.channel().basic_publish("", anchor, b"first")  # judged here: it stays in worker 0
                    ch = conn.channel()
                    while not stop.is_set():
                        ch.queue_declare(queue, passive=True)
                        method, _props, body = ch.basic_get(queue, auto_ack=False)
                        if method is not None:
                            assert body.isdigit(), body
                            ch.basic_reject(method.delivery_tag, requeue=True)
                        if asked[0] % 10 == 9:
                            try:
                                ch.queue_purge(queue)
                                purged[0] += 1
                            except pika.exceptions.ChannelClosedByBroker as exc:
                                if exc.reply_code != 404 or "moving between workers" not in exc.reply_text:
                                    raise
                                ch = conn.channel()
                        asked[0] += 1
            except BaseException as exc:  # noqa: BLE001 - reported by the test (a 404 is pika's ChannelClosedByBroker)
                errors.append(exc)
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        try:
            until(lambda: asked[0] >= 20 or errors, what="the asker started")
            home = 1
            for _move in range(2 * WORKERS):
                target = (home + 1) % WORKERS
                force_move(node3, home, queue, target)
                home = target
        finally:
            stop.set()
            asker.join(60)
        assert not asker.is_alive()
        assert not errors, repr(errors[0])
        assert purged[0] > 0
