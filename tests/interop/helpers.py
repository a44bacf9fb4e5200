"""Helpers shared by the interop tests: unique names, pika connection parameters, waiting loops, and
`RawClient`, a tiny blocking AMQP client built on hutch's own codec (`hutch.amqp.spec` / `frames`) for
the tests that must put exact bytes on the wire (protocol violations, heartbeats, tune negotiation).

Rules: every wait has a deadline; nothing here talks to ports 5672/15672.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions

from hutch.amqp import spec
from hutch.amqp.frames import FrameReader, content_frames, method_frame
from hutch.amqp.table import encode_table

_counter = itertools.count(1)


def storage_barrier(amqp_port: int) -> None:
    """Return once everything the node wrote before is on disk: a confirmed persistent publish waits for
    the group commit that also carries the earlier writes (publishes without confirms, acks, and the
    requeues of a closed connection have no reply of their own). Without it a kill -9 may legitimately
    lose them. Leaves one message in the durable queue "barrier"."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=amqp_port, heartbeat=0))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("barrier", durable=True)
    ch.basic_publish("", "barrier", b"-", pika.BasicProperties(delivery_mode=2))
    conn.close()


def unique(prefix: str = "q") -> str:
    """A name no other test (or earlier run against the same session server) uses."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{time.monotonic_ns() % 1_000_000}"


def params(port: int, user: str = "guest", password: str = "guest", vhost: str = "/",
           **kwargs: Any) -> pika.ConnectionParameters:
    kwargs.setdefault("connection_attempts", 1)
    kwargs.setdefault("socket_timeout", 5)
    kwargs.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
                                     **kwargs)


def connect(port: int, **kwargs: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(params(port, **kwargs))


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0,
             pump: Callable[[], None] | None = None, interval: float = 0.02) -> bool:
    """Poll `predicate` until true or the deadline; `pump` (e.g. process_data_events) runs between polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if pump is not None:
            pump()
        else:
            time.sleep(interval)
    return predicate()


def pump(conn: pika.BlockingConnection, seconds: float = 0.05) -> Callable[[], None]:
    return lambda: conn.process_data_events(time_limit=seconds)


def drain(conn: pika.BlockingConnection, sink: list[Any], count: int, timeout: float = 5.0) -> list[Any]:
    """Run the connection's I/O loop until `sink` holds `count` items (consumer callbacks fill it)."""
    wait_for(lambda: len(sink) >= count, timeout, pump(conn))
    return sink


def settle(conn: pika.BlockingConnection, seconds: float = 0.2) -> None:
    """Let in-flight frames arrive (used before asserting that nothing more is delivered)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


# ---------------------------------------------------------------------------------------------------
# A raw AMQP client on hutch's codec


class ServerClosed(Exception):
    """The server closed the TCP connection."""


def plain_response(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain_response(user: str, password: str) -> bytes:
    # AMQPLAIN is a field table without its 4-byte length prefix (what py-amqp sends)
    return encode_table({"LOGIN": user, "PASSWORD": password})[4:]


class RawClient:
    """One TCP connection speaking AMQP frame by frame. Methods raise `ServerClosed` on EOF and
    `TimeoutError` when nothing arrives in time."""

    def __init__(self, port: int, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None,
                 source: str | None = None) -> None:
        """`source`: a local address to connect from (127.0.0.x: another client host on loopback)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
        self.sock = ssl_context.wrap_socket(sock, server_hostname="localhost") if ssl_context else sock
        self.timeout = timeout
        self.reader = FrameReader(0)
        self.frames: list[tuple[int, int, bytes]] = []
        self.tune: Any = None
        self.start: Any = None

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- sending ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.send(method_frame(channel, method))

    def send_frame(self, ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> None:
        self.send(struct.pack(">BHI", ftype, channel, len(payload)) + payload + end)

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                props: spec.BasicProperties | None = None, frame_max: int = 131072,
                mandatory: bool = False, immediate: bool = False) -> None:
        raw_props = (props or spec.BasicProperties()).encode()
        data = method_frame(channel, spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                         mandatory=mandatory, immediate=immediate))
        data += b"".join(content_frames(channel, 60, raw_props, body, frame_max))
        self.send(data)

    # -- receiving -------------------------------------------------------------------------------
    def recv_raw(self, timeout: float | None = None) -> bytes:
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            raise TimeoutError("no data from the server") from None
        if not data:
            raise ServerClosed()
        return data

    def recv_frame(self, timeout: float | None = None) -> tuple[int, int, bytes]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.frames:
            self.frames.extend(self.reader.frames())
            if self.frames:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the server")
            self.reader.feed(self.recv_raw(remaining))
        return self.frames.pop(0)

    def recv_method(self, timeout: float | None = None) -> tuple[int, spec.Method]:
        """The next method frame, skipping heartbeats."""
        while True:
            ftype, channel, payload = self.recv_frame(timeout)
            if ftype == spec.FRAME_METHOD:
                return channel, spec.decode_method(payload)
            if ftype != spec.FRAME_HEARTBEAT:
                raise AssertionError(f"expected a method frame, got type {ftype} on channel {channel}")

    def expect(self, cls: type, channel: int | None = None, timeout: float | None = None) -> Any:
        ch, method = self.recv_method(timeout)
        assert isinstance(method, cls), f"expected {cls.__name__}, got {method!r}"
        if channel is not None:
            assert ch == channel, f"{method!r} on channel {ch}, expected {channel}"
        return method

    def expect_connection_close(self, code: int | tuple[int, ...], timeout: float | None = None,
                                check_hangup: bool = True) -> Any:
        """Wait for connection.close with `code`, answer close-ok, and check the server hangs up.

        After a framing error the server cannot find frame boundaries any more, so (like RabbitMQ)
        it may only hang up after a grace period; pass check_hangup=False there."""
        close = self.expect(spec.Connection.Close, 0, timeout)
        codes = (code,) if isinstance(code, int) else code
        assert close.reply_code in codes, f"expected {code}, got {close.reply_code} {close.reply_text}"
        self.send_method(0, spec.Connection.CloseOk())
        if check_hangup:
            assert self.wait_closed(), "server did not close the socket after close-ok"
        return close

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the TCP connection (other bytes are discarded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.recv_raw(deadline - time.monotonic())
            except ServerClosed:
                return True
            except (TimeoutError, OSError):
                return False
        return False

    # -- handshake -------------------------------------------------------------------------------
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  mechanism: str = "PLAIN", channel_max: int | None = None, frame_max: int | None = None,
                  heartbeat: int = 0, capabilities: dict[str, Any] | None = None) -> Any:
        """Header, start-ok, tune-ok (server values unless given), open. Returns connection.open-ok."""
        self.send(spec.PROTOCOL_HEADER)
        self.start = self.expect(spec.Connection.Start, 0)
        response = (plain_response if mechanism == "PLAIN" else amqplain_response)(user, password)
        caps = {"authentication_failure_close": True, "consumer_cancel_notify": True,
                "publisher_confirms": True, "basic.nack": True, "connection.blocked": True}
        caps.update(capabilities or {})
        self.send_method(0, spec.Connection.StartOk(
            client_properties={"product": "hutch-interop-raw", "capabilities": caps},
            mechanism=mechanism, response=response, locale="en_US"))
        self.tune = self.expect(spec.Connection.Tune, 0)
        self.send_method(0, spec.Connection.TuneOk(
            channel_max=self.tune.channel_max if channel_max is None else channel_max,
            frame_max=self.tune.frame_max if frame_max is None else frame_max,
            heartbeat=heartbeat))
        self.send_method(0, spec.Connection.Open(virtual_host=vhost))
        return self.expect(spec.Connection.OpenOk, 0)

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(channel, spec.Channel.Open())
        self.expect(spec.Channel.OpenOk, channel)

    def rpc(self, channel: int, method: spec.Method, reply: type) -> Any:
        self.send_method(channel, method)
        return self.expect(reply, channel)


