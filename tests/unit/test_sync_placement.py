"""The placement rule of the group-commit drivers' syncs (runtime/sync_placement.py)."""

from __future__ import annotations

import pytest

from hutch.core.credit_flow import LoopLoad
from hutch.runtime.sync_placement import INLINE_SYNC_MAX_S, SyncPlacement


def test_a_sync_runs_on_the_loop_only_with_time_and_a_fast_disk_measured() -> None:
    assert not SyncPlacement().inline()  # outside a node: always the executor
    has_time = [True]
    p = SyncPlacement(lambda: has_time[0])
    assert not p.inline()  # nothing measured yet
    p.measure(lambda: None)
    assert p.last_sync_s < INLINE_SYNC_MAX_S and p.inline()
    has_time[0] = False
    assert not p.inline()
    has_time[0] = True
    p.last_sync_s = INLINE_SYNC_MAX_S
    assert not p.inline()


def test_a_sync_on_the_loop_is_counted_and_reported_even_when_it_fails() -> None:
    reported: list[float] = []
    p = SyncPlacement(lambda: True)
    p.busy = reported.append
    assert p.run_inline(lambda x: x + 1, 1) == 2

    def fails() -> None:
        raise OSError("EIO")

    with pytest.raises(OSError):
        p.run_inline(fails)
    assert p.inline_syncs == 2 and len(reported) == 2 and reported[-1] == p.last_sync_s


def test_following_the_loop_load_judges_time_by_saturation_and_counts_syncs_on_the_loop() -> None:
    now = [0.0]
    load = LoopLoad(lambda: now[0])
    p = SyncPlacement()
    p.follow_loop(load, count_busy=True)
    p.last_sync_s = 0.0
    assert p.inline()
    load.note_busy(0.09, 0.1)  # a saturated window
    now[0] = 0.1
    assert not p.inline()
    p.run_inline(lambda: None)
    assert load.busy_s > 0  # the sync on the loop counted as loop work
    q = SyncPlacement()
    q.follow_loop(load, count_busy=False)
    assert q.busy is None


def test_a_driver_may_allow_slower_syncs_on_the_loop() -> None:
    p = SyncPlacement(lambda: True, inline_max_s=0.01)
    p.last_sync_s = INLINE_SYNC_MAX_S * 2  # too slow for the default, within this driver's bound
    assert p.inline() and not SyncPlacement(lambda: True).inline()
    p.last_sync_s = 0.01
    assert not p.inline()
