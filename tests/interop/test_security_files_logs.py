"""Issue 15, findings 10 and 11 (core part): data at rest is the node user's alone, a cluster secret
that others can read is refused, and user strings reach the log escaped and bounded.

Each test starts its own `hutch-server` process.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pika

from conftest import start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch.amqp import spec
from hutch.amqp.frames import method_frame

from .helpers import connect, storage_barrier, unique, wait_for


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of the root and of everything below it, by path."""
    found = {str(root): stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path)] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_data_dir_0700_and_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"  # created by the node itself
    old = os.umask(0)  # the node inherits an umask that would make everything world-writable
    try:
        info = start_server(tmp_path, "--data-dir", str(data_dir), "--cluster-port", "0", cluster=None)
    finally:
        os.umask(old)
    try:
        conn = connect(info.amqp_port)
        ch = conn.channel()
        name = unique("durable")
        ch.queue_declare(name, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", name, b"body" * 2000, pika.BasicProperties(delivery_mode=2))
        conn.close()
        storage_barrier(info.amqp_port)
    finally:
        info.stop()
    modes = _modes(data_dir)
    assert len(modes) > 5, modes
    files = {p: m for p, m in modes.items() if not Path(p).is_dir()}
    assert any(p.endswith(".hutch.secret") for p in files)
    loose = {p: oct(m) for p, m in modes.items()
             if (m != 0o700 if Path(p).is_dir() else m & 0o077)}
    assert not loose, loose


def _server_argv(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port", "0",
            "--data-dir", str(tmp_path / "data"), "--node-name", "test@localhost", "--cluster-port", "0", "--workers", "1", *extra]


def test_group_readable_secret_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("s3cret-shared-by-the-cluster")
    secret.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    done = subprocess.run(_server_argv(tmp_path, "--cluster-secret-file", str(secret)), env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hutch-server:")]
    assert lines == [f"hutch-server: cluster secret file {secret} is accessible by group or others (mode 0644); "
                     f"run chmod 600 {secret}, or start with --allow-insecure-secret-file"], done.stderr


def test_group_readable_secret_file_allowed_with_a_warning(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("s3cret-shared-by-the-cluster")
    secret.chmod(0o640)
    info = start_server(tmp_path, "--cluster-port", "0", "--cluster-secret-file", str(secret),
                        "--allow-insecure-secret-file", cluster=None)
    try:
        connect(info.amqp_port).close()
        assert "is accessible by group or others (mode 0640); allowed" in info.log()
    finally:
        info.stop()


FORGED = "2026-01-01 00:00:00,000 [INFO] hutch.node: forged entry"


def _log_lines_with(info_log: str, needle: str) -> list[str]:
    return [line for line in info_log.splitlines() if needle in line]


def test_huge_user_name_with_newlines_is_one_bounded_log_line(tmp_path: Path) -> None:
    info = start_server(tmp_path)
    try:
        name = "evil\n" + FORGED + "\r\n" + "x" * 100_000  # ~100 KB, fits one frame
        with socket.create_connection(("127.0.0.1", info.amqp_port), timeout=10) as sock:
            sock.sendall(spec.PROTOCOL_HEADER)
            sock.recv(65536)
            sock.sendall(method_frame(0, spec.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response=b"\x00" + name.encode() + b"\x00pw",
                locale="en_US")))
            while sock.recv(65536):
                pass
        token = base64.b64encode(("web\n" + FORGED + "y" * 3000 + ":pw").encode()).decode()
        request = urllib.request.Request(info.mgmt_url + "/api/whoami", headers={"Authorization": f"Basic {token}"})
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        assert wait_for(lambda: len(_log_lines_with(info.log(), "access denied")) == 1)
        log = info.log()
    finally:
        info.stop()
    assert not any(line.startswith(FORGED) for line in log.splitlines())  # no forged entry
    amqp = _log_lines_with(log, "login refused")
    assert len(amqp) == 1 and "evil\\n2026-01-01" in amqp[0] and "\\r\\n" in amqp[0]
    assert "...[truncated, 100" in amqp[0] and len(amqp[0]) < 1000, len(amqp[0])
    http = _log_lines_with(log, "access denied")
    assert "web\\n2026-01-01" in http[0] and len(http[0]) < 1000, len(http[0])
