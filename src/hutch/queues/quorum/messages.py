"""The per-message records of a quorum queue and the structures that hold them, tuned for RAM.

Owns: `MsgQueue` (the ready FIFO), `LiveIndexes` (how many live messages each raft entry still holds,
hence the release cursor), the message-id layout (`SHIFT`, `BATCH_MAX`) and the record layout every
other module uses.

A message is never held here, only its record: `(msg_id, size_bytes, expires_at_ms, delivery_count)`
(Record). The message id says where the body is: `(raft index << SHIFT) | position`, the entry that
carries the body (an enqueue, a requeue, or an enqueue batch of up to BATCH_MAX messages) and the
message's position in it; ids grow with the log. `expires_at_ms` is 0 when the message never expires;
`delivery_count` counts failed deliveries (returns, lost consumers).

Rules:
- `MsgQueue` keeps parallel `array`s (message id 8 bytes, size 4 bytes; expiry 8 bytes only once some
  message in the queue expires) consumed from a head offset, and a sparse dict of the delivery counts
  that are not 0 (messages returned to the back). `append` and `popleft` are O(1) amortised: the consumed
  prefix is cut off when it is at least half of the arrays. Sizes are < 2**32 (commands check it).
- `LiveIndexes` is one byte per raft index from the release cursor to the last live message: the number
  of live messages (ready, checked out or an unsettled at-least-once dead letter) whose body is in that
  entry (<= BATCH_MAX). Every new live message is in the current (largest) entry, so adds append;
  `smallest` scans forward from the previous smallest with a compiled regex (C speed), each byte at most
  once, and the scanned prefix is cut off when it is at least half of the map. Its size is thus bounded
  by the log the runtime cannot truncate anyway (one byte per entry versus the entry itself on disk).
- Invariant: `LiveIndexes.count` == the number of live messages of the queue.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

Record = tuple[int, int, int, int]  # (msg_id, size_bytes, expires_at_ms or 0, delivery_count)

_COMPACT_MIN = 4096  # consumed entries before cutting the head off is worth a copy
_NONZERO = re.compile(rb"[^\x00]")

# A message id is its body's place in the log: (raft index of the entry << SHIFT) | position in the
# entry. An enqueue or requeue entry carries one message (position 0), an enqueue batch up to BATCH_MAX.
SHIFT = 8
BATCH_MAX = 255
_LITTLE = sys.byteorder == "little"


class MsgQueue:
    """A FIFO of records in parallel arrays. Invariant: `_head` <= len(arrays); entries before `_head`
    were consumed; `_exp` is None or as long as `_idx`."""

    __slots__ = ("_idx", "_size", "_exp", "_head", "_counts", "n")

    def __init__(self) -> None:
        self._idx = array("q")
        self._size = array("I")
        self._exp: array[int] | None = None
        self._head = 0
        self._counts: dict[int, int] = {}  # raft_index -> delivery count, only counts > 0
        self.n = 0  # records in the queue; hot paths test it rather than call __len__

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    @property
    def may_expire(self) -> bool:
        """Some record in the queue may have an expiry."""
        return self._exp is not None

    def append(self, raft_index: int, size: int, expires_at: int = 0, count: int = 0) -> None:
        self._idx.append(raft_index)
        self._size.append(size)
        exp = self._exp
        if exp is not None:
            exp.append(expires_at)
        elif expires_at:
            exp = self._exp = array("q", bytes(8 * (len(self._idx) - 1)))
            exp.append(expires_at)
        if count:
            self._counts[raft_index] = count
        self.n += 1

    def extend(self, first_id: int, sizes: Sequence[int]) -> None:
        """`append(first_id + i, sizes[i])` for each size (no expiry, no delivery count), in one step."""
        n = len(sizes)
        self._idx.extend(range(first_id, first_id + n))
        self._size.extend(sizes)
        exp = self._exp
        if exp is not None:
            exp.extend(array("q", bytes(8 * n)))
        self.n += n

    @property
    def plain(self) -> bool:
        """No record has an expiry or a delivery count: `take` may be used."""
        return self._exp is None and not self._counts

    def take(self, n: int) -> tuple[list[int], list[int]]:
        """Pop the `n` (<= len) oldest records of a `plain` queue at once: their ids and sizes."""
        head = self._head
        end = head + n
        ids = self._idx[head:end].tolist()
        sizes = self._size[head:end].tolist()
        self.n -= n
        self._consumed_to(end)
        return ids, sizes

    def head_index(self) -> int:
        return self._idx[self._head]

    def head_expiry(self) -> int:
        """The head's expiry (0: never). The queue must not be empty."""
        exp = self._exp
        return 0 if exp is None else exp[self._head]

    def popleft(self) -> Record:
        head = self._head
        idx = self._idx[head]
        size = self._size[head]
        exp = self._exp
        expires_at = 0 if exp is None else exp[head]
        count = self._counts.pop(idx, 0) if self._counts else 0
        self.n -= 1
        self._consumed_to(head + 1)
        return idx, size, expires_at, count

    def _consumed_to(self, head: int) -> None:
        """Everything before `head` was taken: clear, cut the consumed prefix off, or move the head."""
        n = len(self._idx)
        assert head <= n
        if head == n:
            self._clear()
        elif head >= _COMPACT_MIN and head * 2 >= n:
            del self._idx[:head]
            del self._size[:head]
            if self._exp is not None:
                del self._exp[:head]
            self._head = 0
        else:
            self._head = head

    def _clear(self) -> None:
        self._idx = array("q")
        self._size = array("I")
        self._exp = None
        self._head = 0
        self.n = 0

    def clear(self) -> list[int]:
        """Remove everything; the raft indexes removed, in queue order."""
        removed = self._idx[self._head:].tolist()
        self._clear()
        self._counts.clear()
        return removed

    def records(self) -> Iterator[Record]:
        """Every record, head first."""
        head = self._head
        exp = self._exp
        counts = self._counts
        for i in range(head, len(self._idx)):
            idx = self._idx[i]
            yield idx, self._size[i], 0 if exp is None else exp[i], counts.get(idx, 0)

    def indexes(self) -> list[int]:
        return self._idx[self._head:].tolist()

    # -- snapshot form: the arrays as little-endian bytes, the counts as pairs -----------------------
    def to_wire(self) -> list[object]:
        head = self._head
        exp = self._exp
        return [_le_bytes(self._idx[head:]), _le_bytes(self._size[head:]),
                None if exp is None else _le_bytes(exp[head:]), [[k, v] for k, v in self._counts.items()]]

    @classmethod
    def from_wire(cls, data: list[Any]) -> MsgQueue:
        """The inverse of `to_wire`, from a decoded snapshot (msgpack values, hence Any)."""
        idx_b, size_b, exp_b, counts = data
        q = cls()
        q._idx = _from_le("q", idx_b)
        q._size = _from_le("I", size_b)
        q._exp = None if exp_b is None else _from_le("q", exp_b)
        q._counts = {k: v for k, v in counts}
        q.n = len(q._idx)
        return q

    def nbytes(self) -> int:
        """RAM held by the arrays and the counts dict (for the memory figure in docs)."""
        total = sys.getsizeof(self._idx) + sys.getsizeof(self._size) + sys.getsizeof(self._counts)
        if self._exp is not None:
            total += sys.getsizeof(self._exp)
        return total


