"""hutch.storage: the only package that touches data files.

Layers, bottom up (each module's docstring states its rules; docs/storage.md has the design):

* ``fs``       the FileSystem interface and RealFS; ``memfs`` has MemoryFS (crash model) and FaultyFS.
* ``records``  checksummed record framing; torn tail versus corruption; salvage.
* ``log``      the segmented append-only log with group commit (one fdatasync per batch).
* ``snapshot`` checksummed snapshot files replaced atomically.
* ``salvage``  offline recovery of what still verifies in a damaged log directory.

Pure apart from the FileSystem calls: no asyncio, no threads, no clocks. A leaf package: imports only the
standard library.
"""

from hutch.storage.errors import (
    CorruptRecord,
    CorruptSnapshot,
    LogFailed,
    NoSpaceError,
    StorageError,
)
from hutch.storage.fs import FileHandle, FileSystem, RealFS
from hutch.storage.log import LogOptions, RecoveryReport, SegmentedLog, SyncJob, TruncateJob
from hutch.storage.memfs import FaultyFS, MemoryFS
from hutch.storage.records import SalvageResult, ScanResult, TornTail, salvage, scan
from hutch.storage.salvage import LogSalvage, salvage_log
from hutch.storage.snapshot import read_snapshot, write_snapshot

__all__ = [
    "CorruptRecord",
    "CorruptSnapshot",
    "FaultyFS",
    "FileHandle",
    "FileSystem",
    "LogFailed",
    "LogOptions",
    "LogSalvage",
    "MemoryFS",
    "NoSpaceError",
    "RealFS",
    "RecoveryReport",
    "SalvageResult",
    "ScanResult",
    "SegmentedLog",
    "StorageError",
    "SyncJob",
    "TornTail",
    "TruncateJob",
    "read_snapshot",
    "salvage",
    "salvage_log",
    "scan",
    "write_snapshot",
]
