"""Durable Raft storage: one node-wide write-ahead log shared by every Raft group, per-group segment files,
per-group snapshots (issue 6 item 3; docs/raft.md "On-disk storage").

Owns the on-disk layout under one root directory and its crash-safety protocol:

    root/MANIFEST                 snapshot.py file (checksummed, atomic): the WAL generation in force and,
                                  per group, the hard state, compaction point and segment files
    root/wal-<gen>/               a SegmentedLog (group commit, checksummed batches, torn tail tolerated)
    root/g<group>/<first>-<gen>.rseg   segment files: appendfile.py files of <= segment_max_entries entries
                                  and (but for a single entry) about segment_max_bytes
    root/g<group>/snapshot        the group's latest Raft snapshot (snapshot.py: checksummed, synced)

- `RaftWal`: the WAL record codec and replay rule on top of `SegmentedLog`. One WAL entry per call:
  (kind, group, payload) with kind ENTRIES / HARD_STATE / RESET (a snapshot installed: the log restarts
  after it) / COMPACT / DELETE (the group is gone; group ids are never reused). Later entries at the same (group, index) replace earlier ones and everything after.
- `RaftLogStore`: the node-wide store. Writes go to the WAL and to in-memory tables (`GroupState.mem`);
  `sync()` (or `begin_sync()` + `run()` + `complete()`) is one fdatasync for all groups. When the WAL passes
  `wal_max_size_bytes`, `flush()` moves every group's in-memory entries into segment files, syncs them,
  commits a new MANIFEST naming a fresh empty WAL generation, then deletes the old WAL and replaced files.
- `DiskStorage`: one group's view, implementing the `hutch.raft.storage.Storage` read protocol and the
  `MemoryStorage` write methods, so the driver uses it exactly like `MemoryStorage`.

Pure: no asyncio, threads or clocks; all IO through a `FileSystem`. Imports hutch.raft's value types (also a
pure, stdlib-only package).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from hutch.raft.messages import (
    EMPTY_HARD_STATE,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
)
from hutch.raft.storage import CompactedError, StorageError, UnavailableError, limit_size
from hutch.storage import appendfile, snapshot
from hutch.storage.errors import CorruptRecord, CorruptSnapshot
from hutch.storage.fs import Bytes, DelegatingFS, FileHandle, FileSystem
from hutch.storage.log import LogOptions, SegmentedLog, SyncJob
from hutch.storage.salvage import salvage_log

MANIFEST = "MANIFEST"
MANIFEST_KIND = 0x52  # 'R'
SNAPSHOT_KIND = 0x53  # 'S'
SEGMENT_RECORD_TYPE = 0x31
SEGMENT_SUFFIX = ".rseg"
MAX_SEGMENT_ENTRIES = 65535
FAULT_SYNC_JOURNAL_ENV = "HUTCH_FAULT_SYNC_JOURNAL"  # test-only: see SyncJournalFS

# WAL record kinds
ENTRIES = 1
HARD_STATE = 2
RESET = 3  # a snapshot (index, term) was installed: the group's log is replaced by it
COMPACT = 4  # entries up to index (whose term is given) were discarded
DELETE = 5  # the group was deleted (its directory goes once this record is durable)

_HEAD = struct.Struct("<BQ")  # kind, group
_ENTRY = struct.Struct("<QQBI")  # term, index, type, data length
_HS = struct.Struct("<QQQ")
_POINT = struct.Struct("<QQ")  # index, term
_SNAP_HEAD = struct.Struct("<QQI")  # index, term, voter count


@dataclass(frozen=True)
class RaftLogOptions:
    wal_max_size_bytes: int = 512 * 1024 * 1024
    segment_max_entries: int = 4096
    segment_max_bytes: int = 4 * 1024 * 1024  # a segment is also closed past this (entries can be batches)
    wal: LogOptions = field(default_factory=LogOptions)

    def __post_init__(self) -> None:
        if not 1 <= self.segment_max_entries <= MAX_SEGMENT_ENTRIES:
            raise ValueError(f"segment_max_entries must be 1..{MAX_SEGMENT_ENTRIES}")


# -- codecs -----------------------------------------------------------------------------------------------
def encode_entry(e: Entry) -> bytes:
    return _ENTRY.pack(e.term, e.index, int(e.type), len(e.data)) + e.data


def decode_entries(data: bytes | memoryview, pos: int = 0) -> list[Entry]:
    view = memoryview(data)
    out: list[Entry] = []
    while pos < len(view):
        term, index, etype, length = _ENTRY.unpack_from(view, pos)
        pos += _ENTRY.size
        out.append(Entry(term, index, EntryType(etype), bytes(view[pos:pos + length])))
        pos += length
    return out


def encode_snapshot_payload(snap: Snapshot) -> bytes:
    voters = snap.meta.conf_state.voters
    return (_SNAP_HEAD.pack(snap.index, snap.term, len(voters)) + struct.pack(f"<{len(voters)}Q", *voters)
            + snap.data)


def decode_snapshot_payload(data: bytes) -> Snapshot:
    index, term, n = _SNAP_HEAD.unpack_from(data)
    voters = struct.unpack_from(f"<{n}Q", data, _SNAP_HEAD.size)
    return Snapshot(SnapshotMeta(index, term, ConfState(tuple(voters))), data[_SNAP_HEAD.size + 8 * n:])


# -- per-group state ----------------------------------------------------------------------------------
@dataclass
class SegmentRef:
    """Entries [first, last] of a group, stored in `name` (the file may hold more, past `last`: ignored)."""

    first: int
    last: int
    name: str


@dataclass
class GroupState:
    """A group's log: snapshot/compaction point, then flushed entries (segments), then `mem`.

    Invariant: offset_index < segments' entries < mem entries, consecutive; mem[0].index == flushed_last + 1.
    """

    group: int
    hard_state: HardState = EMPTY_HARD_STATE
    offset_index: int = 0  # entries <= offset_index are gone (snapshot or compaction)
    offset_term: int = 0
    segments: list[SegmentRef] = field(default_factory=list)
    mem: list[Entry] = field(default_factory=list)

    @property
    def flushed_last(self) -> int:
        return self.segments[-1].last if self.segments else self.offset_index

    @property
    def last_index(self) -> int:
        return self.mem[-1].index if self.mem else self.flushed_last

    def apply_entries(self, ents: list[Entry]) -> list[SegmentRef]:
        """MemoryStorage.append's rule; returns the segment refs no longer referenced at all."""
        if not ents:
            return []
        if ents[-1].index <= self.offset_index:
            return []
        if ents[0].index <= self.offset_index:
            ents = ents[self.offset_index + 1 - ents[0].index:]
        first = ents[0].index
        if first > self.last_index + 1:
            raise UnavailableError(f"missing log entry [last: {self.last_index}, append at: {first}]")
        dropped: list[SegmentRef] = []
        if first <= self.flushed_last:
            self.mem = []
            while self.segments and self.segments[-1].first >= first:
                dropped.append(self.segments.pop())
            if self.segments and self.segments[-1].last >= first:
                self.segments[-1].last = first - 1
        else:
            del self.mem[first - self.flushed_last - 1:]
        self.mem.extend(ents)
        assert self.mem[0].index == self.flushed_last + 1, "log entries are not consecutive"
        return dropped

    def reset(self, index: int, term: int) -> list[SegmentRef]:
        dropped = self.segments
        self.segments = []
        self.mem = []
        self.offset_index, self.offset_term = index, term
        return dropped

    def compact_to(self, index: int, term: int) -> list[SegmentRef]:
        if index <= self.offset_index:
            return []
        self.offset_index, self.offset_term = index, term
        dropped = [s for s in self.segments if s.last <= index]
        self.segments = [s for s in self.segments if s.last > index]
        self.mem = [e for e in self.mem if e.index > index]
        return dropped


