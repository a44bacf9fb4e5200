"""Compaction of load in a node of 2 workers (`workers.compaction`, runtime/compaction.py): an island (a
queue and the connections that use only it) moved to the other worker mid-flow, with pika.

The move is forced with the test hook (`SIGUSR1` to the worker that holds the island: it moves its busiest
movable island to the next worker), so it is certain and its moment known; the controller's own moves
are judged from the same reports (tests/unit/test_compaction.py). Connections are pinned to a worker
(`workers.own_ports`); which worker holds a client's socket is read from /proc, as in test_locality.py.
Waits poll with generous deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from pika.exceptions import AMQPError
from tests.conftest import ServerInfo, start_server
from tests.workers.test_locality import CONFIG as LOCALITY_CONFIG
from tests.workers.test_locality import connect, declare_in, own_port
from tests.workers.test_workers import (
    PERSISTENT,
    alive,
    client_port,
    drain,
    get_one,
    holders,
    ports_file_names_worker,
    queue_json,
    until,
    worker_of,
    worker_pid,
)

from hutch import portfile
from hutch.runtime.compaction import HOLD_RECORD_ENV, KILL_AFTER_PROMISE_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CONFIG = LOCALITY_CONFIG + "workers.compaction = true\n"  # the locality node's, with compaction on


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("compaction"), "--workers", "2", config_text=CONFIG)
    yield info
    info.stop()


def force_move(info: ServerInfo, source: int, queue: str, target: int) -> None:
    """SIGUSR1 to worker `source` (again each second, should the island not be quiet at that moment)
    until `queue`'s record names worker `target`."""
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


def drain_quiet(ch: Any, queue: str) -> list[bytes]:
    """Every body a consumer of `queue` on `ch` gets until it is quiet for 5 s, each acked."""
    bodies = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
    return bodies


def assert_once_in_order(numbers: list[int], sent: int, who: str = "") -> None:
    """`numbers` are 0..sent-1, each once (none lost, none duplicated), in the order they were sent."""
    assert len(numbers) == len(set(numbers)), f"duplicates{who}"
    assert set(numbers) == set(range(sent)), sorted(set(range(sent)) - set(numbers))[:10]
    assert numbers == sorted(numbers), next(
        (numbers[i - 1], numbers[i]) for i in range(1, len(numbers)) if numbers[i] < numbers[i - 1])


def test_a_publisher_and_consumer_move_with_their_queue_mid_flow(node: ServerInfo) -> None:
    """A publisher with confirms and a consumer (prefetch 10, 10 unacked) of one queue in worker 1,
    moved to worker 0: nothing lost or duplicated, order kept, delivery tags and confirms continue, the
    tags delivered before the move acked after it, both sockets now in worker 0, the management API
    listing the queue once, in worker 0."""
    queue = declare_in(node, 1, "isle")
    with connect(node, 0) as admin:
        admin.channel().queue_bind(queue, "amq.direct", routing_key=queue)
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
    for worker in (0, 1):  # its binding kept in both workers (the record moved the queue, not deleted it)
        with connect(node, worker) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.direct", queue, b"bound %d" % worker, mandatory=True)
            assert get_one(ch, queue)[2] == b"bound %d" % worker


TRANSIENT = pika.BasicProperties(delivery_mode=1)


