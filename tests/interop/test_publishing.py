"""Publishing: publisher confirms, mandatory returns, transactions, message size limit, immediate,
bodies split across frames, sender-selected distribution (CC/BCC), Direct Reply-To, validated user-id,
expiration, and every field-table type in headers surviving the broker."""

from __future__ import annotations

import datetime as dt
import struct
import threading
from decimal import Decimal

import pika
import pika.data
import pika.exceptions
import pytest

from hutch.amqp import spec

from .helpers import connect, drain, get_all, raw_session, refused, temp_queue, unique

# ---------------------------------------------------------------------------------------------------
# confirms


def test_confirms_ack_every_publish(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = temp_queue(ch)
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())  # raises if nacked
    assert len(get_all(ch, q)) == 20


def test_confirm_acks_cover_every_sequence_number(server):
    """A burst of publishes is acked, possibly with `multiple`, exactly up to the last sequence number."""
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        raw.rpc(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
        for i in range(50):
            raw.publish(1, "", q, str(i).encode())
        confirmed = 0
        multiples = 0
        while confirmed < 50:
            ack = raw.expect(spec.Basic.Ack, 1)
            assert ack.delivery_tag > confirmed
            assert ack.multiple or ack.delivery_tag == confirmed + 1
            multiples += ack.multiple
            confirmed = ack.delivery_tag
        assert confirmed == 50
        ok = raw.rpc(1, spec.Queue.Declare(queue=q, passive=True), spec.Queue.DeclareOk)
        assert ok.message_count == 50


def test_confirm_sequence_is_per_channel(server):
    with raw_session(server.amqp_port) as raw:
        raw.open_channel(2)
        for ch in (1, 2):
            raw.rpc(ch, spec.Confirm.Select(), spec.Confirm.SelectOk)
        raw.publish(1, "", "nowhere", b"a")
        raw.publish(1, "", "nowhere", b"b")
        raw.publish(2, "", "nowhere", b"c")
        acks = {1: 0, 2: 0}
        while acks != {1: 2, 2: 1}:
            ch, m = raw.recv_method()
            assert isinstance(m, spec.Basic.Ack)
            acks[ch] = m.delivery_tag


def test_unroutable_non_mandatory_is_acked(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", unique("nobody"), b"dropped")  # no exception: acked
    assert ch.is_open


def test_confirm_select_nowait(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Confirm.Select(nowait=True))
        raw.publish(1, "", "nowhere", b"x")
        ack = raw.expect(spec.Basic.Ack, 1)
        assert ack.delivery_tag == 1


# ---------------------------------------------------------------------------------------------------
# mandatory


def test_mandatory_unroutable_returned_before_confirm_ack(server):
    with raw_session(server.amqp_port) as raw:
        raw.rpc(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
        key = unique("nobody")
        raw.publish(1, "amq.direct", key, b"bounce", mandatory=True)
        ret = raw.expect(spec.Basic.Return, 1)
        assert (ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key) == (
            312, "NO_ROUTE", "amq.direct", key)
        ftype, _ch, _payload = raw.recv_frame()
        assert ftype == spec.FRAME_HEADER
        ftype, _ch, payload = raw.recv_frame()
        assert (ftype, payload) == (spec.FRAME_BODY, b"bounce")
        ack = raw.expect(spec.Basic.Ack, 1)
        assert ack.delivery_tag == 1


def test_mandatory_unroutable_with_pika_confirms(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("", unique("nobody"), b"bounce", mandatory=True)
    returned = info.value.messages[0]
    assert (returned.method.reply_code, returned.method.reply_text, returned.body) == (312, "NO_ROUTE",
                                                                                      b"bounce")
    q = temp_queue(ch)
    ch.basic_publish("", q, b"routable", mandatory=True)  # no exception


def test_mandatory_return_callback(conn):
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returns.append((method, props, body)))
    ch.basic_publish("amq.topic", "no.such.binding", b"r", pika.BasicProperties(message_id="m1"),
                     mandatory=True)
    drain(conn, returns, 1)
    method, props, body = returns[0]
    assert (method.reply_code, method.exchange, method.routing_key) == (312, "amq.topic", "no.such.binding")
    assert (props.message_id, body) == ("m1", b"r")


# ---------------------------------------------------------------------------------------------------
# transactions


def test_tx_commit_and_rollback_of_publishes(conn):
    ch, observer = conn.channel(), conn.channel()
    q = temp_queue(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    assert observer.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_rollback()
    assert observer.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_publish("", q, b"c1")
    ch.basic_publish("", q, b"c2")
    assert observer.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert get_all(observer, q) == [b"c1", b"c2"]


def test_tx_commit_and_rollback_of_acks(conn):
    setup = conn.channel()
    q = temp_queue(setup)
    for i in range(3):
        setup.basic_publish("", q, str(i).encode())
    ch = conn.channel()
    ch.tx_select()
    m0 = ch.basic_get(q)[0]
    m1 = ch.basic_get(q)[0]
    ch.basic_ack(m0.delivery_tag)
    ch.tx_rollback()  # the ack is forgotten: m0 is still unacked
    ch.basic_ack(m1.delivery_tag)
    ch.tx_commit()
    ch.close()  # m0 (still unacked) is requeued; m1 was acked
    got = []
    while True:
        method, _p, body = setup.basic_get(q, auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    assert got == [(b"0", True), (b"2", False)]


def test_tx_reject_and_nack(conn):
    setup = conn.channel()
    q = temp_queue(setup)
    for i in range(2):
        setup.basic_publish("", q, str(i).encode())
    ch = conn.channel()
    ch.tx_select()
    m0 = ch.basic_get(q)[0]
    m1 = ch.basic_get(q)[0]
    ch.basic_reject(m0.delivery_tag, requeue=False)
    ch.basic_nack(m1.delivery_tag, requeue=True)
    assert setup.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert get_all(setup, q) == [b"1"]


def test_tx_ack_of_unknown_tag_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    with refused(406, "PRECONDITION_FAILED - unknown delivery tag 5"):
        ch.basic_ack(5)
        ch.tx_commit()


def test_tx_then_confirm_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    with refused(406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode"):
        ch.confirm_delivery()


def test_confirm_then_tx_is_406(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with refused(406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode"):
        ch.tx_select()


@pytest.mark.parametrize("op", ["commit", "rollback"])
def test_tx_commit_or_rollback_without_select_is_406(conn, op):
    ch = conn.channel()
    with refused(406, "PRECONDITION_FAILED - channel is not transactional"):
        ch.tx_commit() if op == "commit" else ch.tx_rollback()


def test_tx_publish_is_routed_at_publish_time(conn):
    """Like RabbitMQ: routing happens at basic.publish, enqueueing at tx.commit."""
    ch, admin = conn.channel(), conn.channel()
    x = unique("x")
    admin.exchange_declare(x, "fanout")
    early, late = temp_queue(admin), temp_queue(admin)
    admin.queue_bind(early, x)
    ch.tx_select()
    ch.basic_publish(x, "", b"m")
    admin.queue_bind(late, x)  # bound after the publish: not a destination
    admin.exchange_delete(x)  # deleted before the commit: the routing already happened
    ch.tx_commit()
    assert (get_all(admin, early), get_all(admin, late)) == ([b"m"], [])


def test_tx_mandatory_return_at_commit(conn):
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, method, _p, body: returns.append((method.reply_code, body)))
    ch.tx_select()
    ch.basic_publish("amq.direct", unique("nobody"), b"unroutable", mandatory=True)
    ch.tx_commit()
    drain(conn, returns, 1)
    assert returns == [(312, b"unroutable")]


# ---------------------------------------------------------------------------------------------------
# limits and refused publishes


def test_max_message_size(limited_server):
    conn = connect(limited_server.amqp_port)
    try:
        ch = conn.channel()
        q = temp_queue(ch)
        ch.basic_publish("", q, b"x" * 1024)  # at the limit: fine
        with refused(406, "PRECONDITION_FAILED - message size 2000 is larger than configured max size "
                          "1024"):
            ch.basic_publish("", q, b"x" * 2000)
            ch.queue_declare("", exclusive=True)
        ch = conn.channel()
        assert get_all(ch, q) == [b"x" * 1024]
    finally:
        conn.close()


def test_immediate_is_540(server):
    with raw_session(server.amqp_port) as raw:
        raw.publish(1, "", "q", b"now", immediate=True)
        close = raw.expect_connection_close(540)
        assert close.reply_text == "NOT_IMPLEMENTED - immediate=true"
        assert (close.class_id, close.method_id) == (60, 40)


def test_user_id_must_match(conn):
    ch = conn.channel()
    q = temp_queue(ch)
    ch.basic_publish("", q, b"me", pika.BasicProperties(user_id="guest"))
    assert get_all(ch, q) == [b"me"]
    with refused(406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was "
                      "'guest'"):
        ch.basic_publish("", q, b"spoof", pika.BasicProperties(user_id="mallory"))
        ch.queue_declare("", exclusive=True)


def test_invalid_expiration_is_406(conn):
    ch = conn.channel()
    with refused(406) as r:
        ch.basic_publish("", "q", b"", pika.BasicProperties(expiration="soon"))
        ch.queue_declare("", exclusive=True)
    assert r.text.startswith("PRECONDITION_FAILED - invalid expiration 'soon'")


# ---------------------------------------------------------------------------------------------------
# content


def test_large_body_split_across_small_frames(server):
    conn = connect(server.amqp_port, frame_max=4096)
    try:
        assert conn._impl.params.frame_max == 4096
        ch = conn.channel()
        q = temp_queue(ch)
        body = bytes(range(256)) * 4096  # 1 MiB in ~257 body frames each way
        props = pika.BasicProperties(content_type="application/octet-stream", headers={"n": 1})
        ch.confirm_delivery()
        ch.basic_publish("", q, body, props)
        received = []
        ch.basic_consume(q, lambda _c, m, p, b: received.append((p, b)), auto_ack=True)
        drain(conn, received, 1, timeout=20)
        got_props, got_body = received[0]
        assert len(got_body) == len(body) and got_body == body
        assert (got_props.content_type, got_props.headers) == ("application/octet-stream", {"n": 1})
    finally:
        conn.close()


@pytest.mark.parametrize("body", [b"", b"\x00", bytes(range(256)), b"\xce" * 10, b"y" * 131072])
def test_body_round_trip(ch, body):
    q = temp_queue(ch)
    ch.basic_publish("", q, body)
    assert get_all(ch, q) == [body]


def test_persistent_message_properties(ch):
    q = unique("durable")
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"p", pika.BasicProperties(delivery_mode=2))
    _m, props, body = ch.basic_get(q, auto_ack=True)
    assert (props.delivery_mode, body) == (2, b"p")
    ch.queue_delete(q)


# ---------------------------------------------------------------------------------------------------
# sender-selected distribution


def test_cc_and_bcc(ch):
    qa, qb, qc = temp_queue(ch), temp_queue(ch), temp_queue(ch)
    for q, key in ((qa, "a"), (qb, "b"), (qc, "c")):
        ch.queue_bind(q, "amq.direct", key)
    headers = {"CC": ["b"], "BCC": ["c"], "keep": "me"}
    ch.basic_publish("amq.direct", "a", b"ssd", pika.BasicProperties(headers=headers))
    for q in (qa, qb, qc):
        method, props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"ssd"
        assert method.routing_key == "a"  # the publish routing key, not the CC/BCC key
        assert props.headers == {"CC": ["b"], "keep": "me"}  # BCC is stripped


def test_cc_through_default_exchange(ch):
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_publish("", q1, b"both", pika.BasicProperties(headers={"CC": [q2]}))
    assert (get_all(ch, q1), get_all(ch, q2)) == ([b"both"], [b"both"])


def test_cc_duplicates_deliver_once(ch):
    q = temp_queue(ch)
    ch.queue_bind(q, "amq.direct", "k1")
    ch.queue_bind(q, "amq.direct", "k2")
    ch.basic_publish("amq.direct", "k1", b"once", pika.BasicProperties(headers={"CC": ["k2"], "BCC": ["k1"]}))
    assert get_all(ch, q) == [b"once"]


# ---------------------------------------------------------------------------------------------------
# Direct Reply-To


def test_direct_reply_to_rpc_round_trip(server):
    service_ready = threading.Event()
    stop = threading.Event()
    request_q = unique("rpc")
    seen_reply_to = []
    errors = []

    def service() -> None:
        try:
            sconn = connect(server.amqp_port)
            sch = sconn.channel()
            sch.queue_declare(request_q, auto_delete=True)

            def on_request(ch, method, props, body):
                seen_reply_to.append(props.reply_to)
                ch.basic_publish("", props.reply_to, body.upper(),
                                 pika.BasicProperties(correlation_id=props.correlation_id))
                ch.basic_ack(method.delivery_tag)

            sch.basic_consume(request_q, on_request)
            service_ready.set()
            while not stop.is_set():
                sconn.process_data_events(time_limit=0.05)
            sconn.close()
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
            service_ready.set()

    thread = threading.Thread(target=service, daemon=True)
    thread.start()
    try:
        assert service_ready.wait(10)
        conn = connect(server.amqp_port)
        try:
            ch = conn.channel()
            replies = []
            ch.basic_consume("amq.rabbitmq.reply-to", lambda _c, m, p, b: replies.append((m, p, b)),
                             auto_ack=True)
            for i in range(3):
                ch.basic_publish("", request_q, f"ping{i}".encode(),
                                 pika.BasicProperties(reply_to="amq.rabbitmq.reply-to",
                                                      correlation_id=str(i)))
            drain(conn, replies, 3, timeout=10)
            assert [(p.correlation_id, b) for _m, p, b in replies] == [
                ("0", b"PING0"), ("1", b"PING1"), ("2", b"PING2")]
            assert not any(m.redelivered for m, _p, _b in replies)
        finally:
            conn.close()
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors
    assert all(r.startswith("amq.rabbitmq.reply-to.") and len(r) > 22 for r in seen_reply_to)
    assert len(set(seen_reply_to)) == 1


def test_direct_reply_to_requires_consumer(conn):
    ch = conn.channel()
    with refused(406, "PRECONDITION_FAILED - fast reply consumer does not exist"):
        ch.basic_publish("", "q", b"", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        ch.queue_declare("", exclusive=True)


def test_direct_reply_to_requires_no_ack(conn):
    ch = conn.channel()
    with refused(406):
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)


@pytest.mark.parametrize("passive", [True, False])
def test_declaring_the_reply_to_pseudo_queue_is_ok(ch, passive):
    # faststream and others declare it (passively) before consuming, as RabbitMQ allows
    ok = ch.queue_declare("amq.rabbitmq.reply-to", passive=passive).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("amq.rabbitmq.reply-to", 0, 1)


def test_passive_declare_of_reply_to_address_tracks_the_requester(server, conn):
    requester = connect(server.amqp_port)
    rch = requester.channel()
    rch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    q = temp_queue(rch)
    rch.basic_publish("", q, b"req", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    _m, props, _b = rch.basic_get(q, auto_ack=True)
    address = props.reply_to
    assert address.startswith("amq.rabbitmq.reply-to.")
    assert conn.channel().queue_declare(address, passive=True).method.queue == address
    requester.close()
    with refused(404):
        conn.channel().queue_declare(address, passive=True)


def test_direct_reply_to_unknown_token_is_dropped(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "amq.rabbitmq.reply-to.nosuchtoken", b"lost")
    assert ch.is_open


# ---------------------------------------------------------------------------------------------------
# field tables


def _lstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _entry(key: str, value: bytes) -> bytes:
    return bytes((len(key),)) + key.encode() + value


def _table(*entries: bytes) -> bytes:
    return _lstr(b"".join(entries))


# one entry per field type letter RabbitMQ knows, written byte by byte (independent of any codec)
ALL_TYPES = [
    _entry("bool", b"t\x01"),
    _entry("int8", b"b" + struct.pack(">b", -5)),
    _entry("uint8", b"B" + struct.pack(">B", 250)),
    _entry("int16", b"s" + struct.pack(">h", -300)),
    _entry("uint16", b"u" + struct.pack(">H", 65000)),
    _entry("int32", b"I" + struct.pack(">i", -70000)),
    _entry("uint32", b"i" + struct.pack(">I", 4_000_000_000)),
    _entry("int64", b"l" + struct.pack(">q", -(2**40))),
    _entry("int64L", b"L" + struct.pack(">q", 2**40)),
    _entry("float", b"f" + struct.pack(">f", 1.5)),
    _entry("double", b"d" + struct.pack(">d", 2.25)),
    _entry("decimal", b"D" + struct.pack(">Bi", 2, 12345)),
    _entry("longstr", b"S" + _lstr("héllo".encode())),
    _entry("bytes", b"x" + _lstr(b"\x00\xff\xce")),
    _entry("timestamp", b"T" + struct.pack(">Q", 1_700_000_000)),
    _entry("table", b"F" + _table(_entry("inner", b"I" + struct.pack(">i", 7)), _entry("v", b"V"))),
    _entry("array", b"A" + _lstr(b"I" + struct.pack(">i", 1) + b"S" + _lstr(b"two") + b"t\x00")),
    _entry("void", b"V"),
]


def _props_with_headers(table: bytes) -> bytes:
    return struct.pack(">H", spec.FLAG_HEADERS) + table


def _publish_raw_props(raw, exchange: str, key: str, raw_props: bytes, body: bytes) -> None:
    raw.send_method(1, spec.Basic.Publish(exchange=exchange, routing_key=key))
    raw.send_frame(spec.FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, len(body)) + raw_props)
    raw.send_frame(spec.FRAME_BODY, 1, body)


def _get_raw_props(raw, queue: str) -> bytes:
    raw.send_method(1, spec.Basic.Get(queue=queue, no_ack=True))
    raw.expect(spec.Basic.GetOk, 1)
    ftype, _ch, payload = raw.recv_frame()
    assert ftype == spec.FRAME_HEADER
    raw.recv_frame()  # body
    return payload[12:]


@pytest.mark.parametrize("via", ["default", "headers"])
def test_every_field_type_round_trips_byte_exact(server, via):
    table = _table(*ALL_TYPES)
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        if via == "headers":  # the headers exchange must decode the table to route
            raw.rpc(1, spec.Queue.Bind(queue=q, exchange="amq.headers",
                                       arguments={"x-match": "any", "bool": True}), spec.Queue.BindOk)
            _publish_raw_props(raw, "amq.headers", "", _props_with_headers(table), b"b")
        else:
            _publish_raw_props(raw, "", q, _props_with_headers(table), b"b")
        assert _get_raw_props(raw, q) == _props_with_headers(table)


def test_every_field_type_decodes_equal_in_pika_after_bcc_rewrite(server, conn):
    """With BCC present the broker must rewrite the headers; every value must read the same in pika."""
    sent = _table(*ALL_TYPES)
    with_bcc = _table(*ALL_TYPES, _entry("BCC", b"A" + _lstr(b"S" + _lstr(b"nobody"))))
    ch = conn.channel()
    q = temp_queue(ch)
    with raw_session(server.amqp_port) as raw:
        _publish_raw_props(raw, "", q, _props_with_headers(with_bcc), b"b")
        raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk)
    _m, props, _b = ch.basic_get(q, auto_ack=True)
    expected, _ = pika.data.decode_table(sent, 0)
    assert props.headers == expected


def test_bcc_rewrite_keeps_field_type_letters(server):
    sent = _table(*ALL_TYPES)
    with_bcc = _table(*ALL_TYPES, _entry("BCC", b"A" + _lstr(b"S" + _lstr(b"nobody"))))
    with raw_session(server.amqp_port) as raw:
        q = raw.rpc(1, spec.Queue.Declare(queue="", exclusive=True), spec.Queue.DeclareOk).queue
        _publish_raw_props(raw, "", q, _props_with_headers(with_bcc), b"b")
        assert _get_raw_props(raw, q) == _props_with_headers(sent)


PIKA_HEADERS = {
    "str": "text ünïcode", "bytes": b"\x00\x01", "true": True, "false": False, "int": 42,
    "negative": -7, "big": 2**40, "decimal": Decimal("3.14"),
    "timestamp": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "none": None,
    "table": {"nested": {"deep": [1, "two", {"three": 3}]}}, "array": [1, "a", True, None, [2]],
    "empty_table": {}, "empty_array": [],
}


@pytest.mark.parametrize("bcc", [False, True])
def test_pika_headers_round_trip(ch, bcc):
    q = temp_queue(ch)
    headers = dict(PIKA_HEADERS)
    if bcc:
        headers["BCC"] = [unique("nobody")]
    ch.basic_publish("", q, b"h", pika.BasicProperties(headers=headers))
    _m, props, _b = ch.basic_get(q, auto_ack=True)
    assert props.headers == PIKA_HEADERS
