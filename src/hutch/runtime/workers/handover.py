"""Connection locality, the transfer: moving an open AMQP or stream-protocol connection's socket and state
to another worker of the node (docs/scaling.md, "Connection locality"; `workers.locality`).

Owns: `Locality`, a worker's implementation of the session's `Handover` port (runtime/session/ports.py)
and of the stream session's `StreamHandover` (runtime/stream_session/ports.py), and the receiving end
(the composition root's `adopt` opens an AMQP or a stream connection by the state's kind). Moving a connection to worker N:
1. the session judged it quiet and encoded its state (runtime/session/handover.py, or
   runtime/stream_session/handover.py for a stream connection);
2. here the client socket's descriptor is duplicated and sent to the supervisor over this worker's
   control socket (`{"handover": N}`, `SCM_RIGHTS`), which relays it to worker N (`{"adopt": M}`). The
   state rides in the same message (base64) when it is at most `INLINE_STATE_BYTES` (a connection that
   moves at its first publish or consume usually has a few frames unread); a larger one follows on a
   fresh `AF_UNIX` stream pair whose other end travels with the client's descriptor;
3. the session drops its transport (the socket closes here only: the duplicate keeps the TCP
   connection), and a large state is written on this end of the pair, then closed. A TLS connection
   (`relay`) cannot be handed over so (Python's `ssl` cannot export a TLS session): worker N gets one
   end of a fresh socket pair as the connection's socket instead, and this worker keeps the TLS
   transport and pumps the plaintext between the two (`TlsRelay`, runtime/workers/relay.py);
4. worker N has the state (or reads it to the pair's end of file: at most `MAX_STATE_BYTES`, within
   `STATE_TIMEOUT_S`) and adopts the socket as an open connection (the `adopt` callable the
   composition root gives).

Rules:
- Nothing is lost silently: if worker N is not ready the supervisor closes the descriptors, if it dies
  the kernel does (it held the last copy), and if its state does not arrive whole it closes the client's
  connection itself (below). A relayed connection ends with either worker: the relay's pair closes.
  In every case the client sees its connection end and reconnects; a publish it had not been
  confirmed is its to resend, as on any connection loss.
- The kind of the connection (`KIND_AMQP`, `KIND_STREAM`) travels ahead of its state: the first
  character of an inline state, the first byte on a state's socket pair (written before the pair is
  handed over, so it is there even when the state never follows). A state that does not arrive whole
  ends an AMQP client's connection with 320 and a stream client's by closing its socket.
- Only a queue's stand-in (`remote`, its `home` a worker of this node that the link reaches) is a reason
  to move; a connection is judged once (the session's rule), so it moves at most once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from hutch.amqp import spec
from hutch.amqp.errors import CONNECTION_FORCED
from hutch.amqp.frames import method_frame
from hutch.runtime.stream_session.handover import is_stream_state
from hutch.runtime.workers.control import INLINE_STATE_BYTES, MAX_STATE_BYTES
from hutch.runtime.workers.link import WorkerLink
from hutch.runtime.workers.relay import TlsRelay
from hutch.runtime.workers.spec import node_of_worker

log = logging.getLogger("hutch.workers")

STATE_TIMEOUT_S = 5.0
RELAY_SOCKET_BUFFER_BYTES = 4 << 20  # each end of a relay's socket pair: as Linux's largest TCP send buffer (tcp_wmem); capped at wmem_max
KIND_AMQP, KIND_STREAM = b"a", b"s"  # what kind of connection a handed over state is, sent before it

Adopt = Callable[[socket.socket, bytes], Awaitable[None]]  # the composition root's: open the adopted socket


def worker_index(name: str) -> int | None:
    """N of a worker's name `<node>#w<N>`, else None."""
    _node, sep, index = name.rpartition("#w")
    return int(index) if sep and index.isdigit() else None


