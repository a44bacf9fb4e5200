"""Safety properties of Raft, checked by the simulator after every step.

Owns the oracle of what the cluster has committed and the checks against it:
- Election safety: at most one leader per term.
- Log matching: an (index, term) pair names one entry, with one predecessor term, on every node that
  ever persisted it (by induction, logs that share an (index, term) share their whole prefix).
- Leader completeness: a node that becomes leader holds every entry committed so far.
- State machine safety: nodes apply the same entry at each index; a snapshot equals the committed prefix.
- Committed entries are never lost: every node's committed prefix agrees with the oracle, across crashes
  and restarts (a lost committed entry shows up as a leader without it, or a disagreeing commit).
"""

from __future__ import annotations

from hutch.raft import Entry, EntryType, RawNode, StateType
from hutch.raft.storage import CompactedError, MemoryStorage, StorageError


class SimViolation(AssertionError):
    """A safety or liveness property failed; the message says which and how to replay it."""


def decode_commands(data: bytes) -> list[bytes]:
    return data.split(b"\n") if data else []


def encode_commands(commands: list[bytes]) -> bytes:
    return b"\n".join(commands)


class Checker:
    def __init__(self) -> None:
        self.leader_of_term: dict[int, int] = {}
        self.committed: dict[int, Entry] = {}  # the oracle: index -> the entry committed there
        self.max_committed = 0
        self.entry_ids: dict[tuple[int, int], tuple[EntryType, bytes, int]] = {}
        self.checked_commit: dict[int, int] = {}  # node -> commit index verified against the oracle
        self.leaderships: set[tuple[int, int]] = set()
        self.violations = 0

    def fail(self, what: str) -> None:
        raise SimViolation(what)

    # -- hooks called by the driver ------------------------------------------------------------

    def on_persist(self, node_id: int, ents: list[Entry], storage: MemoryStorage) -> None:
        prev_term = None
        for e in ents:
            if prev_term is None:
                try:
                    prev_term = storage.term(e.index - 1)
                except StorageError:
                    prev_term = -1  # below the snapshot or beyond the log: cannot tell
            key = (e.index, e.term)
            val = (e.type, e.data, prev_term)
            seen = self.entry_ids.get(key)
            if seen is None:
                if prev_term >= 0:
                    self.entry_ids[key] = val
            elif seen[:2] != val[:2] or (prev_term >= 0 and seen[2] != prev_term):
                self.fail(f"log matching: node {node_id} persisted {key} as {val}, seen before as {seen}")
            prev_term = e.term

    def on_restart(self, node_id: int) -> None:
        self.checked_commit.pop(node_id, None)

    def on_apply(self, node_id: int, applied_index: int, e: Entry) -> None:
        if e.index != applied_index + 1:
            self.fail(f"node {node_id} applied index {e.index} after {applied_index}")
        want = self.committed.get(e.index)
        if want is None:
            self._record(e)
        elif want != e:
            self.fail(f"state machine safety: node {node_id} applied {e} at {e.index}, committed is {want}")

    def on_apply_snapshot(self, node_id: int, index: int, commands: list[bytes]) -> None:
        expected = [
            e.data
            for i in range(1, index + 1)
            if (e := self.committed.get(i)) is not None and e.type is EntryType.NORMAL and e.data
        ]
        missing = [i for i in range(1, index + 1) if i not in self.committed]
        if not missing and expected != commands:
            self.fail(f"state machine safety: node {node_id} snapshot at {index} differs from the committed log")

    def _record(self, e: Entry) -> None:
        self.committed[e.index] = e
        if e.index > self.max_committed:
            self.max_committed = e.index

    # -- after every step ----------------------------------------------------------------------

    def check(self, nodes: dict[int, RawNode]) -> None:
        for node_id, raw in nodes.items():
            r = raw.raft
            if r.state is StateType.LEADER:
                holder = self.leader_of_term.setdefault(r.term, node_id)
                if holder != node_id:
                    self.fail(f"election safety: nodes {holder} and {node_id} both leader in term {r.term}")
                if (node_id, r.term) not in self.leaderships:
                    self.leaderships.add((node_id, r.term))
                    self._check_leader_complete(node_id, raw)
            self._check_commits(node_id, raw)

    def _check_commits(self, node_id: int, raw: RawNode) -> None:
        log = raw.raft.log
        start = self.checked_commit.get(node_id)
        if start is None:
            start = log.first_index() - 1
        if log.committed <= start:
            self.checked_commit[node_id] = max(start, log.committed)
            return
        ents = log.slice(max(start + 1, log.first_index()), log.committed + 1)
        for e in ents:
            want = self.committed.get(e.index)
            if want is None:
                self._record(e)
            elif want != e:
                self.fail(f"committed entry lost or changed: node {node_id} has {e} committed, oracle {want}")
        self.checked_commit[node_id] = log.committed

    def _check_leader_complete(self, node_id: int, raw: RawNode) -> None:
        log = raw.raft.log
        for i in range(log.first_index(), self.max_committed + 1):
            want = self.committed.get(i)
            if want is None:
                continue
            try:
                have = log.term(i)
            except CompactedError:
                continue
            if have != want.term:
                self.fail(
                    f"leader completeness: node {node_id} leader of term {raw.raft.term} lacks committed "
                    f"entry {i} (term {want.term}); it has term {have}"
                )
