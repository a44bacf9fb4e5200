"""Pure tests of the Raft log, storage, progress and membership pieces (no cluster)."""

from __future__ import annotations

import pytest

from hutch.raft import (
    CompactedError,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    RaftSafetyError,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)
from hutch.raft.log import RaftLog
from hutch.raft.membership import ConfigHistory
from hutch.raft.progress import Inflights, Progress, ProgressState, ProgressTracker, VoteResult


def ents(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(t, start + i, data=b"%d" % (start + i)) for i, t in enumerate(terms)]


def test_memory_storage_append_truncates_and_compacts() -> None:
    st = MemoryStorage()
    st.append(ents(1, 1, 2, 2))
    st.append([Entry(3, 3)])
    assert st.last_index() == 3 and st.term(3) == 3
    st.create_snapshot(2, ConfState((1,)), b"s")
    st.compact(2)
    assert st.first_index() == 3 and st.term(2) == 1
    with pytest.raises(CompactedError):
        st.entries(2, 3, 1 << 20)
    with pytest.raises(UnavailableError):
        st.entries(3, 9, 1 << 20)
    assert st.entries(3, 4, 0) == [Entry(3, 3)]  # at least one entry, even over the byte limit


def test_unstable_and_stable_union() -> None:
    st = MemoryStorage()
    st.append(ents(1, 1))
    log = RaftLog(st)
    log.append(ents(2, 2, start=3))
    assert log.last_index() == 4 and log.term(2) == 1 and log.term(4) == 2
    assert [e.index for e in log.slice(1, 5)] == [1, 2, 3, 4]
    log.stable_to(3, 2)
    assert log.unstable.offset == 4
    log.stable_to(4, 9)  # wrong term: the entry was replaced since, nothing becomes stable
    assert log.unstable.offset == 4


def test_maybe_append_truncates_conflicts_but_never_committed() -> None:
    log = RaftLog(MemoryStorage())
    log.append(ents(1, 1, 1, 2, 2))
    log.commit_to(3)
    assert log.maybe_append(3, 1, 5, tuple(ents(3, 3, start=4))) == 5
    assert [log.term(i) for i in range(1, 6)] == [1, 1, 1, 3, 3]
    assert log.committed == 5
    assert log.maybe_append(5, 9, 5, ()) is None  # previous entry does not match
    with pytest.raises(RaftSafetyError):
        log.append(ents(4, start=3))


def test_find_conflict_by_term_skips_a_term_per_step() -> None:
    log = RaftLog(MemoryStorage())
    log.append(ents(1, 1, 2, 2, 2, 5, 5))
    assert log.find_conflict_by_term(7, 3) == (5, 2)
    assert log.find_conflict_by_term(7, 1) == (2, 1)
    assert log.find_conflict_by_term(7, 9) == (7, 5)


def test_restore_snapshot_resets_log_and_config() -> None:
    log = RaftLog(MemoryStorage())
    log.append(ents(1, 1))
    snap = Snapshot(SnapshotMeta(10, 3, ConfState((1, 2))), b"x")
    log.restore(snap)
    assert log.committed == 10 and log.last_index() == 10 and log.first_index() == 11
    assert log.config.current == ConfState((1, 2))
    assert log.next_committed_entries() == []  # the snapshot is applied first


def test_config_history_follows_append_and_truncation() -> None:
    h = ConfigHistory(0, ConfState())
    add = [
        Entry(1, i, EntryType.CONF_CHANGE, ConfChange(ConfChangeType.ADD_NODE, i).encode()) for i in (1, 2, 3)
    ]
    h.observe(add)
    assert h.current == ConfState((1, 2, 3)) and h.at(2) == ConfState((1, 2)) and h.current_index == 3
    h.truncate_after(2)
    assert h.current == ConfState((1, 2))
    h.compact_to(2)
    assert h.at(2) == ConfState((1, 2))


def test_inflights_window() -> None:
    inf = Inflights(3, max_bytes=100)
    inf.add(5, 10)
    inf.add(7, 10)
    assert not inf.full()
    inf.add(9, 90)
    assert inf.full()
    inf.free_le(7)
    assert len(inf) == 1 and inf.bytes == 90 and not inf.full()


def test_progress_probe_and_replicate() -> None:
    pr = Progress(next_index=10, match=0, max_inflight=4, max_inflight_bytes=0)
    assert pr.state is ProgressState.PROBE and not pr.is_paused()
    pr.probe_sent = True
    assert pr.is_paused()
    assert not pr.maybe_decr_to(5, 3)  # not the outstanding probe: stale
    assert pr.maybe_decr_to(9, 3) and pr.next == 4 and not pr.is_paused()
    assert pr.maybe_update(6)
    pr.become_replicate()
    assert pr.next == 7
    assert not pr.maybe_decr_to(6, 0)  # at or below match: stale
    assert pr.maybe_decr_to(8, 0) and pr.next == 7


def test_quorum_commit_and_votes() -> None:
    t = ProgressTracker(4, 0)
    t.set_voters((1, 2, 3, 4, 5), 1)
    for v, m in zip((1, 2, 3, 4, 5), (9, 7, 5, 3, 1), strict=True):
        t.progress[v].match = m
    assert t.committed() == 5
    t.record_vote(1, True)
    t.record_vote(2, False)
    t.record_vote(3, False)
    assert t.tally_votes() is VoteResult.PENDING
    t.record_vote(4, False)
    assert t.tally_votes() is VoteResult.LOST
