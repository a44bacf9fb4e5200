"""Protocol violations sent on a raw socket (frames built with hutch's codec): each gets RabbitMQ's
connection or channel error, and nothing a client sends can crash the node."""

from __future__ import annotations

import struct

import pytest

from hutch.amqp import spec

from .helpers import RawClient, ServerClosed, raw_session, server_alive, unique


def _content_header(body_size: int) -> bytes:
    return struct.pack(">HHQ", 60, 0, body_size) + spec.BasicProperties().encode()


def test_frame_larger_than_frame_max_is_501(server):
    with raw_session(server.amqp_port) as raw:
        # only the 7-byte header: the server must judge the size before waiting for the payload
        raw.send(struct.pack(">BHI", spec.FRAME_METHOD, 1, 200_000))
        close = raw.expect_connection_close(501, check_hangup=False)
        assert close.reply_text.startswith("FRAME_ERROR")


def test_frame_over_negotiated_smaller_frame_max_is_501(server):
    with raw_session(server.amqp_port, frame_max=4096) as raw:
        raw.send_frame(spec.FRAME_BODY, 1, b"x" * 5000)
        raw.expect_connection_close(501, check_hangup=False)


def test_bad_frame_end_is_501(server):
    with raw_session(server.amqp_port) as raw:
        payload = spec.Queue.Declare(queue=unique()).encode()
        raw.send_frame(spec.FRAME_METHOD, 1, payload, end=b"\x00")
        close = raw.expect_connection_close(501, check_hangup=False)
        assert close.reply_text.startswith("FRAME_ERROR")


def test_unknown_frame_type_is_501(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_frame(9, 1, b"hello")
        raw.expect_connection_close(501, check_hangup=False)


def test_heartbeat_on_non_zero_channel_is_refused(server):
    # the spec says 501; RabbitMQ sends 505. Either closes the connection.
    with raw_session(server.amqp_port) as raw:
        raw.send_frame(spec.FRAME_HEARTBEAT, 1, b"")
        raw.expect_connection_close((501, 505), check_hangup=False)


def test_bad_utf8_in_shortstr_is_501(server):
    with raw_session(server.amqp_port) as raw:
        payload = bytearray(spec.Queue.Declare(queue="abcd").encode())
        pos = payload.index(b"abcd")
        payload[pos:pos + 4] = b"\xff\xfe\xfd\xfc"
        raw.send_frame(spec.FRAME_METHOD, 1, bytes(payload))
        raw.expect_connection_close(501)


def test_truncated_method_payload_is_501(server):
    with raw_session(server.amqp_port) as raw:
        payload = spec.Queue.Declare(queue="abcdef").encode()
        raw.send_frame(spec.FRAME_METHOD, 1, payload[:8])
        raw.expect_connection_close(501)


def test_body_frame_without_header_is_505(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_frame(spec.FRAME_BODY, 1, b"orphan body")
        close = raw.expect_connection_close(505)
        assert close.reply_text.startswith("UNEXPECTED_FRAME")


def test_header_frame_without_publish_is_505(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_frame(spec.FRAME_HEADER, 1, _content_header(3))
        raw.expect_connection_close(505)


def test_method_instead_of_content_header_is_505(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key="x"))
        raw.send_method(1, spec.Queue.Declare(queue=unique()))
        raw.expect_connection_close(505)


def test_method_instead_of_remaining_body_is_505(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key="x"))
        raw.send_frame(spec.FRAME_HEADER, 1, _content_header(10))
        raw.send_frame(spec.FRAME_BODY, 1, b"12345")
        raw.send_method(1, spec.Queue.Declare(queue=unique()))
        raw.expect_connection_close(505)


def test_body_larger_than_declared_is_a_connection_error(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key="x"))
        raw.send_frame(spec.FRAME_HEADER, 1, _content_header(3))
        raw.send_frame(spec.FRAME_BODY, 1, b"too long")
        close = raw.expect(spec.Connection.Close, 0)
        assert close.reply_code in (501, 505)


def test_content_for_other_class_is_505(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key="x"))
        raw.send_frame(spec.FRAME_HEADER, 1, struct.pack(">HHQ", 50, 0, 0) + b"\x00\x00")
        raw.expect_connection_close(505)


def test_second_channel_open_is_504(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Channel.Open())
        close = raw.expect_connection_close(504)
        assert close.reply_text.startswith("CHANNEL_ERROR")
        assert (close.class_id, close.method_id) == (20, 10)


