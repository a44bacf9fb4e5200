"""The AMQP 0-9-1 client a shovel uses for each of its two sides, on hutch's sans-I/O codec.

Owns: `AmqpLink` (one connection with one channel: the handshake as PLAIN, one RPC at a time, publisher
confirms, a consumer's deliveries assembled from method + header + body frames, acks, heartbeats, write
flow control) and `open_link` (a link to a remote broker over TCP or TLS, or to this node in-process
through `LocalPipe`).

Rules:
- `data_received` walks every complete frame synchronously (no task per frame or message); a delivery
  is handed to `on_delivery` when its last body frame arrives; confirms to `on_confirm(tag, multiple,
  ack)`; anything that ends the link (socket loss, connection.close, channel.close outside an RPC, a
  protocol error) resolves `closed` with a `LinkClosed` once and calls `on_lost`.
- Everything is bounded: frames by the negotiated frame_max, a body by the size its header declared and
  by `max_body_bytes`; the unsent output by the transport's write buffer (the caller watches
  `write_paused` and stops reading its source, so a slow destination slows the source).
- Heartbeats: sent every heartbeat/2 s; a peer silent for two heartbeat periods is dead (the link fails).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, cast

from hutch.amqp import spec
from hutch.amqp.errors import AMQPError
from hutch.amqp.frames import HEARTBEAT_FRAME, FrameReader, content_frames, method_frame
from hutch.amqp.uri import AmqpUri

PRE_TUNE_FRAME_MAX = 131072
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = 1 << 18
_BODY_SIZE = struct.Struct(">Q")
CHANNEL = 1

DeliveryHandler = Callable[[int, bool, str, str, bytes, bytes], None]  # tag, redelivered, exchange, key, props, body
ConfirmHandler = Callable[[int, bool, bool], None]  # tag, multiple, ack


class LinkClosed(Exception):
    """The link is gone; `code` is the AMQP reply code (0 for socket errors)."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


