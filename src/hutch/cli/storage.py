"""hutch-storage: offline check and salvage of a stopped node's data directory.

What a data directory holds (docs/storage.md):

* ``definitions/snapshot`` and the segmented log ``definitions/log``: users, vhosts, durable exchanges,
  queues and bindings.
* ``queues/<id>/<segno>.qix``: the index of one durable queue, in segment files (queue_index.py). Each
  file is a sequence of checksummed batch records (type 0x31), each holding index entries: PUB (a small
  message embedded in the index), REF (a reference to a message in the vhost's message store), ACK
  (entries gone: acked, rejected, purged) and DLV (the delivered watermark).
* ``msg_stores/<id>/<n>.rdq``: the message store of one vhost (msg_store.py): checksummed batch records
  (type 0x21) of entries ``u64 msg_id | u32 crc32(payload) | payload``, each a larger message stored once.

`hutch-storage check DATA_DIR` verifies all of it: the snapshot's checksum, every record of the
definitions log, every record of every ``.qix`` and ``.rdq`` file, the framing of the entries inside each
record (and their kinds, for the index), and for ``.rdq`` files every entry's own crc32. One line per
log and per queue or store directory (plus one per file that is not clean); exit 0 when everything
verifies, 1 when something is damaged. An invalid record at the very end of a file, with nothing valid
after it, is a **torn tail** (an unfinished write cut by a crash): it is reported but is not damage, the
node drops it at start. An invalid record followed by valid data is damage: the node refuses to start
and names the file and offset. `check` writes nothing but the lock file (below).

`hutch-storage salvage DATA_DIR` repairs what is damaged so the node can start again:

* a damaged log directory is moved aside to ``<dir>.damaged-<UTC time>`` and a new log with the records
  that still verify, in order, takes its place (the definitions log is renumbered after its snapshot's
  covered sequence so that replay still applies every readable change);
* a damaged ``.qix`` or ``.rdq`` file is moved aside to ``<file>.damaged-<UTC time>`` (hard-linked, then
  replaced atomically, so the file name never goes missing) and rewritten with only the records that
  verify, each re-framed with the same record type and unchanged payload bytes; in a ``.rdq`` record, the
  entries whose own crc32 fails are dropped and the record is re-framed with the surviving entries.
  A file whose header is damaged has lost the seed its records' checksums start from: nothing in it can
  be verified, so all of it is reported lost and it is replaced by an empty file with a new header.

Nothing is deleted. Neither the node nor this tool reads a copy moved aside (their names do not match
the storage file patterns); delete them once you no longer need them. What was lost is printed as byte
ranges (and, for the store, the ids of messages dropped for a bad checksum). What a loss means:

* a lost **index** record may lose persistent messages (its PUB or REF entries: the messages are gone) or
  bring back acknowledged ones (its ACK entries: those messages are delivered again) or lose the
  delivered watermark (DLV: messages are not flagged redelivered). Delivery stays at-least-once.
* a lost **store** entry loses one message body: at start the node drops the queue entries that refer to
  it (and logs how many).
* a lost definitions log record loses a definition change.

Damaged snapshot files are reported, not rewritten. A torn tail is left to the node, which truncates it.
Run the tool only while the node is stopped: it takes the data directory's lock (storage/dirlock.py) and
refuses a directory a live node holds, in one line naming the node's pid (exit 2).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import secrets
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import msgpack

from hutch.cluster.metadata import METADATA_GROUP
from hutch.core.definition_ops import DeclareQueue, from_stored
from hutch.raft.messages import EntryType
from hutch.runtime.queue_types.classic.persistence import resource_dir
from hutch.storage import records
from hutch.storage.appendfile import ENTRY_LEN, FILE_HEADER_BYTES, file_header, read_seed
from hutch.storage.dirlock import DataDirLock, DataDirLocked
from hutch.storage.errors import CorruptRecord, CorruptSnapshot, StorageError
from hutch.storage.fs import RealFS
from hutch.storage.log import SegmentedLog, parse_segment_name
from hutch.storage.msg_store import ENTRY_HEAD, STORE_RECORD_TYPE, parse_file_name
from hutch.storage.msg_store import MAX_RECORD_PAYLOAD_BYTES as STORE_MAX_PAYLOAD_BYTES
from hutch.storage.queue_index import (
    ACK,
    DLV,
    DLV_ENTRY,
    INDEX_RECORD_TYPE,
    PUB,
    PUB_HEAD,
    REF,
    REF_HEAD,
    RET,
    RET_ENTRY,
)
from hutch.storage.queue_index import SUFFIX as INDEX_SUFFIX
from hutch.storage.raft_log import offline_entries, offline_snapshot
from hutch.storage.salvage import LogSalvage, salvage_log
from hutch.storage.snapshot import read_snapshot

DEFINITIONS_LOG = os.path.join("definitions", "log")
CLUSTER_RAFT_DIR = os.path.join("cluster", "raft")  # a clustered node's Raft store (its definitions' home)
DEFINITIONS_SNAPSHOT = os.path.join("definitions", "snapshot")
SNAPSHOT_FILES = (DEFINITIONS_SNAPSHOT,)
QUEUES_DIR = "queues"
STORES_DIR = "msg_stores"
ASIDE_MARK = ".damaged-"
TMP_SUFFIX = ".salvage-tmp"
APPEND_CHUNK = 1000
LIST_AT_MOST = 5

INDEX_LOSS = ("a lost queue index record may lose the messages it published (PUB/REF entries) or bring back "
              "messages acknowledged in it (ACK entries): delivery stays at-least-once")
STORE_LOSS = ("a lost message store entry loses that message: at start the node drops the queue entries "
              "that refer to it")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"hutch-storage: error: {message}\n")


# -- file kinds ------------------------------------------------------------------------------------------
def _is_segment_name(name: str) -> bool:
    """What QueueIndex.segments() lists: digits then ".qix" (a copy moved aside does not match)."""
    return name.endswith(INDEX_SUFFIX) and name[:-len(INDEX_SUFFIX)].isdigit()


def _is_store_name(name: str) -> bool:
    return parse_file_name(name) is not None


@dataclass(frozen=True)
class Kind:
    """One kind of batch-record file: where it lives, how it is named, how its entries are checked."""

    directory: str  # under the data directory
    rtype: int
    max_payload_bytes: int  # the bound the node reads with
    files_noun: str
    entries_noun: str
    is_file: Callable[[str], bool]
    entry_problem: Callable[[memoryview], str]  # why an entry of a verified record is unusable; "" if fine


def _index_entry_problem(entry: memoryview) -> str:
    n = len(entry)
    if n == 0:
        return "empty index entry"
    kind = entry[0]
    if kind == PUB:  # head, exchange and routing key as short strings, properties, body
        pos = PUB_HEAD.size
        if n < pos + 2:
            return f"PUB entry of {n} bytes is shorter than its header"
        plen = PUB_HEAD.unpack_from(entry, 0)[-1]
        pos += 1 + entry[pos]  # exchange
        if pos >= n:
            return "PUB entry's exchange runs past its end"
        pos += 1 + entry[pos]  # routing key
        if pos + plen > n:
            return "PUB entry's fields run past its end"
        return ""
    if kind == REF:
        return "" if n == REF_HEAD.size else f"REF entry of {n} bytes, not {REF_HEAD.size}"
    if kind == ACK:
        return "" if (n - 1) % 8 == 0 else f"ACK entry of {n} bytes is not a list of u64 seqs"
    if kind == DLV:
        return "" if n == DLV_ENTRY.size else f"DLV entry of {n} bytes, not {DLV_ENTRY.size}"
    if kind == RET:
        return "" if n == RET_ENTRY.size else f"RET entry of {n} bytes, not {RET_ENTRY.size}"
    return f"unknown queue index entry type {kind}"


def _store_entry_problem(entry: memoryview) -> str:
    if len(entry) < ENTRY_HEAD.size:
        return f"entry of {len(entry)} bytes is shorter than its header"
    msg_id, crc = ENTRY_HEAD.unpack_from(entry, 0)
    if zlib.crc32(entry[ENTRY_HEAD.size:]) != crc:
        return f"checksum mismatch in message {msg_id}"
    return ""


def _framed_entries(payload: memoryview) -> Iterator[tuple[int, memoryview]]:
    """``(offset in the payload, entry)`` for each entry of a batch record (appendfile framing: u32 length
    then the entry bytes). Raises ValueError when the lengths do not add up to the payload."""
    pos = 0
    end = len(payload)
    while pos < end:
        if end - pos < ENTRY_LEN.size:
            raise ValueError(f"{end - pos} stray bytes after the last entry")
        (length,) = ENTRY_LEN.unpack_from(payload, pos)
        pos += ENTRY_LEN.size
        if pos + length > end:
            raise ValueError(f"entry of {length} bytes runs past the end of its batch record")
        yield pos, payload[pos:pos + length]
        pos += length


INDEX = Kind(QUEUES_DIR, INDEX_RECORD_TYPE, STORE_MAX_PAYLOAD_BYTES, "segment file", "entries",
             _is_segment_name, _index_entry_problem)
STORE = Kind(STORES_DIR, STORE_RECORD_TYPE, STORE_MAX_PAYLOAD_BYTES, "store file", "messages", _is_store_name,
             _store_entry_problem)


# -- verifying one file ----------------------------------------------------------------------------------
@dataclass
class FileReport:
    path: str
    kind: Kind
    entries: int = 0  # entries that verify
    torn: records.TornTail | None = None
    damaged: list[tuple[int, int, str]] = field(default_factory=list)  # [start, end) and why
    bad_entries: list[tuple[int, int, str]] = field(default_factory=list)  # [start, end) and why
    kept: list[bytes] = field(default_factory=list)  # re-framed records that verify, in file order
    lost_ids: list[int] = field(default_factory=list)  # store: messages whose entry fails its crc
    seed: int = 0  # the file's checksum seed (from its header)

    @property
    def is_damaged(self) -> bool:
        return bool(self.damaged or self.bad_entries)


def verify_file(fs: RealFS, path: str, kind: Kind) -> FileReport:
    """Every record and entry of one .qix or .rdq file; reads only."""
    data = fs.read(path)
    report = FileReport(path, kind)
    types = frozenset({kind.rtype})
    seed = read_seed(data)
    report.seed = seed or 0
    if seed is None:
        # no whole header: a file torn right after it was created (harmless) or a damaged header
        if len(data) < FILE_HEADER_BYTES + records.HEADER_BYTES:
            report.torn = records.TornTail(0, "incomplete file header", len(data))
        else:
            report.damaged.append((0, len(data), "bad file header (its checksum seed is lost)"))
        return report
    try:
        scanned = records.scan(data, file=path, start=FILE_HEADER_BYTES, max_payload_bytes=kind.max_payload_bytes,
                               types=types, seed=seed)
        found = scanned.records
        report.torn = scanned.torn_tail
    except CorruptRecord:
        salvaged = records.salvage(data, max_payload_bytes=kind.max_payload_bytes, types=types,
                                   start=FILE_HEADER_BYTES, seed=seed)
        found = salvaged.records
        view = memoryview(data)
        for start, end in salvaged.damaged:
            reason = records.check_at(view, start, kind.max_payload_bytes, types, seed)[0] or "damaged"
            report.damaged.append((start, end, reason))
    for rec in found:
        body = rec.offset + records.HEADER_BYTES
        try:
            framed = list(_framed_entries(rec.payload))
        except ValueError as exc:
            report.damaged.append((rec.offset, rec.end, f"record's entries do not add up: {exc}"))
            continue
        good: list[memoryview] = []
        for pos, entry in framed:
            problem = kind.entry_problem(entry)
            if problem:
                start = body + pos - ENTRY_LEN.size
                report.bad_entries.append((start, body + pos + len(entry), problem))
                if kind is STORE and len(entry) >= ENTRY_HEAD.size:
                    report.lost_ids.append(ENTRY_HEAD.unpack_from(entry, 0)[0])
            else:
                good.append(entry)
        report.entries += len(good)
        if len(good) == len(framed):
            payload = bytes(rec.payload)  # unchanged
        elif good:
            payload = b"".join(ENTRY_LEN.pack(len(e)) + bytes(e) for e in good)
        else:
            continue
        report.kept.append(records.encode(kind.rtype, payload, seed))
    report.damaged.sort()
    return report


def _plural(n: int, noun: str) -> str:
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def _some(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LIST_AT_MOST])
    return shown if len(items) <= LIST_AT_MOST else f"{shown} and {len(items) - LIST_AT_MOST} more"


def _ranges(spans: Sequence[tuple[int, int, str]]) -> str:
    return _some([f"[{a}:{b}]" for a, b, _ in spans])


def describe_file(rel: str, report: FileReport) -> str:
    if not report.is_damaged:
        assert report.torn is not None
        return f"{rel}: torn tail (harmless: an unfinished write), {report.torn.dropped_bytes} bytes"
    parts = [f"{rel}: DAMAGED"]
    if report.damaged:
        reasons = sorted({why for _, _, why in report.damaged})
        parts.append(f"bad records at bytes {_ranges(report.damaged)} ({_some(reasons)})")
    if report.bad_entries:
        parts.append(f"bad entries at bytes {_ranges(report.bad_entries)} "
                     f"({_some([why for _, _, why in report.bad_entries])})")
    parts.append(f"{_plural(len(report.kept), 'record')} and {report.entries} {report.kind.entries_noun} "
                 f"readable")
    return "; ".join(parts)


# -- walking the data directory --------------------------------------------------------------------------
@dataclass
class DirReport:
    path: str
    kind: Kind
    files: list[FileReport] = field(default_factory=list)
    aside: int = 0  # damaged copies moved aside by an earlier salvage
    ignored: list[str] = field(default_factory=list)


def walk(fs: RealFS, data_dir: str, kind: Kind) -> Iterator[DirReport]:
    """A report per queue (or vhost store) directory, in name order."""
    base = os.path.join(data_dir, kind.directory)
    if not os.path.isdir(base):
        return
    for name in fs.list_dir(base):
        directory = os.path.join(base, name)
        if not os.path.isdir(directory) or ASIDE_MARK in name:
            continue
        report = DirReport(directory, kind)
        for file in fs.list_dir(directory):
            if kind.is_file(file):
                report.files.append(verify_file(fs, os.path.join(directory, file), kind))
            elif ASIDE_MARK in file:
                report.aside += 1
            else:
                report.ignored.append(file)
        yield report


def describe_dir(rel: str, label: str, report: DirReport) -> str:
    kind = report.kind
    n = len(report.files)
    head = f"{rel} ({label})" if label else rel
    if not n:
        line = f"{head}: no {kind.files_noun}s"
    else:
        bad = sum(f.is_damaged for f in report.files)
        entries = sum(f.entries for f in report.files)
        if bad:
            line = f"{head}: {n - bad} of {n} {kind.files_noun}s clean, {entries} {kind.entries_noun} readable"
        else:
            line = f"{head}: {_plural(n, kind.files_noun)} clean, {entries} {kind.entries_noun}"
    if report.aside:
        line += f"; {_plural(report.aside, 'damaged copy')} kept aside"
    if report.ignored:
        line += f"; ignored: {_some(report.ignored)}"
    return line


def labels(fs: RealFS, data_dir: str) -> dict[str, str]:
    """Best effort: directory id -> "queue 'q' in vhost '/'" / "vhost '/'", from the definitions that still
    read (never raises, never writes)."""
    try:
        ops: list[dict[str, object]] = []
        covered = 0
        payload = read_snapshot(fs, os.path.join(data_dir, DEFINITIONS_SNAPSHOT))
        if payload is not None:
            doc = msgpack.unpackb(payload, raw=False)
            covered = int(doc["covered_seq"])
            ops.extend(doc["ops"])
        log_dir = os.path.join(data_dir, DEFINITIONS_LOG)
        if os.path.isdir(log_dir):
            ops.extend(msgpack.unpackb(e, raw=False) for seq, e in salvage_log(fs, log_dir).entries if seq > covered)
        ops.extend(_metadata_group_ops(fs, data_dir))
        found: dict[str, str] = {}
        for item in ops:
            op = from_stored(item) if isinstance(item, dict) and item.get("op") == DeclareQueue.KIND else None
            if isinstance(op, DeclareQueue):
                vhost, queue = op.vhost, op.name
                found[resource_dir(vhost, queue)] = f"queue {queue!r} in vhost {vhost!r}"
                found[resource_dir(vhost)] = f"vhost {vhost!r}"
        return found
    except Exception:  # labels are a convenience; a damaged definition is reported by check anyway
        return {}


def _metadata_group_ops(fs: RealFS, data_dir: str) -> Iterator[dict[str, object]]:
    """The stored definition operations of a clustered node's definitions, which live in the metadata Raft
    group (cluster/raft): its snapshot and every entry still on disk, in no order and superseded ones
    included; enough for labels, since a queue's directory id is a hash of its vhost and name."""
    root = os.path.join(data_dir, CLUSTER_RAFT_DIR)
    if not os.path.isdir(root):
        return
    snap = offline_snapshot(fs, root, METADATA_GROUP)
    payloads = [snap.data] if snap is not None and snap.data else []
    payloads += [e.data for e in offline_entries(fs, root, METADATA_GROUP) if e.type == EntryType.NORMAL and e.data]
    for payload in payloads:
        try:
            doc = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException):
            continue
        items = doc.get("ops") if isinstance(doc, dict) else None
        yield from (item for item in items or () if isinstance(item, dict))


