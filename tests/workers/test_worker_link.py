"""The worker link: the inter-node transport in paired mode (runtime/clustering/transport.py), two
Transports in one event loop joined by a `socket.socketpair`, as the supervisor joins two workers.

Timings are scaled down (heartbeat 50 ms, peer timeout 500 ms); every wait polls a condition with a
generous deadline.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from tests.cluster.test_transport import TIMEOUT, Node, until


def paired(name: str) -> Node:
    return Node(name, paired=True)


@pytest.mark.asyncio
async def test_a_socket_pair_is_a_link_without_listener_or_handshake() -> None:
    a, b = paired("n#w0"), paired("n#w1")
    s0, s1 = socket.socketpair()
    a.t.adopt("n#w1", s0)  # before start: attached by start
    await a.t.start()
    await b.t.start()
    b.t.adopt("n#w0", s1)
    try:
        assert a.t._server is None and b.t._server is None and a.t.port == 0  # nothing listens
        await until(lambda: a.t.connected("n#w1") and b.t.connected("n#w0"), what="both ends up")
        assert a.ups("n#w1") == 1 and b.ups("n#w0") == 1
        assert a.t.send("n#w1", {"k": b"v"})
        await until(lambda: b.messages == [("n#w0", {"k": b"v"})], what="the message")
        assert await b.t.call("n#w0", [1, 2]) == {"from": "n#w1", "echo": [1, 2]}
        await asyncio.sleep(TIMEOUT * 2)  # heartbeats keep an idle link up
        assert a.t.connected("n#w1") and a.downs("n#w1") == 0
    finally:
        await a.t.stop()
        await b.t.stop()


@pytest.mark.asyncio
async def test_a_newer_pair_replaces_the_link_of_a_restarted_worker() -> None:
    a, b = paired("n#w0"), paired("n#w1")
    await a.t.start()
    await b.t.start()
    s0, s1 = socket.socketpair()
    a.t.adopt("n#w1", s0)
    b.t.adopt("n#w0", s1)
    await until(lambda: a.t.connected("n#w1"), what="first link")
    await b.t.stop()  # worker 1 dies ...
    await until(lambda: a.downs("n#w1") == 1, what="worker 1 down")
    b2 = paired("n#w1")  # ... and its replacement starts slowly: its end is attached later
    s0, s1 = socket.socketpair()
    a.t.adopt("n#w1", s0)
    await until(lambda: a.ups("n#w1") == 2, what="the new link up at worker 0")
    await asyncio.sleep(TIMEOUT * 2)  # silent while the peer boots: not timed out
    assert a.t.connected("n#w1")
    await b2.t.start()
    b2.t.adopt("n#w0", s1)
    try:
        await until(lambda: b2.t.connected("n#w0"), what="worker 1 attached")
        assert await a.t.call("n#w1", "ping") == {"from": "n#w0", "echo": "ping"}
        b2.t.send("n#w0", 7)
        await until(lambda: ("n#w1", 7) in a.messages, what="worker 1's message")
    finally:
        await a.t.stop()
        await b2.t.stop()


@pytest.mark.asyncio
async def test_a_hung_peer_is_dropped_once_it_was_heard() -> None:
    a = paired("n#w0")
    await a.t.start()
    s0, s1 = socket.socketpair()
    a.t.adopt("n#w1", s0)
    try:
        s1.sendall(b"\x00\x00\x00\x01\x90")  # one heartbeat (the empty batch), then silence
        await until(lambda: a.downs("n#w1") == 1, timeout=TIMEOUT * 10, what="silent peer dropped")
    finally:
        s1.close()
        await a.t.stop()


@pytest.mark.asyncio
async def test_adopt_is_only_for_a_paired_transport() -> None:
    tcp = Node("n1")
    s0, s1 = socket.socketpair()
    with pytest.raises(ValueError, match="paired"):
        tcp.t.adopt("n2", s0)
    s0.close()
    s1.close()
    a = paired("n#w0")
    with pytest.raises(ValueError, match="own name"):
        a.t.adopt("n#w0", socket.socket())

