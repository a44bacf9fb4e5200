"""Durable definitions survive a restart (graceful and kill -9); transient ones do not.

Users, vhosts and permissions are made through the management API (as hutchctl does); topology through
pika. Messages are not persisted yet (a later issue): only definitions are checked here.
"""

from __future__ import annotations

import base64
import json
import signal
import urllib.request
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server


def api(server: ServerInfo, method: str, path: str, body: dict | None = None) -> int:
    req = urllib.request.Request(server.mgmt_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def connect(server: ServerInfo, user: str = "guest", password: str = "guest", vhost: str = "/"):
    params = pika.ConnectionParameters(port=server.amqp_port, virtual_host=vhost,
                                       credentials=pika.PlainCredentials(user, password))
    return pika.BlockingConnection(params)


def exists(server: ServerInfo, kind: str, name: str) -> bool:
    conn = connect(server)
    ch = conn.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def make_definitions(server: ServerInfo) -> None:
    api(server, "PUT", "/api/vhosts/tenant", {})
    api(server, "PUT", "/api/users/alice", {"password": "s3cret", "tags": "management"})
    api(server, "PUT", "/api/permissions/tenant/alice", {"configure": "^alice\\.", "write": ".*", "read": ".*"})
    conn = connect(server)
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True, arguments={"alternate-exchange": "unrouted"})
    ch.exchange_declare("unrouted", "fanout", durable=True)
    ch.exchange_declare("scratch", "direct", durable=False)
    ch.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000, "x-note": b"\x00\x01"})
    ch.queue_declare("orders.lost", durable=True)
    ch.queue_declare("transient", durable=False)
    ch.queue_bind("orders.eu", "orders", "eu.#")
    ch.queue_bind("orders.lost", "unrouted", "")
    ch.queue_bind("transient", "orders", "#")
    ch.exchange_declare("audit", "fanout", durable=True)
    ch.exchange_bind("audit", "orders", "eu.*")
    ch.queue_declare("gone-later", durable=True)
    ch.queue_delete("gone-later")
    conn.close()


def check_definitions(server: ServerInfo) -> None:
    assert exists(server, "exchange", "orders")
    assert exists(server, "exchange", "audit")
    assert not exists(server, "exchange", "scratch")
    assert exists(server, "queue", "orders.eu")
    assert not exists(server, "queue", "transient")
    assert not exists(server, "queue", "gone-later")
    conn = connect(server)
    ch = conn.channel()
    # the x-arguments came back byte for byte: redeclaring with the same ones is equivalent
    ch.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000, "x-note": b"\x00\x01"})
    ch.confirm_delivery()
    ch.basic_publish("orders", "eu.fr", b"routed")
    ch.basic_publish("orders", "us.ny", b"alternate")
    assert ch.basic_get("orders.eu", auto_ack=True)[2] == b"routed"
    assert ch.basic_get("orders.lost", auto_ack=True)[2] == b"alternate"
    conn.close()
    # the user, the vhost and the permissions came back
    alice = connect(server, "alice", "s3cret", "tenant")
    ach = alice.channel()
    ach.queue_declare("alice.work", durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ach.queue_declare("bob.work")
    assert info.value.reply_code == 403
    alice.close()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_definitions_survive_restart(tmp_path: Path, how: int) -> None:
    server = start_server(tmp_path)
    try:
        make_definitions(server)
    finally:
        server.stop(how)
    again = start_server(tmp_path)
    try:
        check_definitions(again)
    finally:
        again.stop()
    # a third start replays the compacted snapshot
    third = start_server(tmp_path)
    try:
        check_definitions(third)
    finally:
        third.stop()


def test_deletions_survive_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        make_definitions(server)
        conn = connect(server)
        ch = conn.channel()
        ch.queue_delete("orders.eu")
        ch.exchange_delete("audit")
        conn.close()
        api(server, "DELETE", "/api/users/alice")
    finally:
        server.stop(signal.SIGKILL)
    again = start_server(tmp_path)
    try:
        assert not exists(again, "queue", "orders.eu")
        assert not exists(again, "exchange", "audit")
        assert exists(again, "exchange", "orders")
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(again, "alice", "s3cret", "tenant")
    finally:
        again.stop()