# -- the WAL ----------------------------------------------------------------------------------------------
class RaftWal:
    """The node-wide write-ahead log: Raft records of every group on one `SegmentedLog`."""

    def __init__(self, log: SegmentedLog) -> None:
        self.log = log
        self.bytes_appended = 0  # payload bytes in this generation (what counts against wal_max_size_bytes)
        self.deleted: set[int] = set()  # groups a replayed DELETE record removed

    @classmethod
    def open(cls, fs: FileSystem, directory: str, options: LogOptions | None = None) -> RaftWal:
        wal = cls(SegmentedLog.open(fs, directory, options))
        return wal

    def _add(self, payload: bytes) -> int:
        self.bytes_appended += len(payload)
        return self.log.append([payload])

    def append(self, group: int, entries: list[Entry] | tuple[Entry, ...]) -> int:
        return self._add(_HEAD.pack(ENTRIES, group) + b"".join(encode_entry(e) for e in entries))

    def set_hard_state(self, group: int, hs: HardState) -> int:
        return self._add(_HEAD.pack(HARD_STATE, group) + _HS.pack(hs.term, hs.vote, hs.commit))

    def reset(self, group: int, index: int, term: int) -> int:
        return self._add(_HEAD.pack(RESET, group) + _POINT.pack(index, term))

    def compact(self, group: int, index: int, term: int) -> int:
        return self._add(_HEAD.pack(COMPACT, group) + _POINT.pack(index, term))

    def delete(self, group: int) -> int:
        return self._add(_HEAD.pack(DELETE, group))

    def begin_sync(self) -> SyncJob | None:
        return self.log.begin_sync()

    def sync(self) -> int:
        return self.log.sync()

    def replay(self, groups: dict[int, GroupState]) -> dict[int, GroupState]:
        """Apply every durable record, in order, to `groups` (created as needed); returns `groups`."""
        for seq, payload in self.log.read_from(self.log.first_seq):
            self.bytes_appended += len(payload)
            try:
                kind, gid = _HEAD.unpack_from(payload)
                if kind == DELETE:
                    groups.pop(gid, None)
                    self.deleted.add(gid)
                    continue
                self.deleted.discard(gid)
                g = groups.get(gid)
                if g is None:
                    g = groups[gid] = GroupState(gid)
                if kind == ENTRIES:
                    g.apply_entries(decode_entries(payload, _HEAD.size))
                elif kind == HARD_STATE:
                    g.hard_state = HardState(*_HS.unpack_from(payload, _HEAD.size))
                elif kind == RESET:
                    g.reset(*_POINT.unpack_from(payload, _HEAD.size))
                elif kind == COMPACT:
                    g.compact_to(*_POINT.unpack_from(payload, _HEAD.size))
                else:
                    raise ValueError(f"unknown record kind {kind}")
            except (struct.error, ValueError, UnavailableError) as exc:
                raise CorruptRecord(self.log.directory, seq, f"bad raft WAL record: {exc}") from exc
        return groups

    def recover(self) -> dict[int, GroupState]:
        """Replay from scratch (no manifest): the state the WAL alone describes."""
        return self.replay({})


