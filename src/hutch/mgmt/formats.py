"""JSON shapes of the management API: one function per object kind, RabbitMQ's field names.

Owns: the mapping from runtime and core objects (queues, exchanges, bindings, users, vhosts,
permissions, policies) to the JSON objects RabbitMQ's HTTP API returns. Connections, channels and
consumers come already shaped from the management agent (runtime/agent.py, through the port);
`jsonable` (core/plain.py) makes AMQP field-table values JSON-safe. Pure: reads objects, never
changes them.

Rules:
- Field names and value types are RabbitMQ's, so existing clients (rabbitmqadmin, monitoring
  scripts, client libraries' admin helpers) read them unchanged. Fields RabbitMQ derives from
  Erlang internals (pids, reductions, garbage collection) are left out rather than invented.
- Message counters are cumulative counts since the object was created (`message_stats`); given a
  `StatsView` (stats.py), each counter and queue length gets RabbitMQ's `<name>_details` (rate, and
  samples for a range).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.core.auth import export_password_hash
from hutch.core.counters import channel_name, queue_counters
from hutch.core.plain import jsonable
from hutch.core.routing import DELAYED_MESSAGE, Binding, queue_dest

if TYPE_CHECKING:
    from hutch.core.auth import User, UserPermission, Vhost
    from hutch.core.policy import Policy
    from hutch.core.routing import Exchange

    from .stats import StatsView

HASHING_ALGORITHM = "hutch_password_hashing_scrypt"
DEFAULT_EXCHANGE_URL_NAME = "amq.default"


# -- queues, exchanges, bindings --------------------------------------------------------------------


def queue_rates(out: dict[str, Any], stats: StatsView | None) -> dict[str, Any]:
    """A queue as the management agent answered it (runtime/agent.py), with RabbitMQ's `<name>_details`
    for its lengths and message_stats when the request has statistics. In place; the key order is the
    one the API has always had (details, then message_stats, then owner_pid_details)."""
    if stats is None:
        return out
    counters = out.pop("message_stats")
    owner = out.pop("owner_pid_details", None)
    values = queue_counters(counters, out["messages_ready"], out["messages_unacknowledged"])
    stats.queue((out["vhost"], out["name"]), values, out)
    if owner is not None:
        out["owner_pid_details"] = owner
    return out


def exchange_json(x: Exchange, stats: StatsView | None = None, delayed: Any = None) -> dict[str, Any]:
    """`delayed` (anything with `count(vhost, exchange)`: topology.HeldCounts, gathered from the workers)
    gives an x-delayed-message exchange's `messages_delayed`."""
    out: dict[str, Any] = {
        "name": x.name,
        "vhost": x.vhost,
        "type": x.type,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": jsonable(x.arguments),
        "policy": x.policy,
    }
    if x.type == DELAYED_MESSAGE:  # the plugin's exchange info item
        out["messages_delayed"] = delayed.count(x.vhost, x.name) if delayed is not None else 0
    if stats is not None:
        out["message_stats"] = stats.exchange((x.vhost, x.name))
    return out


def binding_json(vhost: str, b: Binding) -> dict[str, Any]:
    kind, name = b.destination
    return {
        "source": b.source,
        "vhost": vhost,
        "destination": name,
        "destination_type": kind,
        "routing_key": b.routing_key,
        "arguments": jsonable(b.arguments),
        "properties_key": b.properties_key,
    }


def default_binding_json(vhost: str, queue_name: str) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange, which RabbitMQ lists."""
    return {
        "source": "",
        "vhost": vhost,
        "destination": queue_name,
        "destination_type": "queue",
        "routing_key": queue_name,
        "arguments": {},
        "properties_key": Binding("", queue_dest(queue_name), queue_name, {}).properties_key,
    }


# -- users, vhosts, permissions ---------------------------------------------------------------------


def user_json(user: User) -> dict[str, Any]:
    password_hash, algorithm = export_password_hash(user.password_hash)
    return {
        "name": user.name,
        "password_hash": password_hash,
        "hashing_algorithm": algorithm,
        "tags": list(user.tags),
        "limits": {},
    }


def vhost_json(v: Vhost, node_name: str, totals: dict[str, int]) -> dict[str, Any]:
    return {
        "name": v.name,
        "description": v.description,
        "tags": list(v.tags),
        "default_queue_type": v.default_queue_type,
        "metadata": {"description": v.description, "tags": list(v.tags),
                     "default_queue_type": v.default_queue_type},
        "tracing": False,
        "cluster_state": {node_name: "running"},
        **totals,
    }


def permission_json(entry: UserPermission) -> dict[str, Any]:
    return {"user": entry.user, "vhost": entry.vhost, **entry.permission.to_dict()}


def policy_json(policy: Policy) -> dict[str, Any]:
    """A policy or operator policy: vhost, name, pattern, apply-to, definition, priority."""
    return policy.to_dict()


__all__ = [
    "DEFAULT_EXCHANGE_URL_NAME",
    "HASHING_ALGORITHM",
    "binding_json",
    "channel_name",
    "default_binding_json",
    "exchange_json",
    "jsonable",
    "permission_json",
    "policy_json",
    "queue_rates",
    "user_json",
    "vhost_json",
]
