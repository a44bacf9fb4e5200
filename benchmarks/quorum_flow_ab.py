"""Quorum-queue credit flow, before and after, hutch only (issue 17; docs/quorum-queues.md, "Credit flow").

Starts hutch from each source tree given (`--src LABEL=DIR`, repeatable: e.g. the old code exported with
`git archive` and this tree) on free ports, 1 or 3 nodes (scenarios.py's `Hutch`, a cluster of one for 1
node), declares nothing itself, and runs one load generator against node 1 (which declares the queue:
client-local, so node 1 leads), the trees alternating round by round so both see the same machine:

- `--tool raw`: benchmarks/rawload.py, `-x 1 -y 1 -c 1000 -q 1000 -A 100 -s 16 --quorum` (issue 17's
  quorum scenario), `-r` from `--rate` (0: unlimited);
- `--tool perf`: hutch-perf from the tree under test, `-x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100
  --quorum-queue`.

One line per run: received msg/s, latency p50 / p99, broker CPU µs per message (rawload). `--monitor`
also prints the leader's ready / unacked counts and the connection states every 0.5 s (the backlog, and
`flow` while a publisher is held). Every node is stopped at the end of each run.

    python benchmarks/quorum_flow_ab.py --src before=/tmp/old/src --src after=src -n 3 --rounds 3
    python benchmarks/quorum_flow_ab.py --src after=src -n 1 --rate 20000
    python benchmarks/quorum_flow_ab.py --src after=src -n 3 --tool perf --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

from scenarios import PY, RAWLOAD, Hutch  # benchmarks/scenarios.py: the same way of starting hutch


def _api(h: Hutch, path: str) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{h.nodes[0].mgmt}{path}")
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=2) as resp:
        return json.loads(resp.read())


def _command(args: argparse.Namespace, h: Hutch) -> list[str]:
    if args.tool == "raw":
        return [PY, RAWLOAD, "--port", str(h.port()), "--pids", ",".join(map(str, h.pids())), "-x", "1", "-y", "1",
                "-c", "1000", "-q", "1000", "-A", "100", "-s", "16", "--quorum", "-z", str(args.seconds),
                "--warmup", str(args.warmup), "-r", str(args.rate)]
    cmd = [PY, "-m", "hutch.cli.perf", "--uri", f"amqp://guest:guest@127.0.0.1:{h.port()}/%2F", "-x", "1", "-y",
           "1", "-s", "16", "-c", "1000", "-q", "1000", "-A", "100", "--quorum-queue", "-z", str(args.seconds),
           "--json"]
    return cmd + (["-r", str(args.rate)] if args.rate else [])


def run_once(args: argparse.Namespace, label: str, src: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="qflow-ab-"))
    h = Hutch(src, base, args.nodes, True)
    try:
        h.start()
        time.sleep(2)
        p = subprocess.Popen(_command(args, h), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=h.env())
        while args.monitor and p.poll() is None:
            time.sleep(0.5)
            with contextlib.suppress(OSError, ValueError):
                queues = [(q.get("messages_ready"), q.get("messages_unacknowledged")) for q in _api(h, "/api/queues")]
                print(f"  {label}: ready/unacked {queues}, connections "
                      f"{[c.get('state') for c in _api(h, '/api/connections')]}", flush=True)
        out, err = p.communicate(timeout=args.seconds + args.warmup + 300)
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(f"{label}: FAILED {err[-1500:]}", flush=True)
            return
        lat = res["latency_us"]
        cpu = res.get("broker_cpu_us_per_msg")
        print(f"{label} {args.nodes} node(s) {args.tool} rate={args.rate or 'max'}: {res['receive_rate']:,.0f} msg/s, "
              f"p50 {lat['p50'] / 1000:.1f} ms, p99 {lat['p99'] / 1000:.1f} ms"
              + (f", broker CPU {cpu} µs/msg" if cpu is not None else ""), flush=True)
    finally:
        h.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", action="append", required=True, help="LABEL=DIR: a source tree to run hutch from")
    ap.add_argument("-n", "--nodes", type=int, default=1, choices=(1, 3))
    ap.add_argument("--tool", choices=("raw", "perf"), default="raw")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="rawload's warm-up seconds")
    ap.add_argument("--rate", type=int, default=0, help="total publish rate, msg/s (0: unlimited)")
    ap.add_argument("--monitor", action="store_true")
    args = ap.parse_args()
    trees = []
    for spec in args.src:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit(f"--src wants LABEL=DIR, got {spec!r}")
        trees.append((label, Path(path).resolve()))
    for _ in range(args.rounds):
        for label, src in trees:
            run_once(args, label, src)


if __name__ == "__main__":
    main()
