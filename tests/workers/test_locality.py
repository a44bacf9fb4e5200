"""Connection locality in a node of 2 workers (`workers.locality`, runtime/workers/handover.py): a
connection whose first publish or consume uses a queue of the other worker moves there while quiet.

Connections are pinned to a worker (its own port, `workers.own_ports`), so a move is certain; which worker
holds a connection's socket is read from /proc (the socket's inode among each worker's descriptors), the
way an operator would check it. Waits poll with generous deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from pika.exceptions import AMQPConnectionError
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)
from tests.conftest import ServerInfo, start_server
from tests.mgmt.helpers import Api, wait_mgmt
from tests.workers.test_worker_limits import add_vhost, refused
from tests.workers.test_workers import PERSISTENT, alive, client_port, holders, until, worker_of, worker_pid
from tests.workers.test_workers_streams import send_confirmed

from hutch import portfile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CONFIG = "workers.own_ports = true\nworkers.heartbeat_timeout = 30000\ncluster.tick_interval = 50\n" \
         "cluster.metadata_timeout = 5000\n"


def own_port(info: ServerInfo, worker: int) -> int:
    doc = portfile.read(info.data_dir)
    assert doc is not None
    return int(doc["listeners"][f"amqp_w{worker}"])


def connect(info: ServerInfo, worker: int, **kwargs: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", own_port(info, worker), **kwargs))


def declare_in(info: ServerInfo, worker: int, prefix: str) -> str:
    """A new queue whose home is `worker` (declared until the fewest-queues placement puts one there)."""
    with connect(info, 0) as conn:
        ch = conn.channel()
        for i in range(8):
            name = f"{prefix}-{i}"
            ch.queue_declare(name)
            if worker_of(info, name) == worker:
                return name
    raise AssertionError(f"no queue placed in worker {worker}")


def connection_ended(conn: pika.BlockingConnection) -> bool:
    """Whether pika has seen its connection end (it raises from its event loop)."""
    try:
        conn.process_data_events(time_limit=0.1)
    except AMQPConnectionError:
        return True
    return False


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("locality"), "--workers", "2", "--stream-port", "0",
                        config_text=CONFIG)
    yield info
    info.stop()


def test_publisher_and_consumer_move_to_their_queues_worker_nothing_lost_or_reordered(node: ServerInfo) -> None:
    queue = declare_in(node, 1, "move")
    with connect(node, 0) as pub, connect(node, 0) as con:
        pch = pub.channel()
        pch.confirm_delivery()
        assert holders(node, client_port(pub)) == {0}
        for i in range(300):  # each returns once confirmed: tags 1.. continue in worker 1
            pch.basic_publish("", queue, b"%d" % i, PERSISTENT)
        until(lambda: holders(node, client_port(pub)) == {1}, what="the move")  # it moved at its first publish
        cch = con.channel()
        cch.basic_qos(prefetch_count=50)
        bodies = []
        tags = []
        for method, _props, body in cch.consume(queue, inactivity_timeout=10):
            assert method is not None, f"only {len(bodies)} of 300 arrived"
            bodies.append(body)
            tags.append(method.delivery_tag)
            cch.basic_ack(method.delivery_tag)
            if len(bodies) == 300:
                break
        assert bodies == [b"%d" % i for i in range(300)]
        assert tags == list(range(1, 301))
        until(lambda: holders(node, client_port(con)) == {1}, what="the move")
        for i in range(300, 310):  # both connections keep working where they are now
            pch.basic_publish("", queue, b"%d" % i, PERSISTENT)
        more = [next(cch.consume(queue, inactivity_timeout=10)) for _ in range(10)]
        assert [b for _m, _p, b in more] == [b"%d" % i for i in range(300, 310)]
        cch.cancel()
        cch.queue_delete(queue)


def test_a_burst_moves_with_its_unread_frames_and_confirms_stay_numbered(node: ServerInfo) -> None:
    """aio-pika pipelines 1,000 confirmed publishes on two channels: most are read by worker 0 before the
    connection moves (they go along, unhandled) and every confirm must match its publish's tag."""
    queue = declare_in(node, 1, "burst")

    async def run() -> list[bytes]:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{own_port(node, 0)}/")
        async with conn:
            channels = [await conn.channel(publisher_confirms=True) for _ in range(2)]
            for ch in channels:  # a quiet channel of its own before the first publish
                await ch.set_qos(prefetch_count=7)
            results = await asyncio.gather(*(
                channels[i % 2].default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue)
                for i in range(1000)))
            assert len(results) == 1000
            ch = channels[0]
            q = await ch.get_queue(queue, ensure=True)
            got: list[bytes] = []
            async with q.iterator() as it:
                async for message in it:
                    got.append(message.body)
                    await message.ack()
                    if len(got) == 1000:
                        break
            await q.delete(if_unused=False, if_empty=False)
            return got

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert sorted(got, key=int) == [b"%d" % i for i in range(1000)] and len(set(got)) == 1000
    for parity in (0, 1):  # per channel, in publish order
        mine = [int(b) for b in got if int(b) % 2 == parity]
        assert mine == sorted(mine)


