"""Typed errors of the storage package.

Owns every exception that storage code raises. Rules:

* Anything the operating system reports (``OSError``) leaves the file-system layer as a
  :class:`StorageError` naming the operation, the path and the errno, so a log line says what failed
  where; a full disk is the subclass :class:`NoSpaceError`, so callers can raise a disk alarm and retry.
* Damage found in data already on disk is :class:`CorruptRecord` (a framed record) or
  :class:`CorruptSnapshot` (a snapshot file). Corruption is never skipped silently.
* :class:`LogFailed` means a log hit an error after which its in-memory view can no longer be trusted
  (an fdatasync failed: the kernel may have dropped the dirty pages, so retrying would lie). The only way
  forward is to reopen the log, which re-reads and re-verifies the files.
"""

from __future__ import annotations

import errno as errno_mod
import os


class StorageError(Exception):
    """An IO operation on a data file failed.

    ``op`` is the file-system operation (``"write"``, ``"fdatasync"``, ...), ``path`` the file or directory,
    ``errno`` the OS error number (``None`` when the error is not an OS error).
    """

    def __init__(self, op: str, path: str, errno: int | None = None, detail: str = "") -> None:
        self.op = op
        self.path = path
        self.errno = errno
        self.detail = detail
        reason = detail or (os.strerror(errno) if errno is not None else "failed")
        code = f" [{errno_mod.errorcode.get(errno, errno)}]" if errno is not None else ""
        super().__init__(f"storage {op} failed on {path!r}: {reason}{code}")

    @classmethod
    def from_os_error(cls, op: str, path: str, exc: OSError) -> StorageError:
        if exc.errno in (errno_mod.ENOSPC, errno_mod.EDQUOT):
            return NoSpaceError(op, path, exc.errno)
        return cls(op, path, exc.errno)


class NoSpaceError(StorageError):
    """The file system is full (ENOSPC or EDQUOT). Nothing that was synced before is affected."""


class CorruptRecord(StorageError):
    """A record that is followed by more valid data fails its checks: damage, not a torn write.

    ``file`` and ``offset`` locate the first damaged byte range; ``reason`` says which check failed.
    The offline salvage (:func:`hutch.storage.records.salvage`) can recover the valid records around it.
    """

    def __init__(self, file: str, offset: int, reason: str) -> None:
        self.file = file
        self.offset = offset
        self.reason = reason
        super().__init__("read", file, None, f"corrupt record at offset {offset}: {reason}")


class CorruptSnapshot(StorageError):
    """A snapshot file fails its magic, version, length or checksum check."""

    def __init__(self, file: str, reason: str) -> None:
        self.file = file
        self.reason = reason
        super().__init__("read", file, None, f"corrupt snapshot: {reason}")


class LogFailed(StorageError):
    """The log saw an unrecoverable IO error earlier; reopen it to recover from what is on disk."""

    def __init__(self, path: str, cause: BaseException) -> None:
        self.cause = cause
        super().__init__("use", path, None, f"log failed earlier and must be reopened ({cause})")
