"""Quorum queues at run time: the replicated queue machine (queues/quorum/) on the node's Raft driver.

Owns: `QuorumQueue`, the queue object every node keeps for a quorum queue (members and non-members
alike: the channel code does not know the difference), `QuorumReplica`, the driver's `StateMachine` on
a member node, the leader locator's setting (`leader_locator`) and the constants of the runtime.
`QuorumService` (quorum_service.py, with quorum_members.py) runs the leader's effects (deliveries,
confirms, dead letters, timers) and carries the inter-node messages of quorum queues.

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
- Publisher confirms: a publish's receipt is settled once its enqueue is applied at the leader
  (committed: on a majority's disk; the machine's Confirm effect), rejected on its Reject effect or
  when no confirm came in CONFIRM_TIMEOUT_S. A publisher is (node, incarnation) with a seq per queue;
  an enqueue (`PendingPublish`) is kept until confirmed and sent again when its route may have gone (a
  node down, or no confirm in RESEND_S): the machine applies each seq once whatever order they arrive
  in, so a resend is never enqueued twice. A queue deleted meanwhile settles what it held (RabbitMQ).
- Consumers are keyed (node, consumer id); their node settles by msg id (the raft index of the
  message's entry). A command that leaves its node (a follower's or a non-member's settle, return,
  cancel, ...) is tracked until the leader reports it applied (`QuorumApplied`) and resent, in order,
  when the leader or the route to it changes or after RESEND_S (queues/quorum/client.py): a member that
  relays it, or a leader that dies before committing it, loses nothing. A non-member sends to the
  leader itself once it has heard from it (`leader_hint`), through a member before that. When a node goes down, the leader proposes `down` for it: its consumers' unacked
  messages return to the queue (counted as failed deliveries); when it comes back, its channels' live
  consumers check out again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

import msgpack

from hutch.amqp import spec
from hutch.cluster import messages as cm
from hutch.core.confirms import Receipt
from hutch.core.credit_flow import FLOW_HIGH, FLOW_LOW, QueuePace, backlog_holds
from hutch.core.message import Message
from hutch.core.queue_type import PENDING, SETTLED, Consumer, Deliverer, Published, Queue, QueueEntry
from hutch.queues.quorum import commands as qc
from hutch.queues.quorum import effects as qe
from hutch.queues.quorum.client import CommandTracker
from hutch.queues.quorum.config import QuorumConfig
from hutch.queues.quorum.machine import QuorumMachine
from hutch.queues.quorum.messages import SHIFT
from hutch.runtime.clock import SYSTEM_CLOCK

log = logging.getLogger("hutch.quorum")


class QuorumHost(Protocol):
    """What a quorum queue asks of the node's quorum service (service.py's `QuorumService`)."""

    name: str
    node: Any
    transport: Any
    ids: Any
    publisher_id: tuple[str, str]

    async def call(self, q: QuorumQueue, req: tuple[Any, ...]) -> Any: ...

    def checkout(self, q: QuorumQueue, cid: int, consumer: Consumer) -> None: ...

    def forget(self, q: QuorumQueue) -> None: ...

    def is_leader(self, q: QuorumQueue) -> bool: ...

    def key(self, cid: int) -> tuple[str, int]: ...

    def leader_name(self, q: QuorumQueue) -> str | None: ...

    def message(self, payload: bytes, count: int) -> Message: ...

    def propose(self, q: QuorumQueue, cmd: qc.Command) -> None: ...

    def publish(self, q: QuorumQueue, msg: Message, receipt: Receipt | None) -> None: ...

    def first_log_index(self, q: QuorumQueue) -> int: ...

    def read_payload(self, q: QuorumQueue, msg_id: int) -> bytes | None: ...

    def run_effects(self, q: QuorumQueue, effects: list[qe.Effect]) -> None: ...

CALL_TIMEOUT_S = 5.0
MAX_PENDING = 10_000
CONFIRM_TIMEOUT_S = 30.0  # a publish not confirmed by then is nacked (its fate is unknown to us)
RESEND_S = 3.0  # an enqueue not confirmed by then is sent again (deduplicated by the machine)
TICK_S = 1.0
SNAPSHOT_FLOOR = 16_384  # commands (messages) between snapshots of a queue, at least (quorum_snapshot_interval)
SNAPSHOT_MIN_ENTRIES = 64
MSG_CACHE_MAX = 16_384  # the leader's own just-published messages kept for their first local delivery
SETTLED_KEPT = 16_384  # msg ids settled here remembered against a new leader's deliveries (`settled_here`)
SETTLES_KEPT = 2_048  # the leader's own settle commands not known committed, at most (`led_settles`)


now_ms = SYSTEM_CLOCK.wall_ms  # the leader's stamp on commands (meta's time); the runtime's one clock


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


def _priority_of(msg: Message) -> int:
    """The message's priority property (0-255; none is 0): above 4 it is delivered as high priority."""
    priority = msg.properties.priority
    return priority if isinstance(priority, int) and 0 <= priority <= 255 else 0


