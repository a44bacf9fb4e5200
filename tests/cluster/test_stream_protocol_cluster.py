"""The stream protocol on a real three-node cluster (issue 23; docs/streams.md, "On the node"): rstream
publishers connected to a member that does not write a replicated stream (their publishes go to the
writer's node, as RabbitMQ's do), with and without deduplication, simple entries and gzip sub-batches,
every confirmed message read back on every member; and single-active-consumer groups whose consumers are
connected to different members: one active cluster-wide, the next one activated (with a consumer update)
when the active one leaves, when its node is killed, and when the writer's node (where the group lives)
is killed.

`make test` runs the group test without kills; the others are `slow`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream.client import Addr, Client

from .nodes import Cluster, Node, eventually, short
from .test_stream_cluster import declare, info, read_first, rstream_read, start_cluster, stream_port

AUTH = {"username": "guest", "password": "guest"}


class _Pinned:
    """rstream opens each stream's connection on the node the metadata names (a producer: the leader; a
    consumer: a random replica); these open it on the node they are given."""

    _pinned: Addr

    async def _get_or_create_client(self: Any, stream: str) -> Client:
        if stream not in self._clients:
            self._clients[stream] = await self._pool.get(connection_name=self._connection_name, addr=self._pinned,
                                                         stream=stream,
                                                         connection_closed_handler=self._on_connection_closed)
        return self._clients[stream]


class PinnedProducer(_Pinned, Producer):
    """An rstream producer that publishes on the node it is given, whatever the metadata names as the
    leader (a client behind a load balancer, or one that does not look)."""

    def __init__(self, port: int, **kw: Any) -> None:
        super().__init__("127.0.0.1", port=port, **AUTH, **kw)
        self._pinned = Addr("127.0.0.1", port)


class PinnedConsumer(_Pinned, Consumer):
    """An rstream consumer that reads on the node it is given."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", port=port, **AUTH)
        self._pinned = Addr("127.0.0.1", port)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("stream-protocol-cluster"))
    yield c
    c.stop()


def numbered(i: int, prefix: str) -> AMQPMessage:
    msg = AMQPMessage(body=f"{prefix}{i}".encode())
    msg.publishing_id = i
    return msg


async def publish_through(port: int, stream: str, batches: list[list[AMQPMessage]], *, name: str | None = None,
                          gzip_batch: list[AMQPMessage] | None = None) -> None:
    """Each batch with send_batch (then a send_wait of nothing more: every confirm awaited), on `port`."""
    confirmed = asyncio.Event()
    want = sum(len(b) for b in batches) + (1 if gzip_batch else 0)
    got: list[bool] = []

    async def on_confirm(status: Any) -> None:
        got.append(status.is_confirmed)
        if len(got) == want:
            confirmed.set()

    async with PinnedProducer(port) as p:
        for batch in batches:
            for msg in batch:
                await p.send(stream, msg, publisher_name=name, on_publish_confirm=on_confirm)
        if gzip_batch:
            await p.send_sub_entry(stream, gzip_batch, compression_type=CompressionType.Gzip, publisher_name=name,
                                   on_publish_confirm=on_confirm)
        await asyncio.wait_for(confirmed.wait(), 60)
    assert all(got), "a publish through the replica was refused"


@pytest.mark.slow
def test_rstream_publishes_through_a_replica_reach_every_member_once(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "through-replica")  # n1 writes (client-local)
    assert short(info(n2, "through-replica")["leader"]) == "n1"
    ports = {n.name: stream_port(n) for n in cluster.nodes}
    plain = [numbered(i, "p") for i in range(1, 301)]
    zipped = [AMQPMessage(body=b"z%d" % i) for i in range(20)]
    asyncio.run(publish_through(ports["n2"], "through-replica", [plain]))
    # (a sub-entry in the same rstream producer as messages with publishing ids of their own is never
    # confirmed by rstream, against any broker: its id collides; so it goes on its own)
    asyncio.run(publish_through(ports["n2"], "through-replica", [], gzip_batch=zipped))
    # with deduplication: the ids 1..100 of reference "app", then 51..150 resent (51..100 are duplicates)
    deduped = [numbered(i, "d") for i in range(1, 101)]
    asyncio.run(publish_through(ports["n3"], "through-replica", [deduped], name="app"))
    asyncio.run(publish_through(ports["n2"], "through-replica", [[numbered(i, "d") for i in range(51, 151)]],
                                name="app"))
    want = [b"p%d" % i for i in range(1, 301)] + [b"z%d" % i for i in range(20)] + [b"d%d" % i for i in range(1, 151)]
    for node in cluster.nodes:
        assert asyncio.run(rstream_read(ports[node.name], "through-replica", len(want))) == want, node.name
    doc = info(n3, "through-replica")
    assert eventually(lambda: info(n3, "through-replica")["last_offset"] >= len(want) - 1)  # offsets from 0
    assert doc["type"] == "stream"


