"""Half-open TLS connections (issue 21, finding 2; docs/security.md, "TLS: what each listener enforces").

Before: the TLS listeners counted a connection only once its TLS handshake was done, and the handshake
could take the request timeout (60 s) on HTTPS, `handshake_timeout` (10 s) on AMQP over TLS: 400 sockets
that never send a ClientHello took all 256 descriptors of a node and AMQP logins, HTTP and HTTPS failed.
Now a TLS connection is counted at the accept (runtime/tls_accept.py): HTTPS within the management caps
(with 256 descriptors: 64 in all, 16 per source address), AMQP over TLS within its handshake slots (64,
16 per source), and the handshake has its own timeout (`ssl_handshake_timeout`, 5 s; 2 s here).

Measured here (node limited to 256 descriptors, 2-core machine shared with other work): of 300 + 300
half-open sockets from 127.0.0.2, 16 + 16 were held and the rest closed at once; meanwhile, from
127.0.0.1, a pika login on the AMQP port and one on AMQP over TLS, an HTTP GET and an HTTPS GET all
succeeded; every held one was closed 3.1 s after the flood began (2 s handshake timeout, plus the time to
open 600 sockets and log in); the stall probe (`StallProbe`: a passive queue.declare every 20 ms) saw
at most 4 ms. The old code held 233 of them and ran out of descriptors.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests
from tests.mgmt.helpers import connect, wait_mgmt
from tests.mgmt.sockets import NEEDS_ALIAS, OTHER_SOURCE, assert_kept_answering, closed_now, start_probe
from tests.tls.conftest import TlsNode, start_tls_node

FLOOD = 300  # per TLS listener
NODE_DESCRIPTORS = 256


@pytest.fixture
def small_node(tmp_path: Path) -> Iterator[TlsNode]:
    """A TLS node started with a soft limit of 256 descriptors (the child inherits it) and a 2 s TLS
    handshake timeout."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NODE_DESCRIPTORS, hard))
    try:
        node = start_tls_node(tmp_path, "ssl_handshake_timeout = 2000\n")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        wait_mgmt(node.info)
        yield node
    finally:
        node.info.stop()


@NEEDS_ALIAS
def test_half_open_tls_connections_are_counted_and_timed_out(small_node: TlsNode):
    info = small_node.info
    probe = start_probe(info.amqp_port)
    flood: list[socket.socket] = []
    try:
        opened = time.monotonic()
        for port in (small_node.https_port, small_node.amqps_port):
            for _ in range(FLOOD):
                try:
                    flood.append(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                          source_address=(OTHER_SOURCE, 0)))
                except OSError:  # the old code: the node ran out of descriptors and stopped accepting
                    break
        time.sleep(0.5)
        held = [s for s in flood if not closed_now(s)]
        assert len(held) <= 2 * 16 + 4, f"{len(held)} half-open TLS sockets still open"
        conn = connect(info.amqp_port)  # a legitimate AMQP login
        assert conn.channel().is_open
        conn.close()
        assert requests.get(info.mgmt_url + "/api/overview", auth=("guest", "guest"), timeout=10).status_code == 200
        assert requests.get(small_node.https_url + "/api/overview", auth=("guest", "guest"), timeout=10,
                            verify=str(small_node.pki.cacertfile)).status_code == 200
        tls = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", small_node.amqps_port, connection_attempts=1, socket_timeout=10,
            ssl_options=pika.SSLOptions(small_node.pki.client_context(), "localhost")))
        assert tls.channel().is_open
        tls.close()
        deadline = opened + 20
        while time.monotonic() < deadline and not all(closed_now(s) for s in held):
            time.sleep(0.1)
        closed_after_s = time.monotonic() - opened
        assert all(closed_now(s) for s in held), "half-open TLS sockets outlived the handshake timeout"
    finally:
        for s in flood:
            s.close()
        probe.stop()
    print(f"{len(flood)} opened, {len(held)} held, closed after {closed_after_s:.1f} s; longest AMQP round trip "
          f"{probe.longest_s * 1000:.0f} ms")
    assert_kept_answering(probe)


def test_the_handshake_timeout_is_ssl_handshake_timeout(small_node: TlsNode):
    """A socket that sends half a ClientHello is closed after `ssl_handshake_timeout` (2 s here), not
    after the request timeout or `handshake_timeout`."""
    for port in (small_node.https_port, small_node.amqps_port):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a TLS record, never finished
        started = time.monotonic()
        s.settimeout(15)
        try:
            s.recv(1)
        except OSError:
            pass
        took = time.monotonic() - started
        s.close()
        assert 1.0 < took < 10.0, took
