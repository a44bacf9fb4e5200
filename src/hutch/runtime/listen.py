"""Listening sockets: every listener of a node binds IPv4 and IPv6 unless told one address.

Owns: `create_server`, the one way a hutch listener (AMQP, AMQP over TLS, management HTTP/HTTPS,
inter-node) binds; `descriptor_share`, the share of the descriptor limit one listener's unproven
connections may hold; `SourceSlots`, connections counted per source address under two caps. RabbitMQ's `listeners.tcp.default = 5672` listens on `[::]` and `0.0.0.0`; an
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


__all__ = ["ALL_INTERFACES", "SourceSlots", "create_server", "descriptor_share", "display_host"]
