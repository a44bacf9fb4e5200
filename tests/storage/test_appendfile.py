"""Batch-framed append files and the node's group-commit driver: batching, ENOSPC, EIO, deferred close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from hutch.runtime.queue_types.classic.persistence import FLOW_BATCH_BYTES, GroupCommit
from hutch.runtime.sync_placement import INLINE_SYNC_MAX_S
from hutch.storage import records
from hutch.storage.appendfile import AppendFile, iter_entries, scan_file
from hutch.storage.errors import CorruptRecord, NoSpaceError
from hutch.storage.memfs import FaultyFS, MemoryFS

PATH = "/d/f.x"


def entries_of(fs: MemoryFS | FaultyFS, path: str = PATH) -> list[bytes]:
    _seed, result = scan_file(fs.read(path), path, 0x41)
    assert result.torn_tail is None
    return [bytes(e) for r in result.records for e in iter_entries(r.payload)]


def test_one_record_per_flush_and_offsets_point_at_entries() -> None:
    fs = MemoryFS()
    fs.make_dirs("/d")
    f = AppendFile(fs, PATH, 0x41)
    offsets = [f.add(b"a" * n) for n in (1, 5, 9)]
    assert f.buffered_entry(offsets[1], 5) == b"aaaaa"
    f.flush()
    more = f.add(b"tail")
    f.flush()
    assert len(scan_file(fs.read(PATH), PATH, 0x41)[1].records) == 2
    assert entries_of(fs) == [b"a", b"aaaaa", b"a" * 9, b"tail"]
    for off, n in zip([*offsets, more], (1, 5, 9, 4), strict=True):
        assert len(fs.read(PATH, off, n)) == n
    assert fs.read(PATH, more, 4) == b"tail"


def test_put_buffers_exactly_as_add_does() -> None:
    fs = MemoryFS()
    fs.make_dirs("/d")
    a = AppendFile(fs, "/d/a.x", 0x41, size=0, seed=0)
    b = AppendFile(fs, "/d/b.x", 0x41, size=0, seed=0)
    b.seed, b._header = a.seed, a._header  # same seed: the same bytes are expected
    for n, durable in ((1, False), (7, True), (0, False)):
        a.add(b"e" * n, durable)
        b.put(b"e" * n, durable)
        assert (a.pending_bytes, a.durable_pending) == (b.pending_bytes, b.durable_pending)
    assert b.buffered_entries() == [b"e", b"e" * 7, b""]
    a.flush()
    b.flush()
    assert fs.read("/d/a.x") == fs.read("/d/b.x")
    assert entries_of(fs, "/d/b.x") == [b"e", b"e" * 7, b""]


def test_a_record_forged_inside_an_entry_is_not_taken_for_one_of_the_file() -> None:
    """A client controls message bodies: a body holding a well-formed record must not turn a torn last
    write into "damage in the middle" (refusing to start) nor be resurrected by salvage."""
    fs = MemoryFS()
    fs.make_dirs("/d")
    f = AppendFile(fs, PATH, 0x41)
    f.add(b"first")
    f.flush()
    forged = records.encode(0x41, b"\x05\x00\x00\x00evil!")  # valid without the file's seed
    f.add(b"x" * 10 + forged + b"y" * 10)
    f.flush()
    data = fs.read(PATH)
    torn = data[:len(data) - 5]  # the last write torn: the forged record inside it is whole
    _seed, result = scan_file(torn, PATH, 0x41)
    assert result.torn_tail is not None  # a torn tail, not CorruptRecord
    assert [bytes(e) for r in result.records for e in iter_entries(r.payload)] == [b"first"]
    with pytest.raises(CorruptRecord):  # what an unseeded checksum would conclude: damage in the middle
        records.scan(torn, start=21, types=frozenset({0x41}), seed=0)
    salvaged = records.salvage(torn, start=21, types=frozenset({0x41}), seed=f.seed)
    assert len(salvaged.records) == 1


def test_a_new_file_survives_a_crash_once_synced() -> None:
    fs = MemoryFS()
    fs.make_dirs("/d")
    f = AppendFile(fs, PATH, 0x41)
    f.add(b"x")
    f.flush()
    f.sync()
    fs.crash()
    assert entries_of(fs) == [b"x"]  # the directory entry was synced with the data


def test_enospc_rolls_back_the_partial_record_and_keeps_the_batch() -> None:
    fs = FaultyFS(MemoryFS())
    fs.make_dirs("/d")
    f = AppendFile(fs, PATH, 0x41)
    f.add(b"first")
    f.flush()
    f.add(b"second" * 100)
    fs.write_budget_bytes = 50  # a short write, then ENOSPC
    with pytest.raises(NoSpaceError):
        f.flush()
    assert entries_of(fs) == [b"first"]  # no half record left behind
    fs.write_budget_bytes = None
    f.flush()
    assert entries_of(fs) == [b"first", b"second" * 100]


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_group_commit_batches_every_touch_of_an_iteration_into_one_sync() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        synced: list[int] = []
        gc.start(asyncio.get_running_loop(), synced.append)
        files = [AppendFile(fs, f"/d/{i}", 0x31 if i else 0x21) for i in range(3)]
        for i in range(300):
            f = files[i % 3]
            f.add(b"m")
            gc.touch(f, durable=True)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if gc.synced_seq == 300:
                break
        assert gc.synced_seq == 300 and synced[-1] == 300
        assert gc.syncs == 1 and gc.fsyncs == 3
        assert fs.stats.syncs == 3
        await gc.close()
    _run(main())


def test_group_commit_retries_after_enospc_and_fails_on_eio() -> None:
    async def main() -> None:
        fs = FaultyFS(MemoryFS())
        fs.make_dirs("/d")
        gc = GroupCommit()
        synced: list[int] = []
        gc.start(asyncio.get_running_loop(), synced.append)
        f = AppendFile(fs, "/d/a", 0x31)
        fs.write_budget_bytes = 0
        f.add(b"m")
        gc.touch(f, durable=True)
        await asyncio.sleep(0.1)
        assert gc.synced_seq == 0 and gc.failed is None  # waiting for space, nothing confirmed
        fs.write_budget_bytes = None
        for _ in range(30):
            await asyncio.sleep(0.1)
            if gc.synced_seq == 1:
                break
        assert gc.synced_seq == 1
        fs.fail_next_syncs = 1
        f.add(b"n")
        gc.touch(f, durable=True)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if gc.failed is not None:
                break
        assert gc.failed is not None and synced[-1] == 0  # channels are told to nack
        await gc.close()
    _run(main())


def test_retired_files_close_only_after_the_sync_in_flight() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        gc.start(asyncio.get_running_loop(), lambda _s: None)
        f = AppendFile(fs, "/d/a", 0x31)
        f.add(b"m")
        gc.touch(f, durable=True)
        await asyncio.sleep(0)  # the job starts (flush on the loop, fdatasync in the executor)
        gc.retire(f, delete=True)
        assert not fs.exists("/d/a")
        for _ in range(100):
            await asyncio.sleep(0.01)
            if gc.synced_seq == 1:
                break
        assert gc.synced_seq == 1 and gc.failed is None
        assert f.handle is None
        await gc.close()
    _run(main())


def test_a_batch_bigger_than_the_flow_bound_marks_storage_congested_until_one_is_not() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        drained: list[bool] = []
        gc.on_drained = lambda: drained.append(True)
        gc.start(asyncio.get_running_loop(), lambda _s: None)
        f = AppendFile(fs, "/d/a", 0x31)
        for _ in range(FLOW_BATCH_BYTES // 65536 + 1):
            f.add(b"x" * 65536)
        gc.touch(f, durable=True)
        await asyncio.sleep(0)
        assert gc.congested and not drained
        f.add(b"small")
        gc.touch(f, durable=True)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if gc.synced_seq == 2:
                break
        assert not gc.congested and drained == [True]
        await gc.close()
    _run(main())


class _ThreadNotingFile(AppendFile):
    """An append file that notes on which thread it was synced."""

    __slots__ = ("sync_threads",)

    def __init__(self, fs: MemoryFS | FaultyFS, path: str) -> None:
        super().__init__(fs, path, 0x31)
        self.sync_threads: list[int] = []

    def sync(self) -> None:
        self.sync_threads.append(threading.get_ident())
        super().sync()


async def _until(cond: Callable[[], bool]) -> None:
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_a_fast_sync_runs_on_the_loop_when_it_has_time_and_in_the_executor_when_not() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        loop_has_time = [True]
        gc.placement.has_time = lambda: loop_has_time[0]
        gc.start(asyncio.get_running_loop(), lambda _s: None)
        f = _ThreadNotingFile(fs, "/d/a")
        loop_thread = threading.get_ident()

        async def one_batch(n: int) -> None:
            f.add(b"m")
            gc.touch(f, durable=True)
            await _until(lambda: gc.synced_seq == n)

        await one_batch(1)  # nothing measured yet: the first job runs in the executor
        assert f.sync_threads[-1] != loop_thread and gc.placement.inline_syncs == 0
        assert gc.placement.last_sync_s < INLINE_SYNC_MAX_S
        await one_batch(2)  # fast disk, idle loop: synced on the loop thread, no hand-off
        assert f.sync_threads[-1] == loop_thread and gc.placement.inline_syncs == 1
        loop_has_time[0] = False  # a saturated loop hands the sync off
        await one_batch(3)
        assert f.sync_threads[-1] != loop_thread and gc.placement.inline_syncs == 1
        loop_has_time[0] = True
        gc.placement.last_sync_s = 2 * INLINE_SYNC_MAX_S  # a slow disk: the loop does not block on it
        await one_batch(4)
        assert f.sync_threads[-1] != loop_thread and gc.placement.inline_syncs == 1
        await one_batch(5)  # that job measured a fast sync again
        assert f.sync_threads[-1] == loop_thread and gc.placement.inline_syncs == 2
        await gc.close()
    _run(main())


def test_a_sync_on_the_loop_comes_after_the_writes_scheduled_in_its_turn() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        gc.placement.has_time = lambda: True
        gc.placement.last_sync_s = 0.0
        loop = asyncio.get_running_loop()
        gc.start(loop, lambda _s: None)
        f = AppendFile(fs, "/d/a", 0x31)
        order: list[str] = []
        f.add(b"m")
        gc.touch(f, durable=True)  # schedules the job first...
        loop.call_soon(order.append, "deliveries written")  # ...then the input's writes are scheduled
        gc.after_sync(lambda: order.append("synced"))
        await _until(lambda: gc.synced_seq == 1)
        assert order == ["deliveries written", "synced"] and gc.placement.inline_syncs == 1
        await gc.close()
    _run(main())


def test_a_failed_sync_on_the_loop_rejects_what_waited_for_it() -> None:
    async def main() -> None:
        fs = FaultyFS(MemoryFS())
        fs.make_dirs("/d")
        gc = GroupCommit()
        gc.placement.has_time = lambda: True
        gc.placement.last_sync_s = 0.0
        synced: list[int] = []
        gc.start(asyncio.get_running_loop(), synced.append)
        rejected: list[str] = []

        class Receipt:
            def settle(self, queue: object) -> None:
                raise AssertionError("settled after a failed sync")

            def reject(self, queue: object, error: str | None = None) -> None:
                rejected.append(error or "")

        f = AppendFile(fs, "/d/a", 0x31)
        fs.fail_next_syncs = 1
        f.add(b"m")
        gc.touch(f, durable=True)
        gc.confirm_after_sync(Receipt(), "q")
        await _until(lambda: gc.failed is not None)
        assert gc.placement.inline_syncs == 1 and synced == [0]
        assert len(rejected) == 1 and "message storage failed" in rejected[0]
        await gc.close()
    _run(main())


def test_a_file_keeps_its_descriptor_for_one_job_after_its_last_write() -> None:
    async def main() -> None:
        fs = MemoryFS()
        fs.make_dirs("/d")
        gc = GroupCommit()
        gc.start(asyncio.get_running_loop(), lambda _s: None)
        a = AppendFile(fs, "/d/a", 0x31)
        b = AppendFile(fs, "/d/b", 0x31)
        a.add(b"m")
        gc.touch(a, durable=True)
        await _until(lambda: gc.synced_seq == 1)
        assert a.handle is not None  # a publisher writing in bursts does not reopen it every burst
        b.add(b"m")
        gc.touch(b, durable=True)
        await _until(lambda: gc.synced_seq == 2)
        assert a.handle is None and b.handle is not None  # idle for a whole job: given back
        a.add(b"n")
        gc.touch(a, durable=True)
        await _until(lambda: gc.synced_seq == 3)
        assert a.handle is not None and b.handle is None
        await gc.close()
    _run(main())