def test_channel_numbers_above_channel_max_are_allowed(server):
    """channel_max limits the count of open channels, not their numbers (RabbitMQ; issue 16)."""
    with RawClient(server.amqp_port) as raw:
        raw.handshake()
        raw.open_channel(2047)
        raw.open_channel(2048)
        raw.open_channel(65535)
        raw.rpc(65535, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)


def test_method_on_unopened_channel_is_504(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(5, spec.Queue.Declare(queue=unique()))
        close = raw.expect_connection_close(504)
        assert close.reply_text.startswith("CHANNEL_ERROR")


def test_channel_method_before_connection_open_is_refused(server):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send_method(0, spec.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                   response=b"\x00guest\x00guest", locale="en_US"))
        tune = raw.expect(spec.Connection.Tune)
        raw.send_method(0, spec.Connection.TuneOk(channel_max=tune.channel_max,
                                                  frame_max=tune.frame_max, heartbeat=0))
        raw.send_method(1, spec.Channel.Open())
        close = raw.expect(spec.Connection.Close, 0)
        assert close.reply_code in (504, 505)


def test_unknown_method_closes_connection(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_frame(spec.FRAME_METHOD, 1, struct.pack(">HH", 60, 999))
        close = raw.expect(spec.Connection.Close, 0)
        assert 500 <= close.reply_code < 600


def test_client_channel_close_then_reopen_same_number(server):
    with raw_session(server.amqp_port) as raw:
        raw.rpc(1, spec.Channel.Close(reply_code=200, reply_text="done"), spec.Channel.CloseOk)
        raw.open_channel(1)
        ok = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
        assert ok.queue.startswith("amq.gen-")


def test_channel_error_then_close_ok_then_reopen(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Queue.Declare(queue=unique("missing"), passive=True))
        close = raw.expect(spec.Channel.Close, 1)
        assert close.reply_code == 404
        assert (close.class_id, close.method_id) == (50, 10)
        # methods sent before our close-ok are ignored, not answered
        raw.send_method(1, spec.Queue.Declare(queue=unique()))
        raw.send_method(1, spec.Channel.CloseOk())
        raw.open_channel(1)
        ok = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
        assert ok.queue.startswith("amq.gen-")


def test_channel_error_does_not_affect_other_channels(server):
    with raw_session(server.amqp_port) as raw:
        raw.open_channel(2)
        raw.send_method(1, spec.Queue.Declare(queue=unique("missing"), passive=True))
        raw.expect(spec.Channel.Close, 1)
        ok = raw.rpc(2, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
        assert ok.queue.startswith("amq.gen-")


@pytest.mark.parametrize("seed", range(6))
def test_garbage_after_handshake_never_crashes_the_node(server, seed):
    rnd = __import__("random").Random(seed)
    with raw_session(server.amqp_port) as raw:
        if seed % 2:
            raw.send(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 3000))))
        else:  # plausible frame headers with garbage payloads
            ftype = rnd.choice((1, 2, 3, 8))
            payload = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 200)))
            raw.send_frame(ftype, rnd.randrange(0, 4), payload)
        try:
            close = raw.expect(spec.Connection.Close, 0, timeout=1)
            assert close.reply_code >= 500, close
        except (TimeoutError, ServerClosed):  # it may also wait for the rest of a frame, or hang up
            pass
    assert server_alive(server.amqp_port)


def test_garbage_before_handshake_completes(server):
    with RawClient(server.amqp_port) as raw:
        raw.send(spec.PROTOCOL_HEADER)
        raw.expect(spec.Connection.Start)
        raw.send(b"\x01\x00\x00\x00\x00\x00\x05garbage-garbage")
        close = raw.expect(spec.Connection.Close, 0)
        assert close.reply_code >= 500
    assert server_alive(server.amqp_port)


def test_connection_ignores_methods_after_server_close(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(5, spec.Queue.Declare(queue=unique()))
        close = raw.expect(spec.Connection.Close, 0)
        assert close.reply_code == 504
        raw.send_method(1, spec.Queue.Declare(queue=unique()))  # ignored while closing
        raw.send_method(0, spec.Connection.CloseOk())
        assert raw.wait_closed()


def test_content_interleaved_across_channels(server):
    """Content frames of different channels may interleave (only one channel's must not)."""
    with raw_session(server.amqp_port) as raw:
        raw.open_channel(2)
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key=q))
        raw.send_frame(spec.FRAME_HEADER, 1, _content_header(6))
        raw.send_frame(spec.FRAME_BODY, 1, b"one-")
        raw.send_method(2, spec.Basic.Publish(exchange="", routing_key=q))
        raw.send_frame(spec.FRAME_HEADER, 2, _content_header(3))
        raw.send_frame(spec.FRAME_BODY, 2, b"two")
        raw.send_frame(spec.FRAME_BODY, 1, b"ch")
        ok = raw.rpc(1, spec.Queue.Declare(queue=q, passive=True), spec.Queue.DeclareOk)
        assert ok.message_count == 2
        bodies = []
        for _ in range(2):
            raw.send_method(1, spec.Basic.Get(queue=q, no_ack=True))
            raw.expect(spec.Basic.GetOk, 1)
            raw.recv_frame()
            bodies.append(raw.recv_frame()[2])
        assert bodies == [b"two", b"one-ch"]