class ModeConsumer(Consumer):
    """A `Consumer` that records each delivery's delivery mode too."""

    def __init__(self, conn: pika.BlockingConnection, queue: str, prefetch: int, modes: list[int]) -> None:
        self.modes = modes
        super().__init__(conn, queue, prefetch)

    def _on(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.modes.append(props.delivery_mode)
        super()._on(ch, method, props, body)


def test_a_durable_queue_of_transient_and_persistent_messages_moves_whole(node: ServerInfo) -> None:
    """A durable queue holding transient messages (which the new home does not sync before the record)
    and persistent ones (which it does), 10 of them unacked by a consumer, moved from worker 1 to worker 0
    with its publisher and consumer: every message delivered once, in order, each with its delivery mode,
    confirms and delivery tags continuing, the queue still durable in worker 0."""
    queue = declare_durable_in(node, 1, "durable-isle")
    mode = {b"%d" % i: 2 if i % 3 == 0 else 1 for i in range(60)}
    mode.update({b"%d" % i: 1 for i in range(60, 90)})
    with connect(node, 1) as pub, connect(node, 1) as sub:
        pch = pub.channel()
        pch.confirm_delivery()
        for i in range(60):  # each returns once confirmed
            pch.basic_publish("", queue, b"%d" % i, PERSISTENT if mode[b"%d" % i] == 2 else TRANSIENT)
        modes: list[int] = []
        consumer = ModeConsumer(sub, queue, prefetch=10, modes=modes)
        consumer.wait_for(10)  # 10 unacked across the move
        assert holders(node, client_port(pub)) == {1} and holders(node, client_port(sub)) == {1}
        force_move(node, 1, queue, 0)
        until(lambda: holders(node, client_port(pub)) == {0} and holders(node, client_port(sub)) == {0},
              what="both sockets in worker 0")
        for i in range(60, 90):  # confirms continue in worker 0
            pch.basic_publish("", queue, b"%d" % i, TRANSIENT)
        while len(consumer.got) < 90:
            consumer.ch.basic_ack(consumer.got[-1][0], multiple=True)
            consumer.wait_for(len(consumer.got) + 1)
        consumer.ch.basic_ack(consumer.got[-1][0], multiple=True)
        consumer.conn.process_data_events(time_limit=0.2)
    bodies = [b for _t, b, _r in consumer.got]
    assert bodies == [b"%d" % i for i in range(90)]  # once each, in order
    assert [t for t, _b, _r in consumer.got] == list(range(1, 91))  # tags continue across the move
    assert modes == [mode[b] for b in bodies]
    doc = until(lambda: (lambda d: d if d["messages"] == 0 and d.get("worker") == 0 else None)(queue_json(node, queue)),
                what="the queue empty in worker 0")
    assert doc["durable"] is True


@pytest.mark.asyncio
async def test_an_island_moves_while_messages_stream_through_it(node: ServerInfo) -> None:
    """aio-pika: a publisher awaiting each confirm and a consumer acking each delivery run without
    pause while the island is moved from worker 1 to worker 0: every message arrives once, in order,
    delivery tags continue by one, and every publish was confirmed (none nacked)."""
    queue = declare_in(node, 1, "stream")
    total = 1500
    pub = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{own_port(node, 1)}/")
    sub = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{own_port(node, 1)}/")
    try:
        pch = await pub.channel(publisher_confirms=True)
        sch = await sub.channel()
        await sch.set_qos(prefetch_count=20)
        got: list[tuple[int, bytes]] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append((message.delivery_tag or 0, message.body))
            await message.ack()
            if len(got) == total:
                done.set()
        await (await sch.get_queue(queue, ensure=False)).consume(on_message)

        async def publish() -> None:
            for i in range(total):
                await pch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue)
        publishing = asyncio.ensure_future(publish())
        pid = worker_pid(node, 1)
        assert pid is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while await loop.run_in_executor(None, answers, lambda: worker_of(node, queue)) != 0:
            assert loop.time() < deadline, "the island did not move"
            if len(got) >= 200:  # mid-flow: once messages stream, until it has moved
                os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
        await asyncio.wait_for(publishing, 60)  # every publish confirmed (a nack raises)
        await asyncio.wait_for(done.wait(), 60)
        assert [b for _t, b in got] == [b"%d" % i for i in range(total)]
        assert [t for t, _b in got] == list(range(1, total + 1))
    finally:
        await pub.close()
        await sub.close()


