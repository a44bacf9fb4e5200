"""The stream protocol on a node of 2 workers (docs/scaling.md, "The stream protocol in every worker"):
every worker listens on the node's stream port, and rstream connections pinned to each worker (its own
stream port, `workers.own_ports`) publish to a stream written in worker 0 through worker 1 with
deduplication across a resend, read it from either worker, keep one single active consumer across the
workers, store an offset on one worker and query it on the other, use a super stream created on the
other worker, and get the same metadata (the node's one host and port) on every worker.

A stream of a node of workers has every worker as a member (written by one, replicated by the others):
these paths are the ones between nodes of a cluster (publishes forwarded to the writer, groups on the
writer, stored offsets through the writer), over the worker link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)
from tests.conftest import ServerInfo, start_server
from tests.stream_protocol.equivalence import EXPECTED, READERS, run_steps
from tests.workers.test_workers import CONFIG, connect, ports_file_names_worker, queue_json, until, worker_pid

from hutch import portfile
from hutch.streamproto import commands as sc
from hutch.streamproto.codes import Code
from hutch.streamproto.codes import OffsetType as SpecType
from hutch.streamproto.framer import FrameReader
from hutch.streamproto.wire import OffsetSpec as WireSpec

AUTH = {"username": "guest", "password": "guest"}
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("workers-streams"), "--workers", "2", "--stream-port", "0",
                        config_text=CONFIG)
    yield info
    info.stop()


def api(info: ServerInfo, path: str, method: str = "GET", body: Any = None) -> Any:
    req = urllib.request.Request(f"{info.mgmt_url}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode(),
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def own(info: ServerInfo, worker: int) -> int:
    """Worker `worker`'s own stream port: a connection there lives in that worker."""
    return info.ports[f"stream_w{worker}"]


def numbered(i: int, prefix: str) -> AMQPMessage:
    msg = AMQPMessage(body=f"{prefix}{i}".encode())
    msg.publishing_id = i
    return msg


async def publish(port: int, stream: str, ids: range, prefix: str, name: str | None = None) -> None:
    """Publish `ids` on `port` (reference `name`: deduplicated), every confirm awaited and positive."""
    async with Producer("127.0.0.1", port=port, **AUTH) as p:
        await send_confirmed(p, stream, ids, prefix, name)


async def send_confirmed(producer: Producer, stream: str, ids: Iterable[int], prefix: str, name: str | None) -> None:
    """Send `ids` (as publishing ids and, after `prefix`, bodies) as publisher `name` of `producer`; every
    confirm awaited and positive."""
    ids = list(ids)
    status: dict[int, bool] = {}
    done = asyncio.Event()

    async def on_confirm(s: Any) -> None:
        status[s.message_id] = s.is_confirmed
        if len(status) == len(ids):
            done.set()
    for i in ids:
        await producer.send(stream, numbered(i, prefix), publisher_name=name, on_publish_confirm=on_confirm)
    await asyncio.wait_for(done.wait(), TIMEOUT_S)
    assert all(status.values()) and sorted(status) == ids


