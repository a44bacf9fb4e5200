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



@pytest.mark.asyncio
async def test_a_pause_of_the_whole_node_keeps_the_link() -> None:
    """Found by the Jepsen runs on nodes of workers: a node paused as a whole (SIGSTOP of the supervisor
    and every worker) and continued; each worker saw the other silent for longer than the peer timeout and
    closed the link, which nothing reopens (the supervisor pairs workers only when one restarts). A worker
    whose own loop did not run for that long takes the silence as its own: the link stays."""
    a, b = paired("n#w0"), paired("n#w1")
    s0, s1 = socket.socketpair()
    a.t.adopt("n#w1", s0)
    b.t.adopt("n#w0", s1)
    await a.t.start()
    await b.t.start()
    try:
        await until(lambda: a.t.connected("n#w1") and b.t.connected("n#w0"), what="both ends up")
        loop = asyncio.get_running_loop()
        for node in (a, b):  # as after SIGCONT: no tick and nothing read for 10 peer timeouts
            node.t._ticked_at = loop.time() - TIMEOUT * 10
            for conn in node.open_conns():
                conn.last_rx = loop.time() - TIMEOUT * 10
        ticks = [a.t._ticked_at, b.t._ticked_at]
        await until(lambda: [a.t._ticked_at, b.t._ticked_at] != ticks and a.t._ticked_at > ticks[0]
                    and b.t._ticked_at > ticks[1], what="a tick on both")
        assert a.t.connected("n#w1") and b.t.connected("n#w0") and a.downs("n#w1") == b.downs("n#w0") == 0
        assert await a.t.call("n#w1", "still") == {"from": "n#w0", "echo": "still"}
    finally:
        await a.t.stop()
        await b.t.stop()
