"""The confirm ledger (core/confirms.py), pure: publish order, folding into `multiple`, rejections,
deleted queues, and a Hypothesis state machine over random publishes and settlements. Also the receipts
the classic queue hands to its sync sink."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hutch.amqp.spec import BasicProperties
from hutch.core.confirms import ConfirmBatch, ConfirmLedger, Receipt, ReceiptRun
from hutch.core.message import Message
from hutch.core.queue_settings import QueueSettings
from hutch.core.queue_type import PENDING, REJECTED, SETTLED
from hutch.queues.classic.queue import ClassicQueue
from hutch.storage.appendfile import ManualSink
from hutch.storage.memfs import MemoryFS
from hutch.storage.queue_index import QueueIndex


def test_settled_publishes_fold_into_one_multiple_ack() -> None:
    led = ConfirmLedger()
    for seq in range(1, 6):
        led.insert(seq, ())
    assert led.take_answers() == [(True, 5, True)]
    led.insert(6, ())
    assert led.take_answers() == [(True, 6, False)]
    assert led.take_answers() == []
    assert led.unanswered == 0 and led.waiting == 0


def test_the_owner_is_told_once_per_batch_of_answers() -> None:
    """`insert` returns True, or `on_answers` runs, only when answers become ready where there were none:
    one flush per batch, not one wake-up per message."""
    led = ConfirmLedger()
    told: list[int] = []
    led.on_answers = lambda: told.append(led.decided_upto)
    assert led.insert(1, ()) is True
    assert led.insert(2, ()) is False  # folded into the run already reported
    assert led.insert(3, ["disk"]) is False
    assert led.insert(4, ["disk"]) is False
    led.settle(3, "disk")
    assert told == []  # answers were ready already: the owner flushes them all
    assert led.take_answers() == [(True, 3, True)]
    led.settle(4, "disk")
    assert told == [4]
    assert led.take_answers() == [(True, 4, False)]


def test_answers_follow_publish_order() -> None:
    """The prefix rule of the old confirm deque, on the ledger: a settled publish waits for the ones
    before it (1 waits for the disk; 2 was settled at once but is behind 1)."""
    led = ConfirmLedger()
    led.insert(1, ["disk"])
    led.insert(2, ())
    led.insert(3, ["disk"])
    led.insert(4, ())
    led.insert(5, ["disk"])
    assert led.take_answers() == []  # the first waits for its sync
    assert led.settle(1, "disk")
    assert led.take_answers() == [(True, 2, True)]  # 1 synced; 2 is transient but behind 1
    assert led.settle(3, "disk")
    assert led.take_answers() == [(True, 4, True)]
    assert led.waiting == 1 and led.decided_upto == 4
    led.settle(5, "disk")
    assert led.take_answers() == [(True, 5, False)]
    assert led.waiting == 0


def test_a_publish_waits_for_every_queue() -> None:
    led = ConfirmLedger()
    led.insert(1, ["a", "b"])
    assert not led.settle(1, "a")
    assert led.take_answers() == []
    assert led.confirm([1], "b") == [1]
    assert led.take_answers() == [(True, 1, False)]


def test_a_rejection_is_a_nack_in_its_place_and_later_answers_are_ignored() -> None:
    led = ConfirmLedger()
    led.insert(1, ())
    led.insert(2, ["a", "b"])
    led.insert(3, ())
    led.insert(4, (), rejected=True)
    led.insert(5, ())
    assert led.reject(2, "a")
    assert not led.settle(2, "b")  # decided already: a nack stays a nack
    assert not led.reject(2, "b")
    assert led.take_answers() == [(True, 1, False), (False, 2, False), (True, 3, False), (False, 4, False),
                                  (True, 5, False)]


def test_consecutive_nacks_fold_too() -> None:
    led = ConfirmLedger()
    for seq in (1, 2, 3):
        led.insert(seq, ["disk"])
    led.insert(4, ())
    for seq in (1, 2, 3):
        led.reject(seq, "disk")
    assert led.take_answers() == [(False, 3, True), (True, 4, False)]


def test_a_deleted_queue_confirms_what_waited_only_for_it() -> None:
    led = ConfirmLedger()
    led.insert(1, ["gone"])
    led.insert(2, ["gone", "other"])
    led.insert(3, ["other"])
    assert led.remove_queue("gone") == [1]
    assert led.take_answers() == [(True, 1, False)]
    assert led.confirm([2, 3], "other") == [2, 3]
    assert led.take_answers() == [(True, 3, True)]


def test_sequence_numbers_must_increase() -> None:
    led = ConfirmLedger()
    led.insert(3, ())
    try:
        led.insert(3, ())
    except ValueError as exc:
        assert "must increase" in str(exc)
    else:
        raise AssertionError("a repeated sequence number was accepted")


def test_unknown_sequence_numbers_are_ignored() -> None:
    led = ConfirmLedger()
    assert not led.settle(7, "a") and not led.reject(7, "a") and led.confirm([7], "a") == []
    assert led.remove_queue("a") == []


def test_a_batch_reports_when_every_publish_is_decided() -> None:
    done: list[bool] = []
    batch = ConfirmBatch(on_done=lambda: done.append(True))
    r1, r2, r3 = batch.receipt(), batch.receipt(), batch.receipt()
    batch.published(r1.seq, ["q"], False)
    batch.published(r2.seq, None, True)  # refused, or routed nowhere
    batch.published(r3.seq, ["q", "p"], False)
    batch.close()
    assert not done
    r1.settle("q")
    r3.settle("q")
    assert not done and not batch.done
    r3.reject("p", "message storage failed: EIO")
    assert done == [True] and batch.acked == {1} and batch.errors == ["message storage failed: EIO"]


def test_a_receipt_run_settles_and_rejects_each_publish_of_the_run_in_order() -> None:
    owner = Owner()
    run = ReceiptRun(owner, 4, 7)
    run.settle("q")
    run.reject("q", "EIO")
    assert owner.settled == [4, 5, 6, 7] and owner.rejected == [4, 5, 6, 7]
    assert [(r.owner, r.seq) for r in run.receipts()] == [(owner, 4), (owner, 5), (owner, 6), (owner, 7)]


def test_a_run_inserted_at_once_is_the_same_as_its_publishes_one_by_one() -> None:
    one, run = ConfirmLedger(), ConfirmLedger()
    one.insert(1, ())
    run.insert(1, ())
    for seq in range(2, 6):
        one.insert(seq, ("q",))
    run.insert_run(2, 5, "q")
    with pytest.raises(ValueError):
        run.insert_run(5, 6, "q")
    for led in (one, run):
        for seq in (3, 2, 5, 4):
            led.settle(seq, "q")
    assert one.take_answers() == run.take_answers() == [(True, 5, True)]


class LedgerMachine(RuleBasedStateMachine):
    """Random publishes to random sets of queues, settled, rejected or deleted in any order, answers
    taken at any time. Properties: every publish is answered exactly once, acks and nacks in publish
    order; an ack never comes before every queue of the publish settled (or was deleted); a nack only for
    a rejected publish; `multiple` never covers a publish that is not decided."""

    QUEUES = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.led = ConfirmLedger()
        self.seq = 0
        self.waiting: dict[int, set[str]] = {}  # seq -> queues that have not answered (model)
        self.rejected: set[int] = set()
        self.answered: dict[int, bool] = {}  # seq -> ack?
        self.last_answered = 0

    @rule(queues=st.sets(st.sampled_from(QUEUES)), refused=st.booleans())
    def publish(self, queues: set[str], refused: bool) -> None:
        self.seq += 1
        self.led.insert(self.seq, sorted(queues), rejected=refused)
        self.waiting[self.seq] = set(queues)
        if refused:
            self.rejected.add(self.seq)

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(1, 5))
    def publish_run(self, queue: str, n: int) -> None:
        """A run of publishes to one queue, recorded at once (the session's publish lane)."""
        self.led.insert_run(self.seq + 1, self.seq + n, queue)
        for _ in range(n):
            self.seq += 1
            self.waiting[self.seq] = {queue}

    @precondition(lambda self: any(self.waiting.values()))
    @rule(data=st.data(), reject=st.booleans())
    def answer(self, data: st.DataObject, reject: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(s for s, qs in self.waiting.items() if qs)))
        queue = data.draw(st.sampled_from(sorted(self.waiting[seq])))
        self.waiting[seq].discard(queue)
        if reject:
            if seq not in self.answered:
                self.led.reject(seq, queue)
                self.rejected.add(seq)
        else:
            self.led.settle(seq, queue)

    @rule(queue=st.sampled_from(QUEUES))
    def delete_queue(self, queue: str) -> None:
        self.led.remove_queue(queue)
        for qs in self.waiting.values():
            qs.discard(queue)

    @rule()
    def take(self) -> None:
        for ack, tag, multiple in self.led.take_answers():
            covered = range(self.last_answered + 1, tag + 1)
            assert tag > self.last_answered, "answers out of publish order"
            assert multiple == (len(covered) > 1)
            for seq in covered:
                assert seq not in self.answered, f"publish {seq} answered twice"
                if ack:
                    assert seq not in self.rejected, f"publish {seq} acked although rejected"
                    assert not self.waiting[seq], f"publish {seq} acked before {self.waiting[seq]} settled"
                else:
                    assert seq in self.rejected, f"publish {seq} nacked although never rejected"
                self.answered[seq] = ack
            self.last_answered = tag

    @invariant()
    def undecided_publishes_are_never_answered(self) -> None:
        for seq, ack in self.answered.items():
            assert ack or seq in self.rejected
        assert self.led.unanswered == self.seq - self.last_answered

    def teardown(self) -> None:
        # settle everything left, then every publish has exactly one answer
        for seq, qs in self.waiting.items():
            for queue in sorted(qs):
                self.led.settle(seq, queue)
            qs.clear()
        self.take()
        assert set(self.answered) == set(range(1, self.seq + 1)), "a publish was never answered"
        assert self.led.waiting == 0


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=100, stateful_step_count=60, derandomize=True, deadline=None)


