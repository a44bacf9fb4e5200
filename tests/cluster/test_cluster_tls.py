"""Inter-node TLS (`cluster.ssl.*`) on a real 3-node cluster, a node whose certificate comes from another
CA, and the cluster port's handshake limits against silent sockets (issue 15, finding 8)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import pika
import pytest
from tests.cluster.nodes import FAST, Cluster
from tests.tls.pki import make_pki

pytestmark = pytest.mark.timeout(150)
QQ = {"x-queue-type": "quorum"}


def test_three_nodes_over_tls_and_a_node_from_another_ca_cannot_join(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = FAST + pki.section("cluster.ssl.")
    cluster = Cluster(tmp_path)
    try:
        n1, n2, n3 = (cluster.add(config_text=tls) for _ in range(3))
        cluster.wait_running({"n1", "n2", "n3"})
        assert f"listening for inter-node connections on :::{n1.cluster_port} (TLS)" in n1.log()
        presented = ssl.get_server_certificate(("127.0.0.1", n1.cluster_port))  # the port speaks TLS
        assert ssl.PEM_cert_to_DER_cert(presented) == ssl.PEM_cert_to_DER_cert(pki.certfile.read_text())

        with pika.BlockingConnection(pika.URLParameters(n2.url)) as conn:  # declared and published on n2
            ch = conn.channel()
            ch.queue_declare("tls-qq", durable=True, arguments=QQ)
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish("", "tls-qq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        with pika.BlockingConnection(pika.URLParameters(n3.url)) as conn:  # consumed on n3
            ch = conn.channel()
            got = []
            for _ in range(20):
                method, _, body = ch.basic_get("tls-qq")
                assert method is not None
                got.append(body)
                ch.basic_ack(method.delivery_tag)
            assert got == [f"m{i}".encode() for i in range(20)]
        code, queue = n1.api("GET", "/api/queues/%2F/tls-qq")
        assert code == 200 and queue["type"] == "quorum" and len(queue["members"]) == 3

        other = make_pki(tmp_path / "other", "other")
        stranger = cluster.add(start=False, config_text=FAST + other.section("cluster.ssl."))
        stranger.start(wait=False)
        deadline = time.monotonic() + 60  # a generous bound: the loop ends as soon as the line is there
        while time.monotonic() < deadline and "TLS handshake with node" not in stranger.log():
            time.sleep(0.2)
        assert "TLS handshake with node 'n1@localhost'" in stranger.log() and \
            "CERTIFICATE_VERIFY_FAILED" in stranger.log(), stranger.log()
        assert {m.split("@")[0] for m in cluster.status(n1)["running_nodes"]} == {"n1", "n2", "n3"}
        assert all(m["name"] != stranger.full_name for m in cluster.status(n1)["members"])
        assert not stranger.reported_ports()  # it never got far enough to open its listeners
    finally:
        cluster.stop()


class SilentFlood:
    """Keeps `count` silent sockets open to a port: any that the node closes is opened again at once
    (every 20 ms), as the finding's attacker refreshed its sockets."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.socks: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", self.port), timeout=1)
        except OSError:
            return None

    def _run(self) -> None:
        while not self.stopping.is_set():
            alive = []
            for s in self.socks:
                s.setblocking(False)
                try:
                    closed = s.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    s.close()
                else:
                    alive.append(s)
            while len(alive) < self.count and not self.stopping.is_set():
                s = self._open()
                if s is None:
                    break
                alive.append(s)
            self.socks = alive
            self.stopping.wait(0.02)

    def __enter__(self) -> SilentFlood:
        for _ in range(self.count):
            s = self._open()
            if s is not None:
                self.socks.append(s)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


def test_silent_sockets_on_the_cluster_port_do_not_keep_a_node_from_joining(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        n1 = cluster.add()
        with SilentFlood(n1.cluster_port, 160):
            time.sleep(0.5)
            cluster.add()  # n2 joins through n1 while the flood goes on
            cluster.wait_running({"n1", "n2"}, timeout=15)
        assert "in their handshake" in n1.log()
    finally:
        cluster.stop()


def test_half_open_tls_sockets_on_the_cluster_port_count_from_the_accept(tmp_path: Path) -> None:
    """Issue 21, finding 2: with `cluster.ssl.*` a socket that never sends a ClientHello used to wait
    outside the handshake table until the TLS handshake timed out, so 100 of them held 100 descriptors.
    Now each joins the table at the accept: at most 16 per source address stay (measured: 16 of 100),
    the rest are evicted at once, the kept ones close after the peer timeout, and a node still joins."""
    pki = make_pki(tmp_path / "pki")
    tls = FAST + pki.section("cluster.ssl.")
    cluster = Cluster(tmp_path)
    try:
        n1 = cluster.add(config_text=tls)
        socks = [socket.create_connection(("127.0.0.1", n1.cluster_port), timeout=5) for _ in range(100)]
        time.sleep(0.5)
        open_now = []
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) != b"":
                    open_now.append(s)
            except BlockingIOError:
                open_now.append(s)
            except OSError:
                pass
        assert len(open_now) <= 16 + 2, f"{len(open_now)} half-open TLS sockets held by the cluster port"
        assert "in their handshake" in n1.log()
        cluster.add(config_text=tls)
        cluster.wait_running({"n1", "n2"}, timeout=20)
        for s in socks:
            s.close()
    finally:
        cluster.stop()
