"""Offline salvage of a damaged log: every batch that verifies comes back, the rest is reported."""

from __future__ import annotations

import pytest

from hutch.storage import records
from hutch.storage.errors import CorruptRecord
from hutch.storage.log import SegmentedLog
from hutch.storage.memfs import MemoryFS
from hutch.storage.salvage import salvage_log

from .helpers import DIR, entries, memory_log, open_log, read_all


def build(batches: int = 20) -> tuple[MemoryFS, SegmentedLog]:
    fs, log = memory_log()
    for i in range(batches):
        log.append(entries(5 * i + 1, 5))
        log.sync()
    return fs, log


def test_a_clean_log_salvages_completely() -> None:
    fs, log = build()
    result = salvage_log(fs, DIR)
    assert result.clean
    assert result.entries == list(log.read_from(1))


def test_damage_in_the_middle_loses_only_the_damaged_batch() -> None:
    fs, log = build()
    seg = log.segments()[2]
    recs = records.scan(fs.read(seg.path)).records
    fs.poke(seg.path, recs[1].offset + 20)  # inside the second batch of the third segment
    with pytest.raises(CorruptRecord):
        read_all(open_log(fs))
    result = salvage_log(fs, DIR)
    assert not result.clean
    assert result.damaged == [(seg.path, recs[1].offset, recs[2].offset if len(recs) > 2 else seg.size)]
    lost_first = seg.first_seq + 5
    assert result.missing == [(lost_first, lost_first + 4)]
    survivors = [e for e in entries(1, 100) if e not in entries(lost_first, 5)]
    assert [p for _, p in result.entries] == survivors
    assert fs.read(seg.path)  # read-only: the file is untouched


def test_a_lost_segment_is_a_missing_seq_range() -> None:
    fs, log = build()
    gone = log.segments()[1]
    fs.delete(gone.path)
    result = salvage_log(fs, DIR)
    assert result.missing == [(gone.first_seq, gone.last_seq)]
    assert len(result.entries) == 100 - (gone.last_seq - gone.first_seq + 1)
