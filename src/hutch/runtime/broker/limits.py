"""Vhost and user limits on a running node: changing them, saving them with the durable definitions,
and enforcing them when a connection, a channel or a queue is about to be made.

Owns: the node-side operations on `Node.limits` (a `hutch.core.limits.LimitStore`): `set_vhost_limits`,
`set_user_limits`, `prune`, the checks `check_connection`, `check_channel` and `check_queue` that the
session layer and `Node.declare_queue` call, the cluster-wide counts (`LimitGossip`, `local_counts`), the
exact counts between the workers of one node (`connections_over_workers`, `channels_over_workers`,
`WorkerLimits`, `CountLedger`), and the definition-log operations (`SetVhostLimits`,
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
- Between the workers of one node the counts are exact (`WorkerLimits`): a connection.open (or a
  channel.open of a user with `max-channels`) that a limit applies to asks worker 0, which owns the
  node's count (`CountLedger`). Worker 0 judges one request at a time: it asks every other worker for its
  counts of the keys now (`LimitQuery`, a round trip on the worker link, in parallel), adds the grants it
  gave that those answers do not show settled yet, and grants or refuses. A grant is settled when the
  asking worker has read the answer: in the same step it counts the connection (or channel) or, refused
  for another reason meanwhile, does not. A connection counts from connection.open-ok until its close
  handshake (close-ok sent or received), so a closed connection frees its place before its client can
  open the next one. When worker 0 cannot be reached (it is restarting) a worker judges as between nodes
  (its own counts plus the gossiped ones); a worker worker 0 cannot reach counts as it last gossiped.
- The limits of a vhost or user end with it: `prune` runs whenever the users and vhosts change
  (`Node.permissions_changed` and the replay of an `auth` operation), so a vhost or user created
  again under the same name starts without limits.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hutch.amqp.errors import NOT_ALLOWED, PRECONDITION_FAILED, ChannelError, ConnectionError_
from hutch.cluster.messages import LimitAcquire, LimitCounts, LimitQuery, LimitReport, Record
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
    worker_limits: WorkerLimits | None  # a worker of a node of several: exact counts (below)
    limit_hooks: list[Callable[[], None]]  # called when a vhost's or user's limits change (LimitGossip.wake)

    def _record(self, op: DefinitionOp) -> None: ...



def set_vhost_limits(node: LimitsHost, vhost: str, limits: Mapping[str, int]) -> bool:
    """Replace a vhost's (validated) limits and record them; an empty mapping clears them."""
    assert vhost in node.vhosts, vhost
    if not node.limits.set_vhost(vhost, limits):
        return False
    node._record(SetVhostLimits(vhost, dict(limits)))
    _changed(node)
    return True


def _changed(node: LimitsHost) -> None:
    for hook in node.limit_hooks:
        hook()


def set_user_limits(node: LimitsHost, user: str, limits: Mapping[str, int]) -> bool:
    """Replace a user's (validated) limits and record them; an empty mapping clears them."""
    assert node.auth.get_user(user) is not None, user
    if not node.limits.set_user(user, limits):
        return False
    node._record(SetUserLimits(user, dict(limits)))
    _changed(node)
    return True


def prune(node: LimitsHost) -> None:
    """Drop the limits of vhosts and users that are gone (not recorded: every node prunes alike)."""
    node.limits.prune(set(node.vhosts), {u.name for u in node.auth.list_users()})


# -- enforcing --------------------------------------------------------------------------------------


def _open_connections(node: LimitsHost, vhost: str | None = None, user: str | None = None) -> int:
    """This node's open connections (past connection.open, before their close handshake) to `vhost` or
    of `user`."""
    count = 0
    for conn in node.connections:
        v = conn.vhost_obj
        if not conn.counts_for_limits or v is None or (vhost is not None and v.name != vhost) \
                or (user is not None and conn.user_name != user):
            continue
        count += 1
    return count


def _open_channels(node: LimitsHost, user: str) -> int:
    return sum(len(c.channels) for c in node.connections if c.counts_for_limits and c.user_name == user)


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
    count = _open_channels(node, conn.user_name) + node.peer_counts.total(core.USER_CHANNELS, conn.user_name)
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


def counted(store: core.LimitStore) -> tuple[set[str], set[str]]:
    """The vhosts and the users that have a connection or channel limit (what `local_counts` counts)."""
    return ({v for v, lim in store.vhosts.items() if "max-connections" in lim},
            {u for u, lim in store.users.items() if "max-connections" in lim or "max-channels" in lim})


