"""Listening sockets: every listener of a node binds IPv4 and IPv6 unless told one address.

Owns: `create_server`, the one way a hutch listener (AMQP, AMQP over TLS, management HTTP/HTTPS,
inter-node) binds; `descriptor_share`, the share of the descriptor limit one listener's unproven
connections may hold; `SourceSlots`, connections counted per source address under two caps;
`HandshakeGate`, the one rule for a listener's connections that have proved nothing yet (AMQP and the
stream protocol until their login succeeds, AMQP and the stream protocol over TLS until their TLS
handshake is done: `handshake_slots`, `MAX_PENDING_HANDSHAKES` or a quarter of the descriptor limit
when that is lower, and a quarter of that per source address; past a cap the newest connection is
closed at its accept, with one throttled warning). RabbitMQ's `listeners.tcp.default = 5672` listens on `[::]` and `0.0.0.0`; an
explicit address (`listeners.tcp.default = 127.0.0.1:5672`, `[::1]:5672`) binds that address only.

Rules:
- An empty host (the default of every `*_host` setting) means both families, on the same port. Port 0
  (tests) picks one free port for both.
- A machine without IPv6 (the kernel refuses an AF_INET6 socket or `::`) gets the IPv4 listener alone,
  with one warning, rather than a node that does not start.
- `display_host` is what listings show for an all-interfaces listener: `::`, as RabbitMQ shows.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any

from hutch.core.logsafe import LogThrottle, suppressed_note

log = logging.getLogger("hutch.listen")

ALL_INTERFACES = ""
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)
_warned_no_ipv6 = False


def display_host(host: str) -> str:
    return host or "::"


MIN_DESCRIPTOR_SHARE = 16


def descriptor_share(cap: int) -> int:
    """`cap`, or a quarter of the process's soft descriptor limit when that is lower (at least 16): how
    many sockets one listener's unauthenticated stage may hold, so the others keep descriptors."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return cap
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(MIN_DESCRIPTOR_SHARE, min(cap, soft // 4))


class SourceSlots:
    """Connections held at once, in all and per source address, under a cap for each (the management
    listener's connections, AMQP over TLS's handshakes). Invariant: `held` equals the sum of
    `per_source`, which has no zero entry."""

    __slots__ = ("held", "max_per_source", "max_total", "per_source", "refused")

    def __init__(self, max_total: int, max_per_source: int) -> None:
        assert max_total > 0 and max_per_source > 0
        self.max_total = max_total
        self.max_per_source = max_per_source
        self.held = 0
        self.per_source: dict[str, int] = {}
        self.refused = 0

    def admit(self, source: str) -> str | None:
        """Count one more connection from `source`; or, past a cap, count a refusal and return which
        cap ("per source" or "in all")."""
        held = self.per_source.get(source, 0)
        full = "per source" if held >= self.max_per_source else "in all" if self.held >= self.max_total else None
        if full is not None:
            self.refused += 1
            return full
        self.per_source[source] = held + 1
        self.held += 1
        return None

    def release(self, source: str) -> None:
        assert self.held > 0, "a slot released that was never taken"
        self.held -= 1
        left = self.per_source[source] - 1
        if left:
            self.per_source[source] = left
        else:
            del self.per_source[source]


MAX_PENDING_HANDSHAKES = 1024
"""Connections one listener may hold before they prove anything (unless a quarter of the descriptor
limit is lower: `descriptor_share`); a quarter of that from one source address."""


def handshake_slots() -> SourceSlots:
    """The slots of one listener's unproven connections: `descriptor_share(MAX_PENDING_HANDSHAKES)` in
    all, a quarter of that per source address (with 20,000 descriptors: 1,024 and 256)."""
    pending = descriptor_share(MAX_PENDING_HANDSHAKES)
    return SourceSlots(pending, max(1, pending // 4))


class HandshakeGate:
    """A listener's connections counted from the accept until they prove something (`stage` says what
    they have not done yet, for the log: "in their TLS handshake", "before login"). `admit` at the
    accept answers the source address whose slot the connection holds, or None after closing the
    transport (a cap reached: the newest is refused, so a flood costs only its own source's newcomers,
    never the connections already being served); the holder calls `release(source)` exactly once."""

    __slots__ = ("_refusals_log", "slots", "stage", "what")

    def __init__(self, slots: SourceSlots, what: str, stage: str) -> None:
        self.slots = slots
        self.what = what  # the listener: "AMQP", "AMQP over TLS", "stream protocol"...
        self.stage = stage
        self._refusals_log = LogThrottle(1, 10.0)  # one line per 10 s, the next saying how many were left out

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        full = self.slots.admit(source)
        if full is None:
            return source
        transport.close()
        left_out = self._refusals_log.admit(asyncio.get_running_loop().time())
        if left_out is not None:
            slots = self.slots
            log.warning("%s listener: %d connections %s (%d from %s; at most %d, %d per source), new ones%s "
                        "are closed%s", self.what, slots.held, self.stage, slots.per_source.get(source, 0),
                        source, slots.max_total, slots.max_per_source, " from it" if full == "per source" else "",
                        suppressed_note(left_out))
        return None

    def release(self, source: str) -> None:
        self.slots.release(source)


class HeldSlot:
    """One connection's slot of a `HandshakeGate`, from `take` at the accept to `release` (its login,
    its TLS handshake, or its end; releasing twice is harmless). `refused`: the gate closed it at the
    accept, so the connection never started."""

    __slots__ = ("_gate", "_source", "refused")

    def __init__(self, gate: HandshakeGate) -> None:
        self._gate = gate
        self._source: str | None = None  # set while the slot is held
        self.refused = False

    def take(self, transport: asyncio.BaseTransport) -> bool:
        self._source = self._gate.admit(transport)
        self.refused = self._source is None
        return not self.refused

    def release(self) -> None:
        if self._source is not None:
            self._gate.release(self._source)
            self._source = None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


async def create_server(loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.BaseProtocol],
                        host: str, port: int, **kwargs: Any) -> asyncio.base_events.Server:
    """`loop.create_server` on `host` (empty: `0.0.0.0` and `::`) and `port`."""
    global _warned_no_ipv6
    if host:
        return await loop.create_server(factory, host, port, **kwargs)
    for _attempt in range(5):
        chosen = port or _free_port()
        try:
            return await loop.create_server(factory, ["0.0.0.0", "::"], chosen, **kwargs)
        except OSError as exc:
            if exc.errno in _NO_IPV6 or "address family" in str(exc).lower():
                if not _warned_no_ipv6:
                    _warned_no_ipv6 = True
                    log.warning("no IPv6 on this machine (%s): listening on IPv4 only", exc.strerror or exc)
                return await loop.create_server(factory, "0.0.0.0", chosen, **kwargs)
            if port or exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free port for both address families")


__all__ = ["ALL_INTERFACES", "MAX_PENDING_HANDSHAKES", "HandshakeGate", "HeldSlot", "SourceSlots", "create_server",
           "descriptor_share", "display_host", "handshake_slots"]
