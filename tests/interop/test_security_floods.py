"""Issue 21, items 4 and 5: a login flood and a burst of unfinished bodies, against a real node.

- A flood of wrong passwords from 10 source addresses (127.0.0.x on loopback, 8 threads each) must not
  refuse the first logins of valid users over AMQP and HTTP, right after a restart (nothing cached): the
  login gate queues per source and takes turns (runtime/broker/logins.py).
- Unfinished message bodies are capped node-wide, and the memory alarm measures what hutch holds, so it
  clears once the connections that held them close, and blocked publishers resume
  (runtime/broker/alarms.py).
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch.amqp import spec

from .helpers import RawClient, plain_response

FLOOD_SOURCES = [f"127.0.0.{i}" for i in range(11, 21)]
FLOOD_THREADS = 8
USERS = 10


class LoginFlood:
    """Wrong passwords over AMQP from each of `sources`, `threads` connections at a time per source."""

    def __init__(self, port: int, sources: list[str], threads: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.attempts = 0
        self.passwords = itertools.count()  # each attempt its own: the gate checks a repeated one once
        self.threads = [threading.Thread(target=self._run, args=(src,), daemon=True)
                        for src in sources for _ in range(threads)]

    def _run(self, source: str) -> None:
        while not self.stopping.is_set():
            try:
                with RawClient(self.port, timeout=10, source=source) as raw:
                    raw.send(spec.PROTOCOL_HEADER)
                    raw.expect(spec.Connection.Start, 0)
                    raw.send_method(0, spec.Connection.StartOk(
                        client_properties={"product": "flood"}, mechanism="PLAIN",
                        response=plain_response("guest", f"wrong-{next(self.passwords)}"), locale="en_US"))
                    raw.wait_closed(10)
            except (OSError, TimeoutError, Exception):  # refused or reset: try again
                pass
            self.attempts += 1

    def __enter__(self) -> LoginFlood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)


def _amqp_login(port: int, user: str, source: str) -> str:
    try:
        with RawClient(port, timeout=30, source=source) as raw:
            raw.handshake(user, "pw")
            return "ok"
    except Exception as exc:  # refused: the connection closed (403) or the socket timed out
        return f"refused: {exc!r}"


def _http_login(port: int, user: str, source: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        token = base64.b64encode(f"{user}:pw".encode()).decode()
        conn.request("GET", "/api/whoami", headers={"Authorization": f"Basic {token}"})
        reply = conn.getresponse()
        reply.read()
        return "ok" if reply.status == 200 else f"refused: {reply.status}"
    finally:
        conn.close()


def _api(port: int, method: str, path: str, body: dict[str, object]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        token = base64.b64encode(b"guest:guest").decode()
        conn.request(method, path, body=json.dumps(body),
                     headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


@pytest.fixture
def restarted_with_users(tmp_path: Path) -> Iterator[ServerInfo]:
    """A node with 2 x USERS management users (amqp-N, http-N), restarted so that no login is cached."""
    info = start_server(tmp_path)
    try:
        for kind in ("amqp", "http"):
            for n in range(USERS):
                assert _api(info.management_port, "PUT", f"/api/users/{kind}-{n}",
                            {"password": "pw", "tags": "management"}) in (201, 204)
                assert _api(info.management_port, "PUT", f"/api/permissions/%2F/{kind}-{n}",
                            {"configure": ".*", "write": ".*", "read": ".*"}) in (201, 204)
    finally:
        info.stop()
    info = start_server(tmp_path)
    try:
        yield info
    finally:
        info.stop()


def test_a_login_flood_from_ten_addresses_does_not_refuse_first_logins(restarted_with_users: ServerInfo) -> None:
    """Issue 21 item 4: 10 addresses x 8 threads of wrong passwords refused 10 of 10 first logins of valid
    users, over AMQP and HTTP (every uncached login past 64 pending was refused). Now the gate queues per
    source and takes turns: every first login gets through with the flood running (each from its own
    address, all at once, right after a restart: nothing cached). Measured: docs/security.md."""
    info = restarted_with_users
    results: dict[str, str] = {}

    def login(kind: str, n: int) -> None:
        source = f"127.0.0.{100 + n if kind == 'amqp' else 150 + n}"
        user = f"{kind}-{n}"
        results[user] = (_amqp_login(info.amqp_port, user, source) if kind == "amqp"
                         else _http_login(info.management_port, user, source))

    with LoginFlood(info.amqp_port, FLOOD_SOURCES, FLOOD_THREADS) as flood:
        while flood.attempts < 2 * len(flood.threads):  # the flood is at full strength
            threading.Event().wait(0.05)
        logins = [threading.Thread(target=login, args=(kind, n)) for kind in ("amqp", "http") for n in range(USERS)]
        for t in logins:
            t.start()
        for t in logins:
            t.join(120)
    refused = {user: r for user, r in results.items() if r != "ok"}
    assert len(results) == 2 * USERS and not refused, refused
    assert "too many logins pending" in info.log()  # the flood did reach the bounds


def _mem_alarm(info: ServerInfo) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", info.management_port, timeout=30)
    try:
        token = base64.b64encode(b"guest:guest").decode()
        conn.request("GET", "/api/nodes", headers={"Authorization": f"Basic {token}"})
        return bool(json.loads(conn.getresponse().read())[0]["mem_alarm"])
    finally:
        conn.close()


def _start_unfinished_bodies(port: int, user: str, channels: int, chunk: bytes, chunks: int) -> RawClient:
    """A connection whose `channels` channels each start a publish of a 16 MiB body and send only
    `chunks` frames of it (never the rest)."""
    raw = RawClient(port, timeout=30)
    raw.handshake(user, "pw")
    for ch in range(1, channels + 1):
        raw.open_channel(ch)
    for ch in range(1, channels + 1):
        raw.send_method(ch, spec.Basic.Publish(exchange="", routing_key="nowhere"))
        raw.send_frame(2, ch, struct.pack(">HHQH", 60, 0, 16 * 1024 * 1024, 0))
        for _ in range(chunks):
            raw.send_frame(3, ch, chunk)
    return raw


@pytest.fixture
def small_memory(tmp_path: Path) -> Iterator[ServerInfo]:
    """A node whose memory high watermark is 180 MB and whose unfinished bodies are capped at 150 MB."""
    info = start_server(tmp_path, config_text="vm_memory_high_watermark.absolute = 180MB\n"
                                              "max_unfinished_body_bytes_total = 150000000\n")
    try:
        assert _api(info.management_port, "PUT", "/api/users/reader", {"password": "pw", "tags": ""}) == 201
        assert _api(info.management_port, "PUT", "/api/permissions/%2F/reader",
                    {"configure": "^$", "write": "^$", "read": ".*"}) in (201, 204)
        yield info
    finally:
        info.stop()


def test_unfinished_bodies_are_capped_node_wide_and_the_memory_alarm_clears(small_memory: ServerInfo) -> None:
    """Issue 21 item 5: a burst of unfinished bodies from a read-only user took RSS from 77 to 440 MB; after
    every connection closed RSS stayed at 455 MB and the memory alarm was still set 7 minutes later,
    blocking every publisher. Now the bodies are capped node-wide (the connection past
    `max_unfinished_body_bytes_total` is closed with 506 RESOURCE_ERROR), and the alarm measures RSS after
    handing freed heap pages back (malloc_trim): it clears within seconds of the connections closing and
    a blocked publisher's confirm arrives."""
    info = small_memory
    chunk = b"x" * (128 * 1024 - 8)
    burst: list[RawClient] = []
    closed_by_cap = 0
    for _ in range(6):  # 6 connections x 4 channels x 15 MiB: 360 MiB asked for, 150 MB allowed
        try:
            raw = _start_unfinished_bodies(info.amqp_port, "reader", 4, chunk, 120)
        except Exception:  # the handshake raced the close of the connection over the cap
            closed_by_cap += 1
            continue
        burst.append(raw)
    assert _wait(lambda: _mem_alarm(info), 30), "the memory alarm was not raised"
    assert "max_unfinished_body_bytes_total" in info.log()
    publisher = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", info.amqp_port, blocked_connection_timeout=120))
    channel = publisher.channel()
    channel.confirm_delivery()
    channel.queue_declare("after-alarm")
    for raw in burst:
        raw.close()
    assert _wait(lambda: not _mem_alarm(info), 60), "the memory alarm did not clear"
    channel.basic_publish("", "after-alarm", b"resumed")  # waits for its confirm
    assert channel.queue_declare("after-alarm", passive=True).method.message_count == 1
    publisher.close()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()
