"""Connection locality for TLS connections in a node of 2 workers (runtime/workers/relay.py): a TLS
connection whose first publish or consume uses a queue of the other worker is served there, its TLS
session staying in the worker that accepted it, which relays the plaintext over a socket pair.

Connections are pinned to worker 0 by its own TLS port (`workers.own_ports`: `amqps_w0` in the worker's
own ports file); every queue used is homed in worker 1. Where a connection is served is what a client can
observe: an exclusive queue lives in its connection's worker (`worker` of the queue in the management
API). The client's TCP socket stays in worker 0 (read from /proc). Waits poll with generous deadlines;
nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
)
from tests.conftest import ServerInfo, start_server
from tests.mgmt.helpers import Api, run_ctl, wait_mgmt
from tests.tls.conftest import MECHANISMS
from tests.tls.pki import Pki, make_pki
from tests.tls.test_amqps import TLS_COLUMNS
from tests.workers.test_locality import (
    CONFIG,
    STREAM_AUTH,
    connection_ended,
    declare_in,
    end_message,
    read_until_end,
    rstream_port,
    stream_in,
    until_async,
)
from tests.workers.test_worker_limits import add_vhost, refused
from tests.workers.test_workers import client_port, holders, until, worker_of, worker_pid
from tests.workers.test_workers_streams import send_confirmed

from hutch import portfile
from hutch.core.tls_names import tls_fields

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.timeout(120)]


class Node:
    def __init__(self, info: ServerInfo, pki: Pki) -> None:
        self.info, self.pki = info, pki
        doc = portfile.read(info.data_dir / "w0")  # the management port is worker 0's: new if it restarted
        assert doc is not None
        info.management_port = int(doc["listeners"]["management"])
        self.api = Api(wait_mgmt(info, timeout=60).mgmt_url)

    def tls_port(self, worker: int) -> int:
        doc = portfile.read(self.info.data_dir)  # the node's ports file lists every worker's own TLS port
        assert doc is not None
        return int(doc["listeners"][f"amqps_w{worker}"])

    def connect(self, worker: int = 0, cert: tuple[Path, Path] | None = None, **kw: Any) -> pika.BlockingConnection:
        ctx = self.pki.client_context(cert)
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.tls_port(worker), ssl_options=pika.SSLOptions(ctx, "localhost"),
            connection_attempts=1, **kw))

    def row(self, name: str) -> dict[str, Any] | None:
        rows = [c for c in self.api.get("/api/connections").body if c.get("user_provided_name") == name]
        assert len(rows) <= 1, rows  # listed once: the relaying worker does not list it
        return rows[0] if rows else None

    def served_in(self, conn: pika.BlockingConnection) -> int:
        """The worker serving `conn`: where an exclusive queue it declares lives."""
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        try:
            return worker_of(self.info, queue)
        finally:
            ch.queue_delete(queue)
            ch.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("locality-tls")
    pki = make_pki(tmp / "pki")
    # debug: a stream connection's move is told in the log (where it is served is not otherwise visible)
    config = CONFIG + pki.section("ssl_options.") + MECHANISMS + "stream.listeners.ssl.default = 0\n" \
        "log.console.level = debug\n"
    info = start_server(tmp, "--workers", "2", "--amqps-port", "0", "--stream-port", "0", config_text=config)
    yield Node(info, pki)
    info.stop()


def consume(ch: Any, queue: str, count: int) -> list[tuple[int, bytes]]:
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=15):
        assert method is not None, f"only {len(got)} of {count} arrived"
        got.append((method.delivery_tag, body))
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    return got


def test_tls_publisher_and_consumer_are_served_by_their_queues_worker_through_the_relay(node: Node) -> None:
    queue = declare_in(node.info, 1, "tls-move")
    name = f"tls-pub-{uuid.uuid4().hex[:6]}"
    with node.connect(client_properties={"connection_name": name}) as pub, node.connect() as con:
        pch = pub.channel()
        pch.confirm_delivery()
        for i in range(300):  # each returns once confirmed: the confirms continue through the relay
            pch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        assert node.served_in(pub) == 1  # moved at its first publish
        assert holders(node.info, client_port(pub)) == {0}  # the TLS session (and TCP socket) stayed
        cch = con.channel()
        cch.basic_qos(prefetch_count=50)
        got = consume(cch, queue, 300)
        assert [b for _t, b in got] == [b"%d" % i for i in range(300)]
        assert [t for t, _b in got] == list(range(1, 301))
        assert node.served_in(con) == 1
        row = node.row(name)
        assert row is not None and row["ssl"] is True and row["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert row["ssl_cipher"] and row["peer_port"] == client_port(pub) and row["peer_host"] == "127.0.0.1"
        assert row["port"] == node.tls_port(0)  # the address the client reached, not the socket pair's
        pch.queue_delete(queue)


def test_a_relayed_connection_keeps_its_certificate_identity_and_external_login(node: Node) -> None:
    cn = f"ext-{uuid.uuid4().hex[:8]}"
    user = f"CN={cn},OU=tls,O=hutch tests"
    assert node.api.put(f"/api/users/{quote(user, safe='')}", {"password_hash": "", "tags": ""}).status in (201, 204)
    assert node.api.put(f"/api/permissions/%2F/{quote(user, safe='')}",
                        {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    queue = declare_in(node.info, 1, "tls-ext")
    with node.connect(cert=node.pki.issue(cn), credentials=pika.credentials.ExternalCredentials(),
                      client_properties={"connection_name": cn}) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"x", pika.BasicProperties(user_id=user))  # user-id must be the login
        assert node.served_in(conn) == 1
        assert ch.basic_get(queue, auto_ack=True)[2] == b"x"
        row = until(lambda: node.row(cn), what="the connection's row")
        assert (row["user"], row["auth_mechanism"], row["ssl"]) == (user, "EXTERNAL", True)
        assert row["peer_cert_subject"] == user and row["peer_cert_issuer"] and row["peer_cert_validity"]
        ch.queue_delete(queue)


def test_a_large_message_goes_through_the_relay_both_ways(node: Node) -> None:
    queue = declare_in(node.info, 1, "tls-large")
    body = bytes(range(256)) * (12 << 12)  # 12 MiB: more than every buffer on the way
    with node.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, body)
        assert node.served_in(conn) == 1
        got = consume(ch, queue, 1)
        assert got[0][1] == body
        ch.queue_delete(queue)


def test_the_client_closing_ends_the_connection_in_its_home(node: Node) -> None:
    queue = declare_in(node.info, 1, "tls-bye")
    name = f"tls-bye-{uuid.uuid4().hex[:6]}"
    conn = node.connect(client_properties={"connection_name": name})
    ch = conn.channel()
    ch.basic_consume(queue, lambda *_a: None)
    assert node.served_in(conn) == 1
    until(lambda: node.row(name), what="the connection listed")
    port = client_port(conn)
    conn._impl._transport._sock.close()  # the client vanishes without connection.close (nor close_notify)
    until(lambda: node.row(name) is None, what="the home to forget the connection")
    until(lambda: not holders(node.info, port), what="worker 0 to close the TLS socket")
    with node.connect() as other:
        doc = until(lambda: (lambda d: d if d.get("consumers") == 0 else None)(
            node.api.get(f"/api/queues/%2F/{queue}").body), what="the consumer gone")
        assert doc["consumers"] == 0
        other.channel().queue_delete(queue)


def test_the_home_closing_the_connection_closes_the_tls_session(node: Node) -> None:
    queue = declare_in(node.info, 1, "tls-kick")
    name = f"tls-kick-{uuid.uuid4().hex[:6]}"
    conn = node.connect(client_properties={"connection_name": name})
    ch = conn.channel()
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(queue, lambda *_a: None, exclusive=True)
    assert node.served_in(conn) == 1
    with node.connect(worker=1) as admin:  # the queue deleted under its exclusive consumer: basic.cancel
        admin.channel().queue_delete(queue)
    until(lambda: (conn.process_data_events(0.05), cancelled)[1], what="the consumer's cancel")
    row = until(lambda: node.row(name), what="the connection's row")
    port = client_port(conn)
    assert node.api.delete(f"/api/connections/{quote(row['name'], safe='')}").status == 204
    with pytest.raises(ConnectionClosedByBroker) as info:
        until(lambda: conn.process_data_events(0.1), timeout=30, what="the close")
    assert info.value.reply_code == 320
    until(lambda: not holders(node.info, port), what="worker 0 to close the TLS socket")
    until(lambda: node.row(name) is None, what="the connection gone")


def test_a_relayed_connection_counts_once_for_its_vhosts_limit_and_hutchctl_lists_its_tls(node: Node) -> None:
    add_vhost(node.api, "tls-lim")
    assert node.api.put("/api/vhost-limits/tls-lim/max-connections", {"value": 2}).status == 204
    with node.connect(virtual_host="tls-lim", client_properties={"connection_name": "tls-lim-1"}) as first:
        ch = first.channel()
        for i in range(8):  # a queue in worker 1 of this vhost
            name = f"tls-lim-{i}"
            ch.queue_declare(name)
            if node.api.get(f"/api/queues/tls-lim/{name}").body["worker"] == 1:
                break
        ch.confirm_delivery()
        ch.basic_publish("", name, b"x")  # relayed to worker 1 now
        mine = ch.queue_declare("", exclusive=True).method.queue
        assert node.api.get(f"/api/queues/tls-lim/{mine}").body["worker"] == 1
        with node.connect(worker=1, virtual_host="tls-lim"):  # counted once: one place is left, and only one
            for worker in (0, 1):
                assert "connection limit (2) is reached" in refused(node.info, worker, vhost="tls-lim")
        listed = run_ctl(node.info, "list_connections", "-p", "tls-lim", "--formatter", "json", "client_properties",
                         "peer_port", "ssl", "port")
        assert listed.returncode == 0, listed.stderr
        rows = [r for r in json.loads(listed.stdout)
                if (r.get("client_properties") or {}).get("connection_name") == "tls-lim-1"]
        assert len(rows) == 1 and rows[0]["ssl"] is True and rows[0]["peer_port"] == client_port(first), rows
        assert rows[0]["port"] == node.tls_port(0)  # the port the client reached, not the socket pair's
        ch.queue_delete(name)


def _ctl_tls_row(node: Node, name: str) -> dict[str, Any]:
    listed = run_ctl(node.info, "list_connections", "--formatter", "json", "user_provided_name", *TLS_COLUMNS)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in json.loads(listed.stdout) if r["user_provided_name"] == name]
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("with_cert", [True, False], ids=["client-cert", "no-cert"])
def test_hutchctl_shows_the_same_tls_columns_before_and_after_the_relay(node: Node, with_cert: bool) -> None:
    """rabbitmqctl's TLS columns of a connection served in the worker holding its TLS session, then in the
    worker it was relayed to: the same values, the suite the client negotiated."""
    queue = declare_in(node.info, 1, "tls-cols")
    name = f"tls-cols-{uuid.uuid4().hex[:6]}"
    cert = node.pki.issue(name) if with_cert else None
    with node.connect(cert=cert, client_properties={"connection_name": name}) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        here = until(lambda: node.row(name), what="the connection listed")
        assert here["node"] and node.served_in(conn) == 0
        before = _ctl_tls_row(node, name)
        ch.basic_publish("", queue, b"x")  # the first publish moves it to worker 1
        assert node.served_in(conn) == 1
        after = _ctl_tls_row(node, name)
        assert after == before
        sock = conn._impl._transport._sock  # pika's SSLSocket: what the client negotiated
        assert {k: after[k] for k in TLS_COLUMNS[:5]} == tls_fields((sock.version(), sock.cipher()[0]))
        if with_cert:
            assert after["peer_cert_subject"] == f"CN={name},OU=tls,O=hutch tests" and after["peer_cert_validity"]
        else:
            assert (after["peer_cert_subject"], after["peer_cert_issuer"], after["peer_cert_validity"]) == (None,) * 3
        ch.queue_delete(queue)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_slow_tls_consumer_pauses_its_home_and_the_relay_stays_bounded(node: Node) -> None:
    """A consumer that does not read its socket: the relay stops reading the pair, the home's transport
    fills and its paused-consumer path holds the rest in the queue; worker 0 (the relay) does not grow by
    what is held back. Then the consumer reads, and gets every message in order."""
    queue = declare_in(node.info, 1, "tls-slow")
    body = b"s" * (64 << 10)
    count = 640  # 40 MiB
    relay_pid = worker_pid(node.info, 0)
    assert relay_pid is not None
    with node.connect() as con:
        cch = con.channel()
        got: list[bytes] = []
        cch.basic_consume(queue, lambda ch, m, _p, b: (got.append(b), ch.basic_ack(m.delivery_tag)))
        assert node.served_in(con) == 1
        before = _rss_kib(relay_pid)
        with node.connect(worker=1) as pub:  # worker 1's own TLS port: it is not relayed
            pch = pub.channel()
            pch.confirm_delivery()
            for _ in range(count):
                pch.basic_publish("", queue, body)
        # the consumer has not read: what the home could not write stays in the queue
        doc = until(lambda: (lambda d: d if d.get("messages_ready", 0) > 0 and d.get(
            "messages_unacknowledged", 0) > 0 else None)(node.api.get(f"/api/queues/%2F/{queue}").body),
            what="the home to pause delivering")
        assert doc["messages_ready"] + doc["messages_unacknowledged"] == count
        assert doc["messages_unacknowledged"] < count
        assert _rss_kib(relay_pid) - before < 24 << 10  # the relay holds a bounded share of 40 MiB
        until(lambda: (con.process_data_events(0.1), len(got) == count)[1], timeout=60, what="every message")
        assert all(b == body for b in got)
        cch.queue_delete(queue)


def test_a_tls_connection_whose_first_queue_is_in_its_own_worker_stays_unrelayed(node: Node) -> None:
    """A TLS connection that uses a queue of its own worker first stays, unrelayed (as a plain one)."""
    queue = declare_in(node.info, 0, "tls-here")
    with node.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"here")
        assert node.served_in(conn) == 0
        assert ch.basic_get(queue, auto_ack=True)[2] == b"here"
        ch.queue_delete(queue)



@pytest.mark.slow  # two kill -9 and restarts: ~10 s
def test_a_worker_killed_ends_its_relayed_connections_on_both_sides(tmp_path: Path) -> None:
    """kill -9 of the home ends the client's connection (the relay sees its pair close and closes the TLS
    session); kill -9 of the relaying worker ends it in the home (the pair's end of file)."""
    pki = make_pki(tmp_path / "pki")
    info = start_server(tmp_path, "--workers", "2", "--amqps-port", "0",
                        config_text=CONFIG + pki.section("ssl_options.") + MECHANISMS)
    try:
        for victim in (1, 0):
            _kill_with_a_relayed_connection(info, pki, victim)
    finally:
        info.stop()


def _kill_with_a_relayed_connection(info: ServerInfo, pki: Pki, victim: int) -> None:
    node = Node(info, pki)
    queue = declare_in(info, 1, f"tls-kill{victim}")
    name = f"tls-kill-{victim}"
    conn = node.connect(client_properties={"connection_name": name})
    conn.channel().basic_consume(queue, lambda *_a: None)
    assert node.served_in(conn) == 1
    port = client_port(conn)
    pid = worker_pid(info, victim)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    until(lambda: connection_ended(conn), what="the client to see its connection end")
    until(lambda: not holders(info, port), what="the TLS socket closed")
    until(lambda: worker_pid(info, victim) not in (None, pid), what="the worker restarted")
    after = Node(info, pki)  # (worker 0 serves the management API)
    until(lambda: _row_or_none(after, name) is None, what="the home to forget the connection")


def _row_or_none(node: Node, name: str) -> dict[str, Any] | None:
    try:
        return node.row(name)
    except OSError:  # the management listener restarting with worker 0
        return {"restarting": True}


# -- stream-protocol connections over TLS (rstream) ----------------------------------------------------------


def test_tls_stream_publisher_and_consumer_are_relayed_to_the_streams_home(node: Node) -> None:
    """rstream over TLS on worker 1's own TLS port, the stream's copy in worker 0: both connections are
    served by worker 0 through worker 1's relay (the TCP sockets stay in worker 1); every message is read
    once, in order."""
    stream = stream_in(node.info, 0, f"tls-s-{uuid.uuid4().hex[:6]}")
    doc = portfile.read(node.info.data_dir)  # the node's ports file (the supervisor's)
    assert doc is not None
    port = int(doc["listeners"]["stream_tls_w1"])
    ctx = node.pki.client_context()

    async def run() -> None:
        async with Producer("127.0.0.1", port=port, ssl_context=ctx, **STREAM_AUTH) as producer:
            await send_confirmed(producer, stream, range(200), "", "tls-ref")
            await producer.send_wait(stream, end_message(200))
            writer = rstream_port(producer._clients[stream])
            assert holders(node.info, writer) == {1}  # the TLS session stayed in worker 1
        reader: list[int] = []
        got = await read_until_end(port, stream, ConsumerOffsetSpecification(OffsetType.FIRST), ctx, reader)
        assert got == [(i, b"%d" % i) for i in range(200)]  # every message once, in order
        for peer in (writer, *reader):  # both were served by worker 0 through worker 1's relay
            await until_async(lambda p=peer: f":{p} -> " in _moved_lines(node.info), "the relayed move")
        await until_async(lambda: not [r for r in node.api.get("/api/stream/connections").body
                                       if r["peer_port"] in (writer, *reader)], "the home to forget them (closed)")
    asyncio.run(run())


def test_a_relayed_stream_connection_shows_its_tls_and_peer(node: Node) -> None:
    stream = stream_in(node.info, 0, f"tls-s-{uuid.uuid4().hex[:6]}")
    doc = portfile.read(node.info.data_dir)  # the node's ports file (the supervisor's)
    assert doc is not None
    port = int(doc["listeners"]["stream_tls_w1"])

    async def run() -> None:
        async with Producer("127.0.0.1", port=port, ssl_context=node.pki.client_context(), **STREAM_AUTH) as p:
            await p.send_wait(stream, AMQPMessage(body=b"x"))
            peer = rstream_port(p._clients[stream])
            await until_async(lambda: f":{peer} -> " in _moved_lines(node.info), "the relayed move")
            rows = await asyncio.get_running_loop().run_in_executor(None, lambda: [
                r for r in node.api.get("/api/stream/connections").body if r["peer_port"] == peer])
            assert len(rows) == 1 and rows[0]["ssl"] is True and rows[0]["port"] == port, rows
            assert rows[0]["publishers"] == 1
    asyncio.run(run())


def _moved_lines(info: ServerInfo) -> str:
    return "\n".join(line for line in info.log().splitlines() if "moved to worker 0" in line and "relayed" in line)
