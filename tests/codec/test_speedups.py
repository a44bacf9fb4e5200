"""The compiled hot path (`hutch.amqp._cframes`) against its pure-Python reference (`hutch.amqp.frames`):
the same frames, values, bytes and errors (type, code, text) for the same input, fed whole, one byte at
a time, in random chunks, with trailing garbage, around frame_max, and fed while an iteration is
suspended. Also: `speedups` picks the compiled path unless HUTCH_PURE is set, and the server says once
at start which path runs.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.amqp import frames as pure
from hutch.amqp.errors import AMQPError

from .support import ci_settings, same

try:
    from hutch.amqp import _cframes as compiled
except ImportError as exc:  # not built (no compiler or headers): the pure path runs; nothing to compare
    compiled = None
    NOT_BUILT = f"the compiled hot path is not built ({exc}); `pip install -e .` builds it"
else:
    NOT_BUILT = ""

needs_compiled = pytest.mark.skipif(compiled is None, reason=NOT_BUILT or "built")

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """What a call gives: its value, or its error as (type, code, text)."""
    try:
        return "value", fn(*args)
    except AMQPError as exc:
        return "error", (type(exc).__name__, exc.code, exc.text, exc.class_id, exc.method_id)


def same_outcome(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    return a[0] == b[0] and (same(a[1], b[1]) if a[0] == "value" else a[1] == b[1])


# -- the frame reader --------------------------------------------------------------------------------

def raw_frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


frame_types = st.sampled_from([1, 2, 3, 8]) | st.integers(0, 255)
ends = st.just(0xCE) | st.integers(0, 255)
one_frame = st.builds(raw_frame, frame_types, st.integers(0, 65535), st.binary(max_size=80), ends)
header_only = st.binary(min_size=7, max_size=7)  # any 7-byte header: sizes up to 4 GiB
streams = st.lists(st.sampled_from([0, 1, 2]).flatmap(
    lambda kind: one_frame if kind else header_only | st.binary(max_size=20)), max_size=12)
frame_maxes = st.sampled_from([0, 4096, 131072]) | st.integers(0, 120)
tolerances = st.sampled_from([0, 8]) | st.integers(0, 20)


def run_reader(cls: type, frame_max: int, tolerance: int, ops: list[tuple[str, Any]]) -> list[Any]:
    """Drive a reader through feed / next-step / new-iterator / set-frame_max operations and record
    everything observable: each step's frame or error, `buffered` after every operation."""
    reader = cls(frame_max, tolerance)
    it = None
    seen: list[Any] = []
    for op, arg in ops:
        if op == "feed":
            reader.feed(arg)
        elif op == "frame_max":
            reader.frame_max = arg
        elif op == "iter":
            it = reader.frames()
        elif op == "take":
            seen.append(("take", reader.take_content(arg)))
        elif op == "pubs":
            seen.append(("pubs", reader.take_publishes(*arg)))
        else:
            if it is None:
                it = reader.frames()
            for _ in range(arg):
                step = outcome(next, it, None)
                seen.append(step)
                if step == ("value", None):
                    break
        seen.append(("buffered", reader.buffered))
    seen.append(("rest", outcome(list, reader.frames())))
    return seen


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def assert_readers_agree(frame_max: int, tolerance: int, ops: list[tuple[str, Any]]) -> None:
    expected = run_reader(pure.FrameReader, frame_max, tolerance, ops)
    got = run_reader(compiled.FrameReader, frame_max, tolerance, ops)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert same_outcome(g, e) if g[0] in ("value", "error") else g == e, (g, e)


@needs_compiled
@ci_settings(150)  # `make test`; the 300 of the long run below are in the slow set
@given(streams, frame_maxes, tolerances, st.binary(max_size=10))
def test_reader_whole_and_byte_at_a_time(frames: list[bytes], frame_max: int, tolerance: int,
                                         garbage: bytes) -> None:
    data = b"".join(frames) + garbage
    assert_readers_agree(frame_max, tolerance, [("feed", data), ("next", 100)])
    ops: list[tuple[str, Any]] = []
    for i in range(len(data)):
        ops += [("feed", data[i : i + 1]), ("iter", None), ("next", 100)]
    assert_readers_agree(frame_max, tolerance, ops)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@needs_compiled
