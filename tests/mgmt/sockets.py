"""Raw-socket helpers of the socket-flood tests (tests/mgmt/test_idle_sockets.py, tests/tls/test_half_open.py)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from .helpers import connect
from .test_security import RoundTrips

OTHER_SOURCE = "127.0.0.2"
"""A second loopback address (Linux answers the whole 127/8): "another client" for the per-source caps."""


def loopback_alias_works() -> bool:
    try:
        with socket.socket() as s:
            s.bind((OTHER_SOURCE, 0))
        return True
    except OSError:
        return False


def closed_now(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


NEEDS_ALIAS = pytest.mark.skipif(not loopback_alias_works(), reason="needs 127.0.0.2 (a Linux loopback alias)")


def start_probe(amqp_port: int, queue: str) -> RoundTrips:
    """The stall probe (`RoundTrips`: a passive queue.declare of `queue`, declared here, every ~10 ms)."""
    setup = connect(amqp_port)
    setup.channel().queue_declare(queue)
    setup.close()
    return RoundTrips(amqp_port, queue)


def assert_kept_answering(probe: Any) -> None:
    """The stall probe (`RoundTrips` of tests/mgmt/test_security.py, stopped) ran and never waited 2 s:
    a generous bound, the measured figures are in the tests' docstrings."""
    assert probe.count > 10
    assert probe.longest < 2.0, f"AMQP round trips stalled for {probe.longest:.1f} s"
