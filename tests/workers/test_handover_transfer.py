"""Connection locality's transfer (runtime/workers/handover.py) in one event loop: two workers' control
links (`WorkerLink`) on real `SOCK_SEQPACKET` pairs, the test standing for the supervisor (it relays
`handover` as `adopt`, as supervisor.py does), a socket pair standing for the client's TCP connection.
Both ways a state travels are taken: inline (small) and on a socket pair of its own (large), and the
failure of each (an AMQP client's connection is closed with 320, a stream client's without a frame,
never kept half-adopted)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from pamqp import frame

from hutch.runtime.stream_session.handover import StreamHandoverState
from hutch.runtime.workers import control
from hutch.runtime.workers.handover import Locality
from hutch.runtime.workers.link import WorkerLink
from hutch.runtime.workers.spec import WorkerSpec

NODE = "n@host"


@dataclass
class Worker:
    link: WorkerLink
    supervisor_end: socket.socket
    locality: Locality
    adopted: list[tuple[socket.socket, bytes]] = field(default_factory=list)


def control_link(index: int) -> tuple[WorkerLink, socket.socket]:
    """Worker `index`'s control link, started, and the supervisor's end of its socket."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    link = WorkerLink(WorkerSpec(index, 2, mine.detach(), {}, 0, None, False), NODE)
    link.start(lambda: None)
    return link, theirs


def close_link(link: WorkerLink, supervisor_end: socket.socket) -> None:
    link.stop()
    link.sock.close()
    supervisor_end.close()


def worker(index: int) -> Worker:
    link, theirs = control_link(index)
    w = Worker(link, theirs, None)  # type: ignore[arg-type]

    async def adopt(sock: socket.socket, state: bytes) -> None:
        w.adopted.append((sock, state))
    w.locality = Locality(link, f"{NODE}#w{index}", index, lambda _name: True, adopt)
    return w


async def next_message(supervisor_end: socket.socket, kind: str) -> tuple[dict[str, object], list[int]]:
    """The next control message of `kind` a worker sent its supervisor (heartbeats skipped), with its
    descriptors (the caller closes them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        try:
            data, fds, _f, _a = socket.recv_fds(supervisor_end, control.MAX_MESSAGE_BYTES, control.MAX_FDS)
        except BlockingIOError:
            assert loop.time() < deadline, f"no {kind} message"
            await asyncio.sleep(0.01)
            continue
        doc = control.decode(data)
        if kind in doc:
            return doc, fds


async def relay(src: Worker, dst: Worker) -> dict[str, object]:
    """The supervisor's part: the next handover message from `src`, relayed to `dst` as adopt."""
    doc, fds = await next_message(src.supervisor_end, "handover")
    state = doc.get("state")
    assert isinstance(state, (str, type(None)))
    socket.send_fds(dst.supervisor_end, [control.encode_move("adopt", src.link.spec.index, state)], fds)
    for fd in fds:
        socket.close(fd)
    return doc


async def until(cond: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture
async def workers() -> AsyncIterator[tuple[Worker, Worker]]:
    a, b = worker(0), worker(1)
    yield a, b
    for w in (a, b):
        w.locality.stop()
        close_link(w.link, w.supervisor_end)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [100, 200_000])
async def test_a_client_socket_and_its_state_reach_the_other_worker(workers: tuple[Worker, Worker],
                                                                    size: int) -> None:
    a, b = workers
    server_side, client_side = socket.socketpair()
    state = bytes(range(256)) * (size // 256) + b"end"
    assert a.locality.move(server_side, state, 1)
    server_side.close()  # the old worker drops its transport: the duplicate keeps the connection
    doc = await relay(a, b)
    assert ("state" in doc) == (size < control.INLINE_STATE_BYTES)
    await until(lambda: b.adopted, "the adoption")
    sock, got = b.adopted[0]
    assert got == state and a.locality.moved_out == 1 and b.locality.adopted == 1
    client_side.sendall(b"ping")  # the same connection, now held by worker 1
    sock.setblocking(True)
    assert sock.recv(4) == b"ping"
    sock.sendall(b"pong")
    assert client_side.recv(4) == b"pong"
    sock.close()
    client_side.close()


@pytest.mark.asyncio
async def test_a_state_that_never_arrives_closes_the_client_with_320(workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    server_side, client_side = socket.socketpair()
    a.locality.stop()  # nothing will write the large state: its socket pair ends empty
    assert a.locality.move(server_side, b"x" * (control.INLINE_STATE_BYTES + 1), 1)
    a.locality.stop()
    server_side.close()
    await relay(a, b)
    await until(lambda: b.locality.lost == 1, "the refusal")
    client_side.settimeout(10)
    data = client_side.recv(4096)
    _used, channel, close = frame.unmarshal(data)
    assert channel == 0 and close.reply_code == 320 and not b.adopted
    assert client_side.recv(4096) == b""  # and the socket closed
    client_side.close()


@pytest.mark.asyncio
async def test_a_malformed_inline_state_closes_the_client_with_320(workers: tuple[Worker, Worker]) -> None:
    _a, b = workers
    server_side, client_side = socket.socketpair()
    socket.send_fds(b.supervisor_end, [control.encode_move("adopt", 0, "not base64!")], [server_side.fileno()])
    server_side.close()
    await until(lambda: b.locality.lost == 1, "the refusal")
    client_side.settimeout(10)
    _used, _channel, close = frame.unmarshal(client_side.recv(4096))
    assert close.reply_code == 320 and not b.adopted
    client_side.close()


def test_a_queue_is_a_reason_to_move_only_as_a_stand_in_of_another_running_worker() -> None:
    class Q:
        def __init__(self, remote: bool, home: str) -> None:
            self.remote, self.home = remote, home

    up = {f"{NODE}#w1"}
    link = WorkerLink.__new__(WorkerLink)
    link._adopt_connection = None
    loc = Locality(link, f"{NODE}#w0", 0, lambda name: name in up, lambda _s, _b: asyncio.sleep(0))
    assert loc.home_of(Q(True, f"{NODE}#w1")) == 1
    assert loc.home_of(Q(True, f"{NODE}#w2")) is None  # not up
    assert loc.home_of(Q(True, f"{NODE}#w0")) is None  # this worker
    assert loc.home_of(Q(True, "other@host#w1")) is None  # another node's worker
    assert loc.home_of(Q(True, "other@host")) is None  # another node
    assert loc.home_of(Q(False, f"{NODE}#w1")) is None  # not a stand-in


@pytest.mark.asyncio
async def test_a_stream_connection_whose_state_never_arrives_is_closed_without_an_amqp_frame(
        workers: tuple[Worker, Worker]) -> None:
    """A stream-protocol client must not be sent AMQP's connection.close: its socket is closed, as
    RabbitMQ ends a stream connection on an internal error (the kind travels before the state)."""
    a, b = workers
    server_side, client_side = socket.socketpair()
    state = StreamHandoverState("guest", "/", 1 << 20, 60, {}, "PLAIN", ("127.0.0.1", 1), "c", 0, 2, 0,
                                ("127.0.0.1", 5552), b"x" * (control.INLINE_STATE_BYTES + 1)).encode()
    a.locality.stop()  # nothing will write the large state: its socket pair ends with the kind alone
    assert a.locality.move(server_side, state, 1)
    a.locality.stop()
    server_side.close()
    await relay(a, b)
    await until(lambda: b.locality.lost == 1, "the refusal")
    client_side.settimeout(10)
    assert client_side.recv(4096) == b"" and not b.adopted  # closed, nothing written
    client_side.close()
