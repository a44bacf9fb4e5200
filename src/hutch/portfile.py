"""The ports file: how a node tells whoever started it which ports its listeners got (issue 22).

Owns: the file's name and format, writing it, and reading it back (`wait_for_ports`, what the test
fixtures, the benchmarks, the examples and `hutch.spark.bench` use to start a node on port 0).

A harness that picks a port by binding port 0, closing the socket and handing the number to a server
races every client on the machine: the number is in the kernel's ephemeral range, where clients'
source ports come from ("address already in use" under a connection churn). Instead the harness asks
for port 0 (`--amqp-port 0`, `--management-port 0`, `--cluster-port 0`, `--amqps-port 0`), the node
binds, and once every listener is up it writes `<data dir>/ports.json`:

    {"node": "hutch@host", "pid": 4242, "listeners": {"amqp": 41853, "management": 41855, "cluster": 41851}}

Rules:
- `listeners` maps a listener's name to the port it bound, whatever the configuration asked (0 or a
  fixed port); a listener that is off is absent. A new listener joins with one line where it binds:
  `node.listener_ports["<name>"] = port` (runtime/broker/node.py).
- The file is removed when the node starts (a stale one never answers for a new process) and when it
  stops cleanly; it is written once, atomically (a temporary file renamed), after the management API
  started, so a reader that sees it may connect to every port in it.
- `pid` is the writer's process id: a reader waits for the file of *its* process.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PORTS_FILE = "ports.json"


def path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / PORTS_FILE


def remove(data_dir: str | os.PathLike[str]) -> None:
    """Forget a previous process's ports (at start and at a clean stop)."""
    try:
        path(data_dir).unlink()
    except FileNotFoundError:
        pass


def write(data_dir: str | os.PathLike[str], node: str, pid: int, listeners: Mapping[str, int]) -> Path:
    """Write the ports file atomically; returns its path."""
    target = path(data_dir)
    tmp = target.with_name(f".{PORTS_FILE}.{pid}.tmp")
    tmp.write_text(json.dumps({"node": node, "pid": pid, "listeners": dict(listeners)}, sort_keys=True) + "\n")
    os.replace(tmp, target)
    return target


def read(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ports file's content, or None while there is none (or it is not whole)."""
    try:
        doc = json.loads(path(data_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class NodeDidNotStart(RuntimeError):
    """The node process exited, or wrote no ports file in time; the text ends with its log when known."""


def wait_for_ports(data_dir: str | os.PathLike[str], proc: subprocess.Popen[Any], timeout_s: float = 40.0,
                   log_path: str | os.PathLike[str] | None = None) -> dict[str, int]:
    """The listeners of the node process `proc` (name -> port) once it has written its ports file."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = read(data_dir)
        if doc is not None and doc.get("pid") == proc.pid:
            return {str(k): int(v) for k, v in doc["listeners"].items()}
        if proc.poll() is not None:
            raise NodeDidNotStart(f"hutch-server exited with {proc.returncode}{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise NodeDidNotStart(f"hutch-server wrote no {path(data_dir)} in {timeout_s:.0f} s"
                                  f"{_log_tail(log_path)}")
        time.sleep(0.05)


def _log_tail(log_path: str | os.PathLike[str] | None) -> str:
    if log_path is None:
        return ""
    try:
        return ":\n" + Path(log_path).read_text(errors="replace")[-20_000:]
    except OSError:
        return ""


__all__ = ["PORTS_FILE", "NodeDidNotStart", "path", "read", "remove", "wait_for_ports", "write"]
