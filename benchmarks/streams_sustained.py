"""Streams over AMQP 0-9-1: the highest fixed publish rate each broker sustains (issue 23), hutch against
RabbitMQ 3.10.8, stepped the same way on both.

    python benchmarks/streams_sustained.py run --hutch-data-dir DIR --rabbit-pid PID --sizes 16,1000 \\
        --tools rawload --rates 20000,30000,40000,50000,60000,70000,80000 --seconds 8 --out results.jsonl
    python benchmarks/streams_sustained.py summary --results results.jsonl

An unlimited-rate run measures how fast a broker accepts publishes, which is not what it can keep up with:
a broker whose consumers fall behind its publishers builds a standing backlog (RabbitMQ's streams do at
16 B: publish-to-delivery p50 0.5-2.4 s in the earlier passes), and is not faster for it. This runs the
same generators as `streams_vs_rabbitmq.py` (rawload, hutch-perf; window 1,000, prefetch 500, ack every
250) at fixed rates, lowest first, and says a rate is **sustained** when the run confirmed and consumed
at least `--keep-up` (0.97) of it and the publish-to-delivery p99 stayed within `--p99-ms` (200 ms): no
backlog grew (a growing one shows as a p99 that grows with the run, far past the bound). For each
(size, generator) both brokers are stepped in turn (hutch first at odd steps, RabbitMQ first at even
ones), a broker stops at its first rate that is not sustained, and the summary gives each broker's
highest sustained rate and their ratio, beside the figures of that step. One JSON line per run, with the
load average before it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streams_vs_rabbitmq import amqp_run  # noqa: E402


def sustained(r: dict[str, Any], rate: int, keep_up: float, p99_ms: float) -> bool:
    """Whether run `r` at `rate` msg/s kept up (module docstring)."""
    if "error" in r:
        return False
    return (r.get("published_per_s") or 0) >= keep_up * rate and (r.get("consumed_per_s") or 0) >= keep_up * rate \
        and (r.get("latency_ms_p99") or float("inf")) <= p99_ms


def run(args: argparse.Namespace) -> None:
    ports = json.loads((Path(args.hutch_data_dir) / "ports.json").read_text())
    brokers = {"hutch": (ports["listeners"]["amqp"], [ports["pid"]]), "rabbitmq": (5672, [args.rabbit_pid])}
    rates = [int(x) for x in args.rates.split(",")]
    with open(args.out, "a") as out:
        for size in [int(x) for x in args.sizes.split(",")]:
            for tool in args.tools.split(","):
                live = [b for b in ("hutch", "rabbitmq") if b in args.brokers.split(",")]
                for step, rate in enumerate(rates, 1):
                    for broker in (list(live) if step % 2 else live[::-1]):  # (a copy: a failure leaves `live`)
                        port, pids = brokers[broker]
                        load = os.getloadavg()[0]
                        started = time.strftime("%H:%M:%S", time.gmtime())
                        r = amqp_run(tool, port, pids, size, args.seconds, f"s{step}-{size}-{broker}", rate)
                        ok = sustained(r, rate, args.keep_up, args.p99_ms)
                        line = {"kind": "sustained", "tool": tool, "size": size, "rate": rate, "broker": broker,
                                "utc": started, "loadavg_before": round(load, 2), "label": args.label,
                                "sustained": ok, "r": r}
                        out.write(json.dumps(line) + "\n")
                        out.flush()
                        print(json.dumps(line), flush=True)
                        if not ok:
                            live.remove(broker)
                    if not live:
                        break


def summary(args: argparse.Namespace) -> None:
    best: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    tried: dict[tuple[str, int, str, str], list[int]] = {}
    with open(args.results) as f:
        for raw in f:
            d = json.loads(raw)
            if d.get("kind") != "sustained":
                continue
            key = (d.get("label", ""), d["size"], d["tool"], d["broker"])
            tried.setdefault(key, []).append(d["rate"])
            if d["sustained"] and d["rate"] >= best.get(key, {"rate": -1})["rate"]:
                best[key] = d
    print("| label | size | generator | hutch sustained msg/s (p50 / p99 ms, load) | RabbitMQ sustained msg/s "
          "(p50 / p99 ms, load) | ratio | rates tried hutch / RabbitMQ |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, size, tool in sorted({k[:3] for k in tried}):
        cells = []
        for broker in ("hutch", "rabbitmq"):
            d = best.get((label, size, tool, broker))
            cells.append("-" if d is None else f"{d['rate']:,} ({d['r']['latency_ms_p50']} / "
                                               f"{d['r']['latency_ms_p99']}, {d['loadavg_before']})")
        h, q = best.get((label, size, tool, "hutch")), best.get((label, size, tool, "rabbitmq"))
        ratio = f"{h['rate'] / q['rate']:.2f}" if h and q else "-"
        steps = " / ".join(",".join(f"{x // 1000}k" for x in tried.get((label, size, tool, b), []))
                           for b in ("hutch", "rabbitmq"))
        print(f"| {label} | {size} B | {tool} | {cells[0]} | {cells[1]} | {ratio} | {steps} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--hutch-data-dir", required=True)
    r.add_argument("--rabbit-pid", type=int, required=True)
    r.add_argument("--brokers", default="hutch,rabbitmq")
    r.add_argument("--sizes", default="16,1000")
    r.add_argument("--tools", default="rawload,hutch-perf")
    r.add_argument("--rates", default="20000,30000,40000,50000,60000,70000,80000")
    r.add_argument("--seconds", type=float, default=8.0)
    r.add_argument("--keep-up", type=float, default=0.97)
    r.add_argument("--p99-ms", type=float, default=200.0)
    r.add_argument("--out", required=True)
    r.add_argument("--label", default="")
    s = sub.add_parser("summary")
    s.add_argument("--results", required=True)
    args = ap.parse_args()
    run(args) if args.cmd == "run" else summary(args)


if __name__ == "__main__":
    main()
