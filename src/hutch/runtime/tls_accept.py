"""Server-side TLS that starts after the accept: a TLS connection is the listener's from its first byte.

Owns: `TlsAccept`, the protocol a TLS listener (AMQP over TLS, management HTTPS, the cluster's TLS port)
hands the event loop instead of `create_server(ssl=…)`; `TlsApp`, what it asks of the protocol behind
it; `SlotGate`, the bound on connections in their handshake (a `listen.HandshakeGate`) for a listener
that has no cap of its own (AMQP and the stream protocol over TLS: `listen.handshake_slots`; past it a
new connection is closed at once).

With `ssl=` the loop runs the TLS handshake before the listener's protocol hears of the connection, so a
listener cannot count, cap or time a connection that is still in its handshake: 400 sockets that never
send a ClientHello held every descriptor of a node for the 60 s the handshake was allowed (issue 21,
finding 2). Here the listener's protocol is told at the accept and the handshake runs after it.

Rules:
- `TlsApp.connection_made(raw)` is called at the accept with the TCP transport, before any TLS byte: the
  listener counts the connection there and may refuse it by closing `raw` (nothing else may be done with
  it: no write, no read). Then the TLS handshake runs, bounded by `handshake_timeout_s`
  (`ssl_handshake_timeout`, RabbitMQ's 5 s by default); on success `tls_ready(tls)` gives the TLS
  transport, and from then on data, EOF and write pauses are forwarded.
- `connection_lost` is called exactly once for every `connection_made`: after a failed or timed-out
  handshake (the client never sees the application), a refusal, or the end of a TLS connection. So a
  count taken in `connection_made` and released in `connection_lost` is exact.
- A failed handshake (plain text on a TLS port, a certificate from another CA, a timeout) is logged at
  DEBUG only.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import ssl
from collections.abc import Callable
from typing import Protocol, cast

from hutch.runtime.listen import HandshakeGate, HeldSlot

log = logging.getLogger("hutch.tls")


class TlsApp(Protocol):
    """The listener's protocol behind `TlsAccept` (an asyncio.Protocol plus `tls_ready`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def tls_ready(self, transport: asyncio.Transport) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def eof_received(self) -> bool | None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


def _ssl_protocol_class(loop: asyncio.AbstractEventLoop) -> Callable[..., asyncio.BaseProtocol]:
    """The loop's own TLS protocol class (what `create_server(ssl=…)` builds at each accept)."""
    try:
        import uvloop.loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.sslproto.SSLProtocol
    if isinstance(loop, uvloop.Loop):
        ssl_protocol = uvloop.loop.SSLProtocol  # type: ignore[attr-defined]  # in uvloop, not in its stub
        return cast(Callable[..., asyncio.BaseProtocol], ssl_protocol)
    return asyncio.sslproto.SSLProtocol


class TlsAccept(asyncio.Protocol):
    """One accepted TCP connection of a TLS listener: told to `app` at once, then upgraded to TLS.

    The loop's TLS protocol is put in front of the TCP transport inside `connection_made`, before the
    loop starts reading (uvloop starts reading right after `connection_made` returns, whatever it was
    told, so `loop.start_tls` from a task could lose the ClientHello to this protocol). It then calls
    this object back as its application protocol: `connection_made(tls)` when the handshake is done."""

    __slots__ = ("_app", "_ctx", "_ended", "_open", "_raw", "_timeout_s")

    def __init__(self, app: TlsApp, ctx: ssl.SSLContext, handshake_timeout_s: float) -> None:
        self._app = app
        self._ctx = ctx
        self._timeout_s = handshake_timeout_s
        self._raw: asyncio.Transport | None = None  # set at the accept: the TLS layer calls us next
        self._open = False
        self._ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._raw is not None:  # the TLS layer: the handshake is done
            self._tls_up(cast(asyncio.Transport, transport))
            return
        raw = self._raw = cast(asyncio.Transport, transport)
        self._app.connection_made(raw)
        if raw.is_closing():  # refused by the listener (a cap): its connection_lost follows from the loop
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        tls_layer = _ssl_protocol_class(loop)(loop, self, self._ctx, waiter, server_side=True,
                                              server_hostname=None, ssl_handshake_timeout=self._timeout_s)
        raw.set_protocol(tls_layer)
        tls_layer.connection_made(raw)
        waiter.add_done_callback(self._handshake_done)

    def _handshake_done(self, waiter: asyncio.Future[None]) -> None:
        exc = None if waiter.cancelled() else waiter.exception()
        if exc is None and not waiter.cancelled():
            return  # connection_made(tls) came or comes from the TLS layer
        log.debug("TLS handshake from %s failed: %s", self._peer(), exc or "cancelled")
        if self._raw is not None and not self._raw.is_closing():
            self._raw.abort()
        self._end(exc if isinstance(exc, Exception) else None)

    def _peer(self) -> object:
        return self._raw.get_extra_info("peername") if self._raw is not None else None

    def _tls_up(self, tls: asyncio.Transport) -> None:
        if self._ended:
            tls.abort()
            return
        self._open = True
        self._app.tls_ready(tls)

    def data_received(self, data: bytes) -> None:
        if self._open:
            self._app.data_received(data)

    def eof_received(self) -> bool | None:
        return self._app.eof_received() if self._open else None

    def pause_writing(self) -> None:
        if self._open:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._open:
            self._app.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)  # the end of a TLS connection, a refusal at the accept, or a handshake cut short

    def _end(self, exc: Exception | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._open = False
        self._app.connection_lost(exc)


class SlotGate:
    """A `TlsApp` for a listener whose protocol knows nothing of TLS (AMQP over TLS): holds a handshake
    slot of `gate` from the accept until the handshake ends, then makes the listener's protocol with the
    TLS transport and forwards to it."""

    __slots__ = ("_app", "_make_app", "_slot")

    def __init__(self, make_app: Callable[[], asyncio.Protocol], gate: HandshakeGate) -> None:
        self._make_app = make_app
        self._slot = HeldSlot(gate)
        self._app: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._slot.take(transport)  # refused: the transport is closed, connection_lost follows

    def tls_ready(self, transport: asyncio.Transport) -> None:
        self._slot.release()
        self._app = self._make_app()
        self._app.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._app is not None:
            self._app.data_received(data)

    def eof_received(self) -> bool | None:
        return self._app.eof_received() if self._app is not None else None

    def pause_writing(self) -> None:
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._app is not None:
            self._app.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._slot.release()
        if self._app is not None:
            app, self._app = self._app, None
            app.connection_lost(exc)


__all__ = ["SlotGate", "TlsAccept", "TlsApp"]
