"""A raw AMQP 0-9-1 client on `asyncio.Protocol`, for the benchmark's producers, consumers and setup.

Owns: `AmqpClient` (connection handshake, one-at-a-time RPCs, channel and connection close handling,
write flow control, heartbeats) and `connect()`. Methods are encoded and decoded with the project's
sans-I/O codec (`hutch.amqp.spec`, `hutch.amqp.frames`).

Rules:
- `data_received` walks every complete frame of the read synchronously: no task, no coroutine, no
  per-frame copy. Frames are addressed by (buffer, start, end) offsets; a method frame whose 4-byte
  class/method index is in `fast_methods` goes to that handler with the offsets, any other method is
  decoded with `spec.decode_method`. (`hutch.amqp.frames.FrameReader` copies every payload into a new
  bytes object and yields it from a generator; the hot paths need two integers out of three frames, so
  they read them in place. The frame checks are the same: size against frame_max, the end octet.)
- Only the bytes after the last complete frame are kept between reads (at most one frame: bounded by
  frame_max).
- Tune: channel_max and frame_max are the server's (frame_max lowered to the URI's if it asks for less);
  heartbeat is the URI's (default 0, off). With heartbeats on, one is sent every heartbeat/2 seconds.
- A failure (socket error, protocol error, Connection.Close from the server, a channel closed outside
  an RPC) resolves `closed` with an `AmqpClosed`; subclasses learn of it through `on_failure`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, TypeVar, cast

from hutch.amqp import spec
from hutch.amqp.errors import AMQPError, FrameError
from hutch.amqp.frames import HEARTBEAT_FRAME, method_frame
from hutch.amqp.spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD

from .options import AmqpUri

_HDR = struct.Struct(">BHI")
_INDEX = struct.Struct(">I")
PRE_TUNE_FRAME_MAX = 131072  # bound on frames before Tune (the server's Start with its properties)
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = 1 << 18
CLIENT_PROPERTIES = {
    "product": "hutch-perf",
    "information": "AMQP load generator, https://github.com/ (hutch)",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
    },
}

FastHandler = Callable[[Any, int, int], None]


class AmqpClosed(Exception):
    """The connection or a channel is gone; `code` is the AMQP reply code (0 for socket errors)."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


def method_index(cls: Any) -> int:
    return int(cls.INDEX)