def raw_session(port: int, ssl_context: ssl.SSLContext | None = None, **handshake: Any) -> RawClient:
    """A RawClient (over TLS with `ssl_context`) that has completed the handshake and opened channel 1."""
    client = RawClient(port, ssl_context=ssl_context)
    client.handshake(**handshake)
    client.open_channel(1)
    return client


def write_after_close(raw: RawClient, server_closes_first: bool = False, megabytes: int = 8) -> None:
    """The close handshake of a client that still has writes queued (amqplib's "find high watermark"
    test, issue 22): after connection.close (the client's, or with `server_closes_first` the node's,
    already received) the client writes `megabytes` more of publishes without reading. The node must
    read and discard them all: a socket it closed would fail them (a reset or EPIPE raised here).
    Then the client's close-ok or the node's close-ok, and the node hangs up once the client does."""
    if not server_closes_first:
        raw.send_method(0, spec.Connection.Close(reply_code=200, reply_text="bye"))
    body = b"q" * 65536
    for _ in range(megabytes * 16):
        raw.publish(1, "", "no-such-queue", body)
    if server_closes_first:
        raw.send_method(0, spec.Connection.CloseOk())
    else:
        raw.expect(spec.Connection.CloseOk, 0)
        raw.sock.shutdown(socket.SHUT_WR)
    assert raw.wait_closed(timeout=30), "the node did not close the socket after the client did"


def server_alive(port: int) -> bool:
    """A fresh pika connection can declare and use a queue (the node survived whatever came before)."""
    conn = connect(port)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"ping")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        return method is not None and body == b"ping"
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------------
# pika errors


class _Refusal:
    code = 0
    text = ""


@contextlib.contextmanager
def refused(code: int, text: str | None = None, connection: bool = False) -> Iterator[_Refusal]:
    """Expect pika to report a channel close (or with connection=True a connection close) by the
    broker with `code`; `text`, if given, must equal the reply text. Yields the code and text."""
    result = _Refusal()
    expected = (pika.exceptions.ConnectionClosedByBroker if connection
                else pika.exceptions.ChannelClosedByBroker)
    try:
        yield result
    except expected as exc:
        result.code, result.text = exc.reply_code, exc.reply_text
    else:
        raise AssertionError(f"expected the broker to refuse with {code}")
    assert result.code == code, f"expected {code}, got {result.code} {result.text!r}"
    if text is not None:
        assert result.text == text, f"expected {text!r}, got {result.text!r}"


def get_all(ch: Any, queue: str) -> list[bytes]:
    """Every message currently in `queue`, in order, fetched with basic.get (auto-ack)."""
    bodies = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def temp_queue(ch: Any) -> str:
    return ch.queue_declare("", exclusive=True).method.queue
