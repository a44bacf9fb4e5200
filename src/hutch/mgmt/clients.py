"""Service layer: client connections, channels and consumers, as the management API sees them.

Owns: listing, showing and force-closing AMQP connections, and listing channels and consumers, on
behalf of an authenticated `Principal`. Returns JSON-able data, raises `ApiError`. No IO.

Rules (RabbitMQ's):
- Monitors and administrators see every connection and channel; other users only their own.
  Consumers are listed per vhost, for the vhosts the caller can see. Lists of one vhost's connections
  or channels need the vhost to be visible (404 when it does not exist).
- Closing a connection is for administrators and for the connection's own user. The client gets
  connection.close 320 CONNECTION_FORCED with the reason as text (default
  "Closed via management plugin", or the request's `X-Reason` header).
- Stream-protocol connections are connections too (protocol "stream"), and their subscriptions
  consumers (`stream.subid-N`), as RabbitMQ lists them (stream_clients.py); closing one closes its
  socket (no stream-protocol close frame, as RabbitMQ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import CONNECTION_FORCED, ConnectionError_

from . import formats, stream_clients
from . import stats as _stats
from .access import Principal, may_close_user_object, may_see_user_object, vhost_for_read, visible_vhosts
from .errors import not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.session.channel import ServerChannel
    from hutch.runtime.session.connection import AMQPConnection

    from .stats import StatsView

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _visible_connections(node: Node, p: Principal) -> list[AMQPConnection]:
    return [c for c in node.connections if may_see_user_object(p, c.user_name)]


def list_connections(node: Node, p: Principal, vhost: str | None = None,
                     stats: StatsView | None = None) -> list[dict[str, Any]]:
    conns = _visible_connections(node, p)
    if vhost is not None:
        vhost_for_read(node, p, vhost)
        conns = [c for c in conns if c.vhost_obj is not None and c.vhost_obj.name == vhost]
    return ([formats.connection_json(c, node.name, stats) for c in conns]
            + [stream_clients.connection_json(c) for c in stream_clients.visible(node, p, vhost)])


def user_connections(node: Node, p: Principal, user: str, stats: StatsView | None = None
                     ) -> list[dict[str, Any]]:
    """GET /api/connections/username/{user}: monitors, or the user itself."""
    if not may_see_user_object(p, user):
        raise not_authorised("User not authorised to access object")
    return ([formats.connection_json(c, node.name, stats) for c in node.connections if c.user_name == user]
            + [stream_clients.connection_json(c) for c in stream_clients.opened(node) if c.user_name == user])


def close_user_connections(node: Node, p: Principal, user: str, reason: str | None = None) -> None:
    """DELETE /api/connections/username/{user}: administrators, or the user itself."""
    if not may_close_user_object(p, user):
        raise not_authorised("User not authorised to access object")
    for conn in [c for c in node.connections if c.user_name == user]:
        conn.close_with_error(ConnectionError_(CONNECTION_FORCED, reason or DEFAULT_CLOSE_REASON))
    for stream_conn in [c for c in stream_clients.opened(node) if c.user_name == user]:
        stream_clients.close(node, p, stream_conn, reason)


def _connection(node: Node, name: str) -> AMQPConnection:
    for conn in node.connections:
        if conn.name == name:
            return conn
    raise not_found()


def _visible_connection(node: Node, p: Principal, name: str) -> AMQPConnection:
    conn = _connection(node, name)
    if not may_see_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    return conn


def get_connection(node: Node, p: Principal, name: str, stats: StatsView | None = None) -> dict[str, Any]:
    if stream_clients.find(node, name) is not None:
        return stream_clients.connection_json(stream_clients.visible_one(node, p, name))
    return formats.connection_json(_visible_connection(node, p, name), node.name, stats)


def connection_channels(node: Node, p: Principal, name: str, stats: StatsView | None = None
                        ) -> list[dict[str, Any]]:
    if stream_clients.find(node, name) is not None:
        stream_clients.visible_one(node, p, name)
        return []  # a stream connection has no channels
    conn = _visible_connection(node, p, name)
    return [formats.channel_json(ch, node.name, stats) for ch in list(conn.channels.values())]


def close_connection(node: Node, p: Principal, name: str, reason: str | None = None) -> None:
    stream_conn = stream_clients.find(node, name)
    if stream_conn is not None:
        stream_clients.close(node, p, stream_conn, reason)
        return
    conn = _connection(node, name)
    if not may_close_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    conn.close_with_error(ConnectionError_(CONNECTION_FORCED, reason or DEFAULT_CLOSE_REASON))


def list_channels(node: Node, p: Principal, vhost: str | None = None,
                  stats: StatsView | None = None) -> list[dict[str, Any]]:
    conns = _visible_connections(node, p)
    if vhost is not None:
        vhost_for_read(node, p, vhost)
        conns = [c for c in conns if c.vhost_obj is not None and c.vhost_obj.name == vhost]
    return [formats.channel_json(ch, node.name, stats) for conn in conns for ch in list(conn.channels.values())]


def _channel(node: Node, name: str) -> ServerChannel:
    for conn in node.connections:
        if name.startswith(conn.name):
            for ch in list(conn.channels.values()):
                if formats.channel_name(ch) == name:
                    return ch
    raise not_found()


def get_channel(node: Node, p: Principal, name: str, stats: StatsView | None = None) -> dict[str, Any]:
    """GET /api/channels/{name}: the channel, its consumers and its publishes per exchange."""
    ch = _channel(node, name)
    if not may_see_user_object(p, ch.user):
        raise not_authorised("User not authorised to access object")
    out = formats.channel_json(ch, node.name, stats)
    timeout_ms = node.config.consumer_timeout_ms
    out["consumer_details"] = [formats.consumer_json(c, ch, node.name, timeout_ms)
                               for c in list(ch.consumers.values())]
    publishes = []
    for x, (published, _routed) in _stats.exchange_counts(ch).items():
        known = ch.vhost.exchanges.get(x.name) if ch.vhost is not None else None
        if known is not None and known is x:  # not deleted (or replaced by another of the same name)
            publishes.append({"exchange": {"name": known.name, "vhost": known.vhost},
                              "stats": {"publish": published}})
    out["publishes"] = publishes
    return out


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
    for stream_conn in stream_clients.opened(node):
        if stream_conn.vhost.name in names:
            out.extend(stream_clients.consumers_json(stream_conn))
    return out


__all__ = [
    "DEFAULT_CLOSE_REASON",
    "close_connection",
    "close_user_connections",
    "connection_channels",
    "get_channel",
    "get_connection",
    "list_channels",
    "list_connections",
    "list_consumers",
    "user_connections",
]
