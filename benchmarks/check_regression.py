"""Compare a scenarios.py results file against the recorded ratios; say which scenario fell back (exit 1).

    python benchmarks/check_regression.py RESULTS.json                       # against benchmarks/expected_ratios.json
    python benchmarks/check_regression.py RESULTS.json --expected OTHER.json --tolerance 0.2
    python benchmarks/check_regression.py RESULTS.json --record              # write RESULTS' ratios as the new record
                                                                             # (scenarios it did not run keep theirs)

The ratios are hutch / RabbitMQ medians from the same sitting (scenarios.py's "summary"), so they carry over
between machines better than rates do. A scenario falls back when:
- `throughput_ratio` (msg/s or connections/s) is below the recorded one by more than the tolerance,
- `cpu_ratio` (broker CPU per message or per connection) or `memory_ratio` (RSS per idle connection) is above
  the recorded one by more than the tolerance,
- `p50_ratio` / `p99_ratio` (latency) is above the recorded one by more than the latency tolerance (latency
  under saturation swings more from run to run).
A scenario with no recorded ratio ("no recorded ratio": e.g. one added to scenarios.py after the record was made;
`--record` after a full run records it), or missing from the results, is listed but is not a failure; a recorded
scenario whose runs failed is, and an unrecorded one whose runs failed is listed with its failed runs. Names that
scenarios.py renamed are matched under their new names (ALIASES). Exit status: 0 nothing fell back, 1 something
did, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXPECTED = Path(__file__).resolve().parent / "expected_ratios.json"
HIGHER_IS_BETTER = ("throughput_ratio",)
LOWER_IS_BETTER = ("cpu_ratio", "memory_ratio")
LATENCY = ("p50_ratio", "p99_ratio")
# scenario names scenarios.py renamed: old -> new (a record or results file may use either)
ALIASES = {"classic-16B-20k-perf": "classic-16B-transient-20k-perf"}


def renamed(d: dict[str, Any]) -> dict[str, Any]:
    return {ALIASES.get(k, k): v for k, v in d.items()}


def compare(summary: dict[str, Any], expected: dict[str, Any], tol: float, lat_tol: float,
            failed: set[str]) -> tuple[list[str], list[str]]:
    """(lines of the report, names of the scenarios that fell back)."""
    lines, fell = [], []
    for name, exp in expected.items():
        got = summary.get(name)
        if name in failed:
            lines.append(f"FELL BACK {name}: its runs failed")
            fell.append(name)
            continue
        if got is None:
            lines.append(f"not run   {name}")
            continue
        bad = []
        for key, want in exp.items():
            have = got.get(key)
            if not isinstance(want, (int, float)) or have is None:
                continue
            if key in HIGHER_IS_BETTER and have < want * (1 - tol):
                bad.append(f"{key} {have:.2f} < recorded {want:.2f} - {tol:.0%}")
            elif key in LOWER_IS_BETTER and have > want * (1 + tol):
                bad.append(f"{key} {have:.2f} > recorded {want:.2f} + {tol:.0%}")
            elif key in LATENCY and have > want * (1 + lat_tol):
                bad.append(f"{key} {have:.2f} > recorded {want:.2f} + {lat_tol:.0%}")
        shown = ", ".join(f"{k} {got.get(k):.2f} (recorded {v:.2f})" for k, v in exp.items()
                          if isinstance(v, (int, float)) and got.get(k) is not None)
        if bad:
            fell.append(name)
            lines.append(f"FELL BACK {name}: " + "; ".join(bad))
        else:
            lines.append(f"ok        {name}: {shown or 'nothing comparable'}")
    for name in sorted(set(summary) - set(expected)):
        note = " (its runs failed)" if name in failed else ""
        lines.append(f"no recorded ratio {name}{note}")
    return lines, fell


def record(summary: dict[str, Any], meta: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    keys = (*HIGHER_IS_BETTER, *LOWER_IS_BETTER, *LATENCY)
    scen = {name: {k: s[k] for k in keys if s.get(k) is not None} for name, s in renamed(summary).items()}
    kept = {k: v for k, v in renamed(old.get("scenarios", {})).items() if k not in scen}
    return {**old, "source": f"scenarios.py run of commit {meta.get('commit')} at {meta.get('started_utc')}, "
                             f"{meta.get('rounds')} rounds of {meta.get('seconds')} s"
                             + (f" (and {len(kept)} scenarios from the record before)" if kept else ""),
            "scenarios": {**kept, **{k: v for k, v in scen.items() if v}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="JSON written by benchmarks/scenarios.py --out")
    ap.add_argument("--expected", default=str(EXPECTED))
    ap.add_argument("--tolerance", type=float, default=None, help="default: the expected file's (else 0.15)")
    ap.add_argument("--latency-tolerance", type=float, default=None, help="default: the expected file's (else 0.5)")
    ap.add_argument("--record", action="store_true", help="write the results' ratios to --expected and stop")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(Path(args.results).read_text())
        summary, runs = doc["summary"], doc.get("runs", [])
        exp_doc = json.loads(Path(args.expected).read_text()) if Path(args.expected).exists() else {}
    except (OSError, ValueError, KeyError) as exc:
        print(f"check_regression: cannot read the input: {exc}", file=sys.stderr)
        return 2
    if args.record:
        Path(args.expected).write_text(json.dumps(record(summary, doc.get("meta", {}), exp_doc), indent=1) + "\n")
        print(f"recorded {len(summary)} scenarios in {args.expected}")
        return 0
    tol = args.tolerance if args.tolerance is not None else exp_doc.get("tolerance", 0.15)
    lat_tol = args.latency_tolerance if args.latency_tolerance is not None else exp_doc.get("latency_tolerance", 0.5)
    failed = {ALIASES.get(r["scenario"], r["scenario"]) for r in runs if "error" in r}
    lines, fell = compare(renamed(summary), renamed(exp_doc.get("scenarios", {})), tol, lat_tol, failed)
    print("\n".join(lines))
    print(f"{len(fell)} scenario(s) fell back: {', '.join(fell)}" if fell else "no scenario fell back")
    return 1 if fell else 0


if __name__ == "__main__":
    sys.exit(main())
