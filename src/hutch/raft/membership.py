"""Group membership: which configuration is in force at which log index.

Membership changes follow the Raft thesis §4.1 (single-server changes), not etcd's apply-time rule:

- A configuration change is a CONF_CHANGE log entry adding or removing one voter.
- **A server uses the latest configuration in its log, whether or not that entry is committed.** The new
  configuration takes effect on every server as soon as the entry is appended, and is undone if a new
  leader truncates the entry away.
- The leader proposes a change only when no change is uncommitted in its log, and only once an entry of
  its own term is committed (the fix Diego Ongaro posted to raft-dev in 2015 for the bug in the thesis'
  original rule; `Raft` enforces both with `pending_conf_index`).
- A leader removed by a change keeps leading, without counting itself, until the change commits, then
  steps down (thesis §4.2.2).

Because consecutive configurations differ by one server, any majority of one overlaps any majority of the
next, which is what keeps two leaders from being elected in one term.

This module owns `ConfigHistory`, the list of (index, configuration) pairs of the log above the snapshot.
Invariant: indexes strictly increase; entry 0 is the configuration at the snapshot (the base).
"""

from __future__ import annotations

import bisect

from .messages import ConfChange, ConfState, Entry, EntryType


class ConfigHistory:
    def __init__(self, base_index: int, base: ConfState) -> None:
        self._indexes: list[int] = [base_index]
        self._confs: list[ConfState] = [base]

    @property
    def current(self) -> ConfState:
        return self._confs[-1]

    @property
    def current_index(self) -> int:
        """Index of the entry that made the current configuration (the snapshot index for the base)."""
        return self._indexes[-1]

    def reset(self, base_index: int, base: ConfState) -> None:
        self._indexes = [base_index]
        self._confs = [base]

    def observe(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Record the configuration changes among `entries` (appended in index order)."""
        for e in entries:
            if e.type is EntryType.CONF_CHANGE:
                assert e.index > self._indexes[-1], f"configuration at {e.index} after {self._indexes[-1]}"
                self._indexes.append(e.index)
                self._confs.append(ConfChange.decode(e.data).apply_to(self._confs[-1]))

    def truncate_after(self, index: int) -> None:
        """Forget changes from entries after `index` (the log was truncated there)."""
        while len(self._indexes) > 1 and self._indexes[-1] > index:
            self._indexes.pop()
            self._confs.pop()

    def at(self, index: int) -> ConfState:
        """The configuration in force once entry `index` is in the log (index >= the base index)."""
        pos = bisect.bisect_right(self._indexes, index) - 1
        if pos < 0:
            raise ValueError(f"configuration at {index} is below the snapshot at {self._indexes[0]}")
        return self._confs[pos]

    def compact_to(self, index: int) -> None:
        """Drop history below `index`, keeping the configuration in force at `index` as the base."""
        pos = bisect.bisect_right(self._indexes, index) - 1
        if pos > 0:
            del self._indexes[:pos]
            del self._confs[:pos]
