"""The file-system interface of the storage package, and its real (os-level) implementation.

Owns the only code in hutch that calls ``os.open``/``os.write``/``os.fdatasync`` on data files. Everything
else in ``hutch.storage`` (records, the segmented log, snapshots, and later the queue index, the message
store and the Raft WAL) talks to a :class:`FileSystem`, so that tests can swap in
:class:`~hutch.storage.memfs.MemoryFS` (crashes, torn writes) or :class:`~hutch.storage.memfs.FaultyFS`
(bit flips, ENOSPC, EIO) and run the same code deterministically.

The durability contract every implementation follows (and MemoryFS enforces in its crash model):

* Bytes written through a :class:`FileHandle` are visible to reads at once, but durable only after
  ``handle.sync()`` (fdatasync) returns.
* Creating, renaming and deleting a file are durable only after ``fsync_dir`` of its directory returns.
  A crash keeps some prefix of the unsynced directory operations, in order.
* ``truncate`` is durable when it returns (it syncs the file itself); it is used only by recovery.
* Files are append-only: there is no write-at-offset. In-place changes are made by writing a new file and
  renaming it over the old one.

Every ``OSError`` leaves as :class:`~hutch.storage.errors.StorageError` (``NoSpaceError`` for ENOSPC).

Data at rest holds message bodies and password hashes: :class:`RealFS` creates files ``0600``
(``FILE_MODE``, then narrowed further by the umask) and directories ``0700`` (``DIR_MODE``, set
explicitly, whatever the umask), so only the node's own user can read them (docs/security.md).
Implementations are safe to call from several threads at once, but a single :class:`FileHandle` is used by
one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Protocol

from hutch.storage.errors import StorageError

Bytes = bytes | bytearray | memoryview

FILE_MODE = 0o600
"""Mode of every data file RealFS creates: the node's user only."""
DIR_MODE = 0o700
"""Mode of every directory RealFS creates."""
DATA_UMASK = 0o077
"""The node process's umask (set by ``run_node`` in runtime/app.py), whatever its caller's: every file it creates,
through RealFS or not (the cluster identity, the secret), is 0600 and every directory 0700."""


class FileHandle(Protocol):
    """A file opened for appending. Owned by one thread at a time."""

    path: str

    def write(self, data: Bytes) -> None:
        """Append all of ``data`` at the end of the file, or raise (some prefix may have been written)."""

    def sync(self) -> None:
        """fdatasync: make every byte written so far durable. A failure leaves durability unknown."""

    def close(self) -> None:
        """Release the handle. Does not sync."""


