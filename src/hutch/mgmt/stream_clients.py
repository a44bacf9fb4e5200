"""Service layer: stream-protocol connections, publishers and consumers as the management API shows them.

Owns: which stream connections a caller sees (opened ones; monitors see all, others their own), their
JSON among the connections and consumers of `/api/connections` and `/api/consumers` (as rabbitmq_stream
registers them: protocol "stream", consumer tags `stream.subid-N`; rabbitmq_stream_management's
`/api/stream/...` routes are stream_routes.py's), and closing one (the socket is closed
without a stream-protocol close, as RabbitMQ 3.10.8 does it: checked by hand). Reads the node's
`StreamHub` (`node.streams`, set while the stream listener runs). Returns JSON-able data, raises
`ApiError`. No IO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .access import Principal, may_close_user_object, may_see_user_object
from .errors import not_authorised, not_found
from .formats import jsonable

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

CLOSE_REASON = "Closed via management plugin"


def opened(node: Node) -> list[Any]:
    """The node's opened stream connections (a connection still in its handshake is not listed)."""
    hub = node.streams
    if hub is None:
        return []
    return sorted((c for c in list(hub.connections) if c.phase.name == "OPENED"), key=lambda c: c.name)


def visible(node: Node, p: Principal, vhost: str | None = None) -> list[Any]:
    return [c for c in opened(node) if may_see_user_object(p, c.user_name)
            and (vhost is None or c.vhost.name == vhost)]


def find(node: Node, name: str, vhost: str | None = None) -> Any | None:
    for conn in opened(node):
        if conn.name == name and (vhost is None or conn.vhost.name == vhost):
            return conn
    return None


def visible_one(node: Node, p: Principal, name: str, vhost: str | None = None) -> Any:
    conn = find(node, name, vhost)
    if conn is None:
        raise not_found()
    if not may_see_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    return conn


def close(p: Principal, conn: Any, reason: str | None = None) -> None:
    if not may_close_user_object(p, conn.user_name):
        raise not_authorised("User not authorised to access object")
    conn.drop(reason or CLOSE_REASON)


def connection_json(conn: Any) -> dict[str, Any]:
    """A stream connection among `/api/connections` (RabbitMQ 3.10's fields for one)."""
    info = conn.info()
    props = jsonable(info["client_properties"])
    transport = conn.transport
    tls = transport.get_extra_info("ssl_object") if transport is not None else None
    return {
        "name": info["name"], "user": info["user"], "vhost": info["vhost"], "node": info["node"],
        "host": info["host"], "port": info["port"], "peer_host": info["peer_host"], "peer_port": info["peer_port"],
        "protocol": "stream", "type": "network", "state": "running", "channels": 0, "channel_max": 0,
        "frame_max": info["frame_max"], "timeout": info["heartbeat"], "auth_mechanism": info["auth_mechanism"],
        "connected_at": info["connected_at"], "client_properties": props,
        "user_provided_name": props.get("connection_name") if isinstance(props, dict) else None,
        "user_who_performed_action": info["user"],
        "ssl": tls is not None,
        "ssl_protocol": tls.version() if tls is not None else None,
        "ssl_cipher": (tls.cipher() or ("",))[0] if tls is not None else None,
        "ssl_hash": None, "ssl_key_exchange": None,
        # the certificate's details are in /api/stream/connections (mgmt reads no runtime helper for them)
        "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None,
    }


def consumers_json(conn: Any) -> list[dict[str, Any]]:
    """A stream connection's subscriptions among `/api/consumers` (as rabbitmq_stream lists them)."""
    details = {"connection_name": conn.name, "name": "", "node": str(conn.broker.name), "number": 0,
               "peer_host": conn.peer[0], "peer_port": conn.peer[1], "user": conn.user_name}
    return [{"consumer_tag": f"stream.subid-{row['subscription_id']}",
             "queue": {"name": row["stream"], "vhost": conn.vhost.name}, "channel_details": dict(details),
             "ack_required": False, "exclusive": False, "prefetch_count": 0, "arguments": {},
             "active": row["active"], "activity_status": "up" if row["active"] else "waiting"}
            for row in conn.consuming.info()]


__all__ = ["CLOSE_REASON", "close", "connection_json", "consumers_json", "find", "opened", "visible",
           "visible_one"]
