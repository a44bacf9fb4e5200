"""The management listener's socket: a connection cap, an inactivity watchdog, quiet client errors.

Owns: `ListenerLimits` (the bounds of the listener, from `management.tcp.*`), `GuardedSite` (the aiohttp
site that accepts connections through `ConnectionGuard`), `ConnectionGuard` (the protocol factory: at
most `max_connections` open at once, each watched for silence) and `handler_args` (what the aiohttp
request handlers get: the request timeout and a logger that keeps client errors at DEBUG).

Rules (docs/security.md, "Management listener"; the keys are RabbitMQ's, the semantics Cowboy's):
- request_timeout (default 5 s, Cowboy's): a connection has this long from its opening, or from the end
  of the previous response, to send a whole request head (request line and headers); else it is closed.
  This is aiohttp's keep-alive timer, which runs from the connection's start and only while no request
  is being handled: silent sockets, slowly dripped headers and idle keep-alive connections all end there.
- idle_timeout: the longest pause while a request body arrives (intake.py answers 408).
- inactivity_timeout: a connection on which nothing at all arrives for this long is closed, whatever it
  is doing (a handler stuck behind a client that went away, a reply written to a reader that stopped).
- max_connections: one more connection than this is accepted and closed at once (a warning at most
  every 10 s), so held descriptors stay bounded and AMQP clients can still log in. The default is 1024
  (ranch's, as RabbitMQ), or a quarter of the process's descriptor limit when that is lower.
- max_connections_per_source: one source address may hold at most this many (default a quarter of
  max_connections); one more from it is closed at once, so one address cannot take the whole listener.
- HTTPS: a connection is counted (both caps) at the accept, before its TLS handshake, which has its own
  timeout (`ssl_handshake_timeout`, 5 s): runtime/tls_accept.py.
- A malformed request (bad request line, header or chunk) is the client's error: logged at DEBUG as one
  line (its class and status, never its text, which could carry an Authorization header), no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hutch.core.logsafe import LogThrottle
from hutch.runtime import listen
from hutch.runtime.tls_accept import TlsAccept

if TYPE_CHECKING:
    from collections.abc import Callable

    from hutch.config import Config

log = logging.getLogger("hutch.mgmt")
DEFAULT_MAX_CONNECTIONS = 1024
REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    """Invariant: every timeout and the cap are positive."""

    request_timeout_s: float
    idle_timeout_s: float
    inactivity_timeout_s: float
    max_connections: int
    max_body_bytes: int
    max_connections_per_source: int = DEFAULT_MAX_CONNECTIONS // 4
    tls_handshake_timeout_s: float = 5.0

    @classmethod
    def from_config(cls, cfg: Config) -> ListenerLimits:
        cap = cfg.management_max_connections
        cap = cap if cap is not None else default_max_connections()
        per_source = cfg.management_max_connections_per_source
        return cls(cfg.management_request_timeout_ms / 1000, cfg.management_idle_timeout_ms / 1000,
                   cfg.management_inactivity_timeout_ms / 1000, cap, cfg.management_max_body_bytes,
                   per_source if per_source is not None else max(1, cap // 4),
                   cfg.ssl_handshake_timeout_ms / 1000)


def default_max_connections() -> int:
    """1024, or a quarter of the soft descriptor limit when that is lower (AMQP needs the rest)."""
    return listen.descriptor_share(DEFAULT_MAX_CONNECTIONS)


# -- logging ----------------------------------------------------------------------------------------


class _ClientErrorsQuiet(logging.LoggerAdapter[logging.Logger]):
    """The request handlers' logger: a client's malformed request is one DEBUG line without its text;
    anything else (a bug) keeps its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.debug("management listener: malformed HTTP request (%s, status %s) from %s",
                              type(exc_info).__name__, exc_info.code or 400, args[0] if args else "?")
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


def handler_args(limits: ListenerLimits) -> dict[str, Any]:
    """Keyword arguments of aiohttp's request handlers (through `web.AppRunner`)."""
    return {
        "keepalive_timeout": limits.request_timeout_s,  # the request timeout (see the rules)
        "logger": _ClientErrorsQuiet(logging.getLogger("hutch.mgmt.http"), {}),
    }


# -- the connection guard ---------------------------------------------------------------------------


