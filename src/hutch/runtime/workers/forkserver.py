"""The worker fork server ("zygote") of a node of workers: worker processes forked, not exec'd.

Owns: `WorkerForkServer` (the supervisor's end: start the zygote, ask it for a worker, close it),
`ForkedWorker` (the handle of a forked worker: the pid, its exit status, signals) and the zygote's own
loop (`_zygote`), and the switch that turns it off (`EXEC_ENV`).

Why: a worker started as `python -m hutch.cli.server` is a fresh interpreter that imports hutch, aiohttp
and cryptography again (~1 s of CPU, much more on a loaded machine), at the node's start and at every
restart of a worker that died. The zygote imports them once; each worker is a fork of it.

How (docs/scaling.md, "The worker fork server"):
- `supervise()` starts the zygote before it runs any event loop or thread (`WorkerForkServer.start`): a
  `fork` of the supervisor that closes every descriptor but its end of a `SOCK_SEQPACKET` pair, imports
  what a worker imports, freezes the collector's view of those objects, and then only forks.
- A worker's start is one request on that socket: the argv, the environment (with `HUTCH_WORKER_SPEC`)
  and the descriptors the spec names (its control socket and worker-link sockets, by `SCM_RIGHTS`,
  with the numbers they must have in the worker). The zygote forks twice (the middle process exits at
  once) and answers the worker's pid. The supervisor is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
  the orphaned worker becomes the supervisor's own child: the supervisor signals it by pid, reads its
  exit status with `waitpid` once its pidfd is readable, and nothing of it depends on the zygote
  afterwards.
- The worker puts its descriptors at their numbers, closes every other one (as `pass_fds` does), resets
  signal handlers, the signal mask and the wakeup fd to a fresh interpreter's, takes the request's
  environment and argv, and runs `hutch.cli.server` as `__main__` as `python -m hutch.cli.server` does
  (runpy, by name: the runtime imports nothing of the cli; the zygote's imports are by name too); at its
  end it shuts down as the interpreter would (threads joined, `atexit` run, streams flushed) and exits
  with main's code. It never returns into the supervisor's frames it was forked from.
- The zygote dying (killed, or any failure to answer) never stops the node: the supervisor logs it once
  and starts every later worker as a fresh interpreter. `HUTCH_WORKER_EXEC=1` starts no zygote at all.
  The supervisor gone (even `kill -9`) closes the zygote's socket and the zygote exits; on `SIGTERM` the
  supervisor closes it and reaps it with its workers.

Rules: the zygote is single-threaded and never runs an event loop; workers forked from one zygote share
its hash seed (`random` is reseeded on fork by Python itself, OpenSSL's generator too).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import gc
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

log = logging.getLogger("hutch.workers")

EXEC_ENV = "HUTCH_WORKER_EXEC"
"""Set to 1: no worker fork server; every worker is a fresh `python -m hutch.cli.server`."""

WORKER_MODULE = "hutch.cli.server"
"""What a worker runs as `__main__` (by name, as `python -m` does: the runtime does not import the cli)."""
PRELOAD = (WORKER_MODULE, "hutch.mgmt", "hutch.mgmt.definitions", "hutch.runtime.app", "uvloop")
"""What a worker imports before it serves (cli/server.py's `_run_worker`): the zygote's imports, by name."""

REQUEST_MAX_BYTES = 1 << 20  # a request is the argv and the environment: far less
MAX_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors per message (SCM_MAX_FD)
ANSWER_TIMEOUT_S = 60.0  # the zygote imports before its first answer (seconds on a loaded machine)
_PR_SET_CHILD_SUBREAPER = 36


class ForkServerGone(Exception):
    """The zygote did not start a worker (it exited, or answered with an error)."""


class ForkedWorker:
    """A worker forked by the zygote and adopted by the supervisor (its subreaper): what the supervisor
    uses of `asyncio.subprocess.Process` (pid, returncode, send_signal, kill, wait). The exit status
    (`returncode`: -N for a signal N, as `Process`) is read by `waitpid` when the pidfd is readable, so the
    pid is never signalled after it was reaped (it cannot have been reused before)."""

    def __init__(self, pid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(pid)
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not ours to wait for (cannot happen while we are its subreaper)
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerForkServer:
    """The supervisor's end of the zygote (see the module docstring)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._proc: ForkedWorker | None = None  # the zygote's own exit, once the loop runs
        self._turn = asyncio.Lock()  # one request at a time: answers come in order, one reader on the socket

    @classmethod
    def start(cls) -> WorkerForkServer | None:
        """Fork the zygote (before any event loop or thread), or None when it is switched off
        (`HUTCH_WORKER_EXEC=1`) or this system cannot adopt orphans (no subreaper or pidfd)."""
        if os.environ.get(EXEC_ENV) == "1" or not hasattr(os, "pidfd_open"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
            os.close(os.pidfd_open(os.getpid()))  # the kernel has pidfds (Linux 5.3+), not only the call
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except (OSError, AttributeError) as exc:
            log.info("no worker fork server (%s): workers start as fresh interpreters", exc)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote: never returns into the supervisor's frames
            try:
                ours.close()
                _zygote(theirs)
            finally:
                os._exit(1)
        theirs.close()
        log.info("worker fork server started (pid %d)", pid)
        return cls(pid, ours)

    def watch(self, loop: asyncio.AbstractEventLoop) -> ForkedWorker:
        """The zygote's own exit (it is the supervisor's child), once the supervisor's loop runs."""
        self._sock.setblocking(False)
        self._proc = ForkedWorker(self.pid, loop)
        return self._proc

    @property
    def alive(self) -> bool:
        return self._sock.fileno() != -1 and (self._proc is None or self._proc.returncode is None)

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int]) -> ForkedWorker:
        """A worker forked with `argv` (the node's flags), `env`, and `fds` at their same numbers;
        ForkServerGone if the zygote cannot (the caller starts a fresh interpreter instead)."""
        loop = asyncio.get_running_loop()
        request = json.dumps({"argv": list(argv), "env": dict(env), "fds": list(fds)}).encode()
        if len(request) > REQUEST_MAX_BYTES or len(fds) > MAX_FDS:
            raise ForkServerGone("the request is too large to send")
        async with self._turn:  # two workers restarting at once ask one after the other
            if not self.alive:
                raise ForkServerGone("it was closed")
            try:
                socket.send_fds(self._sock, [request], list(fds))
                answer = await asyncio.wait_for(self._answer(loop), ANSWER_TIMEOUT_S)
            except (TimeoutError, OSError) as exc:
                raise ForkServerGone(str(exc) or type(exc).__name__) from None
        if not answer:
            raise ForkServerGone("it exited")
        reply = json.loads(answer)
        if "pid" not in reply:
            raise ForkServerGone(reply.get("error", "no pid"))
        pid = int(reply["pid"])
        try:
            return ForkedWorker(pid, loop)
        except OSError as exc:  # no pidfd for it (descriptors exhausted): not a worker we could watch
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise ForkServerGone(f"cannot watch worker pid {pid}: {exc}") from None

    async def _answer(self, loop: asyncio.AbstractEventLoop) -> bytes:
        while True:
            try:
                return self._sock.recv(4096)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(self._sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(self._sock.fileno())

    def close(self) -> None:
        """The zygote sees the end of file and exits (reaped through `watch`'s handle)."""
        self._sock.close()

    async def stop(self, timeout_s: float) -> None:
        """Close, then wait for the zygote's exit (kill it past `timeout_s`): no orphan."""
        self.close()
        if self._proc is None:
            return
        try:
            await asyncio.wait_for(self._proc.wait(), timeout_s)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()


# -- the zygote process ----------------------------------------------------------------------------------
def _zygote(sock: socket.socket) -> NoReturn:
    """Close what the supervisor had open, import what a worker imports, then fork workers until the
    supervisor's end closes."""
    _close_all_but({0, 1, 2, sock.fileno()})
    _fresh_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the process group: the supervisor decides
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:  # uvloop is optional (runtime/app.py): the worker imports what it can
            pass
    forget_module(WORKER_MODULE)  # the worker runs it as __main__, afresh
    gc.collect()
    gc.freeze()  # the imported modules' objects: neither collected again nor copied by a collection
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, REQUEST_MAX_BYTES, MAX_FDS)
        except InterruptedError:
            continue
        if not msg:  # the supervisor closed its end or is gone: its workers are its own
            os._exit(0)
        answer: dict[str, object]
        try:
            answer = {"pid": _fork_worker(json.loads(msg), fds, sock)}
        except Exception as exc:  # noqa: BLE001 - any failure is answered: the supervisor execs instead
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(answer).encode())