async def read_first(port: int, stream: str, count: int) -> list[bytes]:
    """The first `count` messages of `stream`, read by a subscription on `port` (one chunk per credit),
    then whatever more arrives within a moment's reading (none is expected)."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append(bytes(msg.body))
        if len(got) >= count:
            done.set()

    async with Consumer("127.0.0.1", port=port, **AUTH) as c:
        await c.start()
        await c.subscribe(stream, on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
    return got


async def create(port: int, stream: str) -> None:
    async with Producer("127.0.0.1", port=port, **AUTH) as p:
        await p.create_stream(stream)


def test_every_worker_listens_and_a_stream_has_one_copy_in_its_declaring_worker(node: ServerInfo) -> None:
    assert {"stream", "stream_w0", "stream_w1"} <= set(node.ports)

    def copies() -> list[int]:
        return [len(list(node.data_dir.glob(f"w{w}/streams/*"))) for w in (0, 1)]

    before = copies()
    asyncio.run(create(own(node, 1), "members"))
    doc = queue_json(node, "members")
    assert doc["type"] == "stream" and doc["node"] == "test@localhost" and doc["worker"] == 1
    assert doc["members"] == doc["online"] == [doc["leader"]] == ["test@localhost"]
    # one copy, in the worker that declared it: its files there, none in the other worker
    assert copies() == [before[0], before[1] + 1]


def test_metadata_names_the_node_once_on_every_worker(node: ServerInfo) -> None:
    asyncio.run(create(own(node, 0), "where"))

    async def metadata(port: int) -> tuple[Any, list[Any]]:
        async with Producer("127.0.0.1", port=port, **AUTH) as p:
            client = await p.default_client
            leader, replicas = await client.query_leader_and_replicas("where")
        return leader, replicas

    for port in (own(node, 0), own(node, 1), node.ports["stream"]):
        leader, replicas = asyncio.run(metadata(port))
        assert (leader.host, leader.port) == ("127.0.0.1", port)  # (a worker's own port is told itself)
        assert replicas == []  # one node: its workers are not other brokers


def test_publish_through_worker_1_to_a_stream_written_in_worker_0_with_deduplication(node: ServerInfo) -> None:
    asyncio.run(create(own(node, 0), "dedup"))  # client-local: worker 0 writes it
    assert queue_json(node, "dedup")["leader_worker"].endswith("#w0")
    asyncio.run(publish(own(node, 1), "dedup", range(1, 51), "d", name="app"))
    asyncio.run(publish(own(node, 1), "dedup", range(26, 76), "d", name="app"))  # 26..50 resent: not stored
    want = [b"d%d" % i for i in range(1, 76)]
    for worker in (0, 1):  # each worker reads its own copy
        assert asyncio.run(read_first(own(node, worker), "dedup", len(want))) == want, worker


def test_single_active_consumer_across_the_workers(node: ServerInfo) -> None:
    asyncio.run(create(own(node, 0), "sac"))
    bodies = [b"s%d" % i for i in range(10)]
    asyncio.run(publish(own(node, 1), "sac", range(10), "s"))

    async def run() -> None:
        got: dict[str, list[bytes]] = {"on-w1": [], "on-w0": []}
        updates: list[tuple[str, bool]] = []
        consumers: dict[str, Consumer] = {}

        async def join(who: str, port: int) -> None:
            c = consumers[who] = Consumer("127.0.0.1", port=port, **AUTH)

            async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
                got[who].append(bytes(msg.body))

            async def on_update(is_active: bool, ctx: Any) -> Any:
                updates.append((who, is_active))
                return OffsetSpecification(OffsetType.FIRST, 0)

            await c.start()
            await c.subscribe("sac", on, decoder=amqp_decoder, consumer_update_listener=on_update,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                              properties={"single-active-consumer": "true", "name": "billing"})

        async def until(check: Any) -> None:
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while not check():
                assert asyncio.get_running_loop().time() < deadline, (updates, got)
                await asyncio.sleep(0.05)

        try:
            await join("on-w1", own(node, 1))  # first: active, though the group lives in worker 0
            await until(lambda: got["on-w1"] == bodies)
            await join("on-w0", own(node, 0))
            assert updates == [("on-w1", True)]
            # the group lives in worker 0 (the writer's), its first member's connection in worker 1
            rows = await asyncio.to_thread(api, node, "/api/stream/consumer-groups/%2F/sac/billing")
            assert [r["state"] for r in rows] == ["active (connected)", "waiting (connected)"]
            await consumers.pop("on-w1").close()  # the next one, in the other worker, takes over
            await until(lambda: got["on-w0"] == bodies)
            assert updates == [("on-w1", True), ("on-w0", True)]
        finally:
            for c in consumers.values():
                await c.close()
    asyncio.run(run())


def test_offset_stored_in_one_worker_is_queried_in_the_other(node: ServerInfo) -> None:
    asyncio.run(create(own(node, 0), "offsets"))
    asyncio.run(publish(own(node, 0), "offsets", range(10), "o"))

    async def query(port: int) -> int | None:
        async with Consumer("127.0.0.1", port=port, **AUTH) as c:
            try:
                return await c.query_offset("offsets", "app")
            except Exception:  # noqa: BLE001 - not stored (yet) there: rstream raises OffsetNotFound
                return None

    async def run() -> None:
        async with Consumer("127.0.0.1", port=own(node, 1), **AUTH) as c:  # worker 1 does not write it
            await c.store_offset("offsets", "app", 7)
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        for worker in (0, 1):
            while await query(own(node, worker)) != 7:
                assert asyncio.get_running_loop().time() < deadline, worker
                await asyncio.sleep(0.1)
    asyncio.run(run())


def test_the_tracking_of_a_stream_homed_in_worker_1_is_listed_by_the_api(node: ServerInfo) -> None:
    """The management API (worker 0) lists the tracking of a stream whose one copy is worker 1's, as
    worker 1 answers it (hutch-streams list_stream_tracking)."""
    asyncio.run(create(own(node, 1), "tracked"))
    asyncio.run(publish(own(node, 1), "tracked", range(1, 4), "t", name="app"))

    async def store() -> None:
        async with Consumer("127.0.0.1", port=own(node, 0), **AUTH) as c:  # (through the link to worker 1)
            await c.store_offset("tracked", "reader", 2)
    asyncio.run(store())
    want = [{"type": "writer", "name": "app", "tracking_value": 3},
            {"type": "offset", "name": "reader", "tracking_value": 2}]
    until(lambda: api(node, "/api/stream/tracking/%2F/tracked") == want, what="the tracking listed")


def test_super_stream_created_in_one_worker_is_routed_in_the_other(node: ServerInfo) -> None:
    async def run() -> None:
        async with Producer("127.0.0.1", port=own(node, 1), **AUTH) as p:
            client = await p.default_client
            await client.create_super_stream("regions", ["regions-eu", "regions-us"], ["eu", "us"])
        async with Producer("127.0.0.1", port=own(node, 0), **AUTH) as p:
            client = await p.default_client
            assert await client.partitions("regions") == ["regions-eu", "regions-us"]
            assert await client.route("us", "regions") == ["regions-us"]
        await publish(own(node, 0), "regions-us", range(3), "u")
        assert await read_first(own(node, 1), "regions-us", 3) == [b"u0", b"u1", b"u2"]
    asyncio.run(run())


def test_stream_protocol_counters_are_the_nodes(node: ServerInfo) -> None:
    """/metrics' rabbitmq_global_* of protocol "stream" count every worker's connections."""
    def received() -> int:
        with urllib.request.urlopen(f"{node.mgmt_url}/metrics", timeout=30) as r:
            text = r.read().decode()
        found = re.search(r'^rabbitmq_global_messages_received_total\{protocol="stream"\} (\d+)', text, re.M)
        assert found is not None
        return int(found.group(1))

    asyncio.run(create(own(node, 0), "counted"))
    before = received()
    asyncio.run(publish(own(node, 1), "counted", range(5), "c"))  # received in worker 1
    asyncio.run(publish(own(node, 0), "counted", range(5, 8), "c"))
    assert received() - before == 8


def test_management_lists_and_closes_the_stream_connections_of_every_worker(node: ServerInfo) -> None:
    asyncio.run(create(own(node, 0), "listed"))

    async def run() -> None:
        p = Producer("127.0.0.1", port=own(node, 1), **AUTH, connection_name="in-w1")
        await p.start()
        try:
            await p.send_wait("listed", AMQPMessage(body=b"x"))  # (a publisher declared in worker 1)
            conns = await asyncio.to_thread(api, node, "/api/stream/connections")
            mine = [c for c in conns if c["client_properties"].get("connection_name") == "in-w1"]
            assert len(mine) == 1 and mine[0]["node"] == "test@localhost" and mine[0]["port"] == own(node, 1)
            publishers = await asyncio.to_thread(api, node, "/api/stream/publishers/%2F/listed")
            assert [r["connection_details"]["name"] for r in publishers] == [mine[0]["name"]]
            everything = await asyncio.to_thread(api, node, "/api/connections")
            assert any(c["name"] == mine[0]["name"] and c["protocol"] == "stream" for c in everything)
            path = "/api/stream/connections/%2F/" + urllib.request.quote(mine[0]["name"], safe="")
            await asyncio.to_thread(api, node, path, "DELETE")
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while any(c["name"] == mine[0]["name"] for c in await asyncio.to_thread(api, node, "/api/stream/connections")):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):  # (its socket was closed under it)
                await p.close()
    asyncio.run(run())


def test_amqp_publishes_in_either_worker_and_reads_from_first_in_the_other(node: ServerInfo) -> None:
    """Over AMQP 0-9-1 too: a stream declared in worker 0, published to through worker 1 with confirms and
    through worker 0, read from `first` in worker 1 with its offsets (before, worker 1 held a stand-in that
    read from `next` only)."""
    with connect(node, 0) as c0, connect(node, 1) as c1:
        c0.channel().queue_declare("amqp-s", durable=True, arguments={"x-queue-type": "stream"})
        ch1 = c1.channel()
        ch1.confirm_delivery()
        for i in range(3):
            ch1.basic_publish("", "amqp-s", b"w1-%d" % i)
        ch0 = c0.channel()
        ch0.confirm_delivery()
        ch0.basic_publish("", "amqp-s", b"w0")
        reader = c1.channel()
        reader.basic_qos(prefetch_count=10)
        got: list[tuple[int, bytes]] = []
        reader.basic_consume("amqp-s", lambda ch, m, props, body: (got.append((props.headers["x-stream-offset"], body)),
                                                                    ch.basic_ack(m.delivery_tag)),
                             arguments={"x-stream-offset": "first"})
        until(lambda: c1.process_data_events(0.05) or len(got) >= 4, what="4 messages")
        assert [b for _, b in got] == [b"w1-0", b"w1-1", b"w1-2", b"w0"]
        offsets = [o for o, _ in got]
        assert offsets == sorted(set(offsets))


def test_pika_and_rstream_in_the_other_worker_read_as_rabbitmq_does(node: ServerInfo) -> None:
    """The stream's one copy in worker 0; pika and rstream in worker 1 write it and read it from `first`,
    offsets, a timestamp, an interval and with filters (tests/stream_protocol/equivalence.py's steps):
    exactly what RabbitMQ gives, offsets from 0 (pika through the hop with its x-stream-offset and filter
    arguments, rstream over the worker link)."""
    with connect(node, 0) as c0:
        c0.channel().queue_declare("eq-w", durable=True, arguments={"x-queue-type": "stream"})
    assert queue_json(node, "eq-w")["worker"] == 0
    url = f"amqp://guest:guest@127.0.0.1:{node.ports['amqp_w1']}/%2F"
    got = asyncio.run(run_steps(url, "127.0.0.1", own(node, 1), "eq-w"))
    expected = {(name, reader): rows for name, rows in EXPECTED.items() for reader in READERS
                if not (name.startswith("interval") and reader == "rstream")}
    assert got == expected


def test_a_subscription_over_the_link_is_listed_and_told_when_the_stream_goes(node: ServerInfo) -> None:
    """A subscription in worker 1 to a stream homed in worker 0: listed by the API with its offset, caught
    up; the stream deleted through worker 0 (AMQP 0-9-1): the subscription's client is told at once (a
    metadata update, rstream's close handler)."""
    asyncio.run(create(own(node, 0), "goes"))
    asyncio.run(publish(own(node, 0), "goes", range(5), "g"))

    async def run() -> None:
        closed: list[Any] = []
        got: list[int] = []

        async def on_close(info: Any) -> None:
            closed.append(info)

        async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
            got.append(ctx.offset)

        async def until_true(check: Any, what: str) -> None:
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while not check():
                assert asyncio.get_running_loop().time() < deadline, what
                await asyncio.sleep(0.05)

        async with Consumer("127.0.0.1", port=own(node, 1), on_close_handler=on_close, **AUTH) as c:
            await c.start()
            await c.subscribe("goes", on, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await until_true(lambda: got == [0, 1, 2, 3, 4], "5 messages from offset 0")

            def caught_up() -> bool:
                subs = [r for r in api(node, "/api/stream/consumers/%2F") if r["stream"] == "goes"]
                return len(subs) == 1 and subs[0]["offset"] == 5 and subs[0]["offset_lag"] == 0
            await until_true(lambda: caught_up(), "the subscription listed, caught up")
            with connect(node, 0) as c0:
                c0.channel().queue_delete("goes")
            await until_true(lambda: bool(closed), "the client told")
    asyncio.run(run())


def test_a_stream_with_a_copy_per_worker_keeps_working(node: ServerInfo) -> None:
    """A stream as the design before this one made them (a replica in every worker, here made with
    add_member): both workers still serve it from their copies, a publisher in the worker that does not
    write it forwards with deduplication."""
    def copies_in_w1() -> set[str]:
        return {p.name for p in node.data_dir.glob("w1/streams/*")}

    before = copies_in_w1()
    asyncio.run(create(own(node, 0), "two-copies"))
    asyncio.run(publish(own(node, 0), "two-copies", range(1, 4), "c", name="app"))
    added = api(node, "/api/queues/%2F/two-copies/members", "POST", {"node": "test@localhost#w1"})
    assert added["members"] == ["test@localhost#w0", "test@localhost#w1"]
    until(lambda: len(copies_in_w1() - before) == 1, what="worker 1's copy")
    asyncio.run(publish(own(node, 1), "two-copies", range(3, 6), "c", name="app"))  # (3 deduplicated)
    want = [b"c%d" % i for i in range(1, 6)]
    for worker in (0, 1):
        assert asyncio.run(read_first(own(node, worker), "two-copies", len(want))) == want, worker
    # (a replicated stream keeps two members at least: delete_member of worker 1 is refused, as between
    # nodes; such a stream keeps its two copies)
    with pytest.raises(urllib.error.HTTPError) as refused:
        api(node, "/api/queues/%2F/two-copies/members/test@localhost%23w1", "DELETE")
    assert refused.value.code == 400


@pytest.mark.slow
def test_either_worker_killed_a_deduplicating_publisher_resends_and_every_message_is_there_once(
        tmp_path: Path) -> None:
    """`kill -9` of the worker that does not write, then of the writer: each restarts (its copy of the
    stream from its files), a publisher with a reference resends overlapping ids through worker 1, and
    both workers read every message once, in order."""
    info = start_server(tmp_path, "--workers", "2", "--stream-port", "0", config_text=CONFIG)
    try:
        def port(worker: int) -> int:
            doc = portfile.read(info.data_dir)
            assert doc is not None
            return int(doc["listeners"][f"stream_w{worker}"])

        asyncio.run(create(port(0), "kept"))
        asyncio.run(publish(port(1), "kept", range(1, 11), "k", name="app"))
        for victim, ids in ((1, range(5, 21)), (0, range(15, 31))):
            old = worker_pid(info, victim)
            assert old is not None
            os.kill(old, signal.SIGKILL)
            until(lambda v=victim, o=old: worker_pid(info, v) not in (None, o) and ports_file_names_worker(info, v),
                  timeout=TIMEOUT_S, what=f"worker {victim} back")
            asyncio.run(publish(port(1), "kept", ids, "k", name="app"))  # (the ids before ids.stop stored once)
            want = [b"k%d" % i for i in range(1, ids.stop)]
            for worker in (0, 1):
                assert asyncio.run(read_first(port(worker), "kept", len(want))) == want, (victim, worker)
    finally:
        info.stop()


@pytest.mark.slow
def test_a_stream_with_a_copy_per_worker_opens_after_a_restart(tmp_path: Path) -> None:
    """The upgrade: a stream with a replica in every worker (the design before this one; made here with
    add_member) opens after the node's restart with both copies, and both workers serve it."""
    info = start_server(tmp_path, "--workers", "2", "--stream-port", "0", config_text=CONFIG)
    try:
        asyncio.run(create(info.ports["stream_w0"], "kept"))
        asyncio.run(publish(info.ports["stream_w0"], "kept", range(1, 4), "k", name="app"))
        api(info, "/api/queues/%2F/kept/members", "POST", {"node": "test@localhost#w1"})
        asyncio.run(publish(info.ports["stream_w1"], "kept", range(4, 6), "k", name="app"))
    finally:
        info.stop()
    info = start_server(tmp_path, "--workers", "2", "--stream-port", "0", config_text=CONFIG)
    try:
        until(lambda: queue_json(info, "kept").get("member_workers") == ["test@localhost#w0", "test@localhost#w1"],
              what="both copies")
        asyncio.run(publish(info.ports["stream_w1"], "kept", range(5, 7), "k", name="app"))
        want = [b"k%d" % i for i in range(1, 7)]
        for worker in (0, 1):
            assert asyncio.run(read_first(info.ports[f"stream_w{worker}"], "kept", len(want))) == want, worker
    finally:
        info.stop()


class RawStreamClient:
    """A stream-protocol client over a real socket for the commands rstream (1.1) and rbfly do not send
    (stream stats, resolve offset spec): frames encoded and decoded by hutch.streamproto, whose codec is
    checked against rstream's (tests/codec/test_streamproto.py)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader(0)
        self.corr = 0

    @classmethod
    async def open(cls, port: int) -> RawStreamClient:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        await client.request(sc.PeerProperties(client.next_corr(), {"product": "raw"}))
        await client.request(sc.SaslHandshake(client.next_corr()))
        await client.request(sc.SaslAuthenticate(client.next_corr(), "PLAIN", b"\0guest\0guest"), 2)
        await client.request(sc.TuneResponse(1 << 20, 0), 0)
        (opened,) = await client.request(sc.Open(client.next_corr(), "/"))
        assert isinstance(opened, sc.OpenResponse) and opened.code == Code.OK
        return client

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    async def request(self, cmd: sc.Command, answers: int = 1) -> list[sc.Command]:
        """Send `cmd`; the next `answers` frames (heartbeats and metadata updates are not expected)."""
        self.writer.write(sc.encode(cmd))
        got: list[sc.Command] = []
        while len(got) < answers:
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT_S)
            assert data, "the node closed the connection"
            self.frames.feed(data)
            got.extend(sc.decode(f) for f in self.frames.frames())
        return got

    async def stats(self, stream: str) -> tuple[int, dict[str, int]]:
        (answer,) = await self.request(sc.StreamStats(self.next_corr(), stream))
        assert isinstance(answer, sc.StreamStatsResponse) and answer.correlation_id == self.corr
        return answer.code, answer.stats

    async def resolve(self, stream: str, spec: WireSpec) -> tuple[int, int]:
        (answer,) = await self.request(sc.ResolveOffsetSpec(self.next_corr(), stream, spec))
        assert isinstance(answer, sc.ResolveOffsetSpecResponse) and answer.correlation_id == self.corr
        return answer.code, answer.offset

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def test_stream_stats_and_resolve_offset_spec_answer_the_same_on_every_worker(node: ServerInfo) -> None:
    """Stream stats and resolve offset spec of a stream whose copy is worker 0's, asked on worker 1, are
    the home's answers (asked over the worker link), as on one node; a stream that does not exist is
    STREAM_DOES_NOT_EXIST on both."""
    asyncio.run(create(own(node, 0), "stats"))

    async def run() -> None:
        clients = [await RawStreamClient.open(own(node, w)) for w in (0, 1)]
        try:
            empty = [await cl.stats("stats") for cl in clients]
            assert empty == [(Code.OK, {"first_chunk_id": -1, "committed_chunk_id": -1})] * 2, empty
            await publish(own(node, 1), "stats", range(10), "a")
            after_a = int(time.time() * 1000)
            await publish(own(node, 1), "stats", range(10, 20), "b")
            answers = []
            for cl in clients:
                code, stats = await cl.stats("stats")
                specs = [WireSpec(SpecType.FIRST), WireSpec(SpecType.LAST), WireSpec(SpecType.NEXT),
                         WireSpec(SpecType.OFFSET, 5), WireSpec(SpecType.TIMESTAMP, after_a)]
                answers.append((code, stats, [await cl.resolve("stats", s) for s in specs]))
            assert answers[0] == answers[1], answers
            code, stats, resolved = answers[1]
            assert code == Code.OK and stats["first_chunk_id"] == 0 and 0 < stats["committed_chunk_id"] < 20
            assert [r[0] for r in resolved] == [Code.OK] * 5
            first, last, nxt, at_5, at_time = (r[1] for r in resolved)
            assert (first, nxt, at_5) == (0, 20, 5) and last == stats["committed_chunk_id"]
            assert 0 <= at_time <= 20
            for cl in clients:
                assert (await cl.stats("no-such-stream"))[0] == Code.STREAM_DOES_NOT_EXIST
                assert (await cl.resolve("no-such-stream", WireSpec(SpecType.FIRST)))[0] == Code.STREAM_DOES_NOT_EXIST
        finally:
            for cl in clients:
                await cl.close()
    asyncio.run(run())


def test_management_shows_an_amqp_consumer_of_a_stream_in_the_other_worker_with_its_offsets(node: ServerInfo) -> None:
    """A pika consumer in worker 1 of a stream whose copy is worker 0's (it reads through the stand-in) is
    listed once in the queue's consumer_details and in /api/consumers, with where it reads as the home
    answers it (offset, offset_lag, credits); a stream homed in worker 1 is among /api/stream/streams."""
    with connect(node, 0) as c0, connect(node, 1) as c1:
        c0.channel().queue_declare("held-s", durable=True, arguments={"x-queue-type": "stream"})
        ch0 = c0.channel()
        ch0.confirm_delivery()
        for i in range(10):
            ch0.basic_publish("", "held-s", b"%d" % i)
        reader = c1.channel()
        reader.basic_qos(prefetch_count=2)
        held: list[int] = []
        reader.basic_consume("held-s", lambda ch, m, props, body: held.append(m.delivery_tag),
                             consumer_tag="held", arguments={"x-stream-offset": "first"})
        until(lambda: c1.process_data_events(0.05) or len(held) == 2, what="2 deliveries")

        def fields(row: dict[str, Any]) -> tuple[Any, ...]:
            return row["consumer_tag"], row.get("offset"), row.get("offset_lag"), row.get("credits")
        details = api(node, "/api/queues/%2F/held-s")["consumer_details"]
        assert [fields(r) for r in details] == [("held", 2, 8, 0)]
        assert [fields(r) for r in api(node, "/api/consumers/%2F") if r["queue"]["name"] == "held-s"] == \
            [("held", 2, 8, 0)]
        reader.basic_ack(held[-1], multiple=True)
        until(lambda: c1.process_data_events(0.05) or len(held) == 4, what="2 more deliveries")
        until(lambda: [fields(r) for r in api(node, "/api/queues/%2F/held-s")["consumer_details"]]
              == [("held", 4, 6, 0)], what="the consumer's new offset")
    asyncio.run(create(own(node, 1), "listed-w1"))
    assert "listed-w1" in {row["name"] for row in api(node, "/api/stream/streams/%2F")}


def test_balanced_streams_go_to_the_worker_with_the_fewest_streams(node: ServerInfo) -> None:
    """`x-queue-leader-locator: balanced` on a node of workers: a new stream's one copy goes to the worker
    that holds the fewest streams (the lower index on a tie), whichever worker the declare came to; a
    stream without it stays in its declaring worker (client-local). A balanced stream homed elsewhere is
    written and read from the declaring worker."""
    def counts() -> list[int]:
        rows = [q for q in api(node, "/api/queues/%2F") if q.get("type") == "stream"]
        return [sum(1 for q in rows if q["worker"] == w) for w in (0, 1)]

    def files() -> list[int]:
        return [len(list(node.data_dir.glob(f"w{w}/streams/*"))) for w in (0, 1)]

    files_before = files()
    with connect(node, 0) as c0:
        ch = c0.channel()
        for i in range(4):
            before = counts()
            expected = 0 if before[0] <= before[1] else 1
            ch.queue_declare(f"bal-{i}", durable=True, arguments={"x-queue-type": "stream",
                                                                  "x-queue-leader-locator": "balanced"})
            assert queue_json(node, f"bal-{i}")["worker"] == expected, (i, before)
        placed = [queue_json(node, f"bal-{i}")["worker"] for i in range(4)]
        assert 1 in placed  # (the module's other streams are mostly worker 0's)
        # one copy each, in its home worker's files
        assert files() == [files_before[0] + placed.count(0), files_before[1] + placed.count(1)]
        ch.queue_declare("local-s", durable=True, arguments={"x-queue-type": "stream"})
        assert queue_json(node, "local-s")["worker"] == 0
        far = f"bal-{placed.index(1)}"
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", far, b"b%d" % i)
    got = asyncio.run(read_first(own(node, 0), far, 5))
    assert got == [b"b%d" % i for i in range(5)]
