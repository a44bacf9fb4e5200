"""The per-message records of a quorum queue and the structures that hold them, tuned for RAM.

Owns: `MsgQueue` (the ready FIFO), `LiveIndexes` (which raft indexes still hold a live message, hence
the release cursor) and the record layout every other module uses.

A message is never held here, only its record: `(raft_index, size_bytes, expires_at_ms, delivery_count)`
(Record). `raft_index` is the index of the log entry that carries the body (enqueue or requeue) and also
the message id; `expires_at_ms` is 0 when the message never expires; `delivery_count` counts failed
deliveries (returns, lost consumers).

Rules:
- `MsgQueue` keeps parallel `array`s (raft index 8 bytes, size 4 bytes; expiry 8 bytes only once some
  message in the queue expires) consumed from a head offset, and a sparse dict of the delivery counts
  that are not 0 (messages returned to the back). `append` and `popleft` are O(1) amortised: the consumed
  prefix is cut off when it is at least half of the arrays. Sizes are < 2**32 (commands check it).
- `LiveIndexes` is one byte per raft index from the release cursor to the last live message: 1 for an
  index holding a live message (ready, checked out or an unsettled at-least-once dead letter), else 0.
  Every new live index is the current (largest) raft index, so adds append; `smallest` scans forward
  from the previous smallest with `bytearray.find` (C speed), each byte at most once, and the scanned
  prefix is cut off when it is at least half of the map. Its size is thus bounded by the log the runtime
  cannot truncate anyway (one byte per entry versus the entry itself on disk).
- Invariant: `LiveIndexes.count` == the number of live messages of the queue.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator

Record = tuple[int, int, int, int]  # (raft_index, size_bytes, expires_at_ms or 0, delivery_count)

_COMPACT_MIN = 4096  # consumed entries before cutting the head off is worth a copy
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
        head += 1
        n = len(self._idx)
        if head == n:
            self._clear()
        elif head >= _COMPACT_MIN and head * 2 >= n:
            del self._idx[:head]
            del self._size[:head]
            if exp is not None:
                del exp[:head]
            self._head = 0
        else:
            self._head = head
        return idx, size, expires_at, count

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
    def from_wire(cls, data: list[object]) -> MsgQueue:
        idx_b, size_b, exp_b, counts = data
        q = cls()
        q._idx = _from_le("q", idx_b)  # type: ignore[arg-type]
        q._size = _from_le("I", size_b)  # type: ignore[arg-type]
        q._exp = None if exp_b is None else _from_le("q", exp_b)  # type: ignore[arg-type]
        q._counts = {k: v for k, v in counts}  # type: ignore[attr-defined]
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
    """One flag byte per raft index from `_base`. Invariant: every live index is >= `_base` and its flag
    is 1; `_low` <= the offset of the smallest live index."""

    __slots__ = ("_flags", "_base", "_low", "count")

    def __init__(self) -> None:
        self._flags = bytearray()
        self._base = 0
        self._low = 0
        self.count = 0

    def add(self, raft_index: int) -> None:
        """Mark a new live index; it must be larger than every index added before."""
        flags = self._flags
        if not flags:
            self._base = raft_index
            self._low = 0
            flags.append(1)
        else:
            gap = raft_index - self._base - len(flags)
            if gap:
                flags.extend(bytes(gap))
            flags.append(1)
        self.count += 1

    def discard(self, raft_index: int) -> None:
        self._flags[raft_index - self._base] = 0
        self.count -= 1

    def __contains__(self, raft_index: int) -> bool:
        off = raft_index - self._base
        return 0 <= off < len(self._flags) and self._flags[off] == 1

    def smallest(self) -> int | None:
        """The smallest live raft index, or None when nothing is live."""
        if not self.count:
            if self._flags:
                self._flags = bytearray()
            return None
        flags = self._flags
        pos = flags.find(1, self._low)
        if pos >= _COMPACT_MIN and pos * 2 >= len(flags):
            del flags[:pos]
            self._base += pos
            pos = 0
        self._low = pos
        return self._base + pos

    def nbytes(self) -> int:
        return sys.getsizeof(self._flags)
