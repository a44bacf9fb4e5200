"""The stable-storage interface the Raft core reads, and `MemoryStorage`, its in-memory implementation.

The core only *reads* storage (`Storage`); the driver *writes* it, with what `Ready` asked for, before it
sends the messages of that `Ready`. This module owns:

- `Storage`, the read protocol: initial state, entries in a range, term of an index, first/last index,
  the latest snapshot.
- `MemoryStorage`, used by tests and the simulator, and the reference for the on-disk implementation
  (the write-ahead log of issue 6 item 3): `set_hard_state`, `append` (truncating a conflicting suffix),
  `apply_snapshot` (replacing the whole log), `create_snapshot` + `compact` (log compaction driven by
  the application).
- `bootstrap_entries`: how a new group's founding configuration is written (as log entries).

Invariant (MemoryStorage): `self._ents[0]` is a dummy entry whose index/term are those of the latest
snapshot (0/0 for an empty log); real entries follow at consecutive indexes.
"""

from __future__ import annotations

from typing import Protocol

from .messages import (
    EMPTY_HARD_STATE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
)


class StorageError(Exception):
    pass


class CompactedError(StorageError):
    """The requested index is at or below the snapshot: the entry is gone (send a snapshot instead)."""


class UnavailableError(StorageError):
    """The requested index is above the last index."""


class SnapshotTemporarilyUnavailableError(StorageError):
    """The storage cannot produce a snapshot now; the leader retries later."""


class Storage(Protocol):
    def initial_state(self) -> tuple[HardState, ConfState]: ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi); at least one entry if any is in range, even past `max_bytes`."""
        ...

    def term(self, index: int) -> int:
        """Term of `index`, valid for first_index()-1 <= index <= last_index()."""
        ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def snapshot(self) -> Snapshot: ...


def limit_size(ents: list[Entry], max_bytes: int) -> list[Entry]:
    """The longest prefix of `ents` within `max_bytes`, but never fewer than one entry."""
    if not ents:
        return ents
    total = ents[0].size_bytes()
    for n in range(1, len(ents)):
        total += ents[n].size_bytes()
        if total > max_bytes:
            return ents[:n]
    return ents


def bootstrap_entries(voters: tuple[int, ...] | list[int]) -> tuple[list[Entry], HardState]:
    """The log and hard state every *founding* member of a new group persists before starting.

    The initial configuration is a sequence of committed ADD_NODE entries (term 1), not a snapshot at
    index 0: a server added later learns the founding configuration by replication like any other entry.
    (Giving it to members out of band would leave later joiners with an empty base configuration.)
    A joining node starts with empty storage and waits to be contacted.
    """
    ents = [
        Entry(1, i + 1, EntryType.CONF_CHANGE, ConfChange(ConfChangeType.ADD_NODE, v).encode())
        for i, v in enumerate(sorted(voters))
    ]
    return ents, HardState(term=1, vote=0, commit=len(ents))


class MemoryStorage:
    """Storage held in memory; `MemoryStorage.bootstrap(voters)` for a founding member of a new group."""

    def __init__(self) -> None:
        self.hard_state: HardState = EMPTY_HARD_STATE
        self._snapshot = Snapshot(SnapshotMeta(0, 0, ConfState()))
        self._ents: list[Entry] = [Entry(0, 0)]

    @classmethod
    def bootstrap(cls, voters: tuple[int, ...] | list[int]) -> MemoryStorage:
        st = cls()
        ents, hs = bootstrap_entries(voters)
        st.append(ents)
        st.set_hard_state(hs)
        return st

    # -- reads (the Storage protocol) ------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self.hard_state, self._snapshot.meta.conf_state

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def term(self, index: int) -> int:
        offset = self._ents[0].index
        if index < offset:
            raise CompactedError(index)
        if index - offset >= len(self._ents):
            raise UnavailableError(index)
        return self._ents[index - offset].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(lo)
        if hi > self.last_index() + 1:
            raise UnavailableError(hi)
        return limit_size(self._ents[lo - offset : hi - offset], max_bytes)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- writes (the driver's) -------------------------------------------------------------------

    def set_hard_state(self, hs: HardState) -> None:
        self.hard_state = hs

    def append(self, ents: list[Entry] | tuple[Entry, ...]) -> None:
        """Append `ents`, replacing any existing entries from `ents[0].index` on."""
        if not ents:
            return
        first = self.first_index()
        last = ents[-1].index
        if last < first:
            return  # all already compacted
        if first > ents[0].index:
            ents = ents[first - ents[0].index :]
        offset = ents[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise UnavailableError(f"missing log entry [last: {self.last_index()}, append at: {ents[0].index}]")
        del self._ents[offset:]
        self._ents.extend(ents)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log with `snap` (a follower installing the leader's snapshot)."""
        if snap.index <= self._snapshot.index:
            return  # out of date
        self._snapshot = snap
        self._ents = [Entry(snap.term, snap.index)]

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes) -> Snapshot:
        """Record the application's state as of `index` (which must be applied, hence stored)."""
        if index <= self._snapshot.index:
            return self._snapshot
        if index > self.last_index():
            raise UnavailableError(index)
        snap = Snapshot(SnapshotMeta(index, self.term(index), conf_state), data)
        self._snapshot = snap
        return snap

    def compact(self, compact_index: int) -> None:
        """Discard entries up to and including `compact_index` (must be <= the snapshot index)."""
        offset = self._ents[0].index
        if compact_index <= offset:
            return
        if compact_index > self._snapshot.index:
            raise StorageError(f"compact({compact_index}) past the snapshot at {self._snapshot.index}")
        i = compact_index - offset
        self._ents = [Entry(self._ents[i].term, self._ents[i].index)] + self._ents[i + 1 :]