def test_delivery_tags_continue_after_a_move(node: ServerInfo) -> None:
    local = declare_in(node, 0, "tags-local")
    remote = declare_in(node, 1, "tags-remote")
    with connect(node, 1) as filler:  # a message in each queue, from the other worker's own port
        fch = filler.channel()
        fch.confirm_delivery()
        fch.basic_publish("", local, b"local")
    with connect(node, 0) as conn:
        ch = conn.channel()
        method, _props, body = until(lambda: (lambda r: r if r[0] is not None else None)(ch.basic_get(local)),
                                     what="a message")
        assert body == b"local" and method.delivery_tag == 1
        ch.basic_ack(method.delivery_tag)
        ch.confirm_delivery()
        ch.basic_publish("", remote, b"remote")  # moves the connection: channel 1 confirms its tag 1 there
        until(lambda: holders(node, client_port(conn)) == {1}, what="the move")
        method, _props, body = until(lambda: (lambda r: r if r[0] is not None else None)(ch.basic_get(remote)),
                                     what="a message")
        assert body == b"remote" and method.delivery_tag == 2  # the channel's tags went on from 1
        ch.basic_ack(method.delivery_tag)
        ch.queue_delete(local)
        ch.queue_delete(remote)


def test_a_connection_that_is_not_quiet_stays_and_works_over_the_hop(node: ServerInfo) -> None:
    local = declare_in(node, 0, "busy-local")
    remote = declare_in(node, 1, "busy-remote")
    with connect(node, 0) as conn:
        ch = conn.channel()
        ch.basic_consume(local, lambda *_a: None)  # a consumer here: not quiet
        pch = conn.channel()
        pch.confirm_delivery()
        for i in range(50):
            pch.basic_publish("", remote, b"%d" % i)
        assert holders(node, client_port(conn)) == {0}  # it stayed
        got = []
        for method, _props, body in pch.consume(remote, inactivity_timeout=10):
            assert method is not None
            got.append(body)
            pch.basic_ack(method.delivery_tag)
            if len(got) == 50:
                break
        assert got == [b"%d" % i for i in range(50)]
        pch.cancel()
        assert holders(node, client_port(conn)) == {0}
        pch.queue_delete(local)
        pch.queue_delete(remote)


