"""The inter-node transport: one authenticated, multiplexed TCP connection per pair of nodes.

Owns: the cluster listener, the outgoing dials to known peers (with capped backoff, forever), the
handshake driving (`hutch.cluster.wire.Handshake`), the choice of one connection per node pair, batched
writes, request/response correlation, heartbeats and peer liveness, the per-peer write bounds, and the
fault-injection hooks the tests use (`block`, `unblock`, `set_delay`). The wire format is
`hutch.cluster.wire`; docs/transport.md explains the protocol.

Rules:
- Hot path as in `connection.py`: `data_received` feeds the sans-I/O `FrameDecoder` and dispatches every
  entry of every complete batch synchronously; no task or coroutine per message (only an `on_request`
  handler that returns an awaitable gets one, to await it). `send` packs the message at once (so a value
  msgpack cannot encode raises in the caller), queues it on its peer, and one `loop.call_soon` per loop
  iteration writes every peer's queue as one batch frame with `writelines`.
- One connection per node pair (`_resolve_duplicate`): when both nodes dial each other, the connection
  dialled by the node whose name sorts lower wins, decided by the acceptor *before* it sends WELCOME, so
  the losing connection never carries a message. Any other second connection means the first one is
  stale (the peer restarted): the new one replaces it, reported as down then up.
- A peer is up while it has an open connection. `on_peer_up` / `on_peer_down` alternate strictly, one
  per transition. Going down drops that peer's unwritten queue and fails its pending calls with
  `PeerUnavailable`; closing a connection is synchronous bookkeeping (`_conn_closed`), whatever the
  socket does afterwards.
- Nothing a peer sends can raise out of a protocol callback: bad frames and handshake failures close the
  connection with a log line; exceptions from callbacks are logged and the connection carries on.
- Bounds: frames (`max_frame_bytes`, and `HANDSHAKE_MAX_FRAME_BYTES` until the peer is authenticated),
  accepted connections still in their handshake (`MAX_HANDSHAKING`, and `MAX_HANDSHAKING_PER_SOURCE` per
  source address), the handshake time (`peer_timeout_s`), and the bytes queued plus buffered per peer
  (`max_buffered_bytes`: `send` returns False past it).
- A full handshake table never refuses a newcomer: it evicts the oldest connection of the busiest source
  (the newcomer's own source when that one is at its limit) that has not sent a HELLO yet, else the
  oldest. Silent sockets, however many, only ever push out other silent sockets, so a peer that
  proves the secret (it sends its HELLO at once) gets in (issue 15, finding 8).
- Paired mode (`paired=True`, the worker link of a node's worker processes: runtime/workers/): no
  listener, no dials and no handshake. Every connection is a connected Unix socket the supervisor made
  with `socket.socketpair` and handed to both ends (`adopt`); only those peers exist, so nothing on the
  network can reach the link. Framing, batching, requests, heartbeats and liveness are as between nodes.
  A newer socket for the same peer (the peer worker was restarted) replaces the old connection.
  Both at once (`paired=True, network=True`: a worker of a node of workers in a multi-node cluster): the
  worker link to its own node's workers (`is_sibling`: never dialled, and refused from the network) and
  the listener, dials and handshake to every other node's workers.
- TLS (`ssl_server` / `ssl_client`, built from `cluster.ssl.*` by runtime/tls.py): both ends present
  and verify a certificate; the secret handshake runs inside TLS as without it. An accepted connection
  joins the handshake table at the accept, before its TLS handshake (runtime/tls_accept.py), so the
  table's limits and `peer_timeout_s` (which also bounds the TLS handshake) hold for TLS too.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import os
import random
import socket
import ssl
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

from hutch.cluster.wire import (
    BATCH_OVERHEAD_BYTES,
    ERROR,
    HANDSHAKE_MAX_FRAME_BYTES,
    HEARTBEAT_FRAME,
    MESSAGE,
    MIN_FRAME_BYTES,
    NONCE_BYTES,
    REASON_TEXT,
    REPLY,
    REQUEST,
    FrameDecoder,
    Handshake,
    HandshakeFailed,
    HandshakeState,
    MalformedFrame,
    Reason,
    Role,
    WireError,
    batch_parts,
    encode_refused,
    pack_error,
    pack_message,
    pack_message_raw,
    pack_reply,
    pack_request,
    pack_request_raw,
)
from hutch.core.credit_flow import LoopLoad
from hutch.runtime import listen
from hutch.runtime.tls_accept import TlsAccept

log = logging.getLogger("hutch.transport")

WRITE_BUFFER_HIGH_BYTES = 1 << 20
"""Per-connection write-buffer high-water mark: above it `writable(peer)` is False."""
BATCH_TARGET_BYTES = 1 << 20
"""A batch frame is closed once it holds this much; one larger entry still gets a frame of its own."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
MAX_HANDSHAKING = 128
"""Accepted connections in their handshake at once; a newcomer past it evicts one (`_make_room`)."""
MAX_HANDSHAKING_PER_SOURCE = 16
"""Accepted connections in their handshake at once from one source address."""
WARN_REPEAT_S = 60.0
"""The same handshake warning (same peer, same reason) is logged at WARNING at most this often."""
MAX_ERROR_CHARS = 2000
# The worker link alone (paired, no network): a worker that dies closes its socket (the peers see the end
# of file at once), and one that hangs is killed by the supervisor after workers.heartbeat_timeout (5 s by
# default), which closes it too; the link's own silence rule is only a backstop there, so it beats every
# 2 s (a tick a second, not four: an idle worker's loop sleeps) and gives up after 6 s, past the
# supervisor's default.
HEARTBEAT_S, PEER_TIMEOUT_S = 0.5, 3.0  # between nodes: a heartbeat on a quiet connection, silence dropped
WORKER_LINK_HEARTBEAT_S = 2.0
WORKER_LINK_TIMEOUT_S = 6.0
"""A RemoteError's message is cut to this length."""
_WILDCARD_HOSTS = frozenset(("", "0.0.0.0", "::"))


