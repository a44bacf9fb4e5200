"""The asyncio adapter of a stream-protocol connection: socket callbacks in, `StreamConnection` calls out.

Owns: what only a socket on an event loop has: the transport's write-buffer limits (deliveries pause
while the buffer is above the high mark), the read budget (after `READ_BUDGET` bytes in one loop
iteration a connection reads no more until the next: libuv otherwise keeps reading a busy socket, and
a flood of small commands, each answered or written on the loop, stalled every other client for
seconds), the slot the connection holds in the plain listener's `HandshakeGate` from the accept until
its login succeeds (past the gate's caps the socket is closed at the accept: runtime/listen.py), and the wiring of one connection to its ports (the
transport as the `Transport`, the event loop as the `LoopClock`). All the protocol is in connection.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

from hutch.runtime.listen import HandshakeGate, HeldSlot
from hutch.runtime.stream_session.connection import StreamConnection
from hutch.runtime.stream_session.hub import StreamHub

WRITE_BUFFER_HIGH = 4 * 1024 * 1024  # a few chunks of a busy stream
WRITE_BUFFER_LOW = 1024 * 1024
READ_BUDGET = 64 * 1024  # bytes one connection may hand the protocol per event-loop iteration


class StreamProtocol(asyncio.Protocol):
    def __init__(self, hub: StreamHub, tls: bool = False, adopted: bytes | None = None,
                 gate: HandshakeGate | None = None) -> None:
        self.loop = asyncio.get_event_loop()
        self.conn = StreamConnection(hub, self.loop, tls)
        self._read_this_turn = 0
        self._turn_scheduled = False
        self._adopted = adopted  # the state of a connection another worker handed over, adopted at connection_made
        self._slot = HeldSlot(gate) if gate is not None else None  # held from the accept until the login

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        stream.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        peer = stream.get_extra_info("peername") or ("?", 0)
        sock = stream.get_extra_info("sockname") or ("?", 0)
        if self._adopted is not None:
            adopted, self._adopted = self._adopted, None
            self.conn.adopt(stream, (sock[0], sock[1]), adopted)
            return
        if self._slot is not None:
            if not self._slot.take(stream):
                return  # closed at the accept (a cap of the gate): nothing started
            self.conn.on_login = self._slot.release
        self.conn.connection_made(stream, (peer[0], peer[1]), (sock[0], sock[1]))

    def data_received(self, data: bytes) -> None:
        self._read_this_turn += len(data)
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._next_turn)
        if self._read_this_turn >= READ_BUDGET:
            self.conn.hold_reading("budget")
        self.conn.receive_data(data)

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self._read_this_turn = 0
        self.conn.release_reading("budget")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._slot is not None:
            if self._slot.refused:
                return
            self._slot.release()
        self.conn.connection_lost()

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()
