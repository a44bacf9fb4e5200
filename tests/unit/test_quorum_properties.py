"""Properties of the quorum queue state machine (Hypothesis), over random configs and command mixes:

- conservation: every enqueued message ends exactly once — delivered and settled, dropped (with a
  reason), dead-lettered (with a reason), purged — or is still in the queue (ready, unacked, or an
  at-least-once dead letter), and the state's live message ids are exactly the messages not ended;
  the live-index map counts them per raft entry and the release cursor is the oldest one's entry;
- enqueue batches: each seq is deduplicated, gap-tracked and refused by reject-publish as its own
  enqueue would be (predicted exactly while no consumer can take a message during the batch), all the
  seqs of a batch confirmed in one Confirm and refused in one Reject, the reply is the number enqueued;
- a publish is never both confirmed and rejected;
- FIFO of first deliveries within a priority level: over all consumers and basic.gets, messages of
  one level (a priority above 4 is high, RabbitMQ 4.0) delivered for the first time come in enqueue
  order (message id order);
- priority levels: the high FIFO holds exactly the ready high messages (returns aside), the normal
  FIFO the normal ones, and `hi_out` exactly the high ones checked out or in the returns;
- single active consumer: at most one consumer is active, and only it gets deliveries;
- replicas agree: the same commands give the same replies, effects and snapshot bytes on a replica fed
  command objects, on one fed encoded log entries through `QuorumMachine`, and on one that applies
  every enqueue batch message by message (`machine.PLAIN_BATCHES` off: the one-step path for plain
  batches must change nothing);
- snapshot + restore, then replay, equals full replay (replies, effects and snapshots);
- FIFO: one consumer, no returns: deliveries come in enqueue order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hutch.queues.quorum import (
    DUPLICATE,
    OK,
    REJECTED,
    Confirm,
    DeadLetter,
    Deliver,
    DequeueReply,
    DlxDeliver,
    Dropped,
    Meta,
    QueueState,
    QuorumConfig,
    QuorumMachine,
    Reject,
    apply,
    encode,
    machine,
    make_cancel,
    make_checkout,
    make_credit,
    make_dequeue,
    make_discard,
    make_dlx_checkout,
    make_dlx_settle,
    make_down,
    make_enqueue,
    make_enqueue_batch,
    make_purge,
    make_requeue,
    make_return,
    make_settle,
    make_tick,
    make_touch,
    make_update_config,
)
from hutch.queues.quorum.consumers import Status
from hutch.queues.quorum.messages import SHIFT

CONSUMERS = [("ch1", "a"), ("ch1", "b"), ("ch2", "c")]
GETTERS = [("ch1", ""), ("ch2", "")]
PUBLISHERS = [None, "p1", "p2"]

configs = st.builds(
    QuorumConfig,
    message_ttl_ms=st.one_of(st.none(), st.integers(0, 50)),
    max_length=st.one_of(st.none(), st.integers(0, 6)),
    max_length_bytes=st.one_of(st.none(), st.integers(0, 40)),
    overflow=st.sampled_from(["drop-head", "reject-publish"]),
    dead_letter_exchange=st.one_of(st.none(), st.just("dlx")),
    dead_letter_strategy=st.sampled_from(["at-most-once", "at-least-once"]),
    delivery_limit=st.one_of(st.none(), st.integers(0, 3)),
    single_active_consumer=st.booleans(),
)


class QuorumProperties(RuleBasedStateMachine):
    @initialize(config=configs, release_step=st.integers(1, 8))
    def setup(self, config: QuorumConfig, release_step: int) -> None:
        self.a = QueueState(config, release_step)  # fed command objects
        self.b_effects: list[Any] = []
        self.b = QuorumMachine(config, effects_sink=self.b_effects.extend, release_step=release_step)
        self.c: QueueState | None = None  # restored from a snapshot of `a`, then fed the same commands
        self.d = QueueState(config, release_step)  # batches applied message by message
        self.index = 0
        self.now = 1_000
        self.seqs = {p: 0 for p in PUBLISHERS}
        self.gaps: dict[Any, set[int]] = {p: set() for p in PUBLISHERS}  # seqs skipped, not yet sent
        self.auto_ack: dict[Any, bool] = {}
        self.last_first = {False: -1, True: -1}  # per level (high?): the msg id of the last first delivery
        self.high: set[int] = set()  # logical messages published with a priority above 4
        # the fate model: logical message = the msg id of its first enqueue
        self.logical: dict[int, int] = {}  # current msg id -> logical message, for messages not ended
        self.ended: dict[int, str] = {}  # logical message -> how it ended
        self.held: dict[int, Any] = {}  # msg id -> consumer key holding it unsettled
        self.dlx_held: set[int] = set()
        self.confirmed: set[tuple[Any, int]] = set()
        self.rejected: set[tuple[Any, int]] = set()

    # -- driving the replicas -------------------------------------------------------------------
    def run(self, cmd: Any) -> tuple[Any, list[Any]]:
        self.index += 1
        meta = Meta(self.index, 1, self.now)
        _s, reply, effects = apply(meta, cmd, self.a)
        self.b_effects.clear()
        reply_b = self.b.apply(self.index, encode(cmd, self.now))
        assert reply_b == reply
        assert self.b_effects == effects
        if self.c is not None:
            _s, reply_c, effects_c = apply(meta, cmd, self.c)
            assert reply_c == reply and effects_c == effects
        machine.PLAIN_BATCHES = False
        try:
            _s, reply_d, effects_d = apply(meta, cmd, self.d)
        finally:
            machine.PLAIN_BATCHES = True
        assert reply_d == reply and effects_d == effects
        self.check_fifo(reply, effects)
        self.absorb(effects)
        return reply, effects

    def check_fifo(self, reply: Any, effects: list[Any]) -> None:
        """FIFO of first deliveries (delivery count 0): a basic.get's message, then each consumer's
        Deliver in order, all after the first deliveries of earlier commands (the effects group one
        command's deliveries by consumer, so their interleaving between consumers is not visible)."""
        got = [reply.message] if isinstance(reply, DequeueReply) and reply.message is not None else []
        batches = [e.messages for e in effects if isinstance(e, Deliver)]
        for msg_id, body_ref, redelivered, count in [*got, *(d for b in batches for d in b)]:
            assert msg_id == body_ref and redelivered == (count > 0)
        for level in (False, True):
            last = self.last_first[level]
            if got and not got[0][3] and (got[0][0] in self.high) == level:  # before this command's deliveries
                assert got[0][0] > last, "first deliveries out of enqueue order"
                last = got[0][0]
            firsts = [[d[0] for d in b if not d[3] and (d[0] in self.high) == level] for b in batches]
            for mine in firsts:
                assert mine == sorted(mine) and all(i > last for i in mine), "first deliveries out of enqueue order"
            self.last_first[level] = max([last, *(i for mine in firsts for i in mine)])

    def end(self, msg_id: int, how: str) -> None:
        logical = self.logical.pop(msg_id)
        assert logical not in self.ended, f"message {logical} ended twice: {self.ended[logical]}, {how}"
        self.ended[logical] = how
        self.held.pop(msg_id, None)
        self.dlx_held.discard(msg_id)

    def absorb(self, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Deliver):
                if self.a.config.single_active_consumer:
                    c = self.a.consumers.get(e.consumer_key)
                    assert c is not None and c.status == Status.ACTIVE
                for msg_id, _ref, _redelivered, _count in e.messages:
                    assert msg_id in self.logical and msg_id not in self.held
                    if self.auto_ack[e.consumer_key]:
                        self.end(msg_id, "settled")
                    else:
                        self.held[msg_id] = e.consumer_key
            elif isinstance(e, DeadLetter | Dropped):
                assert e.reason in ("rejected", "expired", "maxlen", "delivery_limit",
                                    "dead_letter_strategy_changed")
                for msg_id in e.raft_indexes:
                    self.end(msg_id, f"{type(e).__name__}:{e.reason}")
            elif isinstance(e, DlxDeliver):
                for msg_id, _idx, _reason in e.messages:
                    assert msg_id in self.logical and msg_id not in self.dlx_held
                    self.dlx_held.add(msg_id)
            elif isinstance(e, Confirm | Reject):
                target, other = (self.confirmed, self.rejected) if isinstance(e, Confirm) else \
                    (self.rejected, self.confirmed)
                for seq in e.seqs:
                    assert (e.publisher_id, seq) not in other, "both acked and nacked"
                    target.add((e.publisher_id, seq))

    def held_by(self, key: Any) -> list[int]:
        return sorted(i for i, k in self.held.items() if k == key)

    # -- rules ----------------------------------------------------------------------------------
    @rule(publisher=st.sampled_from(PUBLISHERS), size=st.integers(0, 12),
          ttl=st.one_of(st.none(), st.integers(0, 60)), resend=st.booleans(), n=st.integers(1, 3),
          priority=st.sampled_from([0, 0, 4, 5, 9]))
    def enqueue(self, publisher: Any, size: int, ttl: int | None, resend: bool, n: int, priority: int) -> None:
        for i in range(n):
            self.enqueue_one(publisher, size, ttl, resend and i == 0, priority)

    def enqueue_one(self, publisher: Any, size: int, ttl: int | None, resend: bool, priority: int = 0) -> None:
        if publisher is not None and resend and self.seqs[publisher]:
            seq = self.seqs[publisher]
        elif publisher is not None:
            seq = self.seqs[publisher] = self.seqs[publisher] + 1
        else:
            seq = 0
        seen = (publisher, seq) in self.confirmed | self.rejected
        new = (self.index + 1) << SHIFT
        self.logical[new] = new  # known before the apply: its own command may deliver or drop it
        if priority > 4:
            self.high.add(new)
        reply, effects = self.run(make_enqueue(publisher, seq, size, ttl, b"", priority))
        if reply != OK:
            assert self.logical.pop(new) == new
        if publisher is not None:
            kind = Reject if reply == REJECTED else Confirm
            assert kind(publisher, (seq,)) in effects
            if seen:
                assert reply in (DUPLICATE, REJECTED)
        else:
            assert reply in (OK, REJECTED)
            assert not [e for e in effects if isinstance(e, Confirm | Reject)]

    @rule(publisher=st.sampled_from(PUBLISHERS), sizes=st.lists(st.integers(0, 12), min_size=1, max_size=20),
          ttls=st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(0, 60)), min_size=1,
                                              max_size=4)),
          start=st.sampled_from(["next", "next", "resend", "skip", "fill"]), back=st.integers(1, 20),
          prios=st.one_of(st.none(), st.lists(st.sampled_from([0, 3, 6, 9]), min_size=1, max_size=3)))
    def enqueue_batch(self, publisher: Any, sizes: list[int], ttls: list[int | None] | None, start: str,
                      back: int, prios: list[int] | None) -> None:
        """One EnqueueBatch: the next seqs, or a resend reaching `back` seqs into those already applied,
        or starting past a few seqs never sent (a gap), or a resend filling a gap."""
        n = len(sizes)
        ttls = None if ttls is None else [ttls[p % len(ttls)] for p in range(n)]  # a pattern, repeated
        prios = None if prios is None else [prios[p % len(prios)] for p in range(n)]
        ids = [((self.index + 1) << SHIFT) | p for p in range(n)]
        kinds = ["new"] * n
        first, last = 0, self.seqs[publisher]
        if publisher is not None:
            gaps = self.gaps[publisher]
            first = last + 1
            if start == "resend":
                first = max(1, last - back + 1)
            elif start == "skip":
                first = last + 1 + back % 4
            elif start == "fill" and gaps:
                first = sorted(gaps)[back % len(gaps)]
            pub = self.a.publishers.get(publisher)
            for p in range(n):
                seq = first + p
                if seq in gaps:
                    if pub is None or not any(lo <= seq <= hi for lo, hi in pub.missing):
                        return  # the machine gave the gap up (a bounded record): not what this checks
                elif seq <= last:
                    if (publisher, seq) in self.confirmed:
                        kinds[p] = "duplicate"
                    else:
                        assert (publisher, seq) in self.rejected
                        if pub is None or not pub.was_rejected(seq):
                            return  # the machine forgot this refusal (a bounded record)
                        kinds[p] = "refused"
            gaps.update(range(last + 1, first))
            gaps.difference_update(range(first, first + n))
            self.seqs[publisher] = max(last, first + n - 1)
        # reject-publish, predicted while no consumer can take a message during the batch (then the
        # batch and one enqueue per message agree): each new message against the ready + dlx counts
        cfg, a = self.a.config, self.a
        predict = not a.consumers.prios
        count, nbytes = a.ready_count() + a.dlx.count, a.ready_bytes + a.dlx.bytes
        expected = []
        for p, size in enumerate(sizes):
            if kinds[p] == "new":
                if cfg.overflow == "reject-publish" and (
                        (cfg.max_length is not None and count >= cfg.max_length)
                        or (cfg.max_length_bytes is not None and nbytes + size > cfg.max_length_bytes)):
                    continue
                count += 1
                nbytes += size
                expected.append(ids[p])
        for p, i in enumerate(ids):
            self.logical[i] = i  # known before the apply: its own command may deliver or drop them
            if prios is not None and prios[p] > 4:
                self.high.add(i)
        reply, effects = self.run(make_enqueue_batch(publisher, first, sizes, ttls, sizes, bytes(sum(sizes)),
                                                     prios))
        live = set(self.a.live_indexes())
        enqueued = [i for i in ids if i in live or i in self.ended]
        for i in ids:
            if i not in enqueued:
                assert self.logical.pop(i) == i
        assert reply == len(enqueued)
        assert not [i for i, kind in zip(ids, kinds, strict=True) if kind != "new" and i in enqueued]
        if predict:
            assert enqueued == expected
        confirms = [e for e in effects if isinstance(e, Confirm)]
        rejects = [e for e in effects if isinstance(e, Reject)]
        if publisher is None:
            assert not confirms and not rejects
            return
        confirmed = [first + p for p in range(n) if kinds[p] == "duplicate" or ids[p] in enqueued]
        refused = [first + p for p in range(n) if first + p not in confirmed]
        assert confirms == ([Confirm(publisher, tuple(confirmed))] if confirmed else [])
        assert rejects == ([Reject(publisher, tuple(refused))] if refused else [])
        assert not [p for p in range(n) if kinds[p] == "refused" and first + p in confirmed]

    @rule(key=st.sampled_from(CONSUMERS), prefetch=st.integers(0, 3), auto_ack=st.booleans(),
          priority=st.integers(0, 2))
    def checkout(self, key: Any, prefetch: int, auto_ack: bool, priority: int) -> None:
        c = self.a.consumers.get(key)
        if c is not None and c.checked_out and auto_ack:
            return  # switching a consumer with unacked messages to auto-ack: not something a channel does
        self.auto_ack[key] = auto_ack
        self.run(make_checkout(key, prefetch, auto_ack, priority, key[1], "n", key[0]))

    @rule(key=st.sampled_from(CONSUMERS), credit=st.one_of(st.none(), st.integers(0, 3)))
    def cancel_or_credit(self, key: Any, credit: int | None) -> None:
        self.run(make_cancel(key) if credit is None else make_credit(key, credit))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["settle", "settle", "return", "discard", "requeue"]))
    def settlement(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from(sorted(set(self.held.values()))))
        mine = self.held_by(key)
        if how == "requeue":
            old = data.draw(st.sampled_from(mine))
            del self.held[old]
            logical = self.logical.pop(old)
            self.logical[(self.index + 1) << SHIFT] = logical  # the message lives on at the requeue's entry
            self.run(make_requeue(key, old, b"body"))
            return
        ids = data.draw(st.lists(st.sampled_from(mine + [10**6]), min_size=1, max_size=4, unique=True))
        known = [i for i in ids if i in mine]
        if how == "settle":
            self.run(make_settle(key, ids))
            for i in known:
                self.end(i, "settled")
        else:
            for i in known:
                del self.held[i]
            self.run((make_return if how == "return" else make_discard)(key, ids))

    @rule(owner=st.sampled_from(["ch1", "ch2", "n"]), reason=st.sampled_from(["down", "noconnection"]))
    def down(self, owner: str, reason: str) -> None:
        for i in [i for i, k in self.held.items() if k[0] == owner or owner == "n"]:
            del self.held[i]
        self.run(make_down(owner, reason))

    @rule(key=st.sampled_from(GETTERS), settled=st.booleans())
    def dequeue(self, key: Any, settled: bool) -> None:
        reply, _effects = self.run(make_dequeue(key, settled, "n", key[0]))
        assert isinstance(reply, DequeueReply)
        if reply.message is not None:
            msg_id = reply.message[0]
            if settled:
                self.end(msg_id, "settled")
            else:
                self.held[msg_id] = key

    @rule(op=st.sampled_from(["tick", "tick", "touch", "purge", "snapshot"]), ms=st.integers(0, 40))
    def queue_op(self, op: str, ms: int) -> None:
        self.now += ms
        if op == "purge":
            ready = self.a.ready_indexes()
            reply, _effects = self.run(make_purge())
            assert reply == len(ready)
            for i in ready:
                self.end(i, "purged")
        elif op == "snapshot":  # a replica restored from a snapshot joins and follows from here
            self.c = QueueState.restore(self.a.snapshot())
        else:
            self.run(make_tick(self.now) if op == "tick" else make_touch())

    @rule(config=configs)
    def update_config(self, config: QuorumConfig) -> None:
        self.run(make_update_config(config))
        if not self.a.config.at_least_once:
            assert not self.dlx_held

    @precondition(lambda self: self.a.config.at_least_once or self.a.dlx.count)
    @rule(data=st.data(), prefetch=st.one_of(st.none(), st.integers(1, 3)))
    def dlx_worker(self, data: st.DataObject, prefetch: int | None) -> None:
        if prefetch is not None or not self.dlx_held:
            self.dlx_held.clear()  # a new worker gets them again
            self.run(make_dlx_checkout(prefetch or 2))
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.dlx_held) + [10**6]), min_size=1, max_size=3,
                                 unique=True))
        known = [i for i in ids if i in self.dlx_held]
        self.run(make_dlx_settle(ids))
        for i in known:
            self.end(i, "dead-lettered at least once")

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def conservation(self) -> None:
        if not hasattr(self, "a"):
            return
        live = self.a.live_indexes()
        assert sorted(self.logical) == live
        assert len(set(self.logical.values())) == len(self.logical)
        assert not set(self.logical.values()) & set(self.ended)
        assert self.a.live.count == len(live)
        per_entry = Counter(i >> SHIFT for i in live)
        entries = range(self.index + 2)
        assert [self.a.live.holds(i) for i in entries] == [per_entry[i] for i in entries]
        assert self.a.release_cursor() == (live[0] >> SHIFT if live else self.index)

    @invariant()
    def holders_match(self) -> None:
        if not hasattr(self, "a"):
            return
        for key in CONSUMERS + GETTERS:
            assert sorted(self.a.checked_out(key)) == self.held_by(key)
        assert set(self.a.dlx.checked) == self.dlx_held
        cs = self.a.consumers
        assert cs.unacked == sum(len(c.checked_out) for c in cs.by_key.values())
        assert self.a.ready_bytes == sum(r[1] for r in self.a.returns) + sum(r[1] for r in
                                                                               self.a.messages.records()) \
            + sum(r[1] for r in self.a.hi.records())
        for c in cs.by_key.values():
            if not c.auto_ack and c.status <= 1:
                assert c.credit == c.limit - len(c.checked_out)
            assert c.in_service == (c.status == 0 and c.credit > 0)
        if self.a.config.single_active_consumer:
            active = [k for k, c in cs.by_key.items() if c.status == Status.ACTIVE]
            assert active == ([cs.active_key] if cs.active_key is not None else [])

    @invariant()
    def priority_levels(self) -> None:
        if not hasattr(self, "a"):
            return
        a = self.a
        assert all(self.logical[i] in self.high for i in a.hi.indexes())
        assert not any(self.logical[i] in self.high for i in a.messages.indexes())
        returned = [r[0] for r in a.returns]
        assert a.hi_out == {i for i in [*self.held, *returned] if self.logical[i] in self.high}

    @invariant()
    def no_idle_credit_while_messages_wait(self) -> None:
        if not hasattr(self, "a"):
            return
        if self.a.ready_count():
            assert not self.a.consumers.prios

    @invariant()
    def replicas_agree(self) -> None:
        if not hasattr(self, "a"):
            return
        snap = self.a.snapshot()
        assert self.b.snapshot() == snap
        assert self.d.snapshot() == snap
        if self.c is not None:
            assert self.c.snapshot() == snap
        restored = QueueState.restore(snap)
        assert restored.snapshot() == snap
        # the live-index map is not in the snapshot: each replica's own (restored: rebuilt) must agree
        counts = [self.a.live.holds(i) for i in range(self.index + 2)]
        for other in (self.b.state, restored, self.d) if self.c is None else (self.b.state, restored, self.d, self.c):
            assert other.live.count == self.a.live.count and other.release_cursor() == self.a.release_cursor()
            assert [other.live.holds(i) for i in range(self.index + 2)] == counts


