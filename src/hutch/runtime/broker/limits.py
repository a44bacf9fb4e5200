"""Vhost and user limits on a running node: changing them, saving them with the durable definitions,
and enforcing them when a connection, a channel or a queue is about to be made.

Owns: the node-side operations on `Node.limits` (a `hutch.core.limits.LimitStore`): `set_vhost_limits`,
`set_user_limits`, `prune`, the checks `check_connection`, `check_channel` and `check_queue` that the
session layer and `Node.declare_queue` call, the cluster-wide counts (`LimitGossip`, `local_counts`), and the definition-log operations (`SetVhostLimits`,
`SetUserLimits` records, each carrying the whole limits document of one vhost or user, so replaying one is
idempotent) with their replay (`apply_op`) and their place in a snapshot (`state_ops`).

Rules:
- A change is recorded (fdatasync'd, or replicated through the metadata Raft group on a clustered
  node) before the caller replies, like every durable definition; every node applies it, so a limit
  set on one node holds on all of them.
- Limits take effect for what comes next: connections, channels and queues that exist stay (as in
  RabbitMQ, lowering a limit closes nothing).
- Queue counts are the vhost's queues as this node's metadata knows them (on a clustered node: the
  cluster's). Connection and channel counts are the cluster's, as RabbitMQ 4.x counts them: this node's
  own (exact) plus what the other nodes last reported (`node.peer_counts`). `LimitGossip` sends each
  node's counts of the limited vhosts and users to the others every `COUNTS_INTERVAL_S` when they
  changed (all of them to a node that came up, none when no such limit is set), so no connection open
  waits for a cluster round trip; the price is that a burst spread over several nodes inside one
  interval can pass a limit by what the other nodes accepted meanwhile. A node that goes down takes its
  counts with it.
- The limits of a vhost or user end with it: `prune` runs whenever the users and vhosts change
  (`Node.permissions_changed` and the replay of an `auth` operation), so a vhost or user created
  again under the same name starts without limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from hutch.amqp.errors import NOT_ALLOWED, PRECONDITION_FAILED, ChannelError, ConnectionError_
from hutch.cluster.messages import LimitCounts, Record
from hutch.core import limits as core
from hutch.core.definition_ops import SetUserLimits, SetVhostLimits

if TYPE_CHECKING:
    from hutch.core.auth import AuthStore
    from hutch.core.definition_ops import DefinitionOp
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.ports import SessionConnection


class LimitsHost(Protocol):
    """What limits need of the node (`broker/node.py`)."""

    limits: core.LimitStore
    peer_counts: core.PeerCounts  # the other nodes' counts (a cluster), empty on a plain node
    vhosts: dict[str, VirtualHost]
    auth: AuthStore
    connections: set[Any]

    def _record(self, op: DefinitionOp) -> None: ...



def set_vhost_limits(node: LimitsHost, vhost: str, limits: Mapping[str, int]) -> bool:
    """Replace a vhost's (validated) limits and record them; an empty mapping clears them."""
    assert vhost in node.vhosts, vhost
    if not node.limits.set_vhost(vhost, limits):
        return False
    node._record(SetVhostLimits(vhost, dict(limits)))
    return True


def set_user_limits(node: LimitsHost, user: str, limits: Mapping[str, int]) -> bool:
    """Replace a user's (validated) limits and record them; an empty mapping clears them."""
    assert node.auth.get_user(user) is not None, user
    if not node.limits.set_user(user, limits):
        return False
    node._record(SetUserLimits(user, dict(limits)))
    return True


def prune(node: LimitsHost) -> None:
    """Drop the limits of vhosts and users that are gone (not recorded: every node prunes alike)."""
    node.limits.prune(set(node.vhosts), {u.name for u in node.auth.list_users()})


# -- enforcing --------------------------------------------------------------------------------------


def _open_connections(node: LimitsHost, vhost: str | None = None, user: str | None = None) -> int:
    """This node's open connections (past connection.open) to `vhost` or of `user`."""
    count = 0
    for conn in node.connections:
        v = conn.vhost_obj
        if v is None or (vhost is not None and v.name != vhost) or (user is not None and conn.user_name != user):
            continue
        count += 1
    return count


def check_connection(node: LimitsHost, vhost: str, user: str) -> None:
    """connection.open to `vhost` by `user`: 530 NOT_ALLOWED past either connection limit (the vhost's
    first, as rabbit_reader checks them)."""
    store, peers = node.limits, node.peer_counts
    limit = store.vhost_limit(vhost, "max-connections")
    if limit is not None and core.reached(limit, _open_connections(node, vhost=vhost)
                                          + peers.total(core.VHOST_CONNECTIONS, vhost)):
        raise ConnectionError_(NOT_ALLOWED, core.vhost_connections_refused(vhost, user, limit), 10, 40)
    limit = store.user_limit(user, "max-connections")
    if limit is not None and core.reached(limit, _open_connections(node, user=user)
                                          + peers.total(core.USER_CONNECTIONS, user)):
        raise ConnectionError_(NOT_ALLOWED, core.user_connections_refused(user, limit), 10, 40)


