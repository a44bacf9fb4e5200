"""A small synchronous stream-protocol client for the Spark connector (read tasks, the driver's probes,
the idempotent sink).

Owns: `StreamClient` - one TCP (or TLS) connection speaking RabbitMQ's stream protocol through the pure
codec in `hutch.streamproto` - and `StreamClientError`. It does what the connector needs and nothing
else: the handshake (peer properties, SASL PLAIN, tune, open), `partitions` of a super stream (and
creating one, for the benchmark), subscriptions with credit (`subscribe`, `read_chunks`: chunks as
stored; `read_range`: the chunks that hold an offset range), the driver's probes built on them (the
stream's first chunk, its exact end `committed_end`, the chunk at a timestamp), where a stream lives
(`placement`: its leader's and replicas' advertised host and stream port from the `metadata` command;
`advertised`: this connection's node as its open response names it), declaring a publisher
with a reference (the broker's deduplication key), pipelined publishes with confirms, and the close
handshake.

Why our own and not rstream: rstream is asyncio; a Spark task is a plain blocking Python call, and an
event loop per task (or a loop thread per executor) buys nothing for one publisher per task. The codec
is hutch's own (`hutch.streamproto`), so the client is ~250 lines of socket handling (docs/spark.md,
"Why a small client of our own").

Rules:
- One thread: the caller's. Reads happen only inside calls (`_rpc`, `wait_confirms`); every wait has
  a deadline (`timeout_s`), and a broken connection fails the call with `StreamClientError`.
- Heartbeats: the client answers a broker heartbeat with its own; a task that publishes keeps the
  connection busy, and one that waits for confirms reads (and so answers) all the time.
- Bounded: a frame sent is at most the negotiated frame_max (a message that cannot fit in one is
  refused before anything is sent); a frame received at most `MAX_DELIVER_BYTES` (a chunk is delivered
  whole, and the broker cuts chunks by entry count, not by frame_max); unconfirmed publishing ids are at
  most what the caller lets accumulate (it calls `wait_confirms` with its bound); chunks queued for a
  subscription at most the credit it granted (a chunk beyond it is a protocol error).
- Reuse: a client returns to a pool (spark/pool.py) only between operations: no subscription open
  (`unsubscribe` reads up to its response, so no chunk of it can come later) and no publisher declared.
"""

from __future__ import annotations

import itertools
import select
import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hutch.amqp.uri import AmqpUri
from hutch.queues.stream.chunk import USER, Header, decode_header
from hutch.streamproto import commands as c
from hutch.streamproto.codes import DEFAULT_FRAME_MAX, INITIAL_FRAME_MAX, Code, OffsetType
from hutch.streamproto.errors import FrameError
from hutch.streamproto.framer import FrameReader
from hutch.streamproto.wire import OffsetSpec

from .tlssock import TlsSocket

RECV_BYTES = 262_144
PUBLISH_FRAME_OVERHEAD = 4 + 4 + 1 + 4  # size, key + version, publisher id, count
ENTRY_OVERHEAD = 8 + 4  # publishing id, size
MAX_DELIVER_BYTES = 128 * 1024 * 1024  # the largest chunk (delivered whole, in one frame) a client takes
MAX_CREDIT = 64  # chunks a subscription may have in flight
CLIENT_PROPERTIES = {"product": "hutch-spark", "information": "hutch's PySpark data source"}


@dataclass(frozen=True)
class Placement:
    """A stream's leader and replicas as the `metadata` command answers them: advertised (host, port)."""

    leader: tuple[str, int] | None
    replicas: list[tuple[str, int]]

    def members(self) -> list[tuple[str, int]]:
        return ([self.leader] if self.leader is not None else []) + self.replicas


