"""The asyncio adapter of a stream-protocol connection: socket callbacks in, `StreamConnection` calls out.

Owns: what only a socket on an event loop has: the transport's write-buffer limits (deliveries pause
while the buffer is above the high mark), and the wiring of one connection to its ports (the
transport as the `Transport`, the event loop as the `LoopClock`). All the protocol is in connection.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

from hutch.runtime.stream_session.connection import StreamConnection
from hutch.runtime.stream_session.hub import StreamHub

WRITE_BUFFER_HIGH = 4 * 1024 * 1024  # a few chunks of a busy stream
WRITE_BUFFER_LOW = 1024 * 1024


class StreamProtocol(asyncio.Protocol):
    def __init__(self, hub: StreamHub, tls: bool = False, adopted: bytes | None = None) -> None:
        self.conn = StreamConnection(hub, asyncio.get_event_loop(), tls)
        self._adopted = adopted  # the state of a connection another worker handed over, adopted at connection_made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        stream.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        peer = stream.get_extra_info("peername") or ("?", 0)
        sock = stream.get_extra_info("sockname") or ("?", 0)
        if self._adopted is not None:
            adopted, self._adopted = self._adopted, None
            self.conn.adopt(stream, (sock[0], sock[1]), adopted)
            return
        self.conn.connection_made(stream, (peer[0], peer[1]), (sock[0], sock[1]))

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.connection_lost()

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()
