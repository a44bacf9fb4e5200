"""One data directory, one user: an exclusive lock on a data directory for as long as it is in use.

Owns: `DataDirLock` (the lock file `<data_dir>/.hutch.lock`, held with `fcntl.flock` for the holder's whole
life) and `DataDirLocked` (the refusal, naming the holder's pid). Two nodes on one directory would both
append to the same logs and stores and lose confirmed messages (issue 21, finding 0); RabbitMQ (Mnesia,
Khepri) and every database refuse it the same way.

Rules:
- `hutch-server` takes the lock before anything in the directory is read or written, and keeps it until
  the process ends; `hutch-storage check` and `salvage` take it for their run, so they refuse a live
  node's directory and a node cannot start while they run.
- `flock` is released by the kernel when the holder's process dies, however it dies (`kill -9` too), so
  a stale lock file never blocks a restart. The file holds the holder's pid (for the refusal's text
  only: the lock, not the file's content, decides).
- The lock file is opened without truncation and written only once the lock is held, so a refused
  second process never wipes the holder's pid.
"""

from __future__ import annotations

import errno
import fcntl
import os

from hutch.storage.fs import DIR_MODE, FILE_MODE

LOCK_FILE = ".hutch.lock"


class DataDirLocked(Exception):
    """The directory is in use by another process; `holder_pid` is None when its pid cannot be read."""

    def __init__(self, data_dir: str, holder_pid: int | None) -> None:
        self.data_dir = data_dir
        self.holder_pid = holder_pid
        holder = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(f"data directory {data_dir} is in use by {holder} (lock file "
                         f"{os.path.join(data_dir, LOCK_FILE)}); one data directory serves one node")


class DataDirLock:
    """An exclusive lock on one data directory. `acquire` creates the directory (0700) when missing."""

    def __init__(self, data_dir: str, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str) -> DataDirLock:
        """Take the lock, or raise DataDirLocked (held elsewhere) or OSError (cannot create the file)."""
        os.makedirs(data_dir, mode=DIR_MODE, exist_ok=True)
        path = os.path.join(data_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirLocked(data_dir, holder) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, fd)

    @classmethod
    def acquire_or_reason(cls, data_dir: str) -> DataDirLock | str:
        """`acquire`, or the one-line reason it could not be had (what `hutch-server` prints)."""
        try:
            return cls.acquire(data_dir)
        except DataDirLocked as exc:
            return str(exc)
        except OSError as exc:
            return f"cannot lock data directory {data_dir}: {exc.strerror or exc}"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (the file stays; its content no longer matters)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


__all__ = ["LOCK_FILE", "DataDirLock", "DataDirLocked"]
