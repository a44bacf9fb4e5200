"""The worker fork server (runtime/workers/forkserver.py): a node of 2 workers whose workers are forked by
its zygote, against pika.

What is pinned: both workers are forked and are the supervisor's own children; a worker killed with -9 is
forked again and serves its persistent messages; the zygote killed with -9 does not stop the node, and the
next worker starts as a fresh interpreter; SIGTERM stops workers and zygote with no process left; the
supervisor killed with -9 takes the zygote with it; a worker that fails before it is ready stops the node
with exit 1 (a supervisor started from the command line, whose zygote imports the worker's modules
itself); `HUTCH_WORKER_EXEC=1` execs every worker. Waits poll with generous deadlines; nothing here asserts
a duration.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ServerInfo, start_server
from tests.workers.test_workers import (
    CONFIG,
    PERSISTENT,
    alive,
    connect,
    drain,
    ports_file_names_worker,
    until,
    worker_of,
    worker_pid,
)

FORKED = {"HUTCH_WORKER_EXEC": "0"}  # whatever the run's environment says (tests/conftest.py's PASSED_ENV)


def start_node(tmp: Path) -> ServerInfo:
    return start_server(tmp, "--workers", "2", config_text=CONFIG, env=FORKED)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def fork_server_pid(info: ServerInfo) -> int:
    found = until(lambda: re.search(r"worker fork server started \(pid (\d+)\)", info.log()),
                  what="the fork server's start in the log")
    return int(found.group(1))


def started(info: ServerInfo, index: int, pid: int) -> str:
    """How the supervisor logged worker `index`'s start as `pid`: "forked" or "a fresh interpreter"."""
    found = until(lambda: re.search(rf"worker {index} started \(pid {pid}, ([a-z ]+)\)", info.log()),
                  what=f"worker {index}'s start (pid {pid}) in the log")
    return str(found.group(1))


def open_files(pid: int) -> set[str]:
    """The paths of the regular files process `pid` holds open."""
    paths: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            paths.add(target)
    return paths


def round_trip(info: ServerInfo, queue: str) -> None:
    """Declare, publish with a confirm and get back, through the node's shared port (either worker)."""
    with connect(info) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"round trip")
        got = until(lambda: ch.basic_get(queue, auto_ack=True)[2], what=f"the message in {queue}")
        assert got == b"round trip"


def test_workers_are_forked_children_and_a_killed_worker_is_forked_again(tmp_path: Path) -> None:
    info = start_node(tmp_path)
    try:
        zygote = fork_server_pid(info)
        assert parent_of(zygote) == info.proc.pid
        pids = [worker_pid(info, 0), worker_pid(info, 1)]
        for index, pid in enumerate(pids):
            assert pid is not None and pid != zygote
            assert started(info, index, pid) == "forked"
            assert parent_of(pid) == info.proc.pid  # adopted by the supervisor (its subreaper)
            # nothing of the supervisor's is inherited: not its lock on the data directory
            assert str(info.data_dir / ".hutch.lock") not in open_files(pid)
        with connect(info, 0) as w0:
            w0.channel().queue_declare("kept", durable=True)
            w0.channel().queue_declare("other", durable=True)
        assert worker_of(info, "other") == 1
        with connect(info, 1) as w1:
            ch = w1.channel()
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish("", "other", b"m%d" % i, PERSISTENT)
        victim = pids[1]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        until(lambda: worker_pid(info, 1) not in (None, victim), what="worker 1 restarted")
        again = worker_pid(info, 1)
        assert again is not None
        assert started(info, 1, again) == "forked" and parent_of(again) == info.proc.pid
        assert alive(zygote)
        with connect(info, 1) as w1:
            assert sorted(drain(w1.channel(), "other", 20)) == sorted(b"m%d" % i for i in range(20))
    finally:
        assert info.stop() == 0


