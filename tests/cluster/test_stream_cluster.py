"""Replicated streams on real multi-process clusters (issue 23; docs/streams.md, "On the node"): three
`hutch-server` nodes with stream listeners, pika publishing with confirms through a member that does not
write, the writer's node killed (`kill -9`) or paused (SIGSTOP) mid-run, a member down while publishing,
and every confirmed message read back in order, once, from `first` on every member with pika, and with
rstream, which connects by the stream protocol's metadata (the writer as leader, the others replicas).

`make test` runs the first test (one kill -9 of the writer with publishes in flight, then no publish for
over a second: the new writer carries what it does not know committed without taking an offset, so
pika and rstream read dense offsets from `first`); the others are `slow`, among them a stream of one
member grown to three (dense offsets too) and a seeded Jepsen-style run (kills, pauses, isolations).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from hutch import portfile

from .nodes import FAST, Cluster, Node, eventually, short

STREAM_CONF = FAST + "stream.listeners.tcp.default = 0\n"
STREAM = {"x-queue-type": "stream"}


def connect(node: Node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))


def start_cluster(tmp: Path, n: int = 3) -> Cluster:
    c = Cluster(tmp)
    for _ in range(n):
        c.add(config_text=STREAM_CONF)
    return c


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def declare(node: Node, name: str, **arguments: object) -> None:
    conn = connect(node)
    conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    conn.close()


def info(node: Node, name: str) -> dict:
    code, doc = node.api("GET", f"/api/queues/%2F/{name}")
    assert code == 200, doc
    return doc


def publish(node: Node, name: str, bodies: list[str], during: dict[int, object] | None = None) -> list[str]:
    """Publish each body with confirms through `node`; returns the confirmed ones (a nack leaves one
    out). `during[i]()` runs before body i (kill a node, pause one...)."""
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    confirmed = []
    for i, body in enumerate(bodies):
        if during and i in during:
            during[i]()  # type: ignore[operator]
        try:
            ch.basic_publish("", name, body.encode())
            confirmed.append(body)
        except pika.exceptions.NackError:
            pass
    conn.close()
    return confirmed


def read_first(node: Node, name: str, count: int, timeout: float = 30.0,
               until: Collection[str] = ()) -> list[tuple[int, str]]:
    """(x-stream-offset, body) of the first `count` messages a consumer from `first` gets on `node`, and
    whatever else arrives within a short while after (so a duplicate would be seen). With `until` (the
    confirmed bodies), it reads on until every one of them has come: a log may also hold messages whose
    confirm was lost with a killed writer, so `count` of them can arrive before the last confirmed one
    (a member still catching up then looked as if it had lost the tail)."""
    conn = connect(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got: list[tuple[int, str]] = []

    def on(channel: object, method: object, props: object, body: bytes) -> None:
        got.append((props.headers["x-stream-offset"], body.decode()))  # type: ignore[attr-defined]
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    ch.basic_consume(name, on, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + timeout
    wanted = set(until)
    while (len(got) < count or not wanted <= {b for _, b in got}) and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.process_data_events(0.5)
    conn.close()
    return got


def assert_all_confirmed_once_in_order(got: list[tuple[int, str]], confirmed: list[str], where: str) -> None:
    bodies = [b for _, b in got]
    offsets = [o for o, _ in got]
    assert offsets == sorted(set(offsets)), f"{where}: offsets not increasing"
    assert len(bodies) == len(set(bodies)), f"{where}: a message twice"
    wanted = set(confirmed)
    assert [b for b in bodies if b in wanted] == confirmed, f"{where}: confirmed messages missing or out of order"


def writer_of(node: Node, name: str) -> str:
    return short(info(node, name)["leader"])


async def publish_window_and_kill(node: Node, name: str, bodies: list[str], kill_after: int) -> list[str]:
    """Publish every body at once through `node` with confirms (aio-pika: all in flight together) and
    `kill -9` the node once `kill_after` confirms have come: the rest are in flight (written on the node,
    shipped to some replicas or not). Returns the confirmed bodies, in publish order."""
    import aio_pika
    conn = await aio_pika.connect(node.url + "?heartbeat=0")
    ch = await conn.channel(publisher_confirms=True)
    acked = asyncio.Event()
    count = 0

    async def one(body: str) -> bool:
        nonlocal count
        try:
            await ch.default_exchange.publish(aio_pika.Message(body.encode()), routing_key=name, timeout=30)
        except Exception:  # noqa: BLE001 - nacked, or lost with the node: not confirmed
            return False
        count += 1
        if count >= kill_after:
            acked.set()
        return True

    tasks = [asyncio.create_task(one(b)) for b in bodies]
    await asyncio.wait_for(acked.wait(), 30)
    await asyncio.get_running_loop().run_in_executor(None, node.kill)
    results = await asyncio.gather(*tasks)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 2)
    return [b for b, ok in zip(bodies, results, strict=True) if ok]


def assert_dense(got: list[tuple[int, str]], where: str) -> None:
    """Offsets from 0 with no gap: every offset holds a message, as on RabbitMQ."""
    assert [o for o, _ in got] == list(range(len(got))), f"{where}: offsets not dense: {[o for o, _ in got]}"


def test_writer_killed_mid_run_every_confirmed_message_on_every_member(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "events")
    doc = info(n2, "events")
    assert doc["type"] == "stream"
    assert sorted(short(m) for m in doc["members"]) == ["n1", "n2", "n3"]  # every node, as RabbitMQ's default
    assert short(doc["leader"]) == "n1"  # client-local: the declaring node writes
    assert doc["replication"]["epoch"] == 1  # epochs start at 1, as osiris's
    # publish through n2 (a replica: forwarded to the writer), then a window of 200 at once on the
    # writer's node, which is killed (-9) with most of them in flight
    confirmed = publish(n2, "events", [f"m{i}" for i in range(50)])
    assert len(confirmed) == 50
    window = [f"w{i}" for i in range(200)]
    confirmed += asyncio.run(publish_window_and_kill(n1, "events", window, kill_after=20))
    assert eventually(lambda: writer_of(n2, "events") in ("n2", "n3"), timeout=20)
    time.sleep(1.0)  # nobody publishes for over 0.5 s: the new writer commits what it carries by itself
    confirmed += publish(n2, "events", [f"m{i}" for i in range(50, 100)])
    n1.start()
    cluster.wait_running({"n1", "n2", "n3"})
    sent = {f"m{i}" for i in range(100)} | set(window)
    for node in cluster.nodes:
        got = read_first(node, "events", len(confirmed), until=confirmed)
        assert_all_confirmed_once_in_order(got, confirmed, node.name)
        assert {b for _, b in got} <= sent, node.name  # nothing that was not published
        assert got[0] == (0, "m0"), node.name  # a fresh replicated stream starts at 0, as RabbitMQ's
        assert_dense(got, node.name)  # the writer change took no offset
    rs = asyncio.run(rstream_read_offsets(stream_port(n3), "events", len(got)))
    assert [(o, b.decode()) for o, b in rs] == got  # rstream reads the same, offsets and all
    assert info(n1, "events")["replication"]["epoch"] >= 2


@pytest.mark.slow
def test_offsets_start_at_0_and_a_writer_change_leaves_no_gap(cluster: Cluster) -> None:
    # as on RabbitMQ (one node or three): the first message is at offset 0, and a new writer over a log
    # it knows committed takes no offset for its epoch (stream_replica.py, "No marker when...")
    n1, n2, n3 = cluster.nodes
    declare(n1, "gapless")
    first = publish(n2, "gapless", [f"a{i}" for i in range(5)])
    assert len(first) == 5
    for node in cluster.nodes:  # read on every member: each knows the whole log committed
        assert read_first(node, "gapless", 5) == [(i, f"a{i}") for i in range(5)], node.name
    out = hq(n2, "delete_member", "gapless", "n1")  # the writer leaves: a new epoch, another writer
    assert out.returncode == 0, out.stdout + out.stderr
    assert eventually(lambda: writer_of(n2, "gapless") in ("n2", "n3"), timeout=20)
    more = publish(n2, "gapless", [f"b{i}" for i in range(5)])
    assert len(more) == 5
    want = [(i, f"a{i}") for i in range(5)] + [(5 + i, f"b{i}") for i in range(5)]
    for node in (n2, n3):
        assert read_first(node, "gapless", 10) == want, node.name


def stream_port(node: Node) -> int:
    doc = portfile.read(node.directory / "data")
    assert doc is not None
    return int(doc["listeners"]["stream"])


async def rstream_read(port: int, name: str, count: int) -> list[bytes]:
    return [body for _, body in await rstream_read_offsets(port, name, count)]


async def rstream_read_offsets(port: int, name: str, count: int) -> list[tuple[int, bytes]]:
    """(offset, body) of the first `count` messages an rstream consumer from `first` gets."""
    from rstream import AMQPMessage, ConsumerOffsetSpecification, MessageContext, OffsetType, amqp_decoder
    from rstream import Consumer as RConsumer
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg.body if isinstance(msg.body, bytes | bytearray) else b"".join(msg.body))))
        if len(got) >= count:
            done.set()

    async with RConsumer("127.0.0.1", port=port, username="guest", password="guest") as c:
        await c.start()
        await c.subscribe(name, on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 30)
    return got


async def rstream_publish(port: int, name: str, bodies: list[bytes]) -> tuple[object, list[object]]:
    """Publish through rstream (it connects to the leader the metadata names); returns that metadata."""
    from rstream import AMQPMessage, Producer
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        for b in bodies:
            await p.send_wait(name, AMQPMessage(body=b))
        client = await p._get_or_create_client(name)  # noqa: SLF001 - the metadata rstream acted on
        leader, replicas = await client.query_leader_and_replicas(name)
    return leader, replicas


@pytest.mark.slow
def test_rstream_follows_the_metadata_and_reads_on_every_member(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n2, "rs-events")  # n2 writes
    ports = {n.name: stream_port(n) for n in cluster.nodes}
    bodies = [b"r%d" % i for i in range(60)]
    leader, replicas = asyncio.run(rstream_publish(ports["n1"], "rs-events", bodies))  # asked n1: not the writer
    assert leader.port == ports["n2"]  # type: ignore[attr-defined]
    assert sorted(r.port for r in replicas) == sorted([ports["n1"], ports["n3"]])  # type: ignore[attr-defined]
    for node in cluster.nodes:
        assert asyncio.run(rstream_read(ports[node.name], "rs-events", len(bodies))) == bodies
        got = read_first(node, "rs-events", len(bodies))
        assert [b for _, b in got] == [b.decode() for b in bodies]
    # deleted on every node (files and groups), then declared again: a new stream, empty
    conn = connect(n3)
    conn.channel().queue_delete("rs-events")
    conn.close()
    for node in cluster.nodes:
        assert eventually(lambda node=node: node.api("GET", "/api/queues/%2F/rs-events")[0] == 404)
    declare(n3, "rs-events")
    assert publish(n1, "rs-events", ["again"]) == ["again"]
    assert [b for _, b in read_first(n2, "rs-events", 1)] == ["again"]


@pytest.mark.slow
def test_member_down_while_publishing_catches_up(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "catch-up")
    n3.stop()
    confirmed = publish(n1, "catch-up", [f"c{i}" for i in range(200)])
    assert len(confirmed) == 200  # two of three members are a majority
    n3.start()
    got = read_first(n3, "catch-up", 200)
    assert_all_confirmed_once_in_order(got, confirmed, "n3")


@pytest.mark.slow
def test_paused_writer_is_replaced_and_rejoins(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "paused")
    confirmed = publish(n2, "paused", [f"p{i}" for i in range(100)], during={30: n1.pause})
    assert eventually(lambda: writer_of(n2, "paused") in ("n2", "n3"), timeout=30)
    n1.resume()
    confirmed += publish(n3, "paused", [f"q{i}" for i in range(50)])
    for node in cluster.nodes:
        got = read_first(node, "paused", len(confirmed), until=confirmed)
        assert_all_confirmed_once_in_order(got, confirmed, node.name)


def hq(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    """hutch-queues against a node's management port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--port", str(node.management_port), *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.slow
def test_membership_through_hutch_queues(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, 4)
    try:
        n1, n2, n3, n4 = c.nodes
        declare(n1, "members", **{"x-initial-cluster-size": 3})
        members = {short(m) for m in info(n1, "members")["members"]}
        assert len(members) == 3 and "n1" in members
        spare = next(n for n in c.nodes if n.name not in members)
        first = publish(n1, "members", [f"a{i}" for i in range(100)])
        out = hq(n1, "add_member", "members", spare.name)
        assert out.returncode == 0, out.stderr
        assert "Adding a replica for queue members" in out.stdout
        assert eventually(lambda: {short(m) for m in info(spare, "members")["members"]} == members | {spare.name})
        assert_all_confirmed_once_in_order(read_first(spare, "members", 100), first, spare.name)  # caught up
        out = hq(n1, "add_member", "members", spare.name)
        assert out.returncode == 1 and "already a member" in out.stderr
        # remove the writer: another member writes; the removed node keeps a stand-in of the stream
        out = hq(n2 if n2.name != "n1" else n3, "delete_member", "members", "n1")
        assert out.returncode == 0, out.stderr
        assert eventually(lambda: short(info(spare, "members")["leader"]) not in ("", "n1"))
        assert "n1" not in {short(m) for m in info(spare, "members")["members"]}
        more = publish(n1, "members", [f"b{i}" for i in range(50)])  # through the stand-in
        assert_all_confirmed_once_in_order(read_first(spare, "members", 150), first + more, spare.name)
        # shrink takes a node out of every replicated stream (and quorum queue) it is a member of
        rest = [n for n in c.nodes if short(n.full_name) in {short(m) for m in info(spare, "members")["members"]}]
        out = hq(rest[0], "--formatter", "json", "shrink", rest[-1].name)
        assert out.returncode == 0, out.stderr
        assert [r["result"] for r in json.loads(out.stdout)] == ["ok"]
        assert len(info(rest[0], "members")["members"]) == 2
        # a stream of one member (the single-node path) grows: replicated from then on, its files shipped
        declare(n1, "single", **{"x-initial-cluster-size": 1})
        assert "replication" not in info(n1, "single")
        alone = publish(n1, "single", [f"s{i}" for i in range(30)])
        out = hq(n1, "add_member", "single", "n2")
        assert out.returncode == 0, out.stderr
        assert {short(m) for m in info(n1, "single")["members"]} == {"n1", "n2"}
        assert_all_confirmed_once_in_order(read_first(n2, "single", 30), alone, "n2")
        later = publish(n2, "single", [f"t{i}" for i in range(10)])  # through n2: to the writer, n1
        assert_all_confirmed_once_in_order(read_first(n1, "single", 40), alone + later, "n1")
        out = hq(n1, "delete_member", "single", "n2")
        assert out.returncode == 1 and "keeps two at least" in out.stderr
    finally:
        c.stop()


