"""Start the tests' hutch nodes by forking a process that has already imported hutch (a fork server).

Owns: `spawn_node`, which the harness (tests/conftest.py's `start_server`, tests/cluster/nodes.py's
`Node.start`) calls instead of `subprocess.Popen([sys.executable, "-m", "hutch.cli.server", ...])`, and
`ForkedNode`, the `Popen` it returns; and the fork server itself (`serve`, run as its own process, one per
pytest process and import environment, started on first use).

Why: a node's start was ~1.2-1.4 s of which ~0.8-1.0 s of CPU is Python importing hutch, aiohttp and
cryptography (aiohttp alone loads the system's CA bundle at import, ~0.1 s), and `make test` starts
several hundred nodes. The fork server imports the modules a node imports while it starts, once; each
node is then a fork of it that runs `hutch.cli.server` as `__main__` with the node's argv, environment,
working directory, umask, resource limits (RLIMIT_*: what a Popen child inherits) and log file, exactly as `python -m hutch.cli.server` would, and exits through
the interpreter's normal shutdown. Each node is still its own process with its own pid: tests signal it
(`os.kill`: SIGTERM, SIGKILL, SIGSTOP) and read `/proc/<pid>` as before; only its exit status comes back
through the fork server (its parent), over a socket of its own.

What stays a fresh interpreter: every test that runs `hutch-server` itself (the command line's errors, the data directory lock,
...), and a node whose environment differs from the fork server's in anything read while importing
(`IMPORT_ENV`: HUTCH_PURE picks the hot path at import; PYTHON*, the locale, TZ and the CA bundle's
variables): such a node gets a fork server of its own environment. `HUTCH_TEST_EXEC_NODES=1` turns the
fork server off (every node a `python -m hutch.cli.server` as before). A node of workers' worker processes
are forked too, by the product's own worker fork server (src/hutch/runtime/workers/forkserver.py; in
a node forked from here it imports nothing); `HUTCH_WORKER_EXEC=1` in the test process's environment
(passed to the nodes by tests/conftest.py) makes them fresh interpreters.

Rules: the fork server is single-threaded and does no work but fork and reap; a node forked from it
closes every descriptor of the fork server's and restores SIGCHLD and the wakeup fd before it runs hutch.
Nodes forked from one fork server share its hash seed (`random` is reseeded on fork by Python itself).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SERVER_MODULE = "hutch.cli.server"
EXEC_ENV = "HUTCH_TEST_EXEC_NODES"
"""Set to 1, `spawn_node` starts every node as `python -m hutch.cli.server` (no fork server)."""

PRELOAD = ("hutch.cli.server", "hutch.runtime.app", "hutch.mgmt", "hutch.mgmt.definitions", "uvloop",
           "encodings.idna")
"""What a node imports before it listens (`python -X importtime` of a node's start): the fork server's imports."""


def _warm() -> None:
    """What every node's start computes alike, computed once here and inherited: the regular expressions of
    the management API's routes (aiohttp compiles one per route with a variable part: ~0.15 s of a node's
    start; `re` caches them by pattern), and a collection with everything imported frozen (the node's
    `tune_gc` collects and freezes at start: ~0.1 s when it has to walk every imported module's objects)."""
    import gc

    from aiohttp import web

    from hutch.mgmt.calls import ROUTES
    router = web.UrlDispatcher()
    for path in {r.path for r in ROUTES} | {r.path + "/" for r in ROUTES} | {"/api/definitions/{vhost}", "/ui/{file}"}:
        router.add_resource(path)  # http.py's build_app adds each route with and without its trailing "/"
    gc.collect()
    gc.freeze()


def _reads_at_import(name: str) -> bool:
    return (name == "HUTCH_PURE" or name.startswith(("PYTHON", "LC_", "SSL_CERT", "OPENSSL", "AIOHTTP"))
            or name in ("LANG", "LANGUAGE", "TZ"))


def import_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of a node's environment that Python, hutch or its libraries read while importing: nodes
    whose keys differ cannot share a fork server."""
    return tuple(sorted((k, v) for k, v in env.items() if _reads_at_import(k)))


class ForkedNode(subprocess.Popen[bytes]):
    """A node process forked by the fork server: `Popen`'s interface (pid, poll, wait, send_signal,
    terminate, kill, returncode) over a pid that is not this process's child. Signals go to the pid; the
    exit status (Popen's convention: -N for a signal N) comes from the fork server, which reaps it."""

    def __init__(self, args: Sequence[str], pid: int, status: socket.socket) -> None:  # noqa: D107
        # Popen.__init__ is not called: the process exists already (the fork server made it)
        self.args = list(args)
        self.pid = pid
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # Popen.__del__ then leaves it alone
        self._communication_started = False
        self._status = status
        self._lock = threading.Lock()

    def _collect(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None:
                readable, _, _ = select.select([self._status], [], [], timeout)
                if readable:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = self._status.recv(64)
                        if not chunk:  # the fork server is gone: it cannot tell, and the pid is not ours
                            raise RuntimeError(f"the fork server of node pid {self.pid} exited before it")
                        data += chunk
                    self.returncode = int(data)
                    self._status.close()
            return self.returncode  # type: ignore[no-any-return]  # Popen's returncode is Any

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _ForkServer:
    """The client's end of one fork server process."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._control = ours
        boot = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import node_forkserver; node_forkserver.main({theirs.fileno()})")
        own_env = {k: v for k, v in env.items() if not k.startswith("HUTCH_") or _reads_at_import(k)}
        self.proc = subprocess.Popen([sys.executable, "-c", boot], env=own_env, pass_fds=[theirs.fileno()],
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        self._lock = threading.Lock()

    def spawn(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> ForkedNode:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = {"argv": list(args[3:]), "env": dict(env), "cwd": os.getcwd(), "umask": _umask(),
                   "rlimits": _rlimits()}
        ours.sendall(json.dumps(request).encode() + b"\n")
        with open(log_path, "wb") as log_file, self._lock:
            socket.send_fds(self._control, [b"r"], [theirs.fileno(), log_file.fileno()])
        theirs.close()
        ours.settimeout(60)
        line = b""
        while not line.endswith(b"\n"):
            chunk = ours.recv(64)
            if not chunk:
                raise RuntimeError(f"the fork server (pid {self.proc.pid}) did not start the node: exited "
                                   f"{self.proc.poll()}")
            line += chunk
        ours.settimeout(None)
        return ForkedNode(args, int(line), ours)


_servers: dict[tuple[tuple[str, str], ...], _ForkServer] = {}
_servers_lock = threading.Lock()


def _umask() -> int:
    """This process's umask, without setting it (os.umask would, for a moment, for every thread)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _rlimits() -> dict[str, list[int]]:
    """This process's resource limits (a test lowers RLIMIT_NOFILE before it starts a node: Popen's child
    inherits them, so the forked node takes them over)."""
    return {name: list(resource.getrlimit(getattr(resource, name))) for name in dir(resource)
            if name.startswith("RLIMIT_")}


def spawn_node(args: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `args` (`[sys.executable, "-m", "hutch.cli.server", ...]`) with `env`, its output to
    `log_path`: forked from a fork server of the same import environment (started on first use), or as a
    fresh interpreter when `HUTCH_TEST_EXEC_NODES=1` or `args` is not hutch-server's command."""
    if os.environ.get(EXEC_ENV) == "1" or list(args[:3]) != [sys.executable, "-m", SERVER_MODULE]:
        with open(log_path, "wb") as log_file:
            return subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=dict(env))
    key = import_key(env)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None:
            server = _servers[key] = _ForkServer(env)
    return server.spawn(args, env, log_path)


# -- the fork server process ---------------------------------------------------------------------------
def main(control_fd: int) -> None:
    """The fork server: import what a node imports, then fork a node per request until the control socket
    closes. In a forked node this returns only by running the node (SystemExit ends the interpreter)."""
    base_path = [p for p in sys.path if p not in ("", str(Path(__file__).parent))]
    for name in PRELOAD:
        __import__(name)
    from hutch.runtime.workers.forkserver import forget_module

    forget_module(SERVER_MODULE)  # the node runs it as __main__, afresh
    _warm()
    request, log_fd = _serve(socket.socket(fileno=control_fd))
    _run_node(request, log_fd, base_path)


def _serve(control: socket.socket) -> tuple[dict[str, Any], int]:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    try:
        while True:
            readable, _, _ = select.select([control, wake_r], [], [])
            if wake_r in readable:
                os.read(wake_r, 4096)
            _reap(children)
            if control not in readable:
                continue
            msg, fds, _flags, _addr = socket.recv_fds(control, 16, 2)
            if not msg:  # the test process is gone: its nodes keep running, as Popen's children would
                sys.exit(0)
            status = socket.socket(fileno=fds[0])
            request = json.loads(status.makefile("rb").readline())
            pid = os.fork()
            if pid == 0:  # the node: leave nothing of the fork server's open
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in (control, status, *children.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, fds[1]
            os.close(fds[1])
            status.sendall(f"{pid}\n".encode())
            children[pid] = status
            _reap(children)
    except KeyboardInterrupt:
        sys.exit(1)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = children.pop(pid, None)
        if status is not None:
            try:
                status.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
            except OSError:
                pass  # the test process dropped this node's handle
            status.close()


def _run_node(request: dict[str, Any], log_fd: int, base_path: list[str]) -> None:
    """In the forked node: become `python -m hutch.cli.server <argv>` and run it."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        if resource.getrlimit(getattr(resource, name)) != (soft, hard):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = [os.getcwd(), *base_path]  # what `python -m` puts first: the working directory
    sys.argv = ["-m", *request["argv"]]
    import runpy
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
