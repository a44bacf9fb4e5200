"""A small synchronous AMQP 0-9-1 client for the Spark connector, on hutch's sans-I/O codec.

Owns: `AmqpClient` - one TCP connection with one channel (channel 1) - and `ClientClosed`. It does what
the connector needs and nothing else: passive queue.declare, basic.qos + basic.consume with a delivery
buffer, basic.ack / basic.nack, confirm.select + pipelined basic.publish with confirm and basic.return
tracking, heartbeats, and the close handshakes.

Threads and rules:
- The caller's thread does the handshake, then a daemon *reader thread* owns every read of the socket:
  it parses frames (in place, with the `hutch.amqp.spec` codec), assembles deliveries, records confirms and
  returns, answers the RPC the caller waits for, and sends heartbeats. It never calls user code.
- Writes (methods, acks, publishes, heartbeats) go through `_send`, serialised by `_send_lock`.
- Every wait has a deadline. A broken connection (socket error, missed heartbeats, connection.close or
  channel.close from the broker, a consumer cancelled by the broker) is recorded once as `failure`;
  every later call raises it as `ClientClosed` with the broker's reply code and text.
- Delivery tags belong to channel 1 of this connection: only this object can settle them. Closing it
  (or losing it) returns every unacknowledged delivery to its queue with redelivered=true - the
  property the connector's at-least-once guarantee rests on.
- Bounded: deliveries buffered <= the prefetch the caller set; unconfirmed publishes <= the caller's
  bound (it waits in `wait_confirms`); a frame <= the negotiated frame_max.

Why not pika: see docs/spark.md ("Why a small client of our own").
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections import deque
from typing import Any, NamedTuple

from hutch.amqp import spec
from hutch.amqp.errors import AMQPError
from hutch.amqp.frames import HEARTBEAT_FRAME, content_frames, method_frame
from hutch.amqp.spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD

from .options import AmqpUri
from .tlssock import TlsSocket

CHANNEL = 1
PRE_TUNE_FRAME_MAX = 131072
RECV_BYTES = 262144
CLIENT_PROPERTIES = {
    "product": "hutch-spark",
    "information": "hutch's PySpark data source",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
    },
}
_FRAME_HDR = struct.Struct(">BHI")
_BODY_SIZE = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
_DELIVER_INDEX = struct.pack(">HH", 60, 60)


class _Content:
    """A basic.deliver (method = (tag, redelivered, exchange, routing key)) or basic.return (method =
    the decoded method) whose header and body frames are being read. Invariant: size is -1 until the
    header frame arrives; got = sum of the lengths of parts."""

    __slots__ = ("deliver", "got", "method", "parts", "props", "size")

    def __init__(self, deliver: bool, method: Any) -> None:
        self.deliver = deliver
        self.method = method
        self.props = b""
        self.size = -1
        self.parts: list[bytes] = []
        self.got = 0


class ClientClosed(Exception):
    """The connection or its channel is gone (or never came up); `code` is the AMQP reply code, 0 for
    socket errors and timeouts."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


