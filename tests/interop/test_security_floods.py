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
WAVE = 2  # first logins at once (the pool checks ~5 a second on a loaded 2-core machine)


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
    source, takes turns, and serves sources without refused logins first: every first login gets through
    with the flood running (each from its own address, 2 at a time, right after a restart: nothing
    cached). Measured: docs/security.md."""
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
        everyone = [(kind, n) for n in range(USERS) for kind in ("amqp", "http")]
        for wave in range(0, len(everyone), WAVE):  # a few at a time, as applications reconnect
            logins = [threading.Thread(target=login, args=who) for who in everyone[wave:wave + WAVE]]
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


def _start_unfinished_bodies(raw: RawClient, user: str, channels: int, chunk: bytes, chunks: int) -> None:
    """On `raw`, `channels` channels each start a publish of a 16 MiB body and send only `chunks` frames
    of it (never the rest). Raises once the node closes the connection or stops reading it (an alarm)."""
    raw.handshake(user, "pw")
    for ch in range(1, channels + 1):
        raw.open_channel(ch)
    for ch in range(1, channels + 1):
        raw.send_method(ch, spec.Basic.Publish(exchange="", routing_key="nowhere"))
        raw.send_frame(2, ch, struct.pack(">HHQH", 60, 0, 16 * 1024 * 1024, 0))
        for _ in range(chunks):
            raw.send_frame(3, ch, chunk)


def _node(tmp_path: Path, watermark: str) -> ServerInfo:
    """A node with the given memory high watermark, unfinished bodies capped at 150 MB node-wide, and a
    user with read-only access to "/"."""
    info = start_server(tmp_path, config_text=f"vm_memory_high_watermark.absolute = {watermark}\n"
                                              "max_unfinished_body_bytes_total = 150000000\n")
    assert _api(info.management_port, "PUT", "/api/users/reader", {"password": "pw", "tags": ""}) == 201
    assert _api(info.management_port, "PUT", "/api/permissions/%2F/reader",
                {"configure": "^$", "write": "^$", "read": ".*"}) in (201, 204)
    return info


def _burst(info: ServerInfo) -> list[RawClient]:
    """6 connections x 4 channels x 15 MiB of unfinished bodies from the read-only user: 360 MiB asked for."""
    chunk = b"x" * (128 * 1024 - 8)
    burst: list[RawClient] = []
    for _ in range(6):
        raw = RawClient(info.amqp_port, timeout=5)
        burst.append(raw)
        try:
            _start_unfinished_bodies(raw, "reader", 4, chunk, 120)
        except Exception:  # closed over the cap (506), or no longer read (the alarm blocked it)
            pass
    return burst


def test_unfinished_bodies_are_capped_node_wide(tmp_path: Path) -> None:
    """Issue 21 item 5: unfinished bodies were capped per connection only (4 x max_message_size), so a
    burst of connections from a read-only user took RSS from 77 to 440 MB in a second. Now the connection
    past `max_unfinished_body_bytes_total` (150 MB here) is closed with 506 RESOURCE_ERROR."""
    info = _node(tmp_path, "4GB")  # no alarm: the cap alone
    try:
        burst = _burst(info)
        assert _wait(lambda: "max_unfinished_body_bytes_total" in info.log(), 30), info.log()[-2000:]
        assert "506 unfinished message bodies on this node hold" in info.log()
        for raw in burst:
            raw.close()
    finally:
        info.stop()


def test_the_memory_alarm_clears_once_the_bodies_are_gone(tmp_path: Path) -> None:
    """Issue 21 item 5: after every connection of the burst closed, RSS stayed at 455 MB and the memory
    alarm was still set 7 minutes later, blocking every publisher. Now the alarm measures RSS after
    handing freed heap pages back (malloc_trim), and connections blocked by the alarm whose clients have
    gone are closed: it clears within seconds of the clients closing, and a blocked publisher's confirm
    arrives."""
    info = _node(tmp_path, "180MB")
    try:
        burst = _burst(info)
        assert _wait(lambda: _mem_alarm(info), 30), "the memory alarm was not raised"
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
    finally:
        info.stop()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()
