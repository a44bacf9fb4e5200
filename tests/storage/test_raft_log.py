"""Durable Raft storage (raft_log.py): the shared WAL, per-group segment files, snapshots, crashes.

The model used throughout: a `MemoryStorage` per group fed the same writes. After a crash the recovered
state of every group must equal the model's state after *some* prefix of the writes made since the last
completed sync (the WAL is a prefix; snapshot files are durable at once).
"""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.raft.messages import ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMeta
from hutch.raft.storage import CompactedError, MemoryStorage
from hutch.storage.errors import CorruptRecord
from hutch.storage.log import LogOptions
from hutch.storage.memfs import MemoryFS
from hutch.storage.raft_log import DiskStorage, RaftLogOptions, RaftLogStore, RaftWal

ROOT = "/data/raft"
SMALL = RaftLogOptions(wal_max_size_bytes=1 << 30, segment_max_entries=4,
                       wal=LogOptions(segment_max_bytes=512, max_batch_bytes=1 << 20))


def ents(lo: int, hi: int, term: int = 1, tag: str = "") -> list[Entry]:
    return [Entry(term, i, EntryType.NORMAL, f"{tag}{term}:{i}".encode()) for i in range(lo, hi + 1)]


def open_store(fs: MemoryFS, options: RaftLogOptions = SMALL) -> RaftLogStore:
    return RaftLogStore.open(fs, ROOT, options)


def state_of(s: DiskStorage | MemoryStorage) -> tuple[object, ...]:
    first, last = s.first_index(), s.last_index()
    body = s.entries(first, last + 1, 1 << 60) if last >= first else []
    return (s.initial_state()[0], first, s.term(first - 1), tuple(body))


def test_synced_entries_and_hard_state_survive_a_crash() -> None:
    fs = MemoryFS(seed=1)
    store = open_store(fs)
    g = store.group(7)
    g.append(ents(1, 5))
    g.set_hard_state(HardState(term=1, vote=2, commit=3))
    store.sync()
    fs.crash()
    g2 = open_store(fs).group(7)
    assert g2.entries(1, 6, 1 << 30) == ents(1, 5)
    assert g2.initial_state()[0] == HardState(1, 2, 3)
    assert (g2.first_index(), g2.last_index(), g2.term(0)) == (1, 5, 0)


def test_unsynced_writes_may_vanish_but_never_corrupt() -> None:
    for seed in range(40):
        fs = MemoryFS(seed=seed)
        store = open_store(fs)
        model = MemoryStorage()
        g = store.group(1)
        for target in (g, model):
            target.append(ents(1, 3))
        store.sync()
        states = [state_of(model)]
        for i in range(4, 10):
            for target in (g, model):
                target.append(ents(i, i, tag="x" * seed))
            states.append(state_of(model))
        fs.crash()
        assert state_of(open_store(fs).group(1)) in states


def test_overwrite_at_an_index_survives_recovery_and_drops_the_suffix() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    g = store.group(1)
    g.append(ents(1, 6, term=1))
    store.sync()
    g.append(ents(4, 5, term=2))  # a follower's log truncation
    store.sync()
    fs.crash()
    g2 = open_store(fs).group(1)
    assert g2.entries(1, 6, 1 << 30) == ents(1, 3, term=1) + ents(4, 5, term=2)
    assert g2.last_index() == 5


def test_many_groups_share_one_fdatasync() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    before = fs.stats.syncs
    for gid in range(100):
        store.group(gid).append(ents(1, 3, tag=str(gid)))
        store.group(gid).set_hard_state(HardState(1, gid, 1))
    store.sync()
    assert fs.stats.syncs - before == 1
    fs.crash()
    store = open_store(fs)
    assert store.groups() == list(range(100))
    assert store.group(42).entries(1, 4, 1 << 30) == ents(1, 3, tag="42")
    assert store.group(42).hard_state == HardState(1, 42, 1)


