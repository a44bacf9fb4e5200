"""The file-system layer: MemoryFS's crash model, FaultyFS's faults, and RealFS on a real directory."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from hutch.storage.errors import NoSpaceError, StorageError
from hutch.storage.fs import RealFS
from hutch.storage.memfs import FaultyFS, MemoryFS


def make_fs() -> MemoryFS:
    fs = MemoryFS(seed=7)
    fs.make_dirs("/d")
    return fs


# -- MemoryFS ---------------------------------------------------------------------------------------------

def test_writes_are_visible_before_sync_and_lost_by_a_crash() -> None:
    fs = make_fs()
    h = fs.open_append("/d/f")
    fs.fsync_dir("/d")
    h.write(b"hello")
    assert fs.read("/d/f") == b"hello"
    fs.crash(torn=False)
    assert fs.read("/d/f") == b""


def test_synced_data_survives_every_crash() -> None:
    for seed in range(20):
        fs = MemoryFS(seed=seed)
        fs.make_dirs("/d")
        h = fs.open_append("/d/f")
        fs.fsync_dir("/d")
        h.write(b"durable")
        h.sync()
        h.write(b"-maybe")
        fs.crash()
        data = fs.read("/d/f")
        assert data.startswith(b"durable")
        assert b"durable-maybe".startswith(data)  # only a prefix of the unsynced tail (a torn write)


def test_torn_bytes_keeps_exactly_that_prefix_of_the_unsynced_tail() -> None:
    for keep in range(6):
        fs = make_fs()
        h = fs.open_append("/d/f")
        fs.fsync_dir("/d")
        h.write(b"ab")
        h.sync()
        h.write(b"cdefg")
        fs.crash(torn_bytes=keep)
        assert fs.read("/d/f") == b"abcdefg"[: 2 + keep]


def test_seeded_crashes_are_reproducible() -> None:
    def run(seed: int) -> bytes:
        fs = MemoryFS(seed=seed)
        fs.make_dirs("/d")
        h = fs.open_append("/d/f")
        fs.fsync_dir("/d")
        h.write(bytes(range(200)))
        fs.crash()
        return fs.read("/d/f")

    assert run(3) == run(3)
    assert len({run(s) for s in range(10)}) > 1


def test_new_file_needs_a_directory_fsync_to_survive() -> None:
    fs = make_fs()
    h = fs.open_append("/d/f")
    h.write(b"x")
    h.sync()  # the data is durable, the name is not
    fs.crash(torn=False)
    assert not fs.exists("/d/f")
    assert fs.list_dir("/d") == []


def test_rename_and_delete_are_durable_after_fsync_dir() -> None:
    fs = make_fs()
    fs.open_append("/d/a").sync()
    fs.fsync_dir("/d")
    fs.rename("/d/a", "/d/b")
    fs.crash(torn=False)
    assert fs.list_dir("/d") == ["a"]
    fs.rename("/d/a", "/d/b")
    fs.fsync_dir("/d")
    fs.delete("/d/b")
    fs.crash(torn=False)
    assert fs.list_dir("/d") == ["b"]
    fs.delete("/d/b")
    fs.fsync_dir("/d")
    fs.crash()
    assert fs.list_dir("/d") == []


def test_a_crash_keeps_a_prefix_of_unsynced_directory_operations_in_order() -> None:
    for kept in range(4):
        fs = make_fs()
        for name in "abc":
            fs.open_append(f"/d/{name}")
        fs.crash(dir_ops_kept=kept)
        assert fs.list_dir("/d") == ["a", "b", "c"][:kept]


def test_handles_from_before_a_crash_are_dead() -> None:
    fs = make_fs()
    h = fs.open_append("/d/f")
    fs.crash()
    with pytest.raises(StorageError, match="before a crash"):
        h.write(b"x")


def test_truncate_is_durable() -> None:
    fs = make_fs()
    h = fs.open_append("/d/f")
    fs.fsync_dir("/d")
    h.write(b"0123456789")
    fs.truncate("/d/f", 4)
    fs.crash()
    assert fs.read("/d/f") == b"0123"


def test_missing_files_and_directories_raise_storage_error_with_enoent() -> None:
    fs = make_fs()
    for call in (lambda: fs.read("/d/nope"), lambda: fs.size("/d/nope"), lambda: fs.delete("/d/nope"),
                 lambda: fs.open_append("/nodir/f"), lambda: fs.list_dir("/nodir")):
        with pytest.raises(StorageError) as info:
            call()
        assert info.value.errno == errno.ENOENT


def test_read_ranges_and_free_space() -> None:
    fs = MemoryFS(capacity_bytes=100)
    fs.make_dirs("/d")
    fs.open_append("/d/f").write(b"0123456789")
    assert fs.read("/d/f", 3, 4) == b"3456"
    assert fs.read("/d/f", 8, 10) == b"89"
    assert fs.read("/d/f", 20) == b""
    assert fs.free_space("/d") == 90


def test_memoryfs_is_thread_safe() -> None:
    fs = make_fs()
    handles = [fs.open_append(f"/d/{i}") for i in range(4)]

    def writer(i: int) -> None:
        for _ in range(2000):
            handles[i].write(b"x")
            handles[i].sync()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(fs.size(f"/d/{i}") == 2000 for i in range(4))
    assert fs.stats.syncs == 8000


# -- FaultyFS ---------------------------------------------------------------------------------------------

def test_enospc_after_budget_writes_what_fits_then_raises() -> None:
    inner = make_fs()
    fs = FaultyFS(inner, write_budget_bytes=5)
    h = fs.open_append("/d/f")
    h.write(b"abc")
    assert fs.free_space("/d") == 2
    with pytest.raises(NoSpaceError) as info:
        h.write(b"defg")
    assert info.value.errno == errno.ENOSPC
    assert "No space left on device" in str(info.value) and "/d/f" in str(info.value)
    assert inner.read("/d/f") == b"abcde"  # a real short write
    with pytest.raises(NoSpaceError):
        h.write(b"z")
    fs.write_budget_bytes = None
    h.write(b"z")
    assert inner.read("/d/f") == b"abcdez"


def test_eio_on_fdatasync_does_not_sync() -> None:
    inner = make_fs()
    fs = FaultyFS(inner, fail_next_syncs=1)
    h = fs.open_append("/d/f")
    inner.fsync_dir("/d")
    h.write(b"data")
    with pytest.raises(StorageError) as info:
        h.sync()
    assert info.value.errno == errno.EIO and info.value.op == "fdatasync"
    assert inner.unsynced_bytes("/d/f") == 4
    h.sync()
    assert inner.unsynced_bytes("/d/f") == 0
    assert (fs.stats.syncs, fs.stats.failed_syncs) == (1, 1)


def test_random_sync_failures_are_seeded() -> None:
    def failures(seed: int) -> list[bool]:
        fs = FaultyFS(make_fs(), seed=seed, sync_eio_rate=0.5)
        h = fs.open_append("/d/f")
        out = []
        for _ in range(30):
            try:
                h.sync()
                out.append(False)
            except StorageError:
                out.append(True)
        return out

    assert failures(1) == failures(1)
    assert any(failures(1)) and not all(failures(1))


def test_bit_flip_on_read_changes_exactly_one_bit() -> None:
    inner = make_fs()
    inner.open_append("/d/f").write(bytes(64))
    fs = FaultyFS(inner, seed=3, read_bit_flip_rate=1.0)
    data = fs.read("/d/f")
    assert sum(bin(b).count("1") for b in data) == 1
    assert inner.read("/d/f") == bytes(64)  # the stored data is intact


def test_flip_stored_bit_damages_the_stored_data() -> None:
    inner = make_fs()
    inner.open_append("/d/f").write(bytes(8))
    fs = FaultyFS(inner, seed=3)
    bit = fs.flip_stored_bit("/d/f", 13)
    assert bit == 13
    assert inner.read("/d/f") == bytes([0, 1 << 5, 0, 0, 0, 0, 0, 0])


# -- RealFS -----------------------------------------------------------------------------------------------

def test_realfs_round_trip(tmp_path: Path) -> None:
    fs = RealFS()
    d = str(tmp_path / "a" / "b")
    fs.make_dirs(d)
    h = fs.open_append(f"{d}/f")
    h.write(b"hello ")
    h.write(memoryview(b"world"))
    h.sync()
    h.close()
    fs.fsync_dir(d)
    assert fs.read(f"{d}/f") == b"hello world"
    assert fs.read(f"{d}/f", 6, 3) == b"wor"
    assert fs.read(f"{d}/f", 6, 100) == b"world"
    assert fs.size(f"{d}/f") == 11
    h = fs.open_append(f"{d}/f")  # reopening appends
    h.write(b"!")
    h.close()
    assert fs.read(f"{d}/f") == b"hello world!"
    fs.truncate(f"{d}/f", 5)
    assert fs.read(f"{d}/f") == b"hello"
    fs.rename(f"{d}/f", f"{d}/g")
    assert fs.list_dir(d) == ["g"]
    assert fs.exists(f"{d}/g") and not fs.exists(f"{d}/f")
    fs.delete(f"{d}/g")
    assert fs.list_dir(d) == []
    assert fs.free_space(d) > 0


def test_realfs_errors_are_storage_errors(tmp_path: Path) -> None:
    fs = RealFS()
    with pytest.raises(StorageError) as info:
        fs.read(str(tmp_path / "missing"))
    assert info.value.errno == errno.ENOENT and info.value.op == "read"
    with pytest.raises(StorageError):
        fs.open_append(str(tmp_path / "no" / "dir" / "f"))
    with pytest.raises(StorageError):
        fs.fsync_dir(str(tmp_path / "missing"))


def test_enospc_from_the_os_becomes_no_space_error() -> None:
    err = StorageError.from_os_error("write", "/x", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert isinstance(err, NoSpaceError)
    assert type(StorageError.from_os_error("write", "/x", OSError(errno.EIO, "io"))) is StorageError


def test_realfs_poke_flips_a_stored_byte(tmp_path: Path) -> None:
    fs = RealFS()
    path = str(tmp_path / "f")
    h = fs.open_append(path)
    h.write(b"\x00\x00")
    h.close()
    FaultyFS(fs).flip_stored_bit(path, 9)
    assert fs.read(path) == b"\x00\x02"
