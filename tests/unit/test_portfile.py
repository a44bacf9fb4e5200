"""The ports file (hutch/portfile.py): written whole, read back, and waited for by process id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hutch import portfile


def test_write_read_remove(tmp_path: Path) -> None:
    assert portfile.read(tmp_path) is None
    path = portfile.write(tmp_path, "n1@h", 42, {"amqp": 5672, "management": 15672})
    assert path == tmp_path / "ports.json"
    assert portfile.read(tmp_path) == {"node": "n1@h", "pid": 42, "listeners": {"amqp": 5672, "management": 15672}}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no temporary file left
    portfile.remove(tmp_path)
    portfile.remove(tmp_path)  # twice is fine
    assert portfile.read(tmp_path) is None


def test_a_partly_written_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "ports.json").write_text('{"node": "n1@h", "pid": 4')
    assert portfile.read(tmp_path) is None


def test_wait_for_ports_takes_only_its_own_process_file(tmp_path: Path) -> None:
    portfile.write(tmp_path, "old@h", 1, {"amqp": 1111})  # a previous process's file
    code = ("import sys, time; from hutch import portfile; time.sleep(0.3); "
            "portfile.write(sys.argv[1], 'new@h', __import__('os').getpid(), {'amqp': 2222}); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    try:
        assert portfile.wait_for_ports(tmp_path, proc, timeout_s=30) == {"amqp": 2222}
    finally:
        proc.kill()
        proc.wait()


def test_wait_for_ports_reports_an_exited_process_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("hutch-server: cannot listen for AMQP on port 1: permission denied\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait()
    with pytest.raises(portfile.NodeDidNotStart, match="exited with 1:\nhutch-server: cannot listen"):
        portfile.wait_for_ports(tmp_path, proc, timeout_s=30, log_path=log)