def forget_module(name: str) -> None:
    """Drop the imported module `name` (and its attribute on its package), so that `runpy` runs it afresh as
    `__main__` (it warns of a module imported already); what it imported stays imported. Also the tests'
    fork server's (tests/node_forkserver.py)."""
    sys.modules.pop(name, None)
    package, _, leaf = name.rpartition(".")
    if hasattr(sys.modules.get(package), leaf):
        delattr(sys.modules[package], leaf)


def _fork_worker(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """Fork twice: the middle process writes the worker's pid and exits, so the worker is orphaned to
    the supervisor (its subreaper) at once."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                _become_worker(request, fds, sock)
            os.write(write_end, str(worker).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 32):
        data += chunk
    os.close(read_end)
    os.waitpid(middle, 0)
    if not data:
        raise OSError("the worker's fork failed")
    return int(data)


def _become_worker(request: dict[str, Any], fds: list[int], sock: socket.socket) -> NoReturn:
    """In the worker: its descriptors, signals, environment and argv as `python -m hutch.cli.server`
    would have them (`pass_fds`, a fresh interpreter), then the worker itself; exits with its code."""
    code = 1
    try:
        sock.close()
        targets = [int(n) for n in request["fds"]]
        argv = [str(a) for a in request["argv"]]
        env = {str(k): str(v) for k, v in request["env"].items()}
        high = max([*targets, *fds, 2]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, high) for fd in fds]
        for fd in fds:
            os.close(fd)
        for fd, target in zip(moved, targets, strict=True):
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
        _close_all_but({0, 1, 2, *targets})
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _fresh_signals()
        os.environ.clear()
        os.environ.update(env)
        for handler in logging.getLogger().handlers[:]:  # the worker configures its own (its `[wN]`)
            logging.getLogger().removeHandler(handler)
        sys.argv = ["-m", *argv]  # runpy puts the module's path first, as `python -m` does
        import runpy
        try:
            runpy.run_module(WORKER_MODULE, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:  # `raise SystemExit(main())`, the module's last line
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then the exit code 1
        import traceback
        traceback.print_exc()
    finally:
        _shut_down()
        os._exit(code)


def _shut_down() -> None:
    """What the interpreter does at exit, in its order: join the non-daemon threads, run `atexit`, flush."""
    with contextlib.suppress(BaseException):
        shutdown = getattr(__import__("threading"), "_shutdown", None)
        if shutdown is not None:
            shutdown()
    with contextlib.suppress(BaseException):
        import atexit
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _close_all_but(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _fresh_signals() -> None:
    """A fresh interpreter's signal state: default actions but SIGPIPE and SIGXFSZ ignored and SIGINT's
    KeyboardInterrupt, nothing blocked, no wakeup fd."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


__all__ = ["EXEC_ENV", "WORKER_MODULE", "ForkServerGone", "ForkedWorker", "WorkerForkServer", "forget_module"]
