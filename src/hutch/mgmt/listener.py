"""The management listener's socket: a connection cap, an inactivity watchdog, quiet client errors.

Owns: `ListenerLimits` (the bounds of the listener, from `management.tcp.*`), `GuardedSite` (the aiohttp
site that accepts connections through `ConnectionGuard`), `ConnectionGuard` (the protocol factory: at
most `max_connections` open at once, each watched for silence) and `handler_args` (what the aiohttp
request handlers get: the request timeout and a logger that keeps client errors at DEBUG).

Rules (docs/security.md, "Management listener"; the keys are RabbitMQ's, the semantics Cowboy's):
- request_timeout: a connection has this long from its opening, or from the end of the previous
  response, to send a whole request head (request line and headers); else it is closed. This is
  aiohttp's keep-alive timer, which runs from the connection's start and only while no request is
  being handled: silent sockets, slowly dripped headers and idle keep-alive connections all end there.
- idle_timeout: the longest pause while a request body arrives (intake.py answers 408).
- inactivity_timeout: a connection on which nothing at all arrives for this long is closed, whatever it
  is doing (a handler stuck behind a client that went away, a reply written to a reader that stopped).
- max_connections: one more connection than this is accepted and closed at once (a warning at most
  every 10 s), so held descriptors stay bounded and AMQP clients can still log in. The default is 1024
  (ranch's, as RabbitMQ), or a quarter of the process's descriptor limit when that is lower.
- A malformed request (bad request line, header or chunk) is the client's error: logged at DEBUG as one
  line (its class and status, never its text, which could carry an Authorization header), no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hutch.runtime import listen

if TYPE_CHECKING:
    from collections.abc import Callable

    from hutch.config import Config

log = logging.getLogger("hutch.mgmt")
DEFAULT_MAX_CONNECTIONS = 1024
MIN_AUTO_CONNECTIONS = 16
REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    """Invariant: every timeout and the cap are positive."""

    request_timeout_s: float
    idle_timeout_s: float
    inactivity_timeout_s: float
    max_connections: int
    max_body_bytes: int

    @classmethod
    def from_config(cls, cfg: Config) -> ListenerLimits:
        cap = cfg.management_max_connections
        return cls(cfg.management_request_timeout_ms / 1000, cfg.management_idle_timeout_ms / 1000,
                   cfg.management_inactivity_timeout_ms / 1000,
                   cap if cap is not None else default_max_connections(), cfg.management_max_body_bytes)


def default_max_connections() -> int:
    """1024, or a quarter of the soft descriptor limit when that is lower (AMQP needs the rest)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(MIN_AUTO_CONNECTIONS, min(DEFAULT_MAX_CONNECTIONS, soft // 4))


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
    nothing has arrived for the inactivity timeout. One timer per connection, re-armed lazily."""

    __slots__ = ("_guard", "_handler", "_last_rx", "_timer", "_transport")

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self._guard = guard
        self._handler = handler
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._guard.opened()
        self._last_rx = self._guard.loop.time()
        self._timer = self._guard.loop.call_later(self._guard.limits.inactivity_timeout_s, self._check)
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
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        self._guard.closed()
        self._handler.connection_lost(exc)


class ConnectionGuard:
    """The listener's protocol factory: aiohttp's handler behind `_Watched`, or `_Refused` past the cap.
    Invariant: `open_connections` counts the `_Watched` connections made and not yet lost."""

    def __init__(self, make_handler: Callable[[], asyncio.Protocol], limits: ListenerLimits,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.make_handler = make_handler
        self.limits = limits
        self.loop = loop
        self.open_connections = 0
        self.refused = 0
        self._last_refusal_log = -REFUSAL_LOG_INTERVAL_S

    def __call__(self) -> asyncio.Protocol:
        if self.open_connections >= self.limits.max_connections:
            self.refused += 1
            now = self.loop.time()
            if now - self._last_refusal_log >= REFUSAL_LOG_INTERVAL_S:
                self._last_refusal_log = now
                log.warning("management listener: %d connections open, new ones are closed "
                            "(management.tcp.max_connections; %d refused so far)",
                            self.open_connections, self.refused)
            return _Refused()
        return _Watched(self, self.make_handler())

    def opened(self) -> None:
        self.open_connections += 1

    def closed(self) -> None:
        assert self.open_connections > 0, "a connection lost that was never made"
        self.open_connections -= 1


class GuardedSite(web.BaseSite):
    """A TCP site of `runner` whose connections go through a `ConnectionGuard` (aiohttp's `TCPSite`
    passes its runner's server to the event loop directly, with no place for a cap or a watchdog)."""

    __slots__ = ("_host", "_limits", "_port", "_tls")

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, limits: ListenerLimits,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limits = limits
        self._tls = ssl_context  # HTTPS (management.ssl.*): the TLS handshake is bounded by request_timeout

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{listen.display_host(self._host or '')}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = ConnectionGuard(server, self._limits, loop)
        tls: dict[str, Any] = {}
        if self._tls is not None:
            tls = {"ssl": self._tls, "ssl_handshake_timeout": self._limits.request_timeout_s}
        self._server = await listen.create_server(loop, guard, self._host or "", self._port,
                                                  backlog=self._backlog, reuse_address=True, **tls)


__all__ = ["ConnectionGuard", "GuardedSite", "ListenerLimits", "default_max_connections", "handler_args"]
