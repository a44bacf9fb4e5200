"""Connection handshake with real clients and a raw socket: SASL mechanisms, login and vhost refusal,
tune negotiation, heartbeats, protocol-header mismatch, server properties, handshake timeout."""

from __future__ import annotations

import socket
import time

import amqp
import pika
import pika.exceptions
import pytest

from hutch.amqp import spec

from .helpers import (
    RawClient,
    ServerClosed,
    amqplain_response,
    connect,
    params,
    raw_session,
    server_alive,
    unique,
)

CAPABILITIES = ("publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
                "connection.blocked", "consumer_priorities", "authentication_failure_close",
                "per_consumer_qos", "direct_reply_to")
LOGIN_REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism {}. For details see "
                 "the broker logfile.")


def test_plain_login_and_server_properties(server):
    conn = connect(server.amqp_port)
    try:
        props = conn._impl.server_properties
        assert props["product"] == "hutch"
        for key in ("version", "platform", "copyright", "information", "cluster_name"):
            assert props.get(key), f"server property {key} missing"
        assert {name: props["capabilities"].get(name) for name in CAPABILITIES} == dict.fromkeys(
            CAPABILITIES, True)
        assert conn.channel().is_open
    finally:
        conn.close()


def test_connection_start_offers_plain_and_amqplain(server):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        start = raw.expect(spec.Connection.Start, 0)
        assert (start.version_major, start.version_minor) == (0, 9)
        assert set(bytes(start.mechanisms).split()) == {b"PLAIN", b"AMQPLAIN"}
        assert b"en_US" in bytes(start.locales).split()


def test_amqplain_login_raw(server):
    with RawClient(server.amqp_port) as raw:
        raw.handshake(mechanism="AMQPLAIN")
        raw.open_channel(1)
        ok = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
        assert ok.queue.startswith("amq.gen-")


def test_amqplain_login_py_amqp(server):
    conn = amqp.Connection(f"127.0.0.1:{server.amqp_port}", userid="guest", password="guest",
                           login_method="AMQPLAIN", connect_timeout=5)
    conn.connect()
    try:
        ch = conn.channel()
        name, count, consumers = ch.queue_declare("", exclusive=True)
        assert name.startswith("amq.gen-") and count == 0 and consumers == 0
    finally:
        conn.close()


def test_wrong_password_is_refused_with_403(server):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(server.amqp_port, password="wrong")
    assert "(403)" in str(info.value)
    assert LOGIN_REFUSED.format("PLAIN") in str(info.value)


def test_unknown_user_is_refused_with_403(server):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(server.amqp_port, user="nobody-" + unique(), password="x")
    assert LOGIN_REFUSED.format("PLAIN") in str(info.value)


def test_wrong_password_amqplain_raw(server):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send_method(0, spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="AMQPLAIN", response=amqplain_response("guest", "bad"), locale="en_US"))
        close = raw.expect_connection_close(403)
        assert close.reply_text == LOGIN_REFUSED.format("AMQPLAIN")


def test_login_failure_without_capability_just_closes(server):
    """A client that did not advertise authentication_failure_close gets the socket closed."""
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send_method(0, spec.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                   response=b"\x00guest\x00bad", locale="en_US"))
        with pytest.raises(ServerClosed):
            raw.recv_method()


def test_unknown_mechanism_is_refused(server):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send_method(0, spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="EXTERNAL", response=b"", locale="en_US"))
        close = raw.expect_connection_close(403)
        assert "EXTERNAL" in close.reply_text


def test_unknown_vhost_is_refused_with_530(server):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(server.amqp_port, vhost="no-such-vhost")
    assert "(530)" in str(info.value)
    assert "NOT_ALLOWED - vhost no-such-vhost not found" in str(info.value)


def test_tune_defaults(server):
    with RawClient(server.amqp_port) as raw:
        raw.handshake()
        assert (raw.tune.channel_max, raw.tune.frame_max, raw.tune.heartbeat) == (2047, 131072, 60)


def test_pika_negotiates_smaller_frame_max_and_channel_max(server):
    conn = connect(server.amqp_port, frame_max=8192, channel_max=10)
    try:
        assert conn._impl.params.frame_max == 8192
        assert conn._impl.params.channel_max == 10
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = bytes(range(256)) * 200  # 51200 bytes: several 8 KiB frames each way
        ch.basic_publish("", q, body)
        _m, _p, got = ch.basic_get(q, auto_ack=True)
        assert got == body
    finally:
        conn.close()


def test_server_honours_client_frame_max(server):
    """With frame_max 4096 negotiated, no frame the server sends is larger than 4096 bytes."""
    with raw_session(server.amqp_port, frame_max=4096) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        body = b"x" * 20000
        raw.publish(1, "", q, body, frame_max=4096)
        raw.send_method(1, spec.Basic.Get(queue=q, no_ack=True))
        sizes, got = [], b""
        ftype, _ch, payload = raw.recv_frame()
        assert spec.decode_method(payload).NAME == "basic.get_ok"
        while len(got) < len(body):
            ftype, _ch, payload = raw.recv_frame()
            sizes.append(len(payload) + 8)
            if ftype == spec.FRAME_BODY:
                got += payload
        assert got == body
        assert max(sizes) <= 4096
        assert len(sizes) >= 1 + 20000 // 4088