def test_begin_sync_job_is_one_group_commit() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    store.group(1).append(ents(1, 2))
    store.group(2).append(ents(1, 2))
    job = store.begin_sync()
    assert job is not None
    store.group(3).append(ents(1, 1))  # appended while the job is in flight: the next batch
    job.run()
    job.complete()
    fs.crash(torn=False)
    store = open_store(fs)
    assert store.group(1).last_index() == 2 and store.group(2).last_index() == 2
    assert store.group(3).last_index() == 0


def test_flush_moves_entries_to_segment_files_and_starts_a_new_wal() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    for gid in (1, 2):
        store.group(gid).append(ents(1, 10, tag=str(gid)))
    store.sync()
    store.flush()
    assert store.gen == 1 and not fs.exists(f"{ROOT}/wal-00000000")
    segs = [n for n in fs.list_dir(f"{ROOT}/g1") if n.endswith(".rseg")]
    assert len(segs) == 3  # 10 entries in segments of at most 4
    store.group(1).append(ents(11, 12, tag="1"))  # tops up the partial last segment at the next flush
    store.group(1).append(ents(9, 9, term=2))  # and truncates inside a flushed segment
    store.sync()
    store.flush()
    expected = ents(1, 8, tag="1") + ents(9, 9, term=2)
    assert store.group(1).entries(1, 10, 1 << 30) == expected
    fs.crash()
    store = open_store(fs)
    assert store.group(1).entries(1, 10, 1 << 30) == expected
    assert store.group(1).last_index() == 9
    assert store.group(2).entries(1, 11, 1 << 30) == ents(1, 10, tag="2")
    assert sorted(n for n in fs.list_dir(f"{ROOT}/g1") if n.endswith(".rseg")) == \
        sorted(s.name for s in store.state(1).segments)


def test_flush_is_triggered_by_wal_max_size() -> None:
    fs = MemoryFS()
    opts = RaftLogOptions(wal_max_size_bytes=2000, segment_max_entries=16)
    store = open_store(fs, opts)
    for i in range(1, 200):
        store.group(1).append(ents(i, i, tag="p" * 20))
        store.sync()
    assert store.flushes >= 2
    fs.crash()
    assert open_store(fs, opts).group(1).entries(1, 200, 1 << 30) == [e for i in range(1, 200)
                                                                       for e in ents(i, i, tag="p" * 20)]


class Crash(Exception):
    pass


