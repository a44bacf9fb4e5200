"""An in-process AMQP connection between a shovel's client and this node, without a socket.

Owns: `LocalPipe` (two transport ends joined in memory: what one protocol writes, the other receives on a
later turn of the loop) and `open_local`, which joins an `AmqpLink` to a server-side `AMQPProtocol` whose
connection logs in as the shovel's acting user without a password (the user authenticated when it set the
parameter: docs/shovel.md, "The local node").

Rules:
- Bytes are handed over with `call_soon`, never inside the writer's call, so neither state machine is
  re-entered from the other's write.
- Flow control as a socket has it: past `HIGH_WATER` unread bytes the writer's protocol gets
  `pause_writing`, below `LOW_WATER` `resume_writing`; a reader that paused reading gets nothing until it
  resumes. So a pipe holds at most about HIGH_WATER plus one write per direction.
- `close()` on either end delivers what is pending, then `connection_lost(None)` to both protocols once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from hutch.runtime.ports import BrokerPort
from hutch.runtime.session.protocol import AMQPProtocol
from hutch.runtime.shovel.client import AmqpLink, LinkClosed

HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18
PEER = ("127.0.0.1", 0)  # what the server connection sees as its peer (shown in the connection list)


class _End:
    """One side's transport: writes go to the other side's protocol."""

    def __init__(self, pipe: LocalPipe, name: str) -> None:
        self.pipe = pipe
        self.name = name
        self.protocol: asyncio.Protocol | None = None
        self.peer: _End | None = None
        self.inbox: list[bytes] = []
        self.inbox_bytes = 0
        self.reading = True
        self.writer_paused = False  # the peer's protocol was told pause_writing because of our inbox
        self._scheduled = False
        self.high, self.low = HIGH_WATER, LOW_WATER

    # -- the Transport interface -------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.pipe.closed or not data:
            return
        assert self.peer is not None
        self.peer._receive(bytes(data))

    def writelines(self, parts: Iterable[bytes]) -> None:
        self.write(b"".join(parts))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self._schedule()

    def is_reading(self) -> bool:
        return self.reading

    def close(self) -> None:
        self.pipe.close()

    def abort(self) -> None:
        self.pipe.close()

    def is_closing(self) -> bool:
        return self.pipe.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        assert self.peer is not None
        if high is not None:
            self.peer.high = high
            self.peer.low = low if low is not None else high // 4

    def get_write_buffer_size(self) -> int:
        assert self.peer is not None
        return self.peer.inbox_bytes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": PEER, "sockname": ("127.0.0.1", 0)}.get(name, default)

    # -- delivery ----------------------------------------------------------------------------------
    def _receive(self, data: bytes) -> None:
        self.inbox.append(data)
        self.inbox_bytes += len(data)
        if self.inbox_bytes > self.high and not self.writer_paused and self.peer is not None:
            self.writer_paused = True
            if self.peer.protocol is not None:
                self.peer.protocol.pause_writing()
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self.inbox and not self.pipe.lost:
            self._scheduled = True
            self.pipe.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        while self.inbox and self.reading and not self.pipe.lost:
            data = b"".join(self.inbox) if len(self.inbox) > 1 else self.inbox[0]
            self.inbox, self.inbox_bytes = [], 0
            assert self.protocol is not None
            self.protocol.data_received(data)
        if self.writer_paused and self.inbox_bytes < self.low and self.peer is not None:
            self.writer_paused = False
            if self.peer.protocol is not None and not self.pipe.lost:
                self.peer.protocol.resume_writing()


class LocalPipe:
    """Two `_End`s: `client` (the shovel's link writes here) and `server` (the node's connection)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.closed = False  # no more writes
        self.lost = False  # both protocols told connection_lost (after what was written before close)
        self.client = _End(self, "client")
        self.server = _End(self, "server")
        self.client.peer, self.server.peer = self.server, self.client

    def connect(self, client: asyncio.Protocol, server: asyncio.Protocol) -> None:
        self.client.protocol, self.server.protocol = client, server
        server.connection_made(self.server)  # type: ignore[arg-type]  # _End has the stream-transport methods both use
        client.connection_made(self.client)  # type: ignore[arg-type]  # (write, pause/resume_reading, close...)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.call_soon(self._lost)

    def _lost(self) -> None:
        for end in (self.server, self.client):
            end._drain()
        self.lost = True
        for end in (self.server, self.client):
            if end.protocol is not None:
                end.protocol.connection_lost(None)


async def open_local(node: BrokerPort, user: str, vhost: str, connection_name: str,
                     timeout_s: float = 10.0) -> AmqpLink:
    """A link to this node in-process, logged in as `user` (who must exist and may use `vhost`)."""
    loop = asyncio.get_running_loop()
    link = AmqpLink(user, "", vhost, connection_name, heartbeat_s=0)
    server = AMQPProtocol(node)
    server.conn.trusted_user = user
    pipe = LocalPipe(loop)
    pipe.connect(link, server)
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(link.ready)
    except TimeoutError:
        pipe.close()
        raise LinkClosed("timed out opening a connection to the local node") from None
    except LinkClosed as exc:
        raise LinkClosed(f"local node: {exc}", exc.code) from None
    return link


__all__ = ["LocalPipe", "open_local"]
