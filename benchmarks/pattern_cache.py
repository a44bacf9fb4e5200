"""Micro-benchmark of the per-message cost of user patterns (issue 21): a topic-permission check and a
policy match, as the publish path and a queue declaration run them, in ns per call.

Before issue 21 every call searched with RE2; now results are cached per (pattern, name)
(hutch.core.patterns). Compare two trees by running this script with each on PYTHONPATH, in alternating
rounds (docs/BENCHMARKS.md, "User pattern caches (issue 21)").

Usage: python benchmarks/pattern_cache.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import timeit

from hutch.core.auth import topic_permission_allows
from hutch.core.policy import make_policy

KEY = "orders.eu.created"
PATTERNS = ("^orders\\.", "^(orders|billing|users)\\.[a-z]+\\.(created|deleted)$")
CALLS = 200_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="repeats; the fastest is reported")
    args = ap.parse_args()
    for pattern in PATTERNS:
        check = functools.partial(topic_permission_allows, pattern, "u", "/", KEY)
        best = min(timeit.repeat(check, number=CALLS, repeat=args.rounds))
        print(f"topic permission {pattern!r}: {best / CALLS * 1e9:.0f} ns per check")
    policy = make_policy("/", "p", PATTERNS[0], {"max-length": 10})
    best = min(timeit.repeat(lambda: policy.matches("queues", KEY), number=CALLS, repeat=args.rounds))
    print(f"policy match {PATTERNS[0]!r}: {best / CALLS * 1e9:.0f} ns per match")


if __name__ == "__main__":
    main()
