"""Publisher confirms, pure: the receipts queue types settle, and the ledger that turns them into answers.

Owns: `Receipt` (what a queue type is handed with a message it must report on), `ConfirmOwner` (who
receives the reports: a channel, a transaction, a batch of dead letters), `ConfirmLedger` (sequence
number -> the queues that still have to settle it, in the spirit of RabbitMQ's `rabbit_confirms`) and
`ConfirmBatch` (a ledger for publishes the broker makes itself, with a callback when all are answered).

Rules:
- A publisher numbers its publishes 1, 2, 3... (strictly increasing) and inserts each one into its ledger
  once `publish` has returned on every queue it was routed to, with the queues that answered PENDING.
  A queue type settles or rejects a receipt only after its `publish` returned, never from inside it.
- A sequence number is answered exactly once: `ack` once every queue settled it (or was deleted,
  `remove_queue`, as RabbitMQ confirms for a deleted queue), `nack` as soon as one queue rejected it.
- Answers go out in publish order (as hutch always answered): a settled publish waits for the ones
  before it. `take_answers` folds the answered prefix into as few answers as it can: a run of acks is
  one `basic.ack` with `multiple=true` (a run of nacks one `basic.nack`), and `multiple` never covers a
  sequence number that is not settled.
- Cost: a publish every queue settled at once, with nothing outstanding before it, is one comparison and
  one list write; the others are a dict entry until they are answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any, Protocol


class ConfirmOwner(Protocol):
    """Who learns the fate of the publishes it numbered (the channel, a transaction, a batch)."""

    def settle(self, seq: int, queue: Hashable) -> object:
        """`queue` has made publish `seq` safe by its own rule (the result is ignored)."""

    def reject(self, seq: int, queue: Hashable, error: str | None) -> object:
        """`queue` refused publish `seq`, or lost it; `error` is set when the queue type failed (storage)."""

    def queue_deleted(self, queue: Hashable) -> None:
        """`queue` was deleted while it held receipts of this owner: what waited for it is settled."""


class Receipt:
    """Handed to `Queue.publish` with a message whose publisher waits for it to be safe. A queue type
    that answers PENDING keeps it and later calls `settle(self_queue)` or `reject(self_queue)`."""

    __slots__ = ("owner", "seq")

    def __init__(self, owner: ConfirmOwner, seq: int) -> None:
        self.owner = owner
        self.seq = seq

    def settle(self, queue: Hashable) -> None:
        self.owner.settle(self.seq, queue)

    def reject(self, queue: Hashable, error: str | None = None) -> None:
        self.owner.reject(self.seq, queue, error)

    def __repr__(self) -> str:
        return f"<Receipt {self.seq} of {self.owner!r}>"


class ReceiptRun:
    """The receipts of a run of consecutive publishes `first`..`last` of one owner that went to one queue
    together (the session's publish lane): the queue settles or rejects them all at once, as it would
    each `Receipt(owner, seq)` of the run, in order."""

    __slots__ = ("owner", "first", "last")

    def __init__(self, owner: ConfirmOwner, first: int, last: int) -> None:
        assert first <= last, "a run holds at least one publish"
        self.owner = owner
        self.first = first
        self.last = last

    def settle(self, queue: Hashable) -> None:
        settle = self.owner.settle
        for seq in range(self.first, self.last + 1):
            settle(seq, queue)

    def reject(self, queue: Hashable, error: str | None = None) -> None:
        reject = self.owner.reject
        for seq in range(self.first, self.last + 1):
            reject(seq, queue, error)

    def receipts(self) -> list[Receipt]:
        """The run as one `Receipt` per publish."""
        return [Receipt(self.owner, seq) for seq in range(self.first, self.last + 1)]

    def __repr__(self) -> str:
        return f"<ReceiptRun {self.first}..{self.last} of {self.owner!r}>"


Answer = tuple[bool, int, bool]  # (ack?, delivery tag, multiple)


class _Outcome:
    """An entry decided behind an undecided one (its answer waits for publish order)."""

    __slots__ = ("ack",)

    def __init__(self, ack: bool) -> None:
        self.ack = ack

    def __repr__(self) -> str:
        return "ack" if self.ack else "nack"


_ACK = _Outcome(True)
_NACK = _Outcome(False)


class ConfirmLedger:
    """Publishes waiting for their queues, and the answers (ack/nack) that are ready, in publish order.

    Queue refs are any hashable but None. `on_answers`, when set, is called when settlements made answers
    ready where there were none (the owner schedules one `take_answers`); `insert` returns that instead."""

    __slots__ = ("_open", "_order", "_runs", "_answered", "_last_seq", "on_answers")

    def __init__(self) -> None:
        # seq -> what it waits for: one queue ref (the common case, no set made), a set of them, or its
        # outcome (_ACK/_NACK) once decided behind a publish that is not. Invariant: the keys are exactly
        # the seqs in `_order`, in publish order, and the first one (the head) is undecided.
        # seq -> what it waits for: one queue ref, a set of them, or _ACK/_NACK once decided
        self._open: dict[int, Any] = {}
        self._order: deque[int] = deque()
        # the decided prefix not answered yet, as runs: +n acks up to n, -n nacks up to n. Invariant: the
        # runs alternate in sign and increase in absolute value, all above `_answered`.
        self._runs: list[int] = []
        self._answered = 0  # every seq up to this one was given out by take_answers
        self._last_seq = 0
        self.on_answers: Callable[[], None] | None = None

    # -- recording -------------------------------------------------------------------------------------
    def insert(self, seq: int, queue_refs: Collection[Hashable] | None = (), rejected: bool = False) -> bool:
        """Publish `seq` waits for `queue_refs` (none: settled already); `rejected`: a queue refused it.
        Returns True when this made answers ready where there were none (call `take_answers` once)."""
        if seq <= self._last_seq:
            raise ValueError(f"publish {seq} inserted after {self._last_seq}: sequence numbers must increase")
        self._last_seq = seq
        if not rejected and queue_refs:
            waits: Any
            if len(queue_refs) == 1:
                (waits,) = queue_refs
            else:
                refs = set(queue_refs)
                waits = refs.pop() if len(refs) == 1 else refs
            assert waits is not None, "None is not a queue ref"
            self._open[seq] = waits
            self._order.append(seq)
            return False
        if self._open:  # decided, but behind a publish that is not
            self._open[seq] = _NACK if rejected else _ACK
            self._order.append(seq)
            return False
        runs = self._runs  # the common case: decided at once, nothing before it open
        if not runs:
            runs.append(-seq if rejected else seq)
            return True
        if (runs[-1] > 0) != rejected:
            runs[-1] = -seq if rejected else seq
        else:
            runs.append(-seq if rejected else seq)
        return False

    def insert_run(self, first: int, last: int, queue_ref: Hashable) -> None:
        """Publishes `first`..`last` all wait for `queue_ref` alone: the same as `insert(seq, (queue_ref,))`
        for each, in order (which never makes answers ready)."""
        if first <= self._last_seq or last < first:
            raise ValueError(f"publishes {first}..{last} inserted after {self._last_seq}: sequence numbers must "
                             "increase")
        assert queue_ref is not None, "None is not a queue ref"
        seqs = range(first, last + 1)
        self._open.update(dict.fromkeys(seqs, queue_ref))
        self._order.extend(seqs)
        self._last_seq = last

    def settle(self, seq: int, queue_ref: Hashable) -> bool:
        """`queue_ref` settled `seq`; True when that made `seq` wholly confirmed. Unknown or already
        decided sequence numbers are ignored (a late answer after a rejection or a deletion)."""
        open_ = self._open
        waits = open_.get(seq)
        if waits is None or waits is _ACK or waits is _NACK:
            return False
        if waits.__class__ is set:
            waits.discard(queue_ref)
            if waits:
                return False
        elif waits is not queue_ref and waits != queue_ref:
            return False
        order = self._order
        if order[0] != seq:
            open_[seq] = _ACK  # decided behind an undecided publish
            return True
        # the head (settlements mostly come in publish order): answered straight away
        order.popleft()
        del open_[seq]
        runs = self._runs
        had_answers = bool(runs)
        if had_answers and runs[-1] > 0:
            runs[-1] = seq
        else:
            runs.append(seq)
        if order:
            following = open_[order[0]]
            if following is _ACK or following is _NACK:
                self._advance()
        if not had_answers and self.on_answers is not None:
            self.on_answers()
        return True

    def confirm(self, seq_nos: Iterable[int], queue_ref: Hashable) -> list[int]:
        """`queue_ref` settled every seq in `seq_nos`; the ones now wholly confirmed."""
        return [seq for seq in seq_nos if self.settle(seq, queue_ref)]

    def reject(self, seq: int, queue_ref: Hashable) -> bool:
        """`queue_ref` refused `seq`: it will be nacked, whatever its other queues say. True if it was
        waiting (False when unknown or already decided)."""
        waits = self._open.get(seq)
        if waits is None or waits is _ACK or waits is _NACK:
            return False
        self._open[seq] = _NACK
        if self._order[0] == seq:
            self._advance()
        return True

    def remove_queue(self, queue_ref: Hashable) -> list[int]:
        """`queue_ref` was deleted: nothing waits for it any more (RabbitMQ confirms such publishes).
        Returns the seqs that this made wholly confirmed."""
        done = []
        open_ = self._open
        for seq in self._order:
            waits = open_[seq]
            if waits.__class__ is set:
                if queue_ref in waits:
                    waits.discard(queue_ref)
                    if not waits:
                        open_[seq] = _ACK
                        done.append(seq)
            elif waits is not _ACK and waits is not _NACK and waits == queue_ref:
                open_[seq] = _ACK
                done.append(seq)
        if done:
            self._advance()
        return done

    def _advance(self) -> None:
        """The head was decided: move the decided prefix into `_runs` and tell the owner."""
        order = self._order
        open_ = self._open
        runs = self._runs
        had_answers = bool(runs)
        while order:
            outcome = open_[order[0]]
            if outcome is _ACK:
                ack = True
            elif outcome is _NACK:
                ack = False
            else:
                break
            seq = order.popleft()
            del open_[seq]
            if runs and (runs[-1] > 0) == ack:
                runs[-1] = seq if ack else -seq
            else:
                runs.append(seq if ack else -seq)
        if runs and not had_answers and self.on_answers is not None:
            self.on_answers()

    # -- answering -------------------------------------------------------------------------------------
    def take_answers(self) -> list[Answer]:
        """The answers ready now, in publish order, each run folded into one (`multiple` when it covers
        more than one publish). Each publish is answered once: what is taken is forgotten."""
        runs = self._runs
        if not runs:
            return []
        out = []
        prev = self._answered
        for r in runs:
            upto = r if r > 0 else -r
            assert upto > prev, "answers must go out in publish order"
            out.append((r > 0, upto, upto - prev > 1))
            prev = upto
        runs.clear()
        self._answered = prev
        return out

    @property
    def has_answers(self) -> bool:
        return bool(self._runs)

    @property
    def answered(self) -> int:
        """Every publish up to this seq was given out by `take_answers`."""
        return self._answered

    @property
    def decided_upto(self) -> int:
        """Every publish up to this seq is decided (answered or ready to be)."""
        return self._order[0] - 1 if self._order else self._last_seq

    @property
    def unanswered(self) -> int:
        """Publishes inserted and not yet answered (management's `unconfirmed`)."""
        return self._last_seq - self._answered

    @property
    def waiting(self) -> int:
        """Publishes inserted and not yet decided."""
        return len(self._order)

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def continue_after(self, seq: int) -> None:
        """An empty ledger takes over a channel whose publishes up to `seq` were all answered elsewhere
        (a connection handed to another worker): the next publish is `seq + 1`."""
        assert not self._open and not self._runs and self._last_seq == self._answered, "not quiet"
        assert seq >= self._last_seq
        self._last_seq = self._answered = seq

    def __repr__(self) -> str:
        return (f"<ConfirmLedger last {self._last_seq} answered {self._answered} waiting {len(self._order)} "
                f"runs {self._runs}>")


class ConfirmBatch:
    """The receipts of a batch the broker publishes itself (at-least-once dead-lettering): numbered from
    1, recorded with `published`, closed with `close`; `on_done` runs once every publish is decided (the
    runtime turns it into a future to await). `acked` is the set of seqs every queue settled."""

    def __init__(self, on_done: Callable[[], None] | None = None) -> None:
        self.ledger = ConfirmLedger()
        self.on_done = on_done
        self.acked: set[int] = set()
        self.errors: list[str] = []
        self._seq = 0
        self._closed = False
        self._done = False

    def receipt(self) -> Receipt:
        """A receipt for the next publish of the batch."""
        self._seq += 1
        return Receipt(self, self._seq)

    def published(self, seq: int, pending: Collection[Hashable] | None, rejected: bool) -> None:
        self.ledger.insert(seq, pending, rejected)
        self._collect()

    def close(self) -> None:
        """No more publishes in this batch."""
        self._closed = True
        self._collect()

    @property
    def done(self) -> bool:
        return self._done

    # -- ConfirmOwner ------------------------------------------------------------------------------------
    def settle(self, seq: int, queue: Hashable) -> None:
        if self.ledger.settle(seq, queue):
            self._collect()

    def reject(self, seq: int, queue: Hashable, error: str | None) -> None:
        if error is not None:
            self.errors.append(error)
        if self.ledger.reject(seq, queue):
            self._collect()

    def queue_deleted(self, queue: Hashable) -> None:
        if self.ledger.remove_queue(queue):
            self._collect()

    def _collect(self) -> None:
        prev = self.ledger.answered
        for ack, upto, _multiple in self.ledger.take_answers():
            if ack:
                self.acked.update(range(prev + 1, upto + 1))
            prev = upto
        if self._closed and not self._done and self.ledger.decided_upto == self._seq:
            self._done = True
            if self.on_done is not None:
                self.on_done()