class ProposedEntry:
    """One EnqueueBatch entry proposed from this node: its bytes (proposed again on a resend) and how
    many of its publishes are not confirmed yet (credit flow counts open entries)."""

    __slots__ = ("data", "left")

    def __init__(self, data: bytes, left: int) -> None:
        self.data = data
        self.left = left


class PendingPublish:
    """A publish from this node to a quorum queue, kept until the machine confirms or rejects it."""

    __slots__ = ("seq", "msg", "receipt", "entry", "sent_at")

    def __init__(self, seq: int, msg: Message, receipt: Receipt | None) -> None:
        self.seq = seq  # this node's publish seq for the queue (the machine deduplicates by it)
        self.msg = msg
        self.receipt = receipt  # None: nobody waits (a publisher without confirms); kept for the resends
        self.entry: ProposedEntry | None = None  # None until proposed (flush_batch)
        self.sent_at = 0.0  # monotonic time of the last proposal


_SETTLING = frozenset({qc.Settle, qc.Return, qc.Discard, qc.Requeue})  # commands that give a consumer credit


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
        q = self.queue
        if type(cmd) is qc.EnqueueBatch:
            self.commands += len(cmd.sizes)
            q.pace.enqueued(len(cmd.sizes))
            if q.inflight and cmd.publisher_id == q.svc.publisher_id and self.group.is_leader:
                q.cache_batch(index, cmd)
        else:
            self.commands += 1
            if type(cmd) is qc.Enqueue:
                q.pace.enqueued(1)
        reply = self.machine.apply_command(index, system_time_ms, cmd)
        if type(cmd) in _SETTLING and self.group is not None and self.group.is_leader:
            q.pace_settled(cmd)  # after the apply: the consumer's checked-out count is the new one
        return reply

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
        """Entries between snapshots: about max(quorum_snapshot_interval, 2 x live messages) commands. A
        snapshot costs O(live messages) (it carries their bodies), so this amortises it; counting commands,
        not entries, bounds the log kept in RAM and on disk whatever the batch size."""
        per_entry = self.commands / self.entries if self.entries else 1.0
        target = max(self.queue.svc.node.config.quorum_snapshot_interval, 2 * self.machine.state.message_count())
        return max(SNAPSHOT_MIN_ENTRIES, int(target / max(per_entry, 1.0)))


