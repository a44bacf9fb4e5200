"""Service layer: client connections, channels and consumers, as the management API sees them.

Owns: listing, showing and force-closing AMQP connections, and listing channels and consumers, on
behalf of an authenticated `Principal`. What exists is asked of the node's management agent
(`ManagementAgentPort`, runtime/ports.py: plain data, one node's view however many processes hold
the objects); who may see or close what is decided here. Returns JSON-able data, raises `ApiError`.

Rules (RabbitMQ's):
- Monitors and administrators see every connection and channel; other users only their own.
  Consumers are listed per vhost, for the vhosts the caller can see. Lists of one vhost's connections
  or channels need the vhost to be visible (404 when it does not exist).
- Closing a connection is for administrators and for the connection's own user. The client gets
  connection.close 320 CONNECTION_FORCED with the reason as text (default
  "Closed via management plugin", or the request's `X-Reason` header).
- Rates (`*_details`) are added from the statistics collector's samples, by object name (stats.py).
- Stream-protocol connections are connections too (protocol "stream"), and their subscriptions
  consumers (`stream.subid-N`), as RabbitMQ lists them (stream_clients.py; the node's, every worker's,
  from the agent); closing one closes its socket (no stream-protocol close frame, as RabbitMQ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.core.counters import values_of

from . import stream_clients
from .access import Principal, may_close_user_object, may_see_user_object, vhost_for_read, visible_vhosts
from .errors import not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import ManagementAgentPort

    from .stats import StatsView

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _connection_rates(conn: dict[str, Any], stats: StatsView | None) -> dict[str, Any]:
    if stats is not None:
        stats.connection(conn["name"], conn)
    return conn


def _channel_rates(ch: dict[str, Any], stats: StatsView | None) -> dict[str, Any]:
    if stats is not None:
        ch["message_stats"] = stats.channel(ch["name"], values_of(ch["message_stats"]))
    return ch


async def list_connections(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str | None = None,
                           stats: StatsView | None = None) -> list[dict[str, Any]]:
    if vhost is not None:
        vhost_for_read(node, p, vhost)
    return ([_connection_rates(c, stats) for c in await agent.connections()
             if may_see_user_object(p, c["user"]) and (vhost is None or c["vhost"] == vhost)]
            + [stream_clients.connection_json(c) for c in stream_clients.visible(await stream_clients.opened(agent), p,
                                                                                 vhost)])


async def user_connections(agent: ManagementAgentPort, p: Principal, user: str, stats: StatsView | None = None,
                           node: Node | None = None) -> list[dict[str, Any]]:
    """GET /api/connections/username/{user}: monitors, or the user itself."""
    if not may_see_user_object(p, user):
        raise not_authorised("User not authorised to access object")
    streams = await stream_clients.opened(agent)
    return ([_connection_rates(c, stats) for c in await agent.connections() if c["user"] == user]
            + [stream_clients.connection_json(c) for c in streams if c["user"] == user])


async def close_user_connections(agent: ManagementAgentPort, p: Principal, user: str, reason: str | None = None,
                                 node: Node | None = None) -> None:
    """DELETE /api/connections/username/{user}: administrators, or the user itself."""
    if not may_close_user_object(p, user):
        raise not_authorised("User not authorised to access object")
    await agent.close_user_connections(user, reason or DEFAULT_CLOSE_REASON)
    for stream_conn in [c for c in await stream_clients.opened(agent) if c["user"] == user]:
        await stream_clients.close(agent, p, stream_conn, reason)


async def _visible_connection(agent: ManagementAgentPort, p: Principal, name: str) -> dict[str, Any]:
    for conn in await agent.connections():
        if conn["name"] == name:
            if not may_see_user_object(p, conn["user"]):
                raise not_authorised("User not authorised to access object")
            return conn
    raise not_found()


async def get_connection(agent: ManagementAgentPort, p: Principal, name: str, stats: StatsView | None = None,
                         node: Node | None = None) -> dict[str, Any]:
    streams = await stream_clients.opened(agent)
    if stream_clients.find(streams, name) is not None:
        return stream_clients.connection_json(stream_clients.visible_one(streams, p, name))
    return _connection_rates(await _visible_connection(agent, p, name), stats)


async def connection_channels(agent: ManagementAgentPort, p: Principal, name: str,
                              stats: StatsView | None = None, node: Node | None = None) -> list[dict[str, Any]]:
    streams = await stream_clients.opened(agent)
    if stream_clients.find(streams, name) is not None:
        stream_clients.visible_one(streams, p, name)
        return []  # a stream connection has no channels
    await _visible_connection(agent, p, name)
    return [_channel_rates(ch, stats) for ch in await agent.channels(name)]


async def close_connection(agent: ManagementAgentPort, p: Principal, name: str, reason: str | None = None,
                           node: Node | None = None) -> None:
    stream_conn = stream_clients.find(await stream_clients.opened(agent), name)
    if stream_conn is not None:
        await stream_clients.close(agent, p, stream_conn, reason)
        return
    for conn in await agent.connections():
        if conn["name"] == name:
            if not may_close_user_object(p, conn["user"]):
                raise not_authorised("User not authorised to access object")
            await agent.close_connection(name, reason or DEFAULT_CLOSE_REASON)
            return
    raise not_found()


async def list_channels(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str | None = None,
                        stats: StatsView | None = None) -> list[dict[str, Any]]:
    if vhost is not None:
        vhost_for_read(node, p, vhost)
    return [_channel_rates(ch, stats) for ch in await agent.channels()  # a channel's user and vhost: its connection's
            if may_see_user_object(p, ch["user"]) and (vhost is None or ch["vhost"] == vhost)]


async def get_channel(agent: ManagementAgentPort, p: Principal, name: str, stats: StatsView | None = None
                      ) -> dict[str, Any]:
    """GET /api/channels/{name}: the channel, its consumers and its publishes per exchange."""
    ch = await agent.channel(name)
    if ch is None:
        raise not_found()
    if not may_see_user_object(p, ch["user"]):
        raise not_authorised("User not authorised to access object")
    return _channel_rates(ch, stats)


async def list_consumers(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str | None = None
                         ) -> list[dict[str, Any]]:
    if vhost is not None:
        names = {vhost_for_read(node, p, vhost).name}
    else:
        names = set(visible_vhosts(node, p))
    return ([c for c in await agent.consumers() if c["queue"]["vhost"] in names]
            + [row for conn in await stream_clients.opened(agent) if conn["vhost"] in names
               for row in stream_clients.consumers_json(conn)])


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
