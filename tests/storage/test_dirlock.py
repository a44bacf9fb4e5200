"""The data directory lock (storage/dirlock.py): exclusive, names its holder, released on release."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hutch.storage.dirlock import LOCK_FILE, DataDirLock, DataDirLocked


def test_a_second_lock_is_refused_with_the_holders_pid_until_released(tmp_path: Path):
    data = tmp_path / "new" / "data"
    first = DataDirLock.acquire(str(data))  # creates the directory
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert (data / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(DataDirLocked) as refused:
        DataDirLock.acquire(str(data))  # flock is per open file: a second open conflicts even in one process
    assert refused.value.holder_pid == os.getpid()
    assert f"in use by process {os.getpid()}" in str(refused.value)
    assert (data / LOCK_FILE).read_text().strip() == str(os.getpid())  # the refused one wiped nothing
    first.release()
    assert not first.held
    with DataDirLock.acquire(str(data)) as second:
        assert second.held
    first.release()  # twice is harmless


def test_a_lock_file_left_by_a_dead_holder_does_not_block(tmp_path: Path):
    (tmp_path / LOCK_FILE).write_text("999999\n")  # content alone never locks: only a held flock does
    with DataDirLock.acquire(str(tmp_path)) as lock:
        assert lock.held