@pytest.mark.slow
def test_a_stream_of_one_member_grown_to_three_keeps_dense_offsets(cluster: Cluster) -> None:
    # its epoch-0 chunks (the single-node path) are carried into epoch 1 by the recorded start: no
    # offset is taken when it becomes replicated, nor when members are added
    n1, n2, n3 = cluster.nodes
    declare(n1, "grown", **{"x-initial-cluster-size": 1})
    assert "replication" not in info(n1, "grown")
    alone = publish(n1, "grown", [f"s{i}" for i in range(30)])
    for other in ("n2", "n3"):
        out = hq(n1, "add_member", "grown", other)
        assert out.returncode == 0, out.stdout + out.stderr
    assert {short(m) for m in info(n1, "grown")["members"]} == {"n1", "n2", "n3"}
    later = publish(n3, "grown", [f"t{i}" for i in range(10)])  # through n3: to the writer, n1
    want = [(i, b) for i, b in enumerate(alone + later)]
    for node in cluster.nodes:
        assert read_first(node, "grown", 40) == want, node.name
    for node in cluster.nodes:
        rs = asyncio.run(rstream_read_offsets(stream_port(node), "grown", 40))
        assert [(o, b.decode()) for o, b in rs] == want, node.name


class Publisher(threading.Thread):
    """Publishes unique bodies with confirms through the running nodes in turn (reconnecting to the next
    on any failure): an ack is confirmed; a nack, a timeout or a lost connection leaves the body out."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.name_ = cluster, name
        self.confirmed: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = turn = 0
        while not self.stopping.is_set():
            turn += 1
            node = self.cluster.nodes[turn % len(self.cluster.nodes)]
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    node.url + "?heartbeat=0&socket_timeout=5&blocked_connection_timeout=10"))
            except Exception:  # noqa: BLE001 - that node is down or paused: the next one
                time.sleep(0.2)
                continue
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stopping.is_set():
                    body = f"j{n}"
                    n += 1
                    try:
                        ch.basic_publish("", self.name_, body.encode())
                        self.confirmed.append(body)
                    except pika.exceptions.NackError:
                        pass
                    time.sleep(0.01)
            except Exception:  # noqa: BLE001 - the node went away under us: the next one
                pass
            finally:
                with contextlib.suppress(Exception):
                    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_nemesis_kills_pauses_and_isolations(cluster: Cluster, seed: int) -> None:
    """Jepsen-style, seeded: while a publisher publishes with confirms through every node, one fault at a
    time (kill -9 of the writer's node or another, SIGSTOP, one node cut off from the others), healed
    after a while; then every confirmed message is on every member, in order, once."""
    rnd = random.Random(seed)
    declare(cluster[0], "nemesis")
    pub = Publisher(cluster, "nemesis")
    pub.start()
    for _ in range(4):
        time.sleep(rnd.uniform(1.0, 2.0))
        writer = writer_of(next(n for n in cluster.nodes if n.running()), "nemesis")
        victim = next((n for n in cluster.nodes if n.name == writer), None) if rnd.random() < 0.5 else None
        victim = victim or rnd.choice(cluster.nodes)
        fault = rnd.choice(["kill", "pause", "isolate"])
        if fault == "kill":
            victim.kill()
        elif fault == "pause":
            victim.pause()
        else:
            cluster.partition([victim], [n for n in cluster.nodes if n is not victim])
        time.sleep(rnd.uniform(2.0, 4.0))
        if fault == "kill":
            victim.start()
        elif fault == "pause":
            victim.resume()
        else:
            cluster.heal()
        cluster.wait_running({"n1", "n2", "n3"}, timeout=30)
    time.sleep(1.0)
    pub.stopping.set()
    pub.join(30)
    assert len(pub.confirmed) > 50
    for node in cluster.nodes:
        got = read_first(node, "nemesis", len(pub.confirmed), until=pub.confirmed)
        assert_all_confirmed_once_in_order(got, pub.confirmed, node.name)


@pytest.mark.slow
def test_whole_cluster_restart_keeps_the_stream(cluster: Cluster) -> None:
    declare(cluster[0], "restarted")
    confirmed = publish(cluster[1], "restarted", [f"f{i}" for i in range(100)])
    for node in cluster.nodes:
        node.stop()
    for node in cluster.nodes:  # together: each waits for a majority of the metadata members
        node.start(wait=False)
    for node in cluster.nodes:
        node.wait_ready(60)
    confirmed += publish(cluster[2], "restarted", [f"g{i}" for i in range(50)])
    for node in cluster.nodes:
        assert_all_confirmed_once_in_order(read_first(node, "restarted", len(confirmed), until=confirmed), confirmed, node.name)
    assert info(cluster[0], "restarted")["replication"]["epoch"] >= 2  # the restarted writer was replaced


class Reader(threading.Thread):
    """One pika consumer from `first` on one node, connected for the whole run: (offset, body) in order."""

    def __init__(self, node: Node, name: str) -> None:
        super().__init__(daemon=True)
        self.node, self.name_ = node, name
        self.got: list[tuple[int, str]] = []
        self.stopping = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        conn = connect(self.node)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)

        def on(channel: object, method: object, props: object, body: bytes) -> None:
            self.got.append((props.headers["x-stream-offset"], body.decode()))  # type: ignore[attr-defined]
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        ch.basic_consume(self.name_, on, arguments={"x-stream-offset": "first"})
        self.ready.set()
        while not self.stopping.is_set():
            conn.process_data_events(0.1)
        conn.close()


@pytest.mark.slow
def test_consumers_on_the_survivors_read_on_across_a_failover(cluster: Cluster) -> None:
    """Consumers connected to the two members that survive the writer's kill -9 stay connected and go
    on from where they were: every confirmed message once, in order, no gap at the failover."""
    n1, n2, n3 = cluster.nodes
    declare(n1, "live")
    readers = [Reader(n2, "live"), Reader(n3, "live")]
    for r in readers:
        r.start()
        assert r.ready.wait(10)
    confirmed = publish(n2, "live", [f"l{i}" for i in range(200)], during={80: n1.kill})
    for r in readers:
        assert eventually(lambda r=r: len({b for _, b in r.got} & set(confirmed)) == len(confirmed), timeout=30)
        time.sleep(0.5)  # (a duplicate would come now)
        r.stopping.set()
        r.join(10)
        assert_all_confirmed_once_in_order(r.got, confirmed, r.node.name)