@pytest.mark.slow  # the long run (`make test-slow`): random, not derandomized; `make test` runs 100 fixed examples
class TestLedgerMachineLong(LedgerMachine.TestCase):
    settings = settings(max_examples=600, stateful_step_count=60, deadline=None)


# -- the classic queue's receipts ----------------------------------------------------------------------
class Owner:
    def __init__(self) -> None:
        self.settled: list[int] = []
        self.rejected: list[int] = []

    def settle(self, seq: int, queue: object) -> None:
        self.settled.append(seq)

    def reject(self, seq: int, queue: object, error: str | None) -> None:
        self.rejected.append(seq)

    def queue_deleted(self, queue: object) -> None:
        raise AssertionError("a classic queue settles through its sync sink")


def _durable_queue() -> tuple[ClassicQueue, ManualSink]:
    fs = MemoryFS()
    sink = ManualSink()
    q = ClassicQueue("/", "q", True, None, False, {})
    q.index = QueueIndex(fs, "/q", sink)
    q.index.recover()
    q.persist = True
    return q, sink


def test_a_persistent_message_is_settled_after_the_sync_a_transient_one_at_once() -> None:
    q, sink = _durable_queue()
    owner = Owner()
    persistent = Message("", "q", BasicProperties(delivery_mode=2), b"p")
    transient = Message("", "q", BasicProperties(), b"t")
    assert q.publish(transient, Receipt(owner, 1)) is SETTLED
    assert q.publish(persistent, Receipt(owner, 2)) is PENDING
    assert q.publish(persistent) is SETTLED  # nobody waits: nothing is held
    assert owner.settled == []  # never from inside publish
    sink.commit()
    assert owner.settled == [2] and owner.rejected == []


def test_a_refused_publish_is_rejected_and_holds_no_receipt() -> None:
    q, sink = _durable_queue()
    q.apply_settings(QueueSettings(max_length=0, overflow="reject-publish"))
    owner = Owner()
    assert q.publish(Message("", "q", BasicProperties(delivery_mode=2), b"p"), Receipt(owner, 1)) is REJECTED
    sink.commit()
    assert owner.settled == [] and sink.receipts == []