def _error_entry(request_id: int, exc: BaseException) -> bytes:
    # bounded, so a handler's huge exception text cannot make the reply exceed a frame
    return pack_error(request_id, type(exc).__name__[:200], str(exc)[:MAX_ERROR_CHARS])


class PeerUnavailable(Exception):
    """The peer is not connected, or its connection went down before the reply came."""


class RemoteError(Exception):
    """The peer's request handler raised; `str(exc)` is its message, `remote_type` its exception class."""

    def __init__(self, message: str, remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type


class ConnState(enum.Enum):
    CONNECTING = "connecting"  # dialler: TCP connect under way
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


class _Conn(asyncio.Protocol):
    """One TCP connection to or from another node. Invariant: `peer_name` is set for a dialler from the
    start (the node it dials) and for an acceptor once the dialler's HELLO arrived."""

    def __init__(self, owner: Transport, role: Role, peer_name: str | None, label: str) -> None:
        self.owner = owner
        self.role = role
        self.peer_name = peer_name
        self.label = label  # "host:port" of the other end, for log lines
        self.source = ""  # an acceptor's source address (the handshake limits are per source)
        self.state = ConnState.CONNECTING if role is Role.DIALLER else ConnState.HANDSHAKE
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_BYTES)
        self.hs = Handshake(role, node=owner.node_name, secret=owner._secret, nonce=os.urandom(NONCE_BYTES),
                            host=owner.host, port=owner.port, max_frame_bytes=owner.max_frame_bytes,
                            expected_node=peer_name, answers_as=owner.answers_as)
        self.send_limit = MIN_FRAME_BYTES  # largest frame the peer accepts (min of both sides' limits)
        self.write_paused = False
        self.started = self.last_rx = self.last_tx = owner._loop.time()
        self.delayed: deque[tuple[float, list[bytes]]] = deque()
        self.delayed_bytes = 0
        self.delay_timer: asyncio.TimerHandle | None = None
        self.adopted = False  # paired mode: a socket the supervisor made; open without a handshake
        self.heard = False  # something arrived on it (an adopted socket's peer may still be starting)

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's TCPTransport is not registered as an asyncio.Transport); with TLS
        # (an acceptor behind TlsAccept) the TCP one until `tls_ready`
        stream = self.transport = cast(asyncio.Transport, transport)
        high = self.owner.write_buffer_high_bytes
        stream.set_write_buffer_limits(high=high, low=high // 4)
        self.started = self.last_rx = self.last_tx = self.owner._loop.time()
        if self.role is Role.ACCEPTOR:
            peer = transport.get_extra_info("peername") or ("?", 0)
            self.label = f"{peer[0]}:{peer[1]}"
            self.source = str(peer[0])
        self.owner._conn_made(self)

    def tls_ready(self, transport: asyncio.Transport) -> None:
        """An acceptor's TLS handshake is done (TlsAccept): the secret handshake runs over `transport`."""
        if self.state is ConnState.CLOSED:  # evicted or stopped meanwhile
            transport.abort()
            return
        self.transport = transport
        high = self.owner.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)

    def data_received(self, data: bytes) -> None:
        load = self.owner.load
        if load is None:
            self._received(data)
        else:  # other nodes' messages are loop work too (the flow rule)
            load.timed(self._received, data)

    def _received(self, data: bytes) -> None:
        if self.state is ConnState.CLOSED:
            return
        self.last_rx = self.owner._loop.time()
        self.heard = True
        try:
            try:
                objs = self.decoder.feed(data)
                error = None
            except WireError as exc:  # act on the good frames in front of the bad one, then close
                objs, error = exc.values, exc
            for obj in objs:
                if self.state is ConnState.OPEN:
                    self.owner._dispatch_batch(self, obj)
                elif self.state is ConnState.HANDSHAKE:
                    self.owner._handshake_step(self, obj)
                if self.state is ConnState.CLOSED:
                    return
            if error is not None:
                raise error
        except (WireError, IndexError, TypeError, ValueError, KeyError) as exc:
            self.owner._bad_input(self, exc)
        except Exception:  # a bug of ours: never let it reach the loop; this connection is suspect
            log.exception("inter-node connection %s %s failed", self.direction, self.label)
            self.owner._conn_closed(self, "internal error", abort=True)

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._closed_after_close(self)
        why = f"connection lost ({exc})" if exc else "connection closed by the peer"
        self.owner._conn_closed(self, why, abort=False)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.peer_name:
            for hook in self.owner.writable_hooks:  # what held back for a full link may go on
                hook(self.peer_name)

    # -- writing ---------------------------------------------------------------------------------
    @property
    def direction(self) -> str:
        return "from" if self.role is Role.ACCEPTOR else "to"

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.state is not ConnState.CLOSED:
            self.last_tx = self.owner._loop.time()
            self.transport.write(data)

    def write_parts(self, parts: list[bytes], delay_s: float) -> None:
        if delay_s <= 0 and not self.delayed:
            if self.transport is not None and self.state is ConnState.OPEN:
                self.last_tx = self.owner._loop.time()
                self.transport.writelines(parts)
            return
        loop = self.owner._loop
        self.delayed.append((loop.time() + delay_s, parts))
        self.delayed_bytes += sum(map(len, parts))
        if self.delay_timer is None:
            self.delay_timer = loop.call_at(self.delayed[0][0], self._write_delayed)

    def _write_delayed(self) -> None:
        self.delay_timer = None
        loop = self.owner._loop
        now = loop.time()
        delayed = self.delayed
        # FIFO even when the delay changed meanwhile: a batch never overtakes an earlier one
        while delayed and delayed[0][0] <= now:
            _, parts = delayed.popleft()
            self.delayed_bytes -= sum(map(len, parts))
            if self.transport is not None and self.state is ConnState.OPEN:
                self.last_tx = now
                self.transport.writelines(parts)
        if delayed:
            self.delay_timer = loop.call_at(delayed[0][0], self._write_delayed)

    def buffered_bytes(self) -> int:
        size = self.delayed_bytes
        if self.transport is not None:
            size += self.transport.get_write_buffer_size()
        return size