@pytest.mark.parametrize(("channel_max", "frame_max", "text"), [
    (None, 131072 * 2, "frame_max"),
    (None, 1024, "frame_max"),
    (4000, None, "channel_max"),
])
def test_tune_ok_outside_limits_is_refused(server, channel_max, frame_max, text):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send_method(0, spec.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                   response=b"\x00guest\x00guest", locale="en_US"))
        tune = raw.expect(spec.Connection.Tune)
        raw.send_method(0, spec.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=tune.frame_max if frame_max is None else frame_max, heartbeat=0))
        raw.send_method(0, spec.Connection.Open(virtual_host="/"))
        close = raw.expect_connection_close(530)
        assert text in close.reply_text


def test_channel_max_negotiated_by_client(server):
    with RawClient(server.amqp_port) as raw:
        raw.handshake(channel_max=3)
        for n in (1, 2, 3):
            raw.open_channel(n)
        raw.send_method(4, spec.Channel.Open())
        close = raw.expect_connection_close(530)
        assert close.reply_text.startswith("NOT_ALLOWED")


def test_pika_client_with_heartbeat_1_stays_connected(server):
    conn = pika.BlockingConnection(params(server.amqp_port, heartbeat=1))
    try:
        assert conn._impl.params.heartbeat == 1
        ch = conn.channel()
        conn.sleep(3.5)  # idle; pika's I/O loop answers and sends heartbeats
        assert conn.is_open
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"after idle")
        assert ch.basic_get(q, auto_ack=True)[2] == b"after idle"
    finally:
        conn.close()


def test_server_sends_heartbeats(server):
    with RawClient(server.amqp_port) as raw:
        raw.handshake(heartbeat=1)
        beats = 0
        deadline = time.monotonic() + 2.6
        while time.monotonic() < deadline:
            raw.send(b"\x08\x00\x00\x00\x00\x00\x00\xce")  # keep the server from dropping us
            try:
                ftype, channel, payload = raw.recv_frame(timeout=0.3)
            except TimeoutError:
                continue
            assert (ftype, channel, payload) == (spec.FRAME_HEARTBEAT, 0, b"")
            beats += 1
        assert beats >= 2


def test_silent_client_is_dropped_after_two_intervals(server):
    raw = RawClient(server.amqp_port)
    try:
        raw.handshake(heartbeat=1)
        raw.open_channel(1)
        started = time.monotonic()
        while True:  # read (heartbeats) but never send anything
            try:
                raw.recv_frame(timeout=8)
            except ServerClosed:
                break
            assert time.monotonic() - started < 8, "server never dropped the silent client"
        elapsed = time.monotonic() - started
        assert 1.5 <= elapsed <= 5.0, elapsed
    finally:
        raw.close()
    assert server_alive(server.amqp_port)


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",
    b"AMQP\x01\x01\x00\x09",
    b"AMQP\x00\x00\x08\x00",
    b"HTTP/1.1 200 OK\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_protocol_header_mismatch(server, header):
    with socket.create_connection(("127.0.0.1", server.amqp_port), timeout=5) as sock:
        sock.sendall(header)
        received = b""
        while True:
            data = sock.recv(100)
            if not data:
                break
            received += data
        assert received == b"AMQP\x00\x00\x09\x01"


def test_protocol_header_byte_by_byte(server):
    with RawClient(server.amqp_port) as raw:
        for byte in spec.PROTOCOL_HEADER:
            raw.send(bytes((byte,)))
            time.sleep(0.01)
        assert raw.expect(spec.Connection.Start).version_major == 0


def test_handshake_timeout_closes_idle_socket(limited_server):
    with RawClient(limited_server.amqp_port) as raw:
        started = time.monotonic()
        assert raw.wait_closed(timeout=6)
        assert time.monotonic() - started < 5


def test_handshake_timeout_after_header(limited_server):
    with RawClient(limited_server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        assert raw.wait_closed(timeout=6)


def test_client_connection_close(server):
    """After close-ok the node waits for the client to close the socket (as RabbitMQ does)."""
    with raw_session(server.amqp_port) as raw:
        raw.send_method(0, spec.Connection.Close(reply_code=200, reply_text="bye"))
        raw.expect(spec.Connection.CloseOk, 0)
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.wait_closed()


def test_update_secret(server):
    conn = connect(server.amqp_port)
    try:
        conn.update_secret("guest", "refresh")
        assert conn.channel().is_open
    finally:
        conn.close()


def test_many_connections_and_channels(server):
    conns = [connect(server.amqp_port) for _ in range(5)]
    try:
        channels = [c.channel() for c in conns for _ in range(20)]
        assert len({(id(ch.connection), ch.channel_number) for ch in channels}) == 100
        assert all(ch.is_open for ch in channels)
    finally:
        for c in conns:
            c.close()