class AmqpLink(asyncio.Protocol):
    """One client connection with channel 1 open once `ready` resolves."""

    def __init__(self, username: str, password: str, vhost: str, connection_name: str, heartbeat_s: int = 60,
                 max_body_bytes: int = 128 << 20) -> None:
        self.loop = asyncio.get_running_loop()
        self.username, self.password, self.vhost = username, password, vhost
        self.connection_name = connection_name
        self.wanted_heartbeat_s = heartbeat_s
        self.max_body_bytes = max_body_bytes
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.closed: asyncio.Future[LinkClosed] = self.loop.create_future()
        self.reader = FrameReader(PRE_TUNE_FRAME_MAX)
        self.frame_max = PRE_TUNE_FRAME_MAX
        self.heartbeat_s = 0
        self.write_paused = False
        self.on_delivery: DeliveryHandler | None = None
        self.on_confirm: ConfirmHandler | None = None
        self.on_lost: Callable[[LinkClosed], None] | None = None
        self.on_writable: Callable[[], None] | None = None
        self.on_cancelled: Callable[[], None] | None = None
        self.next_publish_seq = 1  # the delivery tag of the next publish in confirm mode
        self.channel_reopenable = False  # channel 1 was closed by the broker in answer to an RPC
        self._rpc: tuple[tuple[type, ...], asyncio.Future[Any]] | None = None
        self._rpc_lock = asyncio.Lock()  # RPCs from more than one task (setup, a federation link's rebinding)
        self.server_properties: dict[str, Any] = {}
        self._content: tuple[int, bool, str, str] | None = None  # the delivery whose content is arriving
        self._props = b""
        self._body: list[bytes] = []
        self._body_left = 0
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._heard = True
        self._silent_halves = 0  # heartbeat half-periods in a row without a byte from the peer

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = self.transport = cast(asyncio.Transport, transport)
        stream.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        stream.write(spec.PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closing and exc is None:
            self._fail(LinkClosed("connection closed", 200))
        else:
            self._fail(LinkClosed(f"connection lost: {exc or 'closed by the peer'}"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_writable is not None:
            self.on_writable()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        self.reader.feed(data)
        try:
            for ftype, channel, payload in self.reader.frames():
                if ftype == spec.FRAME_METHOD:
                    self._method(channel, spec.decode_method(payload))
                elif ftype == spec.FRAME_HEADER:
                    self._header(payload)
                elif ftype == spec.FRAME_BODY:
                    self._body_frame(payload)
                if self.closed.done():
                    return
        except (AMQPError, LinkClosed, ValueError, struct.error) as exc:  # a malformed frame from the peer
            self.fail(LinkClosed(f"protocol error: {exc}", getattr(exc, "code", 0)))

    # -- frames -------------------------------------------------------------------------------------
    def _method(self, channel: int, m: spec.Method) -> None:
        handler = _CONNECTION.get(type(m))
        if handler is not None:
            handler(self, m)
            return
        if isinstance(m, spec.Channel.Close):
            self.send(spec.Channel.CloseOk())
            err = LinkClosed(f"channel closed by the broker: {m.reply_code} {m.reply_text}", m.reply_code)
            rpc, self._rpc = self._rpc, None
            if rpc is not None and not rpc[1].done():  # the RPC's error: the caller may open the channel again
                self.channel_reopenable = True
                rpc[1].set_exception(err)
            else:
                self.fail(err)
            return
        if isinstance(m, spec.Channel.OpenOk) and not self.ready.done():
            self.ready.set_result(None)
            return
        if isinstance(m, spec.Basic.Deliver):
            self._content = (m.delivery_tag, m.redelivered, m.exchange, m.routing_key)
            return
        if isinstance(m, spec.Basic.Ack | spec.Basic.Nack):
            if self.on_confirm is not None:
                self.on_confirm(m.delivery_tag, m.multiple, isinstance(m, spec.Basic.Ack))
            return
        if isinstance(m, spec.Basic.Cancel):
            if self.on_cancelled is not None:
                self.on_cancelled()
            return
        rpc = self._rpc
        if rpc is not None and isinstance(m, rpc[0]):
            self._rpc = None
            if not rpc[1].done():
                rpc[1].set_result(m)
        # basic.return and others: a shovel publishes without mandatory, so nothing else is expected

    def _header(self, payload: bytes) -> None:
        if self._content is None:
            raise LinkClosed("content header without a delivery", 505)
        if len(payload) < 14:
            raise LinkClosed("content header frame too short", 501)
        body_size = _BODY_SIZE.unpack_from(payload, 4)[0]
        if body_size > self.max_body_bytes:
            raise LinkClosed(f"message body of {body_size} bytes is over the limit", 501)
        self._props = payload[12:]
        self._body = []
        self._body_left = body_size
        if body_size == 0:
            self._deliver()

    def _body_frame(self, payload: bytes) -> None:
        if self._content is None or len(payload) > self._body_left:
            raise LinkClosed("unexpected content body", 505)
        self._body.append(payload)
        self._body_left -= len(payload)
        if self._body_left == 0:
            self._deliver()

    def _deliver(self) -> None:
        assert self._content is not None
        tag, redelivered, exchange, key = self._content
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._content, self._body = None, []
        if self.on_delivery is not None:
            self.on_delivery(tag, redelivered, exchange, key, self._props, body)

    # -- the handshake ------------------------------------------------------------------------------
    def _on_start(self, m: Any) -> None:
        if b"PLAIN" not in m.mechanisms.split():
            self.fail(LinkClosed(f"the broker does not offer PLAIN (offers {m.mechanisms!r})"))
            return
        self.server_properties = m.server_properties or {}
        response = b"\0" + self.username.encode() + b"\0" + self.password.encode()
        props = {"product": "hutch shovel", "connection_name": self.connection_name,
                 "capabilities": {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                                  "authentication_failure_close": True, "connection.blocked": True}}
        self.send(spec.Connection.StartOk(client_properties=props, mechanism="PLAIN", response=response,
                                          locale="en_US"), 0)

    def _on_tune(self, m: Any) -> None:
        self.frame_max = m.frame_max or PRE_TUNE_FRAME_MAX
        self.reader.frame_max = self.frame_max
        wanted = self.wanted_heartbeat_s
        self.heartbeat_s = min(wanted, m.heartbeat) if m.heartbeat and wanted else 0
        self.send(spec.Connection.TuneOk(channel_max=m.channel_max, frame_max=m.frame_max,
                                         heartbeat=self.heartbeat_s), 0)
        self.send(spec.Connection.Open(virtual_host=self.vhost), 0)
        if self.heartbeat_s:
            self._timer = self.loop.call_later(self.heartbeat_s / 2, self._beat)

    def _on_open_ok(self, m: Any) -> None:
        self.send(spec.Channel.Open())

    def _on_close(self, m: Any) -> None:
        self.send(spec.Connection.CloseOk(), 0)
        self.fail(LinkClosed(f"{m.reply_code} {m.reply_text}", m.reply_code))

    def _on_close_ok(self, m: Any) -> None:
        if self.transport is not None:
            self.transport.close()

    def _beat(self) -> None:
        """Every heartbeat/2 s: send a heartbeat; fail once the peer was silent for two heartbeats."""
        if self.closed.done() or self.transport is None:
            return
        self._silent_halves = 0 if self._heard else self._silent_halves + 1
        self._heard = False
        if self._silent_halves >= 4:
            self.fail(LinkClosed("missed heartbeats from the broker"))
            return
        self.transport.write(HEARTBEAT_FRAME)
        self._timer = self.loop.call_later(self.heartbeat_s / 2, self._beat)

    # -- sending ------------------------------------------------------------------------------------
    def send(self, method: spec.Method, channel: int = CHANNEL) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(method_frame(channel, method))

    async def call(self, method: spec.Method, *replies: type) -> Any:
        """A synchronous method on channel 1 (one at a time); raises LinkClosed when the link fails first."""
        async with self._rpc_lock:
            return await self._call(method, replies)

    async def _call(self, method: spec.Method, replies: tuple[type, ...]) -> Any:
        assert self._rpc is None, "one RPC at a time"
        if self.closed.done():
            raise self.closed.result()
        future: asyncio.Future[Any] = self.loop.create_future()
        self._rpc = (replies, future)
        self.send(method)
        done, _ = await asyncio.wait((future, self.closed), return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            if future.exception() is None:
                self.channel_reopenable = False
            return future.result()
        raise self.closed.result()

    def publish(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes) -> int:
        """basic.publish with its content; returns its confirm tag (meaningful in confirm mode)."""
        assert self.transport is not None
        out = [method_frame(CHANNEL, spec.Basic.Publish(exchange=exchange, routing_key=routing_key))]
        out += content_frames(CHANNEL, 60, props_raw, body, self.frame_max)
        self.transport.writelines(out)
        seq = self.next_publish_seq
        self.next_publish_seq += 1
        return seq

    def ack(self, tag: int, multiple: bool = False) -> None:
        self.send(spec.Basic.Ack(delivery_tag=tag, multiple=multiple))

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- failure and close --------------------------------------------------------------------------
    def _fail(self, exc: LinkClosed) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        first = not self.closed.done()
        if first:
            self.closed.set_result(exc)
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: open_link reports it
        if first and self.on_lost is not None and not self._closing:
            self.on_lost(exc)

    def fail(self, exc: LinkClosed) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.close()

    async def close(self, timeout_s: float = 3.0) -> None:
        """connection.close / close-ok, then the socket; never raises."""
        if self.closed.done() or self.transport is None:
            if self.transport is not None:
                self.transport.close()
            return
        self._closing = True
        self.send(spec.Connection.Close(reply_code=200, reply_text="shovel stopped", class_id=0, method_id=0), 0)
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout_s)
        except TimeoutError:
            self.transport.abort()
            self._fail(LinkClosed("connection closed", 200))


_CONNECTION: dict[type, Callable[[AmqpLink, Any], None]] = {
    spec.Connection.Start: AmqpLink._on_start,
    spec.Connection.Tune: AmqpLink._on_tune,
    spec.Connection.OpenOk: AmqpLink._on_open_ok,
    spec.Connection.Close: AmqpLink._on_close,
    spec.Connection.CloseOk: AmqpLink._on_close_ok,
    spec.Connection.Blocked: lambda link, m: None,
    spec.Connection.Unblocked: lambda link, m: None,
}


async def open_remote(uri: AmqpUri, connection_name: str) -> AmqpLink:
    """A link to a broker over TCP (or TLS for amqps); raises LinkClosed with the reason."""
    loop = asyncio.get_running_loop()
    link: AmqpLink | None = None
    try:
        async with asyncio.timeout(uri.connect_timeout_s):
            ctx = uri.ssl_context()
            tls: dict[str, Any] = {"ssl": ctx, "server_hostname": uri.tls_server_name} if ctx is not None else {}
            link = AmqpLink(uri.username, uri.password, uri.vhost, connection_name, uri.heartbeat_s or 60)
            made = link
            await loop.create_connection(lambda: made, uri.host, uri.port, **tls)
            await asyncio.shield(link.ready)
    except TimeoutError:
        if link is not None and link.transport is not None:
            link.transport.abort()
        raise LinkClosed(f"timed out connecting to {uri.display()}") from None
    except OSError as exc:
        raise LinkClosed(f"cannot connect to {uri.display()}: {exc.strerror or exc}") from None
    except LinkClosed as exc:
        raise LinkClosed(f"{uri.display()}: {exc}", exc.code) from None
    return link


__all__ = ["AmqpLink", "LinkClosed", "open_remote"]
