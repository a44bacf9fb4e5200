"""hutch-storage: offline check and salvage of a stopped node's data directory.

`hutch-storage check DATA_DIR` reads every log (the definitions log and the message journal) and every
snapshot under DATA_DIR, verifying every checksum, and says what is damaged; exit 0 when all is clean,
1 when something is damaged. It never writes.

`hutch-storage salvage DATA_DIR` rebuilds each damaged log from the records that still verify: the
damaged log directory is moved aside to `<dir>.damaged-<UTC time>` (nothing is deleted) and a new log
with the readable records, in order, takes its place, so the node can start again. What was lost is
printed (byte ranges and record sequence ranges). A lost journal record means a persistent message
that may be gone (a lost ENQ) or an acknowledged one that may come back (a lost SETTLE). Damaged snapshot
files are reported, not rewritten.

Run it only while the node is stopped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import msgpack

from hutch.storage.errors import CorruptSnapshot, StorageError
from hutch.storage.fs import RealFS
from hutch.storage.log import SegmentedLog, parse_segment_name
from hutch.storage.salvage import LogSalvage, salvage_log
from hutch.storage.snapshot import read_snapshot

DEFINITIONS_LOG = os.path.join("definitions", "log")
DEFINITIONS_SNAPSHOT = os.path.join("definitions", "snapshot")
SNAPSHOT_FILES = (DEFINITIONS_SNAPSHOT, os.path.join("messages", "CURRENT"))
APPEND_CHUNK = 1000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"hutch-storage: error: {message}\n")


def find_logs(data_dir: str) -> list[str]:
    """Every directory under `data_dir` holding log segments, except logs already moved aside."""
    found = []
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = sorted(d for d in dirs if ".damaged-" not in d)
        if any(parse_segment_name(f) is not None for f in files):
            found.append(root)
    return sorted(found)


def describe(path: str, result: LogSalvage) -> str:
    if result.clean:
        return f"{path}: clean, {len(result.entries)} records"
    parts = [f"{path}: DAMAGED, {len(result.entries)} records readable"]
    if result.damaged:
        parts.append("damaged bytes " + ", ".join(f"{os.path.basename(p)}[{a}:{b}]" for p, a, b in result.damaged))
    if result.missing:
        parts.append("lost records " + ", ".join(f"{a}-{b}" for a, b in result.missing))
    return "; ".join(parts)


def check(data_dir: str) -> int:
    fs = RealFS()
    damaged = False
    for rel in SNAPSHOT_FILES:
        path = os.path.join(data_dir, rel)
        try:
            if read_snapshot(fs, path) is not None:
                print(f"{path}: clean")
        except CorruptSnapshot as exc:
            damaged = True
            print(f"{path}: DAMAGED: {exc}")
    for directory in find_logs(data_dir):
        result = salvage_log(fs, directory)
        damaged = damaged or not result.clean
        print(describe(directory, result))
    return 1 if damaged else 0


def _definitions_covered_seq(data_dir: str) -> int:
    try:
        payload = read_snapshot(RealFS(), os.path.join(data_dir, DEFINITIONS_SNAPSHOT))
    except CorruptSnapshot:
        return 0
    return int(msgpack.unpackb(payload, raw=False)["covered_seq"]) if payload else 0


def salvage(data_dir: str) -> int:
    fs = RealFS()
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
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
        aside = f"{directory}.damaged-{stamp}"
        os.rename(directory, aside)
        log = SegmentedLog.open(fs, directory, first_seq=first)
        for start in range(0, len(entries), APPEND_CHUNK):
            log.append([e for _seq, e in entries[start : start + APPEND_CHUNK]])
            log.sync()
        log.close()
        repaired += 1
        print(describe(directory, result))
        print(f"{directory}: rebuilt with {len(entries)} records; the damaged files are in {aside}")
    if not repaired:
        print(f"{data_dir}: no damaged log to salvage")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="hutch-storage", description="Offline check and salvage of a stopped hutch "
                                                       "node's data directory.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("check", "verify every log and snapshot; exit 1 if anything is damaged"),
                       ("salvage", "rebuild damaged logs from their readable records")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("data_dir", help="the node's data directory (--data-dir)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data_dir):
        print(f"hutch-storage: no such directory: {args.data_dir}", file=sys.stderr)
        return 2
    try:
        return check(args.data_dir) if args.command == "check" else salvage(args.data_dir)
    except StorageError as exc:
        print(f"hutch-storage: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