class Delivery(NamedTuple):
    """One basic.deliver with its content. `properties_raw` is the header's flags + property list,
    decoded only when a row is built."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties_raw: bytes
    body: bytes
    received_us: int  # wall clock (microseconds since the epoch) when its bytes were read


class Returned(NamedTuple):
    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str


class AmqpClient:
    """One connection, one channel. Use `connect()`, then the operations, then `close()`."""

    def __init__(self, uri: AmqpUri, connection_name: str = "hutch-spark", send_timeout_s: float = 60.0) -> None:
        self.uri = uri
        self.connection_name = connection_name
        self.send_timeout_s = send_timeout_s  # a write blocked longer (e.g. by a resource alarm) fails
        self.frame_max = PRE_TUNE_FRAME_MAX
        self.heartbeat_s = 0
        self.failure: ClientClosed | None = None
        self.blocked = False
        self._sock: socket.socket | TlsSocket | None = None
        self._pending = b""  # bytes read during the handshake and not yet parsed
        self._send_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closing = False
        self._last_sent = 0.0
        self._last_recv = 0.0
        # Guarded by _cond:
        self._rpc_wanted: tuple[type, ...] = ()
        self._rpc_reply: Any = None
        self._deliveries: deque[Delivery] = deque()
        self._returns: list[Returned] = []
        self._unconfirmed: dict[int, None] = {}  # publish seq -> None, in publish order
        self._nacked = 0
        self._next_publish_seq = 1
        self._consumer_tag: str | None = None
        # Reader-thread state: the delivery or return whose content frames are being read.
        self._content: _Content | None = None

    # -- connecting ------------------------------------------------------------------------------

    def connect(self) -> AmqpClient:
        """Open the socket, do the AMQP handshake, open channel 1, start the reader thread."""
        where = self.uri.display()
        try:
            sock = socket.create_connection((self.uri.host, self.uri.port), timeout=self.uri.connect_timeout_s)
        except OSError as exc:
            raise ClientClosed(f"cannot connect to {where}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = self._start_tls(sock, where) if self.uri.tls else sock
        try:
            self._handshake()
        except ClientClosed:
            sock.close()
            raise
        except (OSError, AMQPError) as exc:
            sock.close()
            text = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            raise ClientClosed(f"AMQP handshake with {where} failed: {text}") from None
        # The reader thread waits in select(); the socket timeout now bounds sendall only.
        sock.settimeout(self.send_timeout_s)
        self._last_recv = self._last_sent = time.monotonic()
        self._thread = threading.Thread(target=self._read_loop, name=f"hutch-amqp-{self.connection_name}",
                                        daemon=True)
        self._thread.start()
        return self

    def _start_tls(self, sock: socket.socket, where: str) -> TlsSocket:
        """amqps: the TLS handshake, verified against the URI's cacertfile (or the system's CAs)."""
        try:
            ctx = self.uri.ssl_context()
            assert ctx is not None
            return TlsSocket.connect(sock, ctx, self.uri.tls_server_name)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; UriError a ValueError
            sock.close()
            raise ClientClosed(f"TLS handshake with {where} failed: {exc}") from None

    def _read_frame_sync(self) -> tuple[int, int, bytes]:
        """The next non-heartbeat frame, reading the socket in the caller's thread (handshake only)."""
        assert self._sock is not None
        while True:
            buf = self._pending
            if len(buf) >= 8:
                ftype, channel, size = _FRAME_HDR.unpack_from(buf, 0)
                if size + 8 > PRE_TUNE_FRAME_MAX:
                    raise ClientClosed(f"frame of {size + 8} bytes during the handshake")
                if len(buf) >= size + 8:
                    if buf[size + 7] != FRAME_END:
                        raise ClientClosed("bad frame end marker during the handshake")
                    self._pending = buf[size + 8:]
                    if ftype != FRAME_HEARTBEAT:
                        return ftype, channel, buf[7:size + 7]
                    continue
            data = self._sock.recv(65536)
            if not data:
                raise ClientClosed(f"{self.uri.display()} closed the connection during the handshake "
                                   "(wrong user/password or vhost?)", 403)
            self._pending = buf + data

    def _expect(self, *kinds: type) -> Any:
        ftype, channel, payload = self._read_frame_sync()
        if ftype != FRAME_METHOD:
            raise ClientClosed(f"unexpected frame type {ftype} during the handshake")
        method = spec.decode_method(payload)
        if isinstance(method, spec.Connection.Close):
            raise ClientClosed(f"{self.uri.display()} refused the connection: {method.reply_code} "
                               f"{method.reply_text}", method.reply_code)
        if isinstance(method, spec.Channel.Close):
            raise ClientClosed(f"{self.uri.display()} closed the channel: {method.reply_code} "
                               f"{method.reply_text}", method.reply_code)
        if not isinstance(method, kinds):
            raise ClientClosed(f"unexpected {method.NAME} during the handshake")
        return method

    def _handshake(self) -> None:
        assert self._sock is not None
        self._sock.sendall(spec.PROTOCOL_HEADER)
        start = self._expect(spec.Connection.Start)
        if b"PLAIN" not in bytes(start.mechanisms).split():
            raise ClientClosed(f"the broker does not offer PLAIN authentication ({start.mechanisms!r})")
        props = dict(CLIENT_PROPERTIES, connection_name=self.connection_name)
        response = b"\0" + self.uri.username.encode() + b"\0" + self.uri.password.encode()
        self._sock.sendall(method_frame(0, spec.Connection.StartOk(
            client_properties=props, mechanism="PLAIN", response=response, locale="en_US")))
        tune = self._expect(spec.Connection.Tune)
        frame_max = tune.frame_max or PRE_TUNE_FRAME_MAX
        if self.uri.frame_max_bytes and self.uri.frame_max_bytes < frame_max:
            frame_max = self.uri.frame_max_bytes
        heartbeat = self.uri.heartbeat_s
        if tune.heartbeat and heartbeat:
            heartbeat = min(heartbeat, tune.heartbeat)
        self.frame_max = frame_max
        self.heartbeat_s = heartbeat
        self._sock.sendall(method_frame(0, spec.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=frame_max, heartbeat=heartbeat))
            + method_frame(0, spec.Connection.Open(virtual_host=self.uri.vhost)))
        self._expect(spec.Connection.OpenOk)
        self._sock.sendall(method_frame(CHANNEL, spec.Channel.Open()))
        self._expect(spec.Channel.OpenOk)

    # -- the reader thread -----------------------------------------------------------------------

    def _read_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        interval = self.heartbeat_s / 2 if self.heartbeat_s else 5.0
        rest, self._pending = self._pending, b""
        try:
            while True:
                readable, _, _ = select.select([sock], [], [], interval)
                now = time.monotonic()
                if readable:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        raise ClientClosed("the broker closed the connection" if not self._closing
                                           else "connection closed", 320 if not self._closing else 200)
                    self._last_recv = now
                    buf = rest + data if rest else data
                    used = self._scan(buf, time.time_ns() // 1000)
                    rest = buf[used:] if used < len(buf) else b""
                if self.heartbeat_s:
                    if now - self._last_recv > 2 * self.heartbeat_s:
                        raise ClientClosed(f"missed heartbeats from {self.uri.display()} for "
                                           f"{2 * self.heartbeat_s} s")
                    if now - self._last_sent >= interval:
                        self._send(HEARTBEAT_FRAME)
        except ClientClosed as exc:
            self._fail(exc)
        except (OSError, ValueError) as exc:  # ValueError: select on a socket closed under us
            self._fail(ClientClosed(f"connection to {self.uri.display()} lost: {exc}"))
        except AMQPError as exc:
            self._fail(ClientClosed(f"protocol error from {self.uri.display()}: {exc}", exc.code))
        finally:
            if sock.fileno() >= 0:
                try:
                    sock.close()
                except OSError:
                    pass

    def _scan(self, buf: bytes, received_us: int) -> int:
        """Handle every complete frame in `buf` (reader thread); return the offset of the first
        incomplete one. basic.deliver is parsed in place and single-frame bodies are sliced once:
        this loop is the connector's hot path (see docs/spark.md, benchmark)."""
        done: list[Delivery] = []
        pos = 0
        n = len(buf)
        frame_max = self.frame_max
        unpack_hdr = _FRAME_HDR.unpack_from
        try:
            while n - pos >= 8:
                ftype, channel, size = unpack_hdr(buf, pos)
                if size + 8 > frame_max:
                    raise ClientClosed(f"frame of {size + 8} bytes exceeds frame_max {frame_max}", 501)
                end = pos + 7 + size
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise ClientClosed(f"bad frame end marker {buf[end]:#x}", 501)
                start = pos + 7
                pos = end + 1
                if ftype == FRAME_METHOD:
                    if buf[start:start + 4] == _DELIVER_INDEX:
                        o = start + 5 + buf[start + 4]  # past the consumer tag
                        tag, bits = _TAG_BITS.unpack_from(buf, o)
                        o += 9
                        k = buf[o]
                        exchange = buf[o + 1:o + 1 + k].decode()
                        o += 1 + k
                        k = buf[o]
                        self._content = _Content(True, (tag, bool(bits & 1), exchange,
                                                        buf[o + 1:o + 1 + k].decode()))
                    else:
                        self._on_method(channel, spec.decode_method(buf[start:end]))
                elif ftype == FRAME_HEADER:
                    content = self._content
                    if content is None or content.size >= 0:
                        raise ClientClosed("content header frame out of order", 505)
                    (content.size,) = _BODY_SIZE.unpack_from(buf, start + 4)
                    content.props = buf[start + 12:end]
                    if content.size == 0:
                        self._content_done(content, b"", received_us, done)
                elif ftype == FRAME_BODY:
                    content = self._content
                    if content is None or content.size < 0:
                        raise ClientClosed("content body frame out of order", 505)
                    if not content.parts and size == content.size:
                        self._content_done(content, buf[start:end], received_us, done)
                        continue
                    content.parts.append(buf[start:end])
                    content.got += size
                    if content.got >= content.size:
                        self._content_done(content, b"".join(content.parts), received_us, done)
                elif ftype != FRAME_HEARTBEAT:
                    raise ClientClosed(f"unknown frame type {ftype}", 501)
        finally:
            if done:
                with self._cond:
                    self._deliveries.extend(done)
                    self._cond.notify_all()
        return pos

    def _content_done(self, content: _Content, body: bytes, received_us: int, done: list[Delivery]) -> None:
        self._content = None
        if content.deliver:
            tag, redelivered, exchange, routing_key = content.method
            done.append(Delivery(tag, redelivered, exchange, routing_key, content.props, body, received_us))
        else:
            m = content.method
            with self._cond:
                self._returns.append(Returned(m.reply_code, m.reply_text, m.exchange, m.routing_key))

    def _on_method(self, channel: int, m: Any) -> None:
        if isinstance(m, (spec.Basic.Ack, spec.Basic.Nack)):
            self._on_confirm(m)
        elif isinstance(m, spec.Basic.Return):
            self._content = _Content(False, m)
        elif isinstance(m, spec.Basic.GetOk):  # its content follows, as a delivery's (is_stream)
            self._content = _Content(True, (m.delivery_tag, m.redelivered, m.exchange, m.routing_key))
            with self._cond:
                self._rpc_reply = m
                self._cond.notify_all()
        elif isinstance(m, spec.Connection.Close):
            self._send(method_frame(0, spec.Connection.CloseOk()))
            raise ClientClosed(f"the broker closed the connection: {m.reply_code} {m.reply_text}", m.reply_code)
        elif isinstance(m, spec.Connection.CloseOk):
            raise ClientClosed("connection closed", 200)
        elif isinstance(m, spec.Connection.Blocked):
            self.blocked = True
        elif isinstance(m, spec.Connection.Unblocked):
            self.blocked = False
        elif isinstance(m, spec.Channel.Close):
            self._send(method_frame(CHANNEL, spec.Channel.CloseOk()))
            raise ClientClosed(f"the broker closed the channel: {m.reply_code} {m.reply_text}", m.reply_code)
        elif isinstance(m, spec.Basic.Cancel):
            raise ClientClosed("the broker cancelled the consumer (was the queue deleted?)", 404)
        else:
            with self._cond:
                if isinstance(m, self._rpc_wanted):
                    self._rpc_reply = m
                    self._cond.notify_all()

    def _on_confirm(self, m: Any) -> None:
        with self._cond:
            pending = self._unconfirmed
            if m.multiple:
                while pending:
                    seq = next(iter(pending))
                    if seq > m.delivery_tag:
                        break
                    del pending[seq]
                    if isinstance(m, spec.Basic.Nack):
                        self._nacked += 1
            elif pending.pop(m.delivery_tag, 0) is None and isinstance(m, spec.Basic.Nack):
                self._nacked += 1
            self._cond.notify_all()

    def _fail(self, exc: ClientClosed) -> None:
        with self._cond:
            if self.failure is None:
                self.failure = exc
            self._cond.notify_all()

    # -- sending ---------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            raise ClientClosed("not connected")
        try:
            with self._send_lock:
                sock.sendall(data)
                self._last_sent = time.monotonic()
        except OSError as exc:
            text = "timed out writing to the broker" if isinstance(exc, TimeoutError) else str(exc)
            failure = ClientClosed(f"connection to {self.uri.display()} lost: {text}")
            self._fail(failure)
            raise failure from None

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _rpc(self, method: Any, *replies: type, timeout_s: float = 30.0) -> Any:
        with self._cond:
            self._check()
            self._rpc_wanted = replies
            self._rpc_reply = None
        self._send(method_frame(CHANNEL, method))
        deadline = time.monotonic() + timeout_s
        with self._cond:
            try:
                while self._rpc_reply is None:
                    self._check()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ClientClosed(f"no reply to {method.NAME} from {self.uri.display()} "
                                           f"within {timeout_s:g} s")
                    self._cond.wait(left)
                return self._rpc_reply
            finally:
                self._rpc_wanted = ()
                self._rpc_reply = None

    # -- queues ------------------------------------------------------------------------------------

    def queue_message_count(self, queue: str) -> int:
        """Passive queue.declare: the number of ready messages. A missing queue closes the channel
        (404), which surfaces as ClientClosed with code 404."""
        ok = self._rpc(spec.Queue.Declare(queue=queue, passive=True), spec.Queue.DeclareOk)
        return int(ok.message_count)

    def is_stream(self, queue: str, timeout_s: float = 30.0) -> bool:
        """Whether `queue` is a stream. A stream refuses basic.get (RabbitMQ's and hutch's 540 "basic.get
        not supported by stream queues"), which closes this connection: use a client for nothing else
        after a True. Any other queue answers get-empty, or get-ok with a message that is given back at
        once (basic.nack requeue=true: it is redelivered, marked so, like any requeued message)."""
        try:
            reply = self._rpc(spec.Basic.Get(queue=queue), spec.Basic.GetOk, spec.Basic.GetEmpty,
                              timeout_s=timeout_s)
        except ClientClosed as exc:
            if exc.code == 540 and "stream" in str(exc):
                return True
            raise
        if isinstance(reply, spec.Basic.GetOk):
            deadline = time.monotonic() + timeout_s
            with self._cond:
                while not any(d.delivery_tag == reply.delivery_tag for d in self._deliveries):
                    self._check()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ClientClosed(f"no content for basic.get-ok within {timeout_s:g} s")
                    self._cond.wait(left)
                self._deliveries = deque(d for d in self._deliveries if d.delivery_tag != reply.delivery_tag)
            self._send(method_frame(CHANNEL, spec.Basic.Nack(delivery_tag=reply.delivery_tag, multiple=False,
                                                             requeue=True)))
        return False

    def declare_queue(self, queue: str, durable: bool = True, arguments: dict[str, Any] | None = None) -> None:
        """queue.declare (for tools and benchmarks; the connector itself never declares)."""
        self._rpc(spec.Queue.Declare(queue=queue, durable=durable, arguments=arguments or {}), spec.Queue.DeclareOk)

    def purge_queue(self, queue: str) -> int:
        return int(self._rpc(spec.Queue.Purge(queue=queue), spec.Queue.PurgeOk).message_count)

    # -- consuming ---------------------------------------------------------------------------------

    def consume(self, queue: str, prefetch: int, arguments: dict[str, Any] | None = None) -> None:
        """basic.qos(prefetch) then basic.consume(queue, arguments) with manual acknowledgements (on a
        stream: `x-stream-offset` in `arguments`, and acknowledgements are credit)."""
        self._rpc(spec.Basic.Qos(prefetch_count=prefetch), spec.Basic.QosOk)
        ok = self._rpc(spec.Basic.Consume(queue=queue, arguments=arguments or {}), spec.Basic.ConsumeOk)
        self._consumer_tag = ok.consumer_tag

    def take(self, limit: int, timeout_s: float, idle: bool = False) -> list[Delivery]:
        """Up to `limit` buffered deliveries: returns once `limit` are there, or after `timeout_s`
        (measured from the call, or with `idle` from the last delivery that arrived) with what it has."""
        deadline = time.monotonic() + timeout_s
        out: list[Delivery] = []
        with self._cond:
            while True:
                buf = self._deliveries
                if buf:
                    while buf and len(out) < limit:
                        out.append(buf.popleft())
                    if idle:
                        deadline = time.monotonic() + timeout_s
                if len(out) >= limit:
                    return out
                self._check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return out
                self._cond.wait(left)

    def take_available(self, limit: int, timeout_s: float) -> list[Delivery]:
        """Up to `limit` buffered deliveries, as soon as there is at least one; [] after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        out: list[Delivery] = []
        with self._cond:
            buf = self._deliveries
            while not buf:
                self._check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return out
                self._cond.wait(left)
            while buf and len(out) < limit:
                out.append(buf.popleft())
            return out

    def buffered(self) -> int:
        with self._cond:
            return len(self._deliveries)

    def ack(self, delivery_tag: int, multiple: bool = True) -> None:
        self._check()
        self._send(method_frame(CHANNEL, spec.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple)))

    def requeue(self, delivery_tag: int, multiple: bool = True) -> None:
        """basic.nack with requeue=true: the messages go back to the queue (redelivered=true)."""
        self._check()
        self._send(method_frame(CHANNEL, spec.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple,
                                                         requeue=True)))

    # -- publishing ----------------------------------------------------------------------------------

    def confirm_select(self) -> None:
        self._rpc(spec.Confirm.Select(), spec.Confirm.SelectOk)

    def publish_frame_prefix(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        """The basic.publish method frame for one (exchange, routing key), to reuse for many messages."""
        return method_frame(CHANNEL, spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                        mandatory=mandatory))

    def content(self, properties_raw: bytes, body: bytes) -> list[bytes]:
        """Header and body frames for one message (bodies split by frame_max)."""
        return content_frames(CHANNEL, 60, properties_raw, body, self.frame_max)

    def send_publishes(self, data: list[bytes], count: int) -> None:
        """Write `count` publishes (already encoded in `data`) in one go, tracking their confirms."""
        with self._cond:
            self._check()
            first = self._next_publish_seq
            self._next_publish_seq = first + count
            pending = self._unconfirmed
            for seq in range(first, first + count):
                pending[seq] = None
        self._send(b"".join(data))

    def unconfirmed(self) -> int:
        with self._cond:
            return len(self._unconfirmed)

    def wait_confirms(self, at_most: int, timeout_s: float) -> None:
        """Wait until no more than `at_most` publishes are unconfirmed. Raises ClientClosed on failure
        or timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._unconfirmed) > at_most:
                self._check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClientClosed(f"{len(self._unconfirmed)} publishes were not confirmed by "
                                       f"{self.uri.display()} within {timeout_s:g} s")
                self._cond.wait(left)

    def publish_outcome(self) -> tuple[int, list[Returned]]:
        """(messages nacked by the broker, messages returned as unroutable) so far."""
        with self._cond:
            return self._nacked, list(self._returns)

    # -- closing -------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        """connection.close / close-ok, then the socket. Never raises. Unacknowledged deliveries go back
        to their queue."""
        sock = self._sock
        if sock is None:
            return
        self._closing = True
        if self.failure is None and self._thread is not None:
            try:
                self._send(method_frame(0, spec.Connection.Close(reply_code=200, reply_text="bye")))
                with self._cond:
                    self._cond.wait_for(lambda: self.failure is not None, timeout_s)
            except ClientClosed:
                pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._fail(ClientClosed("connection closed", 200))

    def __enter__(self) -> AmqpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