def test_a_hop_publisher_of_the_new_home_keeps_its_order_across_moves(node: ServerInfo) -> None:
    """A pika publisher pinned to worker 0 (its first publish to a queue of worker 0, so connection
    locality keeps it there) publishes a numbered sequence to a queue of worker 1 through the hop, without
    waiting for confirms, while the queue's island (an idle consumer of worker 1, one unacked delivery)
    is moved to worker 0 and back, again and again: its publishes held at the old home during a move
    reach the queue before the ones it makes once worker 0 holds the queue. The queue then holds the
    sequence in order, none lost, none twice."""
    queue = declare_in(node, 1, "order")
    anchor = declare_in(node, 0, "anchor")
    with connect(node, 1) as keeper, connect(node, 0) as sub:
        kch = keeper.channel()  # the island: a consumer (prefetch 1, never acking) that uses only the queue
        kch.basic_publish("", queue, b"-1")
        kch.basic_qos(prefetch_count=1)
        kch.basic_consume(queue, lambda *_a: None)
        stop = threading.Event()
        sent = [0]

        def publish() -> None:
            with connect(node, 0) as pub:
                pub.channel().basic_publish("", anchor, b"first")  # judged here: it stays in worker 0, and
                ch = pub.channel()  # with a channel that last published to the anchor, it is never of the island
                while not stop.is_set():
                    ch.basic_publish("", queue, b"%d" % sent[0])
                    sent[0] += 1
                    pub.sleep(0.0005)
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        try:
            until(lambda: sent[0] >= 200, what="the publisher started")
            for _round in range(2):
                force_move(node, 1, queue, 0)  # to the publisher's worker: the window
                until(lambda: holders(node, client_port(keeper)) == {0}, what="the island in worker 0")
                force_move(node, 0, queue, 1)
                until(lambda: holders(node, client_port(keeper)) == {1}, what="the island in worker 1")
            force_move(node, 1, queue, 0)
        finally:
            stop.set()
            publisher.join(30)
        assert not publisher.is_alive()
        keeper.close()  # its one unacked delivery, the first message, goes back to the head of the queue
        ch = sub.channel()
        bodies = drain_quiet(ch, queue)
        assert bodies[0] == b"-1"
        assert_once_in_order([int(b) for b in bodies[1:]], sent[0])


