"""A moved connection blocked by a resource alarm whose client has gone is cleaned up without waiting for
the alarm to clear, on both sides (runtime/workers/relay.py; Node.reap_blocked_connections).

A publisher pinned to worker 0 (its own port) publishes to a queue of worker 1: it moves there (a TLS one
is relayed: its TLS session stays in worker 0, the plaintext crosses a socket pair). Then the node's
memory alarm goes on (worker 1 filled past its watermark by messages held unacknowledged) and blocks it,
so worker 1 stops reading it. Then the client vanishes (its socket closed, no connection.close).

Measured before the fix (the alarm on all along): the relayed connection that had sent nothing more was
dropped after 56 s (a heartbeat's doing), one with a backlog of unread publishes was still there after
60 s; a plain moved one was dropped after 1 s (quiet, the reaper reads the TCP state) or 26 s (backlog:
its FIN waits behind the unread bytes in the client's kernel until a heartbeat draws a reset). After: 1 s
for both quiet ones; the backlog ones as the plain one, by the heartbeat (29 s with a 60 s heartbeat). A
TLS relayed quiet one runs in `make test`, the rest under `slow`. Waits poll with generous deadlines;
nothing here asserts a duration.
"""

from __future__ import annotations

import contextlib
import ssl
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pamqp import body as amqp_body
from pamqp import commands, frame, header
from tests.conftest import start_server
from tests.tls.conftest import MECHANISMS
from tests.tls.pki import make_pki
from tests.workers.test_locality import CONFIG, declare_in, own_port
from tests.workers.test_locality_tls import Node
from tests.workers.test_workers import client_port, holders, until

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.timeout(120)]


WATERMARK = 160 << 20  # each worker's memory high watermark: above an idle worker's resident set
# the publisher's heartbeat: a client gone with bytes the node never read has its FIN queued behind them in
# its kernel (the node's window is shut), so only the node's next heartbeat, answered by a reset, tells it
HEARTBEAT_S = 6


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A fresh node for each test: its memory alarm is raised by filling worker 1 and never cleared."""
    pki = make_pki(tmp_path / "pki")
    config = (CONFIG + pki.section("ssl_options.") + MECHANISMS + f"vm_memory_high_watermark.absolute = {WATERMARK}\n"
              "vm_memory_high_watermark_paging_ratio = 1.0\n")  # ready messages stay in memory: they fill it
    info = start_server(tmp_path, "--workers", "2", "--amqps-port", "0", config_text=config)
    yield Node(info, pki)
    info.stop()


@contextlib.contextmanager
def memory_alarm(node: Node) -> Iterator[None]:
    """The node's memory alarm, on while inside: 1 MiB messages published into a queue of worker 1 and
    held unacknowledged by a consumer there (unacknowledged messages are not paged out), until worker 1's
    resident set passes the watermark (the supervisor tells every worker). Both clients are pinned to
    worker 1 by its own port, so nothing of theirs moves."""
    queue = declare_in(node.info, 1, "filler")
    params = pika.ConnectionParameters("127.0.0.1", own_port(node.info, 1))
    filler, holder = pika.BlockingConnection(params), pika.BlockingConnection(params)
    try:
        hch = holder.channel()
        hch.basic_qos(prefetch_count=1000)
        hch.basic_consume(queue, lambda *_a: None)  # never acks
        ch = filler.channel()
        for i in range(4 * WATERMARK // (1 << 20)):
            if node.api.get("/api/health/checks/alarms").status != 200:
                break
            ch.basic_publish("", queue, bytes([i % 256]) * (1 << 20))  # (fits in the socket's buffers)
            holder.process_data_events(0.01)
        until(lambda: (holder.process_data_events(0.01), node.api.get("/api/health/checks/alarms").status)[1]
              != 200, what="the memory alarm")
        yield
    finally:
        for conn in (filler, holder):
            conn._impl._transport._sock.close()  # (the filler is blocked: no close handshake to wait for)


def blocked_publisher(node: Node, tls: bool, name: str, queue: str,
                      alarm: contextlib.ExitStack) -> pika.BlockingConnection:
    """A publisher pinned to worker 0 that moved to worker 1 at its first publish and is blocked there."""
    blocked: list[Any] = []
    kw: dict[str, Any] = {"client_properties": {"connection_name": name}, "heartbeat": HEARTBEAT_S}
    conn = node.connect(**kw) if tls else pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", own_port(node.info, 0), **kw))
    conn.add_on_connection_blocked_callback(lambda _c, m: blocked.append(m))
    ch = conn.channel()
    ch.basic_publish("", queue, b"before the alarm")  # it moves to the queue's worker
    assert node.served_in(conn) == 1
    alarm.enter_context(memory_alarm(node))
    until(lambda: (conn.process_data_events(0.05), blocked)[1], what="connection.blocked")
    ch.basic_publish("", queue, b"under the alarm")  # (it has published: blocked already)
    until(lambda: (node.row(name) or {}).get("state") == "blocked", what="the row blocked")
    return conn


def flood(conn: pika.BlockingConnection, nbytes: int) -> int:
    """Write up to `nbytes` of publishes on channel 1, which the blocked home will not read, until the
    socket takes no more: they fill the kernel buffers and (TLS) the relay's buffer towards the home."""
    body = b"b" * 65536
    publish = (frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
               + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
               + frame.marshal(amqp_body.ContentBody(body), 1))
    sock = conn._impl._transport._sock
    sock.settimeout(2.0)  # the socket takes no more for 2 s: everything on the way is full
    sent = 0
    try:
        while sent < nbytes:
            sock.sendall(publish)
            sent += len(publish)
    except (TimeoutError, ssl.SSLWantWriteError, BlockingIOError):
        pass
    return sent


@pytest.mark.parametrize(("tls", "backlog"), [
    (True, False),
    pytest.param(True, True, marks=pytest.mark.slow),  # each a node of 2 workers filled to its watermark
    pytest.param(False, False, marks=pytest.mark.slow),
    pytest.param(False, True, marks=pytest.mark.slow),
], ids=["tls-relayed-quiet", "tls-relayed-backlog", "plain-moved-quiet", "plain-moved-backlog"])
def test_a_blocked_moved_connection_whose_client_vanished_goes_away(node: Node, tls: bool, backlog: bool) -> None:
    queue = declare_in(node.info, 1, f"alarm-{'tls' if tls else 'plain'}")
    name = f"alarm-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as alarm:
        conn = blocked_publisher(node, tls, name, queue, alarm)
        port = client_port(conn)
        if backlog:
            assert flood(conn, 16 << 20) > 0
        conn._impl._transport._sock.close()  # the client vanishes: no connection.close, no close_notify
        until(lambda: node.row(name) is None, timeout=60, what="the home to drop the blocked connection")
        until(lambda: not holders(node.info, port), timeout=60, what="the client's socket closed in the node")
        assert node.api.get("/api/health/checks/alarms").status == 503  # all the while: the alarm did not clear
