"""Quorum queues at run time: the replicated queue machine (queues/quorum/) on the node's Raft driver.

Owns: `QuorumQueue`, the queue object every node keeps for a quorum queue (members and non-members
alike: the channel code does not know the difference), `QuorumReplica`, the driver's `StateMachine` on
a member node, and `QuorumService`, which runs the leader's effects (deliveries, confirms, dead letters,
timers) and carries the inter-node messages of quorum queues.

Rules:
- A quorum queue is one Raft group (a random 63-bit group id, never reused) whose voters are its
  member nodes. Every member bootstraps the group with the same voters when it learns the queue from
  the metadata; the declaring node campaigns first (leader locator client-local).
- Every operation is a command proposed at the leader: a member proposes directly when it leads,
  otherwise forwards to the leader; a non-member forwards to a member. The leader stamps its clock on
  every command it proposes (`commands.encode`), so expiry is decided the same on every replica.
- Only the leader executes effects. Bodies are read back from the Raft log (the enqueue entry's
  payload): the machine keeps no body and neither does this module, except the payloads of live
  messages that came inside an installed snapshot (their entries are not in this node's log).
- Publisher confirms: a publish is acked once its enqueue is applied at the leader (committed: on a
  majority's disk). A publisher is (node, incarnation) with a seq per queue; an enqueue is kept until
  confirmed and sent again when its route may have gone (a node down, or no confirm in RESEND_S): the
  machine applies each seq once whatever order they arrive in, so a resend is never enqueued twice.
- Consumers are keyed (node, consumer id); their node settles by msg id (the raft index of the
  message's entry). When a node goes down, the leader proposes `down` for it: its consumers' unacked
  messages return to the queue (counted as failed deliveries); when it comes back, its channels' live
  consumers check out again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from hutch.amqp import spec
from hutch.amqp.errors import NOT_FOUND, ChannelError
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, Deliverer, Queue, QueueEntry
from hutch.core.vhost import rs
from hutch.queues.quorum import commands as qc
from hutch.queues.quorum import effects as qe
from hutch.queues.quorum.config import QuorumConfig
from hutch.queues.quorum.machine import QuorumMachine
from hutch.queues.quorum.messages import BATCH_MAX, SHIFT

from .raft_group import GroupClosed, NotLeader
from .remote_queue import decode_message, pack_message

if TYPE_CHECKING:
    from .cluster import ClusterService
    from .node import Node

log = logging.getLogger("hutch.quorum")

CALL_TIMEOUT_S = 5.0
MAX_PENDING = 10_000
CONFIRM_TIMEOUT_S = 30.0  # a publish not confirmed by then is nacked (its fate is unknown to us)
RESEND_S = 3.0  # an enqueue not confirmed by then is sent again (deduplicated by the machine)
QUORUM_TARGET = "\x00quorum"  # confirm_pending's route for quorum publishes (resent, never nacked by a peer)
TICK_S = 1.0
SNAPSHOT_FLOOR = 16_384  # commands (messages) between snapshots of a queue, at least
SNAPSHOT_MIN_ENTRIES = 64
MSG_CACHE_MAX = 16_384  # the leader's own just-published messages kept for their first local delivery
_POS_MASK = (1 << SHIFT) - 1


def now_ms() -> int:
    return int(time.time() * 1000)


BALANCED_MAX_QUEUES = 1000  # with more quorum queues, "balanced" picks a random node (RabbitMQ's rule)
_BALANCED = frozenset({"balanced", "random", "least-leaders", "min-masters"})  # the last three: 3.x names


def leader_locator(policy: dict[str, Any], arguments: dict[str, Any], default: str) -> str:
    """"client-local" or "balanced" for a new quorum queue: the policy's `queue-leader-locator` (then
    `queue-master-locator`), else the `x-queue-leader-locator` (then `x-queue-master-locator`) argument,
    else the node's `queue_leader_locator` (a policy wins over an argument, as in RabbitMQ)."""
    for value in (policy.get("queue-leader-locator"), policy.get("queue-master-locator"),
                  arguments.get("x-queue-leader-locator"), arguments.get("x-queue-master-locator"), default):
        if value:
            return "balanced" if value in _BALANCED else "client-local"
    return "client-local"


def _ttl_of(msg: Message) -> int | None:
    """The message's own TTL (the expiration property, ms), if it has a valid one."""
    expiration = msg.properties.expiration
    if expiration is None:
        return None
    try:
        return max(0, int(expiration))
    except ValueError:
        return None


class QuorumReplica:
    """The Raft driver's StateMachine for one member of one quorum queue."""

    def __init__(self, queue: QuorumQueue, config: QuorumConfig) -> None:
        self.queue = queue
        self.machine = QuorumMachine(config, effects_sink=self._effects)
        self.side_payloads: dict[int, bytes] = {}  # msg id -> body of a live message from an installed snapshot
        self.group: Any = None
        self.entries = 0  # entries applied, and the commands they carried (a batch: one per message)
        self.commands = 0

    def apply(self, index: int, data: bytes) -> Any:
        system_time_ms, cmd = qc.decode(data)
        self.entries += 1
        if type(cmd) is qc.EnqueueBatch:
            self.commands += len(cmd.sizes)
            q = self.queue
            if q.inflight and cmd.publisher_id == q.svc.publisher_id and self.group.is_leader:
                q.cache_batch(index, cmd)
        else:
            self.commands += 1
        return self.machine.apply_command(index, system_time_ms, cmd)

    def _effects(self, effects: list[qe.Effect]) -> None:
        if self.group is not None and self.group.is_leader:
            self.queue.svc.run_effects(self.queue, effects)

    def snapshot(self) -> bytes:
        live = self.machine.state.live_indexes()
        pays = []
        for idx in live:
            p = self.queue.svc.read_payload(self.queue, idx)
            if p is not None:
                pays.append([idx, p])
        return msgpack.packb([self.machine.snapshot(), pays], use_bin_type=True)

    def restore(self, data: bytes) -> None:
        state, pays = msgpack.unpackb(data, raw=False)
        self.machine.restore(state)
        first = self.queue.svc.first_log_index(self.queue)
        self.side_payloads = {int(i): bytes(p) for i, p in pays if int(i) >> SHIFT < first}

    def on_membership(self, voters: tuple[int, ...]) -> None:
        self.queue.voters = tuple(voters)

    def release_cursor(self) -> int:
        return self.machine.state.release_cursor()

    def snapshot_interval(self) -> int:
        """Entries between snapshots: about max(SNAPSHOT_FLOOR, 2 x live messages) commands. A snapshot
        costs O(live messages) (it carries their bodies), so this amortises it; counting commands, not
        entries, bounds the log kept in RAM and on disk whatever the batch size."""
        per_entry = self.commands / self.entries if self.entries else 1.0
        target = max(SNAPSHOT_FLOOR, 2 * self.machine.state.message_count())
        return max(SNAPSHOT_MIN_ENTRIES, int(target / max(per_entry, 1.0)))


