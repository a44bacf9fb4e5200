#!/usr/bin/env python3
"""What a node of 2 workers costs to start and stop, its workers forked by the worker fork server or exec'd
(`HUTCH_WORKER_EXEC=1`): docs/scaling.md, "The worker fork server".

Starts `python -m hutch.cli.server --workers 2` (a fresh interpreter, as an operator would) ROUNDS times in
each mode, alternating, waits for its ports file (every worker ready), stops it with SIGTERM, and prints per
mode the seconds to ready of each round and the CPU (user + system) of the whole process tree per round:
the supervisor reaps its workers and its zygote, so their CPU is in its children's, which is in ours. Run
from the repository root, one at a time across the machine:

    flock /tmp/hutch-bench.lock nice -n 19 .venv/bin/python benchmarks/worker_start.py 5
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(mode: str) -> tuple[float, float]:
    """(seconds to the ports file, CPU seconds of the tree) of one start and stop in `mode`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if mode == "exec":
        env["HUTCH_WORKER_EXEC"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        with open(Path(tmp) / "log", "wb") as log:
            started = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port", "0",
                 "--data-dir", str(data), "--no-cluster", "--workers", "2"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            while not (data / "ports.json").exists():
                if proc.poll() is not None:
                    raise SystemExit((Path(tmp) / "log").read_text())
                time.sleep(0.01)
            ready = time.monotonic() - started
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ready, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(rounds: int) -> None:
    results: dict[str, list[tuple[float, float]]] = {"fork": [], "exec": []}
    for _ in range(rounds):
        for mode in results:
            results[mode].append(one(mode))
    for mode, runs in results.items():
        ready = ", ".join(f"{r:.2f}" for r, _ in runs)
        cpu = ", ".join(f"{c:.2f}" for _, c in runs)
        print(f"{mode}: ready in [{ready}] s; CPU per start and stop [{cpu}] s; "
              f"mean CPU {sum(c for _, c in runs) / len(runs):.2f} s")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