class Locality:
    """The `Handover` port of one worker, and its end for connections handed to it."""

    def __init__(self, link: WorkerLink, node_name: str, index: int, peer_up: Callable[[str], bool],
                 adopt: Adopt) -> None:
        self.link = link
        self.node_name = node_of_worker(node_name)  # the node's (a worker's own name works too)
        self.index = index
        self.peer_up = peer_up
        self.adopt = adopt
        self.moved_out = 0  # connections handed to another worker
        self.adopted = 0  # connections taken from another worker
        self.lost = 0  # connections handed to this worker and closed (their state did not arrive whole)
        self.relayed = 0  # TLS connections handed over through a relay (runtime/workers/relay.py)
        self._relays: set[TlsRelay] = set()  # the relays of this worker's TLS connections served elsewhere
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_adopt_connection(self.receive)

    # -- the session's port ----------------------------------------------------------------------------
    def home_of(self, queue: Any) -> int | None:  # Any: a queue of any type; only a stand-in has a home
        home = getattr(queue, "home", None)
        if not getattr(queue, "remote", False) or not isinstance(home, str):
            return None
        return self.worker_of(home)

    def worker_of(self, name: str) -> int | None:
        """The index of worker `name` when it is another worker of this node and reachable now."""
        if node_of_worker(name) != self.node_name:
            return None
        index = worker_index(name)
        if index is None or index == self.index or not self.peer_up(name):
            return None
        return index

    def move(self, sock: Any, state: bytes, to: int) -> bool:  # Any: the transport's socket (uvloop's own kind)
        try:
            fd = os.dup(sock.fileno())
        except OSError:
            return False
        try:
            return self._send(fd, state, to)
        finally:
            os.close(fd)

    def relay(self, transport: Any, state: bytes, to: int) -> bool:  # Any: the loop's TLS transport
        """Hand over a TLS connection: worker `to` gets one end of a fresh socket pair as the connection's
        socket, and this worker keeps the TLS session and pumps the plaintext between the two
        (runtime/workers/relay.py). True when handed over: the relay owns `transport` from now on."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (mine, theirs):  # as a loopback TCP socket's: a large message crosses in a few writes
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RELAY_SOCKET_BUFFER_BYTES)
        try:
            sent = self._send(theirs.fileno(), state, to)
        finally:
            theirs.close()
        if not sent:
            mine.close()
            return False
        relay = TlsRelay(transport, mine, self._relays.discard)
        self._relays.add(relay)
        relay.start()
        self.relayed += 1
        return True

    def _send(self, fd: int, state: bytes, to: int) -> bool:
        """Send client descriptor `fd` and its state to worker `to` (the caller closes `fd`). The state's
        kind (`KIND_STREAM` or `KIND_AMQP`) goes first, so that a receiver whose state does not arrive
        whole still ends the client's connection its protocol's way."""
        kind = KIND_STREAM if is_stream_state(state) else KIND_AMQP
        if len(state) <= INLINE_STATE_BYTES:
            sent = self.link.send_handover(to, [fd], kind.decode() + base64.b64encode(state).decode())
            self.moved_out += sent
            return sent
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.send(kind)  # (a fresh pair's buffer takes one byte at once)
        try:
            sent = self.link.send_handover(to, [fd, theirs.fileno()])
        finally:
            theirs.close()
        if not sent:
            mine.close()
            return False
        self.moved_out += 1
        self._spawn(write_and_close(mine, state, f"a connection handed to worker {to}"))
        return True

    # -- the receiving end -----------------------------------------------------------------------------
    def receive(self, sender: int, client: socket.socket, state: str | socket.socket) -> None:
        self._spawn(self._receive(sender, client, state))

    async def _receive(self, sender: int, client: socket.socket, carried: str | socket.socket) -> None:
        kind = KIND_AMQP
        try:
            if isinstance(carried, str):
                kind = carried[:1].encode()
                state = base64.b64decode(carried[1:], validate=True)
            else:
                try:
                    carried.setblocking(False)
                    # the kind's byte was in the pair before it was handed over: it is there whatever follows
                    kind = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(carried, 1), STATE_TIMEOUT_S)
                    state = await asyncio.wait_for(read_to_end(carried, MAX_STATE_BYTES), STATE_TIMEOUT_S)
                    if not state:
                        raise ValueError("no state (its sender went away)")
                finally:
                    carried.close()
            if kind not in (KIND_AMQP, KIND_STREAM):
                raise ValueError(f"unknown kind of connection {kind!r}")
        except (OSError, TimeoutError, ValueError, binascii.Error) as exc:
            log.warning("a connection handed over by worker %d is closed: its state did not arrive (%s)", sender, exc)
            self.lost += 1
            refuse_client(client, stream=kind == KIND_STREAM)
            return
        try:
            await self.adopt(client, state)
        except OSError as exc:  # the client's socket failed meanwhile
            log.warning("a connection handed over by worker %d could not be adopted: %s", sender, exc)
            self.lost += 1
            client.close()
            return
        self.adopted += 1

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for relay in list(self._relays):
            relay.abort()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def write_and_close(sock: socket.socket, data: bytes, what: str) -> None:
    """Write `data` on a state's socket pair (within `STATE_TIMEOUT_S`), then close it: the receiver reads
    to the end of file. A receiver gone meanwhile is logged (its clients' connections ended with it)."""
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(sock, data), STATE_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        log.warning("the state of %s was not sent: %s", what, exc)
    finally:
        sock.close()


async def read_to_end(sock: socket.socket, limit: int) -> bytes:
    """What a state's socket pair carries, to its end of file; ValueError past `limit` bytes."""
    loop = asyncio.get_running_loop()
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await loop.sock_recv(sock, 256 << 10)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"state over {limit} bytes")
        parts.append(chunk)


def refuse_client(client: socket.socket, stream: bool) -> None:
    """Close a client's connection this worker cannot adopt. An AMQP client gets connection.close 320
    first (best effort), so it learns why; a stream-protocol client's socket is closed without a frame,
    as RabbitMQ ends a stream connection on an internal error (its Close command would need the
    connection's correlation counter, which was in the state that did not arrive, and some clients
    cannot read a close the server starts: stream_session/connection.py's `drop`)."""
    if not stream:
        frame = method_frame(0, spec.Connection.Close(
            reply_code=CONNECTION_FORCED, reply_text="CONNECTION_FORCED - the connection could not be moved "
            "between the node's workers", class_id=0, method_id=0))
        try:
            client.setblocking(False)
            client.send(frame)
        except OSError:
            pass
    client.close()
