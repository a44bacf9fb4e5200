"""Compaction of load, the transfer: moving an island (a queue and the connections of its worker that use
only it) to another worker of the node, its sockets and its state together (docs/scaling.md,
"Compaction of load").

Owns: `IslandTransfer` (a worker's sending and receiving ends) and the island's envelope
(`pack_island` / `unpack_island`: the queue's state and each connection's, as bytes, in the order of
the sockets; their codecs are queues/classic/transfer.py's and runtime/session/island.py's, read by the
composition root's `adopt`). Moving an island to worker N:
1. the caller held reading on the island's connections and exported their states and the queue's;
2. here each client socket's descriptor is duplicated, and a fresh `AF_UNIX` stream pair made; one end
   and the duplicates go to the supervisor over this worker's control socket (`{"island": N}`,
   `SCM_RIGHTS`, at most `control.MAX_FDS` descriptors: an island of more connections is not movable),
   which relays them to worker N (`{"adopt_island": M}`) and closes its copies; the envelope is written
   on the other end of the pair, then closed (an island's state is large: it never rides inline): what
   the pair's buffer takes at once (all of a usual island's) before the message, the rest after;
3. worker N reads the envelope to the pair's end of file (in the turn the message came, when it is whole) (at most `control.MAX_ISLAND_STATE_BYTES`,
   within `STATE_TIMEOUT_S`), checks it names one state per socket, and calls `adopt` with the sockets
   and the states.

Rules:
- Nothing is lost silently: if worker N is not ready the supervisor closes the descriptors, if it dies
  the kernel does, and if the envelope does not arrive whole (or is malformed) worker N closes every
  client's connection with 320 CONNECTION_FORCED. Each client sees its connection end and reconnects.
  What makes that safe for the queue's messages is the caller's: the queue's record names its new home
  only once worker N holds them (the commit point, docs/scaling.md).
- The sender's `send` is False when nothing was handed over (the caller resumes the island where it is).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from hutch.runtime.workers import control
from hutch.runtime.workers.handover import STATE_TIMEOUT_S, read_to_end, refuse_client, write_and_close
from hutch.runtime.workers.link import WorkerLink

log = logging.getLogger("hutch.workers")

VERSION = 1
MAX_CONNECTIONS = control.MAX_FDS - 1  # an island's connections that fit one control message with its state

# the composition root's: build the queue and adopt the connections (sockets in the order of their states);
# the last argument is the `time.monotonic()` at which the supervisor's `{"adopt_island"}` arrived (a move's phases
# are timed from it, runtime/compaction.py's log line)
AdoptIsland = Callable[[bytes, list[tuple[socket.socket, bytes]], float], Awaitable[None]]


def pack_island(queue_state: bytes, connection_states: list[bytes]) -> bytes:
    data = msgpack.packb([VERSION, queue_state, connection_states], use_bin_type=True)
    assert isinstance(data, bytes)
    return data


def unpack_island(data: bytes, connections: int) -> tuple[bytes, list[bytes]]:
    """The queue's state and `connections` connection states of an envelope; ValueError if it is not one."""
    if len(data) > control.MAX_ISLAND_STATE_BYTES:
        raise ValueError(f"an island's state of {len(data)} bytes is over {control.MAX_ISLAND_STATE_BYTES}")
    try:
        v = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed island state: {exc}") from None
    if not isinstance(v, list) or len(v) != 3 or v[0] != VERSION or not isinstance(v[1], bytes) \
            or not isinstance(v[2], list) or not all(isinstance(c, bytes) for c in v[2]):
        raise ValueError("not an island state of this version")
    if len(v[2]) != connections:
        raise ValueError(f"an island state of {len(v[2])} connections came with {connections} sockets")
    return v[1], v[2]


class IslandTransfer:
    """One worker's end of island moves: `send` to another worker, and adoption of those handed here."""

    def __init__(self, link: WorkerLink, adopt: AdoptIsland) -> None:
        self.link = link
        self.adopt = adopt
        self.sent = 0  # islands handed to another worker
        self.adopted = 0  # islands taken from another worker
        self.lost = 0  # islands handed here and refused (their state did not arrive whole, or was bad)
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_adopt_island(self.receive)

    def send(self, to: int, clients: list[Any], queue_state: bytes, connection_states: list[bytes]) -> bool:
        """Hand `clients` (their sockets, in the order of `connection_states`) and the queue's state to worker
        `to`. True when handed over: the caller then forgets the connections and the queue (the sockets
        close here only; worker `to` holds their duplicates)."""
        if not 1 <= len(clients) <= MAX_CONNECTIONS or len(clients) != len(connection_states):
            return False
        envelope = pack_island(queue_state, connection_states)
        if len(envelope) > control.MAX_ISLAND_STATE_BYTES:
            return False
        dups: list[int] = []
        try:
            for sock in clients:
                dups.append(os.dup(sock.fileno()))
        except OSError:
            for fd in dups:
                os.close(fd)
            return False
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # what the pair's buffer takes is written now, before the sockets leave: worker `to` finds the
        # envelope whole (and its end of file) as it takes the sockets, without a turn of this loop between
        try:
            rest = _write_now(mine, envelope)
        except OSError:
            for fd in dups:
                os.close(fd)
            mine.close()
            theirs.close()
            return False
        try:
            sent = self.link.send_island(to, [theirs.fileno(), *dups])
        finally:
            theirs.close()
            for fd in dups:
                os.close(fd)
        if not sent:
            mine.close()
            return False
        self.sent += 1
        if rest:
            self._spawn(write_and_close(mine, rest, f"an island handed to worker {to}"))
        else:
            mine.close()
        return True

    def receive(self, sender: int, state_sock: socket.socket, clients: list[socket.socket]) -> None:
        self._spawn(self._receive(sender, state_sock, clients, time.monotonic()))

    async def _receive(self, sender: int, state_sock: socket.socket, clients: list[socket.socket],
                       arrived: float) -> None:
        try:
            try:
                state_sock.setblocking(False)
                data, whole = _read_now(state_sock, control.MAX_ISLAND_STATE_BYTES)
                if not whole:  # the rest is still being written: read on, in later turns
                    data += await asyncio.wait_for(read_to_end(state_sock, control.MAX_ISLAND_STATE_BYTES - len(data)),
                                                   STATE_TIMEOUT_S)
            finally:
                state_sock.close()
            queue_state, connection_states = unpack_island(data, len(clients))
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("an island handed over by worker %d is closed: its state did not arrive (%s)", sender, exc)
            self.lost += 1
            for client in clients:
                refuse_client(client, stream=False)
            return
        await self.adopt(queue_state, list(zip(clients, connection_states, strict=True)), arrived)
        self.adopted += 1

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _write_now(sock: socket.socket, data: bytes) -> bytes:
    """Write what `sock` (non-blocking) takes of `data` now: the rest (empty when all was written)."""
    sock.setblocking(False)
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except (BlockingIOError, InterruptedError):
            break
        view = view[n:]
    return bytes(view)


def _read_now(sock: socket.socket, limit: int) -> tuple[bytes, bool]:
    """What `sock` (non-blocking) holds now, and True when that reached its end of file; ValueError past
    `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = sock.recv(256 << 10)
        except (BlockingIOError, InterruptedError):
            return b"".join(parts), False
        if not chunk:
            return b"".join(parts), True
        size += len(chunk)
        if size > limit:
            raise ValueError(f"state over {limit} bytes")
        parts.append(chunk)
