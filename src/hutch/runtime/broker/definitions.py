"""Durable definitions: the users, vhosts, permissions, durable exchanges, durable queues and the
bindings between durable objects that survive a restart of the node.

Owns: the on-disk form of definitions under `<data_dir>/definitions/`: a snapshot file (the whole
state as a list of operations, plus the log sequence number it covers) and a segmented log of the
operations made since. Both come from `hutch.storage` (checksummed, fsynced, torn tail tolerated).

Rules:
- Every definition change that must survive a restart is appended to the log and fdatasync'd before
  the node replies to the client (one fdatasync, about 50 µs here, per change; definitions change
  rarely compared with messages).
- Operations are replayed through the same node methods that made them, so cascades (bindings removed
  with their queue, auto-delete exchanges) happen again exactly as they did.
- At start-up, after replay, the state is written as a new snapshot and the log before it is dropped.
- Record format: each operation is a record of core/definition_ops.py, stored as its map
  (`to_stored`: msgpack maps with an "op" key, the same form every earlier version wrote, so old data
  directories load); x-arguments are kept as AMQP-encoded field tables (byte for byte, so every field
  type survives). A stored operation this version cannot read is logged and skipped, not fatal.
- Groups (`append(op, group=g)`, `end_group(g)`): a change made of many operations (a super stream's
  exchange, partitions and bindings) is appended without a sync, each entry tagged with its group, and
  made durable by the one sync of its end marker. At load, a group's entries count only if its end
  marker is in the log: a crash before it (or a group given up, never ended) leaves none of them,
  wherever other changes' syncs put them on disk. An entry of another change that referred to an
  object of a group that did not end is then skipped at replay, as any stale record is.
- Messages are not stored here (the message store is a later issue).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import msgpack

from hutch.amqp.table import decode_table, encode_table
from hutch.core.definition_ops import DefinitionOp, DefinitionOpError, from_stored, to_stored
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.log import SegmentedLog
from hutch.storage.snapshot import read_snapshot, write_snapshot

log = logging.getLogger("hutch.definitions")

SNAPSHOT_KIND = 1
FORMAT_VERSION = 1
GROUP_KEY = "group"  # the group an entry belongs to (absent: none)
GROUP_END = "group.end"  # the op of a group's end marker


def pack_arguments(arguments: dict[str, Any] | None) -> bytes:
    return encode_table(arguments or {})


def unpack_arguments(raw: bytes) -> dict[str, Any]:
    return decode_table(raw, 0)[0]


class DefinitionStore:
    """The definitions files of one node. Not thread-safe; used from the event loop thread."""

    def __init__(self, data_dir: str, fs: FileSystem | None = None) -> None:
        self.fs = fs or RealFS()
        self.directory = os.path.join(data_dir, "definitions")
        self.fs.make_dirs(self.directory)
        self.snapshot_path = os.path.join(self.directory, "snapshot")
        self.log = SegmentedLog.open(self.fs, os.path.join(self.directory, "log"))
        self.covered_seq = 0

    def load(self) -> list[DefinitionOp]:
        """Every operation to replay, oldest first: the snapshot's, then the log's after it."""
        stored: list[Any] = []
        payload = read_snapshot(self.fs, self.snapshot_path, kind=SNAPSHOT_KIND)
        if payload is not None:
            doc = msgpack.unpackb(payload, raw=False)
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"definitions snapshot has unknown format version {doc.get('version')!r}")
            self.covered_seq = int(doc["covered_seq"])
            stored.extend(doc["ops"])
        for _seq, entry in self.log.read_from(self.covered_seq + 1):
            stored.append(msgpack.unpackb(entry, raw=False))
        ops: list[DefinitionOp] = []
        for item in ended_groups_only(stored):
            try:
                ops.append(from_stored(item))
            except DefinitionOpError as exc:
                log.warning("skipping saved definition: %s", exc)
        return ops

    def append(self, op: DefinitionOp, group: int | None = None) -> None:
        """Make one operation durable (appended and fdatasync'd) before returning; in a `group`, append
        it only (durable with the group's end, `end_group`)."""
        stored = to_stored(op)
        if group is not None:
            stored = {**stored, GROUP_KEY: group}
        self.log.append([msgpack.packb(stored, use_bin_type=True)])
        if group is None:
            self.log.sync()

    def end_group(self, group: int) -> None:
        """Make every operation of `group` durable at once: its end marker appended, one fdatasync."""
        self.log.append([msgpack.packb({"op": GROUP_END, GROUP_KEY: group}, use_bin_type=True)])
        self.log.sync()

    def compact(self, ops: Iterable[DefinitionOp]) -> None:
        """Write `ops` (the whole current state) as the snapshot and drop the log it covers."""
        covered = self.log.last_seq
        doc = {"version": FORMAT_VERSION, "covered_seq": covered, "ops": [to_stored(op) for op in ops]}
        write_snapshot(self.fs, self.snapshot_path, msgpack.packb(doc, use_bin_type=True), kind=SNAPSHOT_KIND)
        self.covered_seq = covered
        self.log.truncate_before(covered + 1)

    def close(self) -> None:
        self.log.close()


def ended_groups_only(stored: list[Any]) -> list[Any]:
    """The stored operations to replay: those of no group, and those of groups whose end marker is
    among them (each stripped of its group tag); the end markers themselves are left out."""
    ended = {item.get(GROUP_KEY) for item in stored if isinstance(item, dict) and item.get("op") == GROUP_END}
    out: list[Any] = []
    for item in stored:
        if not isinstance(item, dict) or GROUP_KEY not in item:
            out.append(item)
        elif item.get("op") != GROUP_END and item[GROUP_KEY] in ended:
            out.append({k: v for k, v in item.items() if k != GROUP_KEY})
    return out
