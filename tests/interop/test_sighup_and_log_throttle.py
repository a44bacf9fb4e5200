"""Issue 21, finding 7 (docs/security.md, "Log lines" and "TLS: certificate reloads and expiry"):

- A node without TLS died silently of SIGHUP (the default action: no handler was installed unless a
  certificate was configured). Now SIGHUP is logged and the node keeps serving.
- Login refusals and update-secret lines had no throttle (18,542 lines in 12 s). Now each kind writes at
  most 20 lines per 10 s, node-wide, and the next line written says how many were left out. Measured
  here: 600 update-secrets in ~1 s wrote 20 lines (old code: 600); 40 refused logins wrote 20.
"""

from __future__ import annotations

import signal
import threading
import time

import pika
import pytest

from conftest import ServerInfo

THROTTLE_LINES = 20


def _round_trip(server: ServerInfo) -> bytes | None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"alive")
        return ch.basic_get(q, auto_ack=True)[2]
    finally:
        conn.close()


def test_sighup_on_a_node_without_tls_is_logged_and_the_node_keeps_running(fresh_server: ServerInfo):
    assert _round_trip(fresh_server) == b"alive"
    fresh_server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "SIGHUP received" not in fresh_server.log():
        assert fresh_server.proc.poll() is None, "the node died of SIGHUP"
        time.sleep(0.05)
    assert "SIGHUP received: no TLS certificates to reload; the node keeps running" in fresh_server.log()
    assert fresh_server.proc.poll() is None
    assert _round_trip(fresh_server) == b"alive"


def test_update_secret_lines_are_throttled(fresh_server: ServerInfo):
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=fresh_server.amqp_port))
    try:
        for i in range(600):
            conn.update_secret("guest", f"refresh {i}")
    finally:
        conn.close()
    time.sleep(0.3)
    lines = [line for line in fresh_server.log().splitlines() if "updated secret" in line]
    assert 1 <= len(lines) <= THROTTLE_LINES, len(lines)  # old code: 600


def _refused_login(port: int) -> None:
    params = pika.ConnectionParameters(port=port, credentials=pika.PlainCredentials("guest", "wrong"),
                                       connection_attempts=1, socket_timeout=10)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)


def test_login_refusal_lines_are_throttled_and_say_what_was_left_out(fresh_server: ServerInfo):
    threads = [threading.Thread(target=_refused_login, args=(fresh_server.amqp_port,)) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    refusals = [line for line in fresh_server.log().splitlines() if "login refused" in line]
    assert 1 <= len(refusals) <= THROTTLE_LINES, len(refusals)  # old code: 40
    time.sleep(10.5)  # the next window: the next refusal is written and says how many were left out
    _refused_login(fresh_server.amqp_port)
    last = [line for line in fresh_server.log().splitlines() if "login refused" in line][-1]
    assert "similar lines suppressed before this one" in last, last