def find_logs(data_dir: str) -> list[str]:
    """Every directory under `data_dir` holding log segments, except logs already moved aside."""
    found = []
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = sorted(d for d in dirs if ASIDE_MARK not in d)
        if any(parse_segment_name(f) is not None for f in files):
            found.append(root)
    return sorted(found)


def describe(path: str, result: LogSalvage) -> str:
    if result.clean:
        return f"{path}: clean, {_plural(len(result.entries), 'record')}"
    parts = [f"{path}: DAMAGED, {_plural(len(result.entries), 'record')} readable"]
    if result.damaged:
        parts.append("damaged bytes " + ", ".join(f"{os.path.basename(p)}[{a}:{b}]" for p, a, b in result.damaged))
    if result.missing:
        parts.append("lost records " + ", ".join(f"{a}-{b}" for a, b in result.missing))
    return "; ".join(parts)


# -- commands --------------------------------------------------------------------------------------------
def check(data_dir: str) -> int:
    fs = RealFS()
    damaged = 0
    checked = 0
    for rel in SNAPSHOT_FILES:
        path = os.path.join(data_dir, rel)
        try:
            if read_snapshot(fs, path) is not None:
                checked += 1
                print(f"{rel}: clean")
        except CorruptSnapshot as exc:
            checked += 1
            damaged += 1
            print(f"{rel}: DAMAGED: {exc}")
    for directory in find_logs(data_dir):
        result = salvage_log(fs, directory)
        checked += 1
        damaged += not result.clean
        print(describe(os.path.relpath(directory, data_dir), result))
    names = labels(fs, data_dir)
    for kind in (INDEX, STORE):
        for report in walk(fs, data_dir, kind):
            print(describe_dir(os.path.relpath(report.path, data_dir), names.get(os.path.basename(report.path), ""),
                               report))
            for f in report.files:
                checked += 1
                if f.is_damaged or f.torn is not None:
                    damaged += f.is_damaged
                    print(describe_file(os.path.relpath(f.path, data_dir), f))
    if damaged:
        print(f"{damaged} of {checked} files and logs DAMAGED: run `hutch-storage salvage` with the node "
              f"stopped")
        return 1
    print(f"all {checked} files and logs clean")
    return 0


