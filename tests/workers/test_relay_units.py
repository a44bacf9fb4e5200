"""runtime/workers/relay.py in memory: a relay's client side is a stand-in transport, its home side a real
socket pair whose far end (the home worker) reads nothing, as when an alarm blocks the connection there.
`peer_hung_up` on real sockets. Waits poll with generous deadlines; nothing here asserts a duration."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.session.memory import MemoryTransport

from hutch.runtime.workers import relay
from hutch.runtime.workers.relay import TlsRelay, peer_hung_up

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="poll's POLLRDHUP")


class StandInClient(MemoryTransport):
    """The TLS transport's plaintext side, as the relay uses it (tests/session/memory.py's, plus what a
    relay calls on it)."""

    def is_reading(self) -> bool:
        return self.reading

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def abort(self) -> None:
        self.close()


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_peer_hung_up_sees_a_close_behind_unread_bytes() -> None:
    for family in (socket.AF_UNIX, socket.AF_INET):
        if family == socket.AF_UNIX:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            listener = socket.create_server(("127.0.0.1", 0))
            theirs = socket.create_connection(listener.getsockname())
            ours, _addr = listener.accept()
            listener.close()
        with ours, theirs:
            theirs.sendall(b"unread bytes")
            assert not peer_hung_up(ours.fileno())
            theirs.close()
            deadline = time.monotonic() + 20
            while not peer_hung_up(ours.fileno()):  # (TCP: the FIN crosses loopback)
                assert time.monotonic() < deadline, family
                time.sleep(0.01)


@pytest.mark.asyncio
async def test_the_client_gone_with_bytes_the_home_does_not_read_closes_the_pair(monkeypatch) -> None:
    monkeypatch.setattr(relay, "DRAIN_CHECK_S", 0.05)
    ours, home_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ended: list[TlsRelay] = []
    client = StandInClient()
    pump = TlsRelay(client, ours, ended.append)
    await pump.start()
    try:
        for _ in range(8):  # 512 KiB: more than the pair's kernel buffers, less than the relay's high mark
            pump.from_client(b"p" * (64 << 10))
        assert pump.home is not None and pump.home.get_write_buffer_size() > 0  # the home reads nothing
        pump.client_lost()  # the client's TLS transport is gone
        assert ended == [pump]
        await until(lambda: peer_hung_up(home_end.fileno()), "the pair closed under the home")
    finally:
        home_end.close()


@pytest.mark.asyncio
async def test_the_client_gone_while_the_home_reads_keeps_every_byte(monkeypatch) -> None:
    monkeypatch.setattr(relay, "DRAIN_CHECK_S", 60.0)  # (a loaded machine may pause this reader: not a stall)
    ours, home_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    home_end.setblocking(False)
    pump = TlsRelay(StandInClient(), ours, lambda _r: None)
    await pump.start()
    sent = b"".join(bytes([i]) * (64 << 10) for i in range(8))
    for i in range(8):
        pump.from_client(sent[i << 16:(i + 1) << 16])
    pump.client_lost()
    got = bytearray()
    loop = asyncio.get_running_loop()
    try:
        while True:  # a home that reads: everything arrives, then the end of file
            chunk = await loop.sock_recv(home_end, 16 << 10)
            if not chunk:
                break
            got += chunk
        assert bytes(got) == sent
    finally:
        home_end.close()
