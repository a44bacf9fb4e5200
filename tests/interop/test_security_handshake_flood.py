"""Sockets that never log in, from one address, on the plain AMQP and stream-protocol ports
(docs/security.md, "Not done" of the streams review, closed in session 16).

Before: nothing counted a plain connection before its login; one source could open thousands of sockets
that send nothing (or a protocol header and then nothing) and hold a descriptor each until the
handshake timeout (10 s), so a flood from one address ran a node out of descriptors and nobody else
could log in. Now each plain listener counts a connection from the accept until its login succeeds
in its `listen.HandshakeGate`, the same rule as the TLS listeners' handshakes: a quarter of the
descriptor limit (at most 1,024) in all, a quarter of that per source address, per worker; past a cap
the newest socket is closed at its accept.

The flood comes from 127.0.0.2 and the legitimate clients from 127.0.0.1 (pika cannot choose its
source address; the rule is symmetric). Figures (before → after) are in docs/security.md.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.mgmt.helpers import connect, wait_for
from tests.mgmt.sockets import NEEDS_ALIAS, OTHER_SOURCE, assert_kept_answering, closed_now, start_probe
from tests.stream_protocol.hostile import RawStream

from conftest import TEST_WORKERS_ENV, ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch.amqp import spec
from hutch.streamproto import commands as sc

from .helpers import RawClient

WORKERS = int(os.environ.get(TEST_WORKERS_ENV) or "1")  # each worker accepts: its own gate per listener


def start_limited(tmp: Path, descriptors: int) -> ServerInfo:
    """A node with a stream port, started with a soft limit of `descriptors` (the child inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, hard))
    try:
        return start_server(tmp, "--stream-port", "0")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def per_source(descriptors: int) -> int:
    """The slots of one source on one listener of one worker: a quarter of a quarter of the limit."""
    return min(1024, descriptors // 4) // 4


def flood(port: int, count: int, header: bytes) -> list[socket.socket]:
    """`count` sockets from OTHER_SOURCE; every other one sends `header` and then nothing."""
    sockets: list[socket.socket] = []
    for i in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(OTHER_SOURCE, 0))
        except OSError:  # the old code: the node ran out of descriptors and stopped accepting
            break
        sockets.append(s)
        if i % 2:
            try:
                s.sendall(header)
            except OSError:  # closed at the accept already
                pass
    return sockets


def held(sockets: list[socket.socket]) -> int:
    return sum(1 for s in sockets if not closed_now(s))


STREAM_PEER_PROPERTIES = sc.encode(sc.PeerProperties(1, {"product": "flood"}))


def stream_login(port: int, source: str | None = None) -> None:
    client = RawStream(port, source=source)  # logs in (PLAIN) and opens vhost /
    try:
        (answer,) = client.request(sc.StreamStats(client.next_corr(), "no-such-stream"))
        assert answer.correlation_id == client.corr
    finally:
        client.close()


@pytest.fixture
def small_node(tmp_path: Path) -> Iterator[ServerInfo]:
    info = start_limited(tmp_path, 256)  # 64 in all and 16 per source, per listener and worker
    yield info
    info.stop()


@NEEDS_ALIAS
def test_a_flood_of_silent_sockets_from_one_address_locks_nobody_else_out(small_node: ServerInfo) -> None:
    """20 logged-in AMQP and 20 stream connections from 127.0.0.2 stay open (a login gives its slot
    back), then 300 silent (or header-only) sockets from 127.0.0.2 on each plain port of a node of 256
    descriptors: the 16 slots of that source (per worker) are held on each, the rest closed at once; a
    pika login and a stream login from 127.0.0.1 work meanwhile."""
    info = small_node
    stream_port = info.ports["stream"]
    one_worker, cap = per_source(256), per_source(256) * WORKERS
    logged_in: list[RawClient | RawStream] = []
    sockets: list[socket.socket] = []
    probe = start_probe(info.amqp_port)
    try:
        for _ in range(20):  # more than the source's 16 slots
            raw = RawClient(info.amqp_port, timeout=10, source=OTHER_SOURCE)
            logged_in.append(raw)
            raw.handshake()
            logged_in.append(RawStream(stream_port, source=OTHER_SOURCE))
        amqp = flood(info.amqp_port, 300, spec.PROTOCOL_HEADER)
        stream = flood(stream_port, 300, STREAM_PEER_PROPERTIES)
        sockets = amqp + stream
        assert len(sockets) == 600
        assert wait_for(lambda: held(amqp) <= cap and held(stream) <= cap, timeout=10), (held(amqp), held(stream))
        assert held(amqp) >= one_worker and held(stream) >= one_worker  # the logged-in ones hold no slot
        conn = connect(info.amqp_port)  # a legitimate pika login from another address
        assert conn.channel().is_open
        conn.close()
        stream_login(stream_port)
    finally:
        for s in sockets:
            s.close()
        for client in logged_in:
            client.close()
        wait_for(lambda: probe.rounds > 20, timeout=30)  # enough rounds to measure (the flood may end sooner)
        probe.stop()
    assert_kept_answering(probe)


@pytest.mark.slow  # ~15 s: 6,000 sockets, then the 10 s handshake timeout
@NEEDS_ALIAS
def test_thousands_of_silent_sockets_from_one_address_on_a_node_of_2048_descriptors(tmp_path: Path) -> None:
    """3,000 sockets from 127.0.0.2 on each plain port of a node limited to 2,048 descriptors (512
    slots a listener, 128 per source), with the stall probe: before, the node ran out of descriptors
    and a login from another address failed; now 128 per worker and listener are held, the rest closed
    at the accept, a pika and a stream login from 127.0.0.1 work, and every held one is closed by the
    handshake timeout."""
    info = start_limited(tmp_path, 2048)
    cap = per_source(2048) * WORKERS
    sockets: list[socket.socket] = []
    try:
        probe = start_probe(info.amqp_port)
        started = time.monotonic()
        amqp = flood(info.amqp_port, 3000, spec.PROTOCOL_HEADER)
        stream = flood(info.ports["stream"], 3000, STREAM_PEER_PROPERTIES)
        sockets = amqp + stream
        opened_s = time.monotonic() - started
        assert len(sockets) == 6000
        assert wait_for(lambda: held(amqp) <= cap and held(stream) <= cap, timeout=10), (held(amqp), held(stream))
        conn = connect(info.amqp_port)
        assert conn.channel().is_open
        conn.close()
        stream_login(info.ports["stream"])
        assert wait_for(lambda: held(sockets) == 0, timeout=30), held(sockets)
        wait_for(lambda: probe.rounds > 20, timeout=30)
        probe.stop()
        print(f"6,000 opened in {opened_s:.1f} s; longest AMQP round trip {probe.longest_s * 1000:.0f} ms "
              f"over {probe.rounds} rounds")
        assert_kept_answering(probe)
    finally:
        for s in sockets:
            s.close()
        info.stop()