class CrashingFS:
    """Delegates to a MemoryFS; raises Crash at the `budget`-th mutating operation (before doing it)."""

    MUTATING = {"open_append", "delete", "rename", "truncate", "fsync_dir", "make_dirs", "remove_dir"}

    def __init__(self, inner: MemoryFS, budget: int) -> None:
        self.inner = inner
        self.budget = budget

    def _tick(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise Crash()

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if name not in self.MUTATING:
            return attr

        def call(*args: object, **kwargs: object) -> object:
            self._tick()
            result = attr(*args, **kwargs)
            return CrashingHandle(self, result) if name == "open_append" else result
        return call


class CrashingHandle:
    def __init__(self, fs: CrashingFS, inner: object) -> None:
        self.fs = fs
        self.inner = inner

    def write(self, data: bytes) -> None:
        self.fs._tick()
        self.inner.write(data)  # type: ignore[attr-defined]

    def sync(self) -> None:
        self.fs._tick()
        self.inner.sync()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


def build_flush_scenario(fs: object) -> tuple[RaftLogStore, dict[int, tuple[object, ...]]]:
    store = RaftLogStore.open(fs, ROOT, SMALL)  # type: ignore[arg-type]
    for gid in (1, 2, 3):
        g = store.group(gid)
        g.append(ents(1, 6, tag=str(gid)))
    store.sync()
    store.flush()
    store.group(1).append(ents(5, 9, term=2))  # truncation into flushed segments
    store.group(2).append(ents(7, 7, tag="2"))
    store.group(3).set_hard_state(HardState(3, 1, 4))
    store.create_snapshot(3, 4, ConfState((1, 2)), b"state")
    store.compact(3, 4)
    store.sync()
    return store, {gid: state_of(store.group(gid)) for gid in (1, 2, 3)}


@pytest.mark.parametrize("torn", [False, True])
def test_a_crash_at_every_step_of_a_flush_recovers_the_same_state(torn: bool) -> None:
    step = 0
    while True:
        fs = MemoryFS(seed=step)
        store, expected = build_flush_scenario(fs)
        crashing = CrashingFS(fs, step)
        store.fs = crashing  # type: ignore[assignment]
        store.wal.log.fs = crashing  # type: ignore[assignment]
        try:
            store.flush()
            done = True
        except Crash:
            done = False
        fs.crash(torn=torn)
        recovered = open_store(fs)
        assert {gid: state_of(recovered.group(gid)) for gid in (1, 2, 3)} == expected, step
        assert recovered.snapshot_of(3).data == b"state"
        # and the recovered store keeps working
        recovered.group(2).append(ents(8, 8))
        recovered.sync()
        recovered.flush()
        fs.crash()
        assert open_store(fs).group(2).last_index() == 8
        if done:
            break
        step += 1
    assert step >= 20  # the scenario's flush does 26 mutating operations


def test_snapshot_and_compaction_survive_and_delete_segment_files() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    g = store.group(1)
    g.append(ents(1, 20))
    store.sync()
    store.flush()
    assert len(store.state(1).segments) == 5
    snap = g.create_snapshot(14, ConfState((1, 2, 3)), b"app-state")
    assert snap.meta == SnapshotMeta(14, 1, ConfState((1, 2, 3)))
    g.compact(12)
    store.sync()  # the compaction record is durable: whole segments below 12 go now
    names = [n for n in fs.list_dir(f"{ROOT}/g1") if n.endswith(".rseg")]
    assert len(names) == 2  # 1..4, 5..8 and 9..12 were wholly compacted: deleted
    with pytest.raises(CompactedError):
        g.entries(12, 14, 1 << 30)
    fs.crash()
    g2 = open_store(fs).group(1)
    assert (g2.first_index(), g2.last_index(), g2.term(12)) == (13, 20, 1)
    assert g2.snapshot() == Snapshot(SnapshotMeta(14, 1, ConfState((1, 2, 3))), b"app-state")
    assert g2.initial_state()[1] == ConfState((1, 2, 3))
    assert g2.entries(13, 21, 1 << 30) == ents(13, 20)


def test_compaction_lost_in_a_crash_keeps_the_entries() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    g = store.group(1)
    g.append(ents(1, 8))
    store.sync()
    g.create_snapshot(6, ConfState((1,)), b"s")
    g.compact(6)  # not synced
    fs.crash(torn=False)
    g2 = open_store(fs).group(1)
    assert (g2.first_index(), g2.last_index()) == (1, 8)
    assert g2.snapshot().index == 6


def test_apply_snapshot_replaces_the_log_even_if_its_wal_record_is_lost() -> None:
    for keep_record in (False, True):
        fs = MemoryFS()
        store = open_store(fs)
        g = store.group(1)
        g.append(ents(1, 10, term=1))
        store.sync()
        store.flush()
        snap = Snapshot(SnapshotMeta(8, 3, ConfState((1, 2))), b"leader-state")
        g.apply_snapshot(snap)
        g.append(ents(9, 9, term=3))
        if keep_record:
            store.sync()
        fs.crash(torn=False)
        g2 = open_store(fs).group(1)
        assert g2.snapshot() == snap
        assert g2.first_index() == 9 and g2.term(8) == 3
        assert g2.last_index() == (9 if keep_record else 8)


def test_damage_in_a_segment_file_is_reported() -> None:
    fs = MemoryFS()
    store = open_store(fs)
    store.group(1).append(ents(1, 3))
    store.sync()
    store.flush()
    name = store.state(1).segments[0].name
    fs.poke(f"{ROOT}/g1/{name}", 30)
    store = open_store(fs)
    with pytest.raises(CorruptRecord):
        store.group(1).entries(1, 4, 1 << 30)


def test_raft_wal_recover_replays_without_a_manifest() -> None:
    fs = MemoryFS()
    wal = RaftWal.open(fs, "/w")
    wal.append(1, ents(1, 5))
    wal.append(2, ents(1, 2))
    wal.append(1, ents(3, 3, term=2))
    wal.set_hard_state(2, HardState(2, 1, 1))
    wal.sync()
    fs.crash()
    groups = RaftWal.open(fs, "/w").recover()
    assert groups[1].mem == ents(1, 2) + ents(3, 3, term=2)
    assert groups[2].hard_state == HardState(2, 1, 1)


def test_segment_max_entries_is_bounded() -> None:
    with pytest.raises(ValueError):
        RaftLogOptions(segment_max_entries=65536)


# -- property: random writes, syncs, flushes and crashes against MemoryStorage models ------------------
op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 2), st.integers(0, 3), st.integers(1, 5)),
    st.tuples(st.just("hs"), st.integers(1, 2), st.integers(0, 9), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("sync")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("compact"), st.integers(1, 2), st.integers(0, 4)),
    st.tuples(st.just("crash"), st.booleans()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), seed=st.integers(0, 1000))