class StreamClientError(Exception):
    """The connection or a command failed; `code` is the stream protocol's response code (0 for socket
    errors and timeouts)."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


def code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


class StreamClient:
    """One stream-protocol connection. `connect()`, then the operations, then `close()`."""

    def __init__(self, uri: AmqpUri, connection_name: str = "hutch-spark", timeout_s: float = 60.0) -> None:
        self.uri = uri  # host, port (the stream port), credentials, vhost and TLS settings
        self.connection_name = connection_name
        self.timeout_s = timeout_s
        self.frame_max = INITIAL_FRAME_MAX
        self._sock: socket.socket | TlsSocket | None = None
        self._reader = FrameReader(DEFAULT_FRAME_MAX)
        self._corr = itertools.count(1)
        self._tune: c.Tune | None = None
        self._waiting: tuple[int, int] = (0, 0)  # (request key, correlation id) of the RPC in progress
        self._reply: c.Command | None = None
        # the open subscription: its id, the chunks delivered and not yet taken, the credit outstanding
        self._sub_ids = itertools.cycle(range(256))
        self._sub: int | None = None
        self._chunks: deque[bytes] = deque()
        self._credit = 0
        # publisher id -> publishing ids sent and not yet confirmed; errors (id, code) per publisher
        self.unconfirmed: dict[int, set[int]] = {}
        self.errors: dict[int, list[tuple[int, int]]] = {}
        self.advertised: tuple[str, int] | None = None  # this node's (host, port), from the open response
        self.where = f"{'rabbitmq-stream+tls' if uri.tls else 'rabbitmq-stream'}://{uri.username}@" \
                     f"{uri.host}:{uri.port}"

    # -- connecting ------------------------------------------------------------------------------

    def connect(self) -> StreamClient:
        try:
            raw = socket.create_connection((self.uri.host, self.uri.port), timeout=self.uri.connect_timeout_s)
        except OSError as exc:
            raise StreamClientError(f"cannot connect to {self.where}: {exc.strerror or exc} (is the stream "
                                    "protocol listener on? option 'streamPort')") from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.settimeout(self.timeout_s)
        try:
            if self.uri.tls:
                ctx = self.uri.ssl_context()
                assert ctx is not None
                self._sock = TlsSocket.connect(raw, ctx, self.uri.tls_server_name)
            else:
                self._sock = raw
            self._handshake()
        except StreamClientError:
            raw.close()
            raise
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; a bad TLS file a ValueError
            raw.close()
            raise StreamClientError(f"handshake with {self.where} failed: {exc}") from None
        return self

    def _handshake(self) -> None:
        self._rpc(c.PeerProperties(self._next(), dict(CLIENT_PROPERTIES, connection_name=self.connection_name)))
        mechanisms = self._rpc(c.SaslHandshake(self._next()))
        assert isinstance(mechanisms, c.SaslHandshakeResponse)
        if "PLAIN" not in mechanisms.mechanisms:
            raise StreamClientError(f"{self.where} does not offer PLAIN authentication ({mechanisms.mechanisms})")
        secret = b"\0" + self.uri.username.encode() + b"\0" + self.uri.password.encode()
        self._rpc(c.SaslAuthenticate(self._next(), "PLAIN", secret))
        deadline = time.monotonic() + self.timeout_s
        while self._tune is None:
            self._read_some(deadline)
        frame_max = self._tune.frame_max or DEFAULT_FRAME_MAX
        self._send(c.encode(c.TuneResponse(frame_max, self._tune.heartbeat_s)))
        self.frame_max = frame_max
        self._reader.frame_max = max(frame_max, MAX_DELIVER_BYTES)
        opened = self._rpc(c.Open(self._next(), self.uri.vhost))
        assert isinstance(opened, c.OpenResponse)
        host, port = opened.properties.get("advertised_host"), opened.properties.get("advertised_port", "")
        self.advertised = (host, int(port)) if host and port.isdigit() else None

    # -- commands --------------------------------------------------------------------------------

    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of a super stream, in partition order."""
        reply = self._rpc(c.Partitions(self._next(), super_stream))
        assert isinstance(reply, c.PartitionsResponse)
        return list(reply.streams)

    def placement(self, streams: list[str]) -> dict[str, Placement]:
        """Where each of `streams` lives, from the protocol's `metadata` command: its leader (the node that
        writes it) and its replicas, each as the advertised (host, stream port). A stream the broker
        answers with an error code (missing, access refused) is left out; a leader the broker names
        without an address (during an election) is None."""
        reply = self._rpc(c.Metadata(self._next(), list(streams)))
        assert isinstance(reply, c.MetadataResponse)
        brokers = {ref: (host, port) for ref, host, port in reply.brokers}
        out: dict[str, Placement] = {}
        for stream, code, leader, replicas in reply.streams:
            if code == Code.OK:
                out[stream] = Placement(brokers.get(leader), [brokers[r] for r in replicas if r in brokers])
        return out

    def create_super_stream(self, name: str, partitions: list[str], binding_keys: list[str],
                            arguments: dict[str, str] | None = None) -> None:
        """Create a super stream and its partition streams (the benchmark's and examples' set-up)."""
        self._rpc(c.CreateSuperStream(self._next(), name, partitions, binding_keys, arguments or {}))

    def stats(self, stream: str) -> dict[str, int]:
        reply = self._rpc(c.StreamStats(self._next(), stream))
        assert isinstance(reply, c.StreamStatsResponse)
        return dict(reply.stats)

    def first_chunk(self, stream: str, spec: OffsetSpec, wait_s: float) -> Header | None:
        """The header of the first chunk a subscription at `spec` gets within `wait_s` (None: none came)."""
        self.subscribe(stream, spec, 1)
        try:
            return next(self.read_chunks(wait_s, none_after_s=wait_s), None)
        finally:
            self.unsubscribe()

    def committed_end(self, stream: str, wait_s: float) -> int | None:
        """One past the last record of the stream's last committed user chunk: where a reader that started
        now finds the end (None: the stream holds no committed chunk). Exact: the stream's stats say
        whether it has a committed chunk, and a one-credit subscription at `last` (osiris's last user
        chunk) delivers that chunk whole, its header giving its first offset and record count. Raises
        StreamClientError when no chunk comes within `wait_s` (a stream of tracking chunks only)."""
        if self.stats(stream).get("committed_chunk_id", -1) < 0:
            return None
        header = self.first_chunk(stream, OffsetSpec(OffsetType.LAST), wait_s)
        if header is None:
            raise StreamClientError(f"{self.where}: no chunk of stream {stream!r} within {wait_s:g} s")
        return header.next_offset

    def first_offset(self, stream: str, wait_s: float) -> int | None:
        """The offset of the stream's first message (None: no message): the first record of its first user
        chunk (tracking chunks are never delivered)."""
        if self.stats(stream).get("committed_chunk_id", -1) < 0:
            return None
        header = self.first_chunk(stream, OffsetSpec(OffsetType.FIRST), wait_s)
        return None if header is None else header.chunk_id

    def offset_at(self, stream: str, timestamp_ms: int, wait_s: float) -> int | None:
        """The offset of the first message of the first chunk written at or after `timestamp_ms` (None:
        none within `wait_s`)."""
        header = self.first_chunk(stream, OffsetSpec(OffsetType.TIMESTAMP, timestamp_ms), wait_s)
        return None if header is None else header.chunk_id

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, stream: str, spec: OffsetSpec, credit: int) -> None:
        """Open the client's one subscription at `spec` with `credit` chunks (1..MAX_CREDIT)."""
        assert self._sub is None, "one subscription at a time"
        assert 0 < credit <= MAX_CREDIT
        sub = next(self._sub_ids)
        self._chunks.clear()
        self._sub, self._credit = sub, credit
        try:
            self._rpc(c.Subscribe(self._next(), sub, stream, spec, credit))
        except StreamClientError:
            self._sub = None
            raise

    def credit(self, n: int) -> None:
        """Grant the subscription `n` more chunks."""
        assert self._sub is not None and n > 0
        self._credit += n
        self._send(c.encode(c.Credit(self._sub, n)))

    def read_chunks(self, wait_s: float, none_after_s: float | None = None) -> Iterator[Header]:
        """The subscription's chunks as they come, each as its header (`last_chunk` holds its bytes until
        the next one). Raises StreamClientError when none comes for `wait_s`; with `none_after_s`, ends
        instead when none came that long. The caller grants credit (`credit`) as it takes chunks."""
        while True:
            if not self._chunks:
                deadline = time.monotonic() + (wait_s if none_after_s is None else none_after_s)
                try:
                    while not self._chunks:
                        self._read_some(deadline, quiet=True)
                except _NothingCame:
                    if none_after_s is not None:
                        return
                    raise StreamClientError(f"{self.where}: no chunk for {wait_s:g} s") from None
            raw = self.last_chunk = self._chunks.popleft()
            try:
                header = decode_header(raw)
            except ValueError as exc:
                raise StreamClientError(f"{self.where}: bad chunk from the broker: {exc}") from None
            if header.chunk_type != USER:
                continue
            yield header

    last_chunk: bytes = b""

    def read_range(self, stream: str, start: int, end: int, credit: int, wait_s: float) -> Iterator[Header]:
        """The user chunks holding offsets [start, end) of `stream`, in order (`last_chunk`: the bytes of
        the one just yielded): a subscription at offset `start` that grants a chunk of credit for each
        chunk taken until one reaches `end`, then unsubscribes. The first chunk may begin after `start`
        (retention removed offsets, or they held no message): the caller decides what that means. Raises
        StreamClientError when no chunk comes for `wait_s` while the range is unfinished."""
        self.subscribe(stream, OffsetSpec(OffsetType.OFFSET, start), credit)
        done = False
        for header in self.read_chunks(wait_s):
            if header.next_offset < end:
                self.credit(1)
            else:
                done = True
            yield header
            if done:
                break
        self.unsubscribe()

    def unsubscribe(self) -> None:
        """Close the subscription: chunks it still had in flight are read (and dropped) on the way to the
        response, so none of them can reach a later subscription."""
        sub = self._sub
        if sub is None:
            return
        self._rpc(c.Unsubscribe(self._next(), sub))
        self._sub = None
        self._chunks.clear()
        self.last_chunk = b""

    def in_use(self) -> bool:
        """A subscription or a publisher is open (the client cannot go back to a pool as it is)."""
        return self._sub is not None or bool(self.unconfirmed)

    def alive(self) -> bool:
        """The connection still works: whatever the broker sent while it sat idle (heartbeats) is handled,
        and a closed or broken socket says no."""
        sock = self._sock
        if sock is None:
            return False
        try:
            while True:
                ready, _, _ = select.select([sock], [], [], 0)
                if not ready:
                    return True
                self._read_some(time.monotonic() + 1.0)
        except (StreamClientError, OSError, ValueError):
            return False

    def declare_publisher(self, publisher_id: int, reference: str, stream: str) -> None:
        self._rpc(c.DeclarePublisher(self._next(), publisher_id, reference, stream))
        self.unconfirmed[publisher_id] = set()
        self.errors[publisher_id] = []

    def query_publisher_sequence(self, reference: str, stream: str) -> int:
        reply = self._rpc(c.QueryPublisherSequence(self._next(), reference, stream))
        assert isinstance(reply, c.QueryPublisherSequenceResponse)
        return int(reply.sequence)

    def max_message_bytes(self) -> int:
        """The largest encoded message a one-message publish frame can carry."""
        return self.frame_max - PUBLISH_FRAME_OVERHEAD - ENTRY_OVERHEAD

    def publish(self, publisher_id: int, entries: Iterable[tuple[int, bytes]]) -> None:
        """Send (publishing id, encoded message) entries, as few frames of at most frame_max as fit."""
        pending = self.unconfirmed[publisher_id]
        batch: list[c.PublishedEntry | c.SubBatchEntry] = []
        size = PUBLISH_FRAME_OVERHEAD
        frames: list[bytes] = []
        limit = self.frame_max
        for pid, message in entries:
            need = ENTRY_OVERHEAD + len(message)
            if need + PUBLISH_FRAME_OVERHEAD > limit:
                raise StreamClientError(f"a message of {len(message)} bytes does not fit in a frame of "
                                        f"{limit} bytes (the broker's stream frame_max)")
            if size + need > limit:
                frames.append(c.encode(c.Publish(publisher_id, batch)))
                batch, size = [], PUBLISH_FRAME_OVERHEAD
            batch.append(c.PublishedEntry(pid, message))
            size += need
            pending.add(pid)
        if batch:
            frames.append(c.encode(c.Publish(publisher_id, batch)))
        if frames:
            self._send(b"".join(frames))

    def pending(self) -> int:
        """Publishing ids sent and not yet confirmed (or refused), over every publisher."""
        return sum(len(ids) for ids in self.unconfirmed.values())

    def wait_confirms(self, at_most: int) -> None:
        """Read until at most `at_most` publishing ids are unconfirmed. Raises StreamClientError on a
        timeout (no frame for timeout_s) or a broken connection."""
        while self.pending() > at_most:
            self._read_some(time.monotonic() + self.timeout_s)

    def delete_publisher(self, publisher_id: int) -> None:
        self._rpc(c.DeletePublisher(self._next(), publisher_id))
        self.unconfirmed.pop(publisher_id, None)
        self.errors.pop(publisher_id, None)

    def close(self) -> None:
        """The close handshake when the connection is healthy; the socket is closed in any case."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            self._sock = sock
            self._rpc(c.Close(self._next(), Code.OK, "OK"), timeout_s=min(self.timeout_s, 5.0))
        except (StreamClientError, OSError):
            pass
        finally:
            self._sock = None
            sock.close()

    # -- IO --------------------------------------------------------------------------------------

    def _next(self) -> int:
        return next(self._corr)

    def _send(self, data: bytes) -> None:
        if self._sock is None:
            raise StreamClientError(f"the connection to {self.where} is closed")
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise StreamClientError(f"{self.where}: sending failed: {exc}") from None

    def _rpc(self, cmd: c.Command, timeout_s: float | None = None) -> c.Command:
        """Send a request and read until its response; a response code other than OK raises."""
        corr = getattr(cmd, "correlation_id")  # noqa: B009 - every request sent here has one
        self._waiting = (c.request_key(cmd), corr)
        self._reply = None
        self._send(c.encode(cmd))
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while self._reply is None:
            self._read_some(deadline)
        reply = self._reply
        code = getattr(reply, "code", Code.OK)
        if code != Code.OK:
            raise StreamClientError(f"{self.where}: {type(cmd).__name__} failed: {code_name(code)}", code)
        return reply

    def _read_some(self, deadline: float, quiet: bool = False) -> None:
        """Read what the socket has (waiting until `deadline` for something) and handle every frame. Nothing
        by the deadline: StreamClientError, or `_NothingCame` when `quiet` (the caller words it)."""
        sock = self._sock
        if sock is None:
            raise StreamClientError(f"the connection to {self.where} is closed")
        wait = deadline - time.monotonic()
        try:
            ready, _, _ = select.select([sock], [], [], max(wait, 0))
            if not ready:
                if quiet:
                    raise _NothingCame()
                raise StreamClientError(f"{self.where}: no answer from the broker within {self.timeout_s:.0f} s")
            data = sock.recv(RECV_BYTES)
        except OSError as exc:
            raise StreamClientError(f"{self.where}: the connection failed: {exc}") from None
        if not data:
            raise StreamClientError(f"{self.where} closed the connection")
        self._reader.feed(data)
        try:
            for frame in self._reader.frames():
                self._handle(c.decode(frame))
        except FrameError as exc:
            raise StreamClientError(f"{self.where}: bad frame from the broker: {exc}") from None

    def _handle(self, cmd: c.Command) -> None:
        if isinstance(cmd, c.PublishConfirm):
            pending = self.unconfirmed.get(cmd.publisher_id)
            if pending is not None:
                pending.difference_update(cmd.publishing_ids)
        elif isinstance(cmd, c.PublishError):
            pending = self.unconfirmed.get(cmd.publisher_id)
            if pending is not None:
                pending.difference_update(pid for pid, _ in cmd.errors)
            self.errors.setdefault(cmd.publisher_id, []).extend(cmd.errors)
        elif isinstance(cmd, c.Deliver):
            if cmd.subscription_id == self._sub:
                if self._credit <= 0:
                    raise StreamClientError(f"{self.where} delivered a chunk without credit")
                self._credit -= 1
                self._chunks.append(cmd.chunk)
        elif isinstance(cmd, c.Heartbeat):
            self._send(c.encode(c.Heartbeat()))
        elif isinstance(cmd, c.Tune):
            self._tune = cmd
        elif isinstance(cmd, c.Close):
            self._send(c.encode(c.Response(c.request_key(cmd), cmd.correlation_id)))
            raise StreamClientError(f"{self.where} closed the connection: {code_name(cmd.closing_code)} "
                                    f"{cmd.reason}", cmd.closing_code)
        elif isinstance(cmd, c.MetadataUpdate):
            raise StreamClientError(f"{self.where}: stream {cmd.stream!r} is no longer available "
                                    f"({code_name(cmd.code)})", cmd.code)
        elif (c.request_key(cmd), getattr(cmd, "correlation_id", None)) == self._waiting:
            self._reply = cmd


class _NothingCame(Exception):
    """`_read_some(quiet=True)`: nothing arrived by the deadline."""


__all__ = ["MAX_CREDIT", "Placement", "StreamClient", "StreamClientError"]
