"""hutch-perf end to end against a real hutch node: the numbers it prints add up."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ServerInfo


def run_perf(server: ServerInfo, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "hutch.cli.perf", "--uri", server.url, "--json", *args],
        capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_confirmed_publish_and_consume(hutch_server: ServerInfo) -> None:
    summary = run_perf(hutch_server, "-x", "1", "-y", "1", "-s", "64", "-c", "100", "-q", "100", "-A", "10",
                       "-C", "5000", "-z", "30")
    assert summary["sent"] == 5000
    assert summary["confirmed"] == 5000
    assert summary["nacked"] == 0
    assert summary["received"] == 5000
    assert summary["latency_us"]["samples"] == 5000


def test_mandatory_unroutable_is_returned(hutch_server: ServerInfo) -> None:
    summary = run_perf(hutch_server, "-x", "1", "-y", "0", "-c", "50", "-k", "no-such-queue",
                       "-f", "mandatory", "-C", "200", "-z", "30")
    assert summary["sent"] == 200
    assert summary["returned"] == 200
    assert summary["confirmed"] == 200
