"""Compaction of load's transfer (runtime/workers/island.py) in one event loop: two workers' control links
on real `SOCK_SEQPACKET` pairs, the test standing for the supervisor (it relays `island` as
`adopt_island`, as supervisor.py does), socket pairs standing for the clients' TCP connections. An
island's sockets arrive together with their states, in order; a state that never arrives closes every
client's connection with 320; what cannot be sent is refused before anything is handed over."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import frame

from hutch.runtime.workers import control
from hutch.runtime.workers.island import MAX_CONNECTIONS, IslandTransfer, pack_island, unpack_island
from hutch.runtime.workers.link import WorkerLink

from .test_handover_transfer import close_link, control_link, next_message, until


@dataclass
class Worker:
    link: WorkerLink
    supervisor_end: socket.socket
    transfer: IslandTransfer
    adopted: list[tuple[bytes, list[tuple[socket.socket, bytes]]]] = field(default_factory=list)


def worker(index: int) -> Worker:
    link, theirs = control_link(index)
    w = Worker(link, theirs, None)  # type: ignore[arg-type]

    async def adopt(queue_state: bytes, connections: list[tuple[socket.socket, bytes]], _arrived: float) -> None:
        w.adopted.append((queue_state, connections))
    w.transfer = IslandTransfer(link, adopt)
    return w


async def relay(src: Worker, dst: Worker) -> int:
    """The supervisor's part: the next island message from `src`, relayed to `dst`; its descriptor count."""
    doc, fds = await next_message(src.supervisor_end, "island")
    assert doc["island"] == dst.link.spec.index
    socket.send_fds(dst.supervisor_end, [control.encode("adopt_island", src.link.spec.index)], fds)
    for fd in fds:
        socket.close(fd)
    return len(fds)


@pytest_asyncio.fixture
async def workers() -> AsyncIterator[tuple[Worker, Worker]]:
    a, b = worker(0), worker(1)
    yield a, b
    for w in (a, b):
        w.transfer.stop()
        close_link(w.link, w.supervisor_end)


@pytest.mark.asyncio
async def test_an_islands_sockets_and_states_arrive_together_in_order(workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    pairs = [socket.socketpair() for _ in range(3)]
    queue_state = bytes(range(256)) * 1000  # larger than any control message: it follows on the pair
    states = [b"publisher", b"consumer", b"another"]
    assert a.transfer.send(1, [server for server, _client in pairs], queue_state, states)
    for server, _client in pairs:
        server.close()  # the old worker drops its transports: the duplicates keep the connections
    assert await relay(a, b) == 4
    await until(lambda: b.adopted, "the adoption")
    got_queue, connections = b.adopted[0]
    assert got_queue == queue_state and [s for _sock, s in connections] == states
    for (sock, _s), (_server, client) in zip(connections, pairs, strict=True):
        client.sendall(b"ping")  # the same connection, now held by worker 1
        sock.setblocking(True)
        assert sock.recv(4) == b"ping"
        sock.sendall(b"pong")
        assert client.recv(4) == b"pong"
        sock.close()
        client.close()
    assert a.transfer.sent == 1 and b.transfer.adopted == 1


@pytest.mark.asyncio
async def test_a_state_larger_than_a_socket_pairs_buffer_arrives_whole(workers: tuple[Worker, Worker]) -> None:
    """What the pair's buffer takes is written before the message, the rest by a writer after it; the
    adopting worker reads what is there and then on to the end of file."""
    a, b = workers
    pairs = [socket.socketpair() for _ in range(2)]
    queue_state = bytes(range(251)) * (24 << 10)  # ~6 MB, far over a pair's buffer (212,992 bytes here)
    assert a.transfer.send(1, [s for s, _c in pairs], queue_state, [b"x", b"y"])
    for server, _client in pairs:
        server.close()
    await relay(a, b)
    await until(lambda: b.adopted, "the adoption")
    got_queue, connections = b.adopted[0]
    assert got_queue == queue_state and [s for _sock, s in connections] == [b"x", b"y"]
    for (sock, _s), (_server, client) in zip(connections, pairs, strict=True):
        sock.close()
        client.close()


@pytest.mark.asyncio
async def test_a_state_that_never_arrives_closes_every_client_with_320(workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    pairs = [socket.socketpair() for _ in range(2)]
    # more than a socket pair's buffer takes at once: the rest is left to a writer, which is cancelled, so
    # the pair closes with the state cut short (a state within the buffer is written before the message)
    assert a.transfer.send(1, [s for s, _c in pairs], b"q" * (8 << 20), [b"x", b"y"])
    a.transfer.stop()
    for server, _client in pairs:
        server.close()
    await relay(a, b)
    await until(lambda: b.transfer.lost == 1, "the refusal")
    for _server, client in pairs:
        client.settimeout(10)
        data = client.recv(4096)
        _used, channel, close = frame.unmarshal(data)
        assert channel == 0 and close.reply_code == 320
        assert client.recv(10) == b""  # and the connection ends
        client.close()
    assert b.adopted == []


@pytest.mark.asyncio
async def test_what_cannot_be_sent_is_refused_before_anything_moves(workers: tuple[Worker, Worker]) -> None:
    a, _b = workers
    pairs = [socket.socketpair() for _ in range(MAX_CONNECTIONS + 1)]
    servers = [s for s, _c in pairs]
    assert not a.transfer.send(1, servers, b"q", [b"s"] * len(servers))  # more than one message carries
    assert not a.transfer.send(1, servers[:2], b"q", [b"s"])  # a state per socket
    assert not a.transfer.send(1, [], b"q", [])
    assert a.transfer.sent == 0
    for s, c in pairs:
        s.close()
        c.close()


def test_an_envelope_round_trips_and_must_match_its_sockets() -> None:
    data = pack_island(b"queue", [b"a", b"b"])
    assert unpack_island(data, 2) == (b"queue", [b"a", b"b"])
    with pytest.raises(ValueError, match="2 connections came with 3 sockets"):
        unpack_island(data, 3)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 3))
def test_any_bytes_are_an_envelope_or_a_value_error(data: bytes, sockets: int) -> None:
    try:
        queue_state, states = unpack_island(data, sockets)
    except ValueError:
        return
    assert len(states) == sockets and isinstance(queue_state, bytes)