def test_both_workers_killed_at_once_are_both_forked_again(tmp_path: Path) -> None:
    """Two restarts at once ask the zygote one after the other (one socket, answers in order), and the
    second restarted worker gets its link to the first: before the supervisor's restarts took turns, each
    saw the other dead, neither had a peer, and both waited for a majority of two forever (exec'd too)."""
    info = start_node(tmp_path)
    try:
        victims = [worker_pid(info, 0), worker_pid(info, 1)]
        for pid in victims:
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        for index, victim in enumerate(victims):
            until(lambda index=index, victim=victim: worker_pid(info, index) not in (None, victim),
                  what=f"worker {index} restarted")
            pid = worker_pid(info, index)
            assert pid is not None and started(info, index, pid) == "forked"
            until(lambda index=index: ports_file_names_worker(info, index),
                  what=f"the ports file naming the new worker {index}")
        round_trip(info, "after-both")
    finally:
        assert info.stop() == 0


def test_fork_server_killed_the_node_goes_on_and_starts_workers_as_fresh_interpreters(tmp_path: Path) -> None:
    info = start_node(tmp_path)
    try:
        zygote = fork_server_pid(info)
        os.kill(zygote, signal.SIGKILL)
        until(lambda: f"worker fork server (pid {zygote}) exited with signal 9" in info.log(),
              what="the supervisor noticing the fork server's end")
        until(lambda: not alive(zygote), what="the fork server reaped")
        round_trip(info, "after-zygote")  # the workers it forked are untouched
        victim = worker_pid(info, 0)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        until(lambda: worker_pid(info, 0) not in (None, victim), what="worker 0 restarted")
        again = worker_pid(info, 0)
        assert again is not None
        assert started(info, 0, again) == "a fresh interpreter"
        cmdline = Path(f"/proc/{again}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-m", b"hutch.cli.server"]
        round_trip(info, "after-restart")
    finally:
        assert info.stop() == 0


def test_sigterm_stops_the_workers_and_the_fork_server_with_no_process_left(tmp_path: Path) -> None:
    info = start_node(tmp_path)
    zygote = fork_server_pid(info)
    workers = [worker_pid(info, 0), worker_pid(info, 1)]
    round_trip(info, "before-stop")
    assert info.stop() == 0
    for pid in (zygote, *workers):
        assert pid is not None
        assert not alive(pid), f"pid {pid} outlived its node"


def test_supervisor_killed_takes_its_fork_server_and_workers_with_it(tmp_path: Path) -> None:
    info = start_node(tmp_path)
    zygote = fork_server_pid(info)
    workers = [worker_pid(info, 0), worker_pid(info, 1)]
    info.stop(signal.SIGKILL)
    for pid in (zygote, *workers):
        assert pid is not None
        until(lambda pid=pid: not alive(pid), what=f"pid {pid} gone with its supervisor")


def test_exec_switch_starts_fresh_interpreters(tmp_path: Path) -> None:
    info = start_server(tmp_path, "--workers", "2", config_text=CONFIG, env={"HUTCH_WORKER_EXEC": "1"})
    try:
        for index in (0, 1):
            pid = worker_pid(info, index)
            assert pid is not None and started(info, index, pid) == "a fresh interpreter"
        assert "worker fork server started" not in info.log()
        round_trip(info, "exec")
    finally:
        assert info.stop() == 0


def test_a_forked_worker_failing_before_ready_stops_the_node_with_exit_1(tmp_path: Path) -> None:
    """From the command line (the supervisor a fresh interpreter, its zygote importing for itself): worker
    0's management port is taken, so worker 0 fails at its start; the node stops with exit code 1 and the
    worker's own one-line error."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_") or k == "HUTCH_PURE"} | FORKED
        done = subprocess.run(
            [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port", str(port),
             "--data-dir", str(tmp_path / "data"), "--no-cluster",
             "--workers", "2"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "worker fork server started" in done.stderr
    assert re.search(r"worker 0 started \(pid \d+, forked\)", done.stderr), done.stderr
    assert "before it was ready: stopping the node" in done.stderr