def test_a_first_publish_through_an_exchange_to_one_other_workers_queue_moves(node: ServerInfo) -> None:
    """A direct, topic or fanout exchange's route decides where the first publish goes: every queue it
    reaches is in worker 1, so the connection moves there, as a default-exchange publish does."""
    remote = declare_in(node, 1, "routed")
    with connect(node, 0) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_bind(remote, "amq.topic", routing_key="routed.#")
        assert holders(node, client_port(conn)) == {0}
        ch.basic_publish("amq.topic", "routed.x", b"routed")  # returns once confirmed (from worker 1)
        until(lambda: holders(node, client_port(conn)) == {1}, what="the move")
        ch.basic_publish("amq.topic", "routed.y", b"again")
        assert ch.queue_declare(remote, passive=True).method.message_count == 2
        ch.queue_delete(remote)


def test_a_first_publish_to_queues_in_both_workers_or_through_headers_stays(node: ServerInfo) -> None:
    """A route that reaches queues in both workers (a fanout here) keeps the connection where it is (a
    move would save no hop); so does a headers exchange (its route needs the message's headers, not read
    when the publish is judged). Judged once: a later default-exchange publish does not move it."""
    local, remote = declare_in(node, 0, "fan-here"), declare_in(node, 1, "fan-there")
    with connect(node, 0) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("fan-both", "fanout", auto_delete=True)
        ch.queue_bind(local, "fan-both")
        ch.queue_bind(remote, "fan-both")
        ch.basic_publish("fan-both", "", b"both")
        ch.basic_publish("", remote, b"direct")
        assert holders(node, client_port(conn)) == {0}
        assert ch.queue_declare(local, passive=True).method.message_count == 1
        assert ch.queue_declare(remote, passive=True).method.message_count == 2
    with connect(node, 0) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_bind(remote, "amq.headers", arguments={"x-match": "any", "to": "there"})
        ch.basic_publish("amq.headers", "", b"by headers", pika.BasicProperties(headers={"to": "there"}))
        assert holders(node, client_port(conn)) == {0}
        assert ch.queue_declare(remote, passive=True).method.message_count == 3
        ch.queue_delete(local)
        ch.queue_delete(remote)


def test_the_management_api_lists_a_moved_connection_once(node: ServerInfo) -> None:
    queue = declare_in(node, 1, "listed")
    props = {"connection_name": "locality-listed"}
    with connect(node, 0, client_properties=props) as conn:
        conn.channel().basic_publish("", queue, b"x")
        until(lambda: holders(node, client_port(conn)) == {1}, what="the move")

        def listed() -> list[dict[str, Any]]:
            rows = Api(node.mgmt_url).get("/api/connections").body
            return [r for r in rows if r["client_properties"].get("connection_name") == "locality-listed"]
        rows = until(listed, what="the connection listed")
        assert len(rows) == 1 and rows[0]["peer_port"] == client_port(conn) and rows[0]["user"] == "guest"
        assert rows[0]["channels"] == 1
        conn.channel().queue_delete(queue)


def test_target_worker_killed_mid_handover_closes_the_connection(tmp_path: Path) -> None:
    """Worker 1 is stopped, so the connection worker 0 hands to it waits in its control socket; killed with
    -9 there, the connection must end (the client reconnects), never hang or stay half in worker 0."""
    info = start_server(tmp_path, "--workers", "2", config_text=CONFIG)
    try:
        queue = declare_in(info, 1, "killed")
        pid = worker_pid(info, 1)
        assert pid is not None
        conn = connect(info, 0)
        port = client_port(conn)
        ch = conn.channel()
        os.kill(pid, signal.SIGSTOP)
        try:
            ch.basic_publish("", queue, b"lost with the move")
            until(lambda: not holders(info, port), what="worker 0 to let the connection go")
        finally:
            os.kill(pid, signal.SIGKILL)  # a stopped process takes SIGKILL as it is
        until(lambda: connection_ended(conn), what="the client to see its connection end")
        until(lambda: not alive(pid), what="worker 1 gone")
        until(lambda: worker_pid(info, 1) not in (None, pid), what="worker 1 restarted")
        with connect(info, 0) as again:  # the node goes on: a new connection works
            ch = again.channel()
            ch.confirm_delivery()
            ch.queue_declare("after-the-kill")
            ch.basic_publish("", "after-the-kill", b"x")
            assert ch.queue_declare("after-the-kill", passive=True).method.message_count == 1
    finally:
        info.stop()