def _definitions_covered_seq(data_dir: str) -> int:
    try:
        payload = read_snapshot(RealFS(), os.path.join(data_dir, DEFINITIONS_SNAPSHOT))
    except CorruptSnapshot:
        return 0
    return int(msgpack.unpackb(payload, raw=False)["covered_seq"]) if payload else 0


def _salvage_logs(fs: RealFS, data_dir: str, stamp: str) -> int:
    repaired = 0
    for directory in find_logs(data_dir):
        result = salvage_log(fs, directory)
        if result.clean:
            continue
        entries = result.entries
        first = entries[0][0] if entries else 1
        if os.path.relpath(directory, data_dir) == DEFINITIONS_LOG:
            # the snapshot holds everything up to covered_seq; the log must go on numbering after it
            covered = _definitions_covered_seq(data_dir)
            entries = [(seq, e) for seq, e in entries if seq > covered]
            first = covered + 1
        aside = f"{directory}{ASIDE_MARK}{stamp}"
        os.rename(directory, aside)
        log = SegmentedLog.open(fs, directory, first_seq=first)
        for start in range(0, len(entries), APPEND_CHUNK):
            log.append([e for _seq, e in entries[start : start + APPEND_CHUNK]])
            log.sync()
        log.close()
        repaired += 1
        rel = os.path.relpath(directory, data_dir)
        print(describe(rel, result))
        print(f"{rel}: rebuilt with {_plural(len(entries), 'record')}; the damaged files are in "
              f"{os.path.basename(aside)}")
    return repaired


