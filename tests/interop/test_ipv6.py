"""IPv6 (issue 16): every listener binds both address families by default, as RabbitMQ's
`listeners.tcp.default = 5672` does; an explicit address binds that address only; guest's loopback-only
rule accepts `::1`. Real clients (pika, aio-pika, requests) connect over `::1`."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aio_pika
import pika
import pytest
import requests

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .inproc import InProcNode


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


def _pika(host: str, port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1, socket_timeout=5))


# the default listeners are the run's shared node's (hutch_server: a node of the default config); each
# test's queue is its own (exclusive, server-named)
def test_default_listeners_take_ipv4_and_ipv6_clients(hutch_server: ServerInfo) -> None:
    info = hutch_server
    for host in ("127.0.0.1", "::1"):  # guest over ::1 passes the loopback rule
        conn = _pika(host, info.amqp_port)
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"over " + host.encode())
        assert ch.basic_get(q, auto_ack=True)[2] == b"over " + host.encode()
        conn.close()
    for host in ("127.0.0.1", "[::1]"):
        r = requests.get(f"http://{host}:{info.management_port}/api/overview", auth=("guest", "guest"),
                         timeout=10)
        assert r.status_code == 200
    listeners = {(x["protocol"], x["ip_address"]) for x in r.json()["listeners"]}
    assert ("amqp", "::") in listeners and ("http", "::") in listeners


def test_aio_pika_over_ipv6(hutch_server: ServerInfo) -> None:
    info = hutch_server

    async def run() -> bytes:
        conn = await aio_pika.connect(f"amqp://guest:guest@[::1]:{info.amqp_port}/", timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"v6"), routing_key=q.name)
            msg = await q.get(timeout=5)
            await msg.ack()
            return msg.body

    assert asyncio.run(run()) == b"v6"


def test_an_explicit_ipv4_address_binds_ipv4_only() -> None:
    with InProcNode(amqp_host="127.0.0.1", amqp_port=0) as n:
        _pika("127.0.0.1", n.amqp_port).close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _pika("::1", n.amqp_port)


def test_an_explicit_ipv6_address_binds_ipv6_only() -> None:
    with InProcNode(amqp_host="::1", amqp_port=0) as n:
        _pika("::1", n.amqp_port).close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _pika("127.0.0.1", n.amqp_port)


def test_port_zero_gives_both_families_the_same_port() -> None:
    with InProcNode(amqp_host="", amqp_port=0) as n:
        _pika("127.0.0.1", n.amqp_port).close()
        _pika("::1", n.amqp_port).close()


def test_cluster_of_one_listens_on_both_families(tmp_path: Path) -> None:
    info = start_server(tmp_path, "--cluster-port", "0", cluster=None)
    cluster_port = info.ports["cluster"]
    try:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.create_connection((host, cluster_port), timeout=5) as s:
                assert s.family == family
    finally:
        info.stop()