# -- the node-wide store ------------------------------------------------------------------------------
def _wal_dir(root: str, gen: int) -> str:
    return f"{root}/wal-{gen:08d}"


def _group_dir(root: str, group: int) -> str:
    return f"{root}/g{group}"


class RaftSyncJob:
    """One group commit: `run()` (any thread) then `complete()` (owner thread) -> synced WAL seq."""

    def __init__(self, store: RaftLogStore, job: SyncJob) -> None:
        self._store = store
        self._job = job

    def run(self) -> None:
        self._job.run()

    def complete(self) -> int:
        synced = self._job.complete()
        self._store._after_sync(synced)
        return synced


class RaftLogStore:
    """Every Raft group of a node: open with `RaftLogStore.open(fs, root)`; `group(id)` -> `DiskStorage`."""

    def __init__(self, fs: FileSystem, root: str, options: RaftLogOptions, gen: int, wal: RaftWal,
                 groups: dict[int, GroupState], snapshots: dict[int, Snapshot]) -> None:
        self.fs = fs
        self.root = root
        self.options = options
        self.gen = gen
        self.wal = wal
        self._groups = groups
        self._snapshots = snapshots
        self._deferred: list[tuple[int, str]] = []  # (wal seq, path): delete once seq is synced
        self._deleted_dirs: list[tuple[int, str]] = []  # (wal seq, group directory): remove once synced
        self._cache: dict[int, tuple[str, list[Entry]]] = {}  # group -> last decoded segment
        self.flushes = 0
        self._failed: BaseException | None = None  # a flush failed at its commit point: reopen the store

    # -- opening and recovery -------------------------------------------------------------------------
    @classmethod
    def open(cls, fs: FileSystem, root: str, options: RaftLogOptions | None = None) -> RaftLogStore:
        options = options or RaftLogOptions()
        journal = os.environ.get(FAULT_SYNC_JOURNAL_ENV)  # read once: unset, the store's fs is untouched
        if journal:
            fs = SyncJournalFS(fs, journal)
        fs.make_dirs(root)
        raw = snapshot.read_snapshot(fs, f"{root}/{MANIFEST}", kind=MANIFEST_KIND)
        gen = 0
        groups: dict[int, GroupState] = {}
        if raw is not None:
            doc = json.loads(raw)
            gen = doc["gen"]
            for gid_s, g in doc["groups"].items():
                gid = int(gid_s)
                groups[gid] = GroupState(gid, HardState(*g["hs"]), g["off"][0], g["off"][1],
                                         [SegmentRef(*s) for s in g["segs"]])
        names = fs.list_dir(root)
        # WAL generations other than the manifest's are an unfinished or finished-but-not-cleaned flush.
        for name in names:
            if name.startswith("wal-") and name != f"wal-{gen:08d}":
                cls._remove_tree(fs, f"{root}/{name}")
        wal = RaftWal.open(fs, _wal_dir(root, gen), options.wal)
        wal.replay(groups)
        for gid in wal.deleted:  # deleted, but the crash came before its directory was removed
            if gid not in groups and fs.exists(_group_dir(root, gid)):
                cls._remove_tree(fs, _group_dir(root, gid))
        names = fs.list_dir(root)
        snapshots: dict[int, Snapshot] = {}
        gids = set(groups) | {int(n[1:]) for n in names if n.startswith("g") and n[1:].isdigit()}
        for gid in sorted(gids):
            g = groups.get(gid)
            snap_path = f"{_group_dir(root, gid)}/snapshot"
            raw_snap = snapshot.read_snapshot(fs, snap_path, kind=SNAPSHOT_KIND) \
                if fs.exists(_group_dir(root, gid)) else None
            if raw_snap is not None:
                snap = decode_snapshot_payload(raw_snap)
                snapshots[gid] = snap
                if g is None:
                    g = groups[gid] = GroupState(gid)
                cls._reconcile_snapshot(g, snap, fs, root)
            if g is not None:
                cls._collect_garbage(fs, root, g)
        return cls(fs, root, options, gen, wal, groups, snapshots)

    @staticmethod
    def _remove_tree(fs: FileSystem, directory: str) -> None:
        names = fs.list_dir(directory)
        for name in names:
            fs.delete(f"{directory}/{name}")
        if names:
            fs.fsync_dir(directory)
        fs.remove_dir(directory)
        fs.fsync_dir(directory.rsplit("/", 1)[0] or "/")

    @classmethod
    def _reconcile_snapshot(cls, g: GroupState, snap: Snapshot, fs: FileSystem, root: str) -> None:
        """The snapshot file is durable before any WAL record about it: if the log does not agree with it
        (its RESET record was lost), the snapshot replaces the log, as `apply_snapshot` does."""
        if snap.index <= g.offset_index:
            return
        if g.last_index >= snap.index and cls._term_of(fs, root, g, snap.index) == snap.term:
            return  # created locally (create_snapshot): the log still holds the entries
        g.reset(snap.index, snap.term)

    @staticmethod
    def _term_of(fs: FileSystem, root: str, g: GroupState, index: int) -> int:
        if g.mem and index >= g.mem[0].index:
            return g.mem[index - g.mem[0].index].term
        for s in g.segments:
            if s.first <= index <= s.last:
                for e in _read_segment(fs, f"{_group_dir(root, g.group)}/{s.name}"):
                    if e.index == index:
                        return e.term
        return -1

    @staticmethod
    def _collect_garbage(fs: FileSystem, root: str, g: GroupState) -> None:
        directory = _group_dir(root, g.group)
        if not fs.exists(directory):
            if g.segments:
                raise CorruptRecord(directory, 0, "group directory missing")
            return
        live = {s.name for s in g.segments}
        removed = False
        for name in fs.list_dir(directory):
            if name.endswith(SEGMENT_SUFFIX) and name not in live or name.endswith(snapshot.TMP_SUFFIX):
                fs.delete(f"{directory}/{name}")
                removed = True
        for s in g.segments:
            if not fs.exists(f"{directory}/{s.name}"):
                raise CorruptRecord(f"{directory}/{s.name}", 0, "segment file named by the manifest is missing")
        if removed:
            fs.fsync_dir(directory)

    # -- groups -------------------------------------------------------------------------------------
    def group(self, group: int) -> DiskStorage:
        return DiskStorage(self, group)

    def groups(self) -> list[int]:
        return sorted(self._groups)

    def state(self, group: int) -> GroupState:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = GroupState(group)
        return g

    def snapshot_of(self, group: int) -> Snapshot:
        return self._snapshots.get(group) or Snapshot(SnapshotMeta(0, 0, ConfState()))

    def delete_group(self, group: int) -> None:
        """Delete a group for good: a DELETE record now; its directory (segments and snapshot) goes once
        that record is synced (a crash in between is finished by `open`). Group ids are never reused."""
        self._check()
        seq = self.wal.delete(group)
        self._groups.pop(group, None)
        self._snapshots.pop(group, None)
        self._cache.pop(group, None)
        directory = _group_dir(self.root, group)
        self._deferred = [(q, path) for q, path in self._deferred if not path.startswith(directory + "/")]
        self._deleted_dirs.append((seq, directory))

    # -- writes (memory + WAL; durable after the next sync) --------------------------------------------
    def append(self, group: int, ents: list[Entry] | tuple[Entry, ...]) -> None:
        self._check()
        ents = list(ents)
        if not ents:
            return
        g = self.state(group)
        dropped = g.apply_entries(ents)  # validates before anything is written
        seq = self.wal.append(group, ents)
        self._defer(group, seq, dropped)

    def set_hard_state(self, group: int, hs: HardState) -> None:
        self._check()
        self.state(group).hard_state = hs
        self.wal.set_hard_state(group, hs)

    def apply_snapshot(self, group: int, snap: Snapshot) -> None:
        """Install a leader's snapshot: the file is written and synced now, the log reset record is in the
        WAL (durable with the next sync; if lost, recovery resets from the file)."""
        if snap.index <= self.snapshot_of(group).index:
            return
        self._write_snapshot(group, snap)
        dropped = self.state(group).reset(snap.index, snap.term)
        self._defer(group, self.wal.reset(group, snap.index, snap.term), dropped)

    def create_snapshot(self, group: int, index: int, conf_state: ConfState, data: bytes) -> Snapshot:
        current = self.snapshot_of(group)
        if index <= current.index:
            return current
        st = self.group(group)
        if index > st.last_index():
            raise UnavailableError(index)
        snap = Snapshot(SnapshotMeta(index, st.term(index), conf_state), data)
        self._write_snapshot(group, snap)
        return snap

    def compact(self, group: int, compact_index: int) -> None:
        self._check()
        g = self.state(group)
        if compact_index <= g.offset_index:
            return
        if compact_index > self.snapshot_of(group).index:
            raise StorageError(f"compact({compact_index}) past the snapshot at {self.snapshot_of(group).index}")
        term = self.group(group).term(compact_index)
        dropped = g.compact_to(compact_index, term)
        self._defer(group, self.wal.compact(group, compact_index, term), dropped)

    def _write_snapshot(self, group: int, snap: Snapshot) -> None:
        self._check()
        directory = _group_dir(self.root, group)
        self.fs.make_dirs(directory)
        snapshot.write_snapshot(self.fs, f"{directory}/snapshot", encode_snapshot_payload(snap), kind=SNAPSHOT_KIND)
        self._snapshots[group] = snap

    def _defer(self, group: int, seq: int, dropped: list[SegmentRef]) -> None:
        # A segment file may only go once the record that makes it unnecessary is durable (and the
        # manifest still names it: recovery tolerates its absence only when the WAL says it is not needed).
        self._cache.pop(group, None)
        for s in dropped:
            self._deferred.append((seq, f"{_group_dir(self.root, group)}/{s.name}"))

    # -- group commit ---------------------------------------------------------------------------------
    def begin_sync(self) -> RaftSyncJob | None:
        self._check()
        job = self.wal.begin_sync()
        return None if job is None else RaftSyncJob(self, job)

    def sync(self) -> int:
        """One fdatasync for everything appended by every group (more if over max_batch_bytes); then
        flush the WAL into segment files if it is over wal_max_size_bytes."""
        while (job := self.begin_sync()) is not None:
            job.run()
            job.complete()
        if self.wal.bytes_appended >= self.options.wal_max_size_bytes:
            self.flush()
        return self.wal.log.synced_seq

    def _after_sync(self, synced: int) -> None:
        if self._deleted_dirs:
            for _seq, directory in [d for d in self._deleted_dirs if d[0] <= synced]:
                if self.fs.exists(directory):
                    self._remove_tree(self.fs, directory)
            self._deleted_dirs = [d for d in self._deleted_dirs if d[0] > synced]
        keep = []
        touched: set[str] = set()
        for seq, path in self._deferred:
            if seq <= synced:
                if self.fs.exists(path):
                    self.fs.delete(path)
                    touched.add(path.rsplit("/", 1)[0])
            else:
                keep.append((seq, path))
        self._deferred = keep
        for directory in sorted(touched):
            self.fs.fsync_dir(directory)

    @property
    def needs_flush(self) -> bool:
        return self.wal.bytes_appended >= self.options.wal_max_size_bytes

    # -- flush: WAL -> segment files ------------------------------------------------------------------
    def flush(self) -> None:
        """Move every group's in-memory entries into segment files and start a new, empty WAL generation.

        Steps (a crash between any two leaves a recoverable state; the MANIFEST rename is the commit point):
        1. sync the WAL; 2. write and sync the new segment files (names carry the new generation, so no
        file the current MANIFEST names is touched); 3. create the new WAL directory; 4. write the MANIFEST
        (atomic, synced); 5. delete the old WAL generation and the segment files no longer named.
        """
        self._check()
        self.wal.sync()
        self._after_sync(self.wal.log.synced_seq)  # deleted groups' directories go before the MANIFEST
        new_gen = self.gen + 1
        n = self.options.segment_max_entries
        plans: dict[int, tuple[list[SegmentRef], list[SegmentRef]]] = {}  # group -> (new refs, replaced)
        for gid, g in self._groups.items():
            if not g.mem:
                continue
            directory = _group_dir(self.root, gid)
            self.fs.make_dirs(directory)
            pending = list(g.mem)
            replaced: list[SegmentRef] = []
            max_bytes = self.options.segment_max_bytes
            if g.segments and g.segments[-1].last - g.segments[-1].first + 1 < n:
                last = g.segments[-1]
                path = f"{directory}/{last.name}"
                if self.fs.size(path) < max_bytes:  # top up the partial last segment: rewrite it, less
                    # what was compacted away meanwhile (else it would carry dead entries forever)
                    first = max(last.first, g.offset_index + 1)
                    old = [e for e in _read_segment(self.fs, path) if first <= e.index <= last.last]
                    pending = old + pending
                    replaced.append(last)
            new_refs = []
            chunks: list[list[Entry]] = []
            i = 0
            while i < len(pending):  # at most n entries and (but for one entry) max_bytes per segment
                j, size = i, 0
                while j < len(pending) and j - i < n and (j == i or size < max_bytes):
                    size += _ENTRY.size + len(pending[j].data)
                    j += 1
                chunks.append(pending[i:j])
                i = j
            for chunk in chunks:
                name = f"{chunk[0].index:020d}-{new_gen:08d}{SEGMENT_SUFFIX}"
                f = appendfile.AppendFile(self.fs, f"{directory}/{name}", SEGMENT_RECORD_TYPE)
                if self.fs.exists(f.path):
                    self.fs.delete(f.path)  # left by an earlier flush that crashed before its manifest
                for e in chunk:
                    f.add(encode_entry(e))
                f.flush()
                f.sync()
                f.close()
                new_refs.append(SegmentRef(chunk[0].index, chunk[-1].index, name))
            plans[gid] = (new_refs, replaced)
        new_wal = RaftWal.open(self.fs, _wal_dir(self.root, new_gen), self.options.wal)
        doc: dict[str, object] = {"gen": new_gen, "groups": {}}
        groups_doc: dict[str, object] = {}
        for gid, g in self._groups.items():
            segs = list(g.segments)
            if gid in plans:
                new_refs, replaced = plans[gid]
                segs = [s for s in segs if s not in replaced] + new_refs
            groups_doc[str(gid)] = {"hs": [g.hard_state.term, g.hard_state.vote, g.hard_state.commit],
                                    "off": [g.offset_index, g.offset_term],
                                    "segs": [[s.first, s.last, s.name] for s in segs]}
        doc["groups"] = groups_doc
        try:
            snapshot.write_snapshot(self.fs, f"{self.root}/{MANIFEST}", json.dumps(doc).encode(),
                                    kind=MANIFEST_KIND)
        except BaseException as exc:
            # The rename may or may not be durable: which WAL generation is in force is unknown, so nothing
            # more may be written to either (the owner reopens the store, which reads the manifest).
            self._failed = exc
            raise
        # Committed. Switch over in memory, then clean up.
        old_dir = self.wal.log.directory
        self.wal.log.close()
        self.wal = new_wal
        self.gen = new_gen
        for gid, (new_refs, replaced) in plans.items():
            g = self._groups[gid]
            g.segments = [s for s in g.segments if s not in replaced] + new_refs
            g.mem = []
            for s in replaced:
                self._deferred.append((0, f"{_group_dir(self.root, gid)}/{s.name}"))
        self._cache.clear()
        self._remove_tree(self.fs, old_dir)
        # The manifest names none of the deferred files any more: delete them all, whatever their seq
        # (seqs of the old generation mean nothing in the new one).
        self._deferred = [(0, path) for _, path in self._deferred]
        self._after_sync(0)
        self.flushes += 1

    # -- reads --------------------------------------------------------------------------------------
    def read_range(self, group: int, lo: int, hi: int) -> list[Entry]:
        """Entries [lo, hi) of a group; the caller checked the bounds."""
        g = self._groups[group]
        out: list[Entry] = []
        for s in g.segments:
            if s.last < lo or s.first >= hi:
                continue
            for e in self._segment(group, s):
                if lo <= e.index < hi and e.index <= s.last:
                    out.append(e)
        if g.mem and hi > g.mem[0].index:
            base = g.mem[0].index
            out.extend(g.mem[max(lo - base, 0):hi - base])
        return out

    def _segment(self, group: int, s: SegmentRef) -> list[Entry]:
        cached = self._cache.get(group)
        if cached is not None and cached[0] == s.name:
            return cached[1]
        ents = _read_segment(self.fs, f"{_group_dir(self.root, group)}/{s.name}")
        self._cache[group] = (s.name, ents)
        return ents

    def close(self) -> None:
        self.wal.log.close()

    def _check(self) -> None:
        if self._failed is not None:
            raise StorageError(f"raft log store at {self.root} failed during a flush; reopen it") from self._failed


