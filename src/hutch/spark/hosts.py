"""Trying a read's or a write's nodes in turn (the `hosts` option beside `uri`).

Owns: `first_answering`, the one failover rule of the connector: the addresses are tried in their order
(`uri`'s host first, then `hosts`); an address that does not answer (connection refused, unreachable,
a connect or handshake timeout: the clients' errors with code 0) is passed over for the next; an
answer that refuses (authentication, vhost access: a protocol code) is the same on every node and fails
at once. When none answers, the error names every address tried and why each failed.

Used by the driver's probes and the executors' tasks alike (stream protocol: spark/pool.py; AMQP 0-9-1:
source.py, sink.py, stream_source.py), so a query whose first node is down starts, and a task Spark
retries after its node went away reconnects to another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from hutch.amqp.uri import AmqpUri

T = TypeVar("T")


def host_port(uri: AmqpUri) -> str:
    return f"[{uri.host}]:{uri.port}" if ":" in uri.host else f"{uri.host}:{uri.port}"


def first_answering(uris: Sequence[AmqpUri], connect: Callable[[AmqpUri], T],
                    error: Callable[[str, int], Exception]) -> T:
    """`connect(uri)` for the first of `uris` that answers. `connect` raises `error`'s type with a
    `code` attribute, 0 when the address did not answer (then the next is tried). With one address its
    error is raised as it is; with several, `error(text, 0)` names each address tried and its failure."""
    tried: list[str] = []
    for uri in uris:
        try:
            return connect(uri)
        except Exception as exc:  # the caller's client error (ClientClosed / StreamClientError)
            if getattr(exc, "code", None) != 0 or len(uris) == 1:
                raise
            tried.append(f"{host_port(uri)}: {exc}")
    raise error(f"none of the {len(uris)} hosts answered (option 'uri' and 'hosts'), tried in turn: "
                + "; ".join(tried), 0)


__all__ = ["first_answering", "host_port"]
