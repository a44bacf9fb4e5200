"""The harness's fork server (tests/node_forkserver.py): a node forked from it is the node `python -m
hutch.cli.server` starts, as tests see one: its own pid to signal, Popen's exit statuses, its log, its
working directory, its environment, its resource limits, and no descriptor of the fork server's left open."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from pathlib import Path

import pika
import pytest

from conftest import start_server
from node_forkserver import EXEC_ENV, ForkedNode, import_key


def _fds(pid: int) -> list[str]:
    """What each descriptor of `pid` is (sockets and pipes by kind only: their inode numbers differ)."""
    kinds = []
    for fd in sorted(Path(f"/proc/{pid}/fd").iterdir(), key=lambda p: int(p.name)):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        kinds.append(target.split(":", 1)[0] + ":" if ":[" in target else target)
    return kinds


def _exec_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.Popen[bytes]:
    monkeypatch.setenv(EXEC_ENV, "1")
    try:
        return start_server(tmp_path).proc
    finally:
        monkeypatch.delenv(EXEC_ENV)


def test_a_forked_node_serves_and_holds_the_descriptors_an_exec_node_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forked = start_server(tmp_path / "forked")
    plain = _exec_node(tmp_path / "exec", monkeypatch)
    try:
        assert isinstance(forked.proc, ForkedNode) and not isinstance(plain, ForkedNode)
        forked_fds = [k for k in _fds(forked.proc.pid) if not k.startswith(str(tmp_path))]
        plain_fds = [k for k in _fds(plain.pid) if not k.startswith(str(tmp_path))]
        assert forked_fds == plain_fds  # the fork server's control socket and pipes are not among them
        conn = pika.BlockingConnection(pika.URLParameters(forked.url))
        ch = conn.channel()
        ch.queue_declare("forked-q")
        ch.basic_publish("", "forked-q", b"hello")
        assert ch.basic_get("forked-q", auto_ack=True)[2] == b"hello"
        conn.close()
        assert os.readlink(f"/proc/{forked.proc.pid}/cwd") == os.getcwd()
        assert "starting node test@localhost" in forked.log()
    finally:
        forked.stop()
        plain.terminate()
        plain.wait(10)


def test_exit_statuses_come_back_as_popen_gives_them(tmp_path: Path) -> None:
    a = start_server(tmp_path / "a")
    b = start_server(tmp_path / "b")
    assert a.proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        a.proc.wait(0.1)
    assert a.stop(signal.SIGTERM) == 0  # a clean stop
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    assert b.proc.poll() == -signal.SIGKILL and b.proc.wait() == -signal.SIGKILL
    b.proc.kill()  # a no-op once reaped, as Popen's


def test_a_bad_flag_exits_2_with_its_one_line_in_the_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited with 2") as exc:
        start_server(tmp_path, "--no-such-flag")
    assert "hutch-server: error:" in str(exc.value)


def test_the_nodes_environment_is_its_own(tmp_path: Path) -> None:
    """An environment variable given to one node reaches that node (here the config file, by HUTCH_CONFIG)
    and not the next one from the same fork server."""
    cfg = tmp_path / "env.conf"
    cfg.write_text("default_user = envuser\ndefault_pass = envpass\n")
    named = start_server(tmp_path / "named", env={"HUTCH_CONFIG": str(cfg)})
    plain = start_server(tmp_path / "plain")
    try:
        conn = pika.BlockingConnection(pika.URLParameters(
            f"amqp://envuser:envpass@127.0.0.1:{named.amqp_port}/%2F"))
        conn.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(f"amqp://envuser:envpass@127.0.0.1:{plain.amqp_port}/%2F"))
    finally:
        named.stop()
        plain.stop()


def test_what_is_read_while_importing_picks_the_fork_server() -> None:
    base = {"PATH": "/bin", "HOME": "/root"}
    assert import_key(base) == import_key({**base, "HUTCH_CLUSTER_SECRET": "s", "OTHER": "x"})
    for name in ("HUTCH_PURE", "PYTHONHASHSEED", "LANG", "TZ", "SSL_CERT_FILE", "LC_ALL"):
        assert import_key(base) != import_key({**base, name: "1"}), name


def test_the_nodes_resource_limits_are_the_test_processes(tmp_path: Path) -> None:
    """A test lowers RLIMIT_NOFILE before it starts a node (tests/tls/test_half_open.py): a Popen child
    inherits that, and so does a forked node, though the fork server was started with the old limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
    try:
        info = start_server(tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        [line] = [x for x in Path(f"/proc/{info.proc.pid}/limits").read_text().splitlines()
                  if x.startswith("Max open files")]
        assert line.split()[3:5] == ["300", str(hard)]
    finally:
        info.stop()
