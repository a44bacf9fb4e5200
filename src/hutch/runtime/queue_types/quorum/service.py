"""Quorum queues at run time, the node's side: `QuorumService`.

Owns what a node does for all its quorum queues: opening their Raft groups (`attach`), proposing
commands (at the leader, or forwarded to it; publishes batched per loop turn), publisher confirms and
resends, the leader's effects (deliveries, confirms, dead letters, queue TTL, the at-least-once
dead-letter worker), reading bodies back from the log, the requests other nodes send to a leader
(basic.get, purge, counts, cancel) and the inter-node messages of quorum queues (`qq.*`), and the
periodic tick. Leader placement and membership are in quorum_members.py (inherited); the queue object
and the Raft state machine are in quorum_queue.py, whose docstring has the rules.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from hutch.amqp.errors import NOT_FOUND, ChannelError
from hutch.cluster import messages as cm
from hutch.core.confirms import ConfirmBatch, ConfirmOwner, Receipt
from hutch.core.credit_flow import QueuePace
from hutch.core.message import Message
from hutch.core.queue_type import Consumer, QueueEntry
from hutch.core.vhost import rs
from hutch.queues.quorum import commands as qc
from hutch.queues.quorum import effects as qe
from hutch.queues.quorum.messages import BATCH_MAX, SHIFT
from hutch.runtime.clustering.raft_group import GroupClosed, NotLeader
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
from hutch.runtime.queue_types.classic.features import dead_letter, dead_letter_confirmed
from hutch.runtime.queue_types.quorum.members import QuorumMembership
from hutch.runtime.queue_types.quorum.queue import (
    CALL_TIMEOUT_S,
    CONFIRM_TIMEOUT_S,
    MAX_PENDING,
    MSG_CACHE_MAX,
    RESEND_S,
    TICK_S,
    PendingPublish,
    ProposedEntry,
    QuorumQueue,
    QuorumReplica,
    _priority_of,
    _ttl_of,
    log,
    now_ms,
)
from hutch.runtime.queue_types.remote_codec import decode_message, pack_message

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService

_POS_MASK = (1 << SHIFT) - 1
_SETTLES = (qc.Settle, qc.Discard)


class QuorumService(QuorumMembership):
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
        self._leader_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self.publisher_id = (node.name, cluster.incarnation)
        # the seqs of this node's tracked commands (queues/quorum/client.py): increasing, and unlike those of
        # a previous incarnation, so a late QuorumApplied meant for it forgets nothing of this one's
        self._cmd_seqs = itertools.count((secrets.randbits(31) << 20) + 1)
        self._applied_out: dict[tuple[str, int], list[int]] = {}  # (origin, gid) -> seqs applied, this turn
        self._batching: list[QuorumQueue] = []  # queues with publishes to propose at the end of this turn
        self._entry: tuple[int, int, list[memoryview]] = (0, 0, [])  # (gid, raft index, payloads): last read
        self._tick: asyncio.TimerHandle | None = None
        cluster.register(cm.QuorumGet, self._h_get)
        cluster.register(cm.QuorumPurge, self._h_purge)
        cluster.register(cm.QuorumInfo, self._h_info)
        cluster.register(cm.QuorumMember, self._h_member)
        cluster.register(cm.QuorumCancel, self._h_cancel)
        cluster.register(cm.QuorumCommand, self._on_command)
        cluster.register(cm.QuorumDeliver, self._on_deliver)
        cluster.register(cm.QuorumConfirm, self._on_confirm)
        cluster.register(cm.QuorumLeaderChanged, self._on_leader_changed)
        cluster.register(cm.QuorumApplied, self._on_applied)
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

    def forget(self, q: QuorumQueue) -> None:
        self.queues.pop(q.gid, None)
        q.release_flow()
        owners: dict[int, ConfirmOwner] = {}
        for p in q.unconfirmed.values():
            if p.receipt is not None:
                owners.setdefault(id(p.receipt.owner), p.receipt.owner)
        q.unconfirmed.clear()
        q.batch.clear()
        q.sent.clear()
        for owner in owners.values():  # the queue is gone: what waited for it is settled (RabbitMQ)
            owner.queue_deleted(q)
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
        """Where a command for `q` goes from here: its leader when this node knows it and reaches it (a
        non-member knows it as the member that last answered as the leader: `leader_hint`); else (a
        non-member that has no hint, or a member that has no reachable leader) any reachable member —
        except for a command another node forwarded here, which only goes on to the leader (no
        forwarding loops)."""
        lead = self.leader_name(q)
        if lead is not None and (lead == self.name or self.transport.connected(lead)):
            return lead
        if forwarded or q.replica is not None:
            return None  # a member buffers until it knows a leader (q.pending)
        hint = q.sent.leader_hint
        if hint is not None and hint in q.members and self.transport.connected(hint):
            return hint  # a leader that lost its leadership since relays to the new one
        for m in q.members:
            if m != self.name and self.transport.connected(m):
                return m
        return None

    def key(self, cid: int) -> tuple[str, int]:
        return (self.name, cid)

    # -- proposing -------------------------------------------------------------------------------------
    def propose(self, q: QuorumQueue, cmd: qc.Command) -> None:
        if type(cmd) is qc.Return and self.is_leader(q):
            self._reappend(q, cmd)
            return
        data = qc.encode(cmd, now_ms())
        if type(cmd) in _SETTLES and self.is_leader(q):
            q.led_settles.append(data)  # sent again if this node loses the leadership before they commit
        self.propose_raw(q, data, track=True)

    def _reappend(self, q: QuorumQueue, cmd: qc.Return, origin: str = "", seq: int = 0) -> None:
        """The leader turns a return (basic.reject/nack with requeue, a cancelled consumer's or closed
        channel's messages) into one `Requeue` per message carrying its body, as RabbitMQ 4.x's
        rabbit_fifo re-enqueues with #requeue{}: the message then lives at the new entry and the old one
        can be truncated, so a message requeued forever does not pin the log. A message the consumer no
        longer holds is left to the plain return (a no-op in the machine). A tracked return (`origin`,
        `seq`) is reported applied with the last of the entries it became (they apply in order)."""
        assert q.replica is not None
        consumer = q.replica.machine.state.consumers.get(cmd.consumer_key)
        rest = []
        entries = []
        for msg_id in cmd.msg_ids:
            payload = self.read_payload(q, msg_id) if consumer is not None and msg_id in consumer.checked_out \
                else None
            if payload is None:
                rest.append(msg_id)
            else:
                entries.append(qc.encode(qc.make_requeue(cmd.consumer_key, msg_id, payload), now_ms()))
        if rest:
            entries.append(qc.encode(qc.make_return(cmd.consumer_key, rest), now_ms()))
        if not entries and seq:
            self._report_applied(q.gid, origin, seq)  # nothing to do is done
        for i, data in enumerate(entries, 1):
            last = i == len(entries)
            self.propose_raw(q, data, origin=origin if last else "", seq=seq if last else 0)

    def propose_raw(self, q: QuorumQueue, data: bytes, forwarded: bool = False, origin: str = "", seq: int = 0,
                    track: bool = False) -> bool:
        """Propose `data` at the leader: here when this node leads, else sent to it (or to a member that
        relays it). `track`: this node's own command, which, when it leaves this node, is kept under a new
        seq until the leader reports it applied and resent until then (`q.sent`, queues/quorum/client.py,
        as rabbit_fifo_client's pending commands). `origin`/`seq`: a tracked command (another node's,
        relayed here, or this node's own resent): the leader that proposes it reports it applied to
        `origin` (`_applied_done`)."""
        if q.batch:
            self.flush_batch(q)
        leads = self.is_leader(q)
        if track and not leads:
            origin, seq = self.name, next(self._cmd_seqs)
            q.sent.track(seq, data, "", time.monotonic())
        if leads:
            assert q.replica is not None
            try:
                if seq:
                    fut = q.replica.group.propose_nowait(data)
                    fut.add_done_callback(functools.partial(self._applied_done, q.gid, origin, seq))
                else:
                    q.replica.group.propose_fire(data)
            except GroupClosed:  # the node is stopping (or the queue was deleted)
                return False
            except NotLeader:  # a leadership transfer is under way: sent once the new leader is known
                return self._buffer(q, data, origin, seq)
            return True
        target = self._target(q, forwarded)
        if target is None or target == self.name:
            if origin == self.name:
                return True  # tracked: sent when there is a route (a leader known, a member up, the tick)
            if q.replica is not None:
                return self._buffer(q, data, origin, seq)  # no leader yet (an election is running)
            log.warning("quorum queue '%s': no leader reachable; command dropped", q.name)
            return False
        if origin == self.name:
            q.sent.sent_to(seq, target)
        return self.cluster.send(target, cm.QuorumCommand(q.gid, data, origin, seq))

    @staticmethod
    def _buffer(q: QuorumQueue, data: bytes, origin: str, seq: int) -> bool:
        """Keep a command until a leader is known (`_flush_pending`), bounded."""
        if len(q.pending) < MAX_PENDING:
            q.pending.append((data, origin, seq))
            return True
        return False

    def _applied_done(self, gid: int, origin: str, seq: int, fut: asyncio.Future[Any]) -> None:
        """A tracked command proposed here was applied (or not: lost with the leadership, the group
        closed; then its origin resends it)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        self._report_applied(gid, origin, seq)

    def _report_applied(self, gid: int, origin: str, seq: int) -> None:
        if origin == self.name:
            q = self.queues.get(gid)
            if q is not None:
                q.sent.applied((seq,))
            return
        out = self._applied_out
        if not out:
            asyncio.get_running_loop().call_soon(self._flush_applied)
        out.setdefault((origin, gid), []).append(seq)

    def _flush_applied(self) -> None:
        """One QuorumApplied per origin and queue for the tracked commands applied this turn."""
        out, self._applied_out = self._applied_out, {}
        for (origin, gid), seqs in out.items():
            self.cluster.send(origin, cm.QuorumApplied(gid, seqs))

    def _resend_commands(self, q: QuorumQueue, commands: list[tuple[int, bytes]]) -> None:
        """Send again, in seq order, this node's tracked commands that the leader has not reported applied."""
        for seq, data in commands:
            self.propose_raw(q, data, origin=self.name, seq=seq)

    def publish(self, q: QuorumQueue, msg: Message, receipt: Receipt | None) -> None:
        """Enqueue `msg` with this node's next seq for the queue. The publishes of one loop turn go in
        one EnqueueBatch entry per BATCH_MAX (`_flush_batches`). Each is kept until confirmed and sent
        again if its route went down or it is not confirmed in RESEND_S: the machine applies a seq once,
        whatever the order it arrives in (gaps are remembered), so a resend is never enqueued twice.
        `receipt` is settled on the machine's Confirm effect for it, rejected on Reject (`_confirmed`)."""
        seq = q.next_seq = q.next_seq + 1
        pub = PendingPublish(seq, msg, receipt)
        q.unconfirmed[seq] = pub
        batch = q.batch
        if not batch:
            self._batching.append(q)
            if len(self._batching) == 1:
                asyncio.get_running_loop().call_soon(self._flush_batches)
        batch.append(pub)

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
            msgs = [pub.msg for pub in chunk]
            payloads = [pack_message(m) for m in msgs]
            ttls = prios = None
            for m in msgs:
                if m.properties_raw[0] & 0x01:  # expiration present (property flag bit 8)
                    ttls = tuple(_ttl_of(m) for m in msgs)
                    break
            for m in msgs:
                if m.properties_raw[0] & 0x08:  # priority present (property flag bit 11)
                    prios = tuple(_priority_of(m) for m in msgs)
                    break
            data = qc.encode(qc.EnqueueBatch(self.publisher_id, chunk[0].seq, tuple([m.size for m in msgs]), ttls,
                                             tuple([len(p) for p in payloads]), prios, b"".join(payloads)), now)
            entry = ProposedEntry(data, len(chunk))
            q.open_entries += 1
            for pub in chunk:
                pub.entry = entry
                pub.sent_at = sent_at
            if q.local and self.is_leader(q):  # for the first delivery here (cache_batch)
                inflight = q.inflight
                inflight[chunk[0].seq] = msgs
                if len(inflight) > MSG_CACHE_MAX // 64:  # batches never applied (lost with a leader change)
                    del inflight[next(iter(inflight))]
            self.propose_raw(q, data)  # buffered (a member) or resent later when there is no route now

    def _confirmed(self, q: QuorumQueue, seqs: Iterable[int], ok: bool) -> None:
        """The machine confirmed (`ok`) or rejected these publish seqs of this node: settle or reject
        their receipts (the channels answer at their connection's next flush)."""
        pop = q.unconfirmed.pop
        for seq in seqs:
            pub = pop(seq, None)
            if pub is None:
                continue
            entry = pub.entry
            if entry is not None:
                entry.left -= 1
                if not entry.left:
                    q.open_entries -= 1
            receipt = pub.receipt
            if receipt is not None:
                if ok:
                    receipt.settle(q)
                else:
                    receipt.reject(q)
        q.release_flow_if_done()

    def _resend(self, q: QuorumQueue, older_than_s: float) -> None:
        """Propose again, in seq order, the entries of the publishes not confirmed for `older_than_s`
        (an entry once, however many of its publishes are waiting)."""
        self.flush_batch(q)
        limit = time.monotonic() - older_than_s
        give_up = time.monotonic() - CONFIRM_TIMEOUT_S
        late = []
        sent: set[int] = set()
        for seq, pub in list(q.unconfirmed.items()):
            if pub.sent_at < give_up:
                late.append(seq)
            elif pub.sent_at < limit and pub.entry is not None:
                pub.sent_at = time.monotonic()
                if id(pub.entry) not in sent:
                    sent.add(id(pub.entry))
                    self.propose_raw(q, pub.entry.data)
        if late:
            log.warning("quorum queue '%s': %d publishes not confirmed in %.0f s: nacked", q.name, len(late),
                        CONFIRM_TIMEOUT_S)
            self._confirmed(q, late, False)

    def checkout(self, q: QuorumQueue, cid: int, consumer: Consumer) -> None:
        ch = consumer.channel
        channel_id = f"{self.name}/{id(ch)}"
        self.propose(q, qc.make_checkout(self.key(cid), consumer.prefetch, consumer.no_ack, consumer.priority,
                                         consumer.tag, self.name, channel_id))

    async def call(self, q: QuorumQueue, req: Any) -> Any:
        """A request the leader answers (basic.get, purge, counts); from any node."""
        self.flush_batch(q)
        if self.is_leader(q):
            return await self.cluster.handle_here(req)
        target = self._target(q)
        if target is None:
            raise ChannelError(NOT_FOUND, f"{rs('queue', q.name, q.vhost)} has no leader at the moment (no "
                                          "majority of its members is reachable)")
        try:
            return await self.cluster.call(target, req, timeout=CALL_TIMEOUT_S)
        except (PeerUnavailable, TimeoutError, RemoteError) as exc:
            raise ChannelError(NOT_FOUND, f"{rs('queue', q.name, q.vhost)} is unavailable: {exc}") from exc

    # -- requests at the leader ------------------------------------------------------------------------
    def _queue(self, gid: int) -> QuorumQueue:
        q = self.queues.get(int(gid))
        if q is None:
            raise LookupError("404 no such quorum queue")
        return q

    async def _forward_or(self, q: QuorumQueue, req: Any) -> Any | None:
        if self.is_leader(q):
            return None
        target = self._target(q)
        if target is None or target == self.name:
            raise LookupError(f"404 {rs('queue', q.name, q.vhost)} has no leader at the moment")
        return await self.cluster.call(target, req, timeout=CALL_TIMEOUT_S)

    async def _h_get(self, peer: str, req: cm.QuorumGet) -> cm.QuorumGetReply:
        q = self._queue(req.gid)
        forwarded = await self._forward_or(q, req)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        node = req.node
        cmd = qc.make_dequeue((node, 0), req.no_ack, node, f"{node}/get")
        reply = await q.replica.group.propose(qc.encode(cmd, now_ms()), timeout=CALL_TIMEOUT_S)
        message = None
        if reply.message is not None:
            msg_id, raft_index, redelivered, count = reply.message
            message = [msg_id, self.read_payload(q, raft_index), redelivered, count]
        return cm.QuorumGetReply(int(reply.ready), message)

    async def _h_cancel(self, peer: str, req: cm.QuorumCancel) -> Any:
        q = self._queue(req.gid)
        forwarded = await self._forward_or(q, req)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        await q.replica.group.propose(qc.encode(qc.make_cancel((req.node, req.consumer_id)), now_ms()),
                                      timeout=CALL_TIMEOUT_S)
        return True

    async def _h_purge(self, peer: str, req: cm.QuorumPurge) -> Any:
        q = self._queue(req.gid)
        forwarded = await self._forward_or(q, req)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        return int(await q.replica.group.propose(qc.encode(qc.make_purge(), now_ms()), timeout=CALL_TIMEOUT_S))

    async def _h_info(self, peer: str, req: cm.QuorumInfo) -> Any:
        q = self._queue(req.gid)
        forwarded = await self._forward_or(q, req)
        if forwarded is not None:
            return forwarded
        return list(q._state_counts())

    # -- messages between nodes ------------------------------------------------------------------------
    def _on_command(self, peer: str, m: cm.QuorumCommand) -> None:
        q = self.queues.get(m.gid)
        if q is not None:
            _t, cmd = qc.decode(m.command)
            origin, seq = (m.origin, m.seq) if m.seq > 0 and m.origin else ("", 0)
            if type(cmd) is qc.Return and self.is_leader(q):
                self._reappend(q, cmd, origin, seq)
            else:  # re-stamped: this clock
                self.propose_raw(q, qc.encode(cmd, now_ms()), forwarded=True, origin=origin, seq=seq)

    def _on_applied(self, peer: str, m: cm.QuorumApplied) -> None:
        q = self.queues.get(m.gid)
        if q is not None:
            q.sent.applied([int(s) for s in m.seqs], leader=peer if q.replica is None else None)

    def _on_deliver(self, peer: str, m: cm.QuorumDeliver) -> None:
        q = self.queues.get(m.gid)
        if q is not None:
            if q.replica is None:
                q.sent.leader_hint = peer  # only the leader delivers
            self._deliver_here(q, m.consumer_id, m.messages)
            return
        # a queue this process does not know (yet: it is booting after a crash, and the leader re-delivers
        # what a consumer of its previous process held): that consumer is gone, its messages go back
        key = self.key(m.consumer_id)
        self.cluster.send(peer, cm.QuorumCommand(m.gid, qc.encode(qc.make_cancel(key), now_ms()), "", 0))
        ids = [int(msg[0]) for msg in m.messages if type(msg) is list and msg]
        if ids:
            self.cluster.send(peer, cm.QuorumCommand(m.gid, qc.encode(qc.make_return(key, ids), now_ms()), "", 0))

    def _on_confirm(self, peer: str, m: cm.QuorumConfirm) -> None:
        q = self.queues.get(m.gid)
        if q is not None and m.incarnation == self.cluster.incarnation:
            if q.replica is None:
                q.sent.leader_hint = peer  # only the leader confirms
            self._confirmed(q, m.seqs, m.ok)

    def _on_leader_changed(self, peer: str, m: cm.QuorumLeaderChanged) -> None:
        q = self.queues.get(m.gid)  # a new leader, told to a node with consumers that is not a member
        if q is not None and q.replica is None:
            q.sent.leader_hint = peer
            self._cancel_on_failover(q)
            if q.sent.unapplied:  # the old leader (or the member relaying to it) may have lost them
                self._resend_commands(q, q.sent.resend_all(time.monotonic()))

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
        self._deliver_to(q, cid, consumer, [(int(msg_id), self.message(payload, count), bool(redelivered))
                                            for msg_id, payload, redelivered, count in msgs])

    def _deliver_local(self, q: QuorumQueue, cid: int, deliveries: tuple[qe.Delivery, ...]) -> None:
        """The leader's deliveries to a consumer on this node: a message published here and not
        delivered yet comes from `msg_cache` as it was published, the others are read from the log."""
        self._deliver_to(q, cid, q.local[cid], self._local_messages(q, deliveries))

    def _local_messages(self, q: QuorumQueue,
                        deliveries: tuple[qe.Delivery, ...]) -> Iterator[tuple[int, Message, bool]]:
        cache = q.msg_cache
        for msg_id, ref, redelivered, count in deliveries:
            msg = cache.pop(msg_id, None) if cache else None
            if msg is None or count:
                payload = self.read_payload(q, ref)
                if payload is None:
                    continue
                msg = self.message(payload, count)
            yield msg_id, msg, redelivered

    def _deliver_to(self, q: QuorumQueue, cid: int, consumer: Consumer,
                    msgs: Iterable[tuple[int, Message, bool]]) -> None:
        """basic.deliver of (msg id, message, redelivered) to this node's consumer `cid`; an auto-ack
        consumer gets its credit back for them (`_credit`)."""
        deliver = consumer.channel.deliver
        manual = not consumer.no_ack
        owner_of = q.owner_of
        settled = q.settled_here
        n = 0
        for msg_id, msg, redelivered in msgs:
            if manual and (owner_of.get(msg_id) == cid or (settled and settled.get(msg_id) == cid)):
                continue  # a new leader hands out what it sees checked out: this consumer has it, or settled it
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
        delivered = False
        for eff in effects:
            if isinstance(eff, qe.Deliver):
                delivered = True
                q.pace_delivered(eff.consumer_key, len(eff.messages))
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
                    self.cluster.send(node, cm.QuorumDeliver(q.gid, cid, msgs))
            elif isinstance(eff, qe.Confirm | qe.Reject):
                node, incarnation = eff.publisher_id
                ok = isinstance(eff, qe.Confirm)
                if node == self.name:
                    if incarnation == self.cluster.incarnation:
                        self._confirmed(q, eff.seqs, ok)
                else:
                    self.cluster.send(node, cm.QuorumConfirm(q.gid, incarnation, list(eff.seqs), ok))
            elif isinstance(eff, qe.DeadLetter):
                self._dead_letter(q, eff.reason, eff.raft_indexes)
            elif isinstance(eff, qe.DeleteQueue):
                vhost = self.node.vhosts.get(q.vhost)
                if vhost is not None and vhost.queues.get(q.name) is q:
                    log.info("quorum queue '%s' in vhost '%s' unused for its x-expires: deleted", q.name, q.vhost)
                    self.node.delete_queue(vhost, q)
            elif isinstance(eff, qe.DlxWorker):
                q.dlx_running = eff.running
                if eff.running:
                    self.propose(q, qc.make_dlx_checkout(self.node.config.dead_letter_worker_consumer_prefetch))
            elif isinstance(eff, qe.DlxDeliver):
                asyncio.ensure_future(self._dlx_republish(q, eff.messages))
        if delivered:
            q.release_flow_if_done()  # the backlog drained to FLOW_LOW (or its consumers stopped keeping pace)

    async def _dlx_republish(self, q: QuorumQueue, messages: tuple[tuple[int, int, str], ...]) -> None:
        """At-least-once dead-lettering (seed 000): republish to the dead-letter exchange with receipts
        (the targets' storage sync, the other nodes' answers, the quorum targets' commits), wait for all
        of them to be decided (up to CONFIRM_TIMEOUT_S) and settle only what every target confirmed; the
        rest stays in the queue's dead-letter area and is handed out again (retry on the next tick)."""
        q.dlx_busy = True
        try:
            done = asyncio.get_running_loop().create_future()
            batch = ConfirmBatch(on_done=lambda: None if done.done() else done.set_result(None))
            sent: list[tuple[int, int]] = []  # (msg id, its seq in the batch)
            for msg_id, raft_index, reason in messages:
                payload = self.read_payload(q, raft_index)
                if payload is None:
                    continue
                msg = decode_message(msgpack.unpackb(payload, raw=False))
                sent.append((msg_id, dead_letter_confirmed(self.node, q, msg, reason, batch)))
            batch.close()
            try:
                await asyncio.wait_for(done, CONFIRM_TIMEOUT_S)
            except TimeoutError:
                return  # settle nothing of this batch: it is handed out again
            ok_ids = [msg_id for msg_id, seq in sent if seq in batch.acked]
            if ok_ids and self.is_leader(q):
                self.propose(q, qc.make_dlx_settle(ok_ids))
        finally:
            q.dlx_busy = False

    def _dead_letter(self, q: QuorumQueue, reason: str, raft_indexes: tuple[int, ...]) -> None:
        msgs = []
        for idx in raft_indexes:
            payload = self.read_payload(q, idx)
            if payload is not None:
                msgs.append(decode_message(msgpack.unpackb(payload, raw=False)))
        if msgs:
            dead_letter(self.node, q, msgs, reason)

    def _cancel_on_failover(self, q: QuorumQueue) -> None:
        """The leader changed: this node's consumers with x-cancel-on-ha-failover get basic.cancel."""
        for cid, c in list(q.local.items()):
            if c.arguments.get("x-cancel-on-ha-failover") is True:
                del q.local[cid]
                self.propose(q, qc.make_cancel(self.key(cid)))  # buffered for the next leader if none
                c.channel.consumer_cancelled_by_broker(c)

    def _leader_changed(self, q: QuorumQueue, lead: int) -> None:
        for fut in self._leader_waiters.pop(q.gid, ()):
            if not fut.done():
                fut.set_result(None)
        q.msg_cache.clear()
        q.inflight.clear()
        q.pace = QueuePace()  # judged afresh by the new leader
        self._entry = (0, 0, [])
        if not lead:  # the leader failed or handed over: this member's x-cancel-on-ha-failover consumers go
            self._cancel_on_failover(q)
        if (q.led_settles or q.led_settles_old) and not self.is_leader(q):
            self._settles_after_leading(q)
        if lead:
            self._flush_pending(q)
            if q.sent.unapplied:  # what the old leader had not applied, to the new one (or proposed here)
                self._resend_commands(q, q.sent.resend_all(time.monotonic()))
        if q.replica is None or not q.replica.group.is_leader:
            return
        log.info("quorum queue '%s' in vhost '%s': leader is now %s", q.name, q.vhost, self.name)
        consumer_nodes = {c.node for c in q.replica.machine.state.consumers.by_key.values()}
        for node in sorted(consumer_nodes - set(q.members) - {self.name, ""}):
            self.cluster.send(node, cm.QuorumLeaderChanged(q.gid))  # non-members see no leader change
        q._last_config = None
        q.apply_settings(q.settings)
        effects = q.replica.machine.leader_effects()
        if effects:
            self.run_effects(q, effects)
        for m in q.members:
            if m != self.name and not self.transport.connected(m):
                self.propose(q, qc.make_down(m, "noconnection"))
        for node in sorted(consumer_nodes - set(q.members) - {self.name, ""}):
            # a consumer's node that is not a member and went while no leader watched (it died with the
            # last leader, or every node crashed): its consumers would hold their messages forever
            if not self.transport.connected(node):
                self.propose(q, qc.make_down(node, "noconnection"))

    @staticmethod
    def _turn_led_settles(q: QuorumQueue, group: Any) -> None:
        """At the leader's tick: the older generation of its own settles is forgotten once every entry
        proposed before the newer one began is applied; the newer one becomes the older."""
        if group.applied < q.led_mark:
            return  # not all applied yet: both kept (each bounded)
        q.led_settles_old, q.led_settles = q.led_settles, q.led_settles_old
        q.led_settles.clear()
        q.led_mark = group.raw.raft.log.last_index()

    def _settles_after_leading(self, q: QuorumQueue) -> None:
        """This node lost the leadership: its consumers' last settles, proposed while it led, may not have
        committed. They go to the new leader as tracked commands (a settle applied twice is a no-op), and
        their messages are not delivered to those consumers again (`settled_here`)."""
        settles = [*q.led_settles_old, *q.led_settles]
        q.led_settles.clear()
        q.led_settles_old.clear()
        for data in settles:
            _t, cmd = qc.decode(data)
            assert isinstance(cmd, _SETTLES)
            node, cid = cmd.consumer_key
            if node == self.name:
                q.remember_settled(cid, cmd.msg_ids)
            self.propose_raw(q, data, track=True)

    def _peer_changed(self, peer: str, up: bool) -> None:
        for q in list(self.queues.values()):
            if not up:
                if self.is_leader(q):
                    self.propose(q, qc.make_down(peer, "noconnection"))
                if q.unconfirmed:
                    self._resend(q, 0.0)  # their route may have gone with that node
                q.sent.route_lost(peer)
                if q.sent.unapplied:  # the leader or the member relaying them may have gone with it
                    self._resend_commands(q, q.sent.resend_all(time.monotonic()))
            else:
                self._flush_pending(q)
                if q.sent.waiting_for_route():
                    self._resend_commands(q, q.sent.resend_all(time.monotonic()))
                if q.local and peer in q.members:
                    for cid, c in list(q.local.items()):  # check out again: a lost leader may have dropped them
                        self.checkout(q, cid, c)
                if self.is_leader(q) and q.replica is not None:
                    # a node that comes (back) after this leader was elected, which saw it go by no `down`
                    # (every node crashed): what its consumers hold is delivered again, and a consumer gone
                    # with its previous process gives it back there (`_deliver_here`)
                    again: list[qe.Effect] = [e for e in q.replica.machine.leader_effects()
                             if isinstance(e, qe.Deliver) and e.consumer_key[0] == peer]
                    if again:
                        self.run_effects(q, again)

    def _flush_pending(self, q: QuorumQueue) -> None:
        if q.pending and self._target(q) is not None:
            pending, q.pending = q.pending, []
            for data, origin, seq in pending:
                self.propose_raw(q, data, origin=origin, seq=seq)

    def _on_tick(self) -> None:
        self._tick = asyncio.get_running_loop().call_later(TICK_S, self._on_tick)
        for q in self.queues.values():
            if q.pending:
                self._flush_pending(q)
            if q.unconfirmed:
                self._resend(q, RESEND_S)
            if q.sent.unapplied:
                self._resend_commands(q, q.sent.due(time.monotonic(), RESEND_S))
        now = now_ms()
        for q in self.queues.values():
            if self.is_leader(q) and q.dlx_running and not q.dlx_busy and q.replica is not None \
                    and q.replica.machine.state.dlx_count():
                self.propose(q, qc.make_dlx_checkout(self.node.config.dead_letter_worker_consumer_prefetch))
            replica = q.replica
            if self.is_leader(q) and replica is not None:
                if q.led_settles or q.led_settles_old:
                    self._turn_led_settles(q, replica.group)
                q.pace.retain(replica.machine.state.consumers.by_key)  # the pace of consumers gone goes
                cfg = replica.machine.state.config
                if cfg.message_ttl_ms is not None or cfg.expires_ms is not None \
                        or replica.machine.state.message_count():
                    self.propose(q, qc.make_tick(now))

    def booted(self) -> None:
        pass

    def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