async def publish_resending(port: int, stream: str, count: int, during: dict[int, Any]) -> list[bytes]:
    """Publish `count` numbered messages (reference "app") through `port` in batches of 25, each batch's
    confirms awaited; a batch with refused ids is resent whole (deduplication drops what was stored);
    `during[i]()` runs before batch i. Returns the bodies in publishing order (every one confirmed)."""
    out: list[bytes] = []
    async with PinnedProducer(port) as p:
        for b, start in enumerate(range(1, count + 1, 25)):
            if b in during:
                await asyncio.to_thread(during[b])
            batch = list(range(start, min(start + 25, count + 1)))
            for _attempt in range(20):
                status: dict[int, bool] = {}
                done = asyncio.Event()

                async def on_confirm(s: Any, status: dict[int, bool] = status, done: asyncio.Event = done,
                                     n: int = len(batch)) -> None:
                    status[s.message_id] = s.is_confirmed
                    if len(status) == n:
                        done.set()

                for i in batch:
                    await p.send(stream, numbered(i, "k"), publisher_name="app", on_publish_confirm=on_confirm)
                await asyncio.wait_for(done.wait(), 60)
                if all(status.values()):
                    break
            else:
                raise AssertionError(f"batch {b} never confirmed")
            out.extend(b"k%d" % i for i in batch)
    return out


@pytest.mark.slow
def test_writer_killed_while_rstream_publishes_through_a_replica(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "forward-failover")
    assert _writer(n3, "forward-failover") == "n1"
    ports = {n.name: stream_port(n) for n in cluster.nodes}
    confirmed = asyncio.run(publish_resending(ports["n2"], "forward-failover", 400, {6: n1.kill}))
    assert eventually(lambda: _writer(n2, "forward-failover") in ("n2", "n3"), timeout=30)
    n1.start()
    cluster.wait_running({"n1", "n2", "n3"})
    for node in cluster.nodes:
        got = read_first(node, "forward-failover", len(confirmed))
        assert [b for _, b in got] == [b.decode() for b in confirmed], node.name  # every one once, in order


def _writer(node: Node, stream: str) -> str:
    return short(info(node, stream)["leader"])


class Group:
    """rstream consumers of one single-active-consumer group, each pinned to a node: what each got."""

    def __init__(self, stream: str, name: str) -> None:
        self.stream, self.name = stream, name
        self.consumers: dict[str, PinnedConsumer] = {}
        self.got: dict[str, list[bytes]] = {}
        self.updates: list[tuple[str, bool]] = []
        self.changed = asyncio.Event()

    async def join(self, who: str, port: int) -> None:
        c = self.consumers[who] = PinnedConsumer(port)
        self.got[who] = []

        async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
            self.got[who].append(bytes(msg.body))
            self.changed.set()

        async def on_update(is_active: bool, ctx: Any) -> Any:
            self.updates.append((who, is_active))
            self.changed.set()
            return OffsetSpecification(OffsetType.FIRST, 0)

        await c.start()
        await c.subscribe(self.stream, on_message, decoder=amqp_decoder, consumer_update_listener=on_update,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                          properties={"single-active-consumer": "true", "name": self.name})

    async def leave(self, who: str) -> None:
        await self.consumers.pop(who).close()

    async def until(self, check: Any, timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not check():
            self.changed.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            assert remaining > 0, f"timed out: updates {self.updates}, got { {k: len(v) for k, v in self.got.items()} }"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))

    async def close(self) -> None:
        for c in self.consumers.values():
            with contextlib.suppress(Exception):
                await c.close()


