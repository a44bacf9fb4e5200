"""Simulated file systems for tests: :class:`MemoryFS` (crashes, torn writes) and :class:`FaultyFS` (faults).

Owns the crash model that the storage tests prove recovery against. Both classes implement
:class:`~hutch.storage.fs.FileSystem` and are deterministic for a given seed, so a failing seed is a
reproducible regression test.

MemoryFS crash model (what ``crash()`` keeps):

* File data: every byte that was fdatasync'd, plus, when ``torn=True``, a random prefix (seeded) of the
  bytes appended since the last sync of that file: a torn write. Real disks may also persist unsynced pages
  out of order; the log's format makes that case equivalent to a torn prefix (see docs/storage.md).
* Directory entries (create, rename, delete): every operation made durable by ``fsync_dir`` of its
  directory, plus, when ``torn=True``, a random prefix of the remaining ones, in the order they were made.
* Directories themselves are durable as soon as ``make_dirs`` returns (RealFS syncs the parent to match).
* File handles opened before the crash are dead: using them raises :class:`StorageError`.

FaultyFS wraps any FileSystem and injects, from a seeded RNG: bit flips in what a read returns, bit flips in
stored data (media corruption), ENOSPC once a byte budget is spent (after writing the part that fits, like a
real short write), and EIO from fdatasync (without syncing). It counts writes and syncs for tests and
benchmarks.
"""

from __future__ import annotations

import errno
import posixpath
import random
import threading
from dataclasses import dataclass

from hutch.storage.errors import NoSpaceError, StorageError
from hutch.storage.fs import Bytes, DelegatingFS, FileHandle, FileSystem


class _Inode:
    """A file's bytes. Invariant: ``data[:durable_len]`` is exactly what a crash would keep (at least)."""

    __slots__ = ("data", "durable_len")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable_len = 0


@dataclass(frozen=True)
class _DirOp:
    kind: str  # "link" | "unlink" | "rename"
    path: str  # the name created/removed, or the rename target
    inode: _Inode | None = None
    src: str = ""

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.path)


def _norm(path: str) -> str:
    return posixpath.normpath("/" + path) if not path.startswith("/") else posixpath.normpath(path)


@dataclass
class MemoryStats:
    writes: int = 0
    bytes_written: int = 0
    syncs: int = 0
    dir_syncs: int = 0
    crashes: int = 0


class _MemHandle:
    __slots__ = ("path", "_fs", "_inode", "_generation", "_closed")

    def __init__(self, fs: MemoryFS, path: str, inode: _Inode) -> None:
        self.path = path
        self._fs = fs
        self._inode = inode
        self._generation = fs._generation
        self._closed = False

    def _check(self, op: str) -> None:
        if self._closed:
            raise StorageError(op, self.path, errno.EBADF, "handle is closed")
        if self._generation != self._fs._generation:
            raise StorageError(op, self.path, errno.EIO, "handle was opened before a crash")

    def write(self, data: Bytes) -> None:
        with self._fs._lock:
            self._check("write")
            self._inode.data += data  # O_APPEND: always at the current end
            self._fs.stats.writes += 1
            self._fs.stats.bytes_written += len(data)

    def sync(self) -> None:
        with self._fs._lock:
            self._check("fdatasync")
            self._inode.durable_len = len(self._inode.data)
            self._fs.stats.syncs += 1

    def close(self) -> None:
        self._closed = True


