"""The worker's end of its control socket to the supervisor (`hutch.runtime.workers.control`).

Owns: the heartbeat (a timer on the worker's event loop: a loop that does not turn sends none), the
`ready` report with the worker's listener ports, adopting the worker-link sockets the supervisor sends
for restarted workers, and noticing that the supervisor is gone (the socket's end of file: the worker
stops cleanly, so `kill -9` of the parent leaves no orphans), and the node-wide resource alarms: the
worker reports its own memory and disk alarms (`{"alarms": [...]}`) and is told every worker's
(`{"node_alarms": [...]}`, the supervisor's union), so one worker's alarm blocks publishers node-wide.
And connection locality's transfer (runtime/workers/handover.py): `{"handover": N}` with a client
socket's descriptor and the state socket's, for worker N (the supervisor relays them), and, the other
way, `{"adopt": M}` with both, from worker M; compaction of load's (runtime/workers/island.py):
`{"island": N}` with an island's state socket and its connections' sockets, and `{"adopt_island": M}`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping

from hutch.runtime.workers import control
from hutch.runtime.workers.spec import WorkerSpec, worker_name

log = logging.getLogger("hutch.workers")

Adopt = Callable[[str, socket.socket], None]  # the paired transport's `adopt`
# a connection handed over by worker M: (M, the client's socket, its state inline (base64) or the socket
# its state arrives on)
AdoptConnection = Callable[[int, socket.socket, "str | socket.socket"], None]
# an island handed over by worker M: (M, the socket its state arrives on, its connections' sockets)
AdoptIsland = Callable[[int, socket.socket, list[socket.socket]], None]


class WorkerLink:
    """One worker's control socket. `start` begins heartbeats and reading; `set_adopt` hands it the
    worker link's transport (sockets that arrive before are kept until then)."""

    def __init__(self, spec: WorkerSpec, node_name: str, beat_s: float = control.MAX_BEAT_S) -> None:
        self.spec = spec
        self.beat_s = beat_s  # `control.beat_interval_s` of the node's heartbeat timeout
        self.node_name = node_name  # the node's name (not the worker's)
        self.sock = socket.socket(fileno=spec.control_fd)
        self.sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._on_parent_gone: Callable[[], None] | None = None
        self._adopt: Adopt | None = None
        self._waiting: list[tuple[str, socket.socket]] = []
        self._on_node_alarms: Callable[[set[str]], None] | None = None
        self._node_alarms: set[str] = set()  # the last union the supervisor sent
        self._adopt_connection: AdoptConnection | None = None
        self._adopt_island: AdoptIsland | None = None

    def first_links(self) -> dict[str, socket.socket]:
        """The worker-link sockets inherited at start, by peer worker name."""
        return {worker_name(self.node_name, index): socket.socket(fileno=fd)
                for index, fd in self.spec.peer_fds.items()}

    def start(self, on_parent_gone: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_parent_gone = on_parent_gone
        self._loop.add_reader(self.sock.fileno(), self._readable)
        self._beat()

    def set_adopt(self, adopt: Adopt) -> None:
        self._adopt = adopt
        waiting, self._waiting = self._waiting, []
        for name, sock in waiting:
            adopt(name, sock)

    def report_alarms(self, names: set[str]) -> None:
        """This worker's own alarms changed: tell the supervisor, which tells every worker the union."""
        self._send(control.encode("alarms", sorted(names)))

    def on_node_alarms(self, apply: Callable[[set[str]], None]) -> None:
        """Call `apply` with every worker's alarms (now, and whenever the supervisor's union changes)."""
        self._on_node_alarms = apply
        apply(set(self._node_alarms))

    def on_adopt_connection(self, adopt: AdoptConnection) -> None:
        """Call `adopt` with each connection another worker hands to this one (connection locality)."""
        self._adopt_connection = adopt

    def send_handover(self, to: int, fds: list[int], state: str | None = None) -> bool:
        """Hand a client socket's descriptor to worker `to` through the supervisor, with its state
        inline (base64) or, when `state` is None, a second descriptor it follows on. False when the
        message could not be sent now (nothing was handed over)."""
        assert len(fds) == (1 if state is not None else 2)
        try:
            socket.send_fds(self.sock, [control.encode_move("handover", to, state)], fds)
        except (OSError, ValueError):
            return False
        return True

    def on_adopt_island(self, adopt: AdoptIsland) -> None:
        """Call `adopt` with each island another worker hands to this one (compaction of load)."""
        self._adopt_island = adopt

    def send_island(self, to: int, fds: list[int]) -> bool:
        """Hand an island to worker `to` through the supervisor: `fds` is the socket its state follows on,
        then its connections' sockets. False when the message could not be sent now (nothing handed)."""
        assert 2 <= len(fds) <= control.MAX_FDS, len(fds)
        try:
            socket.send_fds(self.sock, [control.encode("island", to)], fds)
        except (OSError, ValueError):
            return False
        return True

    def request_rejoin(self, seed: str) -> bool:
        """Ask the supervisor to join the node to the cluster of `seed` (`hutchctl join_cluster`): it stops
        every worker, resets their data and starts them again with `--join seed`. False when the message
        could not be sent (nothing happens)."""
        try:
            self.sock.send(control.encode("rejoin", seed))
        except OSError:
            return False
        return True

    def ready(self, ports: Mapping[str, int]) -> None:
        self._send(control.encode("ready", dict(ports)))

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        for _name, sock in self._waiting:
            sock.close()
        self._waiting.clear()

    def _beat(self) -> None:
        assert self._loop is not None
        self._send(control.encode("hb", 1))
        self._timer = self._loop.call_later(self.beat_s, self._beat)

    def _send(self, data: bytes) -> None:
        try:
            self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            pass  # the supervisor is behind: a heartbeat more or less changes nothing
        except OSError:
            self._parent_gone()

    def _readable(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, control.MAX_MESSAGE_BYTES, control.MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                socket.close(fd)
            self._parent_gone()
            return
        try:
            doc = control.decode(data)
        except ValueError as exc:
            log.warning("ignored a malformed control message from the supervisor: %s", exc)
            doc = {}
        names = doc.get("node_alarms")
        if isinstance(names, list) and not fds:
            self._node_alarms = {str(n) for n in names if n in control.ALARM_NAMES}
            if self._on_node_alarms is not None:
                self._on_node_alarms(set(self._node_alarms))
            return
        sender, state = doc.get("adopt"), doc.get("state")
        if isinstance(sender, int) and self._adopt_connection is not None:
            if len(fds) == 1 and isinstance(state, str):
                self._adopt_connection(sender, socket.socket(fileno=fds[0]), state)
                return
            if len(fds) == 2 and state is None:
                self._adopt_connection(sender, socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]))
                return
        sender = doc.get("adopt_island")
        if isinstance(sender, int) and len(fds) >= 2 and self._adopt_island is not None:
            self._adopt_island(sender, socket.socket(fileno=fds[0]), [socket.socket(fileno=fd) for fd in fds[1:]])
            return
        peer = doc.get("peer")
        if isinstance(peer, int) and len(fds) == 1 and peer != self.spec.index:
            name, sock = worker_name(self.node_name, peer), socket.socket(fileno=fds[0])
            if self._adopt is None:
                self._waiting.append((name, sock))
            else:
                self._adopt(name, sock)
            return
        for fd in fds:  # a descriptor we did not ask for is closed, never leaked
            socket.close(fd)

    def _parent_gone(self) -> None:
        if self._on_parent_gone is None:
            return
        log.warning("the supervisor of this worker is gone: stopping")
        callback, self._on_parent_gone = self._on_parent_gone, None
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        callback()
