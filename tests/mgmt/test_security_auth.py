"""Issue 15, findings 7 and 9, and issue 16's update-secret, against a real node.

- A flood of bad logins (separate processes, raw AMQP sockets) does not slow a cached management
  login: cached credentials are answered on the loop, scrypt runs in the node's own bounded pool, and
  logins past the pending bounds are refused at once.
- Refusals cost the same whatever the reason (unknown user, blank password, wrong password, a user
  with an imported RabbitMQ hash), and an imported hash is replaced by scrypt on the first login.
- `connection.update-secret` is accepted for internal users, with any secret (RabbitMQ 4.x), through
  pika and aio-pika; a revoked vhost permission is 530.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pika.exceptions
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch.amqp import spec
from hutch.amqp.frames import FrameReader, method_frame

from .helpers import Api, connect, unique, wait_for, wait_mgmt

# -- a raw login, timed ---------------------------------------------------------------------------------


def raw_login(port: int, user: str, password: str, source: str = "127.0.0.1", timeout: float = 10.0
              ) -> tuple[float, bool]:
    """(seconds from start-ok to the server's answer, logged in?) for one PLAIN login."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        reader = FrameReader(0)

        def next_method() -> spec.Method:
            while True:
                for ftype, _channel, payload in reader.frames():
                    if ftype == spec.FRAME_METHOD:
                        return spec.decode_method(payload)
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                reader.feed(data)

        sock.sendall(spec.PROTOCOL_HEADER)
        assert isinstance(next_method(), spec.Connection.Start)
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        started = time.perf_counter()
        sock.sendall(method_frame(0, spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
            response=response, locale="en_US")))
        try:
            reply = next_method()
        except ConnectionError:
            return time.perf_counter() - started, False
        return time.perf_counter() - started, isinstance(reply, spec.Connection.Tune)


FLOOD = """
import socket, sys, time
from hutch.amqp import spec
from hutch.amqp.frames import method_frame
port, source, until = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
n = 0
while time.monotonic() < until:  # 24 bad logins in flight at once, pipelined (header + start-ok)
    socks = []
    for _ in range(24):
        n += 1  # a different wrong password each time: the same one would share one check
        login = spec.PROTOCOL_HEADER + method_frame(0, spec.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response=b"\\x00guest\\x00wrong%d" % n, locale="en_US"))
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            s.sendall(login)
            socks.append(s)
        except OSError:
            time.sleep(0.01)
    for s in socks:
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()
"""


def _flood(port: int, sources: list[str], seconds: float) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", FLOOD, str(port), source, str(seconds)])
            for source in sources]


def _whoami_ms(api: Api, seconds: float) -> list[float]:
    """Latencies (ms) of cached management logins made one after the other for `seconds`."""
    times: list[float] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.perf_counter()
        assert api.get("/api/whoami").status == 200
        times.append((time.perf_counter() - started) * 1000)
    return times


def test_bad_login_flood_does_not_slow_cached_logins(fresh_api: Api, fresh_mgmt: ServerInfo) -> None:
    _whoami_ms(fresh_api, 0.2)  # guest's credentials are now cached
    quiet = _whoami_ms(fresh_api, 1.0)
    # three sources, 24 bad logins in flight from each: far more than the pool can hash
    flooders = _flood(fresh_mgmt.amqp_port, ["127.0.0.1", "127.0.0.2", "127.0.0.3"], 12.0)
    try:
        time.sleep(2.0)
        loaded = _whoami_ms(fresh_api, 4.0)
        amqp_s, ok = raw_login(fresh_mgmt.amqp_port, "guest", "guest", source="127.0.0.4")
    finally:
        for p in flooders:
            p.kill()
            p.wait()
    # before: a cached login queued behind the flood's scrypt calls in the shared executor, for seconds
    # at a time; now it is answered on the loop. Loose bounds: a loaded machine has hiccups.
    assert max(loaded) < 1000, (statistics.median(quiet), sorted(loaded)[-5:])
    assert len(loaded) > len(quiet) / 10, (len(quiet), len(loaded))
    assert ok and amqp_s < 1.0, amqp_s
    log = fresh_mgmt.log()
    assert "too many logins pending" in log  # the bounds refused the excess at once


def _rabbit_sha256(password: str) -> str:
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


