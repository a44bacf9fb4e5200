"""hutch.cluster.wire: framing (whole, byte at a time, split anywhere, trailing garbage, limits), batches,
and the handshake wired back to back, with no sockets and no event loop."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster import wire
from hutch.cluster.wire import (
    HANDSHAKE_MAX_FRAME_BYTES,
    HEARTBEAT_FRAME,
    FrameDecoder,
    FrameTooLarge,
    Handshake,
    HandshakeFailed,
    HandshakeState,
    MalformedFrame,
    Reason,
    Role,
)

SECRET = b"s3cr3t-cookie-value"

# msgpack values as they come back: lists (never tuples), str keys or int keys, no NaN (NaN != NaN)
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
            | st.floats(allow_nan=False) | st.text(max_size=40) | st.binary(max_size=40))
values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=10) | st.integers(-1000, 1000), children, max_size=6),
    max_leaves=30,
)


def feed_all(decoder: FrameDecoder, data: bytes, chunk: int) -> list:
    out = []
    for i in range(0, len(data), chunk):
        out.extend(decoder.feed(data[i : i + chunk]))
    return out


# -- framing ---------------------------------------------------------------------------------------


def test_frame_layout_is_length_then_msgpack():
    frame = wire.encode_frame({"a": 1})
    payload = msgpack.packb({"a": 1}, use_bin_type=True)
    assert frame == struct.pack(">I", len(payload)) + payload


def test_whole_byte_at_a_time_and_many_frames_in_one_chunk():
    objs = [1, "two", b"three", [4, {"five": 5}], {7: None}]
    data = b"".join(wire.encode_frame(o) for o in objs)
    assert FrameDecoder(1 << 20).feed(data) == objs
    assert feed_all(FrameDecoder(1 << 20), data, 1) == objs
    dec = FrameDecoder(1 << 20)
    assert dec.feed(data[:3]) == []
    assert dec.buffered_bytes == 3


@settings(max_examples=75, deadline=None)  # `make test`; the 150 of the long run below are in the slow set
@given(st.lists(values, min_size=1, max_size=5), st.integers(min_value=1, max_value=64))
def test_round_trip_in_any_chunking(objs, chunk):
    data = b"".join(wire.encode_frame(o) for o in objs)
    assert FrameDecoder(1 << 20).feed(data) == objs
    assert feed_all(FrameDecoder(1 << 20), data, chunk) == objs
    assert feed_all(FrameDecoder(1 << 20), data, 1) == objs


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 150 examples
@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=1, max_size=5), st.integers(min_value=1, max_value=64))
def test_round_trip_in_any_chunking_long(objs, chunk):
    test_round_trip_in_any_chunking.hypothesis.inner_test(objs, chunk)


@settings(max_examples=50, deadline=None)  # `make test`; the 100 of the long run below are in the slow set
@given(st.lists(values, max_size=40))
def test_batches_of_pre_packed_entries_decode_as_arrays(objs):
    entries = [wire.pack_message(o) for o in objs]
    frame = wire.encode_batch(entries)
    assert FrameDecoder(1 << 20).feed(frame) == [[[wire.MESSAGE, o] for o in objs]]


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 100 examples
@settings(max_examples=100, deadline=None)
@given(st.lists(values, max_size=40))
def test_batches_of_pre_packed_entries_decode_as_arrays_long(objs):
    test_batches_of_pre_packed_entries_decode_as_arrays.hypothesis.inner_test(objs)


def test_batch_header_array_sizes():
    for n in (0, 1, 15, 16, 65535, 65536):
        entries = [wire.pack_message(None)] * n
        (decoded,) = FrameDecoder(1 << 22).feed(wire.encode_batch(entries))
        assert len(decoded) == n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(min_value=320, max_value=2000))
def test_batch_parts_split_at_the_frame_size_and_keep_order(blobs, frame_bytes):
    entries = [wire.pack_message(b) for b in blobs]
    data = b"".join(wire.batch_parts(entries, frame_bytes))
    dec = FrameDecoder(frame_bytes - 4)  # the decoder's limit counts the payload only
    frames = dec.feed(data)
    assert [e for frame in frames for e in frame] == [[wire.MESSAGE, b] for b in blobs]
    assert all(frames) or len(frames) == 1  # no empty frame, except for an empty batch
    if sum(map(len, entries)) + wire.BATCH_OVERHEAD_BYTES <= frame_bytes:
        assert len(frames) == 1


def test_entry_kinds():
    dec = FrameDecoder(1 << 20)
    frame = wire.encode_batch([wire.pack_message("m"), wire.pack_request(7, {"q": 1}),
                               wire.pack_reply(7, [1]), wire.pack_error(8, "KeyError", "'k'")])
    assert dec.feed(frame) == [[[0, "m"], [1, 7, {"q": 1}], [2, 7, [1]], [3, 8, "KeyError", "'k'"]]]


def test_heartbeat_is_an_empty_batch():
    assert FrameDecoder(100).feed(HEARTBEAT_FRAME) == [[]]


def test_oversize_frame_is_refused_from_its_header_and_the_decoder_stays_broken():
    dec = FrameDecoder(100)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">I", 101))  # the header alone: the payload is never buffered
    with pytest.raises(FrameTooLarge):
        dec.feed(wire.encode_frame(1))
    assert FrameDecoder(100).feed(wire.encode_frame(b"x" * 90)) == [b"x" * 90]


def test_the_error_carries_the_good_frames_that_came_before_the_bad_one():
    dec = FrameDecoder(100)
    with pytest.raises(FrameTooLarge) as ei:
        dec.feed(wire.encode_frame(1) + wire.encode_frame(2) + struct.pack(">I", 1000))
    assert ei.value.values == [1, 2]
    with pytest.raises(FrameTooLarge) as ei:
        dec.feed(wire.encode_frame(3))  # still broken, and nothing more comes out of it
    assert ei.value.values == []
    with pytest.raises(MalformedFrame) as ei2:
        FrameDecoder(100).feed(wire.encode_frame("a") + b"\x00\x00\x00\x01\xc1")
    assert ei2.value.values == ["a"]


@pytest.mark.parametrize("payload", [
    b"",  # zero-length frame
    b"\xc1",  # never-used msgpack byte
    b"\x92\x01",  # array of 2 with one element
    b"\x01\x02",  # trailing bytes inside the frame
    b"\xa2\xff\xfe",  # invalid UTF-8 in a str
    b"\x81\x91\x01\x01",  # map with an unhashable (list) key
])
def test_garbled_payloads_raise_malformed_frame(payload):
    with pytest.raises(MalformedFrame):
        FrameDecoder(100).feed(struct.pack(">I", len(payload)) + payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_wire_errors(data):
    dec = FrameDecoder(64)
    try:
        feed_all(dec, data, 7)
    except wire.WireError:
        pass


def test_trailing_garbage_after_good_frames():
    dec = FrameDecoder(100)
    assert dec.feed(wire.encode_frame("ok") + b"\x00\x00") == ["ok"]
    with pytest.raises(MalformedFrame):
        dec.feed(b"\x00\x01\xc1")


def test_non_msgpackable_value_raises_type_error_when_packed():
    with pytest.raises(TypeError):
        wire.pack_message(object())
    assert wire.pack_message(1) == b"\x92\x00\x01"  # the packer is usable after the failure


# -- handshake -------------------------------------------------------------------------------------


def make_pair(dialler_secret=SECRET, acceptor_secret=SECRET, dialler="n1", acceptor="n2", expected="n2"):
    d = Handshake(Role.DIALLER, node=dialler, secret=dialler_secret, nonce=b"d" * 32, host="10.0.0.1",
                  port=1111, max_frame_bytes=1 << 20, expected_node=expected)
    a = Handshake(Role.ACCEPTOR, node=acceptor, secret=acceptor_secret, nonce=b"a" * 32, host="10.0.0.2",
                  port=2222, max_frame_bytes=1 << 16)
    return d, a


def one(frame: bytes):
    (obj,) = FrameDecoder(HANDSHAKE_MAX_FRAME_BYTES).feed(frame)
    return obj


def run_handshake(d: Handshake, a: Handshake) -> list[bytes]:
    """Wire the two back to back; returns every frame written (both directions)."""
    written = [d.start()]
    written.append(a.receive(one(written[-1])))  # acceptor's hello
    written.append(d.receive(one(written[-1])))  # dialler's proof
    assert a.receive(one(written[-1])) is None
    assert a.state is HandshakeState.VERIFIED
    written.append(a.accept())  # welcome
    assert d.receive(one(written[-1])) is None
    return written


def test_handshake_ok_both_sides_learn_each_other():
    d, a = make_pair()
    frames = run_handshake(d, a)
    assert d.done and a.done
    assert (d.peer.node, d.peer.host, d.peer.port, d.peer.max_frame_bytes) == ("n2", "10.0.0.2", 2222, 1 << 16)
    assert (a.peer.node, a.peer.host, a.peer.port) == ("n1", "10.0.0.1", 1111)
    assert all(len(f) < HANDSHAKE_MAX_FRAME_BYTES for f in frames)


def test_secret_never_crosses_the_wire():
    d, a = make_pair()
    frames = b"".join(run_handshake(d, a))
    assert SECRET not in frames
    assert SECRET.hex().encode() not in frames


def test_proofs_differ_per_direction_and_per_nonce():
    d, a = make_pair()
    run_handshake(d, a)
    dp = wire.dialler_proof(SECRET, d.hello, a.hello)
    ap = wire.acceptor_proof(SECRET, d.hello, a.hello)
    assert dp != ap  # a proof cannot be reflected back as the other side's
    other = wire.Hello("n1", "10.0.0.1", 1111, b"e" * 32, 1 << 20)
    assert wire.dialler_proof(SECRET, other, a.hello) != dp


def test_wrong_secret_refused_by_the_acceptor_with_a_refused_reply():
    d, a = make_pair(dialler_secret=b"wrong")
    proof = d.receive(one(a.receive(one(d.start()))))
    with pytest.raises(HandshakeFailed) as ei:
        a.receive(one(proof))
    assert ei.value.reason is Reason.SECRET and not ei.value.by_peer
    assert a.state is HandshakeState.FAILED
    # the dialler reads the refusal
    with pytest.raises(HandshakeFailed) as ei2:
        d.receive(one(ei.value.reply))
    assert ei2.value.reason is Reason.SECRET and ei2.value.by_peer


def test_bad_welcome_detected_by_the_dialler():
    d, a = make_pair()
    d.receive(one(a.receive(one(d.start()))))
    with pytest.raises(HandshakeFailed) as ei:
        d.receive({"t": "welcome", "mac": b"\x00" * 32})
    assert ei.value.reason is Reason.SECRET and not ei.value.by_peer and ei.value.reply is not None
    # a mac of the wrong type or length is just as wrong
    d, a = make_pair()
    d.receive(one(a.receive(one(d.start()))))
    with pytest.raises(HandshakeFailed):
        d.receive({"t": "welcome", "mac": "text"})


def test_replayed_proof_from_another_session_fails():
    d1, a1 = make_pair()
    frames = run_handshake(d1, a1)
    d2, a2 = make_pair()
    a2.hello = wire.Hello("n2", "10.0.0.2", 2222, b"b" * 32, 1 << 16)  # a fresh acceptor nonce
    a2.receive(one(d2.start()))
    with pytest.raises(HandshakeFailed) as ei:
        a2.receive(one(frames[2]))  # the proof recorded from the first session
    assert ei.value.reason is Reason.SECRET


def test_name_clash_is_refused_by_either_side():
    d, a = make_pair(dialler="n2", expected=None)
    with pytest.raises(HandshakeFailed) as ei:
        a.receive(one(d.start()))
    assert ei.value.reason is Reason.NAME_CLASH
    d, _ = make_pair(expected=None)
    d.start()
    with pytest.raises(HandshakeFailed) as ei:  # an acceptor claiming the dialler's own name
        d.receive(wire.Hello("n1", "10.0.0.2", 2222, b"a" * 32, 1 << 16).to_wire())
    assert ei.value.reason is Reason.NAME_CLASH


def test_dialler_refuses_an_unexpected_node():
    d, a = make_pair(expected="n9")
    with pytest.raises(HandshakeFailed) as ei:
        d.receive(one(a.receive(one(d.start()))))
    assert ei.value.reason is Reason.UNEXPECTED_NODE and "n9" in str(ei.value)


@pytest.mark.parametrize("msg", [
    {"t": "proof", "mac": b"x" * 32},  # proof before hello
    {"t": "hello"},  # fields missing
    {"t": "hello", "proto": "amqp"},
    [1, 2, 3],
    "hello",
])
def test_bad_first_message_fails_with_protocol_or_version(msg):
    _, a = make_pair()
    with pytest.raises(HandshakeFailed) as ei:
        a.receive(msg)
    assert ei.value.reason is Reason.PROTOCOL


def test_version_mismatch():
    d, a = make_pair()
    hello = one(d.start())
    hello["v"] = 99
    with pytest.raises(HandshakeFailed) as ei:
        a.receive(hello)
    assert ei.value.reason is Reason.VERSION


def test_out_of_range_hello_fields():
    d, a = make_pair()
    hello = one(d.start())
    hello["nonce"] = b"short"
    with pytest.raises(HandshakeFailed):
        a.receive(hello)
    hello = one(wire.encode_frame(d.hello.to_wire()))
    hello["port"] = True  # bool is not an int here
    with pytest.raises(HandshakeFailed):
        make_pair()[1].receive(hello)


def test_refused_from_the_peer_is_reported_as_by_peer():
    d, _ = make_pair()
    d.start()
    with pytest.raises(HandshakeFailed) as ei:
        d.receive(one(wire.encode_refused(Reason.DUPLICATE, "x")))
    assert ei.value.by_peer and ei.value.reason is Reason.DUPLICATE
    d, _ = make_pair()
    d.start()
    with pytest.raises(HandshakeFailed) as ei:
        d.receive({"t": "refused", "reason": "no-such-reason"})
    assert ei.value.reason is Reason.PROTOCOL


def test_empty_secret_rejected():
    with pytest.raises(ValueError):
        make_pair(dialler_secret=b"")
