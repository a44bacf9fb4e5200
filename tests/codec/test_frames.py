"""The framer: bytes in, frames out (whole, byte at a time, with a trailing partial frame), its limits
and errors, and body splitting by frame_max in both directions (hutch <-> pamqp).
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from hutch.amqp import spec
from hutch.amqp.errors import FRAME_ERROR, ConnectionError_, FrameError
from hutch.amqp.frames import (
    HEARTBEAT_FRAME,
    append_body,
    content_frames,
    method_frame,
    method_frame_raw,
)
from hutch.amqp.speedups import FrameReader  # the compiled reader when built, the pure one with HUTCH_PURE=1

from .support import ci_settings, sample_properties

Frame = tuple[int, int, bytes]
FRAME_MAX = 131072


def frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def parse(raw: bytes) -> Frame:
    """Read one frame independently of FrameReader (used to build expectations)."""
    ftype, channel, size = struct.unpack_from(">BHI", raw)
    assert len(raw) == 7 + size + 1 and raw[-1] == 0xCE
    return ftype, channel, raw[7:-1]


def drain(reader: FrameReader) -> list[Frame]:
    return list(reader.frames())


def build_stream() -> list[bytes]:
    props = sample_properties()
    frames = [
        method_frame(0, spec.Connection.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=60)),
        method_frame(1, spec.Basic.Publish(exchange="amq.topic", routing_key="a.b", mandatory=True)),
    ]
    frames += _split(content_frames(1, 60, props.encode(), b"x" * 10_000, 4096))
    frames += [
        HEARTBEAT_FRAME,
        method_frame(65535, spec.Basic.Ack(delivery_tag=2**64 - 1, multiple=True)),
        frame(spec.FRAME_BODY, 7, b""),  # a peer may send an empty body frame
        method_frame(2, spec.Queue.Declare(queue="q", arguments={"x-queue-type": "quorum"})),
    ]
    return frames


def _split(parts: list[bytes]) -> list[bytes]:
    """content_frames returns header, payload and end octet as separate parts: join per frame."""
    assert len(parts) % 3 == 0
    return [b"".join(parts[i:i + 3]) for i in range(0, len(parts), 3)]


STREAM = build_stream()
WIRE = b"".join(STREAM)
EXPECTED = [parse(f) for f in STREAM]
NEXT = method_frame(3, spec.Basic.Consume(queue="q", consumer_tag="ctag"))


def test_stream_is_what_pamqp_sees() -> None:
    for raw in STREAM:
        if parse(raw)[2] == b"" and raw != HEARTBEAT_FRAME:
            continue  # pamqp refuses empty non-heartbeat frames ("No frame size")
        consumed, channel, _ = pamqp_frame.unmarshal(raw + NEXT)
        assert consumed == len(raw) and channel == parse(raw)[1]


# ---------------------------------------------------------------------------------------------------
# Feeding


def test_whole() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE)
    assert drain(reader) == EXPECTED
    assert reader.buffered == 0
    assert drain(reader) == []


def test_one_byte_at_a_time() -> None:
    reader = FrameReader(FRAME_MAX)
    ends = [sum(len(f) for f in STREAM[: i + 1]) for i in range(len(STREAM))]
    got: list[Frame] = []
    for i in range(len(WIRE)):
        reader.feed(WIRE[i : i + 1])
        new = drain(reader)
        # A frame comes out exactly when its end octet arrives, and not before.
        assert len(new) == (1 if i + 1 in ends else 0), i
        got += new
        assert reader.buffered == i + 1 - (max((e for e in ends if e <= i + 1), default=0))
    assert got == EXPECTED


@pytest.mark.parametrize("k", range(1, len(NEXT)))
def test_trailing_partial_frame_stays_buffered(k: int) -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE + NEXT[:k])
    assert drain(reader) == EXPECTED
    assert reader.buffered == k
    assert drain(reader) == []
    assert reader.buffered == k
    reader.feed(NEXT[k:])
    assert drain(reader) == [parse(NEXT)]
    assert reader.buffered == 0


def test_many_frames_in_one_feed() -> None:
    one = method_frame(1, spec.Basic.Ack(delivery_tag=1)) + HEARTBEAT_FRAME
    reader = FrameReader(FRAME_MAX)
    reader.feed(one * 10_000)
    frames = drain(reader)
    assert len(frames) == 20_000
    assert frames[-2:] == [parse(one[:-8]), (spec.FRAME_HEARTBEAT, 0, b"")]
    assert reader.buffered == 0


def test_feeds_accept_bytes_like_objects() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(bytearray(WIRE[:100]))
    reader.feed(memoryview(WIRE)[100:])
    assert drain(reader) == EXPECTED


def test_an_abandoned_iterator_loses_nothing() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE)
    iterator = reader.frames()
    assert next(iterator) == EXPECTED[0]
    del iterator  # e.g. the handler raised after the first frame
    assert drain(reader) == EXPECTED[1:]


def test_feeding_while_an_iterator_is_suspended() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE)
    iterator = reader.frames()
    first = [next(iterator), next(iterator)]
    reader.feed(NEXT)  # compacts the buffer under the suspended iterator
    assert first + list(iterator) == EXPECTED + [parse(NEXT)]



def test_a_large_frame_fed_in_small_pieces_is_not_copied_per_feed() -> None:
    """Issue 15 finding 14: the partial frame moves once into a bytearray that later feeds extend in
    place; the reader never rebuilds the whole buffer per feed (which made a slow frame quadratic)."""
    body = bytes(range(256)) * 512  # 128 KiB
    raw = WIRE + frame(spec.FRAME_BODY, 3, body)
    reader = FrameReader(0)
    reader.feed(raw[: len(WIRE) + 10])
    assert drain(reader) == EXPECTED
    reader.feed(raw[len(WIRE) + 10 : len(WIRE) + 20])  # the 10 bytes left over move once
    held = reader._buf
    assert isinstance(held, bytearray) and len(held) == 20
    for i in range(len(WIRE) + 20, len(raw) - 1, 1000):
        reader.feed(raw[i : min(i + 1000, len(raw) - 1)])
        assert reader._buf is held  # appended in place
        assert drain(reader) == []
    reader.feed(raw[-1:])
    assert drain(reader) == [(spec.FRAME_BODY, 3, body)]
    reader.feed(raw[:5])
    reader.feed(raw[5:])
    frames = drain(reader)
    assert frames[-1] == (spec.FRAME_BODY, 3, body) and all(type(p) is bytes for _, _, p in frames)


def test_consumed_front_of_the_bytearray_is_dropped() -> None:
    one = method_frame(1, spec.Basic.Ack(delivery_tag=1))
    reader = FrameReader(FRAME_MAX)
    reader.feed(one[:3])
    reader.feed(one[3:] + one * 50 + one[:3])  # complete frames followed by a partial one
    assert len(drain(reader)) == 51
    reader.feed(one[3:])
    assert len(reader._buf) == len(one)  # the consumed front went with the feed
    assert drain(reader) == [parse(one)]

@ci_settings(max_examples=200)
@given(st.lists(st.integers(0, len(WIRE)), max_size=40), st.booleans())
def test_any_chunking_gives_the_same_frames(cuts: list[int], drain_every_time: bool) -> None:
    points = [0, *sorted(cuts), len(WIRE)]
    reader = FrameReader(FRAME_MAX)
    got: list[Frame] = []
    for a, b in zip(points, points[1:], strict=False):
        reader.feed(WIRE[a:b])
        if drain_every_time:
            got += drain(reader)
    got += drain(reader)
    assert got == EXPECTED
    assert reader.buffered == 0


def test_heartbeat_frame_constant() -> None:
    assert pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0) == HEARTBEAT_FRAME
    assert parse(HEARTBEAT_FRAME) == (spec.FRAME_HEARTBEAT, 0, b"")


def test_method_frame_raw_is_method_frame() -> None:
    method = spec.Basic.Qos(prefetch_count=10, global_=True)
    assert method_frame_raw(5, method.encode()) == method_frame(5, method)
    assert parse(method_frame(5, method)) == (spec.FRAME_METHOD, 5, method.encode())


# ---------------------------------------------------------------------------------------------------
# frame_max: judged from the 7-byte header, before the payload arrives


def assert_501(reader: FrameReader) -> FrameError:
    with pytest.raises(FrameError) as info:
        drain(reader)
    assert info.value.code == FRAME_ERROR
    assert isinstance(info.value, ConnectionError_)
    return info.value


@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
def test_frame_of_exactly_frame_max_is_accepted(frame_max: int) -> None:
    raw = frame(spec.FRAME_BODY, 1, b"b" * (frame_max - 8))
    assert len(raw) == frame_max
    reader = FrameReader(frame_max)
    reader.feed(raw)
    assert drain(reader) == [parse(raw)]


@pytest.mark.parametrize("ftype", [spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT])
@pytest.mark.parametrize("size", [4096 - 7, 4096, 2**31, 2**32 - 1])
def test_oversized_frame_is_501_from_the_header_alone(ftype: int, size: int) -> None:
    header = struct.pack(">BHI", ftype, 1, size)
    reader = FrameReader(4096)
    for byte in header[:-1]:  # even arriving byte by byte: nothing until the header is complete
        reader.feed(bytes([byte]))
        assert drain(reader) == []
    reader.feed(header[-1:])  # no payload at all yet
    err = assert_501(reader)
    assert "4096" in err.text


def test_oversized_frame_after_good_frames_yields_the_good_ones_first() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE + struct.pack(">BHI", spec.FRAME_BODY, 1, FRAME_MAX))
    iterator = reader.frames()
    assert [next(iterator) for _ in EXPECTED] == EXPECTED
    with pytest.raises(FrameError):
        next(iterator)


def test_frame_max_zero_means_no_limit() -> None:
    raw = frame(spec.FRAME_BODY, 1, b"z" * (1 << 20))
    reader = FrameReader(0)
    reader.feed(raw)
    assert drain(reader) == [parse(raw)]


@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF, ord("A")])
def test_bad_frame_end_is_501(end: int) -> None:
    raw = frame(spec.FRAME_METHOD, 1, spec.Basic.Ack(delivery_tag=1).encode(), end=end)
    reader = FrameReader(FRAME_MAX)
    reader.feed(WIRE + raw[:-1])
    assert drain(reader) == EXPECTED  # the good frames first; the bad one is incomplete
    reader.feed(raw[-1:])
    assert_501(reader)


@pytest.mark.parametrize("ftype", [t for t in range(256) if t not in (1, 2, 3, 8)])
def test_unknown_frame_type_is_501_from_the_header_alone(ftype: int) -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(struct.pack(">BHI", ftype, 0, 4))
    assert_501(reader)


def test_a_protocol_header_mid_stream_is_501() -> None:
    reader = FrameReader(FRAME_MAX)
    reader.feed(spec.PROTOCOL_HEADER)
    assert_501(reader)



@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
def test_tolerance_accepts_exactly_that_many_bytes_over(frame_max: int) -> None:
    """RabbitMQ's rule (rabbit_reader's FRAME_SIZE_FUDGE = 8): a payload of up to frame_max bytes."""
    raw = frame(spec.FRAME_BODY, 1, b"b" * frame_max)
    reader = FrameReader(frame_max, tolerance=8)
    reader.feed(raw)
    assert drain(reader) == [parse(raw)]
    reader.feed(struct.pack(">BHI", spec.FRAME_BODY, 1, frame_max + 1))
    err = assert_501(reader)
    assert err.text == f"frame size {frame_max + 9} larger than negotiated maximum {frame_max}"

# ---------------------------------------------------------------------------------------------------
# Bodies split by frame_max, and reassembled


def reassemble(frames: list[Frame]) -> tuple[int, spec.BasicProperties, bytes, list[int]]:
    (htype, hchannel, header), *bodies = frames
    assert htype == spec.FRAME_HEADER
    class_id, weight, body_size = struct.unpack_from(">HHQ", header)
    assert (class_id, weight) == (60, 0)
    props = spec.BasicProperties.decode(header, 12)
    assert all(t == spec.FRAME_BODY and c == hchannel for t, c, _ in bodies)
    body = b"".join(p for _, _, p in bodies)
    assert len(body) == body_size
    return hchannel, props, body, [len(p) for _, _, p in bodies]


def body_sizes(frame_max: int) -> list[int]:
    chunk = frame_max - 8
    return sorted({0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 2 * chunk + 1, 3 * chunk + 17})


SPLIT_CASES = [(fm, n) for fm in (4096, 8192, FRAME_MAX) for n in body_sizes(fm)]


@pytest.mark.parametrize(("frame_max", "size"), SPLIT_CASES)
def test_content_frames_split_by_frame_max(frame_max: int, size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    props = sample_properties()
    wire = b"".join(content_frames(9, 60, props.encode(), body, frame_max))
    reader = FrameReader(frame_max)
    reader.feed(wire)
    frames = drain(reader)
    assert reader.buffered == 0
    channel, got_props, got_body, lengths = reassemble(frames)
    assert (channel, got_props, got_body) == (9, props, body)
    chunk = frame_max - 8
    assert len(lengths) == math.ceil(size / chunk)
    assert all(n == chunk for n in lengths[:-1])  # every frame but the last is full
    assert all(0 < n <= chunk for n in lengths)

    # pamqp reads the same header and body frames.
    offset, pieces = 0, []
    consumed, _, content_header = pamqp_frame.unmarshal(wire)
    assert isinstance(content_header, pamqp_header.ContentHeader)
    assert content_header.body_size == size
    offset += consumed
    while offset < len(wire):
        consumed, ch, content_body = pamqp_frame.unmarshal(wire[offset:])
        assert consumed <= frame_max and ch == 9
        pieces.append(content_body.value)
        offset += consumed
    assert b"".join(pieces) == body


def test_frame_max_zero_sends_one_body_frame() -> None:
    body = b"q" * 300_000
    wire = b"".join(content_frames(1, 60, b"\x00\x00", body, 0))
    reader = FrameReader(0)
    reader.feed(wire)
    assert reassemble(drain(reader))[2:] == (body, [300_000])


def test_append_body() -> None:
    out: list[bytes] = []
    append_body(out, 3, b"", 4096)
    assert out == []
    append_body(out, 3, b"abcdefghij", 12)  # 4 bytes per frame
    assert b"".join(out) == b"".join(frame(spec.FRAME_BODY, 3, p) for p in (b"abcd", b"efgh", b"ij"))


@ci_settings(max_examples=200)
@given(
    st.sampled_from([9, 10, 17, 100, 4096]),
    st.integers(0, 3 * 100),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_split_then_reassemble_property(frame_max: int, size: int, cuts: list[int]) -> None:
    body = bytes(i % 256 for i in range(size))
    wire = b"".join(content_frames(1, 60, b"\x00\x00", body, frame_max))
    reader = FrameReader(0 if frame_max < 14 + 8 else frame_max)  # the header frame itself is 22 bytes
    points = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    frames: list[Frame] = []
    for a, b in zip(points, points[1:], strict=False):
        reader.feed(wire[a:b])
        frames += drain(reader)
    _, _, got, lengths = reassemble(frames)
    assert got == body
    assert all(n + 8 <= frame_max for n in lengths)


@ci_settings(max_examples=150)
@given(st.lists(st.binary(min_size=1, max_size=300), max_size=8))
def test_hutch_reassembles_a_body_pamqp_split(pieces: list[bytes]) -> None:
    """The other direction: a peer's own split (any piece sizes within frame_max) reads back whole."""
    body = b"".join(pieces)
    theirs = pamqp_header.ContentHeader(0, len(body), None)
    header = pamqp_frame.marshal(theirs, 4)
    wire = header + b"".join(pamqp_frame.marshal(pamqp_body.ContentBody(p), 4) for p in pieces)
    reader = FrameReader(4096)
    reader.feed(wire)
    channel, got_props, got_body, lengths = reassemble(drain(reader))
    assert (channel, got_body, lengths) == (4, body, [len(p) for p in pieces])
    assert got_props == spec.BasicProperties()