def local_counts(node: LimitsHost) -> list[list[Any]]:
    """This node's open connections and channels of every vhost and user that has a connection or
    channel limit, as rows [kind, name, count] (core/limits.py); empty when no such limit is set."""
    vhosts, users = counted(node.limits)
    if not vhosts and not users:
        return []
    counts: dict[core.CountKey, int] = {}
    for conn in node.connections:
        v = conn.vhost_obj
        if v is None or not conn.counts_for_limits:
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
    The composition root registers `received` for `LimitCounts`, `peer_changed` as a peer hook and
    `wake` as a limit hook. It ticks every COUNTS_INTERVAL_S while there is something to count or to
    tell; with no connection or channel limit anywhere and the peers told so, it stops (an idle node,
    or a worker of one, is not woken four times a second for nothing) until a limit is set or a peer
    comes up (`wake`)."""

    def __init__(self, node: LimitsHost, send: Callable[[str, Record], bool],
                 peers: Callable[[], Iterable[str]]) -> None:
        self.node = node
        self._send = send
        self._peers = peers
        self._sent: list[list[Any]] | None = None  # what the peers have; None: send at the next tick
        self._timer: asyncio.TimerHandle | None = None
        self._running = False

    def booted(self) -> None:
        self._running = True
        self.wake()

    def stop(self) -> None:
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def wake(self) -> None:
        """Tick again (a limit changed, a peer came up), if not ticking already."""
        if self._running and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(COUNTS_INTERVAL_S, self._tick)

    def _tick(self) -> None:
        self._timer = None
        rows = local_counts(self.node)
        if rows != self._sent:
            record = LimitCounts(rows)
            delivered = all([self._send(peer, record) for peer in self._peers()])
            self._sent = rows if delivered else None  # a dropped report is sent again at the next tick
        vhosts, users = counted(self.node.limits)
        if self._sent == [] and not vhosts and not users:
            return  # nothing to count until a limit is set, and the peers know it: `wake` restarts
        self.wake()

    def received(self, peer: str, report: LimitCounts) -> None:
        try:
            self.node.peer_counts.replace(peer, report.rows)
        except ValueError as exc:
            log.warning("limit counts from node %r ignored: %s", peer, exc)

    def peer_changed(self, peer: str, up: bool) -> None:
        if up:
            self._sent = None  # the newcomer gets everything at the next tick
            self.wake()
        else:
            self.node.peer_counts.drop(peer)


# -- exact counts between the workers of one node ---------------------------------------------------

Wanted = tuple[int, str, int]  # [kind, name, limit]: one more of this count, which must stay within limit
QUERY_TIMEOUT_S = 2.0  # a worker worker 0 asks, silent this long: counted as it last gossiped
ACQUIRE_TIMEOUT_S = 5.0  # worker 0 silent this long (its queries and a queue of judgements): judged as between nodes


def connections_over_workers(node: LimitsHost, vhost: str, user: str) -> Coroutine[Any, Any, None] | None:
    """connection.open to `vhost` by `user` on a worker of a node of several: None when no connection
    limit applies (nothing to wait for), else the wait for worker 0's answer (it raises the 530 as
    `check_connection` does). On a node of one process: `check_connection`, and None."""
    exact = node.worker_limits
    if exact is None:
        check_connection(node, vhost, user)
        return None
    wanted: list[Wanted] = []
    limit = node.limits.vhost_limit(vhost, "max-connections")
    if limit is not None:
        wanted.append((core.VHOST_CONNECTIONS, vhost, limit))
    limit = node.limits.user_limit(user, "max-connections")
    if limit is not None:
        wanted.append((core.USER_CONNECTIONS, user, limit))
    if not wanted:
        return None
    return exact.acquire(wanted, vhost, user, lambda: check_connection(node, vhost, user))


def channels_over_workers(node: LimitsHost, conn: SessionConnection) -> Coroutine[Any, Any, None] | None:
    """channel.open on `conn`, as `connections_over_workers` for its user's `max-channels`."""
    exact = node.worker_limits
    if exact is None:
        check_channel(node, conn)
        return None
    user = conn.user_name
    limit = node.limits.user_limit(user, "max-channels")
    if limit is None:
        return None
    return exact.acquire([(core.USER_CHANNELS, user, limit)], "", user, lambda: check_channel(node, conn))