def test_whole_session_one_byte_at_a_time(server):
    from hutch.amqp.frames import content_frames, method_frame

    q = unique("bytewise")
    script = b"".join([
        method_frame(1, spec.Queue.Declare(queue=q, auto_delete=True)),
        method_frame(1, spec.Basic.Publish(exchange="", routing_key=q)),
        *content_frames(1, 60, spec.BasicProperties(content_type="text/plain").encode(), b"slow", 131072),
        method_frame(1, spec.Basic.Get(queue=q, no_ack=True)),
    ])
    with raw_session(server.amqp_port) as raw:
        for i in range(len(script)):
            raw.send(script[i:i + 1])
        assert raw.expect(spec.Queue.DeclareOk, 1).queue == q
        raw.expect(spec.Basic.GetOk, 1)
        ftype, _ch, payload = raw.recv_frame()
        assert ftype == spec.FRAME_HEADER
        assert spec.BasicProperties.decode(payload, 12).content_type == "text/plain"
        assert raw.recv_frame()[2] == b"slow"


def test_nowait_declare_consume_and_publish(server):
    with raw_session(server.amqp_port) as raw:
        q = unique("nowait")
        raw.send_method(1, spec.Queue.Declare(queue=q, auto_delete=True, nowait=True))
        raw.send_method(1, spec.Basic.Consume(queue=q, consumer_tag="c", no_ack=True, nowait=True))
        raw.publish(1, "", q, b"fast")
        deliver = raw.expect(spec.Basic.Deliver, 1)
        assert (deliver.consumer_tag, deliver.routing_key) == ("c", q)
        raw.recv_frame()
        assert raw.recv_frame()[2] == b"fast"


def _all_methods() -> list[type]:
    return sorted(spec.METHOD_CLASSES.values(), key=lambda cls: cls.INDEX)


@pytest.mark.parametrize("method_cls", _all_methods(), ids=lambda cls: cls.NAME)
def test_every_method_with_garbage_arguments_is_refused_cleanly(server, method_cls):
    """Random argument bytes for every method (and every server-to-client method sent by a client):
    the server answers with a protocol error or ignores it, never an internal error (541)."""
    import random

    rnd = random.Random(method_cls.INDEX)
    with raw_session(server.amqp_port) as raw:
        for _ in range(3):
            head = struct.pack(">HH", method_cls.CLASS_ID, method_cls.METHOD_ID)
            raw.send_frame(spec.FRAME_METHOD, 1, head + bytes(rnd.randrange(256) for _ in range(rnd.randrange(40))))
        raw.send_method(1, spec.Basic.Qos(prefetch_count=1))  # a probe: answered only if still open
        try:
            while True:
                channel, method = raw.recv_method(timeout=2)
                if isinstance(method, spec.Connection.Close):
                    assert method.reply_code != 541, method.reply_text
                    break
                if isinstance(method, spec.Channel.Close):
                    assert method.reply_code != 541, method.reply_text
                    break
                if isinstance(method, spec.Basic.QosOk):
                    break
        except (TimeoutError, ServerClosed):
            pass
    assert "internal error" not in server.log()


@pytest.mark.parametrize("seed", range(8))
def test_garbage_content_header_properties_are_refused_cleanly(server, seed):
    import random

    rnd = random.Random(seed)
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        raw.send_method(1, spec.Basic.Publish(exchange="", routing_key=q))
        props = struct.pack(">H", rnd.randrange(0x10000) & ~1) + bytes(rnd.randrange(256) for _ in range(30))
        raw.send_frame(spec.FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 0) + props)
        raw.send_method(1, spec.Queue.Declare(queue=q, passive=True))
        channel, method = raw.recv_method()
        if isinstance(method, spec.Connection.Close):
            assert method.reply_code == 501, method.reply_text
        elif isinstance(method, spec.Channel.Close):
            assert method.reply_code in (403, 404, 406), method.reply_text
        else:  # the property list happened to decode: the message was accepted
            assert isinstance(method, spec.Queue.DeclareOk)
    assert server_alive(server.amqp_port)
