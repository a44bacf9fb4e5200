"""In-memory endpoints for the AMQP session, h11's `ConnectionPair` style: no socket, no transport.

`MemoryTransport` is the server connection's `Transport` port (bytes written are kept, reading is a
flag), `ManualLoopClock` its `LoopClock` port (time moves only when a test says so; `call_soon` callbacks
run when the test runs them), and `SessionPair` wires a real `AMQPConnection` to a real broker `Node`
(built from a `Config` as the server builds it, without listeners) and to a client side that speaks
through pamqp, an independent codec. The login check still runs in the event loop's executor, so
tests are coroutines.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from pamqp import commands, frame
from pamqp import header as pheader
from pamqp.body import ContentBody

from hutch.config import Config
from hutch.core.auth import AuthStore
from hutch.runtime.app import build_node
from hutch.runtime.broker.definitions import DefinitionStore
from hutch.runtime.broker.node import Node
from hutch.runtime.queue_types.classic.persistence import Persistence
from hutch.runtime.session.connection import AMQPConnection
from hutch.runtime.session.ports import MethodGate

PLAIN = "\x00guest\x00guest"
CLIENT_CAPABILITIES = {"publisher_confirms": True, "basic.nack": True, "connection.blocked": True,
                       "consumer_cancel_notify": True, "authentication_failure_close": True}


class MemoryTransport:
    """The `Transport` port in memory."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        self.written = bytearray()
        self.reading = True
        self.closed = False
        self.extra = extra or {}

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoopClock:
    """The `LoopClock` port: `advance(seconds)` fires due timers in order; `run_soon()` runs call_soon work."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._timers: list[tuple[float, int, _Timer, Callable[[], object]]] = []
        self._soon: list[Callable[[], object]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object]) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._timers, (self.now + delay, next(self._seq), timer, callback))
        return timer

    def call_soon(self, callback: Callable[[], object]) -> None:
        self._soon.append(callback)

    def run_soon(self) -> None:
        """Run the call_soon callbacks (and those they schedule) until none is left."""
        while self._soon:
            batch, self._soon = self._soon, []
            for callback in batch:
                callback()

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, timer, callback = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                callback()
            self.run_soon()
        self.now = end


def make_node(data_dir: str, durable: bool = False, **config: Any) -> Node:
    """A broker node as `serve()` builds one (configuration, auth store, vhosts), with no listener.
    `durable`: with its definitions store and message storage in `data_dir`, the group commit started
    on the running loop as `Node.start` starts it (call `close_node` at the end)."""
    config.setdefault("node_name", "memory@localhost")
    cfg = Config(data_dir=data_dir, **config)
    auth = AuthStore(scrypt_n=16)  # a cheap hash: the login itself is tested elsewhere
    auth.bootstrap(cfg.default_user, cfg.default_pass, cfg.default_vhost)
    if not durable:
        return build_node(cfg, auth=auth, monitor_resources=False)
    persistence = Persistence(data_dir)
    node = build_node(cfg, auth=auth, store=DefinitionStore(data_dir), persistence=persistence,
                      monitor_resources=False)
    node.recover_messages()
    persistence.sink.on_drained = node.queue_type("classic")._storage_drained  # as ClassicQueueType.start
    persistence.start(asyncio.get_running_loop())
    return node


async def close_node(node: Node) -> None:
    if node.persistence is not None:
        await node.persistence.close()


class SessionPair:
    """A client (pamqp frames) and a server `AMQPConnection`, connected by memory."""

    def __init__(self, node: Node, gate: MethodGate | None = None, peer: str = "127.0.0.1") -> None:
        self.node = node
        self.clock = ManualLoopClock()
        self.transport = MemoryTransport()
        self.conn = AMQPConnection(node, self.clock, gate)
        self.conn.connection_made(self.transport, (peer, 50000), ("127.0.0.1", 5672))
        self._read = 0

    # -- client to server --------------------------------------------------------------------------
    @staticmethod
    def encode(channel: int, *frames: Any) -> bytes:
        return b"".join(frame.marshal(f, channel) for f in frames)

    def feed(self, data: bytes, one_byte_at_a_time: bool = False) -> None:
        """Bytes from the client; the server handles them at once (as its socket callback would)."""
        if one_byte_at_a_time:
            for i in range(len(data)):
                self.conn.receive_data(data[i:i + 1])
        else:
            self.conn.receive_data(data)
        self.clock.run_soon()

    def send(self, channel: int, *frames: Any, one_byte_at_a_time: bool = False) -> None:
        self.feed(self.encode(channel, *frames), one_byte_at_a_time)

    def publish(self, channel: int, routing_key: str, body: bytes, exchange: str = "",
                properties: commands.Basic.Properties | None = None) -> bytes:
        props = properties or commands.Basic.Properties()
        chunk = (self.conn.frame_max or 131072) - 8
        pieces = [ContentBody(body[i:i + chunk]) for i in range(0, len(body), chunk)]
        return self.encode(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
                           pheader.ContentHeader(0, len(body), props), *pieces)

    # -- server to client --------------------------------------------------------------------------
    def received(self) -> list[tuple[int, Any]]:
        """Frames the server wrote since the last call, decoded by pamqp: (channel, frame)."""
        self.clock.run_soon()
        data = bytes(self.transport.written[self._read:])
        out = []
        pos = 0
        while pos < len(data):
            used, channel, value = frame.unmarshal(data[pos:])
            out.append((channel, value))
            pos += used
        self._read += pos
        return out

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Let the event loop run (the login check's executor, the group commit) and the manual clock's
        call_soon work until `predicate` holds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            self.clock.run_soon()
            if predicate():
                return
            assert asyncio.get_running_loop().time() < deadline, "condition not reached"
            await asyncio.sleep(0.001)

    # -- the handshake -------------------------------------------------------------------------------
    async def open(self, channel_max: int = 0, frame_max: int = 0, heartbeat: int = 0,
                   one_byte_at_a_time: bool = False) -> list[tuple[int, Any]]:
        """Protocol header to open-ok; returns every frame the server sent on the way."""
        seen: list[tuple[int, Any]] = []
        self.feed(frame.marshal(pheader.ProtocolHeader(), 0), one_byte_at_a_time)
        seen += self.received()
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "memory-test", "capabilities": CLIENT_CAPABILITIES},
            mechanism="PLAIN", response=PLAIN), one_byte_at_a_time=one_byte_at_a_time)
        await self.until(lambda: bool(self.transport.written[self._read:]))
        seen += self.received()
        tune = seen[-1][1]
        assert isinstance(tune, commands.Connection.Tune), seen
        self.send(0, commands.Connection.TuneOk(channel_max=channel_max or tune.channel_max,
                                                frame_max=frame_max or tune.frame_max, heartbeat=heartbeat),
                  commands.Connection.Open(virtual_host="/"), one_byte_at_a_time=one_byte_at_a_time)
        seen += self.received()
        assert isinstance(seen[-1][1], commands.Connection.OpenOk), seen
        return seen

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        assert [type(f) for _, f in self.received()] == [commands.Channel.OpenOk]
