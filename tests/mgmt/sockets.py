"""Raw-socket helpers of the socket-flood tests (tests/mgmt/test_idle_sockets.py, tests/tls/test_half_open.py)."""

from __future__ import annotations

import socket

import pytest

from .helpers import StallProbe

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


def start_probe(amqp_port: int) -> StallProbe:
    """The stall probe (helpers.StallProbe: a passive queue.declare every 20 ms), started."""
    return StallProbe(amqp_port).start()


def assert_kept_answering(probe: StallProbe) -> None:
    """The stall probe (helpers.StallProbe, stopped) ran and never waited 2 s: a generous bound, the
    measured figures are in the tests' docstrings."""
    assert probe.rounds > 10
    assert probe.longest_s < 2.0, f"AMQP round trips stalled for {probe.longest_s:.1f} s"