def rewrite_file(fs: RealFS, report: FileReport, stamp: str) -> str:
    """Replace a damaged file by its verified records; the damaged one is kept as `<file>.damaged-<stamp>`.
    The file's name always exists: the damaged bytes are hard-linked aside, then the new file renamed over.
    A file whose header was damaged (its seed lost, nothing kept) is replaced by an empty file with a new
    header. Returns the path of the copy kept aside."""
    assert report.seed or not report.kept, "records kept from a file whose seed is lost"
    seed = report.seed or secrets.randbits(32) | 1  # a new file's seed, as AppendFile makes one
    path = report.path
    directory = os.path.dirname(path)
    tmp = path + TMP_SUFFIX
    aside = f"{path}{ASIDE_MARK}{stamp}"
    if fs.exists(tmp):
        fs.delete(tmp)
    handle = fs.open_append(tmp)
    try:
        handle.write(file_header(seed) + b"".join(report.kept))
        handle.sync()
    finally:
        handle.close()
    try:
        os.link(path, aside)
    except OSError:  # no hard links here: a plain rename (the name is missing for a moment)
        fs.rename(path, aside)
    fs.rename(tmp, path)
    fs.fsync_dir(directory)
    return aside


def _salvage_files(fs: RealFS, data_dir: str, stamp: str) -> int:
    repaired = 0
    for kind in (INDEX, STORE):
        lost_here = False
        for report in walk(fs, data_dir, kind):
            for f in report.files:
                if not f.is_damaged:
                    continue
                rel = os.path.relpath(f.path, data_dir)
                print(describe_file(rel, f))
                aside = rewrite_file(fs, f, stamp)
                lost = sorted(f.damaged + f.bad_entries)
                line = (f"{rel}: rebuilt with {_plural(len(f.kept), 'record')} ({f.entries} {kind.entries_noun}); "
                        f"lost bytes {_ranges(lost)}")
                if f.lost_ids:
                    line += f"; lost messages {_some([str(i) for i in f.lost_ids])}"
                print(f"{line}; the damaged file is kept as {os.path.basename(aside)}")
                repaired += 1
                lost_here = True
        if lost_here:
            print(INDEX_LOSS if kind is INDEX else STORE_LOSS)
    return repaired


def salvage(data_dir: str) -> int:
    fs = RealFS()
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    repaired = _salvage_logs(fs, data_dir, stamp) + _salvage_files(fs, data_dir, stamp)
    if not repaired:
        print(f"{data_dir}: nothing damaged to salvage")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="hutch-storage", description="Offline check and salvage of a stopped hutch "
                                                       "node's data directory.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("check", "verify every log, snapshot, queue index and message store file; exit 1 "
                                 "if anything is damaged"),
                       ("salvage", "rebuild damaged logs and files from their readable records")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("data_dir", help="the node's data directory (--data-dir)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data_dir):
        print(f"hutch-storage: no such directory: {args.data_dir}", file=sys.stderr)
        return 2
    try:
        lock = DataDirLock.acquire(args.data_dir)  # a live node's directory is refused, and no node starts meanwhile
    except DataDirLocked as exc:
        print(f"hutch-storage: {exc}; stop the node first", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"hutch-storage: cannot lock {args.data_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        with lock:
            return check(args.data_dir) if args.command == "check" else salvage(args.data_dir)
    except StorageError as exc:
        print(f"hutch-storage: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