class MemoryFS:
    """An in-memory file system that knows what a power cut would keep. Thread-safe."""

    def __init__(self, seed: int = 0, capacity_bytes: int = 1 << 40) -> None:
        self._lock = threading.RLock()
        self._rng = random.Random(seed)
        self._generation = 0
        self._dirs: set[str] = {"/"}
        self._live: dict[str, _Inode] = {}
        self._durable: dict[str, _Inode] = {}
        self._pending: list[_DirOp] = []
        self.capacity_bytes = capacity_bytes
        self.stats = MemoryStats()

    # -- FileSystem ---------------------------------------------------------------------------------
    def open_append(self, path: str) -> _MemHandle:
        path = _norm(path)
        with self._lock:
            inode = self._live.get(path)
            if inode is None:
                if posixpath.dirname(path) not in self._dirs:
                    raise StorageError("open", path, errno.ENOENT)
                if path in self._dirs:
                    raise StorageError("open", path, errno.EISDIR)
                inode = _Inode()
                self._live[path] = inode
                self._pending.append(_DirOp("link", path, inode))
            return _MemHandle(self, path, inode)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with self._lock:
            data = self._inode(path, "read").data
            end = len(data) if length is None else min(len(data), offset + length)
            return bytes(data[offset:end])

    def size(self, path: str) -> int:
        with self._lock:
            return len(self._inode(path, "stat").data)

    def exists(self, path: str) -> bool:
        path = _norm(path)
        with self._lock:
            return path in self._live or path in self._dirs

    def list_dir(self, path: str) -> list[str]:
        path = _norm(path)
        with self._lock:
            if path not in self._dirs:
                raise StorageError("listdir", path, errno.ENOENT)
            names = {posixpath.basename(p) for p in self._live if posixpath.dirname(p) == path}
            names.update(posixpath.basename(d) for d in self._dirs if d != path and posixpath.dirname(d) == path)
            return sorted(names)

    def delete(self, path: str) -> None:
        path = _norm(path)
        with self._lock:
            self._inode(path, "unlink")
            del self._live[path]
            self._pending.append(_DirOp("unlink", path))

    def rename(self, src: str, dst: str) -> None:
        src, dst = _norm(src), _norm(dst)
        with self._lock:
            inode = self._inode(src, "rename")
            if posixpath.dirname(src) != posixpath.dirname(dst):
                raise StorageError("rename", src, errno.EXDEV, "MemoryFS renames within one directory only")
            del self._live[src]
            self._live[dst] = inode
            self._pending.append(_DirOp("rename", dst, inode, src))

    def truncate(self, path: str, size: int) -> None:
        with self._lock:
            inode = self._inode(path, "truncate")
            if size <= len(inode.data):
                del inode.data[size:]
            else:
                inode.data += bytes(size - len(inode.data))
            inode.durable_len = size
            self.stats.syncs += 1

    def fsync_dir(self, path: str) -> None:
        path = _norm(path)
        with self._lock:
            if path not in self._dirs:
                raise StorageError("fsync_dir", path, errno.ENOENT)
            keep: list[_DirOp] = []
            for op in self._pending:
                if op.directory == path:
                    self._apply(op)
                else:
                    keep.append(op)
            self._pending = keep
            self.stats.dir_syncs += 1

    def remove_dir(self, path: str) -> None:
        path = _norm(path)
        with self._lock:
            if path not in self._dirs:
                raise StorageError("rmdir", path, errno.ENOENT)
            if any(posixpath.dirname(p) == path for p in self._live) or \
                    any(posixpath.dirname(d) == path for d in self._dirs if d != path):
                raise StorageError("rmdir", path, errno.ENOTEMPTY)
            self._dirs.discard(path)

    def make_dirs(self, path: str, durable: bool = True) -> None:
        path = _norm(path)  # (directories are always durable here: `durable` changes nothing)
        with self._lock:
            while path not in self._dirs:
                if path in self._live:
                    raise StorageError("mkdir", path, errno.EEXIST)
                self._dirs.add(path)
                path = posixpath.dirname(path)

    def free_space(self, path: str) -> int:
        with self._lock:
            used = sum(len(inode.data) for inode in self._live.values())
            return max(0, self.capacity_bytes - used)

    # -- crash model --------------------------------------------------------------------------------
    def crash(self, *, torn: bool = True, dir_ops_kept: int | None = None,
              torn_bytes: int | None = None) -> None:
        """Simulate a power cut; afterwards the FS holds only what the crash model keeps.

        ``torn=False`` keeps nothing unsynced. With ``torn=True`` a random prefix (from the seeded RNG) of
        the unsynced directory operations and of each file's unsynced tail survives; ``dir_ops_kept`` and
        ``torn_bytes`` fix those lengths instead (capped at what exists), for exhaustive tests.
        """
        with self._lock:
            if torn:
                n_ops = self._rng.randint(0, len(self._pending)) if dir_ops_kept is None else dir_ops_kept
            else:
                n_ops = dir_ops_kept or 0
            for op in self._pending[:n_ops]:
                self._apply(op)
            self._pending = []
            survivors = {id(inode): inode for inode in self._durable.values()}
            for inode in survivors.values():
                unsynced = len(inode.data) - inode.durable_len
                keep = 0
                if torn and unsynced > 0:
                    keep = self._rng.randint(0, unsynced) if torn_bytes is None else min(torn_bytes, unsynced)
                del inode.data[inode.durable_len + keep:]
                inode.durable_len = len(inode.data)
            self._live = dict(self._durable)
            self._generation += 1
            self.stats.crashes += 1

    def unsynced_bytes(self, path: str) -> int:
        """Bytes of ``path`` that a crash could lose."""
        with self._lock:
            inode = self._inode(path, "stat")
            return len(inode.data) - inode.durable_len

    def poke(self, path: str, offset: int, xor: int = 0x01) -> None:
        """Test hook: XOR one stored byte in place (media corruption; bypasses the crash model)."""
        with self._lock:
            inode = self._inode(path, "poke")
            if offset >= len(inode.data):
                raise StorageError("poke", path, None, f"offset {offset} is past the end")
            inode.data[offset] ^= xor

    def _inode(self, path: str, op: str) -> _Inode:
        inode = self._live.get(_norm(path))
        if inode is None:
            raise StorageError(op, path, errno.ENOENT)
        return inode

    def _apply(self, op: _DirOp) -> None:
        if op.kind == "link":
            assert op.inode is not None
            self._durable[op.path] = op.inode
        elif op.kind == "unlink":
            self._durable.pop(op.path, None)
        else:
            assert op.inode is not None
            self._durable.pop(op.src, None)
            self._durable[op.path] = op.inode


