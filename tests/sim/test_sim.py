"""Seeded simulations of the Raft core: safety after every step, liveness after healing.

- `test_seeds`: SEEDS_PER_CHUNK x CHUNKS seeds; `make test` runs the first FAST_CHUNKS chunks (160 seeds), the
  others are marked slow (`make test-sim`, `make test-slow`).
- `test_regression_seeds`: seeds that once found a bug; they stay forever.
- `test_replay`: `HUTCH_SIM_SEED=N [HUTCH_SIM_LONG=1] pytest tests/sim -k replay` replays one seed
  (the same as `python -m tests.sim.replay N`).
- `test_broken_driver_is_caught`: a driver that sends before persisting must be caught, which shows the
  checks can fail.
- `test_seeds_long` (slow): thousands of seeds, and long runs with many faults.
"""

from __future__ import annotations

import os

import pytest

from .checker import SimViolation
from .run import RunStats, run_seed

CHUNKS = 10
SEEDS_PER_CHUNK = 80  # 800 seeds, ~12 s on one core
FAST_CHUNKS = 2  # `make test`: seeds 0-159 (each chunk asserts its crashes, membership changes, snapshots...)

# Seeds that found bugs while the core and the simulator were written (see docs/raft.md, "Found by the
# simulation"); each replays the failing schedule against the fixed code.
REGRESSION_SEEDS = [3, 5, 17, 25, 44, 59, 212]


def _run_chunk(seeds: range, long: bool = False) -> list[RunStats]:
    out = []
    for seed in seeds:
        out.append(run_seed(seed, long=long))
    return out


@pytest.mark.parametrize("chunk", [c if c < FAST_CHUNKS else pytest.param(c, marks=pytest.mark.slow)
                                   for c in range(CHUNKS)])
def test_seeds(chunk: int) -> None:
    stats = _run_chunk(range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK))
    # The faults and features must actually be exercised, or a green run proves nothing.
    assert sum(s.crashes for s in stats) > 0
    assert sum(s.conf_changes for s in stats) > 0
    assert sum(s.snapshots_sent for s in stats) > 0
    assert sum(s.transfers for s in stats) > 0
    assert sum(s.partitions for s in stats) > 0


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seeds(seed: int) -> None:
    run_seed(seed)
    run_seed(seed, long=True)


def test_replay() -> None:
    seed = os.environ.get("HUTCH_SIM_SEED")
    if seed is None:
        pytest.skip("set HUTCH_SIM_SEED=N (and HUTCH_SIM_LONG=1 for the long profile) to replay a seed")
    print(run_seed(int(seed), long=bool(os.environ.get("HUTCH_SIM_LONG"))))


def test_same_seed_same_run() -> None:
    assert run_seed(7) == run_seed(7)
    assert run_seed(7) != run_seed(8)


def test_broken_driver_is_caught() -> None:
    for seed in range(300):
        try:
            run_seed(seed, send_before_persist=True)
        except SimViolation as e:
            assert "replay: python -m tests.sim.replay" in str(e) and "--broken-driver" in str(e)
            return
    raise AssertionError("sending before persisting was never caught: the checks are too weak")


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(20))
def test_seeds_many(chunk: int) -> None:
    _run_chunk(range(100_000 + chunk * 500, 100_000 + (chunk + 1) * 500))


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(10))
def test_seeds_long(chunk: int) -> None:
    _run_chunk(range(200_000 + chunk * 40, 200_000 + (chunk + 1) * 40), long=True)