def _read_segment(fs: FileSystem, path: str) -> list[Entry]:
    data = fs.read(path)
    _seed, result = appendfile.scan_file(data, path, SEGMENT_RECORD_TYPE)
    if result.torn_tail is not None:  # segment files are synced before the manifest names them
        raise CorruptRecord(path, result.torn_tail.offset, result.torn_tail.reason)
    out: list[Entry] = []
    for record in result.records:
        for raw in appendfile.iter_entries(record.payload):
            out.extend(decode_entries(raw))
    for a, b in zip(out, out[1:], strict=False):
        if b.index != a.index + 1:
            raise CorruptRecord(path, 0, f"entry {b.index} follows {a.index}")
    return out


def offline_entries(fs: FileSystem, root: str, group: int) -> Iterator[Entry]:
    """For offline tools (hutch-storage), read-only: every entry of `group` the store at `root` holds,
    from its segment files and the ENTRIES records of every WAL generation, in no particular order and
    superseded ones included (no manifest is consulted); a file that does not read whole is skipped."""
    gdir = _group_dir(root, group)
    names = sorted(fs.list_dir(gdir)) if fs.exists(gdir) else []
    for name in names:
        if name.endswith(SEGMENT_SUFFIX):
            try:
                yield from _read_segment(fs, f"{gdir}/{name}")
            except (CorruptRecord, ValueError, struct.error):
                continue
    for name in sorted(fs.list_dir(root)) if fs.exists(root) else []:
        if not name.startswith("wal-"):
            continue
        for _seq, payload in salvage_log(fs, f"{root}/{name}").entries:
            try:
                kind, gid = _HEAD.unpack_from(payload)
                if kind == ENTRIES and gid == group:
                    yield from decode_entries(payload, _HEAD.size)
            except (struct.error, ValueError):
                continue


