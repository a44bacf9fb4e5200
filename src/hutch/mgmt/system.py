"""Service layer: the node as a whole (overview, nodes, aliveness test) and message-rate sampling.

Owns: `overview` and `node_info` (RabbitMQ's GET /api/overview and /api/nodes shapes), the
`aliveness_test`, `message_totals` (node-wide message counters) and `RateSampler`, which turns two
samples of those counters into per-second rates. Reads process figures (RSS, file descriptors)
from /proc and `resource` where the platform has them; everything else is pure.

Rules:
- `message_stats` counters are the channels' stat_* counters: those of live channels plus
  `Node.closed_channel_stats` for the channels that have closed, so totals never go down.
  `get` comes from the queues (basic.get is counted there). Non-monitors see only the counters
  of live channels in their vhosts (RabbitMQ narrows overview figures the same way).
- Rates (`*_details.rate`, messages per second) are computed by `RateSampler` from samples the
  HTTP service takes every `collect_statistics_interval` ms; they are 0.0 until two samples exist.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import threading
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.amqp.errors import AMQPError
from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.routing import EXCHANGE_TYPES

from . import formats
from .access import (
    Principal,
    may_see_user_object,
    require_amqp,
    require_monitor,
    vhost_for_write,
    visible_vhosts,
)
from .errors import from_amqp, not_found

if TYPE_CHECKING:
    from hutch.runtime.node import Node

ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"
STAT_NAMES = ("publish", "deliver", "deliver_get", "get", "ack", "redeliver")
_EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
}
UNLIMITED_PROCESSES = 1 << 20  # reported as proc_total when RLIMIT_NPROC is unlimited


# -- message counters -------------------------------------------------------------------------------


def message_totals(node: Node, p: Principal | None = None) -> dict[str, int]:
    """Node-wide message counters (or, for a non-monitor `p`, those of its live visible channels)."""
    everything = p is None or p.is_monitor
    totals: dict[str, int] = {}
    if everything:
        for key, value in node.closed_channel_stats.items():
            name = key[5:]
            totals[name] = totals.get(name, 0) + value
    names = set(node.vhosts) if everything else set(visible_vhosts(node, p))  # type: ignore[arg-type]
    for conn in node.connections:
        if conn.vhost_obj is None or conn.vhost_obj.name not in names:
            continue
        for ch in list(conn.channels.values()):
            for name, value in formats.channel_stats(ch).items():
                if name != "deliver_get":
                    totals[name] = totals.get(name, 0) + value
    gets = sum(q.stat_get for name in names for q in node.vhosts[name].queues.values())
    totals["get"] = totals.get("get", 0) + gets
    for name in STAT_NAMES:
        totals.setdefault(name, 0)
    totals["deliver_get"] = totals["deliver"] + totals["get"]
    return totals


class RateSampler:
    """Per-second rates between the last two samples of `message_totals`. Time comes in as seconds."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, int]] | None = None
        self.rates: dict[str, float] = {}

    def sample(self, now_s: float, totals: dict[str, int]) -> None:
        if self._last is not None:
            then_s, before = self._last
            elapsed = now_s - then_s
            if elapsed > 0:
                self.rates = {k: max(0.0, (v - before.get(k, 0)) / elapsed) for k, v in totals.items()}
        self._last = (now_s, dict(totals))

    def with_details(self, totals: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = dict(totals)
        for key in totals:
            out[f"{key}_details"] = {"rate": round(self.rates.get(key, 0.0), 1)}
        return out


# -- overview ---------------------------------------------------------------------------------------


def _exchange_types() -> list[dict[str, Any]]:
    return [{"name": t, "description": _EXCHANGE_TYPE_DESCRIPTIONS.get(t, ""), "enabled": True}
            for t in EXCHANGE_TYPES]


def _listeners(node: Node) -> list[dict[str, Any]]:
    cfg = node.config
    return [
        {"node": node.name, "protocol": "amqp", "ip_address": cfg.amqp_host or "0.0.0.0",
         "port": node.amqp_port or cfg.amqp_port},
        {"node": node.name, "protocol": "http", "ip_address": cfg.management_host or "0.0.0.0",
         "port": node.management_port or cfg.management_port},
    ]


def overview(node: Node, p: Principal, sampler: RateSampler | None = None) -> dict[str, Any]:
    names = visible_vhosts(node, p)
    queues = [q for name in names for q in node.vhosts[name].queues.values()]
    conns = [c for c in node.connections if may_see_user_object(p, c.user_name)]
    channels = [ch for c in conns for ch in list(c.channels.values())]
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    totals = message_totals(node, p)
    stats = sampler.with_details(totals) if sampler is not None and p.is_monitor else totals
    return {
        "management_version": __version__,
        "product_name": "hutch",
        "product_version": __version__,
        "python_version": platform.python_version(),
        "rates_mode": "basic",
        "node": node.name,
        "cluster_name": node.config.cluster_name,
        "exchange_types": _exchange_types(),
        "listeners": _listeners(node),
        "contexts": [{"node": node.name, "description": "RabbitMQ Management", "path": "/",
                      "port": str(node.management_port or node.config.management_port)}],
        "object_totals": {
            "connections": len(conns),
            "channels": len(channels),
            "exchanges": sum(len(node.vhosts[name].exchanges) for name in names),
            "queues": len(queues),
            "consumers": sum(q.consumer_count for q in queues),
        },
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready,
                         "messages_unacknowledged": unacked},
        "message_stats": stats,
        "statistics_db_event_queue": 0,
    }


