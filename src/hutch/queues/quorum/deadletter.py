"""Dead-lettering in the quorum queue machine: at-most-once and at-least-once (seed 000).

Owns: `DlxState` (the at-least-once area: dead letters waiting for the worker, and those handed to it
but not yet settled) and `dead_letter`, the one way a message leaves the queue other than by a
settlement or a purge.

Rules:
- A message that expires, is dropped by drop-head (`maxlen`), passes the delivery limit
  (`delivery_limit`) or is rejected without requeue (`rejected`) is dead-lettered with that reason:
  - at-least-once in force (config.at_least_once): it moves to the dlx area, keeps its log entry live
    and counts towards max-length / max-length-bytes until the worker settles it; the worker
    (`DlxCheckout`) gets at most `prefetch` dead letters at a time, oldest first (`DlxDeliver`);
  - else with a dead-letter exchange: a `DeadLetter` effect (the runtime reads the bodies and
    republishes, core/deadletter.py builds x-death) and the machine forgets it at once;
  - else: a `Dropped` effect with the reason, and it is forgotten.
- A new worker checkout takes back what the previous one had not settled, in message order, ahead of
  the rest (the old worker is gone: a leader change).
- When at-least-once stops being in force (strategy, overflow or dead-letter exchange changed), every
  dead letter not yet settled is deleted (seed 000), reported as `Dropped(DROPPED_STRATEGY_CHANGED)`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from .effects import DROPPED_STRATEGY_CHANGED, REASONS, Out

if TYPE_CHECKING:
    from .config import QuorumConfig
    from .messages import LiveIndexes

DlxRecord = tuple[int, int, int]  # (raft_index, size_bytes, reason code)


class DlxState:
    """Invariant: `count` == len(ready) + len(checked); `bytes` is the sum of their sizes."""

    __slots__ = ("ready", "checked", "prefetch", "bytes")

    def __init__(self) -> None:
        self.ready: deque[DlxRecord] = deque()
        self.checked: dict[int, tuple[int, int]] = {}  # msg id (raft index) -> (size, reason code)
        self.prefetch = 0  # 0: no worker registered
        self.bytes = 0

    @property
    def count(self) -> int:
        return len(self.ready) + len(self.checked)

    def indexes(self) -> list[int]:
        return [r[0] for r in self.ready] + list(self.checked)

    def to_wire(self) -> list[Any]:
        return [self.prefetch, self.bytes, [list(r) for r in self.ready],
                [[i, s, r] for i, (s, r) in self.checked.items()]]

    @classmethod
    def from_wire(cls, data: list[Any]) -> DlxState:
        prefetch, nbytes, ready, checked = data
        d = cls()
        d.prefetch = prefetch
        d.bytes = nbytes
        d.ready = deque((i, s, r) for i, s, r in ready)
        d.checked = {i: (s, r) for i, s, r in checked}
        return d


class DlxHost(Protocol):
    """What dead-lettering reads and changes of a queue's state (state.py's `QueueState`, which imports
    this module: naming it here would be an import cycle)."""

    config: QuorumConfig
    dlx: DlxState
    live: LiveIndexes


def dead_letter(st: DlxHost, out: Out, reason_code: int, raft_index: int, size: int) -> None:
    """The message at `raft_index` (already out of the ready queue or its consumer) dies."""
    cfg = st.config
    if cfg.at_least_once:
        dlx = st.dlx
        dlx.ready.append((raft_index, size, reason_code))
        dlx.bytes += size
        return
    st.live.discard(raft_index)
    target = out.dead if cfg.dead_letter_exchange is not None else out.dropped
    reason = REASONS[reason_code]
    batch = target.get(reason)
    if batch is None:
        target[reason] = [raft_index]
    else:
        batch.append(raft_index)


def dlx_checkout(st: DlxHost, prefetch: int) -> None:
    """The worker (re)registers: what it held goes back to the front, in message order."""
    dlx = st.dlx
    if dlx.checked:
        back = sorted(dlx.checked.items())
        dlx.ready.extendleft((i, s, r) for i, (s, r) in reversed(back))
        dlx.checked = {}
    dlx.prefetch = prefetch


def dlx_settle(st: DlxHost, msg_ids: tuple[int, ...]) -> None:
    dlx = st.dlx
    for msg_id in msg_ids:
        item = dlx.checked.pop(msg_id, None)
        if item is not None:
            dlx.bytes -= item[0]
            st.live.discard(msg_id)


def dlx_deliver(st: DlxHost, out: Out) -> None:
    """Hand dead letters to the worker while it has room."""
    dlx = st.dlx
    room = dlx.prefetch - len(dlx.checked)
    while room > 0 and dlx.ready:
        idx, size, code = dlx.ready.popleft()
        dlx.checked[idx] = (size, code)
        out.dlx.append((idx, idx, REASONS[code]))
        room -= 1


def drop_all(st: DlxHost, out: Out) -> None:
    """At-least-once stopped: delete every dead letter not yet settled (seed 000)."""
    dlx = st.dlx
    indexes = dlx.indexes()
    if indexes:
        for idx in indexes:
            st.live.discard(idx)
        out.dropped.setdefault(DROPPED_STRATEGY_CHANGED, []).extend(indexes)
    dlx.ready.clear()
    dlx.checked = {}
    dlx.bytes = 0
    dlx.prefetch = 0
