"""Snapshot files: format, checksum, and atomic replacement under crashes and faults."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from hutch.storage.errors import CorruptSnapshot, NoSpaceError, StorageError
from hutch.storage.fs import RealFS
from hutch.storage.memfs import FaultyFS, MemoryFS
from hutch.storage.snapshot import (
    HEADER_BYTES,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
    write_snapshot,
)

PATH = "/data/definitions.snap"


def fresh() -> MemoryFS:
    fs = MemoryFS(seed=1)
    fs.make_dirs("/data")
    return fs


def test_layout() -> None:
    data = b"".join(encode_snapshot(b"payload", kind=3))
    assert data[:8] == b"HUTCHSNP"
    assert struct.unpack_from("<BBHQ", data, 8) == (1, 3, 0, 7)
    assert len(data) == HEADER_BYTES + 7
    assert decode_snapshot(data, kind=3) == b"payload"


def test_parts_equal_one_payload() -> None:
    assert encode_snapshot([b"ab", b"", memoryview(b"cd")]) == [encode_snapshot(b"abcd")[0], b"ab", b"",
                                                                  memoryview(b"cd")]
    assert decode_snapshot(b"".join(encode_snapshot([b"ab", b"cd"]))) == b"abcd"


def test_round_trip_and_replace() -> None:
    fs = fresh()
    assert read_snapshot(fs, PATH) is None
    write_snapshot(fs, PATH, b"one")
    assert read_snapshot(fs, PATH) == b"one"
    write_snapshot(fs, PATH, b"two" * 1000, kind=2)
    assert read_snapshot(fs, PATH, kind=2) == b"two" * 1000
    assert fs.list_dir("/data") == ["definitions.snap"]


def test_every_damage_is_detected() -> None:
    data = b"".join(encode_snapshot(b"some state", kind=1))
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptSnapshot):
            decode_snapshot(bytes(damaged), kind=1)
    for cut in range(len(data)):
        with pytest.raises(CorruptSnapshot):
            decode_snapshot(data[:cut])
    with pytest.raises(CorruptSnapshot, match="says"):
        decode_snapshot(data + b"\x00")
    with pytest.raises(CorruptSnapshot, match="kind"):
        decode_snapshot(data, kind=2)


class Stop(Exception):
    pass


class StopAfter:
    """Delegates to a FileSystem and raises Stop at the n-th file or directory operation (a crash point)."""

    def __init__(self, inner: MemoryFS, steps: int) -> None:
        self.inner = inner
        self.steps = steps

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise Stop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in {"open_append", "rename", "fsync_dir", "delete"}:
            return attr

        def wrapped(*args: Any) -> Any:
            self.step()
            result = attr(*args)
            return StepHandle(self, result) if name == "open_append" else result

        return wrapped


class StepHandle:
    def __init__(self, fs: StopAfter, inner: Any) -> None:
        self.fs = fs
        self.inner = inner

    def write(self, data: bytes) -> None:
        self.fs.step()
        self.inner.write(data)

    def sync(self) -> None:
        self.fs.step()
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


def test_a_crash_at_any_point_leaves_the_old_or_the_new_snapshot() -> None:
    """Crash before each FS operation of a replacement, keeping any prefix of the unsynced work."""
    for stop_after in range(8):
        for dir_ops_kept in range(3):
            for torn_bytes in (0, 5, 10_000):
                fs = fresh()
                write_snapshot(fs, PATH, b"old state")
                fs.open_append(PATH + ".tmp").write(b"junk")  # a stale tmp file: one more step (delete)
                try:
                    write_snapshot(StopAfter(fs, stop_after), PATH, b"new state")  # type: ignore[arg-type]
                except Stop:
                    pass
                fs.crash(dir_ops_kept=dir_ops_kept, torn_bytes=torn_bytes)
                assert read_snapshot(fs, PATH) in (b"old state", b"new state")
                if stop_after >= 6:  # all six steps ran:
                    assert read_snapshot(fs, PATH) == b"new state"  # returned, so durable


def test_stale_tmp_file_is_replaced() -> None:
    fs = fresh()
    fs.open_append(PATH + ".tmp").write(b"junk from a crash")
    write_snapshot(fs, PATH, b"state")
    assert read_snapshot(fs, PATH) == b"state"
    assert fs.list_dir("/data") == ["definitions.snap"]


def test_enospc_keeps_the_old_snapshot_and_removes_the_tmp_file() -> None:
    inner = fresh()
    write_snapshot(inner, PATH, b"old")
    fs = FaultyFS(inner, write_budget_bytes=10)
    with pytest.raises(NoSpaceError):
        write_snapshot(fs, PATH, b"new" * 100)
    assert read_snapshot(inner, PATH) == b"old"
    assert inner.list_dir("/data") == ["definitions.snap"]


def test_eio_on_fdatasync_keeps_the_old_snapshot() -> None:
    inner = fresh()
    write_snapshot(inner, PATH, b"old")
    with pytest.raises(StorageError):
        write_snapshot(FaultyFS(inner, fail_next_syncs=1), PATH, b"new")
    inner.crash()
    assert read_snapshot(inner, PATH) == b"old"


def test_realfs(tmp_path: Path) -> None:
    fs = RealFS()
    path = str(tmp_path / "raft.snap")
    write_snapshot(fs, path, [b"a" * 100_000, b"b"])
    assert read_snapshot(fs, path) == b"a" * 100_000 + b"b"
    write_snapshot(fs, path, b"")
    assert read_snapshot(fs, path) == b""
    fs.poke(path, 3)
    with pytest.raises(CorruptSnapshot, match="magic"):
        read_snapshot(fs, path)