@ci_settings(300)
@given(streams, frame_maxes, tolerances, st.binary(max_size=10))
def test_reader_whole_and_byte_at_a_time_long(frames: list[bytes], frame_max: int, tolerance: int,
                                              garbage: bytes) -> None:
    test_reader_whole_and_byte_at_a_time.hypothesis.inner_test(frames, frame_max, tolerance, garbage)


@needs_compiled
@ci_settings(150)  # `make test`; the 300 of the long run below are in the slow set
@given(streams, frame_maxes, tolerances, st.lists(st.integers(0, 2000), max_size=8),
       st.lists(st.integers(0, 3), min_size=1, max_size=8), st.booleans())
def test_reader_chunks_fed_while_suspended(frames: list[bytes], frame_max: int, tolerance: int,
                                           cuts: list[int], steps: list[int], as_bytearray: bool) -> None:
    """Chunks fed between single steps of one iterator (as the connection does when a frame handler
    causes more input), the iterator renewed at times, frame_max changed midway (tune-ok)."""
    data = b"".join(frames)
    ops: list[tuple[str, Any]] = []
    for i, chunk in enumerate(chunked(data, cuts)):
        ops.append(("feed", bytearray(chunk) if as_bytearray else chunk))
        ops.append(("next", steps[i % len(steps)]))
        if i % 3 == 2:
            ops.append(("iter", None))
        if i == 1:
            ops.append(("frame_max", frame_max // 2))
    ops.append(("next", 100))
    assert_readers_agree(frame_max, tolerance, ops)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@needs_compiled
@ci_settings(300)
@given(streams, frame_maxes, tolerances, st.lists(st.integers(0, 2000), max_size=8),
       st.lists(st.integers(0, 3), min_size=1, max_size=8), st.booleans())
def test_reader_chunks_fed_while_suspended_long(frames: list[bytes], frame_max: int, tolerance: int,
                                                cuts: list[int], steps: list[int], as_bytearray: bool) -> None:
    test_reader_chunks_fed_while_suspended.hypothesis.inner_test(frames, frame_max, tolerance, cuts, steps, as_bytearray)


@needs_compiled
@ci_settings(300)
@given(st.integers(9, 200), st.integers(0, 9), st.integers(-10, 10), st.integers(0, 65535))
def test_reader_frame_max_boundary(frame_max: int, tolerance: int, delta: int, channel: int) -> None:
    """A payload of exactly frame_max - 8 + tolerance bytes, and a few bytes either side of it."""
    size = max(0, frame_max - 8 + tolerance + delta)
    data = raw_frame(3, channel, b"b" * size) + raw_frame(8, 0, b"")
    assert_readers_agree(frame_max, tolerance, [("feed", data), ("next", 5)])
    assert_readers_agree(frame_max, tolerance, [("feed", data[:7]), ("next", 1)])  # judged from the header


@needs_compiled
def test_reader_errors_fixed() -> None:
    """The three errors by name, so a regression in the texts shows here plainly."""
    for data in (b"\x09\x00\x00\x00\x00\x00\x00\xce",  # unknown type
                 b"\x03\x00\x01\xff\xff\xff\xff",  # 4 GiB frame, from the header alone
                 b"\x01\x00\x01\x00\x00\x00\x01x\x00"):  # bad frame end
        for frame_max in (0, 4096):
            got = run_reader(compiled.FrameReader, frame_max, 8, [("feed", data), ("next", 2)])
            assert got == run_reader(pure.FrameReader, frame_max, 8, [("feed", data), ("next", 2)])
    assert outcome(list, _fed(compiled.FrameReader(4096), b"\x03\x00\x01\xff\xff\xff\xff").frames()) == (
        "error", ("FrameError", 501, "frame size 4294967303 larger than negotiated maximum 4096", 0, 0))


def _fed(reader: Any, data: bytes) -> Any:
    reader.feed(data)
    return reader


@needs_compiled
def test_reader_many_frames_one_feed() -> None:
    data = b"".join(raw_frame(1 + i % 3, i % 65536, bytes([i % 256]) * (i % 50)) for i in range(20_000))
    assert_readers_agree(131072, 8, [("feed", data), ("next", 20_001)])


# -- publish, content header and ack parsing -------------------------------------------------------

def publish_payload(exchange: bytes, routing_key: bytes, bits: int, ex_len: int | None, rk_len: int | None,
                    extra: bytes) -> bytes:
    ex_len = len(exchange) if ex_len is None else ex_len
    rk_len = len(routing_key) if rk_len is None else rk_len
    return (b"\x00\x3c\x00\x28\x00\x00" + bytes([ex_len]) + exchange + bytes([rk_len]) + routing_key
            + bytes([bits]) + extra)


names = st.text(max_size=40).map(lambda s: s.encode()[:255]) | st.binary(max_size=40)
lengths = st.none() | st.integers(0, 255)
publishes = st.builds(publish_payload, names, names, st.integers(0, 255), lengths, lengths,
                      st.binary(max_size=4))


@needs_compiled
@ci_settings(250)  # `make test`; the 500 of the long run below are in the slow set
@given(publishes, st.integers(0, 120))
def test_parse_publish_same(payload: bytes, cut: int) -> None:
    for p in (payload, payload[:cut], payload[: len(payload) - 1]):
        expected = outcome(pure.parse_publish, p)
        assert same_outcome(outcome(compiled.parse_publish, p), expected), p


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 500 examples
@needs_compiled
@ci_settings(500)
@given(publishes, st.integers(0, 120))
def test_parse_publish_same_long(payload: bytes, cut: int) -> None:
    test_parse_publish_same.hypothesis.inner_test(payload, cut)


@needs_compiled
@ci_settings(300)
@given(st.binary(max_size=30))
def test_parse_publish_random_bytes(payload: bytes) -> None:
    assert same_outcome(outcome(compiled.parse_publish, payload), outcome(pure.parse_publish, payload))


def header_payload(class_id: int, weight: int, size: int, flags: int, props: bytes) -> bytes:
    return struct.pack(">HHQH", class_id, weight, size, flags) + props


fixed_flags = st.sets(st.sampled_from([0x1000, 0x0800, 0x0040])).map(sum)
headers = st.builds(header_payload, st.sampled_from([60, 10, 0, 65535]) | st.integers(0, 65535),
                    st.integers(0, 65535), st.integers(0, 2**64 - 1),
                    fixed_flags | st.integers(0, 65535), st.binary(max_size=12))


@needs_compiled
@ci_settings(250)  # `make test`; the 500 of the long run below are in the slow set
@given(headers | st.binary(max_size=20))
def test_parse_content_header_same(payload: bytes) -> None:
    expected = outcome(pure.parse_content_header, payload)
    assert same_outcome(outcome(compiled.parse_content_header, payload), expected)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 500 examples
@needs_compiled
@ci_settings(500)
@given(headers | st.binary(max_size=20))
def test_parse_content_header_same_long(payload: bytes) -> None:
    test_parse_content_header_same.hypothesis.inner_test(payload)


@needs_compiled
def test_parse_content_header_fixed_only_exhaustive() -> None:
    """Every flag word with the exact length of its fixed-size properties, one byte more and one less."""
    for flags in range(0x10000):
        for extra in (-1, 0, 1):
            n = 2 + (1 if flags & 0x1000 else 0) + (1 if flags & 0x0800 else 0) + (8 if flags & 0x0040 else 0)
            p = struct.pack(">HHQH", 60, 0, 5, flags) + b"\x01" * max(0, n - 2 + extra)
            assert compiled.parse_content_header(p) == pure.parse_content_header(p)


@needs_compiled
@ci_settings(300)
@given(st.binary(min_size=13, max_size=13) | st.binary(max_size=20))
def test_parse_ack_same(payload: bytes) -> None:
    assert same_outcome(outcome(compiled.parse_ack, payload), outcome(pure.parse_ack, payload))


# -- delivery encoding -------------------------------------------------------------------------------

bodies = st.one_of(st.binary(max_size=20), st.integers(4090, 4100).map(lambda n: b"y" * n),
                   st.integers(0, 20_000).map(lambda n: bytes(range(256)) * (n // 256) + b"z" * (n % 256)))


# -- a publish's content taken in one step ---------------------------------------------------------------

def content_pair(channel: int, body_channel: int, body: bytes, props: bytes, declared_delta: int,
                 header_type: int, body_type: int) -> bytes:
    """A content header (declaring len(body) + delta) and a body frame, each possibly off the mark."""
    declared = max(0, len(body) + declared_delta)
    header = struct.pack(">HHQ", 60, 0, declared) + props
    return raw_frame(header_type, channel, header) + raw_frame(body_type, body_channel, body)


channels_small = st.sampled_from([1, 2])
contents = st.builds(content_pair, channels_small, channels_small, st.binary(max_size=40),
                     st.binary(min_size=0, max_size=6), st.sampled_from([0, 0, 0, 1, -1]),
                     st.sampled_from([2, 2, 2, 3]), st.sampled_from([3, 3, 3, 2]))
content_streams = st.lists(contents | one_frame, max_size=8)


def readers_and_frames(data: bytes, frame_max: int, tolerance: int) -> list[tuple[tuple[str, Any], Any]]:
    """For each reader class (pure, compiled if built): what `frames()` gives for `data` (its frames, or
    the error), and a fresh reader fed `data`."""
    out = []
    for cls in [pure.FrameReader] + ([compiled.FrameReader] if compiled is not None else []):
        plain = cls(frame_max, tolerance)
        plain.feed(data)
        reader = cls(frame_max, tolerance)
        reader.feed(data)
        out.append((outcome(list, plain.frames()), reader))
    return out


@needs_compiled
@ci_settings(200)  # `make test`; the 400 of the long run below are in the slow set
@given(content_streams, frame_maxes, tolerances, st.lists(st.integers(0, 200), max_size=6),
       st.lists(st.tuples(st.sampled_from(["take", "next"]), st.integers(0, 3)), max_size=12))
def test_take_content_same_as_the_reference(frames: list[bytes], frame_max: int, tolerance: int,
                                            cuts: list[int], steps: list[tuple[str, int]]) -> None:
    """take_content and frame steps interleaved, on data fed in chunks: the same takes, frames, errors."""
    ops: list[tuple[str, Any]] = [("feed", chunk) for chunk in chunked(b"".join(frames), cuts)]
    ops += [(op, arg if op == "take" else arg + 1) for op, arg in steps]
    assert_readers_agree(frame_max, tolerance, ops)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 400 examples
@needs_compiled
@ci_settings(400)
@given(content_streams, frame_maxes, tolerances, st.lists(st.integers(0, 200), max_size=6),
       st.lists(st.tuples(st.sampled_from(["take", "next"]), st.integers(0, 3)), max_size=12))
def test_take_content_same_as_the_reference_long(frames: list[bytes], frame_max: int, tolerance: int,
                                                 cuts: list[int], steps: list[tuple[str, int]]) -> None:
    test_take_content_same_as_the_reference.hypothesis.inner_test(frames, frame_max, tolerance, cuts, steps)


@ci_settings(150)  # `make test`; the 300 of the long run below are in the slow set
@given(content_streams, frame_maxes, tolerances, st.lists(st.booleans(), max_size=10))
def test_take_content_only_regroups_frames(frames: list[bytes], frame_max: int, tolerance: int,
                                           take_after: list[bool]) -> None:
    """What take_content returns is exactly the header and body frames the reader would have yielded
    next (same payloads, then the same frames after them, or the same error); when it returns None nothing
    moved."""
    for expected, reader in readers_and_frames(b"".join(frames), frame_max, tolerance):
        got: list[tuple[int, int, bytes]] = []
        flags = iter(take_after)
        try:
            while True:
                if next(flags, False):
                    before = reader.buffered
                    for channel in (1, 2):
                        taken = reader.take_content(channel)
                        if taken is not None:
                            got += [(2, channel, taken[0]), (3, channel, taken[1])]
                            break
                        assert reader.buffered == before
                step = next(reader.frames(), None)
                if step is None:
                    break
                got.append(step)
            result: tuple[str, Any] = ("value", got)
        except AMQPError as exc:
            result = "error", (type(exc).__name__, exc.code, exc.text, exc.class_id, exc.method_id)
        if expected[0] == "value":
            assert result == expected
        else:  # the same frames before the same error
            assert result[0] == "error" and result[1] == expected[1]


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(300)
@given(content_streams, frame_maxes, tolerances, st.lists(st.booleans(), max_size=10))
def test_take_content_only_regroups_frames_long(frames: list[bytes], frame_max: int, tolerance: int,
                                                take_after: list[bool]) -> None:
    test_take_content_only_regroups_frames.hypothesis.inner_test(frames, frame_max, tolerance, take_after)


def test_take_content_takes_a_well_formed_pair_only() -> None:
    header = struct.pack(">HHQ", 60, 0, 3) + b"\x00\x00"
    good = raw_frame(2, 1, header) + raw_frame(3, 1, b"abc")
    for cls in [pure.FrameReader] + ([compiled.FrameReader] if compiled is not None else []):
        reader = cls(4096)
        reader.feed(good + raw_frame(8, 0, b""))
        assert reader.take_content(2) is None  # another channel
        assert reader.take_content(1) == (header, b"abc")
        assert reader.buffered == 8 and reader.take_content(1) is None
        for bad in (raw_frame(2, 1, header) + raw_frame(3, 1, b"abcd"),  # body longer than declared
                    raw_frame(2, 1, header) + raw_frame(3, 1, b"ab"),  # a body in more than one frame
                    raw_frame(2, 1, header) + raw_frame(3, 1, b"abc", end=0),  # bad frame end
                    good[:-1]):  # incomplete
            reader = cls(4096)
            reader.feed(bad)
            assert reader.take_content(1) is None and reader.buffered == len(bad)


@needs_compiled
@ci_settings(400)
@given(st.integers(0, 65535), st.binary(max_size=40), st.integers(0, 2**64 - 1), st.booleans(),
       st.binary(max_size=300), st.binary(max_size=300), bodies, st.sampled_from([0, 4096, 9, 131072]),
       st.booleans())
def test_append_delivery_same_bytes(channel: int, prefix: bytes, tag: int, redelivered: bool, tail: bytes,
                                    hp: bytes, body: bytes, frame_max: int, memoryview_body: bool) -> None:
    """The same parts (hence the same bytes) appended after what the list already held; a body that is
    not `bytes` goes the pure way in both."""
    args = (channel, prefix, tag, redelivered, tail, hp, memoryview(body) if memoryview_body else body,
            frame_max)
    expected: list[bytes] = [b"before"]
    pure.append_delivery(expected, *args)
    got: list[bytes] = [b"before"]
    compiled.append_delivery(got, *args)
    assert [bytes(x) for x in got] == [bytes(x) for x in expected]
    assert all(type(x) is bytes for x in got[:2])


@needs_compiled
def test_append_delivery_parses_back() -> None:
    """The encoded delivery read back by the reader: basic.deliver, its header, its body frames."""
    out: list[bytes] = []
    compiled.append_delivery(out, 5, b"\x00\x3c\x00\x3c\x03ctg", 2**64 - 1, True, b"\x00\x01q",
                             struct.pack(">HHQH", 60, 0, 10_000, 0), b"m" * 10_000, 4096)
    reader = compiled.FrameReader(4096)
    reader.feed(b"".join(out))
    got = list(reader.frames())
    assert got[0] == (1, 5, b"\x00\x3c\x00\x3c\x03ctg" + b"\xff" * 8 + b"\x01\x00\x01q")
    assert [f[0] for f in got] == [1, 2, 3, 3, 3]
    assert b"".join(f[2] for f in got[2:]) == b"m" * 10_000
    assert reader.buffered == 0


# -- the choice ------------------------------------------------------------------------------------

def _describe(env_pure: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "HUTCH_PURE"}
    if env_pure is not None:
        env["HUTCH_PURE"] = env_pure
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    code = "from hutch.amqp import speedups as s; print(s.COMPILED, s.FrameReader.__module__, s.describe())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True, timeout=60).stdout.strip()


def test_hutch_pure_forces_the_pure_path() -> None:
    assert _describe("1") == "False hutch.amqp.frames pure-Python hot path (HUTCH_PURE is set)"


def test_compiled_path_chosen_when_built() -> None:
    if compiled is None:
        out = _describe(None)
        assert out.startswith("False hutch.amqp.frames pure-Python hot path (compiled part not built: ")
    else:
        assert _describe(None) == "True hutch.amqp._cframes compiled hot path: on"
        assert _describe("0") == "True hutch.amqp._cframes compiled hot path: on"


def test_a_compiled_part_built_from_an_older_source_is_not_used() -> None:
    """A module lacking part of the interface (a stale build without `take_content`, say) is named for
    what it lacks, so `speedups` falls back to the pure path instead of failing on the first publish."""
    from types import ModuleType

    from hutch.amqp import speedups

    assert speedups.missing_names(pure) == []
    if compiled is not None:
        assert speedups.missing_names(compiled) == []
    stale = ModuleType("stale")

    class OldReader:
        def feed(self, data: bytes) -> None: ...

        def frames(self) -> None: ...

    for name in ("parse_publish", "parse_content_header", "parse_ack", "append_delivery",
                 "stream_plain_run"):
        setattr(stale, name, getattr(pure, name))
    stale.FrameReader = OldReader  # type: ignore[attr-defined]
    assert speedups.missing_names(stale) == ["FrameReader.take_content", "FrameReader.take_publishes",
                                            "FrameReader.cut_unfinished_publish"]
    assert speedups.missing_names(ModuleType("empty"))[:2] == ["FrameReader", "parse_publish"]



# -- a stream consumer's run of plain records ---------------------------------------------------------

def _data_section(body: bytes, wide: bool) -> bytes:
    return (b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) if wide or len(body) > 255
            else b"\x00\x53\x75\xa0" + bytes([len(body)])) + body


def _record(prefix: bytes, kind: int, body: bytes, junk: bytes) -> Any:
    """One record of a run: mostly `prefix` + a data section; else something the run must stop at (a
    record of another prefix, a bad constructor, a short or long length, trailing bytes, not bytes)."""
    if kind == 0:
        return prefix + _data_section(body, False)
    if kind == 1:
        return prefix + _data_section(body, True)
    if kind == 2:
        return junk + _data_section(body, False)
    if kind == 3:
        return prefix + b"\x00\x53\x77" + _data_section(body, False)[3:]
    if kind == 4:
        return prefix + _data_section(body, False) + junk[:1]
    if kind == 5:
        return (prefix + _data_section(body, True))[:-1] if body else prefix + b"\x00\x53"
    if kind == 6:
        return bytearray(prefix + _data_section(body, False))
    return prefix[:len(junk) % (len(prefix) + 1)]


def _message(*args: Any) -> tuple[Any, ...]:
    return args


plain_records = st.lists(st.tuples(
    st.integers(0, 7) | st.just(0), st.binary(max_size=300), st.binary(max_size=6),
    st.integers(0, 2**63 - 1) | st.integers(-5, -1) | st.just(2**63)), max_size=12)


@needs_compiled
@ci_settings(200)  # `make test`; the 400 of the long run below are in the slow set
@given(st.binary(min_size=1, max_size=40), plain_records, st.integers(0, 3), st.binary(max_size=30),
       st.binary(max_size=2))
def test_stream_plain_run_is_the_reference(prefix: bytes, spec_: list[tuple[int, bytes, bytes, int]], start: int,
                                           head: bytes, tail: bytes) -> None:
    """The compiled `stream_plain_run` takes exactly the records the reference takes, and makes exactly
    the same messages (the same arguments, so the same bytes) from them."""
    assert compiled is not None
    records = [(offset, _record(prefix, kind, body, junk)) for kind, body, junk, offset in spec_]
    results = []
    for impl in (pure.stream_plain_run, compiled.stream_plain_run):
        out: list[tuple[int, Any]] = [(-1, "kept")]
        stop = impl(records, start, prefix, head, tail, "x", "rk", b"\x01x\x02rk", _message, out)
        results.append((stop, out))
    assert results[0] == results[1]
    stop, out = results[0]
    assert len(out) - 1 == max(0, stop - start)
    for (offset, args), (rec_offset, entry) in zip(out[1:], records[start:stop], strict=True):
        assert offset == rec_offset and entry.endswith(args[3])
        assert args[4] == head + struct.pack(">q", offset) + tail
        assert args[6] == struct.pack(">HHQ", 60, 0, len(args[3])) + args[4]


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 400 examples
@needs_compiled
@ci_settings(400)
@given(st.binary(min_size=1, max_size=40), plain_records, st.integers(0, 3), st.binary(max_size=30),
       st.binary(max_size=2))
def test_stream_plain_run_is_the_reference_long(prefix: bytes, spec_: list[tuple[int, bytes, bytes, int]], start: int,
                                                head: bytes, tail: bytes) -> None:
    test_stream_plain_run_is_the_reference.hypothesis.inner_test(prefix, spec_, start, head, tail)


# -- a run of publishes taken in one step (the session's publish lane) -------------------------------------

PUBLISH = b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00"  # basic.publish, exchange "", routing key "q", no flags
OTHER_PUBLISHES = [b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x01",  # mandatory
                   b"\x00\x3c\x00\x28\x00\x00\x00\x01r\x00"]  # another routing key
PROPS = [b"\x00\x00", b"\x10\x00\x02", b"\x10\x00\x01", b"\x18\x00\x02\x05", b"\x10\x40" + bytes(9),
         b"\x10\x00", b"\x20\x00\x00\x00\x00\x00", b"\x10\x00\x02\x00"]  # the last three: not fixed-only


def publish_triple(channel: int, method: bytes, props: bytes, body: bytes, delta: int, body_type: int) -> bytes:
    return raw_frame(1, channel, method) + content_pair(channel, channel, body, props, delta, 2, body_type)


publishes = st.builds(publish_triple, st.sampled_from([1, 1, 1, 2]),
                      st.sampled_from([PUBLISH] * 4 + OTHER_PUBLISHES), st.sampled_from(PROPS),
                      st.binary(max_size=40), st.sampled_from([0, 0, 0, 0, 1, -1]), st.sampled_from([3, 3, 3, 3, 2]))
publish_streams = st.lists(publishes | contents | one_frame, max_size=10)


@needs_compiled
@ci_settings(200)
@given(publish_streams, frame_maxes, tolerances, st.lists(st.integers(0, 300), max_size=6),
       st.lists(st.tuples(st.sampled_from(["pubs", "next"]), st.integers(0, 3), st.integers(0, 40)), max_size=10))
def test_take_publishes_same_as_the_reference(frames: list[bytes], frame_max: int, tolerance: int,
                                              cuts: list[int], steps: list[tuple[str, int, int]]) -> None:
    """take_publishes and frame steps interleaved, on data fed in chunks: the same runs, frames, errors."""
    ops: list[tuple[str, Any]] = [("feed", chunk) for chunk in chunked(b"".join(frames), cuts)]
    ops += [("pubs", (1, PUBLISH, limit, count)) if op == "pubs" else ("next", count + 1)
            for op, count, limit in steps]
    assert_readers_agree(frame_max, tolerance, ops)


@ci_settings(150)  # `make test`; the 300 of the long run below are in the slow set
@given(publish_streams, frame_maxes, tolerances, st.integers(0, 40), st.integers(0, 5))
def test_take_publishes_only_regroups_frames(frames: list[bytes], frame_max: int, tolerance: int, max_body: int,
                                             max_count: int) -> None:
    """What take_publishes returns is exactly the next frames the reader would have yielded (three per
    publish: the method frame, the header, the body), then the same frames after them or the same error;
    each taken publish is of `PUBLISH` on channel 1, has a fixed-size property list and a body of 1 to
    `max_body` bytes."""
    for expected, reader in readers_and_frames(b"".join(frames), frame_max, tolerance):
        run = reader.take_publishes(1, PUBLISH, max_body, max_count)
        assert len(run) <= max_count
        got: list[Any] = []
        for header, body in run:
            props = header[12:]
            assert header[:4] == b"\x00\x3c\x00\x00" and 0 < len(body) <= max_body
            assert struct.unpack(">Q", header[4:12])[0] == len(body) and props not in PROPS[-3:]
            got += [(1, 1, PUBLISH), (2, 1, header), (3, 1, body)]
        rest = outcome(list, reader.frames())
        if expected[0] == "value":
            assert rest[0] == "value" and got + rest[1] == expected[1]
        else:
            assert rest[0] == "error" and rest[1] == expected[1]


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@ci_settings(300)
@given(publish_streams, frame_maxes, tolerances, st.integers(0, 40), st.integers(0, 5))
def test_take_publishes_only_regroups_frames_long(frames: list[bytes], frame_max: int, tolerance: int, max_body: int,
                                                  max_count: int) -> None:
    test_take_publishes_only_regroups_frames.hypothesis.inner_test(frames, frame_max, tolerance, max_body, max_count)
