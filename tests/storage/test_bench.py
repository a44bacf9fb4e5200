"""Micro-benchmark of the segmented log on the real file system (marked slow; figures in docs/storage.md).

Run: ``.venv/bin/python -m pytest tests/storage/test_bench.py -m slow -s -q``

Three runs of 100-byte entries:

* group commit: the loop thread appends in chunks of 100 (one ``data_received``'s worth) while one executor
  thread runs sync jobs back to back, exactly as the runtime will drive the log; unbounded, and with at most
  1000 / 100 entries not yet durable (a publisher confirm window);
* one fdatasync per entry, the baseline group commit is measured against;
* the same group-commit workload on MemoryFS: the CPU cost of the Python side alone.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.log import LogOptions, SegmentedLog, SyncJob
from hutch.storage.memfs import FaultyFS, MemoryFS

ENTRY = b"m" * 100
CHUNK = 100


def group_commit(fs: FileSystem, directory: str, total: int, window: int | None = None) -> tuple[float, int]:
    """Entries/s until all are durable, and the number of sync jobs (= fdatasyncs) it took.

    ``window``: at most this many entries appended but not yet durable, like a publisher's confirm window.
    """
    log = SegmentedLog.open(fs, directory, LogOptions())
    jobs = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        running: tuple[SyncJob, Future[None]] | None = None
        appended = 0
        while appended < total or running is not None or log.pending_count:
            if appended < total and (window is None or log.last_seq - log.synced_seq + CHUNK <= window):
                log.append([ENTRY] * CHUNK)
                appended += CHUNK
            elif running is not None:
                running[1].result()  # nothing may be appended now: wait for the IO
            if running is not None and running[1].done():
                running[1].result()
                running[0].complete()
                running = None
            if running is None and (job := log.begin_sync()) is not None:
                jobs += 1
                running = (job, pool.submit(job.run))
    elapsed = time.perf_counter() - start
    assert log.synced_seq == total
    log.close()
    return total / elapsed, jobs


def sync_per_entry(fs: FileSystem, directory: str, total: int) -> float:
    log = SegmentedLog.open(fs, directory, LogOptions())
    start = time.perf_counter()
    for _ in range(total):
        log.append([ENTRY])
        log.sync()
    elapsed = time.perf_counter() - start
    log.close()
    return total / elapsed


@pytest.mark.slow
def test_group_commit_benchmark(tmp_path: Path) -> None:
    total = 200_000
    rows: list[tuple[str, float, float]] = []
    for window in (None, 1000, 100):
        fs = FaultyFS(RealFS())  # no faults: it only counts fdatasyncs
        rate, _ = group_commit(fs, str(tmp_path / f"group-{window}"), total, window)
        label = "unbounded" if window is None else f"window {window}"
        rows.append((f"group commit, {label}", rate, fs.stats.syncs * 1000 / total))
    single_total = 2_000
    single = FaultyFS(RealFS())
    single_rate = sync_per_entry(single, str(tmp_path / "single"), single_total)
    rows.append(("fdatasync per entry", single_rate, single.stats.syncs * 1000 / single_total))
    cpu_rate, _ = group_commit(MemoryFS(), "/bench", total)
    rows.append(("group commit, MemoryFS (CPU only)", cpu_rate, float("nan")))
    print(f"\n{'run (100-byte entries)':<36}{'entries/s':>12}{'fdatasyncs/1000':>18}")
    for label, rate, per_1000 in rows:
        print(f"{label:<36}{rate:>12,.0f}{per_1000:>18.2f}")
    assert rows[1][2] < 100  # window 1000: far fewer than one fdatasync per entry
    assert rows[1][1] > 5 * single_rate
