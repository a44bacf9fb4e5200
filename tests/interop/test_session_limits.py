"""Session limits a client can meet: channel_max as a count of open channels and the 8-byte frame
tolerance (RabbitMQ 4.x's behaviour, issue 16); input not read while a login is pending, a publish
whose body is still arriving held by a memory alarm, and the cap on unfinished bodies (issue 15)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from conftest import start_server
from hutch.amqp import spec
from hutch.amqp.frames import HEARTBEAT_FRAME, method_frame

from .helpers import RawClient, connect, plain_response, unique, wait_for
from .inproc import InProcNode

MiB = 1024 * 1024


# -- channel_max ----------------------------------------------------------------------------------
def test_channel_max_limits_the_count_not_the_number(server) -> None:
    conn = connect(server.amqp_port, channel_max=2)
    try:
        high = conn.channel(65535)  # any number is fine while fewer than channel_max are open
        other = conn.channel(2047)
        q = high.queue_declare("", exclusive=True).method.queue
        other.basic_publish("", q, b"through channel 2047")
        assert high.basic_get(q, auto_ack=True)[2] == b"through channel 2047"
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.channel(5)
        assert info.value.reply_code == 530
        assert info.value.reply_text == ("NOT_ALLOWED - number of channels opened (2) has reached the "
                                         "negotiated channel_max (2)")
    finally:
        if conn.is_open:
            conn.close()


def test_a_closed_channel_frees_its_place(server) -> None:
    conn = connect(server.amqp_port, channel_max=1)
    try:
        conn.channel(300).close()
        ch = conn.channel(301)
        assert ch.is_open
    finally:
        conn.close()


# -- frame_max tolerance ----------------------------------------------------------------------------
def _body_frame(channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", spec.FRAME_BODY, channel, len(payload)) + payload + b"\xce"


def _publish_head(channel: int, queue: str, body_size: int) -> bytes:
    header = struct.pack(">HHQ", 60, 0, body_size) + spec.BasicProperties().encode()
    return (method_frame(channel, spec.Basic.Publish(exchange="", routing_key=queue))
            + struct.pack(">BHI", spec.FRAME_HEADER, channel, len(header)) + header + b"\xce")


@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_body_frames_of_exactly_frame_max_payload_bytes_are_accepted(server, frame_max: int) -> None:
    """Some clients fill a body frame with frame_max payload bytes (8 over); RabbitMQ takes them."""
    body = bytes(range(256)) * (frame_max * 2 // 256) + b"tail"
    with RawClient(server.amqp_port) as raw:
        raw.handshake(frame_max=frame_max)
        raw.open_channel(1)
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        pieces = [body[i:i + frame_max] for i in range(0, len(body), frame_max)]
        raw.send(_publish_head(1, q, len(body)) + b"".join(_body_frame(1, p) for p in pieces))
        raw.send_method(1, spec.Basic.Get(queue=q, no_ack=True))
        raw.expect(spec.Basic.GetOk, 1)
        got = b""
        while len(got) < len(body):
            ftype, _ch, payload = raw.recv_frame()
            got += payload if ftype == spec.FRAME_BODY else b""
        assert got == body


def test_a_body_frame_one_byte_longer_is_501(server) -> None:
    with RawClient(server.amqp_port) as raw:
        raw.handshake(frame_max=4096)
        raw.open_channel(1)
        raw.send(_publish_head(1, unique(), 8192) + struct.pack(">BHI", spec.FRAME_BODY, 1, 4097))
        close = raw.expect_connection_close(501, check_hangup=False)
        assert close.reply_text == "FRAME_ERROR - frame size 4105 larger than negotiated maximum 4096"


# -- nothing read while a login is pending -----------------------------------------------------------
def _start_ok() -> bytes:
    return method_frame(0, spec.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response=plain_response("guest", "guest"), locale="en_US"))


def _flood(sock: socket.socket, data: bytes, sent: list[int], seconds: float) -> None:
    """Send `data` until the peer stops reading (or `seconds` pass); count what the kernel took."""
    sock.setblocking(False)
    view = memoryview(data)
    deadline = time.monotonic() + seconds
    while view and time.monotonic() < deadline:
        try:
            n = sock.send(view[:65536])
        except BlockingIOError:
            time.sleep(0.01)
            continue
        except OSError:
            return
        sent[0] += n
        view = view[n:]


def test_input_after_start_ok_is_not_read_while_the_login_is_pending() -> None:
    """Issue 15 finding 14: the login runs off the loop; meanwhile the socket must not be read (before,
    every byte a client sent was buffered until the password check returned)."""
    release = threading.Event()
    with InProcNode(monitor_resources=False) as node:
        assert node.node is not None
        real = node.node.auth.check_login  # the uncached password check the login gate runs off the loop

        def slow_check_login(user: str, password: str):  # noqa: ANN202 - the AuthStore's signature
            release.wait(20)
            return real(user, password)

        node.node.auth.check_login = slow_check_login  # type: ignore[method-assign]
        sock = socket.create_connection(("127.0.0.1", node.amqp_port))
        try:
            sock.sendall(spec.PROTOCOL_HEADER)
            assert sock.recv(65536)  # connection.start
            head = _start_ok()
            sock.sendall(head)
            time.sleep(0.3)  # the node has taken the start-ok and started the (held) password check
            sent = [0]
            flooder = threading.Thread(target=_flood, args=(sock, HEARTBEAT_FRAME * (4 * MiB), sent, 3))
            flooder.start()
            flooder.join()

            def read_so_far() -> tuple[int, int, bool]:
                conn, = node.node.connections  # type: ignore[union-attr]
                return conn.recv_oct, conn.reader.buffered, conn.transport.is_closing()

            recv_oct, buffered, closing = node.call(read_so_far)
            # nothing past the start-ok was read (the kernel's socket buffers hold what the client sent)
            assert (recv_oct, buffered, closing) == (len(spec.PROTOCOL_HEADER) + len(head), 0, False)
            assert sent[0] > 0
        finally:
            release.set()
            sock.close()


# -- partial bodies during a memory alarm, and their cap ---------------------------------------------
def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _mem_alarm(raw: RawClient) -> None:
    """Wait until the node's memory alarm is on: a publish gets connection.blocked."""
    raw.send(_publish_head(1, "nowhere", 0))
    raw.expect(spec.Connection.Blocked, 0, timeout=10)


