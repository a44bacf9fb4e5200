"""Broker CPU per message: start a hutch-server, run hutch-perf against it, read the server's CPU time.

Usage:
    python benchmarks/cpu_per_message.py [--rounds N] -- HUTCH-PERF-ARGS...
    e.g. python benchmarks/cpu_per_message.py --rounds 3 -- -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 -r 20000 -z 10

The server is this Python's `-m hutch.cli.server` on port 0 (its ports file says which it bound) with a
fresh data directory, a node that is not clustered (`--no-cluster`); `HUTCH_PURE` passes through to it (every other `HUTCH_*` variable is cleared), so
`HUTCH_PURE=1` measures the pure-Python hot path. Each round prints the messages received, the server's
user + system CPU seconds during the run (from /proc/PID/stat), their quotient in µs per message, and the
latency percentiles hutch-perf reports. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from hutch.portfile import wait_for_ports


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("perf_args", nargs=argparse.REMAINDER, help="hutch-perf arguments, after --")
    args = parser.parse_args()
    perf_args = [a for a in args.perf_args if a != "--"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}
    env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
    with tempfile.TemporaryDirectory(prefix="hutch-cpu-") as data_dir:
        with open(os.path.join(data_dir, "server.log"), "wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port", "0",
                 "--data-dir", data_dir, "--no-cluster"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            amqp = wait_for_ports(data_dir, server, 60, os.path.join(data_dir, "server.log"))["amqp"]
            run_rounds(server.pid, amqp, args.rounds, perf_args, env)
        finally:
            server.terminate()
            server.wait()
        with open(os.path.join(data_dir, "server.log")) as f:
            print(next((line.strip() for line in f if "hot path" in line), "(no hot-path line in the log)"))


def run_rounds(pid: int, port: int, rounds: int, perf_args: list[str], env: dict[str, str]) -> None:
    uri = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    for r in range(1, rounds + 1):
        before = cpu_seconds(pid)
        out = subprocess.run([sys.executable, "-m", "hutch.cli.perf", "--uri", uri, "--json", *perf_args],
                             capture_output=True, text=True, env=env, check=True).stdout
        cpu = cpu_seconds(pid) - before
        res = json.loads(out)
        lat = res["latency_us"]
        print(f"round {r}: received {res['received']} ({res['receive_rate']:.0f}/s), broker CPU {cpu:.2f} s, "
              f"{cpu * 1e6 / max(res['received'], 1):.2f} µs/msg, latency p50 {lat['p50'] / 1000:.1f} ms "
              f"p99 {lat['p99'] / 1000:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
