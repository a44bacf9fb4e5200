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

import datetime
from typing import TYPE_CHECKING, Any

from hutch.config import TlsOptions
from hutch.core.certs import file_expiry
from hutch.runtime.workers.spec import node_of_worker

from .cluster import cluster_service
from .errors import bad_request, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

FAILED = 503
# protocol names a caller may use -> the listener protocol they mean (RabbitMQ's normalize_protocol)
PROTOCOL_ALIASES = {"amqp": "amqp", "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp",
                    "amqp0_9_1": "amqp", "http": "http", "management": "http", "prometheus": "http",
                    "amqps": "amqp/ssl", "amqp/ssl": "amqp/ssl", "https": "https"}
# certificate-expiration: seconds per unit (rabbit_mgmt_wm_health_check_certificate_expiration)
_DAY_S = 86400
EXPIRY_UNITS = {"days": _DAY_S, "weeks": 7 * _DAY_S, "months": _DAY_S * 365 / 12, "years": 365 * _DAY_S}

Result = tuple[int, dict[str, Any]]


def _ok(**extra: Any) -> Result:
    return 200, {"status": "ok", **extra}


def _failed(reason: str, **extra: Any) -> Result:
    return FAILED, {"status": "failed", "reason": reason, **extra}


def alarms(node: Node, local: bool = False) -> Result:
    if not node.alarms:
        return _ok()
    found = [{"node": node.public_name, "resource": resource} for resource in sorted(node.alarms)]
    return _failed("There are alarms in effect on the node" if local else
                   "There are alarms in effect in the cluster", alarms=found)


def deprecated_node_check(node: Node, name: str | None = None) -> dict[str, str]:
    """GET /api/healthchecks/node[/{node}]: ok (a no-op, as RabbitMQ 4.x); 404 for a non-member."""
    cluster = cluster_service(node)
    if name is not None and name not in (node.name, node.public_name) and (cluster is None or name not in cluster.machine.members):
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
    if node.amqps_port:
        out.append(("amqp/ssl", node.amqps_port))
    if node.management_ssl_port:
        out.append(("https", node.management_ssl_port))
    return out


def _tls_listeners(node: Node) -> list[tuple[str, str, int, TlsOptions]]:
    """(protocol, interface, port, TLS options) of the node's listeners that have a certificate."""
    cfg = node.config
    out = []
    if node.amqps_port:
        out.append(("amqp/ssl", cfg.amqps_host, node.amqps_port, cfg.ssl_options))
    if node.management_ssl_port:
        out.append(("https", cfg.management_ssl_host, node.management_ssl_port, cfg.management_ssl))
    cluster = getattr(node, "cluster", None)
    if cluster is not None and cfg.cluster_ssl.certfile:
        out.append(("clustering", cfg.cluster_host, cluster.transport.port, cfg.cluster_ssl))
    return out


def _expiring(path: str | None, now: datetime.datetime, horizon: datetime.datetime) -> list[str] | dict[str, str]:
    """RabbitMQ's `expired/2`: the notAfter dates before `horizon` (or the file's error)."""
    if not path:
        return []
    found = file_expiry(path, now)
    if found.error:
        return {"error": found.error}
    return [f"{d.year}-{d.month:02d}-{d.day:02d} {d.hour}:{d.minute:02d}:{d.second:02d}"
            for d in found.not_after if d < horizon]


def certificate_expiration(node: Node, within_text: str, unit_text: str) -> Result:
    """Fails when a TLS listener's certfile or cacertfile has a certificate that expires within the
    period (or cannot be read), with RabbitMQ's body: `expired` lists those listeners."""
    try:
        within = int(within_text)
    except ValueError:
        raise bad_request("Invalid expiration value.") from None
    seconds = EXPIRY_UNITS.get(unit_text.lower())
    if seconds is None:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    now = datetime.datetime.now(datetime.UTC)
    horizon = now + datetime.timedelta(seconds=within * seconds)
    expired = []
    for protocol, interface, port, opts in _tls_listeners(node):
        cert = _expiring(opts.certfile, now, horizon)
        ca = _expiring(opts.cacertfile, now, horizon)
        if cert or ca:
            expired.append({"node": node.public_name, "protocol": protocol, "interface": interface, "port": port,
                            "certfile": opts.certfile or "", "cacertfile": opts.cacertfile or "",
                            "certfile_expires_on": cert, "cacertfile_expires_on": ca})
    if expired:
        return _failed("Certificates expiring", expired=expired)
    return _ok()


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
    # a node of workers is one node: its workers' internal cluster is no cluster of nodes (docs/scaling.md)
    if cluster is None or all(node_of_worker(m) == node.public_name for m in cluster.machine.members):
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


__all__ = ["alarms", "certificate_expiration", "is_in_service", "node_is_quorum_critical", "port_listener", "protocol_listener",
           "virtual_hosts"]