def test_recovery_matches_a_prefix_of_what_was_written(ops: list[tuple], seed: int) -> None:
    fs = MemoryFS(seed=seed)
    store = open_store(fs)
    models = {1: MemoryStorage(), 2: MemoryStorage()}
    term = 1

    def snapshot_all() -> dict[int, tuple[object, ...]]:
        return {gid: state_of(m) for gid, m in models.items()}

    candidates = [snapshot_all()]  # the states a crash may recover (since the last completed sync)
    for o in ops:
        kind = o[0]
        if kind == "append":
            _, gid, back, count = o
            m = models[gid]
            # Raft never overwrites a committed entry, and a snapshot covers only committed entries.
            start = max(m.last_index() + 1 - back, m.first_index(), m.snapshot().index + 1)
            term += 1
            new = ents(start, start + count - 1, term=term, tag=str(gid))
            m.append(new)
            store.group(gid).append(new)
        elif kind == "hs":
            _, gid, t, v, c = o
            hs = HardState(t, v, min(c, models[gid].last_index()))
            models[gid].set_hard_state(hs)
            store.group(gid).set_hard_state(hs)
        elif kind == "compact":
            _, gid, back = o
            m = models[gid]
            idx = m.last_index() - back
            if idx < m.first_index():
                continue
            # The application snapshots only what it applied, and the driver persists before applying:
            # the entries are synced (a snapshot of unsynced entries would survive a crash that they do not).
            store.sync()
            candidates = [snapshot_all()]
            snap_m = m.create_snapshot(idx, ConfState((1,)), b"d")
            snap_d = store.group(gid).create_snapshot(idx, ConfState((1,)), b"d")
            assert snap_m.meta == snap_d.meta
            m.compact(idx)
            store.group(gid).compact(idx)
        elif kind in ("sync", "flush"):
            store.sync()
            if kind == "flush":
                store.flush()
            candidates = []
        elif kind == "crash":
            fs.crash(torn=o[1])
            store = open_store(fs)
            recovered = {gid: state_of(store.group(gid)) for gid in models}
            assert recovered in candidates
            for gid in models:  # the models become what was recovered
                m = MemoryStorage()
                g = store.group(gid)
                m._snapshot = g.snapshot()
                m._ents = [Entry(g.term(g.first_index() - 1), g.first_index() - 1)]
                m.append(g.entries(g.first_index(), g.last_index() + 1, 1 << 60)
                         if g.last_index() >= g.first_index() else [])
                m.set_hard_state(g.hard_state)
                models[gid] = m
            candidates = []
        candidates.append(copy.deepcopy(snapshot_all()))
        live = {gid: state_of(store.group(gid)) for gid in models}
        assert live == candidates[-1]