def _le_bytes(a: array[int]) -> bytes:
    if not _LITTLE:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _from_le(typecode: str, data: bytes) -> array[int]:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


class LiveIndexes:
    """How many live messages each raft entry holds, from `_base`. Invariant: every live message's entry
    is >= `_base`; `_counts[i - _base]` is the number of live messages at entry `i` (at most
    BATCH_MAX: one byte); `_low` <= the offset of the smallest entry holding a live message."""

    __slots__ = ("_flags", "_base", "_low", "count")

    def __init__(self) -> None:
        self._flags = bytearray()
        self._base = 0
        self._low = 0
        self.count = 0

    def add(self, msg_id: int, n: int = 1) -> None:
        """`n` new live messages of one entry (`msg_id >> SHIFT`, a plain enqueue batch's in one step); the
        entry must be at or after every entry added before."""
        raft_index = msg_id >> SHIFT
        flags = self._flags
        if not flags:
            self._base = raft_index
            self._low = 0
            flags.append(n)
        else:
            off = raft_index - self._base
            size = len(flags)
            if off < size:
                flags[off] += n
            else:
                if off > size:
                    flags.extend(bytes(off - size))
                flags.append(n)
        self.count += n

    def discard(self, msg_id: int) -> None:
        self._flags[(msg_id >> SHIFT) - self._base] -= 1
        self.count -= 1

    def discard_many(self, msg_ids: list[int]) -> None:
        flags, base = self._flags, self._base
        for msg_id in msg_ids:
            flags[(msg_id >> SHIFT) - base] -= 1
        self.count -= len(msg_ids)

    def holds(self, raft_index: int) -> int:
        """The number of live messages whose body is in the entry at `raft_index`."""
        off = raft_index - self._base
        return self._flags[off] if 0 <= off < len(self._flags) else 0

    def smallest(self) -> int | None:
        """The smallest raft index holding a live message, or None when nothing is live."""
        if not self.count:
            if self._flags:
                self._flags = bytearray()
            return None
        flags = self._flags
        m = _NONZERO.search(flags, self._low)
        assert m is not None  # count > 0
        pos = m.start()
        if pos >= _COMPACT_MIN and pos * 2 >= len(flags):
            del flags[:pos]
            self._base += pos
            pos = 0
        self._low = pos
        return self._base + pos

    def nbytes(self) -> int:
        return sys.getsizeof(self._flags)
