"""The Raft log as the core sees it: stable storage below, unstable (not yet persisted) entries above.

This module owns:
- `Unstable`: entries and at most one snapshot the core has accepted but the driver has not yet
  persisted. They leave `Unstable` only when `advance()` reports them stable.
- `RaftLog`: the union of `Storage` (read-only to the core) and `Unstable`, plus the `committed` and
  `applied` indexes and the configuration history (membership takes effect on append, see membership.py).

Invariants:
- `applied <= committed <= last_index()`; `committed` never decreases; an entry at or below `committed`
  is never truncated (violations raise `RaftSafetyError`, they are bugs, not conditions to handle).
- `Unstable.entries[i].index == Unstable.offset + i`; with a pending snapshot, `offset == snapshot.index + 1`.
"""

from __future__ import annotations

from .membership import ConfigHistory
from .messages import Entry, Snapshot
from .storage import CompactedError, Storage, limit_size

NO_LIMIT = 1 << 62


class RaftSafetyError(AssertionError):
    """An invariant of the Raft log would be broken. Always a bug (or corrupted storage)."""


class Unstable:
    __slots__ = ("entries", "offset", "snapshot")

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset

    def maybe_first_index(self) -> int | None:
        return self.snapshot.index + 1 if self.snapshot is not None else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        if self.snapshot is not None:
            return self.snapshot.index
        return None

    def maybe_term(self, index: int) -> int | None:
        if index < self.offset:
            if self.snapshot is not None and self.snapshot.index == index:
                return self.snapshot.term
            return None
        pos = index - self.offset
        if pos >= len(self.entries):
            return None
        return self.entries[pos].term

    def stable_to(self, index: int, term: int) -> None:
        # Only if the entry is still the one that was persisted: it may have been replaced since.
        if index < self.offset or self.maybe_term(index) != term:
            return
        del self.entries[: index + 1 - self.offset]
        self.offset = index + 1

    def stable_snap_to(self, index: int) -> None:
        if self.snapshot is not None and self.snapshot.index == index:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry] | tuple[Entry, ...]) -> None:
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replacing entries already handed to storage: the driver's append overwrites them there.
            self.offset = after
            self.entries = list(ents)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(ents)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        return self.entries[lo - self.offset : hi - self.offset]


class RaftLog:
    def __init__(self, storage: Storage, max_apply_bytes: int = NO_LIMIT) -> None:
        self.storage = storage
        self.max_apply_bytes = max_apply_bytes
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = Unstable(last + 1)
        self.committed = first - 1
        self.applied = first - 1
        self.applying = first - 1  # last index handed out in a Ready, not yet advanced
        _, conf = storage.initial_state()
        self.config = ConfigHistory(first - 1, conf)
        if last >= first:
            # Restart: rebuild the configuration history from the log above the snapshot.
            self.config.observe(storage.entries(first, last + 1, NO_LIMIT))

    # -- indexes and terms ---------------------------------------------------------------------

    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, index: int) -> int:
        """Term of `index`; 0 above the last index; raises CompactedError below the first index - 1."""
        t = self.unstable.maybe_term(index)
        if t is not None:
            return t
        if index > self.last_index():
            return 0
        if index < self.first_index() - 1:
            raise CompactedError(index)
        return self.storage.term(index)

    def zero_term_on_compacted(self, index: int) -> int:
        try:
            return self.term(index)
        except CompactedError:
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term
        except CompactedError:
            return False

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """§5.4.1: is a log ending at (last_index, term) at least as up-to-date as ours?"""
        our_term = self.last_term()
        return term > our_term or (term == our_term and last_index >= self.last_index())

    # -- reading entries -----------------------------------------------------------------------

    def slice(self, lo: int, hi: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        """Entries [lo, hi), size-limited (at least one); raises CompactedError if lo is compacted."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise CompactedError(lo)
        if hi > self.last_index() + 1:
            raise RaftSafetyError(f"slice [{lo}, {hi}) out of bound; last index {self.last_index()}")
        offset = self.unstable.offset
        ents: list[Entry] = []
        if lo < offset:
            ents = self.storage.entries(lo, min(hi, offset), max_bytes)
            if len(ents) < min(hi, offset) - lo:
                return ents  # the size limit was hit inside storage
        if hi > offset:
            ents = ents + self.unstable.slice(max(lo, offset), hi)
        return limit_size(ents, max_bytes)

    def entries_from(self, lo: int, max_bytes: int, max_count: int) -> list[Entry]:
        hi = min(self.last_index() + 1, lo + max_count)
        return self.slice(lo, hi, max_bytes)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def has_next_committed_entries(self) -> bool:
        if self.unstable.snapshot is not None:
            return False
        return self.committed > max(self.applied, self.applying)

    def next_committed_entries(self) -> list[Entry]:
        if self.unstable.snapshot is not None:
            return []  # the snapshot is applied first
        lo = max(self.applied, self.applying, self.first_index() - 1) + 1
        return self.slice(lo, self.committed + 1, self.max_apply_bytes)

    # -- changing the log ----------------------------------------------------------------------

    def append(self, ents: list[Entry] | tuple[Entry, ...]) -> int:
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise RaftSafetyError(f"append after {after} would truncate committed {self.committed}")
        self.unstable.truncate_and_append(ents)
        self.config.truncate_after(after)
        self.config.observe(ents)
        return self.last_index()

    def find_conflict(self, ents: tuple[Entry, ...]) -> int:
        """Index of the first entry of `ents` whose term differs from ours (0: none)."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest (i, term(i)) with i <= index and term(i) <= term: the leader's fast backtrack hint."""
        while index > 0:
            try:
                our = self.term(index)
            except CompactedError:
                return index, 0
            if our <= term:
                return index, our
            index -= 1
        return 0, 0

    def maybe_append(self, index: int, log_term: int, committed: int, ents: tuple[Entry, ...]) -> int | None:
        """AppendEntries on a follower: None if (index, log_term) does not match, else the last new index."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        conflict = self.find_conflict(ents)
        if conflict:
            if conflict <= self.committed:
                raise RaftSafetyError(f"entry {conflict} conflicts with committed entry {self.committed}")
            self.append(ents[conflict - (index + 1) :])
        self.commit_to(min(committed, last_new))
        return last_new

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise RaftSafetyError(f"commit {index} past last index {self.last_index()}")
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Figure 8: a leader commits by counting replicas only entries of its own term."""
        if index > self.committed and self.zero_term_on_compacted(index) == term:
            self.commit_to(index)
            return True
        return False

    def applied_to(self, index: int) -> None:
        if index <= self.applied:
            return
        if index > self.committed:
            raise RaftSafetyError(f"applied {index} past committed {self.committed}")
        self.applied = index
        self.applying = max(self.applying, index)

    def stable_to(self, index: int, term: int) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, index: int) -> None:
        self.unstable.stable_snap_to(index)

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.index
        self.unstable.restore(snap)
        self.config.reset(snap.index, snap.meta.conf_state)