def offline_snapshot(fs: FileSystem, root: str, group: int) -> Snapshot | None:
    """For offline tools, read-only: the snapshot of `group` under `root`, None if none reads."""
    try:
        payload = snapshot.read_snapshot(fs, f"{_group_dir(root, group)}/snapshot", kind=SNAPSHOT_KIND)
        return None if payload is None else decode_snapshot_payload(payload)
    except (CorruptSnapshot, struct.error, ValueError):
        return None


class DiskStorage:
    """One group's durable storage: the raft `Storage` read protocol plus `MemoryStorage`'s write methods.
    Writes are durable after the store's next `sync()` (snapshots: when the call returns)."""

    def __init__(self, store: RaftLogStore, group: int) -> None:
        self.store = store
        self.group_id = group

    @property
    def _g(self) -> GroupState:
        return self.store.state(self.group_id)

    @property
    def hard_state(self) -> HardState:
        return self._g.hard_state

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._g.hard_state, self.store.snapshot_of(self.group_id).meta.conf_state

    def first_index(self) -> int:
        return self._g.offset_index + 1

    def last_index(self) -> int:
        return self._g.last_index

    def term(self, index: int) -> int:
        g = self._g
        if index < g.offset_index:
            raise CompactedError(index)
        if index > g.last_index:
            raise UnavailableError(index)
        if index == g.offset_index:
            return g.offset_term
        return self.store.read_range(self.group_id, index, index + 1)[0].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        g = self._g
        if lo <= g.offset_index:
            raise CompactedError(lo)
        if hi > g.last_index + 1:
            raise UnavailableError(hi)
        return limit_size(self.store.read_range(self.group_id, lo, hi), max_bytes)

    def snapshot(self) -> Snapshot:
        return self.store.snapshot_of(self.group_id)

    def set_hard_state(self, hs: HardState) -> None:
        self.store.set_hard_state(self.group_id, hs)

    def append(self, ents: list[Entry] | tuple[Entry, ...]) -> None:
        self.store.append(self.group_id, ents)

    def apply_snapshot(self, snap: Snapshot) -> None:
        self.store.apply_snapshot(self.group_id, snap)

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes) -> Snapshot:
        return self.store.create_snapshot(self.group_id, index, conf_state, data)

    def compact(self, compact_index: int) -> None:
        self.store.compact(self.group_id, compact_index)