class _Refused(asyncio.Protocol):
    """A connection past the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Watched(asyncio.Protocol):
    """Forwards a connection's events to aiohttp's request handler, and closes the connection when
    nothing has arrived for the inactivity timeout. One timer per connection, re-armed lazily. Counted
    by its guard from the accept (`connection_made`) to `connection_lost`; on HTTPS it sits behind
    `TlsAccept`, so it is counted before the TLS handshake and the handler sees the TLS transport."""

    __slots__ = ("_guard", "_handler", "_last_rx", "_made", "_source", "_timer", "_tls", "_transport")

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol, tls: bool = False) -> None:
        self._guard = guard
        self._handler = handler
        self._tls = tls
        self._made = False  # the handler has its transport
        self._source: str | None = None  # set while counted by the guard
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        if not self._guard.admit(source):
            transport.close()
            return
        self._source = source
        self._transport = transport
        self._last_rx = self._guard.loop.time()
        self._timer = self._guard.loop.call_later(self._guard.limits.inactivity_timeout_s, self._check)
        if not self._tls:
            self._ready(transport)

    def tls_ready(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._ready(transport)

    def _ready(self, transport: asyncio.BaseTransport) -> None:
        self._made = True
        self._handler.connection_made(transport)

    def _check(self) -> None:
        loop = self._guard.loop
        silent_for = loop.time() - self._last_rx
        timeout = self._guard.limits.inactivity_timeout_s
        if silent_for < timeout:
            self._timer = loop.call_later(timeout - silent_for, self._check)
            return
        self._timer = None
        log.debug("management listener: connection closed after %.1f s without data "
                  "(management.tcp.inactivity_timeout)", silent_for)
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._last_rx = self._guard.loop.time()
        if self._made:
            self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._made else None

    def pause_writing(self) -> None:
        if self._made:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._made:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        if self._source is not None:
            self._guard.closed(self._source)
            self._source = None
        if self._made:
            self._made = False
            self._handler.connection_lost(exc)


class ConnectionGuard:
    """The listener's protocol factory: aiohttp's handler behind `_Watched` (and `TlsAccept` on HTTPS),
    or `_Refused` past the cap. Invariant: `slots.held` counts the connections admitted and not yet
    lost."""

    def __init__(self, make_handler: Callable[[], asyncio.Protocol], limits: ListenerLimits,
                 loop: asyncio.AbstractEventLoop, tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        self.make_handler = make_handler
        self.limits = limits
        self.loop = loop
        self.tls = tls
        self.slots = listen.SourceSlots(limits.max_connections, limits.max_connections_per_source)
        self._refusals_log = LogThrottle(1, REFUSAL_LOG_INTERVAL_S)

    @property
    def open_connections(self) -> int:
        return self.slots.held

    @property
    def refused(self) -> int:
        return self.slots.refused

    def __call__(self) -> asyncio.Protocol:
        if self.slots.held >= self.limits.max_connections:
            self.slots.refused += 1
            self._log_refusal("in all", "")
            return _Refused()
        if self.tls is None:
            return _Watched(self, self.make_handler())
        return TlsAccept(_Watched(self, self.make_handler(), tls=True), self.tls(), self.limits.tls_handshake_timeout_s)

    def admit(self, source: str) -> bool:
        """Count a connection from `source` at its accept, or refuse it (False) past either cap."""
        full = self.slots.admit(source)
        if full is not None:
            self._log_refusal(full, source)
        return full is None

    def closed(self, source: str) -> None:
        self.slots.release(source)

    def _log_refusal(self, full: str, source: str) -> None:
        left_out = self._refusals_log.admit(self.loop.time())
        if left_out is None:
            return
        if full == "per source":
            log.warning("management listener: %d connections open from %s, new ones from it are closed "
                        "(management.tcp.max_connections_per_source; %d refused so far)",
                        self.slots.per_source.get(source, 0), source, self.slots.refused)
        else:
            log.warning("management listener: %d connections open, new ones are closed "
                        "(management.tcp.max_connections; %d refused so far)", self.slots.held, self.slots.refused)


class GuardedSite(web.BaseSite):
    """A TCP site of `runner` whose connections go through a `ConnectionGuard` (aiohttp's `TCPSite`
    passes its runner's server to the event loop directly, with no place for a cap or a watchdog)."""

    __slots__ = ("_host", "_limits", "_port", "_tls")

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, limits: ListenerLimits,
                 ssl_context: Callable[[], ssl.SSLContext] | None = None) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limits = limits
        # HTTPS (management.ssl.*): the live context at each accept (a reload swaps it); the TLS handshake
        # is bounded by ssl_handshake_timeout
        self._tls = ssl_context

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{listen.display_host(self._host or '')}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = ConnectionGuard(server, self._limits, loop, self._tls)  # HTTPS: TLS after the accept
        self._server = await listen.create_server(loop, guard, self._host or "", self._port,
                                                  backlog=self._backlog, reuse_address=True)


__all__ = ["ConnectionGuard", "GuardedSite", "ListenerLimits", "default_max_connections", "handler_args"]