class QuorumQueue(Queue):
    queue_type = "quorum"
    remote = True  # basic.get, purge and counts are prepared asynchronously (connection.py)

    def __init__(self, svc: QuorumHost, vhost: str, name: str, arguments: dict[str, Any], gid: int,
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
        # commands waiting for a leader to be known (bounded): (data, origin, seq), origin and seq those of
        # a tracked command relayed for another node ("", 0: untracked)
        self.pending: list[tuple[bytes, str, int]] = []
        # this node's commands sent towards the leader and not yet reported applied, resent until they are;
        # a non-member's leader hint (queues/quorum/client.py)
        self.sent = CommandTracker(MAX_PENDING)
        # msg id -> consumer id: what this node's consumers acked or dropped while it did not lead (their
        # settles may still be on their way), and, after it lost the leadership, what they settled while it
        # led: a new leader hands out every message it sees checked out, and these are not delivered
        # again (bounded: the oldest go first)
        self.settled_here: dict[int, int] = {}
        # the leader's own settle/discard commands not yet known to be applied: proposed here (no waiter,
        # the hot path) and perhaps never committed when it loses the leadership, then sent to the new
        # leader (`QuorumService._settles_after_leading`). Two generations, turned at the tick once the
        # older one is applied (`led_mark`: the log's last index when the newer one began), so they hold
        # about a tick's settles, bounded
        self.led_settles: deque[bytes] = deque(maxlen=SETTLES_KEPT)
        self.led_settles_old: deque[bytes] = deque(maxlen=SETTLES_KEPT)
        self.led_mark = 0
        self.next_seq = 0  # this node's publish seq for this queue (the machine deduplicates by it)
        self.unconfirmed: dict[int, PendingPublish] = {}  # seq -> publish not confirmed yet
        self.batch: list[PendingPublish] = []  # this loop turn's publishes, not proposed yet
        # credit flow: enqueue entries proposed from this node and not wholly confirmed; past the soft
        # limit (quorum_commands_soft_limit) the connections publishing here stop being read
        self.open_entries = 0
        self.soft_limit = svc.node.config.quorum_commands_soft_limit
        # credit flow, the backlog rule (core/credit_flow.py): the leader's record of its consumers' pace
        self.pace = QueuePace()
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
            reply = await self.svc.call(self, cm.QuorumGet(self.gid, bool(method.no_ack), self.svc.name))
            self._counts = (reply.ready, *self._counts[1:])
            if reply.message is not None:
                msg_id, payload, redelivered, count = reply.message
                entry = QueueEntry(int(msg_id), self.svc.message(payload, count))
                entry.redelivered = bool(redelivered)
                if not method.no_ack:
                    self.owner_of[int(msg_id)] = 0
                self._prepared_get = entry
        elif isinstance(method, spec.Queue.Purge):
            self._prepared_purge = int(await self.svc.call(self, cm.QuorumPurge(self.gid)))
        elif isinstance(method, spec.Basic.Consume):
            return
        elif isinstance(method, spec.Basic.Cancel):
            await self.cancel_committed(method.consumer_tag)
        else:
            counts = await self.svc.call(self, cm.QuorumInfo(self.gid))  # [ready, unacked, consumers, bytes, ...]
            self._counts = (counts[0], counts[1], counts[2], counts[3])

    # -- messages ------------------------------------------------------------------------------------
    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        self.stat_published += 1
        self.svc.publish(self, msg, receipt)
        return SETTLED if receipt is None else PENDING

    def needs_flow_control(self) -> bool:
        """Credit flow for a quorum queue: hold this node's publishers to the queue while more than
        `quorum_commands_soft_limit` enqueue entries from here are not wholly confirmed (the pipeline to
        the leader is full), or, on the leader, while the backlog rule holds (core/credit_flow.py): more
        than FLOW_HIGH ready messages behind a consumer that keeps pace while the loop is saturated (the
        node, not the consumer, is the bottleneck: every message a publisher adds only adds latency).
        The backlog test is sampled every 64th publish from this node."""
        if self.open_entries > self.soft_limit:
            return True
        if self.next_seq & 63:
            return False
        return self._backlog_holds(FLOW_HIGH)

    def flow_still_needed(self) -> bool:
        """Keep held publishers while the pipeline is full or the backlog is over FLOW_LOW behind a
        consumer that keeps pace on a saturated loop (asked on confirms, deliveries and the recheck)."""
        return self.open_entries > self.soft_limit or self._backlog_holds(FLOW_LOW)

    def _backlog_holds(self, limit: int) -> bool:
        replica = self.replica
        if replica is None or replica.group is None or not replica.group.is_leader:
            return False  # the backlog and the consumers' pace are known where the machine leads
        return backlog_holds(replica.machine.state.ready_count(), limit, self.svc.node.loop_load, self.pace,
                             now_ms)

    def pace_delivered(self, key: Any, n: int) -> None:
        """The leader handed `n` messages to consumer `key` (a Deliver effect): feed its pace."""
        assert self.replica is not None
        c = self.replica.machine.state.consumers.by_key.get(key)
        if c is not None and c.prefetch and not c.auto_ack:
            self.pace.delivered(key, n, len(c.checked_out), c.prefetch, now_ms())

    def pace_settled(self, cmd: Any) -> None:
        """The leader applied a settle, return, discard or requeue of consumer `cmd.consumer_key`."""
        assert self.replica is not None
        key = cmd.consumer_key
        c = self.replica.machine.state.consumers.by_key.get(key)
        acked = len(cmd.msg_ids) if type(cmd) is qc.Settle else 0
        self.pace.settled(key, acked, len(c.checked_out) if c is not None else 0, now_ms())

    def get(self, channel: Deliverer | None, no_ack: bool) -> QueueEntry | None:
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
            self._settling(cid, ids)
            self.svc.propose(self, qc.make_settle(self.svc.key(cid), ids))

    def _settling(self, cid: int, ids: list[int]) -> None:
        """This node's consumer `cid` acked or dropped `ids`: remembered while another node leads (the
        settle may be lost with that leader and resent; a new leader's deliveries of them are skipped)."""
        if cid and not self.svc.is_leader(self):
            self.remember_settled(cid, ids)

    def remember_settled(self, cid: int, ids: Iterable[int]) -> None:
        held = self.settled_here
        for msg_id in ids:
            held[msg_id] = cid
        while len(held) > SETTLED_KEPT:
            del held[next(iter(held))]

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for cid, ids in self._by_owner(entries).items():
            self.svc.propose(self, qc.make_return(self.svc.key(cid), ids))

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        for cid, ids in self._by_owner(entries).items():
            self._settling(cid, ids)
            self.svc.propose(self, qc.make_discard(self.svc.key(cid), ids))

    def touch(self) -> None:
        """A redeclare is a use: restart the queue's x-expires countdown (the leader stamps the time)."""
        self.svc.propose(self, qc.make_touch())

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
                    await self.svc.call(self, cm.QuorumCancel(self.gid, *self.svc.key(cid)))
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
