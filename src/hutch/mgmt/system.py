"""Service layer: the node as a whole (overview, nodes, cluster name, aliveness test).

Owns: `overview` and `node_info` (RabbitMQ's GET /api/overview and /api/nodes shapes), the cluster
name (GET/PUT /api/cluster-name), the `aliveness_test`, `message_totals` (node-wide message counters)
and `node_figures` (the process figures the statistics collector samples). The process figures (RSS, file
descriptors, threads, fsyncs) are the node agent's answer (`process_figures`: a node of workers sums its
workers'); the limits come from `resource`, the free disk from the data directory.

Rules:
- `message_stats` counters are the channels' stat_* counters: those of live channels plus
  `Node.closed_channel_stats` for the channels that have closed, so totals never go down, as the node's
  management agent counts them (`ManagementAgentPort.counts`). Non-monitors
  see the sum over the vhosts they can see, from the collector (RabbitMQ narrows overview figures the
  same way).
- Rates and samples (`*_details`) come from stats.py; without a collector (hutchctl's tests build the
  app without one) the counters are plain numbers.
- The cluster name is the node's `cluster_name` (config, default the node name); PUT changes it for
  the running node (AMQP server properties included), saved with the definitions (replicated in a
  cluster), so it outlives a restart, as RabbitMQ's runtime parameter does.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.amqp.errors import AMQPError
from hutch.amqp.spec import BasicProperties
from hutch.cluster import messages as cm
from hutch.core.counters import ZERO_CHANNEL, add, msg_stats, values_of
from hutch.core.message import Message
from hutch.core.routing import EXCHANGE_TYPES
from hutch.runtime import listen, procinfo
from hutch.runtime.workers.membership import nodes_of
from hutch.runtime.workers.spec import node_of_worker, worker_name

from . import stats as _stats
from .access import (
    Principal,
    may_see_user_object,
    require_admin,
    require_amqp,
    require_monitor,
    vhost_for_write,
    visible_vhosts,
)
from .cluster import cluster_service
from .errors import bad_request, from_amqp, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import ManagementAgentPort

    from .stats import StatsView

ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"
_EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "x-consistent-hash": "Consistent Hashing Exchange",
    "x-random": "Randomly picks a binding (queue) to route via (to).",
    "x-local-random": "Picks one random local binding (queue) to route via (to).",
    "x-delayed-message": "Delayed Message Exchange.",
}
UNLIMITED_PROCESSES = 1 << 20  # reported as proc_total when RLIMIT_NPROC is unlimited


# -- message counters -------------------------------------------------------------------------------


async def message_totals(agent: ManagementAgentPort, node: Node, p: Principal | None = None) -> dict[str, int]:
    """Node-wide message counters (closed channels plus live ones; or, for a non-monitor `p`, those of
    the live channels in its vhosts), by RabbitMQ's message_stats names, as the node's agent counts them."""
    if p is None or p.is_monitor:
        return msg_stats(values_of(await agent.counts()))
    names = set(visible_vhosts(node, p))
    values = ZERO_CHANNEL
    for ch in await agent.channels():
        if ch["vhost"] in names:
            values = add(values, values_of(ch["message_stats"]))
    return msg_stats(values)


# -- overview ---------------------------------------------------------------------------------------


def _exchange_types() -> list[dict[str, Any]]:
    return [{"name": t, "description": _EXCHANGE_TYPE_DESCRIPTIONS.get(t, ""), "enabled": True}
            for t in EXCHANGE_TYPES]


def _listeners(node: Node) -> list[dict[str, Any]]:
    cfg = node.config
    out = [{"node": node.public_name, "protocol": "amqp", "ip_address": listen.display_host(cfg.amqp_host),
            "port": node.amqp_port or cfg.amqp_port}]
    if cfg.management_tcp:
        out.append({"node": node.public_name, "protocol": "http", "ip_address": listen.display_host(cfg.management_host),
                    "port": node.management_port or cfg.management_port})
    if node.amqps_port:  # the TLS listeners (runtime/tls.py, RabbitMQ's protocol names)
        out.append({"node": node.public_name, "protocol": "amqp/ssl", "ip_address": listen.display_host(cfg.amqps_host),
                    "port": node.amqps_port})
    if node.management_ssl_port:
        out.append({"node": node.public_name, "protocol": "https", "ip_address": listen.display_host(cfg.management_ssl_host),
                    "port": node.management_ssl_port})
    return out


async def overview(agent: ManagementAgentPort, node: Node, p: Principal, stats: StatsView | None = None
                   ) -> dict[str, Any]:
    names = visible_vhosts(node, p)
    counts = await agent.counts()
    if p.is_monitor:  # every connection
        n_conns, n_channels = counts["connections"], counts["channels"]
    else:
        conns = [c for c in await agent.connections() if may_see_user_object(p, c["user"])]
        n_conns, n_channels = len(conns), sum(c["channels"] for c in conns)
    queues = ready = unacked = consumers = 0
    for name in names:  # one pass: with 10,000 queues this is most of the overview's cost
        for q in node.vhosts[name].queues.values():
            queues += 1
            ready += q.message_count
            unacked += q.unacked_count
            consumers += q.consumer_count
    out: dict[str, Any] = {
        "management_version": __version__,
        "product_name": "hutch",
        "product_version": __version__,
        "python_version": platform.python_version(),
        "rates_mode": "basic",
        "sample_retention_policies": _stats.sample_retention_policies(),
        "node": node.public_name,
        "cluster_name": node.config.cluster_name,
        "exchange_types": _exchange_types(),
        "listeners": _listeners(node),
        "contexts": [{"node": node.public_name, "description": "RabbitMQ Management", "path": "/",
                      "port": str(node.management_port or node.config.management_port)}],
        "object_totals": {
            "connections": n_conns,
            "channels": n_channels,
            "exchanges": sum(len(node.vhosts[name].exchanges) for name in names),
            "queues": queues,
            "consumers": consumers,
        },
        "statistics_db_event_queue": 0,
    }
    churn = [node.churn[k] for k in _stats.CHURN_KEYS]
    if stats is not None:
        out.update(stats.overview(None if p.is_monitor else names, values_of(counts), (ready, unacked), churn))
    else:
        out["message_stats"] = await message_totals(agent, node, p)
        out["queue_totals"] = {"messages": ready + unacked, "messages_ready": ready,
                               "messages_unacknowledged": unacked}
        out["churn_rates"] = {name: churn[idx[0]] for name, idx in _stats.CHURN}
    return out


# -- cluster name -----------------------------------------------------------------------------------


def get_cluster_name(node: Node) -> dict[str, Any]:
    return {"name": node.config.cluster_name}


def put_cluster_name(node: Node, p: Principal, body: Any) -> None:
    """PUT /api/cluster-name {"name": ...}: administrators only (RabbitMQ's rule)."""
    require_admin(p)
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise bad_request("[{key_missing,name}]" if not isinstance(body, dict) or "name" not in body
                          else "name must be a non-empty string")
    node.set_cluster_name(name)


# -- nodes ------------------------------------------------------------------------------------------


def _limit(which: int, unlimited: int) -> int:
    soft, _hard = resource.getrlimit(which)
    return unlimited if soft == resource.RLIM_INFINITY else int(soft)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _disk_free(node: Node) -> int:
    try:
        return shutil.disk_usage(node.config.data_dir).free
    except OSError:
        return 0


async def node_figures(agent: ManagementAgentPort, node: Node) -> tuple[int, ...]:
    """The figures the collector samples, in stats.NODE_FIELDS order: the node's processes' (summed over
    the workers of a node of workers) and the data directory's free disk."""
    f = await agent.process_figures()
    return (f["mem_used"], f["fd_used"], f["sockets_used"], f["proc_used"], _disk_free(node), f["io_sync_count"])


async def own_node_info(agent: ManagementAgentPort, node: Node, now_ms: float,
                        stats: StatsView | None = None) -> dict[str, Any]:
    """This node's `node_info`, its process figures as its agent answers them (every worker's, summed)."""
    return node_info(node, now_ms, await agent.process_figures(), stats)


def node_info(node: Node, now_ms: float, figures: Mapping[str, int], stats: StatsView | None = None
              ) -> dict[str, Any]:
    """GET /api/nodes' object for this node; `figures` are its processes' (runtime/procinfo.py's
    PROCESS_FIGURES, as `ManagementAgentPort.process_figures` answers them)."""
    cfg = node.config
    disk_free = _disk_free(node)
    fd_total = _limit(resource.RLIMIT_NOFILE, 1 << 20)
    pid, started = procinfo.node_process(cfg.worker_index, node.started_at)
    out: dict[str, Any] = {
        "name": node.public_name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "uptime": int(now_ms - started * 1000),
        "os_pid": str(pid),
        "processors": os.cpu_count() or 1,
        "run_queue": 0,
        "rates_mode": "basic",
        "mem_used": figures["mem_used"],
        "mem_limit": int(_physical_memory() * cfg.vm_memory_high_watermark),
        "mem_alarm": "memory" in node.alarms,
        "mem_paging": node.memory_pressure,
        # message storage: group-commit batches that synced and fdatasync calls made (RabbitMQ's
        # io_sync_count counts fsyncs too)
        "io_sync_count": figures["io_sync_count"],
        "io_sync_batch_count": figures["io_sync_batch_count"],
        "disk_free": disk_free,
        "disk_free_limit": cfg.disk_free_limit_bytes,
        "disk_free_alarm": "disk" in node.alarms,
        "fd_used": figures["fd_used"],
        "fd_total": fd_total,
        "sockets_used": figures["sockets_used"],
        "sockets_total": fd_total,
        "proc_used": figures["proc_used"],
        "proc_total": _limit(resource.RLIMIT_NPROC, UNLIMITED_PROCESSES),
        "exchange_types": _exchange_types(),
        "auth_mechanisms": [{"name": m, "description": "", "enabled": True} for m in ("PLAIN", "AMQPLAIN")],
        "applications": [{"name": "hutch", "description": "hutch message broker", "version": __version__}],
        "contexts": [{"description": "RabbitMQ Management", "path": "/",
                      "port": str(node.management_port or cfg.management_port)}],
        "enabled_plugins": ["rabbitmq_management"],
        "partitions": [],
        "config_files": [cfg.config_file] if cfg.config_file else [],
        "db_dir": cfg.data_dir,
        "log_files": ["<stderr>"],
    }
    if stats is not None:
        stats.node(tuple(out[k] for k in _stats.NODE_FIELDS), out)
    return out


# -- the other nodes of a cluster -------------------------------------------------------------------


def serve_node_info(node: Node, agent: ManagementAgentPort) -> None:
    """Let the other nodes of a cluster ask this one for its `node_info` (GET /api/nodes there)."""
    cluster = cluster_service(node)
    if cluster is not None:
        async def answer(_peer: str, _req: cm.NodeInfo) -> dict[str, Any]:
            return await own_node_info(agent, node, node.wall_ms())

        cluster.register(cm.NodeInfo, answer)


async def _member_info(node: Node, name: str, members: list[str] | None = None) -> dict[str, Any]:
    """Node `name`'s `node_info`, asked of the member that answers for it: the node itself, or for a node
    of workers its first worker (worker 0, whose management agent gathers the node's workers)."""
    cluster = cluster_service(node)
    assert cluster is not None
    for member in members or [name]:
        if cluster.transport.connected(member):
            try:
                info: dict[str, Any] = await cluster.call(member, cm.NodeInfo(), timeout=2.0)
                return info
            except Exception:  # noqa: BLE001 - a node that does not answer is shown as not running
                pass
    return {"name": name, "type": "disc", "running": False}


def _other_nodes(node: Node) -> dict[str, list[str]]:
    """The cluster's other nodes, each with its members (a node of workers: its workers, worker 0 first;
    they are one node outside, docs/scaling.md)."""
    cluster = cluster_service(node)
    if cluster is None:
        return {}
    grouped = nodes_of(m for m in sorted(cluster.machine.members) if not _own_member(node, m))
    return {name: sorted(ms, key=lambda m: (m != worker_name(name, 0), m)) for name, ms in grouped.items()}


def _own_member(node: Node, member: str) -> bool:
    """Whether the cluster member `member` is this node: itself, or (in a node of workers, whose
    workers are its internal cluster) one of its node's workers, which are never shown as nodes."""
    return member == node.name or (node.public_name != node.name and node_of_worker(member) == node.public_name)


async def list_cluster_nodes(agent: ManagementAgentPort, node: Node, p: Principal, now_ms: float,
                             stats: StatsView | None = None) -> list[dict[str, Any]]:
    """Every member of the cluster (this node's figures, the others' as they report them)."""
    require_monitor(p)
    own = await own_node_info(agent, node, now_ms, stats)
    cluster = cluster_service(node)
    if cluster is None:
        return [own]
    return [own, *[await _member_info(node, name, ms) for name, ms in _other_nodes(node).items()]]


async def get_cluster_node(agent: ManagementAgentPort, node: Node, p: Principal, name: str, now_ms: float,
                           stats: StatsView | None = None) -> dict[str, Any]:
    require_monitor(p)
    if name == node.public_name:
        return await own_node_info(agent, node, now_ms, stats)
    others = _other_nodes(node)
    if name not in others:
        raise not_found()  # a worker (of this node or another) is no node of its own
    return await _member_info(node, name, others[name])


# -- aliveness --------------------------------------------------------------------------------------


def aliveness_test(node: Node, p: Principal, vhost: str) -> dict[str, Any]:
    """RabbitMQ's check: declare queue `aliveness-test`, publish a message to it through the default
    exchange, get it back. The queue is left in place, as RabbitMQ does."""
    v = vhost_for_write(node, p, vhost)
    require_amqp(node, p, vhost, "configure", "queue", ALIVENESS_QUEUE)
    require_amqp(node, p, vhost, "write", "exchange", "")
    require_amqp(node, p, vhost, "read", "queue", ALIVENESS_QUEUE)
    try:
        q = node.declare_queue(v, ALIVENESS_QUEUE, False, False, False, {}, None)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    q.publish(Message("", ALIVENESS_QUEUE, BasicProperties(), ALIVENESS_BODY))
    entry = q.get(None, True)  # no channel: no-ack get, nothing to settle
    if entry is None or entry.msg.body != ALIVENESS_BODY:
        return {"status": "failed", "reason": "the test message did not come back"}
    return {"status": "ok"}


__all__ = [
    "ALIVENESS_QUEUE",
    "aliveness_test",
    "get_cluster_name",
    "get_cluster_node",
    "list_cluster_nodes",
    "message_totals",
    "node_figures",
    "node_info",
    "own_node_info",
    "overview",
    "put_cluster_name",
]
