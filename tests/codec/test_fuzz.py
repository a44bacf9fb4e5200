"""Hostile input: random bytes and mutated valid frames never make the codec raise anything but a
connection-level `AMQPError` (501 FRAME_ERROR, 502 SYNTAX_ERROR, 503 COMMAND_INVALID or
505 UNEXPECTED_FRAME), so the broker always answers with Connection.Close and the right code.

Deterministic: every property runs derandomized with a fixed example budget (see `support.ci_settings`),
so CI sees the same inputs on every run. Multiply the budgets locally to search harder, e.g.
`HUTCH_FUZZ_SCALE=50 pytest tests/codec/test_fuzz.py` (derandomized still: same seed, more examples).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from hutch.amqp import spec
from hutch.amqp.errors import AMQPError, ConnectionError_
from hutch.amqp.frames import HEARTBEAT_FRAME, FrameReader, content_frames, method_frame
from hutch.amqp.table import decode_table

from .support import ALL_METHODS, ci_settings, sample_method, sample_properties

ALLOWED_CODES = {501, 502, 503, 505}
FRAME_MAX = 4096
SCALE = max(1, int(os.environ.get("HUTCH_FUZZ_SCALE", "1")))


def budget(n: int) -> Any:
    return ci_settings(max_examples=n * SCALE)


def only_connection_errors(call: Callable[[], Any]) -> AMQPError | None:
    """Run `call`; it may succeed or raise a connection-level AMQPError, nothing else."""
    try:
        call()
    except AMQPError as err:
        assert isinstance(err, ConnectionError_), repr(err)
        assert err.code in ALLOWED_CODES, repr(err)
        return err
    return None


def process(chunks: Iterable[bytes], frame_max: int = FRAME_MAX) -> None:
    """What the connection does with received bytes: frame, then decode each method / header."""
    reader = FrameReader(frame_max)

    def run() -> None:
        for chunk in chunks:
            reader.feed(chunk)
            for ftype, _channel, payload in reader.frames():
                if ftype == spec.FRAME_METHOD:
                    spec.decode_method(payload)
                elif ftype == spec.FRAME_HEADER:
                    spec.BasicProperties.decode(payload, 12)

    only_connection_errors(run)


# ---------------------------------------------------------------------------------------------------
# Corpus of valid frames


def _deep_arguments(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    body = b"\x01k" + inner
    return struct.pack(">I", len(body)) + body


def _frames() -> list[bytes]:
    corpus = [method_frame(1, sample_method(cls)) for cls in ALL_METHODS]
    corpus += [method_frame(2, cls()) for cls in ALL_METHODS]
    corpus.append(b"".join(content_frames(1, 60, sample_properties().encode(), b"body" * 30, 64)))
    corpus.append(b"".join(content_frames(1, 60, spec.BasicProperties(delivery_mode=2).encode(), b"", 0)))
    corpus.append(HEARTBEAT_FRAME)
    declare = spec.Queue.Declare(queue="q").encode()[:-4] + _deep_arguments(150)
    corpus.append(struct.pack(">BHI", 1, 1, len(declare)) + declare + b"\xce")
    return corpus


CORPUS = _frames()
PAYLOADS = [sample_method(cls).encode() for cls in ALL_METHODS]
PROPERTY_BLOBS = [sample_properties().encode(), spec.BasicProperties(headers={"a": [1, {"b": b"x"}]}).encode()]

INTERESTING_32 = [0, 1, 2, 7, 8, 255, 256, FRAME_MAX - 9, FRAME_MAX - 8, FRAME_MAX - 7, 2**31 - 1, 2**31, 2**32 - 1]
interesting_bytes = st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xCE, 0xFF]) | st.integers(0, 255)
interesting_u32 = st.sampled_from(INTERESTING_32) | st.integers(0, 2**32 - 1)


@st.composite
def mutate(draw: st.DrawFn, data: bytes, frame_starts: list[int] | None = None) -> bytes:
    """1-4 mutations: bit flips, byte overwrites, 32-bit length corruption, truncation, insertion,
    deletion, and (for streams) a frame-size field set to near its true value."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not buf:
            break
        op = draw(st.sampled_from(["flip", "set", "len32", "len8", "truncate", "insert", "delete", "size"]))
        pos = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            buf[pos] = draw(interesting_bytes)
        elif op == "len32":
            buf[pos : pos + 4] = struct.pack(">I", draw(interesting_u32))
        elif op == "len8":  # shortstr / key length
            buf[pos] = draw(st.integers(0, 255))
        elif op == "truncate":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif op == "size" and frame_starts:
            start = draw(st.sampled_from(frame_starts))
            if start + 7 <= len(buf):
                (size,) = struct.unpack_from(">I", buf, start + 3)
                new = max(0, size + draw(st.integers(-9, 9))) if draw(st.booleans()) else draw(interesting_u32)
                struct.pack_into(">I", buf, start + 3, min(new, 2**32 - 1))
    return bytes(buf)


