"""Offline salvage of a damaged log directory: what a future ``hutch-storage salvage`` command prints/exports.

Owns the policy for reading past damage, which the live log never does: every segment is scanned with
:func:`hutch.storage.records.salvage`, every batch that still verifies is kept, and what was lost is reported
as byte ranges and seq ranges. Read-only: it never changes the directory. Entries come back in seq order
with duplicates dropped (a batch found twice, or a record found by resynchronising inside a damaged range
that repeats seqs already recovered, is ignored).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hutch.storage import records
from hutch.storage.errors import CorruptRecord
from hutch.storage.fs import FileSystem
from hutch.storage.log import MAX_RECORD_PAYLOAD_BYTES, RECORD_TYPES, decode_batch, parse_segment_name


@dataclass
class LogSalvage:
    entries: list[tuple[int, bytes]] = field(default_factory=list)
    damaged: list[tuple[str, int, int]] = field(default_factory=list)  # (path, start, end) byte ranges
    missing: list[tuple[int, int]] = field(default_factory=list)  # inclusive seq ranges not recovered

    @property
    def clean(self) -> bool:
        return not self.damaged and not self.missing


def salvage_log(fs: FileSystem, directory: str) -> LogSalvage:
    """Every entry that still verifies, and a report of what could not be read."""
    result = LogSalvage()
    names = sorted((seq, name) for name in fs.list_dir(directory)
                   if (seq := parse_segment_name(name)) is not None)
    next_seq: int | None = None
    for _, name in names:
        path = f"{directory}/{name}"
        for first, payloads in _batches(fs, path, result):
            if next_seq is not None and first + len(payloads) <= next_seq:
                continue  # already recovered
            if next_seq is not None and first > next_seq:
                result.missing.append((next_seq, first - 1))
            for seq, payload in enumerate(payloads, start=first):
                if next_seq is None or seq >= next_seq:
                    result.entries.append((seq, payload))
            next_seq = first + len(payloads)
    return result


def _batches(fs: FileSystem, path: str, result: LogSalvage) -> Iterator[tuple[int, list[bytes]]]:
    data = fs.read(path)
    scanned = records.salvage(data, max_payload_bytes=MAX_RECORD_PAYLOAD_BYTES, types=RECORD_TYPES)
    result.damaged.extend((path, start, end) for start, end in scanned.damaged)
    for record in scanned.records:
        try:
            first, lengths, pos = decode_batch(record, path)
        except CorruptRecord:
            result.damaged.append((path, record.offset, record.end))
            continue
        payloads = []
        for length in lengths:
            payloads.append(bytes(record.payload[pos:pos + length]))
            pos += length
        yield first, payloads