# -- nodes ------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


def _fd_used() -> int:
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 0


def _limit(which: int, unlimited: int) -> int:
    soft, _hard = resource.getrlimit(which)
    return unlimited if soft == resource.RLIM_INFINITY else int(soft)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def node_info(node: Node, now_ms: float) -> dict[str, Any]:
    cfg = node.config
    try:
        disk_free = shutil.disk_usage(cfg.data_dir).free
    except OSError:
        disk_free = 0
    fd_total = _limit(resource.RLIMIT_NOFILE, 1 << 20)
    storage = node.persistence
    return {
        "name": node.name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "uptime": int(now_ms - node.started_at * 1000),
        "os_pid": str(os.getpid()),
        "processors": os.cpu_count() or 1,
        "run_queue": 0,
        "rates_mode": "basic",
        "mem_used": _rss_bytes(),
        "mem_limit": int(_physical_memory() * cfg.vm_memory_high_watermark),
        "mem_alarm": "memory" in node.alarms,
        "mem_paging": node.memory_pressure,
        # message storage: group-commit batches that synced and fdatasync calls made (RabbitMQ's
        # io_sync_count counts fsyncs too)
        "io_sync_count": storage.sink.fsyncs if storage is not None else 0,
        "io_sync_batch_count": storage.sink.syncs if storage is not None else 0,
        "disk_free": disk_free,
        "disk_free_limit": cfg.disk_free_limit_bytes,
        "disk_free_alarm": "disk" in node.alarms,
        "fd_used": _fd_used(),
        "fd_total": fd_total,
        "sockets_used": len(node.connections),
        "sockets_total": fd_total,
        "proc_used": threading.active_count(),
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


def list_nodes(node: Node, p: Principal, now_ms: float) -> list[dict[str, Any]]:
    require_monitor(p)
    return [node_info(node, now_ms)]


def get_node(node: Node, p: Principal, name: str, now_ms: float) -> dict[str, Any]:
    require_monitor(p)
    if name != node.name:
        raise not_found()
    return node_info(node, now_ms)


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
    entry = q.get(None, True)  # type: ignore[arg-type]  # no channel: no-ack get, nothing to settle
    if entry is None or entry.msg.body != ALIVENESS_BODY:
        return {"status": "failed", "reason": "the test message did not come back"}
    return {"status": "ok"}


__all__ = [
    "ALIVENESS_QUEUE",
    "RateSampler",
    "aliveness_test",
    "get_node",
    "list_nodes",
    "message_totals",
    "node_info",
    "overview",
]
