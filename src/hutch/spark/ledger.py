"""The streaming source's bookkeeping: which deliveries a micro-batch holds and what to settle when.

Owns: `Ledger`, a pure state machine (no I/O, no clock, no Spark) driven by the stream reader on the
driver, and `Settle`, the acknowledgements it decides.

Offsets. A query numbers the messages it hands to Spark: the k-th gets sequence number `seq` = k, and
a micro-batch is the range (start, end] of seqs. Numbering continues across restarts (a restarted
query resumes from the end offset in its checkpoint), so offsets only grow. Each handed-out seq maps to
a delivery tag of the reader's one AMQP channel; seqs and tags ascend together.

Invariants:
- `entries` are the handed-out, unsettled deliveries, contiguous in seq (first seq = `settled_seq`+1,
  last = `handed_seq`) and ascending in delivery tag.
- A delivery is acknowledged only if (a) Spark has finished the batch that holds it (`settle(upto)`
  with upto >= its seq) and (b) its rows were emitted to Spark (`mark_emitted`). A delivery settled
  without having been emitted is requeued (basic.nack requeue=true), never acknowledged: nothing the
  reader acknowledges can be missing from Spark's output.
- Settling walks entries in order, so each `Settle` may use multiple=true: every earlier tag of the
  channel is already settled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class LedgerError(RuntimeError):
    """Spark asked for offsets the reader cannot serve (a broken contract, not a broker failure)."""


@dataclass(frozen=True)
class Settle:
    """Acknowledge (`ack`) or requeue every unsettled delivery up to and including `delivery_tag`."""

    ack: bool
    delivery_tag: int
    count: int


class _Entry:
    __slots__ = ("seq", "tag", "item", "emitted")

    def __init__(self, seq: int, tag: int, item: Any) -> None:
        self.seq = seq
        self.tag = tag
        self.item = item
        self.emitted = False


class Ledger:
    """Handed-out deliveries by seq. `item`s are opaque to the ledger (the reader keeps deliveries)."""

    def __init__(self, base_seq: int) -> None:
        if base_seq < 0:
            raise LedgerError(f"offset seq must be >= 0, got {base_seq}")
        self.settled_seq = base_seq
        self.entries: deque[_Entry] = deque()

    @property
    def handed_seq(self) -> int:
        return self.entries[-1].seq if self.entries else self.settled_seq

    def settle(self, upto_seq: int) -> list[Settle]:
        """Spark has finished every batch ending at or before `upto_seq`: settle those deliveries.
        Returns the acknowledgements to send, in order."""
        out: list[Settle] = []
        entries = self.entries
        while entries and entries[0].seq <= upto_seq:
            first = entries.popleft()
            run_ack, last_tag, count = first.emitted, first.tag, 1
            while entries and entries[0].seq <= upto_seq and entries[0].emitted == run_ack:
                last_tag = entries.popleft().tag
                count += 1
            out.append(Settle(run_ack, last_tag, count))
        if upto_seq > self.settled_seq:
            self.settled_seq = upto_seq if not entries else entries[0].seq - 1
        return out

    def room(self, start_seq: int, limit: int) -> int:
        """How many new deliveries a batch starting at `start_seq` may take (limit minus what it
        re-serves from entries already handed out after `start_seq`)."""
        self._check_start(start_seq)
        already = max(0, self.handed_seq - start_seq)
        return max(0, limit - already)

    def append(self, tagged: Iterable[tuple[int, Any]]) -> None:
        """Hand out new deliveries `(delivery_tag, item)`, numbering them after `handed_seq`."""
        seq = self.handed_seq
        entries = self.entries
        for tag, item in tagged:
            if entries and tag <= entries[-1].tag:
                raise LedgerError(f"delivery tag {tag} after {entries[-1].tag}: tags must ascend")
            seq += 1
            entries.append(_Entry(seq, tag, item))

    def batch(self, start_seq: int, limit: int) -> tuple[list[Any], int]:
        """The items of the batch (start_seq, end] with at most `limit` items, and `end`. Call
        `settle(start_seq)` first: that is also what moves a restarted query's numbering to its
        checkpointed offset."""
        self._check_start(start_seq)
        entries = self.entries
        if not entries or start_seq >= self.handed_seq:
            return [], start_seq
        skip = start_seq - self.settled_seq
        items = [entries[i].item for i in range(skip, min(skip + limit, len(entries)))]
        return items, start_seq + len(items)

    def mark_emitted(self, start_seq: int, end_seq: int) -> None:
        """The rows of (start_seq, end_seq] were emitted to Spark."""
        for e in self.entries:
            if e.seq > end_seq:
                break
            if e.seq > start_seq:
                e.emitted = True

    def _check_start(self, start_seq: int) -> None:
        if start_seq < self.settled_seq:
            raise LedgerError(
                f"Spark asked for messages after seq {start_seq}, but this reader has already settled "
                f"everything up to seq {self.settled_seq}; a queue cannot be re-read (was the checkpoint "
                "replaced while the query ran?)")
        if start_seq > self.handed_seq and self.entries:
            raise LedgerError(f"start seq {start_seq} is past the last handed-out seq {self.handed_seq} "
                              "while earlier deliveries are unsettled")
