"""Idle sockets on the management listener (issue 21, finding 3; docs/security.md, "Timeouts and the
connection cap").

Before: 1,030 silent sockets from one address filled the 1,024-connection cap and an administrator's
request was reset, for the 60 s of `management.tcp.request_timeout`. Now the request timeout defaults to
Cowboy's 5 s and one source address may hold at most `management.tcp.max_connections_per_source`
(default a quarter of the cap: 256). Measured here (2-core machine shared with other work): 256 of the
1,030 silent sockets held, the other 774 closed at once; an administrator's GET from 127.0.0.2 answered
200 in 5 ms while they were open; every held socket closed 5.1 s after the flood began; the stall probe
(`RoundTrips`: a passive queue.declare every ~10 ms) saw at most 6 ms. The old code held 1,024.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import wait_mgmt
from .sockets import NEEDS_ALIAS, OTHER_SOURCE, assert_kept_answering, closed_now, start_probe

SILENT = 1030


@pytest.fixture
def default_node(tmp_path: Path) -> Iterator[ServerInfo]:
    info = start_server(tmp_path)  # the default listener settings: nothing in a config file
    try:
        yield wait_mgmt(info)
    finally:
        info.stop()


def _admin_get(port: int, source: str) -> bytes:
    """GET /api/overview as guest (an administrator) from `source`; the status line, or b"" if reset."""
    token = base64.b64encode(b"guest:guest").decode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
            s.sendall(f"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Basic {token}\r\n"
                      "Connection: close\r\n\r\n".encode())
            reply = b""
            while b"\r\n" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
            return reply.split(b"\r\n", 1)[0]
    except OSError:
        return b""


@NEEDS_ALIAS
def test_silent_sockets_from_one_source_leave_room_for_an_administrator(default_node: ServerInfo):
    port = default_node.management_port
    probe = start_probe(default_node.amqp_port)
    silent: list[socket.socket] = []
    try:
        opened = time.monotonic()
        for _ in range(SILENT):
            silent.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(1.0)
        held = [s for s in silent if not closed_now(s)]
        assert len(held) <= 256 + 8, f"{len(held)} silent sockets from one source still open"  # the per-source cap
        asked = time.monotonic()
        status = _admin_get(port, OTHER_SOURCE)
        answer_s = time.monotonic() - asked
        assert status.startswith(b"HTTP/1.1 200"), status
        # the request timeout (5 s by default) closes the held ones
        deadline = opened + 30
        while time.monotonic() < deadline and not all(closed_now(s) for s in held):
            time.sleep(0.2)
        closed_after_s = time.monotonic() - opened
        assert all(closed_now(s) for s in held), "silent sockets still open 30 s after they opened"
        assert _admin_get(port, "127.0.0.1").startswith(b"HTTP/1.1 200")  # and the source is welcome again
    finally:
        for s in silent:
            s.close()
        probe.stop()
    print(f"held {len(held)} of {SILENT}; admin answer {answer_s * 1000:.0f} ms; all closed after "
          f"{closed_after_s:.1f} s; longest AMQP round trip {probe.longest_s * 1000:.0f} ms")
    assert_kept_answering(probe)