class FileSystem(Protocol):
    """Operations on files and directories; paths are ``/``-separated strings."""

    def open_append(self, path: str) -> FileHandle:
        """Open ``path`` for appending, creating it (empty) if missing."""

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes from ``offset`` (to the end if ``None``); shorter at end of file."""

    def size(self, path: str) -> int:
        """Current size in bytes (written, not necessarily synced)."""

    def exists(self, path: str) -> bool: ...

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of a directory, sorted."""

    def delete(self, path: str) -> None:
        """Remove a file. Durable after ``fsync_dir`` of its directory."""

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src``. Durable after ``fsync_dir`` of the directory."""

    def truncate(self, path: str, size: int) -> None:
        """Cut the file to ``size`` bytes and sync it. Durable when it returns."""

    def remove_dir(self, path: str) -> None:
        """Remove an empty directory."""

    def fsync_dir(self, path: str) -> None:
        """Make the creations, renames and deletions in directory ``path`` durable."""

    def make_dirs(self, path: str, durable: bool = True) -> None:
        """Create a directory and its parents if missing (durably; with `durable=False` the new entries
        are made durable later by `fsync_dir` of their parents, the caller's duty)."""

    def free_space(self, path: str) -> int:
        """Bytes available to this process on the file system holding ``path``."""


@contextlib.contextmanager
def os_errors(op: str, path: str) -> Iterator[None]:
    """Translate ``OSError`` raised inside the block into :class:`StorageError`."""
    try:
        yield
    except OSError as exc:
        raise StorageError.from_os_error(op, path, exc) from exc


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync; fsync is a superset
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class DelegatingFS:
    """A FileSystem that passes every call to `inner`: the base of wrappers that change a few of them
    (memfs.FaultyFS injects faults, raft_log.SyncJournalFS journals durable lengths)."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner

    def open_append(self, path: str) -> FileHandle:
        return self.inner.open_append(path)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        return self.inner.read(path, offset, length)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def list_dir(self, path: str) -> list[str]:
        return self.inner.list_dir(path)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def truncate(self, path: str, size: int) -> None:
        self.inner.truncate(path, size)

    def remove_dir(self, path: str) -> None:
        self.inner.remove_dir(path)

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)

    def make_dirs(self, path: str, durable: bool = True) -> None:
        self.inner.make_dirs(path, durable)

    def free_space(self, path: str) -> int:
        return self.inner.free_space(path)


class RealFileHandle:
    """An ``os.open(O_WRONLY | O_APPEND | O_CREAT)`` descriptor."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: str) -> None:
        self.path = path
        with os_errors("open", path):
            self._fd: int = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, FILE_MODE)

    def write(self, data: Bytes) -> None:
        view = memoryview(data).cast("B")
        with os_errors("write", self.path):
            while view:
                # os.write may write less than asked (signals, quotas); loop until all is written.
                written = os.write(self._fd, view)
                view = view[written:]

    def sync(self) -> None:
        with os_errors("fdatasync", self.path):
            _fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with os_errors("close", self.path):
                os.close(fd)


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    """Up to `length` bytes at `offset` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ReadHandle(Protocol):
    """A file kept open for reading at offsets (a stream reader's current segment). One owner at a time;
    the owner closes it when it moves to another file or goes."""

    path: str

    def pread(self, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` (fewer only at the end of the file)."""

    def close(self) -> None:
        """Release the handle (idempotent)."""


class RealReadHandle:
    """An ``os.open(O_RDONLY)`` descriptor, closed by `close()` (or, as a last resort, when collected)."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        with os_errors("open", path):
            self._fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)

    def pread(self, offset: int, length: int) -> bytes:
        if self._fd < 0:
            raise StorageError("read", self.path, detail="the read handle is closed")
        with os_errors("read", self.path):
            return _pread_all(self._fd, offset, length)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


class PathReadHandle:
    """A `ReadHandle` over a file system without descriptors to keep (MemoryFS, and every wrapper such
    as FaultyFS, whose `read` must see each read): each `pread` is `fs.read`."""

    __slots__ = ("path", "_fs")

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.path = path
        self._fs = fs

    def pread(self, offset: int, length: int) -> bytes:
        return self._fs.read(self.path, offset, length)

    def close(self) -> None:
        return None


def open_read(fs: FileSystem, path: str) -> ReadHandle:
    """A handle that reads `path` at offsets: one kept descriptor on RealFS (no open and close per read),
    reads through `fs.read` on any other file system (so wrappers keep seeing every read)."""
    if type(fs) is RealFS:
        return RealReadHandle(path)
    return PathReadHandle(fs, path)


class RealFS:
    """The operating system's file system."""

    def open_append(self, path: str) -> RealFileHandle:
        return RealFileHandle(path)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with os_errors("read", path):
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
            try:
                if length is None:
                    length = max(0, os.fstat(fd).st_size - offset)
                return _pread_all(fd, offset, length)
            finally:
                os.close(fd)

    def size(self, path: str) -> int:
        with os_errors("stat", path):
            return os.stat(path).st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_dir(self, path: str) -> list[str]:
        with os_errors("listdir", path):
            return sorted(os.listdir(path))

    def delete(self, path: str) -> None:
        with os_errors("unlink", path):
            os.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        with os_errors("rename", src):
            os.replace(src, dst)

    def truncate(self, path: str, size: int) -> None:
        with os_errors("truncate", path):
            fd = os.open(path, os.O_WRONLY | _O_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)  # fsync, not fdatasync: the size change is metadata
            finally:
                os.close(fd)

    def remove_dir(self, path: str) -> None:
        with os_errors("rmdir", path):
            os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        with os_errors("fsync_dir", path):
            fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def make_dirs(self, path: str, durable: bool = True) -> None:
        path = os.path.abspath(path)
        missing: list[str] = []
        probe = path
        while not os.path.isdir(probe):
            missing.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        with os_errors("mkdir", path):
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
            for created in missing:  # makedirs gives the mode to the leaf only, and umask applies
                os.chmod(created, DIR_MODE)
        # A new directory entry is durable only once its parent directory is synced.
        for created in reversed(missing if durable else []):
            self.fsync_dir(os.path.dirname(created))

    def free_space(self, path: str) -> int:
        with os_errors("statvfs", path):
            st = os.statvfs(path)
            return st.f_bavail * st.f_frsize

    # Test hook (not part of FileSystem): XOR one stored byte in place, modelling media corruption.
    def poke(self, path: str, offset: int, xor: int = 0x01) -> None:
        with os_errors("poke", path), open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            if not byte:
                raise StorageError("poke", path, None, f"offset {offset} is past the end")
            f.seek(offset)
            f.write(bytes([byte[0] ^ xor]))
