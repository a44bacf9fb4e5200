"""Shared helpers for the storage tests."""

from __future__ import annotations

from hutch.storage.fs import FileSystem
from hutch.storage.log import LogOptions, SegmentedLog
from hutch.storage.memfs import MemoryFS

DIR = "/data/log"
SMALL = LogOptions(segment_max_bytes=256, max_batch_bytes=100)


def entries(start: int, count: int, size: int = 8) -> list[bytes]:
    """Distinct, recognisable entries: entry n is ``n`` repeated to ``size`` bytes."""
    return [(f"e{n}-".encode() * size)[:size] for n in range(start, start + count)]


def read_all(log: SegmentedLog, *, include_unsynced: bool = False) -> list[bytes]:
    return [payload for _, payload in log.read_from(log.first_seq, include_unsynced=include_unsynced)]


def open_log(fs: FileSystem, options: LogOptions = SMALL, **kwargs: int) -> SegmentedLog:
    return SegmentedLog.open(fs, DIR, options, **kwargs)


def memory_log(seed: int = 0, options: LogOptions = SMALL) -> tuple[MemoryFS, SegmentedLog]:
    fs = MemoryFS(seed=seed)
    return fs, open_log(fs, options)