@st.composite
def mutated_stream(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    frames = draw(st.lists(st.sampled_from(CORPUS), min_size=1, max_size=4))
    starts, offset = [], 0
    for f in frames:
        starts.append(offset)
        offset += len(f)
    data = draw(mutate(b"".join(frames), starts))
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=6))
    return data, sorted(cuts)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


# ---------------------------------------------------------------------------------------------------
# Properties


def test_corpus_is_valid() -> None:
    reader = FrameReader(0)
    for raw in CORPUS:
        reader.feed(raw)
    for ftype, _, payload in reader.frames():
        if ftype == spec.FRAME_METHOD:
            try:
                spec.decode_method(payload)
            except AMQPError as err:  # only the over-deep arguments are refused
                assert "nested too deeply" in err.text
    assert reader.buffered == 0


@budget(600)
@given(mutated_stream())
def test_mutated_frame_streams(case: tuple[bytes, list[int]]) -> None:
    data, cuts = case
    process(chunked(data, cuts))
    process([data], frame_max=0)  # without a frame_max, mutations reach the decoders more often


@budget(600)
@given(st.sampled_from(PAYLOADS).flatmap(mutate))
def test_mutated_method_payloads(payload: bytes) -> None:
    only_connection_errors(lambda: spec.decode_method(payload))


@budget(300)
@given(st.sampled_from(PROPERTY_BLOBS).flatmap(mutate))
def test_mutated_property_blobs(blob: bytes) -> None:
    only_connection_errors(lambda: spec.BasicProperties.decode(blob, 0))


@budget(300)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=4))
@example(b"\x01\x00\x01\xff\xff\xff\xff", [])  # method frame claiming 4 GiB
@example(spec.PROTOCOL_HEADER, [])
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    process(chunked(data, sorted(c % (len(data) + 1) for c in cuts)))
    process([data], frame_max=0)
    only_connection_errors(lambda: spec.decode_method(data))
    only_connection_errors(lambda: spec.BasicProperties.decode(data, 0))
    only_connection_errors(lambda: decode_table(data, 0))


@budget(400)
@given(st.sampled_from(ALL_METHODS), st.binary(max_size=120))
def test_random_arguments_for_every_method(cls: type[spec.Method], args: bytes) -> None:
    only_connection_errors(lambda: spec.decode_method(struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID) + args))


field_soup = st.lists(
    st.one_of(
        st.sampled_from([c.encode() for c in "tbBsuIilLfdDSxATFV"]),
        st.sampled_from([b"\x01k", b"\x00", b"\xff"]),
        interesting_u32.map(lambda n: struct.pack(">I", n)),
        st.binary(max_size=6),
    ),
    max_size=30,
).map(b"".join)


@budget(400)
@given(field_soup, st.booleans())
@example(_deep_arguments(20_000)[4:], True)
def test_table_soup(body: bytes, honest_length: bool) -> None:
    """Type letters, keys and lengths in random order: the decoder's own territory."""
    length = len(body) if honest_length else (len(body) * 7) % 2**32
    raw = struct.pack(">I", length) + body
    only_connection_errors(lambda: decode_table(raw, 0))
    props = struct.pack(">H", spec.FLAG_HEADERS) + raw
    only_connection_errors(lambda: spec.BasicProperties.decode(props, 0))


def test_errors_are_what_the_connection_expects() -> None:
    """The codes the fuzzers see, on known inputs: 501 for framing/decoding, 503 for unknown methods."""
    reader = FrameReader(FRAME_MAX)
    reader.feed(HEARTBEAT_FRAME[:-1] + b"\x00")
    err = only_connection_errors(lambda: list(reader.frames()))
    assert err is not None and err.code == 501
    err = only_connection_errors(lambda: spec.decode_method(b"\x00\x1e\x00\x0a"))
    assert err is not None and err.code == 503
    err = only_connection_errors(lambda: spec.decode_method(PAYLOADS[0][:-1]))
    assert err is not None and err.code == 501