class _Peer:
    """What this node knows about one other node. Invariants: `conn` is OPEN or None; `dialing` is our
    own outgoing connection still connecting or in its handshake, or None; `out` is empty unless `conn`
    is set (going down clears it)."""

    __slots__ = ("name", "host", "port", "registered", "conn", "dialing", "dial_task", "retry", "backoff_s",
                 "out", "out_bytes", "dirty", "last_failure")

    def __init__(self, name: str, host: str, port: int, registered: bool) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.registered = registered  # set_peer was called: keep a connection, redial forever
        self.conn: _Conn | None = None
        self.dialing: _Conn | None = None
        self.dial_task: asyncio.Task[None] | None = None
        self.retry: asyncio.TimerHandle | None = None
        self.backoff_s = BACKOFF_FIRST_S
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.dirty = False
        self.last_failure = ""  # last dial failure logged at WARNING/INFO; repeats go to DEBUG


class Transport:
    """The node's end of the inter-node transport. See the module docstring and docs/transport.md."""

    def __init__(self, node_name: str, secret: bytes, host: str = "127.0.0.1", port: int = 0, *,
                 on_message: Callable[[str, Any], None],
                 on_request: Callable[[str, Any], Any | Awaitable[Any]] | None = None,
                 on_peer_up: Callable[[str], None] | None = None,
                 on_peer_down: Callable[[str], None] | None = None,
                 heartbeat_s: float = HEARTBEAT_S, peer_timeout_s: float = PEER_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20,
                 write_buffer_high_bytes: int = WRITE_BUFFER_HIGH_BYTES,
                 max_buffered_bytes: int | None = None,
                 ssl_server: ssl.SSLContext | None = None, ssl_client: ssl.SSLContext | None = None,
                 paired: bool = False, network: bool | None = None,
                 is_sibling: Callable[[str], bool] | None = None,
                 answers_as: Callable[[str, str], bool] | None = None) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if not node_name:
            raise ValueError("the node name must not be empty")
        if not 0 < heartbeat_s < peer_timeout_s:
            raise ValueError("need 0 < heartbeat_s < peer_timeout_s")
        if max_frame_bytes < MIN_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be at least {MIN_FRAME_BYTES}")
        self.node_name = node_name
        self.load: LoopLoad | None = None  # the node's loop load: input handled here counts in it
        # called with a peer's name when its connection's write buffer drains below the low-water mark
        self.writable_hooks: list[Callable[[str], None]] = []
        self._secret = bytes(secret)
        self.host = host
        self.port = port
        self.on_message = on_message
        self.on_request = on_request
        self.on_peer_up = on_peer_up
        self.on_peer_down = on_peer_down
        self.heartbeat_s = heartbeat_s
        self.peer_timeout_s = peer_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.write_buffer_high_bytes = write_buffer_high_bytes
        self.max_buffered_bytes = max_buffered_bytes if max_buffered_bytes is not None else 2 * max_frame_bytes
        if (ssl_server is None) != (ssl_client is None):
            raise ValueError("TLS between nodes needs both an acceptor and a dialler context")
        self.ssl_server = ssl_server  # TLS on the listener and on every dial (runtime/tls.py)
        self.ssl_client = ssl_client
        self.paired = paired  # the worker link: adopted socket pairs (module docstring)
        # a node of workers in a multi-node cluster: the worker link to its own workers and the network
        # (listener, dials, handshake) to every other node's; `is_sibling(name)` says which is which
        self.network = not paired if network is None else network
        self.is_sibling = is_sibling
        self.answers_as = answers_as  # Handshake's: a node dialled for `--join` may answer as one of its workers
        self._to_adopt: list[tuple[str, socket.socket]] = []  # adopted before `start`
        self._started = False
        self._loop: asyncio.AbstractEventLoop  # set by start(); nothing touches it before
        self._server: asyncio.Server | None = None
        self._running = False
        self._peers: dict[str, _Peer] = {}
        self._conns: set[_Conn] = set()  # every connection not yet CLOSED
        self._closing: set[_Conn] = set()  # closed with close(): flushing, connection_lost not seen yet
        self._all_closed: asyncio.Future[None] | None = None  # stop() waits on it for `_closing` to empty
        self._blocked: set[str] = set()
        self._delays: dict[str, float] = {}
        self._dirty: list[_Peer] = []
        self._flush_scheduled = False
        self._calls: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self._next_request_id = 1
        self._request_tasks: set[asyncio.Future[Any]] = set()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._ticked_at = 0.0  # the last `_tick` (a gap says this process did not run)
        self._warned: dict[tuple[str, ...], float] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = True
        if self.paired and not self.network:  # no listener: every peer comes through `adopt`
            self._running = True
            self._ticked_at = self._loop.time()
            self._tick_handle = self._loop.call_later(self._tick_s, self._tick)
            log.info("node %r on the worker link (socket pairs, no listener)", self.node_name)
            waiting, self._to_adopt = self._to_adopt, []
            for name, sock in waiting:
                await self._attach(name, sock)
            return
        self._server = await listen.create_server(self._loop, self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._running = True
        self._ticked_at = self._loop.time()
        self._tick_handle = self._loop.call_later(self._tick_s, self._tick)
        for peer in self._peers.values():
            self._maybe_dial(peer)
        waiting, self._to_adopt = self._to_adopt, []
        for name, sock in waiting:  # a worker's own node's workers (paired and network at once)
            await self._attach(name, sock)
        log.info("node %r listening for inter-node connections on %s:%d%s", self.node_name, listen.display_host(self.host), self.port,
                 " (TLS)" if self.ssl_server else "")

    def _closed_after_close(self, conn: _Conn) -> None:
        self._closing.discard(conn)
        done = self._all_closed
        if not self._closing and done is not None and not done.done():
            done.set_result(None)

    async def stop(self) -> None:
        """Close the listener and every connection (peers still up get `on_peer_down`); calls pending
        fail with PeerUnavailable. What was sent before stop() is flushed, for up to a second."""
        if not self._started:  # never started, or stopped already
            return
        self._started = False
        self._running = False
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self._server is not None:
            self._server.close()
        tasks = []
        for peer in self._peers.values():
            if peer.dial_task is not None:
                tasks.append(peer.dial_task)
            self._cancel_dial(peer)
            self._cancel_retry(peer)
        self._flush()  # what callers sent before stop() still goes out
        for conn in list(self._conns):
            self._conn_closed(conn, "node stopping", abort=False)
        for task in self._request_tasks:
            task.cancel()
        self._fail_calls(None, "the transport stopped")
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._closing:  # let close() flush (connection_lost says when), then give up after 1 s
            self._all_closed = self._loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._all_closed), 1.0)
            self._all_closed = None
        for conn in list(self._closing):
            if conn.transport is not None:
                conn.transport.abort()
        self._closing.clear()
        if self._server is not None:  # last: from 3.12 on it waits for every accepted connection to end
            await self._server.wait_closed()
            self._server = None

    # -- peers -----------------------------------------------------------------------------------
    def adopt(self, name: str, sock: socket.socket) -> None:
        """Paired mode: `sock` is this end of a socket pair to peer `name`, made by the supervisor; the
        peer is up as soon as the socket is attached (no handshake), replacing any older connection.
        Before `start`, the socket waits and is attached by `start`; after `stop`, it is closed."""
        if not self.paired:
            raise ValueError("adopt() is for a paired transport (the worker link)")
        if name == self.node_name:
            raise ValueError(f"{name!r} is this node's own name")
        if not self._started:
            self._to_adopt.append((name, sock))
            return
        if not self._running:
            sock.close()
            return
        task = self._loop.create_task(self._attach(name, sock))
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)

    async def _attach(self, name: str, sock: socket.socket) -> None:
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = _Peer(name, "", 0, registered=True)
        conn = _Conn(self, Role.DIALLER, name, f"worker link to {name}")
        conn.adopted = True
        sock.setblocking(False)
        await self._loop.create_unix_connection(lambda: conn, sock=sock)

    def set_peer(self, name: str, host: str, port: int) -> None:
        if name == self.node_name:
            raise ValueError(f"{name!r} is this node's own name")
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = _Peer(name, host, port, registered=True)
        else:
            peer.registered = True
            peer.host, peer.port = host, port
        self._maybe_dial(peer)

    def remove_peer(self, name: str) -> None:
        """Forget `name`: stop dialling it and close the connection to it (it may still dial us)."""
        peer = self._peers.pop(name, None)
        if peer is None:
            return
        peer.registered = False
        self._cancel_dial(peer)
        self._cancel_retry(peer)
        if peer.conn is not None:
            self._conn_closed(peer.conn, "peer removed", abort=False, peer=peer)

    def connected(self, name: str) -> bool:
        peer = self._peers.get(name)
        return peer is not None and peer.conn is not None

    def connected_peers(self) -> list[str]:
        return sorted(name for name, peer in self._peers.items() if peer.conn is not None)

    def peer_address(self, name: str) -> tuple[str, int] | None:
        peer = self._peers.get(name)
        return (peer.host, peer.port) if peer is not None else None

    def writable(self, name: str) -> bool:
        """True while the peer is connected and its connection is below the write-buffer high-water mark."""
        peer = self._peers.get(name)
        return peer is not None and peer.conn is not None and not peer.conn.write_paused

    # -- fault injection -------------------------------------------------------------------------
    def block(self, name: str) -> None:
        """Act as if the network to `name` were cut: close the connection, refuse and stop dialling."""
        self._blocked.add(name)
        peer = self._peers.get(name)
        if peer is None:
            return
        self._cancel_dial(peer)
        self._cancel_retry(peer)
        if peer.conn is not None:
            self._conn_closed(peer.conn, "blocked (fault injection)", abort=True, peer=peer)

    def unblock(self, name: str) -> None:
        self._blocked.discard(name)
        peer = self._peers.get(name)
        if peer is not None:
            peer.backoff_s = BACKOFF_FIRST_S
            self._maybe_dial(peer)

    def set_delay(self, name: str, seconds: float) -> None:
        """Hold every batch to `name` for `seconds` before writing it (order kept; 0 turns it off).
        Heartbeats are not delayed."""
        if seconds > 0:
            self._delays[name] = seconds
        else:
            self._delays.pop(name, None)

    # -- sending ---------------------------------------------------------------------------------
    def send(self, name: str, obj: Any) -> bool:
        """Queue `obj` for `name`; False (dropped) when it is not connected or its buffers are full."""
        entry = pack_message(obj)  # TypeError now, in the caller, for a value msgpack cannot encode
        peer = self._peers.get(name)
        if peer is None or peer.conn is None:
            return False
        return self._enqueue(peer, peer.conn, entry)

    def send_packed(self, name: str, payload: bytes) -> bool:
        """`send` of a value already msgpack-encoded (the cluster's message records are encoded once by
        their codec, `hutch.cluster.messages`); the peer receives the decoded value."""
        peer = self._peers.get(name)
        if peer is None or peer.conn is None:
            return False
        return self._enqueue(peer, peer.conn, pack_message_raw(payload))

    async def call(self, name: str, obj: Any, timeout: float = 5.0) -> Any:
        return await self._call(name, lambda request_id: pack_request(request_id, obj), timeout)

    async def call_packed(self, name: str, payload: bytes, timeout: float = 5.0) -> Any:
        """`call` with a request already msgpack-encoded (see `send_packed`)."""
        return await self._call(name, lambda request_id: pack_request_raw(request_id, payload), timeout)

    async def _call(self, name: str, make_entry: Callable[[int], bytes], timeout: float) -> Any:
        peer = self._peers.get(name)
        if peer is None or peer.conn is None:
            raise PeerUnavailable(f"node {name!r} is not connected")
        request_id = self._next_request_id
        self._next_request_id += 1
        entry = make_entry(request_id)
        if not self._enqueue(peer, peer.conn, entry):
            raise PeerUnavailable(f"node {name!r}: outgoing buffer full")
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._calls[request_id] = (fut, name)
        timer = self._loop.call_later(timeout, self._expire_call, request_id, timeout)
        try:
            return await fut
        finally:
            timer.cancel()
            self._calls.pop(request_id, None)

    def _expire_call(self, request_id: int, timeout: float) -> None:
        item = self._calls.pop(request_id, None)
        if item is not None and not item[0].done():
            item[0].set_exception(TimeoutError(f"no reply from node {item[1]!r} within {timeout} s"))

    def _enqueue(self, peer: _Peer, conn: _Conn, entry: bytes) -> bool:
        size = len(entry)
        if size + BATCH_OVERHEAD_BYTES > conn.send_limit:
            raise ValueError(f"message of {size} bytes exceeds the inter-node frame limit of {conn.send_limit}")
        if peer.out_bytes + size + conn.buffered_bytes() > self.max_buffered_bytes:
            log.debug("dropping a message to node %r: %d bytes already queued", peer.name, peer.out_bytes)
            return False
        peer.out.append(entry)
        peer.out_bytes += size
        if not peer.dirty:
            peer.dirty = True
            self._dirty.append(peer)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        """Write each peer's queue as batch frames: one `writelines` per peer per loop iteration."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for peer in dirty:
            peer.dirty = False
            out = peer.out
            if not out:
                continue
            peer.out = []
            peer.out_bytes = 0
            conn = peer.conn
            if conn is None:
                continue
            parts = batch_parts(out, min(conn.send_limit, BATCH_TARGET_BYTES))
            conn.write_parts(parts, self._delays.get(peer.name, 0.0))

    # -- receiving -------------------------------------------------------------------------------
    def _dispatch_batch(self, conn: _Conn, batch: Any) -> None:
        if type(batch) is not list:
            raise MalformedFrame("a batch frame must hold an array")
        name = conn.peer_name
        assert name is not None
        for entry in batch:
            if conn.state is not ConnState.OPEN:  # a callback blocked or removed the peer: drop the rest
                return
            kind = entry[0]
            if kind == MESSAGE:
                obj = entry[1]
                try:
                    self.on_message(name, obj)
                except Exception:
                    log.exception("on_message failed for a message from node %r", name)
            elif kind == REQUEST:
                self._handle_request(conn, entry[1], entry[2])
            elif kind == REPLY:
                self._complete_call(name, entry[1], entry[2], None)
            elif kind == ERROR:
                self._complete_call(name, entry[1], None, RemoteError(str(entry[3]), str(entry[2])))
            else:
                raise MalformedFrame(f"unknown entry kind {kind!r}")

    def _complete_call(self, name: str, request_id: Any, result: Any, error: Exception | None) -> None:
        item = self._calls.get(request_id)
        if item is None or item[1] != name:
            return  # timed out or cancelled meanwhile
        fut = item[0]
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def _handle_request(self, conn: _Conn, request_id: Any, obj: Any) -> None:
        if type(request_id) is not int:
            raise MalformedFrame("request id must be an integer")
        name = conn.peer_name
        assert name is not None
        handler = self.on_request
        if handler is None:
            self._reply(conn, pack_error(request_id, "NoHandler", f"node {self.node_name!r} takes no requests"))
            return
        try:
            result = handler(name, obj)
        except Exception as exc:
            self._reply(conn, _error_entry(request_id, exc))
            return
        if inspect.isawaitable(result):
            fut = asyncio.ensure_future(result)
            self._request_tasks.add(fut)
            fut.add_done_callback(lambda f: self._request_done(conn, request_id, f))
            return
        self._reply_value(conn, request_id, result)

    def _request_done(self, conn: _Conn, request_id: int, fut: asyncio.Future[Any]) -> None:
        self._request_tasks.discard(fut)
        if conn.state is not ConnState.OPEN:
            if not fut.cancelled():
                fut.exception()  # retrieved, so asyncio does not log "exception never retrieved"
            return
        if fut.cancelled():
            self._reply(conn, pack_error(request_id, "CancelledError", "the request handler was cancelled"))
            return
        exc = fut.exception()
        if exc is not None:
            self._reply(conn, _error_entry(request_id, exc))
        else:
            self._reply_value(conn, request_id, fut.result())

    def _reply_value(self, conn: _Conn, request_id: int, value: Any) -> None:
        try:
            entry = pack_reply(request_id, value)
        except Exception as exc:
            entry = pack_error(request_id, type(exc).__name__, f"the reply cannot be encoded: {exc}"[:MAX_ERROR_CHARS])
        if len(entry) + BATCH_OVERHEAD_BYTES > conn.send_limit:
            entry = pack_error(request_id, "ValueError", f"the reply of {len(entry)} bytes exceeds the frame limit")
        self._reply(conn, entry)

    def _reply(self, conn: _Conn, entry: bytes) -> None:
        # a reply belongs to the connection its request came on; if that one is gone, so is the caller's call
        peer = self._peers.get(conn.peer_name) if conn.peer_name is not None else None
        if peer is not None and peer.conn is conn:
            self._enqueue(peer, conn, entry)

    # -- connections -----------------------------------------------------------------------------
    def _accept(self) -> asyncio.Protocol:
        conn = _Conn(self, Role.ACCEPTOR, None, "?")
        if self.ssl_server is None:
            return conn
        # TLS after the accept (runtime/tls_accept.py): the connection joins the handshake table at once
        return TlsAccept(conn, self.ssl_server, self.peer_timeout_s)

    def _conn_made(self, conn: _Conn) -> None:
        transport = conn.transport
        assert transport is not None
        if conn.role is Role.ACCEPTOR:
            if not self._running:
                conn.state = ConnState.CLOSED
                transport.abort()
                return
            self._make_room(conn.source)
            self._conns.add(conn)
            return
        peer = self._peers.get(conn.peer_name or "")
        if conn.adopted and peer is not None and self._running:
            self._conns.add(conn)
            self._paired_established(peer, conn)
            return
        if peer is None or peer.dialing is not conn or not self._running:  # cancelled while connecting
            conn.state = ConnState.CLOSED
            transport.abort()
            return
        self._conns.add(conn)
        conn.state = ConnState.HANDSHAKE
        conn.write(conn.hs.start())

    def _make_room(self, source: str) -> None:
        """Before a new connection from `source` joins the handshake table: if the source is at its limit,
        or the table is full, evict one connection (see the module docstring: silent ones first)."""
        handshaking = [c for c in self._conns if c.role is Role.ACCEPTOR and c.state is ConnState.HANDSHAKE]
        same = [c for c in handshaking if c.source == source]
        if len(same) >= MAX_HANDSHAKING_PER_SOURCE:
            pool = same
        elif len(handshaking) >= MAX_HANDSHAKING:
            busiest = Counter(c.source for c in handshaking).most_common(1)[0][0]
            pool = [c for c in handshaking if c.source == busiest]
        else:
            return
        victim = min(pool, key=lambda c: (c.hs.peer is not None, c.started))
        self._warn(("evict", victim.source), "inter-node connections from %s in their handshake: %d (limit %d "
                   "per source, %d in all); closing the oldest %s", victim.source, len(pool),
                   MAX_HANDSHAKING_PER_SOURCE, MAX_HANDSHAKING,
                   "silent one" if victim.hs.peer is None else "one")
        self._conn_closed(victim, "evicted from the handshake table", abort=True)

    def _handshake_step(self, conn: _Conn, msg: Any) -> None:
        hs = conn.hs
        try:
            reply = hs.receive(msg)
        except HandshakeFailed as exc:
            self._handshake_failed(conn, exc)
            return
        if conn.role is Role.ACCEPTOR and conn.peer_name is None and hs.peer is not None:
            conn.peer_name = hs.peer.node
            if self._link_only(conn.peer_name):
                self._warn(("sibling", conn.label), "refused inter-node connection from %s: it claims %r, a "
                           "worker of this node (reached over the worker link only)", conn.label, conn.peer_name)
                self._conn_closed(conn, "a worker of this node over the network", abort=True)
                return
            if conn.peer_name in self._blocked:
                log.debug("dropping inter-node connection from %s (node %r): blocked", conn.label, conn.peer_name)
                self._conn_closed(conn, "blocked (fault injection)", abort=True)
                return
        if reply is not None:
            conn.write(reply)
        if hs.state is HandshakeState.VERIFIED:
            self._acceptor_verified(conn)
        elif hs.done:
            self._established(conn)

    def _acceptor_verified(self, conn: _Conn) -> None:
        name = conn.peer_name
        assert name is not None
        peer = self._peers.get(name)
        if peer is not None:
            ours = peer.dialing is not None or (peer.conn is not None and peer.conn.role is Role.DIALLER)
            if ours and self.node_name < name:
                # simultaneous dial: ours wins (lower name); the dialler drops this one quietly
                log.debug("inter-node connection from %s (node %r): ours wins", conn.label, name)
                conn.write(encode_refused(Reason.DUPLICATE, "the lower-named node's connection wins"))
                self._conn_closed(conn, "duplicate", abort=False)
                return
            self._cancel_dial(peer)  # theirs wins; an existing connection is stale and gets replaced
        conn.write(conn.hs.accept())
        self._established(conn)

    def _established(self, conn: _Conn) -> None:
        hello = conn.hs.peer
        name = conn.peer_name
        assert hello is not None and name is not None
        # where it listens, as it says (a wildcard bind address means: where it connects from)
        host = conn.label.rsplit(":", 1)[0] if hello.host in _WILDCARD_HOSTS else hello.host
        peer = self._peers.get(name)
        if peer is None:  # a node joining through us
            peer = self._peers[name] = _Peer(name, host, hello.port, registered=False)
        elif not peer.registered:  # set_peer's address stands; a learned one is refreshed
            peer.host, peer.port = host, hello.port
        if peer.dialing is conn:
            peer.dialing = None
            peer.dial_task = None
        if peer.conn is not None:
            self._conn_closed(peer.conn, "replaced by a newer connection", abort=False, peer=peer)
        self._cancel_retry(peer)
        conn.state = ConnState.OPEN
        conn.decoder.max_frame_bytes = self.max_frame_bytes
        conn.send_limit = min(self.max_frame_bytes, hello.max_frame_bytes)
        peer.conn = conn
        peer.backoff_s = BACKOFF_FIRST_S
        peer.last_failure = ""
        log.info("node %r is up (connection %s %s)", name, conn.direction, conn.label)
        self._notify(self.on_peer_up, name)

    def _paired_established(self, peer: _Peer, conn: _Conn) -> None:
        """An adopted socket is open at once: the supervisor made the pair, so there is nothing to prove."""
        if peer.conn is not None:
            self._conn_closed(peer.conn, "replaced by a newer worker link", abort=False, peer=peer)
        conn.state = ConnState.OPEN
        conn.decoder.max_frame_bytes = self.max_frame_bytes
        conn.send_limit = self.max_frame_bytes
        peer.conn = conn
        log.info("worker %r is up (worker link)", peer.name)
        self._notify(self.on_peer_up, peer.name)

    def _conn_closed(self, conn: _Conn, why: str, *, abort: bool, peer: _Peer | None = None) -> None:
        """Idempotent bookkeeping for a connection that is done, then close its socket."""
        if conn.state is ConnState.CLOSED:
            return
        was_open = conn.state is ConnState.OPEN
        conn.state = ConnState.CLOSED
        self._conns.discard(conn)
        if conn.delay_timer is not None:
            conn.delay_timer.cancel()
            conn.delay_timer = None
        conn.delayed.clear()
        if conn.transport is not None and not conn.transport.is_closing():
            if abort:
                conn.transport.abort()
            else:
                self._closing.add(conn)
                conn.transport.close()
        if peer is None and conn.peer_name is not None:
            peer = self._peers.get(conn.peer_name)
        if peer is None:
            return
        if peer.dialing is conn:
            peer.dialing = None
            log.debug("inter-node connection to node %r at %s closed during the handshake: %s",
                      peer.name, conn.label, why)
            self._schedule_retry(peer)
        elif was_open and peer.conn is conn:
            peer.conn = None
            peer.out = []
            peer.out_bytes = 0
            log.info("node %r is down: %s", peer.name, why)
            self._fail_calls(peer.name, f"node {peer.name!r} went down: {why}")
            self._notify(self.on_peer_down, peer.name)
            peer.backoff_s = BACKOFF_FIRST_S
            self._schedule_retry(peer)

    def _fail_calls(self, name: str | None, why: str) -> None:
        for request_id, (fut, peer_name) in list(self._calls.items()):
            if (name is None or peer_name == name) and not fut.done():
                fut.set_exception(PeerUnavailable(why))
                del self._calls[request_id]

    # -- failures and their log lines ------------------------------------------------------------
    def _handshake_failed(self, conn: _Conn, exc: HandshakeFailed) -> None:
        if exc.reply is not None:
            conn.write(exc.reply)
        claimed = conn.hs.peer.node if conn.hs.peer is not None else (conn.peer_name or "?")
        # an acceptor sees a new source port on every retry: the rate-limit key uses the host only
        where = conn.label if conn.role is Role.DIALLER else conn.label.rsplit(":", 1)[0]
        if exc.reason is Reason.DUPLICATE:
            log.debug("node %r at %s keeps its own connection to us", claimed, conn.label)
        elif exc.by_peer and exc.reason is Reason.SECRET:
            self._warn(("secret", where, claimed), "node %r at %s refused our cluster secret",
                       claimed, conn.label)
        elif exc.by_peer:
            self._warn(("refused", where, claimed, exc.reason.value),
                       "node %r at %s refused the inter-node connection: %s%s", claimed, conn.label,
                       REASON_TEXT[exc.reason], f" ({exc})" if str(exc) else "")
        else:
            why = REASON_TEXT[exc.reason] if exc.reason in (Reason.SECRET, Reason.NAME_CLASH) else str(exc)
            self._warn(("refusing", conn.direction, where, claimed, exc.reason.value),
                       "refused inter-node connection %s %s (claims node %r): %s", conn.direction, conn.label,
                       claimed, why)
        self._conn_closed(conn, f"handshake failed: {exc.reason.value}", abort=False)

    def _bad_input(self, conn: _Conn, exc: Exception) -> None:
        what = str(exc) if isinstance(exc, WireError) else f"malformed batch ({type(exc).__name__}: {exc})"
        node = f" (node {conn.peer_name!r})" if conn.peer_name else ""
        log.warning("closing inter-node connection %s %s%s: %s", conn.direction, conn.label, node, what)
        self._conn_closed(conn, f"bad frame: {what}", abort=True)

    def _warn(self, key: tuple[str, ...], msg: str, *args: Any) -> None:
        """WARNING the first time, DEBUG for the same event again within WARN_REPEAT_S (a node with the
        wrong secret retries every second, forever)."""
        now = self._loop.time()
        last = self._warned.get(key)
        if last is not None and now - last < WARN_REPEAT_S:
            log.debug(msg, *args)
            return
        if len(self._warned) > 1000:
            self._warned.clear()
        self._warned[key] = now
        log.warning(msg, *args)

    def _notify(self, callback: Callable[[str], None] | None, name: str) -> None:
        if callback is None:
            return
        try:
            callback(name)
        except Exception:
            log.exception("inter-node peer callback %r failed for node %r", callback, name)

    # -- dialling --------------------------------------------------------------------------------
    def _link_only(self, name: str) -> bool:
        """Whether `name` is reached over the worker link alone (never dialled, never accepted): every
        peer of a paired transport without the network, and a worker of this node when both."""
        if not self.paired:
            return False
        return not self.network or (self.is_sibling is not None and self.is_sibling(name))

    def _maybe_dial(self, peer: _Peer) -> None:
        if (self._link_only(peer.name) or not self._running or not peer.registered or peer.name in self._blocked
                or peer.conn is not None or peer.dialing is not None or peer.retry is not None):
            return
        conn = _Conn(self, Role.DIALLER, peer.name, f"{peer.host}:{peer.port}")
        peer.dialing = conn
        peer.dial_task = self._loop.create_task(self._dial(peer, conn))

    async def _dial(self, peer: _Peer, conn: _Conn) -> None:
        try:
            tls: dict[str, Any] = ({"ssl": self.ssl_client, "ssl_handshake_timeout": self.peer_timeout_s}
                                   if self.ssl_client else {})
            await asyncio.wait_for(self._loop.create_connection(lambda: conn, peer.host, peer.port, **tls),
                                   timeout=self.peer_timeout_s)
        except (TimeoutError, OSError) as exc:
            if isinstance(exc, ssl.SSLError) and peer.dialing is conn:  # e.g. its certificate is from another CA
                self._warn(("tls", peer.name, str(exc.reason)), "TLS handshake with node %r at %s failed: %s",
                           peer.name, conn.label, exc)
            if peer.dial_task is asyncio.current_task():
                peer.dial_task = None
            if peer.dialing is conn:
                peer.dialing = None
                failure = f"cannot reach node {peer.name!r} at {conn.label}: {exc or 'timed out'}"
                level = logging.DEBUG if failure == peer.last_failure else logging.INFO
                peer.last_failure = failure
                log.log(level, "%s; retrying", failure)
                self._schedule_retry(peer)
            return
        if peer.dial_task is asyncio.current_task():
            peer.dial_task = None

    def _cancel_dial(self, peer: _Peer) -> None:
        conn, peer.dialing = peer.dialing, None
        task, peer.dial_task = peer.dial_task, None
        if conn is not None:
            self._conn_closed(conn, "dial cancelled", abort=True, peer=peer)
        if task is not None and not task.done():
            task.cancel()

    def _schedule_retry(self, peer: _Peer) -> None:
        if (self._link_only(peer.name) or not self._running or not peer.registered or peer.name in self._blocked
                or peer.conn is not None or peer.dialing is not None or peer.retry is not None
                or self._peers.get(peer.name) is not peer):
            return
        delay = peer.backoff_s * random.uniform(0.5, 1.0)
        peer.backoff_s = min(peer.backoff_s * 2, BACKOFF_MAX_S)
        peer.retry = self._loop.call_later(delay, self._retry, peer)

    def _retry(self, peer: _Peer) -> None:
        peer.retry = None
        self._maybe_dial(peer)

    @staticmethod
    def _cancel_retry(peer: _Peer) -> None:
        if peer.retry is not None:
            peer.retry.cancel()
            peer.retry = None

    # -- liveness --------------------------------------------------------------------------------
    @property
    def _tick_s(self) -> float:
        return max(0.005, self.heartbeat_s / 2)

    def _tick(self) -> None:
        now = self._loop.time()
        # this process did not run for a while (the whole node stopped with SIGSTOP and continued, or
        # starved): an adopted socket's silence is then ours, not its peer's, and the worker link, which
        # only the supervisor can reopen, must outlive the pause (a peer that is hung alone is still seen)
        stalled = now - self._ticked_at > self.peer_timeout_s / 2
        self._ticked_at = now
        for conn in list(self._conns):
            if conn.state is ConnState.OPEN:
                if stalled and conn.adopted:
                    conn.last_rx = max(conn.last_rx, now)
                # a restarted worker attaches its end of an adopted pair only once it has booted: its
                # silence counts from its first frame (a worker that dies meanwhile closes the socket)
                if now - conn.last_rx > self.peer_timeout_s and (conn.heard or not conn.adopted):
                    log.warning("node %r silent for %.1f s (peer_timeout_s %.1f); closing its connection",
                                conn.peer_name, now - conn.last_rx, self.peer_timeout_s)
                    self._conn_closed(conn, "heartbeat timeout", abort=True)
                elif now - conn.last_tx >= self.heartbeat_s:
                    conn.write(HEARTBEAT_FRAME)
            elif conn.state is ConnState.HANDSHAKE and now - conn.started > self.peer_timeout_s:
                log.info("closing inter-node connection %s %s: handshake not done within %.1f s",
                         conn.direction, conn.label, self.peer_timeout_s)
                self._conn_closed(conn, "handshake timeout", abort=True)
        self._tick_handle = self._loop.call_later(self._tick_s, self._tick)
