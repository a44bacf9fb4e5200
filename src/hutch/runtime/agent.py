"""The management agent of this process: what it holds, as plain data (runtime/ports.py's
`ManagementAgentPort`).

Owns: `LocalAgent`, which answers the management API's queries about the AMQP connections, channels,
consumers and queues of one process, and carries out its commands on them (close a connection, a
user's connections; purge or delete a queue), and the JSON shapes of those objects (RabbitMQ's field names, no rates: mgmt/stats.py
adds those). RabbitMQ's `rabbit_mgmt_agent` on each node is the model; a node of several worker
processes answers by gathering every worker's agent (runtime/gather.py).

Rules:
- Answers are plain data (dict, list, str, int, float, bool, None), safe to send over a process or
  node boundary unchanged; nothing answered aliases a live object (client properties are copied).
- Fields RabbitMQ derives from Erlang internals (pids, reductions) are left out rather than invented.
- Only this module (and the composition root that builds it) reads the session's classes on behalf of
  the management layer: mgmt/ sees the port.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from cryptography import x509

from hutch.amqp.errors import CONNECTION_FORCED, AMQPError, ConnectionError_
from hutch.core.counters import (
    QUEUE_MSG_STATS,
    add,
    channel_metric_values,
    channel_name,
    channel_values,
    closed_values,
    exchange_counts,
    msg_stats,
    queue_values,
)
from hutch.core.plain import jsonable
from hutch.core.routing import DELAYED_MESSAGE
from hutch.core.tls_names import tls_fields

from . import procinfo
from .queue_types.remote_queue import RemoteQueue
from .queue_types.stream.queue import StreamQueue
from .session.channel import ServerChannel
from .session.connection import AMQPConnection
from .workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.core.queue_type import Consumer, Queue

    from .broker.node import Node


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


def connection_json(conn: AMQPConnection, node_name: str) -> dict[str, Any]:
    out = dict(conn.info())
    props = jsonable(out.get("client_properties") or {})
    out["client_properties"] = props
    tls = conn.tls  # its own TLS session's, or the relaying worker's (a TLS connection moved here)
    out.update({
        "node": node_name,
        "host": conn.sockname[0],
        "port": conn.sockname[1],
        **tls_fields(tls),  # RabbitMQ's spelling: tlsv1.3, aes_256_gcm (core/tls_names.py)
        **peer_cert_json(conn.peer_cert),
        "type": "network",
        "user_provided_name": props.get("connection_name") if isinstance(props, dict) else None,
    })
    return out


def channel_json(ch: ServerChannel, node_name: str) -> dict[str, Any]:
    out = dict(ch.info())
    conn = ch.conn
    out.update({
        "name": channel_name(ch),
        "node": node_name,
        "connection_details": {"name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1]},
        "message_stats": msg_stats(channel_values(ch)),
        # RabbitMQ's names: confirm-mode publishes not confirmed yet, transactional publishes not committed
        "messages_unconfirmed": ch.unconfirmed_count(),
        "messages_uncommitted": sum(1 for op in ch.tx_ops if op[0] == "publish") if ch.tx else 0,
        "acks_uncommitted": sum(1 for op in ch.tx_ops if op[0] in ("ack", "reject")) if ch.tx else 0,
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


def _exchange_samples(ch: ServerChannel) -> list[list[Any]]:
    """The channel's [vhost, exchange, published, routed] for the exchanges that still exist; forgets
    those deleted (or replaced by another of the same name), which bounds `x_counts`."""
    vhost = ch.vhost
    if vhost is None:
        return []
    out: list[list[Any]] = []
    for x, (published, routed) in exchange_counts(ch).items():
        known = vhost.exchanges.get(x.name)
        if known is not None and known is x:
            out.append([known.vhost, known.name, published, routed])
    for gone in [g for g in ch.x_counts if vhost.exchanges.get(g.name) is not g]:
        del ch.x_counts[gone]
    return out


def _publishes(ch: ServerChannel) -> list[dict[str, Any]]:
    """The channel's publishes per exchange that still exists (not deleted, nor replaced by another of
    the same name)."""
    out = []
    for x, (published, _routed) in exchange_counts(ch).items():
        known = ch.vhost.exchanges.get(x.name) if ch.vhost is not None else None
        if known is not None and known is x:
            out.append({"exchange": {"name": known.name, "vhost": known.vhost}, "stats": {"publish": published}})
    return out


def queue_light(q: Queue) -> dict[str, Any]:
    """The fields a paginated queue list may sort on without formatting every queue (mgmt/listing.py)."""
    ready, unacked = q.message_count, q.unacked_count
    return {"name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
            "exclusive": q.exclusive, "messages": ready + unacked, "messages_ready": ready,
            "messages_unacknowledged": unacked, "consumers": q.consumer_count}


def queue_json(q: Queue, node_name: str) -> dict[str, Any]:
    """A queue as GET /api/queues shows it, `message_stats` its live counters (no rates)."""
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
    values = queue_values(q)
    out["message_stats"] = {name: sum(values[i] for i in idx) for name, idx in QUEUE_MSG_STATS}
    owner = q.exclusive_owner
    if isinstance(owner, AMQPConnection):
        out["owner_pid_details"] = {"name": owner.name, "peer_host": owner.peer[0],
                                    "peer_port": owner.peer[1]}
    plain: dict[str, Any] = jsonable(out)  # plain data: info() of some queue types carries tuples
    return node_named(plain)


def node_named(out: dict[str, Any]) -> dict[str, Any]:
    """A replicated queue's `leader`, `members` and `online` as nodes, as RabbitMQ names them: a member
    that is a worker of a node of workers (`<node>#w<N>`) is its node, listed once (a node's workers each
    hold a member of its streams; in a multi-node cluster a quorum member is one worker of its node).
    Where that changed a name, the members by worker are kept in hutch's own `leader_worker` and
    `member_workers`. In place; returns `out`."""
    leader, members = out.get("leader"), out.get("members")
    if not isinstance(members, list) or not any(isinstance(m, str) and node_of_worker(m) != m for m in members):
        return out
    out["leader_worker"], out["member_workers"] = leader, list(members)
    if isinstance(leader, str):
        out["leader"] = node_of_worker(leader)
    for field in ("members", "online"):
        names = out.get(field)
        if isinstance(names, list):
            out[field] = list(dict.fromkeys(node_of_worker(m) if isinstance(m, str) else m for m in names))
    return out


class LocalAgent:
    """The management agent of one process: answers for `node`'s connections, channels and consumers."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def name(self) -> str:
        return self.node.name

    def _connections(self) -> list[AMQPConnection]:
        return list(self.node.connections)

    def _channels(self, conn: AMQPConnection) -> list[ServerChannel]:
        return list(conn.channels.values())

    async def counts(self) -> dict[str, int]:
        conns = self._connections()
        channels = consumers = 0
        values = closed_values(self.node.closed_channel_stats)
        for conn in conns:
            for ch in self._channels(conn):
                channels += 1
                consumers += len(ch.consumers)
                values = add(values, channel_values(ch))
        return {"connections": len(conns), "channels": channels, "consumers": consumers, **msg_stats(values)}

    async def connections(self) -> list[dict[str, Any]]:
        return [connection_json(c, self.name) for c in self._connections()]

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        conns = [c for c in self._connections() if connection is None or c.name == connection]
        return [channel_json(ch, self.name) for c in conns for ch in self._channels(c)]

    async def channel(self, name: str) -> dict[str, Any] | None:
        for conn in self._connections():
            if not name.startswith(conn.name):
                continue
            for ch in self._channels(conn):
                if channel_name(ch) == name:
                    out = channel_json(ch, self.name)
                    out["consumer_details"] = await self._consumers_json([(c, ch) for c in list(ch.consumers.values())])
                    out["publishes"] = _publishes(ch)
                    return out
        return None

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        if queue is not None:
            q = self._queue(*queue)
            if q is None:
                return []
            return await self._consumers_json([(c, c.channel) for c in q.consumers()
                                               if isinstance(c.channel, ServerChannel)])  # (another node's: not here)
        return await self._consumers_json([(c, ch) for conn in self._connections()
                                           for ch in self._channels(conn) for c in list(ch.consumers.values())])

    async def _consumers_json(self, consumers: list[tuple[Consumer, ServerChannel]]) -> list[dict[str, Any]]:
        """The consumers' fields; those of a stream whose copy is another worker's (or node's) with where
        they read as its home answers (a stand-in knows no offsets)."""
        timeout_ms = self.node.config.consumer_timeout_ms
        rows = [consumer_json(c, ch, self.name, timeout_ms) for c, ch in consumers]
        far = {id(c.queue): c.queue for c, _ in consumers
               if isinstance(c.queue, RemoteQueue) and c.queue.stream_group is not None}
        if far:
            found: dict[Consumer, dict[str, int]] = {}
            for answer in await asyncio.gather(*(q.link.stream_consumer_info(q) for q in far.values())):
                found.update(answer)
            for (c, _), row in zip(consumers, rows, strict=True):
                row.update(found.get(c, {}))
        return rows

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        wanted = self.node.vhosts.keys() if vhosts is None else vhosts
        return [queue_light(q) for name in wanted if (v := self.node.vhosts.get(name)) is not None
                for q in v.queues.values()]

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out = []
        for vhost, name in keys:
            q = self._queue(vhost, name)
            if q is not None:
                out.append(queue_json(q, self.name))
        return out

    async def samples(self) -> dict[str, Any]:
        node = self.node
        connections: list[list[Any]] = []
        channels: list[list[Any]] = []
        for conn in self._connections():
            vhost = conn.vhost_obj
            connections.append([conn.name, vhost.name if vhost is not None else None, conn.recv_oct, conn.send_oct])
            for ch in self._channels(conn):
                channels.append([channel_name(ch), ch.vhost.name if ch.vhost is not None else None,
                                 list(channel_values(ch)), _exchange_samples(ch)])
        return {
            "queues": [[name, q.name, *queue_values(q)] for name, v in node.vhosts.items() for q in v.queues.values()],
            "channels": channels,
            "connections": connections,
            "closed": list(closed_values(node.closed_channel_stats)),
            "churn": dict(node.churn),
        }

    async def metric_samples(self) -> dict[str, Any]:
        node = self.node
        connections: list[list[Any]] = []
        channels: list[list[Any]] = []
        for conn in self._connections():
            chans = self._channels(conn)
            connections.append([conn.name, conn.recv_oct, conn.send_oct, len(chans)])
            channels.extend([channel_name(ch), ch.vhost.name if ch.vhost is not None else "",
                             list(channel_metric_values(ch))] for ch in chans)
        return {"connections": connections, "channels": channels, "closed": dict(node.closed_channel_stats),
                "churn": dict(node.churn), "streams": self._stream_rows(), "stream_protocol": self._stream_protocol()}

    def _stream_protocol(self) -> list[int]:
        """The stream protocol's counters of this process (ports.py's `STREAM_PROTOCOL_FIELDS`), [] when
        it has no stream listener."""
        hub = self.node.streams
        if hub is None:
            return []
        n = hub.counters
        conns = list(hub.connections)
        return [n.messages_received, n.messages_confirmed, n.messages_errored, n.messages_delivered,
                sum(len(conn.publishing.publishers) for conn in conns),
                sum(len(conn.consuming.subscriptions) for conn in conns)]

    def _stream_rows(self) -> list[list[Any]]:
        """[vhost, name, segment files, consumer offset lag] of every stream this process holds; the lag
        counts AMQP 0-9-1 consumers and this process's stream-protocol subscriptions alike."""
        hub = self.node.streams
        sub_lag: dict[tuple[str, str], int] = {}
        for conn in list(hub.connections) if hub is not None else []:
            vhost = conn.vhost.name
            for row in conn.consuming.info():
                value = row["offset_lag"]
                if isinstance(value, int):
                    key = (vhost, str(row["stream"]))
                    sub_lag[key] = max(sub_lag.get(key, 0), value)
        return [[q.vhost, q.name, q.handle.segment_count, max(q.max_offset_lag(), sub_lag.get((q.vhost, q.name), 0))]
                for v in self.node.vhosts.values() for q in v.queues.values()
                if isinstance(q, StreamQueue)]

    async def process_figures(self) -> dict[str, int]:
        storage = self.node.persistence
        figures = (procinfo.rss_bytes(), procinfo.fd_used(), len(self.node.connections), procinfo.threads(),
                   storage.sink.fsyncs if storage is not None else 0, storage.sink.syncs if storage is not None else 0)
        return dict(zip(procinfo.PROCESS_FIGURES, figures, strict=True))

    def _queue(self, vhost: str, name: str) -> Queue | None:
        v = self.node.vhosts.get(vhost)
        return v.queues.get(name) if v is not None else None

    async def delayed_counts(self) -> list[list[Any]]:
        delayed = self.node.delayed
        if delayed is None:
            return []
        held = ([v.name, x.name, delayed.held_here(v.name, x.name)] for v in self.node.vhosts.values()
                for x in v.exchanges.values() if x.type == DELAYED_MESSAGE)
        return [row for row in held if row[2]]

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        q = self._queue(vhost, name)
        return q.purge() if q is not None else None

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        q = self._queue(vhost, name)
        if q is None:
            return "absent"
        if if_unused or if_empty:
            try:
                await q.refresh_counts()  # a queue in another worker or node: its home's counts now
            except AMQPError:
                pass  # its home is down: judged on the counts it last reported, as its listing shows them
        if if_unused and q.consumer_count:
            return "in_use"
        if if_empty and q.message_count:
            return "not_empty"
        self.node.delete_queue(self.node.vhosts[vhost], q)
        return "deleted"

    async def close_connection(self, name: str, reason: str) -> bool:
        for conn in self._connections():
            if conn.name == name:
                conn.close_with_error(ConnectionError_(CONNECTION_FORCED, reason))
                return True
        return False

    async def close_user_connections(self, user: str, reason: str) -> int:
        conns = [c for c in self._connections() if c.user_name == user]
        for conn in conns:
            conn.close_with_error(ConnectionError_(CONNECTION_FORCED, reason))
        return len(conns)

    # -- the stream protocol's connections and groups (runtime/stream_session/) ----------------------
    def _stream_connections(self) -> list[Any]:
        hub = self.node.streams
        return [] if hub is None else [c for c in list(hub.connections) if c.phase.name == "OPENED"]

    async def stream_connections(self) -> list[dict[str, Any]]:
        out = []
        for conn in self._stream_connections():
            tls = conn.tls_info  # its own TLS session's, or the relaying worker's (a TLS connection moved here)
            out.append({**conn.info(), "tls": list(tls) if tls is not None else None,
                        "publisher_rows": conn.publishing.info(), "consumer_rows": conn.consuming.info()})
        return out

    async def stream_groups(self, vhost: str) -> list[dict[str, Any]]:
        hub = self.node.streams
        if hub is None:
            return []
        return [{**row, "members": hub.sac.member_rows((vhost, row["stream"], row["reference"])) or []}
                for row in hub.sac.group_rows(vhost)]

    async def stream_tracking(self, vhost: str, stream: str) -> list[list[Any]] | None:
        v = self.node.vhosts.get(vhost)
        handle = getattr(None if v is None else v.queues.get(stream), "handle", None)
        tracking = getattr(handle, "tracking", None)
        if tracking is None:
            return None
        rows: list[list[Any]] = [["writer", ref.decode("utf-8", "replace"), seq]
                                 for ref, (_chunk, seq) in sorted(tracking.sequences.items())]
        rows += [["offset", ref.decode("utf-8", "replace"), offset] for ref, offset in sorted(tracking.offsets.items())]
        return rows

    async def close_stream_connection(self, vhost: str, name: str, reason: str) -> bool:
        for conn in self._stream_connections():
            if conn.name == name and conn.vhost.name == vhost:
                conn.drop(reason)  # the socket, no Close: as RabbitMQ
                return True
        return False


__all__ = ["LocalAgent", "channel_json", "connection_json", "consumer_json", "node_named", "peer_cert_json", "queue_json",
           "queue_light"]
