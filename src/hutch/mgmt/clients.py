"""Service layer: client connections, channels and consumers, as the management API sees them.

Owns: listing, showing and force-closing AMQP connections, and listing channels and consumers, on
behalf of an authenticated `Principal`. Returns JSON-able data, raises `ApiError`. No IO.

Rules (RabbitMQ's):
- Monitors and administrators see every connection and channel; other users only their own.
  Consumers are listed per vhost, for the vhosts the caller can see.
- Closing a connection is for administrators and for the connection's own user. The client gets
  connection.close 320 CONNECTION_FORCED with the reason as text (default
  "Closed via management plugin", or the request's `X-Reason` header).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import CONNECTION_FORCED, ConnectionError_

from . import formats
from .access import Principal, may_close_user_object, may_see_user_object, vhost_for_read, visible_vhosts
from .errors import not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.connection import AMQPConnection
    from hutch.runtime.node import Node

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _visible_connections(node: Node, p: Principal) -> list[AMQPConnection]:
    return [c for c in node.connections if may_see_user_object(p, c.user_name)]


def list_connections(node: Node, p: Principal) -> list[dict[str, Any]]:
    return [formats.connection_json(c, node.name) for c in _visible_connections(node, p)]


def _connection(node: Node, name: str) -> AMQPConnection:
    for conn in node.connections:
        if conn.name == name:
            return conn
    raise not_found()


def get_connection(node: Node, p: Principal, name: str) -> dict[str, Any]:
    conn = _connection(node, name)
    if not may_see_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    return formats.connection_json(conn, node.name)


def close_connection(node: Node, p: Principal, name: str, reason: str | None = None) -> None:
    conn = _connection(node, name)
    if not may_close_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    conn.close_with_error(ConnectionError_(CONNECTION_FORCED, reason or DEFAULT_CLOSE_REASON))


def list_channels(node: Node, p: Principal) -> list[dict[str, Any]]:
    return [formats.channel_json(ch, node.name)
            for conn in _visible_connections(node, p) for ch in list(conn.channels.values())]


def list_consumers(node: Node, p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    if vhost is not None:
        names = {vhost_for_read(node, p, vhost).name}
    else:
        names = set(visible_vhosts(node, p))
    timeout_ms = node.config.consumer_timeout_ms
    out = []
    for conn in node.connections:
        vh = conn.vhost_obj
        if vh is None or vh.name not in names:
            continue
        for ch in list(conn.channels.values()):
            for consumer in list(ch.consumers.values()):
                out.append(formats.consumer_json(consumer, ch, node.name, timeout_ms))
    return out


__all__ = [
    "DEFAULT_CLOSE_REASON",
    "close_connection",
    "get_connection",
    "list_channels",
    "list_connections",
    "list_consumers",
]