def pika_publish(node: Node, stream: str, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", stream, b)
    conn.close()


def test_one_active_consumer_across_members_and_the_next_on_leave(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "sac-across")  # the group lives with the writer, on n1
    pika_publish(n1, "sac-across", [b"m%d" % i for i in range(20)])
    ports = {n.name: stream_port(n) for n in cluster.nodes}
    all_of = [b"m%d" % i for i in range(20)]

    async def run() -> None:
        g = Group("sac-across", "billing")
        try:
            await g.join("on-n2", ports["n2"])  # first: active (a consumer update, then it reads)
            await g.until(lambda: g.got["on-n2"] == all_of)
            await g.join("on-n3", ports["n3"])
            await g.join("on-n1", ports["n1"])
            assert g.updates == [("on-n2", True)]
            await g.leave("on-n2")  # the next in arrival order, on another node, takes over
            await g.until(lambda: g.got["on-n3"] == all_of)
            assert g.updates == [("on-n2", True), ("on-n3", True)] and g.got["on-n1"] == []
            await asyncio.to_thread(pika_publish, n2, "sac-across", [b"more"])  # (through a replica)
            await g.until(lambda: g.got["on-n3"][-1:] == [b"more"])
            assert g.got["on-n1"] == []
            code, rows = n1.api("GET", "/api/stream/consumer-groups/%2F/sac-across/billing")
            assert code == 200 and [r["state"] for r in rows] == ["active (connected)", "waiting (connected)"]
        finally:
            await g.close()
    asyncio.run(run())


def test_an_offset_stored_on_a_replica_is_stored_by_the_writer_and_read_everywhere(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "offsets-across")
    pika_publish(n1, "offsets-across", [b"o%d" % i for i in range(10)])
    ports = {n.name: stream_port(n) for n in cluster.nodes}

    async def query(port: int) -> int | None:
        async with PinnedConsumer(port) as c:
            try:
                return await c.query_offset("offsets-across", "app")
            except Exception:  # noqa: BLE001 - not stored (yet) there: rstream raises OffsetNotFound
                return None

    async def run() -> None:
        async with PinnedConsumer(ports["n2"]) as c:  # n2 does not write the stream
            await c.store_offset("offsets-across", "app", 7)
            for node in cluster.nodes:
                deadline = asyncio.get_running_loop().time() + 30
                while await query(ports[node.name]) != 7:
                    assert asyncio.get_running_loop().time() < deadline, node.name
                    await asyncio.sleep(0.1)
            await c.store_offset("offsets-across", "app", 8)  # the connection is still there
            deadline = asyncio.get_running_loop().time() + 30
            while await c.query_offset("offsets-across", "app") != 8:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
    asyncio.run(run())


@pytest.mark.slow
def test_the_group_fails_over_when_the_active_node_and_then_the_writers_node_die(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    declare(n1, "sac-failover")
    pika_publish(n1, "sac-failover", [b"f%d" % i for i in range(20)])
    all_of = [b"f%d" % i for i in range(20)]
    ports = {n.name: stream_port(n) for n in cluster.nodes}

    async def run() -> None:
        g = Group("sac-failover", "audit")
        try:
            await g.join("on-n2", ports["n2"])
            await g.until(lambda: g.got["on-n2"] == all_of)
            await g.join("on-n3", ports["n3"])
            await g.join("on-n1", ports["n1"])
            # the active consumer's node dies: the group's node (n1, the writer's) activates the next
            await asyncio.to_thread(n2.kill)
            await g.until(lambda: g.got["on-n3"] == all_of)
            assert [u for u in g.updates if u[1]] == [("on-n2", True), ("on-n3", True)]
            await asyncio.to_thread(n2.start)
            await asyncio.to_thread(cluster.wait_running, {"n1", "n2", "n3"})
            await g.join("on-n2-again", stream_port(n2))  # (its stream listener took a new port)
            await g.leave("on-n3")
            await g.until(lambda: g.got["on-n1"] == all_of)  # next in arrival order, on the writer's node
            # the writer's node dies with the active consumer: the group moves with the stream's writer, and
            # the consumer left on n2 is activated there
            await asyncio.to_thread(n1.kill)
            await g.until(lambda: g.got["on-n2-again"] == all_of, timeout=60)
            assert [u for u in g.updates if u[1]][-1] == ("on-n2-again", True)
        finally:
            await g.close()
    try:
        asyncio.run(run())
    finally:
        if not n1.running():
            n1.start()
        if not n2.running():
            n2.start()
        cluster.wait_running({"n1", "n2", "n3"})


def test_a_node_that_is_not_a_member_answers_from_the_members(cluster: Cluster) -> None:
    """A stream of two members asked on the third node: metadata names its writer and its replica (as
    RabbitMQ answers on every node; a stream of one member its node), query offset and query publisher sequence answer as a member does,
    and rstream, connected to the third node, publishes and reads by that metadata."""
    n1 = cluster.nodes[0]
    declare(n1, "two-members", **{"x-initial-cluster-size": 2})  # n1 writes (client-local), one other
    doc = info(n1, "two-members")
    members = {short(m) for m in doc["members"]}
    assert short(doc["leader"]) == "n1" and len(members) == 2
    outside = next(n for n in cluster.nodes if n.name not in members)
    replica = next(n for n in cluster.nodes if n.name in members and n.name != "n1")
    ports = {n.name: stream_port(n) for n in cluster.nodes}
    asyncio.run(publish_through(ports["n1"], "two-members", [[numbered(i, "t") for i in range(1, 6)]], name="app"))
    declare(n1, "one-member", **{"x-initial-cluster-size": 1})  # (not replicated: n1's alone)

    async def run() -> None:
        async with PinnedConsumer(ports["n1"]) as c:
            await c.store_offset("two-members", "reader", 3)
        async with Producer("127.0.0.1", port=ports[outside.name], **AUTH) as p:
            client = await p.default_client
            leader, replicas = await client.query_leader_and_replicas("two-members")
            assert leader.port == ports["n1"] and [r.port for r in replicas] == [ports[replica.name]]
            assert await client.query_publisher_sequence("two-members", "app") == 5
            leader, replicas = await client.query_leader_and_replicas("one-member")
            assert leader.port == ports["n1"] and replicas == []
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # (the stored offset reaches the replica asked first once it has the chunk)
                try:
                    if await client.query_offset("two-members", "reader") == 3:
                        break
                except Exception:  # noqa: BLE001 - rstream raises OffsetNotFound until then
                    pass
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            await p.send_wait("two-members", AMQPMessage(body=b"via-outside"))  # (on the leader it was told)
        want = [b"t%d" % i for i in range(1, 6)] + [b"via-outside"]
        assert await rstream_read(ports[outside.name], "two-members", len(want)) == want  # (read on a member)
    asyncio.run(run())