class AmqpClient(asyncio.Protocol):
    """One AMQP connection. Subclasses add hot paths through `fast_methods`, `on_header`, `on_body`."""

    def __init__(self, uri: AmqpUri) -> None:
        self.uri = uri
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.closed: asyncio.Future[AmqpClosed] = self.loop.create_future()
        self.frame_max = PRE_TUNE_FRAME_MAX
        self.channel_max = 0
        self.heartbeat_s = 0
        self.server_properties: dict[str, Any] = {}
        self.blocked = False
        self.write_paused = False
        self.fast_methods: dict[int, FastHandler] = {}
        self._rest: bytes | bytearray = b""
        self._rpc: tuple[int, tuple[type, ...], asyncio.Future[Any]] | None = None
        self._closing = False
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self.last_activity_ns = 0  # CLOCK_MONOTONIC of the last message sent, confirmed or received

    async def setup(self) -> None:
        """Open channel 1 (subclasses add their own declarations)."""
        await self.open_channel(1)

    def stop(self) -> None:
        """Stop sending and counting (subclasses)."""

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's TCPTransport is not registered as an asyncio.Transport)
        stream = self.transport = cast(asyncio.Transport, transport)
        stream.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        stream.write(spec.PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if self._closing and exc is None:
            self._resolve_closed(AmqpClosed("connection closed", 200))
        elif not self.ready.done():
            reason = str(exc) if exc else "the server closed the connection during the handshake"
            self._resolve_closed(AmqpClosed(reason))
        else:
            self._resolve_closed(AmqpClosed(f"connection lost: {exc or 'closed by the server'}"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.on_writable()

    def data_received(self, data: bytes) -> None:
        if self._rest:
            buf: bytes | bytearray = self._rest + data
        else:
            buf = data
        try:
            pos = self.scan(buf)
        except (AMQPError, AmqpClosed) as exc:
            self.fail(AmqpClosed(f"protocol error: {exc}", getattr(exc, "code", 0)))
            return
        self._rest = buf[pos:] if pos < len(buf) else b""

    # -- frame walk ---------------------------------------------------------------------------------

    def scan(self, buf: bytes | bytearray) -> int:
        """Dispatch every complete frame in `buf`; return the offset of the first incomplete one."""
        pos = 0
        n = len(buf)
        unpack_hdr = _HDR.unpack_from
        unpack_index = _INDEX.unpack_from
        fast = self.fast_methods
        frame_max = self.frame_max
        while n - pos >= 8:
            ftype, channel, size = unpack_hdr(buf, pos)
            end = pos + 7 + size
            if end >= n:
                if size + 8 > frame_max:
                    raise FrameError(f"frame of {size + 8} bytes exceeds frame_max {frame_max}")
                break
            if buf[end] != FRAME_END:
                raise FrameError(f"bad frame end marker {buf[end]:#x}")
            start = pos + 7
            if ftype == FRAME_METHOD:
                handler = fast.get(unpack_index(buf, start)[0])
                if handler is not None:
                    handler(buf, start, end)
                else:
                    self.on_method(channel, spec.decode_method(bytes(buf[start:end])))
            elif ftype == FRAME_HEADER:
                self.on_header(buf, start, end)
            elif ftype == FRAME_BODY:
                self.on_body(buf, start, end)
            elif ftype != FRAME_HEARTBEAT:
                raise FrameError(f"unknown frame type {ftype}")
            pos = end + 1
        return pos

    def on_header(self, buf: Any, start: int, end: int) -> None:
        """A content header frame (returned messages on a producer): ignored unless overridden."""

    def on_body(self, buf: Any, start: int, end: int) -> None:
        """A content body frame: ignored unless overridden."""

    def on_writable(self) -> None:
        """The transport drained below its low-water mark."""

    def on_failure(self, exc: AmqpClosed) -> None:
        """The connection failed after the handshake (hook for producers/consumers)."""

    def on_other_method(self, channel: int, method: spec.Method) -> None:
        """A method no one waited for (Basic.Return, Basic.Cancel...)."""

    # -- methods ------------------------------------------------------------------------------------

    def on_method(self, channel: int, method: spec.Method) -> None:
        handler = _HANDSHAKE.get(type(method))
        if handler is not None:
            handler(self, method)
            return
        if isinstance(method, spec.Channel.Close):
            self.send(channel, spec.Channel.CloseOk())
            err = AmqpClosed(f"channel {channel} closed by the server: {method.reply_code} "
                             f"{method.reply_text}", method.reply_code)
            if self._rpc is not None and self._rpc[0] == channel:
                self._finish_rpc(err)
            else:
                self.fail(err)
            return
        rpc = self._rpc
        if rpc is not None and rpc[0] == channel and isinstance(method, rpc[1]):
            self._finish_rpc(method)
            return
        self.on_other_method(channel, method)

    def _on_start(self, method: Any) -> None:
        if b"PLAIN" not in method.mechanisms.split():
            self.fail(AmqpClosed(f"the server does not offer PLAIN (offers {method.mechanisms!r})"))
            return
        self.server_properties = method.server_properties or {}
        response = b"\0" + self.uri.username.encode() + b"\0" + self.uri.password.encode()
        self.send(0, spec.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism="PLAIN",
                                             response=response, locale="en_US"))

    def _on_tune(self, method: Any) -> None:
        frame_max = method.frame_max
        wanted = self.uri.frame_max_bytes
        if wanted and (not frame_max or wanted < frame_max):
            frame_max = wanted
        self.frame_max = frame_max or PRE_TUNE_FRAME_MAX
        self.channel_max = method.channel_max
        self.heartbeat_s = self.uri.heartbeat_s
        self.send(0, spec.Connection.TuneOk(channel_max=method.channel_max, frame_max=frame_max,
                                            heartbeat=self.heartbeat_s))
        self.send(0, spec.Connection.Open(virtual_host=self.uri.vhost))
        if self.heartbeat_s:
            self._heartbeat_timer = self.loop.call_later(self.heartbeat_s / 2, self._send_heartbeat)

    def _on_open_ok(self, method: Any) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def _on_close(self, method: Any) -> None:
        self.send(0, spec.Connection.CloseOk())
        self.fail(AmqpClosed(f"{method.reply_code} {method.reply_text}", method.reply_code))

    def _on_close_ok(self, method: Any) -> None:
        if self.transport is not None:
            self.transport.close()

    def _on_blocked(self, method: Any) -> None:
        self.blocked = True

    def _on_unblocked(self, method: Any) -> None:
        self.blocked = False

    def _send_heartbeat(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HEARTBEAT_FRAME)
            self._heartbeat_timer = self.loop.call_later(self.heartbeat_s / 2, self._send_heartbeat)

    # -- sending and RPCs ---------------------------------------------------------------------------

    def send(self, channel: int, method: spec.Method) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(method_frame(channel, method))

    async def call(self, channel: int, method: spec.Method, *replies: type) -> Any:
        """Send a synchronous method and wait for one of `replies` (or a failure) on that channel."""
        assert self._rpc is None, "one RPC at a time"
        if self.closed.done():
            raise self.closed.result()
        future: asyncio.Future[Any] = self.loop.create_future()
        self._rpc = (channel, replies, future)
        self.send(channel, method)
        result = await future
        if isinstance(result, AmqpClosed):
            raise result
        return result

    def _finish_rpc(self, result: Any) -> None:
        rpc, self._rpc = self._rpc, None
        if rpc is not None and not rpc[2].done():
            rpc[2].set_result(result)

    async def open_channel(self, channel: int = 1) -> None:
        await self.call(channel, spec.Channel.Open(), spec.Channel.OpenOk)

    # -- failure and close --------------------------------------------------------------------------

    def _resolve_closed(self, exc: AmqpClosed) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: a failed handshake is reported by connect()
        self._finish_rpc(exc)

    def fail(self, exc: AmqpClosed) -> None:
        """Tear the connection down after an error and tell the subclass (once)."""
        first = not self.closed.done()
        self._resolve_closed(exc)
        if self.transport is not None:
            self.transport.close()
        if first and self.ready.done() and not self._closing:
            self.on_failure(exc)

    async def close(self, timeout_s: float = 3.0) -> None:
        """Connection.Close / CloseOk, then the socket; never raises."""
        if self.closed.done() or self.transport is None:
            return
        self._closing = True
        self.send(0, spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout_s)
        except TimeoutError:
            self.transport.abort()


_HANDSHAKE: dict[type, Callable[[AmqpClient, Any], None]] = {
    spec.Connection.Start: AmqpClient._on_start,
    spec.Connection.Tune: AmqpClient._on_tune,
    spec.Connection.OpenOk: AmqpClient._on_open_ok,
    spec.Connection.Close: AmqpClient._on_close,
    spec.Connection.CloseOk: AmqpClient._on_close_ok,
    spec.Connection.Blocked: AmqpClient._on_blocked,
    spec.Connection.Unblocked: AmqpClient._on_unblocked,
}


class CannotConnect(Exception):
    """Connecting or the AMQP handshake failed; the text is the reason."""


ClientT = TypeVar("ClientT", bound=AmqpClient)


async def connect(uri: AmqpUri, factory: Callable[[], ClientT]) -> ClientT:
    """Open a TCP connection and complete the AMQP handshake; raises CannotConnect with the reason."""
    loop = asyncio.get_running_loop()
    client: ClientT | None = None
    try:
        async with asyncio.timeout(uri.connect_timeout_s):
            ctx = uri.ssl_context()  # amqps: TLS, verified against the URI's cacertfile (or the system's CAs)
            tls: dict[str, Any] = {"ssl": ctx, "server_hostname": uri.tls_server_name} if ctx is not None else {}
            _, client = await loop.create_connection(factory, uri.host, uri.port, **tls)
            await asyncio.shield(client.ready)
    except (TimeoutError, OSError, AmqpClosed) as exc:
        if client is not None and client.transport is not None:
            client.transport.abort()
        if isinstance(exc, TimeoutError):
            raise CannotConnect(f"timed out after {uri.connect_timeout_s:g} s") from None
        if isinstance(exc, OSError):
            raise CannotConnect(exc.strerror or str(exc)) from None
        raise CannotConnect(str(exc)) from None
    return client
