"""Replay one simulation seed: `python -m tests.sim.replay SEED [--long] [--trace] [--broken-driver]`.

Prints the run's statistics, or the violated property; `--trace` prints every driver-level event
(starts, crashes, proposals, partitions, conf changes) with its tick, to read a failure step by step.
"""

from __future__ import annotations

import argparse
import sys
import time

from .checker import SimViolation
from .run import run_seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim.replay")
    ap.add_argument("seeds", type=int, nargs="+", help="seed(s) to replay")
    ap.add_argument("--long", action="store_true", help="the long profile (as in the slow test)")
    ap.add_argument("--trace", action="store_true", help="print every driver event")
    ap.add_argument("--broken-driver", action="store_true", help="send before persisting (must fail)")
    args = ap.parse_args(argv)
    failed = 0
    for seed in args.seeds:
        t0 = time.perf_counter()
        try:
            stats = run_seed(
                seed, long=args.long, send_before_persist=args.broken_driver, trace=print if args.trace else None
            )
        except SimViolation as e:
            print(f"FAIL {e}")
            failed += 1
            continue
        print(f"ok seed {seed} in {time.perf_counter() - t0:.2f}s: {stats}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