def test_a_single_node_raft_group_runs_and_restarts_on_disk_storage() -> None:
    import random

    from hutch.raft import Config, RawNode
    from hutch.raft.storage import bootstrap_entries

    def drive(node: RawNode, store: RaftLogStore, storage: DiskStorage, applied: list[bytes]) -> None:
        while node.has_ready():
            rd = node.ready()
            if rd.snapshot:
                storage.apply_snapshot(rd.snapshot)
            storage.append(list(rd.entries))
            if rd.hard_state:
                storage.set_hard_state(rd.hard_state)
            store.sync()
            applied.extend(e.data for e in rd.committed_entries if e.type == EntryType.NORMAL and e.data)
            node.advance(rd)

    fs = MemoryFS()
    store = open_store(fs, RaftLogOptions(wal_max_size_bytes=600, segment_max_entries=3))
    storage = store.group(5)
    boot, hs = bootstrap_entries([1])
    storage.append(boot)
    storage.set_hard_state(hs)
    store.sync()
    node = RawNode(Config(id=1, rng=random.Random(1)), storage)
    node.campaign()
    applied: list[bytes] = []
    drive(node, store, storage, applied)
    for i in range(20):
        node.propose(f"cmd{i}".encode())
        drive(node, store, storage, applied)
    assert applied == [f"cmd{i}".encode() for i in range(20)]
    assert store.flushes > 0
    fs.crash()
    store = open_store(fs, RaftLogOptions(wal_max_size_bytes=600, segment_max_entries=3))
    storage = store.group(5)
    node = RawNode(Config(id=1, rng=random.Random(2)), storage)
    applied = []
    drive(node, store, storage, applied)
    assert applied == [f"cmd{i}".encode() for i in range(20)]  # everything committed is there again
    assert node.status().term >= 2


def test_a_flush_failing_at_its_commit_point_poisons_the_store() -> None:
    from hutch.raft.storage import StorageError as RaftStorageError

    fs = MemoryFS()
    store = open_store(fs)
    store.group(1).append(ents(1, 3))
    store.sync()
    crashing = CrashingFS(fs, 10_000)
    store.fs = crashing  # type: ignore[assignment]
    store.wal.log.fs = crashing  # type: ignore[assignment]
    real_rename = fs.rename

    def failing_rename(src: str, dst: str) -> None:
        real_rename(src, dst)
        raise Crash()
    fs.rename = failing_rename  # type: ignore[method-assign]
    with pytest.raises(Crash):
        store.flush()
    with pytest.raises(RaftStorageError):
        store.group(1).append(ents(4, 4))
    fs.rename = real_rename  # type: ignore[method-assign]
    fs.crash()
    assert open_store(fs).group(1).entries(1, 4, 1 << 30) == ents(1, 3)


def test_delete_group_removes_it_for_good_and_a_crash_before_the_sync_keeps_it() -> None:
    fs = MemoryFS()
    store = RaftLogStore.open(fs, "/r")
    for gid in (7, 8):
        store.append(gid, [Entry(1, 1, EntryType.NORMAL, b"x")])
        store.create_snapshot(gid, 1, ConfState((1,)), b"state")
    store.sync()
    store.delete_group(7)
    assert store.groups() == [8]
    assert fs.exists("/r/g7")  # not before the DELETE record is durable
    store.sync()
    assert not fs.exists("/r/g7")
    again = RaftLogStore.open(fs, "/r")
    assert again.groups() == [8]
    assert again.snapshot_of(7).index == 0


def test_a_crash_between_the_delete_record_and_the_directory_removal_finishes_at_open() -> None:
    fs = MemoryFS()
    store = RaftLogStore.open(fs, "/r")
    store.append(7, [Entry(1, 1, EntryType.NORMAL, b"x")])
    store.create_snapshot(7, 1, ConfState((1,)), b"state")
    store.sync()
    store.delete_group(7)
    store.wal.sync()  # the record is durable but _after_sync never ran (a crash right here)
    fs.crash()
    again = RaftLogStore.open(fs, "/r")
    assert again.groups() == []
    assert not fs.exists("/r/g7")


def test_a_crash_before_the_delete_record_is_synced_keeps_the_group() -> None:
    fs = MemoryFS()
    store = RaftLogStore.open(fs, "/r")
    store.append(7, [Entry(1, 1, EntryType.NORMAL, b"x")])
    store.sync()
    store.delete_group(7)
    fs.crash()
    again = RaftLogStore.open(fs, "/r")
    assert again.groups() == [7]