@pytest.fixture
def imported_user(fresh_api: Api) -> Iterator[str]:
    doc = {"users": [{"name": "imported", "password_hash": _rabbit_sha256("secret"),
                      "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []},
                     {"name": "known", "password": "right", "tags": []}],
           "permissions": [{"user": "imported", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
    assert fresh_api.call("POST", "/api/definitions", doc).status in (200, 201, 204)
    yield "imported"


def _median_refusals(port: int, logins: dict[str, tuple[str, str]], rounds: int = 7) -> dict[str, float]:
    """The median seconds of each kind of refused login, the kinds interleaved round by round, so a load
    spike of the shared machine falls on every kind alike, not on one kind's run of attempts."""
    times: dict[str, list[float]] = {what: [] for what in logins}
    for _ in range(rounds):
        for what, (user, password) in logins.items():
            seconds, ok = raw_login(port, user, password)
            assert not ok
            times[what].append(seconds)
    return {what: statistics.median(t) for what, t in times.items()}


def test_refusals_cost_the_same_whatever_the_reason(imported_user: str, fresh_mgmt: ServerInfo) -> None:
    port = fresh_mgmt.amqp_port
    medians = _median_refusals(port, {"wrong password": ("known", "wrong"),
                                      "unknown user": ("nobody-" + unique(), "wrong"),
                                      "blank password": ("known", ""),
                                      "imported hash, wrong password": (imported_user, "wrong")})
    wrong = medians.pop("wrong password")
    for what, seconds in medians.items():
        # before: 0.26 ms for a blank password and for an imported hash against ~40 ms (loose: 1/3)
        assert seconds > wrong / 3, (what, seconds, wrong)


def test_imported_hash_becomes_scrypt_on_first_login(imported_user: str, fresh_api: Api, tmp_path: Path,
                                                     fresh_mgmt: ServerInfo) -> None:
    assert fresh_api.ok(f"/api/users/{imported_user}")["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(fresh_mgmt.amqp_port, imported_user, "wrong")
    assert fresh_api.ok(f"/api/users/{imported_user}")["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    connect(fresh_mgmt.amqp_port, imported_user, "secret").close()
    assert wait_for(lambda: fresh_api.ok(f"/api/users/{imported_user}")["hashing_algorithm"]
                    == "hutch_password_hashing_scrypt")
    stored = fresh_api.ok(f"/api/users/{imported_user}")["password_hash"]
    assert stored.startswith("scrypt$")
    connect(fresh_mgmt.amqp_port, imported_user, "secret").close()  # the new hash verifies
    # recorded like a password change: it survives a restart
    fresh_mgmt.stop()
    again = start_server(fresh_mgmt.data_dir.parent)
    try:
        wait_mgmt(again)
        assert Api(again.mgmt_url).ok(f"/api/users/{imported_user}")["password_hash"] == stored
        connect(again.amqp_port, imported_user, "secret").close()
    finally:
        again.stop()


# -- connection.update-secret (issue 16) ----------------------------------------------------------------


def test_update_secret_with_any_secret_is_accepted_pika(fresh_mgmt: ServerInfo) -> None:
    conn = connect(fresh_mgmt.amqp_port)
    try:
        conn.update_secret("a-new-token-not-the-password", "token refresh")  # RabbitMQ: ok, user kept
        ch = conn.channel()
        name = unique()
        ch.queue_declare(name, exclusive=True)
        ch.basic_publish("", name, b"after")
        assert wait_for(lambda: ch.basic_get(name, auto_ack=True)[2] == b"after")
    finally:
        conn.close()
    assert "user 'guest' updated secret, reason: token refresh" in fresh_mgmt.log()


def test_update_secret_aio_pika(clean_mgmt: ServerInfo) -> None:
    async def scenario() -> None:
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{clean_mgmt.amqp_port}/")
        try:
            await connection.update_secret("other-secret", reason="rotate", timeout=5)
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            assert queue.name.startswith("amq.gen-")
        finally:
            await connection.close()

    asyncio.run(scenario())


def test_update_secret_after_vhost_access_revoked_is_530(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    assert clean_api.put("/api/users/rotating", {"password": "pw", "tags": ""}).status == 201
    assert clean_api.put("/api/permissions/%2F/rotating", {"configure": ".*", "write": ".*", "read": ".*"}
                         ).status in (201, 204)
    conn = connect(clean_mgmt.amqp_port, "rotating", "pw")
    assert clean_api.delete("/api/permissions/%2F/rotating").status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.update_secret("pw", "refresh")
    assert closed.value.reply_code == 530
    assert "access to vhost '/' refused for user 'rotating'" in closed.value.reply_text


def test_a_reconnect_storm_of_one_application_is_not_refused(tmp_path: Path) -> None:
    """60 aio-pika connections with the same credentials from one address, opened at once on a node
    that has not seen them verified (a restart's reconnect storm), with the per-source bound at 2: all
    open, as on RabbitMQ. Before: the logins past the bound were refused ("too many logins pending")."""
    info = start_server(tmp_path, config_text="auth.max_pending_logins_per_source = 2\n")
    try:
        url = f"amqp://guest:guest@127.0.0.1:{info.amqp_port}/"

        async def storm() -> list[object]:
            results = await asyncio.gather(*(aio_pika.connect(url, timeout=30) for _ in range(60)),
                                           return_exceptions=True)
            for r in results:
                if isinstance(r, aio_pika.abc.AbstractConnection):
                    await r.close()
            return results

        results = asyncio.run(storm())
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed[:3]
        assert "too many logins pending" not in info.log()
    finally:
        info.stop()
