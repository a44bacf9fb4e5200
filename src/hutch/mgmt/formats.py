"""JSON shapes of the management API: one function per object kind, RabbitMQ's field names.

Owns: the mapping from runtime and core objects (queues, exchanges, bindings, connections,
channels, consumers, users, vhosts, permissions, policies) to the JSON objects RabbitMQ's HTTP API
returns, and `jsonable`, which makes AMQP field-table values (bytes, Decimal, timestamps) JSON-safe.
Pure: reads objects, never changes them.

Rules:
- Field names and value types are RabbitMQ's, so existing clients (rabbitmqadmin, monitoring
  scripts, client libraries' admin helpers) read them unchanged. Fields RabbitMQ derives from
  Erlang internals (pids, reductions, garbage collection) are left out rather than invented.
- Message counters are cumulative counts since the object was created (`message_stats`); given a
  `StatsView` (stats.py), each counter and queue length gets RabbitMQ's `<name>_details` (rate, and
  samples for a range).
"""

from __future__ import annotations

import datetime as _dt
import functools
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cryptography import x509

from hutch.core.auth import export_password_hash
from hutch.core.routing import DELAYED_MESSAGE, Binding, queue_dest
from hutch.runtime.queue_types.remote import RemoteQueue
from hutch.runtime.session.connection import AMQPConnection

from . import stats as _stats

if TYPE_CHECKING:
    from hutch.core.auth import User, UserPermission, Vhost
    from hutch.core.policy import Policy
    from hutch.core.queue_type import Consumer, Queue
    from hutch.core.routing import Exchange
    from hutch.runtime.session.channel import ServerChannel

    from .stats import StatsView

HASHING_ALGORITHM = "hutch_password_hashing_scrypt"
DEFAULT_EXCHANGE_URL_NAME = "amq.default"


