"""One data directory, one node (issue 21, finding 0; docs/security.md, "Threat model").

Before: a second `hutch-server` on the same `--data-dir` (same node name, clustered or `--no-cluster`)
started beside the first; both confirmed persistent messages into the same durable queue, and after
`kill -9` of both half of the confirmed messages were gone while `hutch-storage check` called the
directory clean. Now the first node holds an exclusive `flock` on `<data_dir>/.hutch.lock` for its whole
life: the second is refused in one line naming the holder's pid (exit 1), the first keeps serving
(a pika publish/consume round trip after the refusal), and `hutch-storage check`/`salvage` refuse the
live directory (exit 2). Once the node is stopped (even by `kill -9`: the kernel drops the lock) the
tool and a new node run as before.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server


def _second_node(data_dir: Path, clustered: bool) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0",
            "--management-port", "0", "--data-dir", str(data_dir), "--node-name", "test@localhost", "--workers", "1"]
    args += ["--cluster-port", "0"] if clustered else ["--no-cluster"]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _storage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hutch.cli.storage", *args], capture_output=True, text=True,
                          timeout=60)


def _round_trip(server: ServerInfo, body: bytes) -> bytes | None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = f"locked.{body.decode()}"
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        _method, _props, got = ch.basic_get(queue, auto_ack=True)
        return got
    finally:
        conn.close()


@pytest.mark.parametrize("clustered", [False, True], ids=["no-cluster", "clustered"])
def test_a_second_node_on_a_data_directory_is_refused_and_the_first_keeps_serving(tmp_path: Path,
                                                                                   clustered: bool):
    first = start_server(tmp_path, cluster=clustered)
    try:
        assert _round_trip(first, b"before") == b"before"
        second = _second_node(first.data_dir, clustered)
        assert second.returncode == 1, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.startswith("hutch-server:")]
        assert len(lines) == 1, second.stderr  # one line (the log lines before it are the start-up's)
        assert lines[0].startswith("hutch-server: data directory ") and f"process {first.proc.pid}" in lines[0]
        assert first.proc.poll() is None
        assert _round_trip(first, b"after") == b"after"  # the first node still serves
        for command in ("check", "salvage"):
            refused = _storage(command, str(first.data_dir))
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert f"in use by process {first.proc.pid}" in refused.stderr
            assert refused.stdout == ""  # nothing was read or repaired
        assert _round_trip(first, b"still") == b"still"
    finally:
        first.stop(signal.SIGKILL)  # the kernel drops the lock with the process
    assert _storage("check", str(first.data_dir)).returncode == 0
    again = start_server(tmp_path / "again", "--data-dir", str(first.data_dir), cluster=clustered)
    try:
        assert _round_trip(again, b"restarted") == b"restarted"
    finally:
        again.stop()