def refusal(row: Wanted, vhost: str, user: str) -> ConnectionError_:
    """The 530 of a refused [kind, name, limit], as rabbit_reader words it."""
    kind, name, limit = row
    if kind == core.VHOST_CONNECTIONS:
        return ConnectionError_(NOT_ALLOWED, core.vhost_connections_refused(name, user, limit), 10, 40)
    if kind == core.USER_CONNECTIONS:
        return ConnectionError_(NOT_ALLOWED, core.user_connections_refused(name, limit), 10, 40)
    return ConnectionError_(NOT_ALLOWED, core.user_channels_refused(name, limit), 0, 0)


def _key_count(node: LimitsHost, key: core.CountKey) -> int:
    kind, name = key
    if kind == core.VHOST_CONNECTIONS:
        return _open_connections(node, vhost=name)
    if kind == core.USER_CONNECTIONS:
        return _open_connections(node, user=name)
    return _open_channels(node, name)


class CountLedger:
    """Worker 0's count of the node's limited connections and channels (pure: no IO, no clock).

    A judgement takes every worker's report of the keys in question, taken after every earlier
    judgement's grants were given (the caller judges one at a time), and the grants this ledger gave:
    a grant counts until a report of its worker shows it settled (its id below the report's `next_id`
    and not among its `pending`). Invariant: a worker's grants are those it may still count (a report
    prunes them; a new incarnation or `forget` drops them)."""

    def __init__(self) -> None:
        self._grants: dict[str, dict[int, tuple[core.CountKey, ...]]] = {}
        self._incarnations: dict[str, int] = {}

    def grants(self, worker: str) -> int:
        return len(self._grants.get(worker, ()))

    def incarnation_of(self, worker: str) -> int:
        """The incarnation last reported by `worker` (-1: none), for a stand-in report that keeps its grants."""
        return self._incarnations.get(worker, -1)

    def forget(self, worker: str) -> None:
        """`worker` is gone (its connections and channels with it)."""
        self._grants.pop(worker, None)
        self._incarnations.pop(worker, None)

    def _apply(self, worker: str, report: LimitReport) -> None:
        grants = self._grants.setdefault(worker, {})
        if self._incarnations.get(worker) != report.incarnation:
            grants.clear()  # a restarted worker: its ids start again
            self._incarnations[worker] = report.incarnation
        pending = set(report.pending)
        for gid in [g for g in grants if g < report.next_id and g not in pending]:
            del grants[gid]  # settled: in the report's counts if it was used

    def judge(self, worker: str, request_id: int, wanted: Sequence[Wanted],
              reports: Mapping[str, LimitReport]) -> Wanted | None:
        """Grant `worker`'s request `request_id` of one more of each `wanted` count (None), or the first
        count that would pass its limit. `reports` has every live worker's, the asker's included."""
        assert worker in reports, worker
        for w, report in reports.items():
            self._apply(w, report)
        keys = tuple((kind, name) for kind, name, _ in wanted)
        totals = dict.fromkeys(keys, 0)
        for report in reports.values():
            for kind, name, count in report.counts:
                if (kind, name) in totals:
                    totals[(kind, name)] += count
        for grants in self._grants.values():
            for granted in grants.values():
                for key in granted:
                    if key in totals:
                        totals[key] += 1
        for row in wanted:
            if core.reached(row[2], totals[(row[0], row[1])]):
                return row
        assert request_id not in self._grants[worker], request_id
        self._grants[worker][request_id] = keys
        return None


def _wanted_of(rows: Any) -> list[Wanted]:  # Any: a peer's msgpack value, checked here
    """A `LimitAcquire`'s rows, checked (ValueError: malformed)."""
    if type(rows) is not list or not 0 < len(rows) <= 2:
        raise ValueError("wanted: 1 or 2 rows")
    out: list[Wanted] = []
    for row in rows:
        if type(row) is not list or len(row) != 3 or row[0] not in core.COUNT_KINDS or type(row[1]) is not str \
                or type(row[2]) is not int or row[2] < 0:
            raise ValueError(f"wanted: bad row {row!r:.80}")
        out.append((row[0], row[1], row[2]))
    return out


def _report_of(value: Any) -> LimitReport:  # Any: a peer's reply, checked here
    if type(value) is not LimitReport or type(value.counts) is not list or type(value.pending) is not list \
            or any(type(r) is not list or len(r) != 3 or type(r[2]) is not int or r[2] < 0 for r in value.counts) \
            or any(type(p) is not int for p in value.pending):
        raise ValueError(f"malformed limit report {value!r:.80}")
    return value


