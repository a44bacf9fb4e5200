#!/usr/bin/env python3
"""Latency under full load and the ready backlog over time: does the publisher outrun the node's deliveries?

Starts a hutch node of its own (`hutch-server` on free ports, a temporary data dir, removed at the end)
from the source tree given by --src (default: this tree's src/), runs hutch-perf against it, and while
it runs samples the queue's `messages_ready` / `messages_unacknowledged` and the connections' states
(`running`, `flow`, ...) from the management API every --sample seconds. Reports hutch-perf's summary
(sent/received msg/s, latency percentiles), the queue depth over time (max and mean of the second
half of the run), how often a connection showed `flow`, and the broker's CPU seconds (utime + stime
from /proc/PID/stat) divided by the messages delivered.

    PYTHONPATH=src .venv/bin/python benchmarks/flow_latency.py --label after -- \\
        -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 -z 15

Everything after `--` goes to hutch-perf as it is (the URI is added). One JSON line per run is appended
to --out when given. The machine this runs on is usually shared: compare trees in alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
from node_ports import legacy_port, port_arg, takes_port_zero  # benchmarks/node_ports.py

from hutch.portfile import wait_for_ports

ROOT = Path(__file__).resolve().parent.parent


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hutch-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"hutch-server did not listen on {port}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """Polls /api/queues and /api/connections until stopped."""

    def __init__(self, mgmt_port: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.base = f"http://127.0.0.1:{mgmt_port}/api"
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        session.auth = ("guest", "guest")
        t0 = time.monotonic()
        while not self.stop_event.wait(self.every_s):
            try:
                queues = session.get(f"{self.base}/queues", timeout=5).json()
                conns = session.get(f"{self.base}/connections", timeout=5).json()
            except (requests.RequestException, ValueError):
                continue
            perf = [q for q in queues if q["name"].startswith("hutch-perf")]
            self.samples.append({
                "t": round(time.monotonic() - t0, 2),
                "ready": sum(q.get("messages_ready", 0) for q in perf),
                "unacked": sum(q.get("messages_unacknowledged", 0) for q in perf),
                "states": sorted(c.get("state", "?") for c in conns),
            })


def run(args: argparse.Namespace, perf_args: list[str]) -> dict[str, Any]:
    src = Path(args.src).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="hutch-flow-"))
    reports_ports = takes_port_zero(src)  # port 0 and the ports file (benchmarks/node_ports.py)
    amqp_port, mgmt_port = (0, 0) if reports_ports else (legacy_port(), legacy_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env["PYTHONPATH"] = str(src)
    env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
    if args.cluster:  # a cluster of one (quorum queues)
        cluster_args = ["--cluster-port", port_arg(src)]
    elif "--no-cluster" in (src / "hutch" / "cli" / "server.py").read_text():
        cluster_args = ["--no-cluster"]  # trees where a lone node is a cluster of one on 25672 by default
    else:
        cluster_args = []
    server = subprocess.Popen(
        [sys.executable, "-m", "hutch.cli.server", "--amqp-port", str(amqp_port), "--management-port",
         str(mgmt_port), "--data-dir", str(tmp / "data"), "--node-name", "flow@localhost",
         "--log-level", "warning", *cluster_args],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))  # noqa: SIM115
    try:
        if reports_ports:
            ports = wait_for_ports(tmp / "data", server, 60, tmp / "server.log")
            amqp_port, mgmt_port = ports["amqp"], ports["management"]
        else:
            wait_port(amqp_port, server)
            wait_port(mgmt_port, server)
        sampler = Sampler(mgmt_port, args.sample)
        cpu0 = cpu_seconds(server.pid)
        sampler.start()
        perf_env = dict(env)
        perf_env["PYTHONPATH"] = str(ROOT / "src")  # the same load generator for every tree
        out = subprocess.run(
            [sys.executable, "-m", "hutch.cli.perf", "--uri", f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F",
             "--json", *perf_args], env=perf_env, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"hutch-perf failed: {out.stderr}")
        cpu1 = cpu_seconds(server.pid)
        sampler.stop_event.set()
        sampler.join()
        perf = json.loads(out.stdout)
    finally:
        server.terminate()
        server.wait(timeout=30)
        if args.keep_log:
            shutil.copy(tmp / "server.log", args.keep_log)
        shutil.rmtree(tmp, ignore_errors=True)
    samples = sampler.samples
    half = samples[len(samples) // 2:] or samples
    received = perf["received"] or 1
    result = {
        "loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0]),
        "label": args.label, "src": str(src), "perf_args": perf_args,
        "send_rate": perf["send_rate"], "receive_rate": perf["receive_rate"],
        "p50_ms": perf["latency_us"]["p50"] / 1000, "p99_ms": perf["latency_us"]["p99"] / 1000,
        "ready_max": max((s["ready"] for s in samples), default=0),
        "ready_mean_2nd_half": round(sum(s["ready"] for s in half) / max(len(half), 1)),
        "flow_samples": sum(1 for s in samples if "flow" in s["states"]), "samples": len(samples),
        "broker_cpu_s": round(cpu1 - cpu0, 2),
        "broker_cpu_us_per_msg": round((cpu1 - cpu0) / received * 1e6, 2),
        "ready_series": [s["ready"] for s in samples],
        "unacked_series": [s["unacked"] for s in samples],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--src", default=str(ROOT / "src"), help="source tree of the broker to run")
    parser.add_argument("--label", default="")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between management samples")
    parser.add_argument("--cluster", action="store_true", help="a clustered node of one (quorum queues)")
    parser.add_argument("--keep-log", help="copy the broker's log here")
    parser.add_argument("--out", help="append one JSON line per run here")
    parser.add_argument("perf", nargs=argparse.REMAINDER, help="-- then hutch-perf's arguments")
    args = parser.parse_args()
    perf_args = args.perf[1:] if args.perf[:1] == ["--"] else args.perf
    result = run(args, perf_args)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    series = result.pop("ready_series")
    unacked = result.pop("unacked_series")
    print(json.dumps(result))
    print("ready over time:", series)
    print("unacked over time:", unacked)


if __name__ == "__main__":
    main()