def test_memory_alarm_holds_publishes_whose_bodies_are_still_arriving(tmp_path: Path) -> None:
    """Issue 15 finding 5: many channels each sending most of a large body during an alarm. The node
    stops reading at the first content frame, so its memory does not grow by what was sent."""
    server = start_server(tmp_path, config_text="vm_memory_high_watermark.absolute = 1MB\n")
    try:
        with RawClient(server.amqp_port) as probe:
            probe.handshake()
            probe.open_channel(1)
            deadline = time.monotonic() + 10
            while True:  # the resource monitor raises the alarm within a second of the start
                try:
                    _mem_alarm(probe)
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline
        raw = RawClient(server.amqp_port)
        raw.handshake()
        channels = 16
        for n in range(1, channels + 1):
            raw.open_channel(n)
        before = _rss_bytes(server.proc.pid)
        size = 6 * MiB
        chunk = b"p" * (131072 - 8)
        data = b"".join(_publish_head(n, "nowhere", size) + _body_frame(n, chunk) * (size // len(chunk) - 1)
                        for n in range(1, channels + 1))
        sent = [0]
        _flood(raw.sock, data, sent, 4)
        time.sleep(0.5)
        grown = _rss_bytes(server.proc.pid) - before
        assert grown < 32 * MiB, f"node RSS grew by {grown >> 20} MiB (client sent {sent[0] >> 20} MiB)"
        raw.close()
    finally:
        server.stop()


def test_unfinished_bodies_per_connection_are_capped(tmp_path: Path) -> None:
    server = start_server(tmp_path, config_text="max_message_size = 1048576\n"
                                                "max_unfinished_body_bytes = 2097152\n")
    try:
        with RawClient(server.amqp_port) as raw:
            raw.handshake()
            for n in (1, 2, 3):
                raw.open_channel(n)
            part = b"u" * 100_000
            for n in (1, 2, 3):  # each channel: a 1 MiB message of which 900 kB has arrived
                raw.send(_publish_head(n, "nowhere", MiB) + _body_frame(n, part) * 9)
            close = raw.expect_connection_close(506)
            assert close.reply_text == (
                "RESOURCE_ERROR - unfinished message bodies on this connection hold 2100000 bytes, more "
                "than the limit of 2097152 (max_unfinished_body_bytes)")
        # bodies that complete free their share: the same traffic, finished, is fine
        with RawClient(server.amqp_port) as raw:
            raw.handshake()
            for n in (1, 2, 3):
                raw.open_channel(n)
                raw.send(_publish_head(n, "nowhere", MiB) + _body_frame(n, b"v" * (MiB // 8)) * 8)
            raw.rpc(3, spec.Basic.Qos(prefetch_count=1), spec.Basic.QosOk)
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
        assert wait_for(lambda: conn.is_open)
        conn.close()
    finally:
        server.stop()