class WorkerLimits:
    """The exact connection and channel limits of one worker of a node of several (see the module's
    rules): every worker asks (`acquire`) and answers worker 0's `LimitQuery`; worker 0 (`counter` is
    its own name) also judges (`CountLedger`). The composition root registers `on_acquire` for
    `LimitAcquire`, `on_query` for `LimitQuery` and `peer_changed` as a peer hook."""

    def __init__(self, node: LimitsHost, name: str, counter: str, call: Callable[[str, Any, float], Awaitable[Any]],
                 peers: Callable[[], Iterable[str]], errors: tuple[type[BaseException], ...]) -> None:
        self.node = node
        self.name = name
        self.counter = counter
        self._call = call
        self._peers = peers
        self._errors = errors  # what a call to a worker that is gone or silent raises
        self.incarnation = random.getrandbits(62)
        self.next_id = 0
        self.pending: set[int] = set()
        self.ledger = CountLedger() if name == counter else None
        self._judging = asyncio.Lock()

    def report(self, keys: Iterable[core.CountKey]) -> LimitReport:
        """This worker's counts of `keys` now, and its requests not settled yet."""
        counts = [[kind, name, _key_count(self.node, (kind, name))] for kind, name in keys]
        return LimitReport(self.incarnation, counts, sorted(self.pending), self.next_id)

    async def acquire(self, wanted: list[Wanted], vhost: str, user: str, fallback: Callable[[], None]) -> None:
        """One more of each `wanted` count, or the 530 that refuses it. The caller counts what it opens
        in the step this returns in (the request is settled then)."""
        request_id = self.next_id
        self.next_id += 1
        self.pending.add(request_id)
        try:
            if self.ledger is not None:
                refused = await self.judge(self.name, request_id, wanted)
            else:
                try:
                    reply = await self._call(self.counter, LimitAcquire(request_id, [list(w) for w in wanted]),
                                             ACQUIRE_TIMEOUT_S)
                except self._errors as exc:
                    log.info("limits judged without worker 0 (%s)", type(exc).__name__)
                    fallback()  # as between nodes: own counts plus the gossiped ones
                    return
                refused = None if reply is None else _wanted_of([reply])[0]
        finally:
            self.pending.discard(request_id)
        if refused is not None:
            raise refusal(refused, vhost, user)

    async def judge(self, worker: str, request_id: int, wanted: Sequence[Wanted]) -> Wanted | None:
        """Worker 0: judge `worker`'s request with every worker's counts now (one judgement at a time)."""
        ledger = self.ledger
        assert ledger is not None, "only worker 0 judges"
        keys = [(kind, name) for kind, name, _ in wanted]
        async with self._judging:
            others = [p for p in self._peers() if p != self.name]
            answers = await asyncio.gather(*(self._call(p, LimitQuery([list(k) for k in keys]), QUERY_TIMEOUT_S)
                                             for p in others), return_exceptions=True)
            reports = {self.name: self.report(keys)}
            for peer, answer in zip(others, answers, strict=True):
                try:
                    reports[peer] = _report_of(answer)
                except ValueError:  # gone, silent or malformed: its gossiped counts, its grants kept
                    gossiped = self.node.peer_counts.by_peer.get(peer, {})
                    reports[peer] = LimitReport(ledger.incarnation_of(peer),
                                                [[k, n, gossiped.get((k, n), 0)] for k, n in keys], [], 0)
            if worker not in reports:
                return None  # the asker went away meanwhile: nothing it could open
            return ledger.judge(worker, request_id, wanted, reports)

    async def on_acquire(self, peer: str, req: LimitAcquire) -> list[Any] | None:
        try:
            wanted = _wanted_of(req.wanted)
        except ValueError as exc:
            log.warning("limit request from %r ignored: %s", peer, exc)
            return None
        refused = await self.judge(peer, req.request_id, wanted)
        return None if refused is None else list(refused)

    def on_query(self, _peer: str, req: LimitQuery) -> LimitReport:
        keys = [(k[0], k[1]) for k in req.keys[:2] if type(k) is list and len(k) == 2
                and k[0] in core.COUNT_KINDS and type(k[1]) is str]
        return self.report(keys)

    def peer_changed(self, peer: str, up: bool) -> None:
        if not up and self.ledger is not None:
            self.ledger.forget(peer)


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


__all__ = ["COUNTS_INTERVAL_S", "CountLedger", "LimitGossip", "WorkerLimits", "apply_op", "channels_over_workers",
           "check_channel", "check_connection", "counted", "check_queue", "connections_over_workers", "local_counts", "prune",
           "refusal", "set_user_limits", "set_vhost_limits", "state_ops"]