@dataclass
class FaultStats:
    writes: int = 0
    bytes_written: int = 0
    syncs: int = 0
    failed_syncs: int = 0
    dir_syncs: int = 0
    read_flips: int = 0


class _FaultyHandle:
    __slots__ = ("path", "_fs", "_inner")

    def __init__(self, fs: FaultyFS, inner: FileHandle) -> None:
        self.path = inner.path
        self._fs = fs
        self._inner = inner

    def write(self, data: Bytes) -> None:
        fs = self._fs
        with fs._lock:
            budget = fs.write_budget_bytes
            if budget is not None and len(data) > budget:
                fs.write_budget_bytes = 0
                fits = bytes(memoryview(data)[:budget])
            else:
                fits = None
                if budget is not None:
                    fs.write_budget_bytes = budget - len(data)
        if fits is not None:
            if fits:
                self._inner.write(fits)  # a real short write: part of the data lands before ENOSPC
            fs.stats.bytes_written += len(fits)
            raise NoSpaceError("write", self.path, errno.ENOSPC)
        self._inner.write(data)
        fs.stats.writes += 1
        fs.stats.bytes_written += len(data)

    def sync(self) -> None:
        fs = self._fs
        with fs._lock:
            fail = fs.fail_next_syncs > 0 or (fs.sync_eio_rate > 0 and fs._rng.random() < fs.sync_eio_rate)
            if fs.fail_next_syncs > 0:
                fs.fail_next_syncs -= 1
        if fail:
            fs.stats.failed_syncs += 1
            raise StorageError("fdatasync", self.path, errno.EIO)
        self._inner.sync()
        fs.stats.syncs += 1

    def close(self) -> None:
        self._inner.close()


class FaultyFS(DelegatingFS):
    """Wraps a FileSystem and injects seeded faults. Fault knobs are plain attributes; change them any time.

    * ``read_bit_flip_rate``: probability that one ``read`` returns data with one random bit flipped.
    * ``write_budget_bytes``: bytes that may still be written (``None``: unlimited); past it, ENOSPC.
    * ``sync_eio_rate`` / ``fail_next_syncs``: fdatasync fails with EIO (randomly / the next N times).
    """

    def __init__(self, inner: FileSystem, seed: int = 0, *, read_bit_flip_rate: float = 0.0,
                 write_budget_bytes: int | None = None, sync_eio_rate: float = 0.0,
                 fail_next_syncs: int = 0) -> None:
        super().__init__(inner)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.read_bit_flip_rate = read_bit_flip_rate
        self.write_budget_bytes = write_budget_bytes
        self.sync_eio_rate = sync_eio_rate
        self.fail_next_syncs = fail_next_syncs
        self.stats = FaultStats()

    def open_append(self, path: str) -> _FaultyHandle:
        return _FaultyHandle(self, self.inner.open_append(path))

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self.inner.read(path, offset, length)
        with self._lock:
            flip = bool(data) and self.read_bit_flip_rate > 0 and self._rng.random() < self.read_bit_flip_rate
            if flip:
                bit = self._rng.randrange(len(data) * 8)
        if flip:
            buf = bytearray(data)
            buf[bit // 8] ^= 1 << (bit % 8)
            self.stats.read_flips += 1
            return bytes(buf)
        return data

    def flip_stored_bit(self, path: str, bit: int | None = None) -> int:
        """Flip one bit of the stored file (random if ``bit`` is None); returns the bit index flipped."""
        size = self.inner.size(path)
        if size == 0:
            raise StorageError("poke", path, None, "file is empty")
        if bit is None:
            with self._lock:
                bit = self._rng.randrange(size * 8)
        poke = getattr(self.inner, "poke", None)
        if poke is None:
            raise TypeError(f"{type(self.inner).__name__} has no poke() test hook")
        poke(path, bit // 8, 1 << (bit % 8))
        return bit

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)
        self.stats.dir_syncs += 1

    def free_space(self, path: str) -> int:
        free = self.inner.free_space(path)
        return free if self.write_budget_bytes is None else min(free, self.write_budget_bytes)