QuorumProperties.TestCase.settings = settings(max_examples=70, stateful_step_count=50, deadline=None)
TestQuorumProperties = QuorumProperties.TestCase


@pytest.mark.slow  # the long run (`make test-slow`); `make test` runs 70 examples of the same machine
class TestQuorumPropertiesLong(QuorumProperties.TestCase):
    settings = settings(max_examples=400, stateful_step_count=50, deadline=None)


@settings(max_examples=100, deadline=None)
@given(prefetch=st.integers(1, 5),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 4)), max_size=80))
def test_single_consumer_without_returns_gets_fifo_order(prefetch: int,
                                                         steps: list[tuple[bool, int, int]]) -> None:
    """Publishes are one enqueue (batch 0) or a batch of that many messages."""
    state = QueueState()
    index = 0
    enqueued: list[int] = []
    delivered: list[int] = []
    held: list[int] = []

    def run(cmd: Any) -> None:
        nonlocal index
        index += 1
        for e in apply(Meta(index, 1, 0), cmd, state).effects:
            if isinstance(e, Deliver):
                delivered.extend(m[0] for m in e.messages)
                held.extend(m[0] for m in e.messages)

    run(make_checkout("c", prefetch))
    for publish, pick, batch in steps:
        if (publish or not held) and not batch:
            run(make_enqueue(None, 0, 1))
            enqueued.append(index << SHIFT)
        elif publish or not held:
            run(make_enqueue_batch(None, 0, [1] * batch, None, [0] * batch, b""))
            enqueued.extend((index << SHIFT) | p for p in range(batch))
        else:
            run(make_settle("c", [held.pop(pick % len(held))]))
    assert delivered == enqueued[: len(delivered)]
    assert len(enqueued) == len(delivered) + state.ready_count()