def jsonable(value: Any) -> Any:
    """A JSON-encodable copy of an AMQP value (field tables, arrays, client properties)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, _dt.datetime):
        return int(value.timestamp())
    return str(value)


# -- queues, exchanges, bindings --------------------------------------------------------------------


def queue_json(q: Queue, node_name: str, stats: StatsView | None = None) -> dict[str, Any]:
    out = dict(q.info())
    out["arguments"] = jsonable(q.arguments)
    consumers = int(out.get("consumers", 0))
    remote = q if isinstance(q, RemoteQueue) else None  # a queue on another node of the cluster
    out.update({
        "node": remote.home if remote is not None else node_name,
        "state": "running" if remote is None or remote.link.up(remote.home) else "down",
        "policy": q.settings.policy,
        "operator_policy": q.settings.operator_policy,
        "effective_policy_definition": jsonable(q.settings.effective_policy_definition),
        "exclusive_consumer_tag": None,
        "consumer_capacity": 1.0 if consumers else 0.0,
        "consumer_utilisation": 1.0 if consumers else 0.0,
        "message_bytes_ready": out.get("message_bytes", 0),
    })
    info_lengths: dict[str, Any] = {k: out[k] for k in ("messages", "messages_ready", "messages_unacknowledged")
                                    if k in out}
    if stats is not None:
        stats.queue(q, out)
    else:
        values = _stats.queue_values(q)
        out["message_stats"] = {name: sum(values[i] for i in idx) for name, idx in _stats.QUEUE_MSG_STATS}
    if q.queue_type == "stream":  # a log: its length is what it holds, not what is ready (docs/streams.md)
        out.update(info_lengths)
    owner = q.exclusive_owner
    if isinstance(owner, AMQPConnection):
        out["owner_pid_details"] = {"name": owner.name, "peer_host": owner.peer[0],
                                    "peer_port": owner.peer[1]}
    return out


def exchange_json(x: Exchange, stats: StatsView | None = None, delayed: Any = None) -> dict[str, Any]:
    """`delayed` (the node's DelayedPort) gives an x-delayed-message exchange's `messages_delayed`."""
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
        out["message_stats"] = stats.exchange(x)
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


# -- connections, channels, consumers ---------------------------------------------------------------


def connection_json(conn: AMQPConnection, node_name: str, stats: StatsView | None = None) -> dict[str, Any]:
    out = dict(conn.info())
    props = jsonable(out.get("client_properties") or {})
    out["client_properties"] = props
    host, port = "", 0
    transport = conn.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    if sock:
        host, port = str(sock[0]), int(sock[1])
    out.update({
        "node": node_name,
        "host": host,
        "port": port,
        "ssl": conn.ssl_object is not None,
        "ssl_protocol": conn.ssl_object.version() if conn.ssl_object is not None else None,
        "ssl_cipher": (conn.ssl_object.cipher() or ("",))[0] if conn.ssl_object is not None else None,
        **peer_cert_json(conn.peer_cert),
        "type": "network",
        "user_provided_name": props.get("connection_name") if isinstance(props, dict) else None,
    })
    if stats is not None:
        stats.connection(conn, out)
    return out


_NO_PEER_CERT: dict[str, str | None] = {"peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None}


@functools.lru_cache(maxsize=256)  # a connection list re-reads the same few certificates on every poll
def peer_cert_json(der: bytes | None) -> dict[str, str | None]:
    """RabbitMQ's `peer_cert_subject`, `peer_cert_issuer` (RFC 4514, most specific first, as
    core/certs.py names a certificate's user) and `peer_cert_validity` ("<not before> - <not after>",
    UTC) of the client certificate the TLS handshake verified; None each without one."""
    if not der:
        return _NO_PEER_CERT
    cert = x509.load_der_x509_certificate(der)
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return {"peer_cert_subject": cert.subject.rfc4514_string(), "peer_cert_issuer": cert.issuer.rfc4514_string(),
            "peer_cert_validity": f"{cert.not_valid_before_utc.strftime(stamp)} - "
                                  f"{cert.not_valid_after_utc.strftime(stamp)}"}


def channel_name(ch: ServerChannel) -> str:
    return f"{ch.conn.name} ({ch.number})"


def channel_stats(ch: ServerChannel) -> dict[str, int]:
    """The channel's counters by RabbitMQ's message_stats names (`deliver`: manual acknowledgement)."""
    values = _stats.channel_values(ch)
    return {name: sum(values[i] for i in idx) for name, idx in _stats.MSG_STATS}


def channel_json(ch: ServerChannel, node_name: str, stats: StatsView | None = None) -> dict[str, Any]:
    out = dict(ch.info())
    conn = ch.conn
    out.update({
        "name": channel_name(ch),
        "node": node_name,
        "connection_details": {"name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1]},
        "message_stats": stats.channel(ch) if stats is not None else channel_stats(ch),
        # RabbitMQ's names: confirm-mode publishes not confirmed yet, transactional publishes not committed
        "messages_unconfirmed": ch.unconfirmed_count(),
        "messages_uncommitted": sum(1 for op in ch.tx_ops if op[0] == "publish") if ch.tx else 0,
    })
    return out


def consumer_json(consumer: Consumer, ch: ServerChannel, node_name: str, timeout_ms: int) -> dict[str, Any]:
    conn = ch.conn
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost},
        "channel_details": {
            "name": channel_name(ch),
            "number": ch.number,
            "connection_name": conn.name,
            "peer_host": conn.peer[0],
            "peer_port": conn.peer[1],
            "user": ch.user,
            "node": node_name,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "priority": consumer.priority,
        "arguments": jsonable(consumer.arguments),
        "active": True,
        "activity_status": "up",
        "consumer_timeout": timeout_ms,
        **consumer.queue.consumer_info(consumer),  # a stream's consumer: offset, offset_lag, credits
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
    "channel_json",
    "channel_name",
    "channel_stats",
    "connection_json",
    "consumer_json",
    "default_binding_json",
    "exchange_json",
    "jsonable",
    "permission_json",
    "policy_json",
    "queue_json",
    "user_json",
    "vhost_json",
]