def check_channel(node: LimitsHost, conn: SessionConnection) -> None:
    """channel.open on `conn`: 530 NOT_ALLOWED when its user has `max-channels` open already (in the
    cluster: every connection of the user). RabbitMQ names no method in this error."""
    limit = node.limits.user_limit(conn.user_name, "max-channels")
    if limit is None:
        return
    count = sum(len(c.channels) for c in node.connections if c.user_name == conn.user_name) \
        + node.peer_counts.total(core.USER_CHANNELS, conn.user_name)
    if core.reached(limit, count):
        raise ConnectionError_(NOT_ALLOWED, core.user_channels_refused(conn.user_name, limit), 0, 0)


def check_queue(node: LimitsHost, vhost: str, queue: str, count: int) -> None:
    """A new queue in `vhost`, which has `count` already: 406 PRECONDITION_FAILED past max-queues."""
    limit = node.limits.vhost_limit(vhost, "max-queues")
    if limit is not None and core.reached(limit, count):
        raise ChannelError(PRECONDITION_FAILED, core.queues_refused(queue, vhost, limit), 50, 10)


# -- counting across a cluster ----------------------------------------------------------------------

COUNTS_INTERVAL_S = 0.25
log = logging.getLogger("hutch.limits")


def local_counts(node: LimitsHost) -> list[list[Any]]:
    """This node's open connections and channels of every vhost and user that has a connection or
    channel limit, as rows [kind, name, count] (core/limits.py); empty when no such limit is set."""
    store = node.limits
    vhosts = {v for v, lim in store.vhosts.items() if "max-connections" in lim}
    users = {u for u, lim in store.users.items() if "max-connections" in lim or "max-channels" in lim}
    if not vhosts and not users:
        return []
    counts: dict[core.CountKey, int] = {}
    for conn in node.connections:
        v = conn.vhost_obj
        if v is None:
            continue
        if v.name in vhosts:
            key = (core.VHOST_CONNECTIONS, v.name)
            counts[key] = counts.get(key, 0) + 1
        if conn.user_name in users:
            key = (core.USER_CONNECTIONS, conn.user_name)
            counts[key] = counts.get(key, 0) + 1
            key = (core.USER_CHANNELS, conn.user_name)
            counts[key] = counts.get(key, 0) + len(conn.channels)
    return [[kind, name, n] for (kind, name), n in sorted(counts.items())]


class LimitGossip:
    """Tells the other nodes of a cluster this node's counts (`local_counts`) and keeps theirs in
    `node.peer_counts` (a `ClusterSubsystem`: started when the cluster boot is done, stopped with it).
    The composition root registers `received` for `LimitCounts` and `peer_changed` as a peer hook."""

    def __init__(self, node: LimitsHost, send: Callable[[str, Record], bool],
                 peers: Callable[[], Iterable[str]]) -> None:
        self.node = node
        self._send = send
        self._peers = peers
        self._sent: list[list[Any]] | None = None  # what the peers have; None: send at the next tick
        self._timer: asyncio.TimerHandle | None = None

    def booted(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(COUNTS_INTERVAL_S, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(COUNTS_INTERVAL_S, self._tick)
        rows = local_counts(self.node)
        if rows == self._sent:
            return
        record = LimitCounts(rows)
        delivered = all([self._send(peer, record) for peer in self._peers()])
        self._sent = rows if delivered else None  # a dropped report is sent again at the next tick

    def received(self, peer: str, report: LimitCounts) -> None:
        try:
            self.node.peer_counts.replace(peer, report.rows)
        except ValueError as exc:
            log.warning("limit counts from node %r ignored: %s", peer, exc)

    def peer_changed(self, peer: str, up: bool) -> None:
        if up:
            self._sent = None  # the newcomer gets everything at the next tick
        else:
            self.node.peer_counts.drop(peer)


# -- durable definitions ----------------------------------------------------------------------------


def apply_op(node: LimitsHost, op: SetVhostLimits | SetUserLimits) -> None:
    """Replay one saved (or replicated) operation. A vhost or user that does not exist (any more) is
    an error the caller logs and skips."""
    if isinstance(op, SetVhostLimits):
        if op.vhost not in node.vhosts:
            raise KeyError(f"vhost '{op.vhost}' does not exist")
        set_vhost_limits(node, op.vhost, core.validate_vhost_limits(op.limits))
    else:
        if node.auth.get_user(op.user) is None:
            raise KeyError(f"user '{op.user}' does not exist")
        set_user_limits(node, op.user, core.validate_user_limits(op.limits))


def state_ops(node: LimitsHost) -> Iterator[SetVhostLimits | SetUserLimits]:
    """Every limit as the operation that sets it (after the auth state, which creates their owners)."""
    for vhost, limits in node.limits.iter_vhosts():
        if vhost in node.vhosts:
            yield SetVhostLimits(vhost, dict(limits))
    for user, limits in node.limits.iter_users():
        if node.auth.get_user(user) is not None:
            yield SetUserLimits(user, dict(limits))


__all__ = ["COUNTS_INTERVAL_S", "LimitGossip", "apply_op", "check_channel", "check_connection", "check_queue",
           "local_counts", "prune", "set_user_limits", "set_vhost_limits", "state_ops"]
