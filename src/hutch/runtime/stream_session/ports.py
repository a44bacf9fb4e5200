"""The ports of the stream-protocol session: what a stream connection asks of the node's streams.

Owns the `Protocol`s `StreamHandover` (moving a connection to its stream's home worker), `StreamTransport` (the session's `Transport` with `writelines`: a delivery's
chunk goes out as parts, not joined; an asyncio transport has it), `StreamCatalog`, to find the running `StreamHandle` of a stream by vhost and
name, create one, delete one (catalog.QueueCatalog implements it over the stream queue type: a stream is
a queue of type stream, seen by AMQP 0-9-1 and management too); and `StreamSession`, what a
connection's publishing and consuming halves (publishing.py, consuming.py) ask of the connection that
holds them. The session never imports the queue type, only these shapes and the handle's own API
(runtime/queue_types/stream/handle.py, the seam of issue 23).

Errors `create` raises: `StreamExists` (response STREAM_ALREADY_EXISTS) and `StreamRefused` with the
response code and text (PRECONDITION_FAILED for bad arguments, ACCESS_REFUSED for a reserved name).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hutch.core.auth import PermissionKind
from hutch.core.vhost import VirtualHost
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.session.ports import LoopClock, Transport
from hutch.streamproto.codes import Code
from hutch.streamproto.commands import Command


class StreamTransport(Transport, Protocol):
    """Where a stream connection writes: `write`, and `writelines` for parts written without a join."""

    def writelines(self, parts: list[bytes | memoryview]) -> None: ...


class StreamHandover(Protocol):
    """Moving a stream connection to its stream's home worker (a node of workers, `workers.locality`;
    runtime/workers/handover.py's `Locality`). `worker_of` is the index of worker `name` of this node when
    it is another worker that can take a connection now (None: this worker, another node, or a worker that
    is down); `move` hands the connection's socket (duplicated: the caller then drops its transport without
    closing the TCP connection) and its encoded state to worker `to`; False when it could not be sent.
    `relay` hands over a TLS connection: its TLS session (`transport`) stays in this worker, which pumps
    the plaintext to worker `to` (the relay owns `transport` once it returns True)."""

    def worker_of(self, name: str) -> int | None: ...

    def move(self, sock: Any, state: bytes, to: int) -> bool: ...

    def relay(self, transport: Any, state: bytes, to: int) -> bool: ...


class StreamExists(Exception):
    pass


class StreamRefused(Exception):
    def __init__(self, code: Code, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


# a replicated stream's members as the metadata command answers them: (this node, the writer's node or None
# while one is elected, [(member node, (host, port) of its stream listener or None if not known yet)])
Members = tuple[str, str | None, list[tuple[str, tuple[str, int] | None]]]


class StreamForwarder(Protocol):
    """A replicated stream's way to its writer (the stream queue's replication route): where this node
    does not write the stream, a publisher's entries go to the writer's node."""

    def writes_here(self) -> bool: ...

    async def publish(self, data: bytes, ids: list[int], reference: bytes,
                      filters: list[bytes | None] | None) -> None:
        """Write `data` (a chunk's data section, one publishing id per entry; deduplicated with a
        `reference`) through the writer; returns once a majority has it, raises if it may not have."""
        ...

    def store_offset(self, reference: bytes, offset: int) -> bool:
        """Store a consumer's offset through the writer (no answer; False: not sent)."""
        ...


class StreamLocator(Protocol):
    """How a node that is not a member of a replicated stream reaches its members (the replication
    service, runtime/queue_types/stream_replication/service.py)."""

    def endpoint_of(self, node: str) -> tuple[str, int] | None:
        """Where `node`'s stream listener is (None: not known yet)."""
        ...

    async def lookup(self, gid: int, members: Sequence[str], what: str, reference: bytes = b"") -> Any:
        """"writer", "offset" or "sequence" of stream group `gid` as a member answers it (None: none did)."""
        ...


class ClusterLink(Protocol):
    """What the stream session needs of the node's cluster service (runtime/clustering/service.py): its
    name, records to a peer, handlers of records from peers, and whether a peer is connected."""

    name: str

    def send(self, peer: str, record: Any) -> bool: ...

    def register(self, kind: type[Any], handler: Callable[[str, Any], Any]) -> None: ...

    def connected(self, peer: str) -> bool: ...


class StreamCatalog(Protocol):
    def lookup(self, vhost: str, name: str) -> StreamHandle | None:
        """The open handle of stream `name` in `vhost`, None if there is no such stream."""
        ...

    def members(self, vhost: str, name: str) -> Members | None:
        """A replicated stream's members (None: a stream of this node only)."""
        ...

    def is_stream(self, vhost: str, name: str) -> bool:
        """Is there a stream of that name (open or not)?"""
        ...

    def forwarder(self, vhost: str, name: str) -> StreamForwarder | None:
        """A replicated stream's way to its writer (None: a stream of this node only)."""
        ...

    def elsewhere(self, vhost: str, name: str) -> bool:
        """Is `name` a replicated stream this node is not a member of (answered by `locate` and `ask`)?"""
        ...

    def home(self, vhost: str, name: str) -> str | None:
        """The worker of this node holding the stream's one copy on the node, when this worker holds none
        (None: this worker holds it, or no worker of this node does)."""
        ...

    async def locate(self, vhost: str, name: str) -> Members | None:
        """Such a stream's members as `members` gives them, its writer as a member names it (None: not
        such a stream)."""
        ...

    async def ask(self, vhost: str, name: str, what: str, reference: str) -> Any:
        """Such a stream's stored offset ("offset") or publisher sequence ("sequence") of `reference`, as
        a member answers it; None if none did."""
        ...

    async def create(self, vhost: str, name: str, arguments: dict[str, str]) -> None: ...

    async def delete(self, vhost: str, name: str) -> bool:
        """False if there was no such stream."""
        ...


class StreamSession(Protocol):
    """What publishing.py and consuming.py ask of their connection (connection.StreamConnection)."""

    out: list[bytes | memoryview]
    clock: LoopClock
    name: str  # as management lists it ("127.0.0.1:5xxxx -> 127.0.0.1:5552")
    hub: Any  # the node's StreamHub (hub.py)
    vhost: VirtualHost
    catalog: StreamCatalog

    def send(self, cmd: Command) -> None: ...

    def respond(self, cmd: Any, code: Code) -> None: ...

    def flush(self) -> None: ...

    def want_flush(self) -> None: ...

    def hold_reading(self, reason: str) -> None: ...

    def release_reading(self, reason: str) -> None: ...

    def next_correlation_id(self) -> int: ...

    def bound_append(self, settled: asyncio.Future[None]) -> None:
        """Count an append that sends no confirm (a stored offset) against the connection's bound on
        appends in flight until it settles (publishing.py, `Publishing.bound`)."""
        ...

    def can_deliver(self) -> bool: ...

    def permitted(self, kind: PermissionKind, stream: str) -> bool: ...

    def check_permission(self, kind: PermissionKind, stream: str) -> None: ...

    def stream_handle(self, stream: str) -> StreamHandle: ...

    def advertised(self) -> tuple[str, int]:
        """The host and port this node is known by, to this connection's client."""
        ...
