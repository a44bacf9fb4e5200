"""Turn run_core.sh's JSON lines into a Markdown table: per scenario, each round's hutch and RabbitMQ
figures, their ratio, and the median ratio.

Usage: python benchmarks/summarize.py results.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(path: str) -> int:
    runs: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    order: list[str] = []
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if not line.strip():
            continue
        rec = json.loads(line)
        runs[(rec["scenario"], rec["round"])][rec["broker"]] = rec["result"]
        if rec["scenario"] not in order:
            order.append(rec["scenario"])
    print("| scenario | round | hutch msg/s | RabbitMQ msg/s | ratio | hutch p50/p99 µs | RabbitMQ p50/p99 µs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for scenario in order:
        ratios = []
        for (name, rnd), pair in sorted(runs.items()):
            if name != scenario or len(pair) != 2:
                continue
            h, r = pair["hutch"], pair["rabbitmq"]
            key = "receive_rate" if h["consumers"] else "send_rate"
            ratio = h[key] / r[key] if r[key] else float("nan")
            ratios.append(ratio)
            hl, rl = h["latency_us"], r["latency_us"]
            print(f"| {scenario} | {rnd} | {h[key]:,} | {r[key]:,} | {ratio:.2f}× | "
                  f"{hl['p50']:,}/{hl['p99']:,} | {rl['p50']:,}/{rl['p99']:,} |")
        if ratios:
            print(f"| **{scenario}** | median | | | **{statistics.median(ratios):.2f}×** | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