def test_the_sync_journal_fault_hook_records_durable_lengths_only_when_enabled(tmp_path, monkeypatch) -> None:
    """HUTCH_FAULT_SYNC_JOURNAL (tests/cluster/test_quorum_storage_faults.py's power cut): off, the store's
    file system is not wrapped; on, each file's last journaled length is what was fsynced."""
    from hutch.storage.fs import RealFS
    from hutch.storage.raft_log import FAULT_SYNC_JOURNAL_ENV, SyncJournalFS

    def journaled() -> dict[str, int]:
        durable: dict[str, int] = {}
        for line in journal.read_text().splitlines():
            length, path = line.split(" ", 1)
            durable[path] = int(length)
        return durable

    monkeypatch.delenv(FAULT_SYNC_JOURNAL_ENV, raising=False)
    fs = RealFS()
    plain = RaftLogStore.open(fs, str(tmp_path / "plain"), SMALL)
    assert plain.fs is fs
    plain.close()
    journal = tmp_path / "journal"
    monkeypatch.setenv(FAULT_SYNC_JOURNAL_ENV, str(journal))
    root = tmp_path / "raft"
    store = RaftLogStore.open(fs, str(root), SMALL)
    assert isinstance(store.fs, SyncJournalFS)
    g = store.group(1)
    g.append(ents(1, 3))
    store.sync()
    g.append(ents(4, 6))
    store.flush()  # syncs the WAL, writes and syncs segment files, replaces the MANIFEST (a rename)
    g.append(ents(7, 7))
    store.sync()
    files = sorted(str(p) for p in root.rglob("*") if p.is_file())
    assert any(f.endswith(".rseg") for f in files) and str(root / "MANIFEST") in files
    durable = journaled()
    assert {f: durable.get(f) for f in files} == {f: os.path.getsize(f) for f in files}  # all synced
    handle = store.fs.open_append(str(root / "extra"))
    handle.write(b"abc")
    assert journaled()[str(root / "extra")] == 0  # created, nothing durable yet
    handle.sync()
    handle.write(b"de")  # never synced
    assert journaled()[str(root / "extra")] == 3
    handle.close()
    store.close()


def test_segments_are_closed_by_bytes_too_and_a_top_up_drops_what_was_compacted() -> None:
    """Entries may be large batches: a segment is closed at segment_max_bytes as well as at
    segment_max_entries, and topping up the partial last segment leaves out the entries compacted
    since, so a long-lived group with few, big entries does not carry its whole history in one file."""
    fs = MemoryFS()
    options = RaftLogOptions(wal_max_size_bytes=1 << 30, segment_max_entries=100, segment_max_bytes=3000,
                             wal=SMALL.wal)
    store = open_store(fs, options)
    g = store.group(1)
    big = [Entry(1, i, EntryType.NORMAL, bytes([i]) * 1000) for i in range(1, 8)]
    g.append(big)
    store.sync()
    store.flush()
    refs = store.state(1).segments
    assert [(r.first, r.last) for r in refs] == [(1, 3), (4, 6), (7, 7)]  # 3 x ~1 kB, not 100 entries
    g.create_snapshot(7, ConfState((1,)), b"s")
    g.compact(6)
    g.append([Entry(1, 8, EntryType.NORMAL, b"x" * 10)])
    store.sync()
    store.flush()  # tops up 7..7 with 8
    refs = store.state(1).segments
    assert [(r.first, r.last) for r in refs] == [(7, 8)]
    g.create_snapshot(8, ConfState((1,)), b"s2")
    g.compact(7)
    g.append([Entry(1, 9, EntryType.NORMAL, b"y" * 10)])
    store.sync()
    store.flush()  # the top-up leaves entry 7 (compacted) out of the new file
    refs = store.state(1).segments
    assert [(r.first, r.last) for r in refs] == [(8, 9)]
    names = [n for n in fs.list_dir(f"{ROOT}/g1") if n.endswith(".rseg")]
    assert len(names) == 1 and fs.size(f"{ROOT}/g1/{names[0]}") < 200
    fs.crash()
    g2 = open_store(fs, options).group(1)
    assert (g2.first_index(), g2.last_index()) == (8, 9)
    assert [e.data for e in g2.entries(8, 10, 1 << 30)] == [b"x" * 10, b"y" * 10]
