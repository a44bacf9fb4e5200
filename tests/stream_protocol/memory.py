"""The stream-protocol connection driven in memory, as tests/session/memory.py drives the AMQP one.

`StreamPair` wires a real `StreamConnection` to a real broker `Node` (tests/session/memory.make_node),
its stream queue type (streams in the node's data directory) as the catalog, a `MemoryTransport` and a
`ManualLoopClock`; the client side speaks through hutch.streamproto's records (the codec is checked
against rstream's in tests/codec/test_streamproto.py). The login check and the handles' syncs run on
the event loop, so tests are coroutines and wait with `until`.
"""

from __future__ import annotations

from typing import Any

from hutch.runtime.broker.node import Node
from hutch.runtime.stream_session.catalog import QueueCatalog
from hutch.runtime.stream_session.connection import StreamConnection
from hutch.runtime.stream_session.hub import StreamHub
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code, Key
from hutch.streamproto.framer import FrameReader
from session.memory import ManualLoopClock, MemoryTransport, SessionPair


class StreamMemoryTransport(MemoryTransport):
    """The `StreamTransport` port in memory: `writelines` writes the parts in order."""

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        for part in parts:
            self.write(bytes(part))


def make_hub(node: Node) -> StreamHub:
    return StreamHub(node, QueueCatalog(node))


class StreamPair:
    def __init__(self, hub: StreamHub, peer: str = "127.0.0.1") -> None:
        self.hub = hub
        self.clock = ManualLoopClock()
        self.transport = StreamMemoryTransport()
        self.conn = StreamConnection(hub, self.clock)
        self.conn.connection_made(self.transport, (peer, 50000), ("127.0.0.1", 5552))
        self._reader = FrameReader(0)
        self._read = 0
        self.corr = 0

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    feed = SessionPair.feed  # bytes in, as its socket callback would; then the call_soon work

    def send(self, *cmds: c.Command, one_byte_at_a_time: bool = False) -> None:
        self.feed(b"".join(c.encode(cmd) for cmd in cmds), one_byte_at_a_time)

    def received(self) -> list[c.Command]:
        self.clock.run_soon()
        data = bytes(self.transport.written[self._read:])
        self._read += len(data)
        self._reader.feed(data)
        return [c.decode(f) for f in self._reader.frames()]

    until = SessionPair.until  # let the loop run (logins, syncs) until a condition holds

    async def expect(self, count: int = 1, timeout: float = 5.0) -> list[c.Command]:
        """Let the loop run until the server has sent `count` more frames; returns them."""
        got: list[c.Command] = []

        def enough() -> bool:
            got.extend(self.received())
            return len(got) >= count
        await self.until(enough, timeout)
        return got

    async def open(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                   one_byte_at_a_time: bool = False, heartbeat_s: int = 0) -> list[c.Command]:
        self.send(c.PeerProperties(self.next_corr(), {"product": "test"}),
                  c.SaslHandshake(self.next_corr()),
                  c.SaslAuthenticate(self.next_corr(), "PLAIN", f"\0{user}\0{password}".encode()),
                  one_byte_at_a_time=one_byte_at_a_time)
        seen = await self.expect(4)
        tune = seen[-1]
        assert isinstance(tune, c.Tune)
        self.send(c.TuneResponse(tune.frame_max, heartbeat_s), c.Open(self.next_corr(), vhost),
                  one_byte_at_a_time=one_byte_at_a_time)
        return seen + await self.expect(1)

    async def request(self, cmd: Any) -> c.Command:
        self.send(cmd)
        replies = await self.expect(1)
        assert len(replies) == 1, replies
        return replies[0]

    async def create(self, stream: str, arguments: dict[str, str] | None = None) -> None:
        reply = await self.request(c.Create(self.next_corr(), stream, arguments or {}))
        assert reply == c.Response(Key.CREATE, self.corr, Code.OK), reply