# -- test-only fault hook -----------------------------------------------------------------------------------
class SyncJournalFS(DelegatingFS):
    """A FileSystem wrapper that journals, for each file, the length known durable: the fault tests' power
    cut (tests/cluster/test_quorum_storage_faults.py). Installed by `RaftLogStore.open` only when the
    environment variable HUTCH_FAULT_SYNC_JOURNAL names a journal file; otherwise nothing is wrapped.

    It appends `<length> <absolute path>\n` to the journal (O_APPEND, one write per line, never synced:
    a kill -9 keeps it, and the test reads it only after a kill): `0` before a file is created, the file's
    size before each fdatasync once that fdatasync returned, the new size after a `truncate` (which syncs),
    and for a rename the destination's durable length before the rename is made (the larger of the
    source's and the destination's: the store renames only synced files, so both are whole). A simulated
    power cut truncates every file of the store to the last length journaled for it. Not modelled:
    directory entries (creations, renames and deletions count as durable at once) and out-of-order page
    persistence (the record framing makes a torn write of either kind the same; docs/storage.md).
    """

    def __init__(self, inner: FileSystem, journal: str) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._durable: dict[str, int] = {}
        self._fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)

    def record(self, path: str, length: int) -> None:
        path = os.path.abspath(path)
        with self._lock:
            self._durable[path] = length
            os.write(self._fd, f"{length} {path}\n".encode())

    def _durable_length(self, path: str) -> int:
        with self._lock:
            known = self._durable.get(os.path.abspath(path))
        if known is not None:
            return known
        return self.inner.size(path) if self.inner.exists(path) else 0  # as found at open: durable

    def open_append(self, path: str) -> FileHandle:
        if not self.inner.exists(path):
            self.record(path, 0)
        return _JournaledHandle(self, self.inner.open_append(path))

    def truncate(self, path: str, size: int) -> None:
        self.inner.truncate(path, size)
        self.record(path, size)

    def rename(self, src: str, dst: str) -> None:
        self.record(dst, max(self._durable_length(src), self._durable_length(dst)))
        self.inner.rename(src, dst)
        with self._lock:
            self._durable.pop(os.path.abspath(src), None)

    def delete(self, path: str) -> None:
        self.inner.delete(path)
        with self._lock:
            self._durable.pop(os.path.abspath(path), None)



class _JournaledHandle:
    __slots__ = ("path", "_fs", "_inner")

    def __init__(self, fs: SyncJournalFS, inner: FileHandle) -> None:
        self.path = inner.path
        self._fs = fs
        self._inner = inner

    def write(self, data: Bytes) -> None:
        self._inner.write(data)

    def sync(self) -> None:
        length = self._fs.inner.size(self.path)  # one writer per file: all of it is durable once synced
        self._inner.sync()
        self._fs.record(self.path, length)

    def close(self) -> None:
        self._inner.close()