def test_a_moved_connection_counts_once_for_its_vhosts_limit(node: ServerInfo) -> None:
    api = Api(wait_mgmt(node, timeout=60).mgmt_url)
    add_vhost(api, "loc-lim")
    assert api.put("/api/vhost-limits/loc-lim/max-connections", {"value": 2}).status == 204
    params = {"virtual_host": "loc-lim"}
    with connect(node, 0, **params) as first:
        ch = first.channel()
        for i in range(8):  # a queue in worker 1 of this vhost
            name = f"loc-lim-{i}"
            ch.queue_declare(name)
            doc = api.get(f"/api/queues/loc-lim/{name}")
            if doc.body["worker"] == 1:
                break
        ch.confirm_delivery()
        ch.basic_publish("", name, b"x")
        until(lambda: holders(node, client_port(first)) == {1}, what="the move")
        with connect(node, 1, **params) as second:  # counted once: one place is left, and only one
            second.channel()
            for worker in (0, 1):
                assert "connection limit (2) is reached" in refused(node, worker, vhost="loc-lim")
        ch.queue_delete(name)
    with connect(node, 0, **params), connect(node, 1, **params):  # both places free again once it closed
        pass


# -- stream-protocol connections (rstream) --------------------------------------------------------------

STREAM_AUTH = {"username": "guest", "password": "guest"}
WAIT_S = 60.0


def own_stream_port(info: ServerInfo, worker: int) -> int:
    return int(info.ports[f"stream_w{worker}"])


def rstream_port(client: Any) -> int:
    """The local port of an rstream client's socket: it names the connection at the node."""
    return int(client._conn._writer.get_extra_info("sockname")[1])


async def until_async(cond: Any, what: str) -> None:
    """`until` for a coroutine's thread: the check runs off the loop, so the client keeps reading."""
    await asyncio.get_running_loop().run_in_executor(None, lambda: until(cond, timeout=WAIT_S, what=what))


def stream_in(info: ServerInfo, worker: int, name: str) -> str:
    async def run() -> None:
        async with Producer("127.0.0.1", port=own_stream_port(info, worker), **STREAM_AUTH) as p:
            await p.create_stream(name)
    asyncio.run(run())
    assert worker_of(info, name) == worker
    return name


def end_message(publishing_id: int) -> AMQPMessage:
    """The b"end" message of a publisher whose last publishing id was `publishing_id` - 1 (an id already
    seen would be deduplicated)."""
    msg = AMQPMessage(body=b"end")
    msg.publishing_id = publishing_id
    return msg


