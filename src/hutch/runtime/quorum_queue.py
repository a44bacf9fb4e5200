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

from .raft_group import GroupClosed, NotLeader
from .remote_queue import decode_message, encode_message

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
SNAPSHOT_FLOOR = 8192


def now_ms() -> int:
    return int(time.time() * 1000)


class QuorumReplica:
    """The Raft driver's StateMachine for one member of one quorum queue."""

    def __init__(self, queue: QuorumQueue, config: QuorumConfig) -> None:
        self.queue = queue
        self.machine = QuorumMachine(config, effects_sink=self._effects)
        self.side_payloads: dict[int, bytes] = {}  # bodies of live messages from an installed snapshot
        self.group: Any = None

    def apply(self, index: int, data: bytes) -> Any:
        return self.machine.apply(index, data)

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
        self.side_payloads = {int(i): bytes(p) for i, p in pays if int(i) < first}

    def on_membership(self, voters: tuple[int, ...]) -> None:
        self.queue.voters = tuple(voters)

    def release_cursor(self) -> int:
        return self.machine.state.release_cursor()

    def snapshot_interval(self) -> int:
        return max(SNAPSHOT_FLOOR, 2 * self.machine.state.message_count())


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
        self.unconfirmed: dict[int, list[Any]] = {}  # seq -> [link publish id, entry bytes, last sent]
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
        else:
            self._counts = tuple(await self.svc.call(self, {"t": "qq.info", "g": self.gid}))  # type: ignore

    # -- messages ------------------------------------------------------------------------------------
    def publish(self, msg: Message) -> bool | None:
        self.stat_published += 1
        self.svc.publish(self, msg)
        return None

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
        pass  # the leader delivers (prefetch credit is the machine's)

    # -- consumers -----------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumers = True
        cid = next(self.svc.ids)
        self.local[cid] = consumer
        self.svc.checkout(self, cid, consumer)

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
        self._tick: asyncio.TimerHandle | None = None
        cluster.handlers.update({"qq.get": self._h_get, "qq.purge": self._h_purge, "qq.info": self._h_info,
                                 "qq.member": self._h_member})
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

    async def elect(self, q: QuorumQueue) -> None:
        """After the declaration committed (and the other members opened the group): the declaring
        node campaigns (leader locator client-local) and waits, briefly, for a leader."""
        await self.cluster.sync_peers()
        if q.replica is not None and not q.replica.group.leader:
            q.replica.group.campaign()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_TIMEOUT_S
        while loop.time() < deadline and self.leader_name(q) is None:
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
        """Propose an enqueue (seq: this node's next for the queue). It is kept until confirmed and sent
        again if its route went down or it is not confirmed in RESEND_S: the machine applies a seq once,
        whatever the order it arrives in (gaps are remembered), so a resend is never enqueued twice."""
        link = self.cluster.link
        pid = next(link._ids)
        link.last_publish_id = pid
        props = msg.properties
        ttl = None
        if props.expiration is not None:
            try:
                ttl = max(0, int(props.expiration))
            except ValueError:
                ttl = None
        q.next_seq += 1
        payload = msgpack.packb(encode_message(msg), use_bin_type=True)
        data = qc.encode(qc.make_enqueue(self.publisher_id, q.next_seq, msg.size, ttl, payload), now_ms())
        link.confirm_pending[pid] = QUORUM_TARGET
        q.unconfirmed[q.next_seq] = [pid, data, time.monotonic()]
        self.propose_raw(q, data)  # buffered (a member) or resent later when there is no route now

    def _confirmed(self, q: QuorumQueue, seqs: Iterable[int], ok: bool) -> None:
        out = self._acks if ok else self._nacks
        for seq in seqs:
            item = q.unconfirmed.pop(seq, None)
            if item is not None:
                out.append(item[0])
        if out and not self._confirms_scheduled:  # one pass over the waiting channels per loop turn
            self._confirms_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_confirms)

    def _flush_confirms(self) -> None:
        self._confirms_scheduled = False
        acks, self._acks = self._acks, []
        nacks, self._nacks = self._nacks, []
        self.cluster.link._on_confirms(acks, nacks)

    def _resend(self, q: QuorumQueue, older_than_s: float) -> None:
        limit = time.monotonic() - older_than_s
        give_up = time.monotonic() - CONFIRM_TIMEOUT_S
        late = []
        for seq, item in list(q.unconfirmed.items()):
            if item[2] < give_up:
                late.append(seq)
            elif item[2] < limit:
                item[2] = time.monotonic()
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
            entry = QueueEntry(int(msg_id), self.message(payload, count))
            entry.redelivered = bool(redelivered)
            if not consumer.no_ack:
                consumer.unacked += 1
                q.owner_of[int(msg_id)] = cid
            consumer.delivered += 1
            q.stat_delivered += 1
            consumer.channel.deliver(consumer, q, entry)

    @staticmethod
    def message(payload: bytes, count: int) -> Message:
        msg = decode_message(msgpack.unpackb(payload, raw=False))
        if count:
            msg = msg.with_header("x-delivery-count", count)
        return msg

    # -- bodies ----------------------------------------------------------------------------------------
    def read_payload(self, q: QuorumQueue, raft_index: int) -> bytes | None:
        if q.replica is not None and raft_index in q.replica.side_payloads:
            return q.replica.side_payloads[raft_index]
        driver = self.cluster.driver
        assert driver is not None
        mem = driver._store.state(q.gid).mem  # entries not yet flushed to segment files: in RAM anyway
        if mem and mem[0].index <= raft_index <= mem[-1].index:
            e = mem[raft_index - mem[0].index]
            if e.index == raft_index:
                return bytes(qc.payload_of(e.data))
        try:
            entries = driver._store.group(q.gid).entries(raft_index, raft_index + 1, 1 << 62)
        except Exception:  # noqa: BLE001 - compacted or unavailable: reported below
            entries = []
        if not entries:
            log.error("quorum queue '%s': the body at raft index %d is not in this node's log", q.name,
                      raft_index)
            return None
        return bytes(qc.payload_of(entries[0].data))

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
                msgs = []
                for msg_id, raft_index, redelivered, count in eff.messages:
                    payload = self.read_payload(q, raft_index)
                    if payload is not None:
                        msgs.append([msg_id, payload, redelivered, count])
                if node == self.name:
                    self._deliver_here(q, cid, msgs)
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

    def _leader_changed(self, q: QuorumQueue, lead: int) -> None:
        if not lead:  # the leader failed or handed over: this member's x-cancel-on-ha-failover consumers go
            for cid, c in list(q.local.items()):
                if c.arguments.get("x-cancel-on-ha-failover") is True:
                    del q.local[cid]
                    q.pending.append(qc.encode(qc.make_cancel(self.key(cid)), now_ms()))  # for the next leader
                    c.channel.consumer_cancelled_by_broker(c)
        if lead:
            self._flush_pending(q)
        if q.replica is None or not q.replica.group.is_leader:
            return
        log.info("quorum queue '%s' in vhost '%s': leader is now %s", q.name, q.vhost, self.name)
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
