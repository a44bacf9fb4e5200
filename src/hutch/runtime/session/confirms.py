"""A channel's publisher confirms and transaction commits: its confirm ledger, answered on the wire.

Owns: `ChannelConfirms`, the `ConfirmOwner` of one channel's receipts (core/confirms.py). In confirm mode
it turns the ledger's answers into basic.ack / basic.nack frames; in tx mode every publish of a commit
is numbered the same way and tx.commit-ok goes out once the commit's last publish is decided.

Rules:
- Settlements mark the channel for its connection's next flush (`want_flush`), so the acks of one loop
  turn go out as one `multiple` ack; nothing is written from inside a settlement.
- Answers follow publish order; a nack is never sent for a publish that was acked, nor the reverse.
- A commit-ok follows the commits before it. A queue's refusal does not fail a commit (tx publishes are
  not confirmed to the client); a queue type's failure (`error`, message storage) closes the connection
  with 541 INTERNAL_ERROR and that text, as before.
- A closed channel drops what is settled later (its receipts may outlive it in the queues).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING, Protocol

from hutch.amqp import spec
from hutch.amqp.errors import INTERNAL_ERROR, ConnectionError_
from hutch.core.confirms import ConfirmLedger

if TYPE_CHECKING:
    from hutch.runtime.ports import SessionConnection


class AnsweringChannel(Protocol):
    """What the confirms need of their channel (session/channel.py's ServerChannel)."""

    OPEN: int
    number: int
    state: int
    stat_confirm: int
    conn: SessionConnection

    def send(self, method: spec.Method) -> None: ...


class ChannelConfirms(ConfirmLedger):
    """The confirm ledger of one channel in confirm mode (`tx=False`) or tx mode (`tx=True`), and the
    `ConfirmOwner` of its receipts: `settle` is the ledger's own (the hot path: one call from a receipt)."""

    __slots__ = ("channel", "tx", "closed", "failure", "_commits")

    def __init__(self, channel: AnsweringChannel, tx: bool) -> None:
        super().__init__()
        self.channel = channel
        self.tx = tx
        self.closed = False
        self.failure: str | None = None  # the first queue-type failure reported (tx mode closes with it)
        self._commits: deque[int] = deque()  # last publish seq of each tx.commit not answered yet
        self.on_answers = self._wake

    def _wake(self) -> None:
        if not self.closed:
            self.channel.conn.want_flush(self.channel)

    def published(self, seq: int, pending: Collection[Hashable] | None, rejected: bool) -> None:
        """Publish `seq` went to its queues: `pending` still have to settle it; `rejected`: one refused."""
        if self.insert(seq, pending, rejected):
            self._wake()

    # -- ConfirmOwner (settle: the ledger's) -------------------------------------------------------------
    def reject(self, seq: int, queue: Hashable, error: str | None = None) -> bool:
        if error is not None and self.failure is None:
            self.failure = error
        return super().reject(seq, queue)

    def queue_deleted(self, queue: Hashable) -> None:
        self.remove_queue(queue)

    # -- transactions -----------------------------------------------------------------------------------
    def commit(self) -> bool:
        """tx.commit enqueued its publishes: True when commit-ok may go out now (nothing to wait for),
        else it goes out from `flush` once they are decided."""
        upto = self.last_seq
        if not self._commits and self.decided_upto >= upto and self.failure is None:
            self.take_answers()
            return True
        self._commits.append(upto)
        self.channel.conn.want_flush(self.channel)
        return False

    # -- answering ------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what is decided (the connection calls this once per loop turn for a marked channel)."""
        ch = self.channel
        if self.tx:
            self.take_answers()
            self._complete_commits()
            return
        prev = self.answered
        answers = self.take_answers()
        if self.closed or ch.state != ch.OPEN:
            return
        send = ch.conn.send_method
        number = ch.number
        for ack, tag, multiple in answers:
            if ack:
                send(number, spec.Basic.Ack(delivery_tag=tag, multiple=multiple))
                ch.stat_confirm += tag - prev
            else:
                send(number, spec.Basic.Nack(delivery_tag=tag, multiple=multiple))
            prev = tag

    def _complete_commits(self) -> None:
        commits = self._commits
        decided = self.decided_upto
        ch = self.channel
        while commits and commits[0] <= decided:
            commits.popleft()
            if self.failure is not None:
                # the commit cannot be made durable: the connection is closed with 541
                ch.conn.close_with_error(ConnectionError_(INTERNAL_ERROR, self.failure))
                return
            if not self.closed and ch.state == ch.OPEN:
                ch.send(spec.Tx.CommitOk())

    @property
    def unconfirmed(self) -> int:
        """Publishes not answered yet (management)."""
        return self.unanswered