async def read_until_end(port: int, stream: str, offset: ConsumerOffsetSpecification,
                         ssl_context: ssl.SSLContext | None = None,
                         local_ports: list[int] | None = None) -> list[tuple[int, bytes]]:
    """(offset, body) of every message from `offset` up to the b"end" message (not included); the
    consumer's connection to the stream's reader is over TLS with `ssl_context`, and its local port is
    appended to `local_ports`."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
        if bytes(msg.body) == b"end":
            done.set()
        elif not done.is_set():
            got.append((ctx.offset, bytes(msg.body)))
    async with Consumer("127.0.0.1", port=port, ssl_context=ssl_context, **STREAM_AUTH) as c:
        await c.start()
        await c.subscribe(stream, on, decoder=amqp_decoder, offset_specification=offset)
        if local_ports is not None:
            local_ports.append(rstream_port(c._clients[stream]))
        await asyncio.wait_for(done.wait(), WAIT_S)
    return got


def test_stream_publisher_and_consumer_move_to_the_streams_home_nothing_lost_or_duplicated(node: ServerInfo) -> None:
    """rstream's publisher and consumer connect to worker 1; the stream's copy is worker 0's: each moves
    there at its first declare publisher / subscribe (the socket ends in worker 0), every message is read
    once, in order, from offset 0, a resend after the move is deduplicated, and a stored offset is there."""
    stream = stream_in(node, 0, "s-move")
    port = own_stream_port(node, 1)

    async def run() -> None:
        got: list[tuple[int, bytes]] = []
        enough = asyncio.Event()

        async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
            got.append((ctx.offset, bytes(msg.body)))
            if len(got) >= 300:
                enough.set()
        async with Producer("127.0.0.1", port=port, **STREAM_AUTH) as producer, \
                Consumer("127.0.0.1", port=port, **STREAM_AUTH) as consumer:
            await consumer.start()
            await consumer.subscribe(stream, on, decoder=amqp_decoder, subscriber_name="mover",
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            reading = consumer._clients[stream]
            await send_confirmed(producer, stream, range(200), "", "dedup-ref")
            writing = producer._clients[stream]
            await until_async(lambda: holders(node, rstream_port(writing)) == {0}, "the publisher's move")
            await until_async(lambda: holders(node, rstream_port(reading)) == {0}, "the consumer's move")
            await send_confirmed(producer, stream, range(150, 300), "", "dedup-ref")  # 150-199 again: deduplicated

            def listed() -> list[dict[str, Any]]:  # the moved connections, once each, with their publisher
                rows = Api(node.mgmt_url).get("/api/stream/connections").body
                return [r for r in rows if r["peer_port"] in (rstream_port(writing), rstream_port(reading))]
            rows = await asyncio.get_running_loop().run_in_executor(None, listed)
            assert sorted((r["peer_port"], r["publishers"], r["subscriptions"]) for r in rows) == \
                sorted([(rstream_port(writing), 1, 0), (rstream_port(reading), 0, 1)])
            await asyncio.wait_for(enough.wait(), WAIT_S)
            await consumer.store_offset(stream, "mover", 299)
            await until_async(lambda: asyncio.run(query_offset(port, stream, "mover")) == 299, "the stored offset")
            await producer.send_wait(stream, end_message(300))
        assert got[:300] == [(i, b"%d" % i) for i in range(300)]
        after = await read_until_end(own_stream_port(node, 0), stream,
                                     ConsumerOffsetSpecification(OffsetType.FIRST))
        assert after == [(i, b"%d" % i) for i in range(300)]  # nothing twice
    asyncio.run(run())


async def query_offset(port: int, stream: str, reference: str) -> int | None:
    async with Consumer("127.0.0.1", port=port, **STREAM_AUTH) as c:
        try:
            return await c.query_offset(stream, reference)
        except Exception:  # noqa: BLE001 - not stored (yet): rstream raises OffsetNotFound
            return None


def test_a_stream_connection_using_streams_of_both_workers_stays_and_uses_the_link(node: ServerInfo) -> None:
    """A connection whose first publisher is on a stream of its own worker is judged there and stays: its
    next publisher, on a stream of the other worker, goes over the worker link; both streams get theirs."""
    local = stream_in(node, 1, "s-here")
    far = stream_in(node, 0, "s-there")
    port = own_stream_port(node, 1)

    async def run() -> None:
        async with Producer("127.0.0.1", port=port, **STREAM_AUTH) as producer:
            await send_confirmed(producer, local, range(20), "", "here")
            client = producer._clients[local]
            await send_confirmed(producer, far, range(20), "", "there")
            assert producer._clients[far] is client  # (one connection for both: the same advertised port)
            assert holders(node, rstream_port(client)) == {1}
            for s in (local, far):
                await producer.send_wait(s, end_message(20))
        for s in (local, far):
            got = await read_until_end(port, s, ConsumerOffsetSpecification(OffsetType.FIRST))
            assert got == [(i, b"%d" % i) for i in range(20)]
    asyncio.run(run())
