"""Service layer: stream-protocol connections, publishers and consumers as the management API shows them.

Owns: which stream connections a caller sees (opened ones; monitors see all, others their own), their
JSON among the connections and consumers of `/api/connections` and `/api/consumers` (as rabbitmq_stream
registers them: protocol "stream", consumer tags `stream.subid-N`; rabbitmq_stream_management's
`/api/stream/...` routes are stream_routes.py's), and closing one (the socket is closed
without a stream-protocol close, as RabbitMQ 3.10.8 does it: checked by hand). Asks the node's
management agent (`stream_connections`, runtime/ports.py: every worker's connections, as plain values)
and works on its answer. Returns JSON-able data, raises `ApiError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.core.tls_names import tls_fields

from .access import Principal, may_close_user_object, may_see_user_object
from .errors import not_authorised, not_found
from .formats import jsonable

if TYPE_CHECKING:
    from hutch.runtime.ports import ManagementAgentPort

CLOSE_REASON = "Closed via management plugin"
SNAPSHOT_ONLY = ("tls", "publisher_rows", "consumer_rows")  # the agent's, not the connection's fields


async def opened(agent: ManagementAgentPort) -> list[dict[str, Any]]:
    """The node's opened stream connections (every worker's), by name."""
    return sorted(await agent.stream_connections(), key=lambda c: str(c["name"]))


def visible(conns: list[dict[str, Any]], p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    return [c for c in conns if may_see_user_object(p, c["user"]) and (vhost is None or c["vhost"] == vhost)]


def find(conns: list[dict[str, Any]], name: str, vhost: str | None = None) -> dict[str, Any] | None:
    for conn in conns:
        if conn["name"] == name and (vhost is None or conn["vhost"] == vhost):
            return conn
    return None


def visible_one(conns: list[dict[str, Any]], p: Principal, name: str, vhost: str | None = None) -> dict[str, Any]:
    conn = find(conns, name, vhost)
    if conn is None:
        raise not_found()
    if not may_see_user_object(p, conn["user"]):
        raise not_authorised("User not authorised to access object")
    return conn


async def close(agent: ManagementAgentPort, p: Principal, conn: dict[str, Any], reason: str | None = None) -> None:
    if not may_close_user_object(p, conn["user"]):
        raise not_authorised("User not authorised to access object")
    await agent.close_stream_connection(conn["vhost"], conn["name"], reason or CLOSE_REASON)


def info(conn: dict[str, Any]) -> dict[str, Any]:
    """The connection's own fields (rabbitmq_stream_management's), without what the agent adds."""
    return {k: v for k, v in conn.items() if k not in SNAPSHOT_ONLY}


def connection_json(conn: dict[str, Any]) -> dict[str, Any]:
    """A stream connection among `/api/connections` (RabbitMQ 3.10's fields for one)."""
    props = jsonable(conn["client_properties"])
    tls = conn["tls"]
    return {
        "name": conn["name"], "user": conn["user"], "vhost": conn["vhost"], "node": conn["node"],
        "host": conn["host"], "port": conn["port"], "peer_host": conn["peer_host"], "peer_port": conn["peer_port"],
        "protocol": "stream", "type": "network", "state": "running", "channels": 0, "channel_max": 0,
        "frame_max": conn["frame_max"], "timeout": conn["heartbeat"], "auth_mechanism": conn["auth_mechanism"],
        "connected_at": conn["connected_at"], "client_properties": props,
        "user_provided_name": props.get("connection_name") if isinstance(props, dict) else None,
        "user_who_performed_action": conn["user"],
        **tls_fields(None if tls is None else (tls[0], tls[1])),  # RabbitMQ's spelling (core/tls_names.py)
        # the certificate's details are in /api/stream/connections (mgmt reads no runtime helper for them)
        "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None,
    }


def consumers_json(conn: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream connection's subscriptions among `/api/consumers` (as rabbitmq_stream lists them)."""
    details = {"connection_name": conn["name"], "name": "", "node": conn["node"], "number": 0,
               "peer_host": conn["peer_host"], "peer_port": conn["peer_port"], "user": conn["user"]}
    return [{"consumer_tag": f"stream.subid-{row['subscription_id']}",
             "queue": {"name": row["stream"], "vhost": conn["vhost"]}, "channel_details": dict(details),
             "ack_required": False, "exclusive": False, "prefetch_count": 0, "arguments": {},
             "active": row["active"], "activity_status": "up" if row["active"] else "waiting"}
            for row in conn["consumer_rows"]]


__all__ = ["CLOSE_REASON", "close", "connection_json", "consumers_json", "find", "info", "opened", "visible",
           "visible_one"]
