"""The supervisor: the parent process of a node of N workers (`hutch-server --workers N`).

Owns: the node's data directory lock, the listening ports the workers share (reserved here: bound with
`SO_REUSEPORT`, never listened on, so port 0 becomes one port every worker binds, and the port stays the
node's while workers restart), the worker link's socket pairs (`socket.socketpair`: nothing listens on a
network port for it), starting the workers, the node's ports file, and the workers' lives: a worker that
exits is restarted, one whose heartbeat stops (hung, or `SIGSTOP`) is killed and restarted, and
`SIGTERM`/`SIGINT` stops them all.

Rules (gunicorn's arbiter and nginx's master, docs/scaling.md):
- The supervisor does no message work and holds no client socket: it runs one small event loop for
  its control sockets, timers and child processes.
- A worker is `python -m hutch.cli.server` with the node's own flags: forked by the worker fork server
  (runtime/workers/forkserver.py: a "zygote" forked by `supervise()` before any event loop or thread,
  with the worker's modules imported; the worker is adopted as this process's child), or, when the
  zygote is off (`HUTCH_WORKER_EXEC=1`) or gone, started with `subprocess` (a fresh interpreter). Either
  way nothing of the parent's state is inherited but the descriptors passed by number in
  `HUTCH_WORKER_SPEC`; not `multiprocessing`, whose spawn pickles state and whose fork would copy an
  event loop. The zygote dying never stops the node.
- When worker K is (re)started, each running worker J gets a new socket pair to K: one end is passed to
  K at its start, the other sent to J over J's control socket (`SCM_RIGHTS`).
- A worker that fails before it was ever ready (a bad certificate, a port in use) stops the node with
  exit code 1: its own one-line error is already on stderr. Later exits are restarted, after a delay
  that grows while a worker keeps dying young (`RESTART_DELAY_*`).
- The heartbeat is judged only once a worker is ready (recovery may keep a starting worker busy).
- Connection locality: a worker's `{"handover": N}` (a client's socket and its state socket) is relayed
  to worker N if it is ready, else its descriptors are closed here (the client reconnects); the
  supervisor never reads or writes them. Compaction of load's `{"island": N}` (an island's state socket
  and its connections' sockets) is relayed the same way as `{"adopt_island": M}`.
- `hutchctl join_cluster` on a running node of workers (worker 0's `{"rejoin": seed}`, after it checked
  the seed answers): as RabbitMQ's `stop_app; reset; join_cluster; start_app`, every worker is stopped,
  its data directory emptied (a dotfile such as the cluster secret file stays) and every worker started
  again with `--join seed` (the node's AMQP ports stay reserved; clients reconnect).
- Killing the supervisor with `-9` closes every control socket: each worker sees the end of file and
  stops (runtime/workers/link.py), so no worker outlives its node.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from hutch import portfile
from hutch.config import Config
from hutch.runtime.workers import control
from hutch.runtime.workers.forkserver import WORKER_MODULE, ForkedWorker, ForkServerGone, WorkerForkServer
from hutch.runtime.workers.spec import SPEC_ENV, WorkerSpec, data_dir_mismatch, worker_dir
from hutch.storage.dirlock import DataDirLock
from hutch.storage.fs import DATA_UMASK

log = logging.getLogger("hutch.workers")

RESTART_DELAY_FIRST_S = 0.1
RESTART_DELAY_MAX_S = 5.0
YOUNG_S = 10.0  # a worker that dies within this many seconds of its start makes the next delay longer
STOP_TIMEOUT_S = 60.0  # then stragglers are killed


def reserve_port(host: str, port: int) -> tuple[int, list[socket.socket]]:
    """Bind (never listen) `SO_REUSEPORT` sockets on `host` (empty: IPv4 and IPv6) and `port` (0: any
    free one): the port every worker then listens on. OSError if it cannot be had. A fixed port is first
    bound without `SO_REUSEPORT` (and let go): a port another process shares with `SO_REUSEPORT` (another
    node of workers) is refused as in use rather than joined, which would split clients between nodes."""
    if host:
        families = [(socket.getaddrinfo(host, None)[0][0], host)]
    else:
        families = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]
    for _attempt in range(5):
        socks: list[socket.socket] = []
        chosen = port
        try:
            for family, address in families:
                if port:
                    _probe_free(family, address, port)
                s = socket.socket(family, socket.SOCK_STREAM)
                socks.append(s)
                # no SO_REUSEADDR: another supervisor's probe (which has it) must see this port taken
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((address, chosen))
                chosen = s.getsockname()[1]
            return chosen, socks
        except OSError as exc:
            for s in socks:
                s.close()
            if not host and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL) and len(families) == 2:
                families = families[:1]  # no IPv6 here: the workers will listen on IPv4 alone too
                continue
            if port or exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free port for both address families")


def _probe_free(family: int, address: str, port: int) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no owner
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind((address, port))


class _Worker:
    __slots__ = ("index", "proc", "control", "started_at", "last_heartbeat", "ready", "ever_ready", "ports",
                 "delay_s", "alarms")

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: asyncio.subprocess.Process | ForkedWorker | None = None
        self.control: socket.socket | None = None
        self.started_at = 0.0
        self.last_heartbeat = 0.0
        self.ready = False  # ready since its last start: its heartbeat is judged
        self.ever_ready = False
        self.ports: dict[str, int] = {}
        self.delay_s = RESTART_DELAY_FIRST_S
        self.alarms: frozenset[str] = frozenset()  # its own memory and disk alarms, as it last reported

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    """See the module docstring. `argv` are the node's flags, given to every worker as they are."""

    def __init__(self, config: Config, argv: Sequence[str], count: int,
                 fork_server: WorkerForkServer | None = None) -> None:
        assert count >= 2
        self._fork_server = fork_server  # None: every worker a fresh interpreter
        self.config = config
        self.argv = list(argv)
        self.workers = [_Worker(i) for i in range(count)]
        self.amqp_port = 0
        self.amqps_port: int | None = None
        self.stream_port: int | None = None  # the stream protocol's ports, shared by the workers as AMQP's
        self.stream_tls_port: int | None = None
        self._reserved: list[socket.socket] = []
        self._stop = asyncio.Event()
        self._exit_code = 0
        self._stopping = False
        self._resetting = False  # `_rejoin` is stopping and restarting every worker: no one-by-one restart
        # restarts one at a time: a worker restarted while another is being restarted must see it running, to
        # get a link to it (two workers killed at once each saw the other dead, and neither ever had a peer)
        self._restarting = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop
        self._watchers: set[asyncio.Task[None]] = set()
        self._check: asyncio.TimerHandle | None = None
        self._node_alarms: frozenset[str] = frozenset()  # the union last told to the workers
        self._checked_at = 0.0  # when the heartbeats were last judged (a pause of this process shows here)

    # -- life ------------------------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        reserved: dict[str, int | None] = {}
        for key, what, host, port in (("amqp", "AMQP", cfg.amqp_host, cfg.amqp_port),
                                      ("amqps", "AMQP over TLS", cfg.amqps_host, cfg.amqps_port),
                                      ("stream", "the stream protocol", cfg.stream_host, cfg.stream_port),
                                      ("stream_tls", "the stream protocol over TLS", cfg.stream_tls_host,
                                       cfg.stream_tls_port)):
            if port is None:
                reserved[key] = None
                continue
            try:
                reserved[key], socks = reserve_port(host, port)
                self._reserved += socks
            except OSError as exc:
                print(f"hutch-server: cannot listen for {what} on port {port}: {_why(exc)}", file=sys.stderr)
                return 1
        self.amqp_port = reserved["amqp"] or 0
        self.amqps_port, self.stream_port, self.stream_tls_port = (
            reserved["amqps"], reserved["stream"], reserved["stream_tls"])
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._request_stop)
        self._loop.add_signal_handler(signal.SIGHUP, self._forward_hup)
        if self._fork_server is not None:
            self._watch_fork_server(self._fork_server)
        await self._spawn_all()
        log.info("node %s: %d workers started (AMQP port %d)", cfg.node_name, len(self.workers), self.amqp_port)
        self._checked_at = self._loop.time()
        self._check = self._loop.call_later(control.HEARTBEAT_S, self._check_heartbeats)
        await self._stop.wait()
        await self._stop_all()
        return self._exit_code

    def _request_stop(self) -> None:
        if not self._stopping:
            log.info("node %s stopping its workers", self.config.node_name)
        self._stopping = True
        self._stop.set()

    def _forward_hup(self) -> None:
        """SIGHUP (certificate reload, docs/security.md) is each worker's business."""
        for w in self.workers:
            if w.running and w.proc is not None:
                w.proc.send_signal(signal.SIGHUP)

    async def _stop_all(self) -> None:
        if self._check is not None:
            self._check.cancel()
        await self._stop_workers()
        if self._fork_server is not None:
            await self._fork_server.stop(STOP_TIMEOUT_S)
        for task in list(self._watchers):
            task.cancel()
        for w in self.workers:
            self._close_control(w)
        for s in self._reserved:
            s.close()
        if self.config.data_dir:
            portfile.remove(self.config.data_dir)
        log.info("node %s stopped", self.config.node_name)

    async def _stop_workers(self) -> None:
        """SIGTERM to every running worker; those not gone within STOP_TIMEOUT_S are killed."""
        for w in self.workers:
            if w.running and w.proc is not None:
                w.proc.send_signal(signal.SIGCONT)  # a stopped worker must be able to take its SIGTERM
                w.proc.send_signal(signal.SIGTERM)
        procs = [w.proc for w in self.workers if w.running and w.proc is not None]
        if procs:
            done, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs],
                                               timeout=STOP_TIMEOUT_S)
            if pending:
                for w in self.workers:
                    if w.running and w.proc is not None:
                        log.warning("worker %d did not stop within %.0f s: killed", w.index, STOP_TIMEOUT_S)
                        w.proc.kill()
                await asyncio.wait(pending)

    async def _rejoin(self, seed: str) -> None:
        """`hutchctl join_cluster seed` on this node (see the module docstring): stop every worker, empty
        their data directories, start them again with `--join seed` (read at a worker's first start)."""
        if self._stopping or self._resetting:
            return
        if not self.config.cluster_enabled:
            log.error("node %s was started with clustering off (--no-cluster): it cannot join the cluster of %s; "
                      "start it without --no-cluster first", self.config.node_name, seed)
            return
        self._resetting = True
        try:
            log.warning("node %s joins the cluster of %s: its workers stop, their data (definitions and "
                        "messages) is dropped, and they start again joining it", self.config.node_name, seed)
            await self._stop_workers()
            for w in self.workers:
                self._close_control(w)
            if self._stopping:
                return
            for w in self.workers:
                _empty_dir(worker_dir(self.config.data_dir, w.index))
            self.argv += ["--join", seed]
            await self._spawn_all()
        finally:
            self._resetting = False

    # -- workers ---------------------------------------------------------------------------------------
    async def _spawn_all(self) -> None:
        """Start every worker, with a socket pair between each two of them (the worker link)."""
        pairs: dict[tuple[int, int], tuple[socket.socket, socket.socket]] = {}
        for i in range(len(self.workers)):
            for j in range(i + 1, len(self.workers)):
                pairs[(i, j)] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for w in self.workers:
                links = {j: pairs[(min(w.index, j), max(w.index, j))][0 if w.index < j else 1]
                         for j in range(len(self.workers)) if j != w.index}
                await self._spawn(w, links)
        finally:
            for a, b in pairs.values():
                a.close()
                b.close()

    async def _spawn(self, w: _Worker, links: dict[int, socket.socket]) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec = WorkerSpec(w.index, len(self.workers), child_end.fileno(),
                          {j: s.fileno() for j, s in links.items()}, self.amqp_port, self.amqps_port,
                          self.config.worker_own_ports, self.stream_port, self.stream_tls_port)
        env = dict(os.environ)
        env[SPEC_ENV] = spec.to_env()
        fds = [child_end.fileno(), *(s.fileno() for s in links.values())]
        proc: asyncio.subprocess.Process | ForkedWorker | None = None
        try:
            if self._fork_server is not None and self._fork_server.alive:
                try:
                    proc = await self._fork_server.spawn(self.argv, env, fds)
                except ForkServerGone as exc:
                    log.warning("the worker fork server could not start worker %d (%s): workers start as "
                                "fresh interpreters from now on", w.index, exc)
                    self._fork_server.close()
            if proc is None:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", WORKER_MODULE, *self.argv, env=env, stdin=subprocess.DEVNULL,
                    pass_fds=fds)
        finally:
            child_end.close()
        parent_end.setblocking(False)
        w.proc, w.control = proc, parent_end
        w.started_at = w.last_heartbeat = self._loop.time()
        w.ready = False
        self._loop.add_reader(parent_end.fileno(), self._readable, w)
        self._keep(self._watch(w, proc))
        log.info("worker %d started (pid %d, %s)", w.index, proc.pid,
                 "forked" if isinstance(proc, ForkedWorker) else "a fresh interpreter")

    async def _restart(self, w: _Worker) -> None:
        """Start worker `w` again, with a new socket pair to every running worker (one restart at a time)."""
        async with self._restarting:
            if not self._stopping and not self._resetting:
                await self._restart_now(w)

    async def _restart_now(self, w: _Worker) -> None:
        links: dict[int, socket.socket] = {}
        theirs: dict[int, socket.socket] = {}
        for other in self.workers:
            if other is not w and other.running and other.control is not None:
                links[other.index], theirs[other.index] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await self._spawn(w, links)
            for j, sock in theirs.items():
                control_sock = self.workers[j].control
                if control_sock is None:
                    continue
                try:
                    socket.send_fds(control_sock, [control.encode("peer", w.index)], [sock.fileno()])
                except OSError as exc:  # that worker is going too; its own restart pairs them again
                    log.info("could not hand worker %d its link to worker %d: %s", j, w.index, exc)
        finally:
            for sock in (*links.values(), *theirs.values()):
                sock.close()

    def _watch_fork_server(self, fork_server: WorkerForkServer) -> None:
        zygote = fork_server.watch(self._loop)

        async def watch() -> None:
            code = await zygote.wait()
            fork_server.close()
            if not self._stopping:
                log.warning("the worker fork server (pid %d) exited with %s: workers start as fresh "
                            "interpreters from now on", fork_server.pid,
                            f"signal {-code}" if code < 0 else f"code {code}")
        self._keep(watch())

    def _keep(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task the supervisor keeps (and cancels when it stops)."""
        task = asyncio.ensure_future(coro)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, w: _Worker, proc: asyncio.subprocess.Process | ForkedWorker) -> None:
        code = await proc.wait()
        if w.proc is not proc:
            return
        self._close_control(w)
        if self._stopping or self._resetting:
            return
        if not w.ever_ready:
            log.error("worker %d exited with code %d before it was ready: stopping the node", w.index, code)
            self._exit_code = 1
            self._request_stop()
            return
        young = self._loop.time() - w.started_at < YOUNG_S
        w.delay_s = min(w.delay_s * 2, RESTART_DELAY_MAX_S) if young else RESTART_DELAY_FIRST_S
        log.warning("worker %d (pid %d) exited with %s: restarting it in %.1f s", w.index, proc.pid,
                    f"signal {-code}" if code < 0 else f"code {code}", w.delay_s)
        await asyncio.sleep(w.delay_s)
        if not self._stopping:
            await self._restart(w)

    def _close_control(self, w: _Worker) -> None:
        if w.control is not None:
            self._loop.remove_reader(w.control.fileno())
            w.control.close()
            w.control = None
        w.ready = False
        if w.alarms:  # a worker gone takes its alarms with it (its replacement reports its own)
            w.alarms = frozenset()
            self._share_alarms()

    def _readable(self, w: _Worker) -> None:
        sock = w.control
        if sock is None:
            return
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, control.MAX_MESSAGE_BYTES, control.MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        try:
            self._handle(w, sock, data, fds)
        finally:
            for fd in fds:  # relayed (the receiver has its own copies) or refused: never kept here
                os.close(fd)

    def _handle(self, w: _Worker, sock: socket.socket, data: bytes, fds: list[int]) -> None:
        if not data:  # the worker is gone; `_watch` restarts it
            self._loop.remove_reader(sock.fileno())
            return
        w.last_heartbeat = self._loop.time()
        try:
            doc = control.decode(data)
        except ValueError:
            return
        to, state = doc.get("handover"), doc.get("state")
        if isinstance(to, int) and ((len(fds) == 1 and isinstance(state, str)) or (len(fds) == 2 and state is None)):
            self._relay_handover(w, to, fds, control.encode_move("adopt", w.index, state))
            return
        island = doc.get("island")
        if isinstance(island, int) and len(fds) >= 2:
            self._relay_handover(w, island, fds, control.encode("adopt_island", w.index))
            return
        seed = doc.get("rejoin")
        if isinstance(seed, str) and w.index == 0:
            self._keep(self._rejoin(seed))
            return
        alarms = doc.get("alarms")
        if isinstance(alarms, list):
            w.alarms = frozenset(str(a) for a in alarms if a in control.ALARM_NAMES)
            self._share_alarms()
            return
        ports = doc.get("ready")
        if isinstance(ports, dict):
            w.ports = {str(k): int(v) for k, v in ports.items()}
            w.ready = w.ever_ready = True
            self._send_alarms(w, self._node_alarms)
            log.info("worker %d ready: %s", w.index, ", ".join(f"{k} {v}" for k, v in w.ports.items()))
            self._announce()

    def _relay_handover(self, sender: _Worker, to: int, fds: list[int], message: bytes) -> None:
        """Pass a connection (or an island's) `sender` let go of to worker `to` with `message`, if it is
        ready to take it."""
        target = self.workers[to] if 0 <= to < len(self.workers) and to != sender.index else None
        if target is None or not target.ready or target.control is None:
            log.warning("a connection handed from worker %d to worker %s was closed: that worker is not ready",
                        sender.index, to)
            return
        try:
            socket.send_fds(target.control, [message], fds)
        except (OSError, ValueError) as exc:
            log.warning("a connection handed from worker %d to worker %d was closed: %s", sender.index, to, exc)

    def _share_alarms(self) -> None:
        """Memory and disk alarms are node-wide (as RabbitMQ's are cluster-wide): every worker is told the
        union of the workers' own alarms when it changes, and blocks its publishers while it is not empty."""
        union = frozenset().union(*(w.alarms for w in self.workers))
        if union == self._node_alarms:
            return
        self._node_alarms = union
        log.warning("node-wide resource alarms: %s", ", ".join(sorted(union)) or "none")
        for w in self.workers:
            self._send_alarms(w, union)

    def _send_alarms(self, w: _Worker, names: frozenset[str]) -> None:
        if w.control is None:
            return
        try:
            w.control.send(control.encode("node_alarms", sorted(names)))
        except OSError:
            pass  # a worker whose socket is full or gone: it gets the union again when ready

    def _check_heartbeats(self) -> None:
        now = self._loop.time()
        timeout_s = self.config.worker_heartbeat_timeout_ms / 1000
        if now - self._checked_at > 2 * control.HEARTBEAT_S + timeout_s / 2:
            # this process did not run either (the whole node was stopped, SIGSTOP, and continued): the
            # workers' silence is the node's, not a hang; their heartbeats count from now
            for w in self.workers:
                w.last_heartbeat = max(w.last_heartbeat, now)
        self._checked_at = now
        for w in self.workers:
            if w.ready and w.running and w.proc is not None and now - w.last_heartbeat > timeout_s:
                log.warning("worker %d (pid %d) sent no heartbeat for %.1f s (workers.heartbeat_timeout): "
                            "killing and replacing it", w.index, w.proc.pid, now - w.last_heartbeat)
                w.ready = False
                w.proc.kill()
        self._check = self._loop.call_later(control.HEARTBEAT_S, self._check_heartbeats)

    def _announce(self) -> None:
        """Once every worker is ready: the node's ports file (worker 0's listeners, the shared AMQP
        ports, each worker's own port when `workers.own_ports` is on), rewritten after each restart."""
        if not all(w.ready for w in self.workers) or not self.config.data_dir:
            return
        # worker 0's `cluster` port is the node's inter-node port (a seed others join through), when it
        # listens for other nodes (docs/scaling.md, "A node of workers in a multi-node cluster")
        ports: dict[str, int] = dict(self.workers[0].ports)
        for w in self.workers[1:]:
            ports.update({k: v for k, v in w.ports.items() if k.startswith(("amqp_w", "amqps_w", "stream_w", "stream_tls_w"))})
        where = portfile.write(self.config.data_dir, self.config.node_name, os.getpid(), ports)
        log.info("listening: %s (written to %s)", ", ".join(f"{k} {v}" for k, v in ports.items()), where)


def supervise(config: Config, argv: Sequence[str], count: int) -> int:
    """Run the supervisor of `count` workers until SIGTERM; returns the exit code."""
    if not config.data_dir:
        print("hutch-server: --workers needs a data directory (each worker keeps its own under it)",
              file=sys.stderr)
        return 2
    problem = data_dir_mismatch(config.data_dir, count)
    if problem:
        print(f"hutch-server: {problem}", file=sys.stderr)
        return 1
    os.umask(DATA_UMASK)
    os.makedirs(config.data_dir, exist_ok=True)
    lock = DataDirLock.acquire_or_reason(config.data_dir)
    if isinstance(lock, str):
        print(f"hutch-server: {lock}", file=sys.stderr)
        return 1
    try:
        portfile.remove(config.data_dir)
        for index in range(count):
            os.makedirs(worker_dir(config.data_dir, index), exist_ok=True)
        fork_server = WorkerForkServer.start()  # before any event loop or thread (forkserver.py)
        return asyncio.run(Supervisor(config, argv, count, fork_server).run())
    finally:
        lock.release()


def _empty_dir(path: str) -> None:
    """Remove everything in `path` but its dotfiles (the cluster secret file, `.hutch.secret`)."""
    for entry in os.scandir(path):
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _why(exc: OSError) -> str:
    return "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)


__all__ = ["Supervisor", "reserve_port", "supervise"]
