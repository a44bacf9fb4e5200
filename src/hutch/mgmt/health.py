"""Service layer: RabbitMQ's health checks (GET /api/health/checks/...).

Owns: the checks a load balancer or an orchestrator polls: alarms (node-wide and local: the same on a
single node), virtual hosts, port and protocol listeners, quorum criticality, being in service. Each
returns `(status, body)`: 200 `{"status": "ok", ...}` or 503 `{"status": "failed", "reason": ...}`
with RabbitMQ's reasons and extra fields (`alarms`, `missing`, `ports`, `protocols`, `queues`).

Rules (rabbit_mgmt_wm_health_check_*): any management user may call them. A port that is not an
integer is a 400 `Invalid port`. `node-is-quorum-critical` fails when stopping this node would leave
one of its quorum queues without a majority of members online (ok with `reason: "single node cluster"`
on a node that is alone, clustered or not, as RabbitMQ's is_single_node_cluster).
The deprecated `/api/healthchecks/node[/][{node}]` is a no-op in RabbitMQ 4.x: `{"status": "ok"}` for
this node or any cluster member, 404 for a name that is not a member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import bad_request, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

FAILED = 503
# protocol names a caller may use -> the listener protocol they mean (RabbitMQ's normalize_protocol)
PROTOCOL_ALIASES = {"amqp": "amqp", "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp",
                    "amqp0_9_1": "amqp", "http": "http", "management": "http", "prometheus": "http"}

Result = tuple[int, dict[str, Any]]


def _ok(**extra: Any) -> Result:
    return 200, {"status": "ok", **extra}


def _failed(reason: str, **extra: Any) -> Result:
    return FAILED, {"status": "failed", "reason": reason, **extra}


def alarms(node: Node, local: bool = False) -> Result:
    if not node.alarms:
        return _ok()
    found = [{"node": node.name, "resource": resource} for resource in sorted(node.alarms)]
    return _failed("There are alarms in effect on the node" if local else
                   "There are alarms in effect in the cluster", alarms=found)


def deprecated_node_check(node: Node, name: str | None = None) -> dict[str, str]:
    """GET /api/healthchecks/node[/{node}]: ok (a no-op, as RabbitMQ 4.x); 404 for a non-member."""
    if name is not None and name != node.name and (node.cluster is None
                                                   or name not in node.cluster.machine.members):
        raise not_found()
    return {"status": "ok"}


def virtual_hosts(node: Node) -> Result:
    down = sorted(name for name in (v.name for v in node.auth.list_vhosts()) if name not in node.vhosts)
    return _failed("Some virtual hosts are down", **{"virtual-hosts": down}) if down else _ok()


def listeners(node: Node) -> list[tuple[str, int]]:
    """(protocol, port) of the node's listeners."""
    out = []
    if node.amqp_port:
        out.append(("amqp", node.amqp_port))
    if node.management_port:
        out.append(("http", node.management_port))
    return out


def port_listener(node: Node, port_text: str) -> Result:
    try:
        port = int(port_text)
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = [p for _proto, p in listeners(node)]
    if port in ports:
        return _ok(port=port)
    return _failed("No active listener", missing=port, ports=ports)


def protocol_listener(node: Node, protocols_text: str) -> Result:
    active = sorted({proto for proto, _port in listeners(node)})
    wanted = [PROTOCOL_ALIASES.get(p.strip().lower(), p.strip().lower()) for p in protocols_text.split(",")]
    missing = sorted({p for p in wanted if p and p not in active})
    if missing:
        return _failed("No active listener", missing=missing, protocols=active)
    return _ok(protocols=active)


def node_is_quorum_critical(node: Node) -> Result:
    """Would stopping this node leave a quorum queue (or the metadata store) without a majority of its
    members online? (rabbit_quorum_queue:list_with_minimum_quorum)"""
    cluster = getattr(node, "cluster", None)
    if cluster is None or len(cluster.machine.members) <= 1:
        return _ok(reason="single node cluster")
    online = {node.name, *cluster.transport.connected_peers()}
    critical = []
    for vhost in node.vhosts.values():
        for q in vhost.queues.values():
            members = getattr(q, "members", None)
            if q.queue_type != "quorum" or not members or node.name not in members:
                continue
            up = sum(1 for m in members if m in online)
            if len(members) > 1 and up - 1 < len(members) // 2 + 1:
                critical.append({"name": q.name, "virtual_host": vhost.name, "type": "quorum"})
    if critical:
        return _failed("There are quorum queues that would lose their quorum if the target node is shut down",
                       queues=critical)
    return _ok()


def is_in_service(node: Node) -> Result:
    if node.server is None or not node.server.is_serving():
        return _failed("this rabbit node is not currently available to serve")
    return _ok()


__all__ = ["alarms", "is_in_service", "node_is_quorum_critical", "port_listener", "protocol_listener",
           "virtual_hosts"]