class QuorumQueue(Queue):
    queue_type = "quorum"
    remote = True  # basic.get, purge and counts are prepared asynchronously (connection.py)

    def __init__(self, svc: QuorumService, vhost: str, name: str, arguments: dict[str, Any], gid: int,
                 members: list[str]) -> None:
        super().__init__(vhost, name, True, None, False, arguments)
        self.svc = svc
        self.gid = gid
        self.members = list(members)
        self.voters: tuple[int, ...] = ()
        self.replica: QuorumReplica | None = None
        self.local: dict[int, Consumer] = {}  # consumer id -> a consumer on this node
        self.owner_of: dict[int, int] = {}  # msg id delivered here -> consumer id (0: basic.get)
        self._counts = (0, 0, 0, 0)  # ready, unacked, consumers, bytes (non-members: from the leader)
        self._prepared_get: QueueEntry | None = None
        self._prepared_purge = 0
        self._last_config: QuorumConfig | None = None
        self.pending: list[bytes] = []  # commands waiting for a leader to be known (bounded)
        self.next_seq = 0  # this node's publish seq for this queue (the machine deduplicates by it)
        # seq -> [link publish id, entry bytes (of its batch, b"" until proposed), last sent, message, seq,
        #         [publishes of its entry not confirmed yet] (None until proposed)]
        self.unconfirmed: dict[int, list[Any]] = {}
        self.batch: list[list[Any]] = []  # this loop turn's publishes (`unconfirmed` items), not proposed
        # credit flow: enqueue entries proposed from this node and not wholly confirmed; past the soft
        # limit (quorum_commands_soft_limit) the connections publishing here stop being read
        self.open_entries = 0
        self.soft_limit = svc.node.config.quorum_commands_soft_limit
        self.msg_cache: dict[int, Message] = {}  # leader: msg id -> own message, until its first delivery
        self.owed_credit: dict[int, int] = {}  # auto-ack consumer id -> credit held while its socket is full
        self.inflight: dict[int, list[Message]] = {}  # leader: first seq of a batch proposed -> its messages
        self.dlx_running = False  # at-least-once dead-lettering in force (the leader runs the worker)
        self.dlx_busy = False  # a republish batch is waiting for its confirms

    # -- where commands go ---------------------------------------------------------------------------
    @property
    def leader(self) -> str | None:
        return self.svc.leader_name(self)

    def config(self) -> QuorumConfig:
        return QuorumConfig.from_settings(self.settings, self.arguments)

    def apply_settings(self, settings: Any) -> None:
        super().apply_settings(settings)
        config = self.config()
        if self.replica is not None and config != self._last_config and self.svc.is_leader(self):
            self._last_config = config
            self.svc.propose(self, qc.make_update_config(config))

    def cache_batch(self, index: int, cmd: qc.EnqueueBatch) -> None:
        """The leader applies a batch this node proposed: keep its messages for their first delivery to
        a consumer here, so that they are not decoded back from the log."""
        msgs = self.inflight.pop(cmd.first_seq, None)
        if msgs is None or len(msgs) != len(cmd.sizes):
            return
        cache = self.msg_cache
        base = index << SHIFT
        cache.update(zip(range(base, base + len(msgs)), msgs, strict=True))
        while len(cache) > MSG_CACHE_MAX:  # a message never delivered here (expired, purged...): oldest out
            del cache[next(iter(cache))]

    # -- preparing channel methods --------------------------------------------------------------------
    async def prepare(self, method: spec.Method) -> None:
        if isinstance(method, spec.Basic.Get):
            reply = await self.svc.call(self, {"t": "qq.get", "g": self.gid, "na": bool(method.no_ack),
                                                "n": self.svc.name})
            self._counts = (int(reply["r"]), *self._counts[1:])
            if reply.get("m") is not None:
                msg_id, payload, redelivered, count = reply["m"]
                entry = QueueEntry(int(msg_id), self.svc.message(payload, count))
                entry.redelivered = bool(redelivered)
                if not method.no_ack:
                    self.owner_of[int(msg_id)] = 0
                self._prepared_get = entry
        elif isinstance(method, spec.Queue.Purge):
            self._prepared_purge = int(await self.svc.call(self, {"t": "qq.purge", "g": self.gid}))
        elif isinstance(method, spec.Basic.Consume):
            return
        elif isinstance(method, spec.Basic.Cancel):
            await self.cancel_committed(method.consumer_tag)
        else:
            self._counts = tuple(await self.svc.call(self, {"t": "qq.info", "g": self.gid}))  # type: ignore

    # -- messages ------------------------------------------------------------------------------------
    def publish(self, msg: Message) -> bool | None:
        self.stat_published += 1
        self.svc.publish(self, msg)
        return None

    def needs_flow_control(self) -> bool:
        return self.open_entries > self.soft_limit

    def get(self, channel: Deliverer, no_ack: bool) -> QueueEntry | None:
        entry, self._prepared_get = self._prepared_get, None
        if entry is not None:
            self.stat_get += 1
        return entry

    def _by_owner(self, entries: Iterable[QueueEntry]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for e in entries:
            cid = self.owner_of.pop(e.seq, None)
            if cid is not None:
                out.setdefault(cid, []).append(e.seq)
        return out

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        for cid, ids in self._by_owner(entries).items():
            self.svc.propose(self, qc.make_settle(self.svc.key(cid), ids))

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for cid, ids in self._by_owner(entries).items():
            self.svc.propose(self, qc.make_return(self.svc.key(cid), ids))

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        for cid, ids in self._by_owner(entries).items():
            self.svc.propose(self, qc.make_discard(self.svc.key(cid), ids))

    def purge(self) -> int:
        count, self._prepared_purge = self._prepared_purge, 0
        return count

    def deliver_pending(self) -> None:
        """A consumer's connection takes writes again: the credit its auto-ack consumers are owed."""
        if self.owed_credit:
            for cid, n in list(self.owed_credit.items()):
                c = self.local.get(cid)
                if c is None:
                    del self.owed_credit[cid]
                elif not c.channel.conn.write_paused:
                    del self.owed_credit[cid]
                    self.svc.propose(self, qc.make_credit(self.svc.key(cid), n))

    # -- consumers -----------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        cid = next(self.svc.ids)
        self.local[cid] = consumer
        self.svc.checkout(self, cid, consumer)

    async def cancel_committed(self, tag: str) -> None:
        """basic.cancel: cancel this node's consumer `tag` and wait (up to CALL_TIMEOUT_S) until the leader
        has applied it, so that nothing published after cancel-ok is checked out to it (RabbitMQ's
        cancel is a synchronous Raft command too). Without a leader in time the cancel stays proposed."""
        for cid, c in list(self.local.items()):
            if c.tag == tag:
                del self.local[cid]
                try:
                    await self.svc.call(self, {"t": "qq.cancel", "g": self.gid, "k": list(self.svc.key(cid))})
                except Exception:  # noqa: BLE001 - no leader in time, or it changed: proposed again below
                    self.svc.propose(self, qc.make_cancel(self.svc.key(cid)))  # goes when there is a leader
                return

    def remove_consumer(self, consumer: Consumer) -> None:
        for cid, c in list(self.local.items()):
            if c is consumer:
                del self.local[cid]
                self.svc.propose(self, qc.make_cancel(self.svc.key(cid)))

    def consumers(self) -> list[Consumer]:
        return list(self.local.values())

    # -- counts ----------------------------------------------------------------------------------------
    def _state_counts(self) -> tuple[int, int, int, int]:
        if self.replica is not None:
            st = self.replica.machine.state
            return st.ready_count(), st.unacked_count(), st.consumer_count(), st.ready_bytes
        return self._counts

    @property
    def message_count(self) -> int:
        return self._state_counts()[0]

    @property
    def unacked_count(self) -> int:
        return self._state_counts()[1]

    @property
    def consumer_count(self) -> int:
        return self._state_counts()[2]

    @property
    def message_bytes(self) -> int:
        return self._state_counts()[3]

    def delete(self) -> int:
        self.deleted = True
        count = self.message_count
        consumers = list(self.local.values())
        self.local.clear()
        for c in consumers:
            c.channel.consumer_cancelled_by_broker(c)
        self.svc.forget(self)
        return count

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["leader"] = self.leader
        out["members"] = list(self.members)
        out["online"] = [m for m in self.members if m == self.svc.name or self.svc.transport.connected(m)]
        return out


class QuorumService:
    """The quorum queues of one node: effects, forwarding, timers. Created by the cluster service."""

    def __init__(self, node: Node, cluster: ClusterService) -> None:
        self.node = node
        self.cluster = cluster
        self.name = node.name
        self.transport = cluster.transport
        # consumer ids: unique across this node's incarnations, so a new consumer never takes over the
        # key (and the checked-out messages and credit) of one that died with a previous process
        self.ids = itertools.count((secrets.randbits(31) << 20) + 1)
        self.queues: dict[int, QuorumQueue] = {}
        self.publisher_id = (node.name, cluster.incarnation)
        self._acks: list[int] = []  # link publish ids confirmed this loop turn
        self._nacks: list[int] = []
        self._confirms_scheduled = False
        self._batching: list[QuorumQueue] = []  # queues with publishes to propose at the end of this turn
        self._entry: tuple[int, int, list[memoryview]] = (0, 0, [])  # (gid, raft index, payloads): last read
        self._tick: asyncio.TimerHandle | None = None
        cluster.handlers.update({"qq.get": self._h_get, "qq.purge": self._h_purge, "qq.info": self._h_info,
                                 "qq.member": self._h_member, "qq.cancel": self._h_cancel})
        node.cluster_peer_hooks.append(self._peer_changed)

    # -- groups ----------------------------------------------------------------------------------------
    @staticmethod
    def new_gid() -> int:
        return secrets.randbits(62) + 2  # 0 and 1 are not quorum queues (1 is the metadata group)

    def attach(self, q: QuorumQueue, campaign: bool, joining: bool = False) -> None:
        """Open the queue's Raft group if this node is a member (from disk after a restart). A member
        added later (`joining`) opens it empty and gets the log or a snapshot from the leader."""
        self.queues[q.gid] = q
        self._start_tick()
        if self.name not in q.members or q.replica is not None:
            return
        driver = self.cluster.driver
        assert driver is not None
        replica = QuorumReplica(q, q.config())
        voters = [self.cluster.raft_id_of(m) for m in q.members]
        group = driver.open_group(q.gid, replica, bootstrap_voters=None if joining else [v for v in voters if v])
        replica.group = group
        q.replica = replica
        group.on_leader_change = lambda lead, q=q: self._leader_changed(q, lead)
        if campaign:
            group.campaign()

    def _start_tick(self) -> None:
        if self._tick is None:
            self._tick = asyncio.get_running_loop().call_later(TICK_S, self._on_tick)

    def choose_leader(self, locator: str) -> str:
        """The node a new quorum queue's leader goes to: this one (client-local), or (balanced) the
        running node that leads the fewest quorum queues (this one among equals), or a random running
        node once there are BALANCED_MAX_QUEUES quorum queues or more."""
        if locator != "balanced":
            return self.name
        import random
        running = [self.name, *sorted(m for m in self.cluster.machine.members
                                      if m != self.name and self.transport.connected(m))]
        if len(self.queues) >= BALANCED_MAX_QUEUES:
            return random.choice(running)
        leads = dict.fromkeys(running, 0)
        for q in self.queues.values():
            lead = self.leader_name(q) or (q.members[0] if q.members else None)  # else: the locator's choice
            if lead in leads:
                leads[lead] += 1
        return min(running, key=lambda m: leads[m])

    async def elect(self, q: QuorumQueue) -> None:
        """After the declaration committed (and the other members opened the group): the declaring
        node campaigns and waits, briefly, for a leader; when the leader locator chose another member
        (the first one), it then hands the leadership over to it."""
        await self.cluster.sync_peers()
        if q.replica is not None and not q.replica.group.leader:
            q.replica.group.campaign()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_TIMEOUT_S
        while loop.time() < deadline and self.leader_name(q) is None:
            await asyncio.sleep(0.01)
        target = q.members[0] if q.members else self.name
        if target != self.name and self.is_leader(q) and self.transport.connected(target):
            try:
                self.transfer_leader(q, target)
            except (ValueError, LookupError) as exc:
                log.warning("quorum queue '%s': leader locator: %s", q.name, exc)
                return
            deadline = loop.time() + CALL_TIMEOUT_S
            while loop.time() < deadline and self.leader_name(q) != target:
                await asyncio.sleep(0.01)

    # -- membership (hutch-queues add_member / delete_member / grow / shrink) ------------------------------
    def members_changed(self, q: QuorumQueue, members: list[str]) -> None:
        """The metadata says the queue's members are now `members` (every node applies this)."""
        added = self.name in members and self.name not in q.members
        removed = self.name in q.members and self.name not in members
        q.members = list(members)
        if added:
            self.attach(q, campaign=False, joining=True)
        elif removed and q.replica is not None and self.cluster.driver is not None:
            self.cluster.driver.close_group(q.gid, delete=True)
            q.replica = None

    async def add_member(self, q: QuorumQueue, name: str) -> None:
        """Add `name` as a member: it opens the group empty (metadata), then the leader adds it as a
        voter; it catches up from the log or a snapshot. Needs a quorum (ProposalTimeout otherwise)."""
        if name not in self.cluster.machine.members:
            raise LookupError(f"node {name!r} is not a member of this cluster")
        if name in q.members:
            raise ValueError(f"node {name!r} is already a member of {rs('queue', q.name, q.vhost)}")
        await self._on_leader(q, {"t": "qq.member", "g": q.gid, "add": name})

    async def delete_member(self, q: QuorumQueue, name: str) -> None:
        if name not in q.members:
            raise LookupError(f"node {name!r} is not a member of {rs('queue', q.name, q.vhost)}")
        if len(q.members) == 1:
            raise ValueError(f"cannot remove the last member of {rs('queue', q.name, q.vhost)}")
        await self._on_leader(q, {"t": "qq.member", "g": q.gid, "delete": name})

    async def _on_leader(self, q: QuorumQueue, obj: dict[str, Any]) -> Any:
        if self.is_leader(q):
            return await self._h_member(self.name, obj)
        target = self._target(q)
        if target is None:
            raise ValueError(f"{rs('queue', q.name, q.vhost)} has no leader (no majority of its members)")
        return await self.transport.call(target, obj, timeout=CALL_TIMEOUT_S * 4)

    async def _h_member(self, peer: str, obj: dict[str, Any]) -> Any:
        q = self._queue(obj["g"])
        forwarded = await self._forward_or(q, obj)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        group = q.replica.group
        vhost = self.node.vhosts[q.vhost]
        if obj.get("add"):
            name = obj["add"]
            if name not in q.members:
                self.node.set_queue_members(vhost, q, [*q.members, name])
                await self.cluster.wait_replicated()
                await self.cluster.sync_peers()
            await group.add_voter(self.cluster.raft_id_of(name), timeout=CALL_TIMEOUT_S * 2)
        else:
            name = obj["delete"]
            await group.remove_voter(self.cluster.raft_id_of(name), timeout=CALL_TIMEOUT_S * 2)
            if name in q.members:
                self.node.set_queue_members(vhost, q, [m for m in q.members if m != name])
                await self.cluster.wait_replicated()
        return True

    def status(self, q: QuorumQueue) -> list[dict[str, Any]]:
        """quorum_status: per member, its Raft role, term and log indexes as this node knows them."""
        rows: list[dict[str, Any]] = []
        st = q.replica.group.status() if q.replica is not None else {}
        progress = st.get("progress") or {}
        for m in q.members:
            raft_id = self.cluster.raft_id_of(m)
            row: dict[str, Any] = {"node": m, "raft_id": raft_id,
                                   "online": m == self.name or self.transport.connected(m)}
            if m == self.name and st:
                row.update(role=st.get("role"), term=st.get("term"), commit_index=st.get("commit"),
                           last_applied=st.get("applied"), first_index=st.get("first_index"),
                           last_index=st.get("last_index"))
            elif raft_id in progress:
                pr = progress[raft_id]
                row.update(role="follower", match_index=pr.get("match") if isinstance(pr, dict) else None)
            rows.append(row)
        return rows

    def forget(self, q: QuorumQueue) -> None:
        self.queues.pop(q.gid, None)
        q.release_flow()
        if q.replica is not None and self.cluster.driver is not None:
            self.cluster.driver.close_group(q.gid, delete=True)
            q.replica = None

    def is_leader(self, q: QuorumQueue) -> bool:
        return q.replica is not None and q.replica.group is not None and q.replica.group.is_leader

    def leader_name(self, q: QuorumQueue) -> str | None:
        if q.replica is None or q.replica.group is None:
            return None
        lead = q.replica.group.leader
        if not lead:
            return None
        return self.name if lead == self.cluster.raft_id else self.cluster.name_of(lead)

    def _target(self, q: QuorumQueue, forwarded: bool = False) -> str | None:
        """Where a command for `q` goes from here: its leader when this node knows it and reaches it;
        else (a non-member, or a member that has no reachable leader) any reachable member — except for
        a command another node forwarded here, which only goes on to the leader (no forwarding loops)."""
        lead = self.leader_name(q)
        if lead is not None and (lead == self.name or self.transport.connected(lead)):
            return lead
        if forwarded or q.replica is not None:
            return None  # a member buffers until it knows a leader (q.pending)
        for m in q.members:
            if m != self.name and self.transport.connected(m):
                return m
        return None

    def key(self, cid: int) -> tuple[str, int]:
        return (self.name, cid)

    # -- proposing -------------------------------------------------------------------------------------
    def propose(self, q: QuorumQueue, cmd: qc.Command) -> None:
        self.propose_raw(q, qc.encode(cmd, now_ms()))

    def propose_raw(self, q: QuorumQueue, data: bytes, forwarded: bool = False) -> bool:
        if q.batch:
            self.flush_batch(q)
        if self.is_leader(q):
            assert q.replica is not None
            try:
                q.replica.group.propose_fire(data)
            except GroupClosed:  # the node is stopping (or the queue was deleted)
                return False
            except NotLeader:  # a leadership transfer is under way: sent once the new leader is known
                if len(q.pending) < MAX_PENDING:
                    q.pending.append(data)
                    return True
                return False
            return True
        target = self._target(q, forwarded)
        if target is None or target == self.name:
            if q.replica is not None and len(q.pending) < MAX_PENDING:
                q.pending.append(data)  # no leader yet (an election is running): sent when there is one
                return True
            log.warning("quorum queue '%s': no leader reachable; command dropped", q.name)
            return False
        return self.transport.send(target, {"t": "qq.cmd", "g": q.gid, "c": data})

    def publish(self, q: QuorumQueue, msg: Message) -> None:
        """Enqueue `msg` with this node's next seq for the queue. The publishes of one loop turn go in
        one EnqueueBatch entry per BATCH_MAX (`_flush_batches`). Each is kept until confirmed and sent
        again if its route went down or it is not confirmed in RESEND_S: the machine applies a seq once,
        whatever the order it arrives in (gaps are remembered), so a resend is never enqueued twice."""
        link = self.cluster.link
        pid = link.last_publish_id = next(link._ids)
        link.confirm_pending[pid] = QUORUM_TARGET
        seq = q.next_seq = q.next_seq + 1
        item = [pid, b"", 0.0, msg, seq, None]
        q.unconfirmed[seq] = item
        batch = q.batch
        if not batch:
            self._batching.append(q)
            if len(self._batching) == 1:
                asyncio.get_running_loop().call_soon(self._flush_batches)
        batch.append(item)

    def _flush_batches(self) -> None:
        queues, self._batching = self._batching, []
        for q in queues:
            self.flush_batch(q)

    def flush_batch(self, q: QuorumQueue) -> None:
        """Propose the publishes `q` gathered (before any other command of the queue from this node, so a
        channel's publish and its next basic.get, say, reach the queue in that order)."""
        batch, q.batch = q.batch, []
        if not batch:
            return
        now, sent_at = now_ms(), time.monotonic()
        for start in range(0, len(batch), BATCH_MAX):
            chunk = batch[start:start + BATCH_MAX]
            msgs = [item[3] for item in chunk]
            payloads = [pack_message(m) for m in msgs]
            ttls = None
            for m in msgs:
                if m.properties_raw[0] & 0x01:  # expiration present (property flag bit 8)
                    ttls = tuple(_ttl_of(m) for m in msgs)
                    break
            data = qc.encode(qc.EnqueueBatch(self.publisher_id, chunk[0][4], tuple([m.size for m in msgs]), ttls,
                                             tuple([len(p) for p in payloads]), b"".join(payloads)), now)
            left = [len(chunk)]  # publishes of this entry not confirmed yet
            q.open_entries += 1
            for item in chunk:
                item[1] = data
                item[2] = sent_at
                item[5] = left
            if q.local and self.is_leader(q):  # for the first delivery here (cache_batch)
                inflight = q.inflight
                inflight[chunk[0][4]] = msgs
                if len(inflight) > MSG_CACHE_MAX // 64:  # batches never applied (lost with a leader change)
                    del inflight[next(iter(inflight))]
            self.propose_raw(q, data)  # buffered (a member) or resent later when there is no route now

    def _confirmed(self, q: QuorumQueue, seqs: Iterable[int], ok: bool) -> None:
        out = self._acks if ok else self._nacks
        pop = q.unconfirmed.pop
        for seq in seqs:
            item = pop(seq, None)
            if item is not None:
                out.append(item[0])
                left = item[5]
                if left is not None:
                    left[0] -= 1
                    if not left[0]:
                        q.open_entries -= 1
        if q.flow_waiters and q.open_entries <= q.soft_limit:
            q.release_flow()
        if out and not self._confirms_scheduled:  # one pass over the waiting channels per loop turn
            self._confirms_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_confirms)

    def _flush_confirms(self) -> None:
        self._confirms_scheduled = False
        acks, self._acks = self._acks, []
        nacks, self._nacks = self._nacks, []
        self.cluster.link._on_confirms(acks, nacks)

    def _resend(self, q: QuorumQueue, older_than_s: float) -> None:
        """Propose again, in seq order, the entries of the publishes not confirmed for `older_than_s`
        (an entry once, however many of its publishes are waiting)."""
        self.flush_batch(q)
        limit = time.monotonic() - older_than_s
        give_up = time.monotonic() - CONFIRM_TIMEOUT_S
        late = []
        sent: set[int] = set()
        for seq, item in list(q.unconfirmed.items()):
            if item[2] < give_up:
                late.append(seq)
            elif item[2] < limit and item[1]:
                item[2] = time.monotonic()
                if id(item[1]) not in sent:
                    sent.add(id(item[1]))
                    self.propose_raw(q, item[1])
        if late:
            log.warning("quorum queue '%s': %d publishes not confirmed in %.0f s: nacked", q.name, len(late),
                        CONFIRM_TIMEOUT_S)
            self._confirmed(q, late, False)

    def checkout(self, q: QuorumQueue, cid: int, consumer: Consumer) -> None:
        ch = consumer.channel
        channel_id = f"{self.name}/{id(ch)}"
        self.propose(q, qc.make_checkout(self.key(cid), consumer.prefetch, consumer.no_ack, consumer.priority,
                                         consumer.tag, self.name, channel_id))

    async def call(self, q: QuorumQueue, obj: dict[str, Any]) -> Any:
        """A request the leader answers (basic.get, purge, counts); from any node."""
        from .transport import PeerUnavailable, RemoteError
        self.flush_batch(q)
        if self.is_leader(q):
            return await self.cluster.handlers[obj["t"]](self.name, obj)
        target = self._target(q)
        if target is None:
            raise ChannelError(NOT_FOUND, f"{rs('queue', q.name, q.vhost)} has no leader at the moment (no "
                                          "majority of its members is reachable)")
        try:
            return await self.transport.call(target, obj, timeout=CALL_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError, RemoteError) as exc:
            raise ChannelError(NOT_FOUND, f"{rs('queue', q.name, q.vhost)} is unavailable: {exc}") from exc

    # -- requests at the leader ------------------------------------------------------------------------
    def _queue(self, gid: int) -> QuorumQueue:
        q = self.queues.get(int(gid))
        if q is None:
            raise LookupError("404 no such quorum queue")
        return q

    async def _forward_or(self, q: QuorumQueue, obj: dict[str, Any]) -> Any | None:
        if self.is_leader(q):
            return None
        target = self._target(q)
        if target is None or target == self.name:
            raise LookupError(f"404 {rs('queue', q.name, q.vhost)} has no leader at the moment")
        return await self.transport.call(target, obj, timeout=CALL_TIMEOUT_S)

    async def _h_get(self, peer: str, obj: dict[str, Any]) -> Any:
        q = self._queue(obj["g"])
        forwarded = await self._forward_or(q, obj)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        node = obj.get("n", peer)
        cmd = qc.make_dequeue((node, 0), bool(obj["na"]), node, f"{node}/get")
        reply = await q.replica.group.propose(qc.encode(cmd, now_ms()), timeout=CALL_TIMEOUT_S)
        out: dict[str, Any] = {"r": reply.ready, "m": None}
        if reply.message is not None:
            msg_id, raft_index, redelivered, count = reply.message
            out["m"] = [msg_id, self.read_payload(q, raft_index), redelivered, count]
        return out

    async def _h_cancel(self, peer: str, obj: dict[str, Any]) -> Any:
        q = self._queue(obj["g"])
        forwarded = await self._forward_or(q, obj)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        node, cid = obj["k"]
        await q.replica.group.propose(qc.encode(qc.make_cancel((str(node), int(cid))), now_ms()),
                                      timeout=CALL_TIMEOUT_S)
        return True

    async def _h_purge(self, peer: str, obj: dict[str, Any]) -> Any:
        q = self._queue(obj["g"])
        forwarded = await self._forward_or(q, obj)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        return int(await q.replica.group.propose(qc.encode(qc.make_purge(), now_ms()), timeout=CALL_TIMEOUT_S))

    async def _h_info(self, peer: str, obj: dict[str, Any]) -> Any:
        q = self._queue(obj["g"])
        forwarded = await self._forward_or(q, obj)
        if forwarded is not None:
            return forwarded
        return list(q._state_counts())

    # -- messages between nodes ------------------------------------------------------------------------
    def on_message(self, peer: str, obj: dict[str, Any]) -> bool:
        kind = obj.get("t")
        if kind == "qq.cmd":
            q = self.queues.get(int(obj["g"]))
            if q is not None:
                _t, cmd = qc.decode(obj["c"])
                self.propose_raw(q, qc.encode(cmd, now_ms()), forwarded=True)  # re-stamped: this clock
        elif kind == "qq.d":
            q = self.queues.get(int(obj["g"]))
            if q is not None:
                self._deliver_here(q, int(obj["k"]), obj["m"])
        elif kind == "qq.c":
            q = self.queues.get(int(obj["g"]))
            if q is not None and obj["i"] == self.cluster.incarnation:
                self._confirmed(q, obj["s"], bool(obj["ok"]))
        elif kind == "qq.lc":  # a new leader, told to a node with consumers that is not a member
            q = self.queues.get(int(obj["g"]))
            if q is not None and q.replica is None:
                self._cancel_on_failover(q)
        elif kind == "qq.x":
            q = self.queues.get(int(obj["g"]))
            c = q.local.pop(int(obj["k"]), None) if q is not None else None
            if c is not None:
                c.channel.consumer_cancelled_by_broker(c)
        else:
            return False
        return True

    def _deliver_here(self, q: QuorumQueue, cid: int, msgs: list[list[Any]]) -> None:
        consumer = q.local.get(cid)
        if consumer is None:  # cancelled, or its channel closed, meanwhile (or a consumer of a previous
            # incarnation of this node): stop it and give the messages back (a cancel keeps them)
            key = self.key(cid)
            self.propose(q, qc.make_cancel(key))
            ids = [int(m[0]) for m in msgs]
            if ids:
                self.propose(q, qc.make_return(key, ids))
            return
        for msg_id, payload, redelivered, count in msgs:
            entry = QueueEntry(msg_id, payload if type(payload) is Message else self.message(payload, count))
            entry.redelivered = bool(redelivered)
            if not consumer.no_ack:
                consumer.unacked += 1
                q.owner_of[int(msg_id)] = cid
            consumer.delivered += 1
            q.stat_delivered += 1
            consumer.channel.deliver(consumer, q, entry)
        if consumer.no_ack and msgs:
            self._credit(q, cid, consumer, len(msgs))

    def _deliver_local(self, q: QuorumQueue, cid: int, deliveries: tuple[qe.Delivery, ...]) -> None:
        """The leader's deliveries to a consumer on this node: a message published here and not
        delivered yet comes from `msg_cache` as it was published, the others are read from the log."""
        consumer = q.local[cid]
        deliver = consumer.channel.deliver
        cache = q.msg_cache
        manual = not consumer.no_ack
        owner_of = q.owner_of
        n = 0
        for msg_id, ref, redelivered, count in deliveries:
            msg = cache.pop(msg_id, None) if cache else None
            if msg is None or count:
                payload = self.read_payload(q, ref)
                if payload is None:
                    continue
                msg = self.message(payload, count)
            entry = QueueEntry(msg_id, msg)
            if redelivered:
                entry.redelivered = True
            if manual:
                consumer.unacked += 1
                owner_of[msg_id] = cid
            n += 1
            deliver(consumer, q, entry)
        consumer.delivered += n
        q.stat_delivered += n
        if not manual and n:
            self._credit(q, cid, consumer, n)

    def _credit(self, q: QuorumQueue, cid: int, consumer: Consumer, n: int) -> None:
        """An auto-ack consumer spends the machine's credit per delivery: give back what its channel has
        written out, now, or once the connection's socket takes writes again (`deliver_pending`)."""
        if consumer.channel.conn.write_paused:
            q.owed_credit[cid] = q.owed_credit.get(cid, 0) + n
        else:
            self.propose(q, qc.make_credit(self.key(cid), n))

    @staticmethod
    def message(payload: bytes, count: int) -> Message:
        msg = decode_message(msgpack.unpackb(payload, raw=False))
        if count:
            msg = msg.with_header("x-delivery-count", count)
        return msg

    # -- bodies ----------------------------------------------------------------------------------------
    def read_payload(self, q: QuorumQueue, msg_id: int) -> bytes | None:
        """The stored bytes of message `msg_id`: from the log entry at `msg_id >> SHIFT` (position
        `msg_id & _POS_MASK` in it), or from the installed snapshot for a message below this node's log."""
        if q.replica is not None and msg_id in q.replica.side_payloads:
            return q.replica.side_payloads[msg_id]
        raft_index, pos = msg_id >> SHIFT, msg_id & _POS_MASK
        gid, idx, payloads = self._entry
        if gid != q.gid or idx != raft_index:
            data = self._entry_data(q, raft_index)
            if data is None:
                log.error("quorum queue '%s': the body at raft index %d is not in this node's log", q.name,
                          raft_index)
                return None
            payloads = qc.payloads_of(data)
            self._entry = (q.gid, raft_index, payloads)
        return bytes(payloads[pos]) if pos < len(payloads) else None

    def _entry_data(self, q: QuorumQueue, raft_index: int) -> bytes | None:
        driver = self.cluster.driver
        assert driver is not None
        mem = driver._store.state(q.gid).mem  # entries not yet flushed to segment files: in RAM anyway
        if mem and mem[0].index <= raft_index <= mem[-1].index:
            e = mem[raft_index - mem[0].index]
            if e.index == raft_index:
                return e.data
        try:
            entries = driver._store.group(q.gid).entries(raft_index, raft_index + 1, 1 << 62)
        except Exception:  # noqa: BLE001 - compacted or unavailable: reported by the caller
            return None
        return entries[0].data if entries else None

    def first_log_index(self, q: QuorumQueue) -> int:
        driver = self.cluster.driver
        assert driver is not None
        return driver._store.group(q.gid).first_index()

    # -- the leader's effects --------------------------------------------------------------------------
    def run_effects(self, q: QuorumQueue, effects: list[qe.Effect]) -> None:
        for eff in effects:
            t = type(eff)
            if t is qe.Deliver:
                node, cid = eff.consumer_key
                if node == self.name and cid in q.local:
                    self._deliver_local(q, cid, eff.messages)
                    continue
                msgs = []
                cache = q.msg_cache
                for msg_id, ref, redelivered, count in eff.messages:
                    if cache:
                        cache.pop(msg_id, None)
                    payload = self.read_payload(q, ref)
                    if payload is not None:
                        msgs.append([msg_id, payload, redelivered, count])
                if node == self.name:
                    self._deliver_here(q, cid, msgs)  # a consumer gone meanwhile: gives them back
                else:
                    self.transport.send(node, {"t": "qq.d", "g": q.gid, "k": cid, "m": msgs})
            elif t is qe.Confirm or t is qe.Reject:
                node, incarnation = eff.publisher_id
                if node == self.name:
                    if incarnation == self.cluster.incarnation:
                        self._confirmed(q, eff.seqs, t is qe.Confirm)
                else:
                    self.transport.send(node, {"t": "qq.c", "g": q.gid, "i": incarnation, "s": list(eff.seqs),
                                               "ok": t is qe.Confirm})
            elif t is qe.DeadLetter:
                self._dead_letter(q, eff.reason, eff.raft_indexes)
            elif t is qe.DeleteQueue:
                vhost = self.node.vhosts.get(q.vhost)
                if vhost is not None and vhost.queues.get(q.name) is q:
                    log.info("quorum queue '%s' in vhost '%s' unused for its x-expires: deleted", q.name, q.vhost)
                    self.node.delete_queue(vhost, q)
            elif t is qe.DlxWorker:
                q.dlx_running = eff.running
                if eff.running:
                    self.propose(q, qc.make_dlx_checkout(self.node.config.dead_letter_worker_consumer_prefetch))
            elif t is qe.DlxDeliver:
                asyncio.ensure_future(self._dlx_republish(q, eff.messages))

    async def _dlx_republish(self, q: QuorumQueue, messages: tuple[tuple[int, int, str], ...]) -> None:
        """At-least-once dead-lettering (seed 000): republish to the dead-letter exchange with confirms
        (the targets' storage sync, or the other nodes' acks) and settle only what was confirmed; the
        rest stays in the queue's dead-letter area and is handed out again (retry on the next tick)."""
        from .queue_features import dead_letter
        q.dlx_busy = True
        try:
            storage = self.node.persistence
            link = self.cluster.link
            before = storage.last_enqueued if storage is not None else 0
            remote_before = link.last_publish_id
            ok_ids = []
            for msg_id, raft_index, reason in messages:
                payload = self.read_payload(q, raft_index)
                if payload is None:
                    continue
                msg = decode_message(msgpack.unpackb(payload, raw=False))
                if dead_letter(self.node, q, [msg], reason)[0]:  # type: ignore[arg-type]
                    ok_ids.append(msg_id)
            need = storage.last_enqueued if storage is not None and storage.last_enqueued != before else 0
            lo, hi = remote_before + 1, link.last_publish_id
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CONFIRM_TIMEOUT_S
            while loop.time() < deadline:
                local_ok = storage is None or storage.synced_seq >= need
                remote = link.confirmed(lo, hi) if hi >= lo else 1
                if remote < 0:
                    ok_ids = []  # some target refused: settle nothing of this batch, retry it
                    break
                if local_ok and remote == 1:
                    break
                await asyncio.sleep(0.005)
            else:
                ok_ids = []
            if hi >= lo:
                link.forget_confirms(lo, hi)
            if ok_ids and self.is_leader(q):
                self.propose(q, qc.make_dlx_settle(ok_ids))
        finally:
            q.dlx_busy = False

    def _dead_letter(self, q: QuorumQueue, reason: str, raft_indexes: tuple[int, ...]) -> None:
        from .queue_features import dead_letter
        msgs = []
        for idx in raft_indexes:
            payload = self.read_payload(q, idx)
            if payload is not None:
                msgs.append(decode_message(msgpack.unpackb(payload, raw=False)))
        if msgs:
            dead_letter(self.node, q, msgs, reason)  # type: ignore[arg-type]

    def _cancel_on_failover(self, q: QuorumQueue) -> None:
        """The leader changed: this node's consumers with x-cancel-on-ha-failover get basic.cancel."""
        for cid, c in list(q.local.items()):
            if c.arguments.get("x-cancel-on-ha-failover") is True:
                del q.local[cid]
                self.propose(q, qc.make_cancel(self.key(cid)))  # buffered for the next leader if none
                c.channel.consumer_cancelled_by_broker(c)

    def _leader_changed(self, q: QuorumQueue, lead: int) -> None:
        q.msg_cache.clear()
        q.inflight.clear()
        self._entry = (0, 0, [])
        if not lead:  # the leader failed or handed over: this member's x-cancel-on-ha-failover consumers go
            self._cancel_on_failover(q)
        if lead:
            self._flush_pending(q)
        if q.replica is None or not q.replica.group.is_leader:
            return
        log.info("quorum queue '%s' in vhost '%s': leader is now %s", q.name, q.vhost, self.name)
        consumer_nodes = {c.node for c in q.replica.machine.state.consumers.by_key.values()}
        for node in sorted(consumer_nodes - set(q.members) - {self.name, ""}):
            self.transport.send(node, {"t": "qq.lc", "g": q.gid})  # non-members see no leader change
        q._last_config = None
        q.apply_settings(q.settings)
        effects = q.replica.machine.leader_effects()
        if effects:
            self.run_effects(q, effects)
        for m in q.members:
            if m != self.name and not self.transport.connected(m):
                self.propose(q, qc.make_down(m, "noconnection"))

    def _peer_changed(self, peer: str, up: bool) -> None:
        for q in list(self.queues.values()):
            if not up:
                if self.is_leader(q):
                    self.propose(q, qc.make_down(peer, "noconnection"))
                if q.unconfirmed:
                    self._resend(q, 0.0)  # their route may have gone with that node
            else:
                self._flush_pending(q)
                if q.local and peer in q.members:
                    for cid, c in list(q.local.items()):  # check out again: a lost leader may have dropped them
                        self.checkout(q, cid, c)

    def _flush_pending(self, q: QuorumQueue) -> None:
        if q.pending and self._target(q) is not None:
            pending, q.pending = q.pending, []
            for data in pending:
                self.propose_raw(q, data)

    def _on_tick(self) -> None:
        self._tick = asyncio.get_running_loop().call_later(TICK_S, self._on_tick)
        for q in self.queues.values():
            if q.pending:
                self._flush_pending(q)
            if q.unconfirmed:
                self._resend(q, RESEND_S)
        now = now_ms()
        for q in self.queues.values():
            if self.is_leader(q) and q.dlx_running and not q.dlx_busy and q.replica is not None \
                    and q.replica.machine.state.dlx_count():
                self.propose(q, qc.make_dlx_checkout(self.node.config.dead_letter_worker_consumer_prefetch))
            if self.is_leader(q):
                cfg = q.replica.machine.state.config if q.replica is not None else None
                if cfg is not None and (cfg.message_ttl_ms is not None or cfg.expires_ms is not None
                                        or q.replica.machine.state.message_count()):
                    self.propose(q, qc.make_tick(now))

    def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def transfer_leader(self, q: QuorumQueue, name: str) -> None:
        """Hand the leadership of `q` to its member `name` (hutch-queues rebalance); on the leader only.
        Raft finishes the transfer once `name` is caught up, or abandons it after an election timeout."""
        if not self.is_leader(q):
            raise ValueError(f"node {self.name!r} does not lead {rs('queue', q.name, q.vhost)}")
        if name not in q.members:
            raise LookupError(f"node {name!r} is not a member of {rs('queue', q.name, q.vhost)}")
        assert q.replica is not None
        q.replica.group.transfer_leader(self.cluster.raft_id_of(name))