@pytest.mark.slow  # a sustained load (over the controller's 2,000 msg/s floor) for several seconds
@pytest.mark.asyncio
async def test_the_controller_packs_two_islands_into_one_worker(tmp_path: Path) -> None:
    """No hook: a node of 2 with one busy island in each worker, far below a core, packs them into one
    worker by itself (the reports, worker 0's controller, the move), and every message still arrives."""
    info = start_server(tmp_path, "--workers", "2", config_text=CONFIG)
    conns: list[Any] = []
    try:
        queues = [declare_in(info, w, f"pack{w}") for w in (0, 1)]
        received = {q: 0 for q in queues}
        sent = {q: 0 for q in queues}
        stop = asyncio.Event()

        async def island(worker: int, queue: str) -> None:
            url = f"amqp://guest:guest@127.0.0.1:{own_port(info, worker)}/"
            pub, sub = await aio_pika.connect(url), await aio_pika.connect(url)
            conns.extend((pub, sub))
            pch = await pub.channel(publisher_confirms=True)
            sch = await sub.channel()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                received[queue] += 1
            await (await sch.get_queue(queue, ensure=False)).consume(on_message, no_ack=True)
            while not stop.is_set():  # batches of 100 confirmed publishes: ~1,500-3,000 msg/s each here
                await asyncio.gather(*(pch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue)
                                       for _ in range(100)))
                sent[queue] += 100
        tasks = [asyncio.ensure_future(island(w, q)) for w, q in zip((0, 1), queues, strict=True)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while True:
            homes = await loop.run_in_executor(None, answers, lambda: {worker_of(info, q) for q in queues})
            if homes is not None and len(homes) == 1:
                break
            assert loop.time() < deadline, f"not packed (rates {sent})"
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        until_async = loop.time() + 30
        while received != sent:
            assert loop.time() < until_async, (received, sent)
            await asyncio.sleep(0.1)
    finally:
        for conn in conns:
            await conn.close()
        info.stop()
    assert "compaction: moving island" in info.log()


def _queues(info: ServerInfo) -> list[dict[str, Any]]:
    req = urllib.request.Request(f"{info.mgmt_url}/api/queues",
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        out: list[dict[str, Any]] = json.loads(resp.read())
    return out


# -- crash safety: a worker killed around a move ----------------------------------------------------------

def declare_durable_in(info: ServerInfo, worker: int, prefix: str) -> str:
    with connect(info, 0) as conn:
        ch = conn.channel()
        for i in range(8):
            name = f"{prefix}-{i}"
            ch.queue_declare(name, durable=True)
            if worker_of(info, name) == worker:
                return name
    raise AssertionError(f"no queue placed in worker {worker}")


def answers(fn: Any) -> Any:
    """`fn()`, or None while the node cannot answer it (a worker restarting: the API or a port is down)."""
    try:
        return fn()
    except (OSError, AMQPError, KeyError, AssertionError):
        return None


def kill_and_wait(info: ServerInfo, worker: int) -> None:
    """kill -9 of worker `worker`, until the supervisor has restarted it (and the ports file names its new
    ports: a restarted worker 0 serves the management API on a new port, which `info` then follows)."""
    victim = worker_pid(info, worker)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    until(lambda: not alive(victim), what=f"worker {worker} gone")
    until(lambda: worker_pid(info, worker) not in (None, victim) and ports_file_names_worker(info, worker),
          timeout=60, what=f"worker {worker} restarted")
    doc = portfile.read(info.data_dir)
    assert doc is not None
    info.management_port = int(doc["listeners"]["management"])


def close_quietly(*conns: pika.BlockingConnection) -> None:
    for conn in conns:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a connection the kill (or a refused move) already ended
            pass


def everything_there_once(info: ServerInfo, queue: str, bodies: list[bytes]) -> None:
    """Once the node answers again: `queue` is listed once, in one worker, holding `bodies` (each once,
    every one ready: no connection holds any), and a consumer gets exactly those."""
    seen: list[Any] = []

    def settled() -> bool:
        doc = answers(lambda: queue_json(info, queue))
        seen[:] = [None if doc is None else (doc["messages_ready"], doc["consumers"], doc.get("worker"))]
        return doc is not None and doc["messages_ready"] == len(bodies) and doc["consumers"] == 0
    deadline = time.monotonic() + 60
    while not settled():
        assert time.monotonic() < deadline, \
            f"{len(bodies)} messages ready in {queue} and no consumer: last seen (ready, consumers, worker) {seen}"
        time.sleep(0.05)
    listed = [q for q in _queues(info) if q["name"] == queue]
    assert len(listed) == 1 and listed[0]["worker"] in (0, 1)
    with connect(info, listed[0]["worker"]) as conn:
        got = drain(conn.channel(), queue, len(bodies))
        assert sorted(got) == sorted(bodies) and len(set(got)) == len(got)
        assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0


def kill_around_a_move(tmp: Path, seed: int) -> None:
    """A durable queue in worker 1 with 60 confirmed persistent messages, 10 of them unacked by a
    consumer, forced to move to worker 0 while worker 0 or 1 (by `seed`) is killed 0-30 ms after the
    signal: whatever the moment, the queue ends in one worker with every message, once."""
    rng = random.Random(seed)
    victim, delay = rng.choice((0, 1)), rng.uniform(0.0, 0.03)
    info = start_server(tmp, "--workers", "2", config_text=CONFIG)
    try:
        queue = declare_durable_in(info, 1, "kill")
        bodies = [b"m%d" % i for i in range(60)]
        pub, sub = connect(info, 1), connect(info, 1)
        try:
            pch = pub.channel()
            pch.confirm_delivery()
            for body in bodies:
                pch.basic_publish("", queue, body, PERSISTENT)
            consumer = Consumer(sub, queue, prefetch=10)
            consumer.wait_for(10)
            source = worker_pid(info, 1)
            assert source is not None
            os.kill(source, signal.SIGUSR1)
            time.sleep(delay)  # the moment of the kill (the seed's), not a wait for anything
            kill_and_wait(info, victim)
        finally:
            close_quietly(pub, sub)
        everything_there_once(info, queue, bodies)
    finally:
        info.stop()


def test_a_worker_killed_around_a_move_loses_nothing(tmp_path: Path) -> None:
    """The seeded representative in make test (seed 0: the old home killed as the move commits)."""
    kill_around_a_move(tmp_path, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_a_worker_killed_around_a_move_loses_nothing_seeds(tmp_path: Path, seed: int) -> None:
    kill_around_a_move(tmp_path, seed)


def test_a_publish_confirmed_by_a_restarted_old_home_before_the_commit_is_kept(tmp_path: Path) -> None:
    """Window 1: the old home (worker 1) is killed right after it promised the move (synced) and answered
    `CompactCommit` (the test hook), and the new home holds its record back (the other hook) until the old
    home has restarted and a pika publisher with confirms has published through it. The restarted old
    home does not serve its recovered copy (its promise): the publishes wait at the new home and are
    confirmed there once the record commits, and every message, before and after, is in the queue once."""
    kill, hold = tmp_path / "kill-after-promise", tmp_path / "hold-record"
    info = start_server(tmp_path, "--workers", "2", config_text=CONFIG,
                        env={KILL_AFTER_PROMISE_ENV: str(kill), HOLD_RECORD_ENV: str(hold)})
    try:
        queue = declare_durable_in(info, 1, "promise")
        before = [b"b%d" % i for i in range(20)]
        after = [b"a%d" % i for i in range(20)]
        pub = connect(info, 1)
        try:
            pch = pub.channel()
            pch.confirm_delivery()
            for body in before:
                pch.basic_publish("", queue, body, PERSISTENT)
            kill.touch()
            hold.touch()
            victim = worker_pid(info, 1)
            assert victim is not None
            os.kill(victim, signal.SIGUSR1)  # the island (pub) moves to worker 0; worker 1 dies as it agrees
            until(lambda: not alive(victim), timeout=60, what="the old home killed by the hook")
            assert not kill.exists()
            until(lambda: worker_pid(info, 1) not in (None, victim) and ports_file_names_worker(info, 1),
                  timeout=60, what="worker 1 restarted")
            confirmed: list[bytes] = []

            def publish() -> None:
                with connect(info, 1) as conn:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    for body in after:
                        ch.basic_publish("", queue, body, PERSISTENT)  # returns once confirmed
                        confirmed.append(body)
            publisher = threading.Thread(target=publish, daemon=True)
            publisher.start()
            # before the fix the restarted copy confirms these at once; with it they wait for the record: the
            # record is held back until then (a bound, not a measurement: the outcome is checked either way)
            deadline = time.monotonic() + 3
            while len(confirmed) < len(after) and time.monotonic() < deadline and publisher.is_alive():
                time.sleep(0.05)
            hold.unlink()
            publisher.join(60)
            assert not publisher.is_alive() and confirmed == after
        finally:
            close_quietly(pub)
        everything_there_once(info, queue, before + after)
    finally:
        info.stop()


@pytest.mark.slow  # two kill -9s and restarts (~8 s): make test keeps the seeded kill above
def test_a_durable_queue_moved_with_a_worker_killed(tmp_path: Path) -> None:
    """A durable queue moved mid-flow from worker 1 to worker 0; then worker 0 (its new home) is killed,
    then worker 1 (its old home): the queue stays in worker 0, with every message not acked, once (the
    old home's copy and index were dropped at the commit, so its restart brings no second copy). The kill
    comes once the acks are known handled and written (below)."""
    info = start_server(tmp_path, "--workers", "2", config_text=CONFIG)
    try:
        queue = declare_durable_in(info, 1, "durable")
        pub, sub = connect(info, 1), connect(info, 1)
        try:
            pch = pub.channel()
            pch.confirm_delivery()
            for i in range(40):
                pch.basic_publish("", queue, b"d%d" % i, PERSISTENT)
            consumer = Consumer(sub, queue, prefetch=10)
            consumer.wait_for(10)
            force_move(info, 1, queue, 0)
            for i in range(40, 60):  # confirmed by worker 0 now
                pch.basic_publish("", queue, b"d%d" % i, PERSISTENT)
            consumer.ch.basic_ack(consumer.got[4][0], multiple=True)  # 5 acked after the move
            # An ack has no reply: a kill right after it may come before worker 0 has read it, and an ack is
            # buffered and written to the queue's index by the storage's next job (nobody waits for it, as in
            # RabbitMQ), so until then the acked messages come back after a crash, as AMQP allows (at least
            # once). The test waits for both: a round trip
            # on the consumer's channel (its methods are handled in order, so the ack was), then a confirmed
            # persistent publish, whose group commit writes everything touched before it (the ack too).
            consumer.ch.basic_qos(prefetch_count=10)
            pch.basic_publish("", queue, b"d60", PERSISTENT)
            acked = {b for _t, b, _r in consumer.got[:5]}
            kill_and_wait(info, 0)  # with the clients connected to it
        finally:
            close_quietly(pub, sub)
        until(lambda: answers(lambda: worker_of(info, queue)) == 0, timeout=60, what=f"{queue} in worker 0")
        kill_and_wait(info, 1)
        until(lambda: answers(lambda: worker_of(info, queue)) == 0, timeout=60, what=f"{queue} in worker 0")
        everything_there_once(info, queue, [b"d%d" % i for i in range(61) if b"d%d" % i not in acked])
    finally:
        info.stop()
