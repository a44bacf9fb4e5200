"""The compiled field-table decoder (`hutch.amqp._ctable`) against its pure reference
(`table.decode_table_pure`): the same values of the same types (Decimal exponents, float bits, `str` or
`bytes` for `S`) or the same `FrameError` text, for random, malformed, deepest-nested and longest input,
at any offset and from bytes, bytearray or memoryview; pamqp is the third opinion on valid tables.
Also: `table.decode_table` is the compiled one unless HUTCH_PURE is set or the build is missing.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from hutch.amqp import table
from hutch.amqp.errors import FRAME_ERROR, FrameError
from hutch.amqp.table import MAX_NESTING_DEPTH, decode_table_pure, encode_table

from .support import canonical_tables, ci_settings, from_pamqp, oracle_in_tables, same

try:
    from hutch.amqp import _ctable
except ImportError as exc:  # not built (no compiler or headers): the pure path runs; nothing to compare
    _ctable = None  # type: ignore[assignment]  # the module is absent when the build failed
    NOT_BUILT = f"the compiled table decoder is not built ({exc}); `pip install -e .` builds it"
else:
    NOT_BUILT = ""
    _ctable.configure(table.Timestamp, MAX_NESTING_DEPTH)  # as table.py does (not when HUTCH_PURE is set)

pytestmark = pytest.mark.skipif(_ctable is None, reason=NOT_BUILT or "built")

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
FRAME_MAX = 131072


def outcome(fn: Callable[[Any, int], tuple[dict[str, Any], int]], buf: Any, offset: int) -> tuple[str, Any]:
    """What a decode gives: ("value", (table, end)) or ("error", (code, text))."""
    try:
        return "value", fn(buf, offset)
    except FrameError as exc:
        return "error", (exc.code, exc.text)


def assert_agree(raw: bytes, offset: int = 0) -> tuple[str, Any]:
    """Both decoders on `raw` at `offset`, from bytes, bytearray and memoryview: one outcome."""
    assert _ctable is not None
    expected = outcome(decode_table_pure, raw, offset)
    for buf in (raw, bytearray(raw), memoryview(raw)):
        got = outcome(_ctable.decode_table, buf, offset)
        assert got[0] == expected[0], f"{got!r}\n!=\n{expected!r}"
        if got[0] == "value":  # typed equality, plus repr: Decimal('2.50') == Decimal('2.5') otherwise
            (got_table, got_end), (table_, end) = got[1], expected[1]
            assert same(got_table, table_) and repr(got_table) == repr(table_) and got_end == end, \
                f"{got!r} != {expected!r}"
        else:
            assert got[1] == expected[1]
    return expected


def wrap(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# -- valid tables ------------------------------------------------------------------------------------

@ci_settings(max_examples=200)  # `make test`; the 400 of the long run below are in the slow set
@given(canonical_tables, st.binary(max_size=3), st.binary(max_size=3))
def test_valid_tables_decode_alike(value: dict[str, Any], before: bytes, after: bytes) -> None:
    raw = encode_table(value)
    kind, (decoded, end) = assert_agree(before + raw + after, len(before))
    assert kind == "value" and end == len(before) + len(raw)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 400 examples
@ci_settings(max_examples=400)
@given(canonical_tables, st.binary(max_size=3), st.binary(max_size=3))
def test_valid_tables_decode_alike_long(value: dict[str, Any], before: bytes, after: bytes) -> None:
    test_valid_tables_decode_alike.hypothesis.inner_test(value, before, after)


@ci_settings(max_examples=200)
@given(oracle_in_tables)
def test_what_pamqp_writes_decodes_alike_and_as_pamqp_reads_it(value: dict[str, Any]) -> None:
    raw = pamqp_encode.field_table(value)
    kind, (decoded, _) = assert_agree(raw)
    assert kind == "value"
    _, theirs = pamqp_decode.field_table(raw)
    assert same(decoded, from_pamqp(theirs)) or repr(decoded) == repr(from_pamqp(theirs))


def nested(depth: int, letter: bytes) -> bytes:
    """A table whose one value nests `depth` arrays ('A') or tables ('F'), the innermost empty."""
    inner = b""
    for _ in range(depth):
        inner = letter + wrap(inner if letter == b"A" else (b"\x01k" + inner if inner else b""))
    return wrap(b"\x01k" + inner)


@pytest.mark.parametrize("letter", [b"A", b"F"])
@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH - 1, MAX_NESTING_DEPTH, MAX_NESTING_DEPTH + 1])
def test_the_deepest_nesting_allowed_and_one_past_it(letter: bytes, depth: int) -> None:
    kind, result = assert_agree(nested(depth, letter))
    assert kind == ("value" if depth <= MAX_NESTING_DEPTH else "error")


def test_alternating_nesting_past_the_limit_in_a_full_frame() -> None:
    inner = b""
    for i in range(FRAME_MAX // 12):
        inner = (b"A" + wrap(inner)) if i % 2 else (b"F" + wrap(b"\x00" + inner if inner else b""))
    kind, (code, text) = assert_agree(wrap(b"\x00" + inner))
    assert kind == "error" and code == FRAME_ERROR and "nested too deeply" in text


@pytest.mark.parametrize("text", ["", "a" * (FRAME_MAX - 64), "ü€😀" * ((FRAME_MAX - 64) // 9)])
def test_the_longest_strings_a_frame_holds(text: str) -> None:
    raw = text.encode()
    for body in (b"\x01sS" + wrap(raw), b"\x01xx" + wrap(raw), b"\x01bS" + wrap(raw[:-1] + b"\xff"),
                 b"\x00A" + wrap(b"S" + wrap(raw)), b"\xff" + b"k" * 255 + b"S" + wrap(raw)):
        assert assert_agree(wrap(body))[0] == "value"


def test_frame_filling_tables_of_every_letter_decode_alike() -> None:
    """The shapes an attacker would pick to make decoding cost the most, each one frame_max long."""
    room = FRAME_MAX - 64
    units = [b"V", b"t\x01", b"b\x80", b"B\xff", b"s\x80\x00", b"u\xff\xff", b"I\x80\0\0\0", b"i\xff\xff\xff\xff",
             b"l\x80" + b"\0" * 7, b"L\xff" * 1 + b"\xff" * 7, b"f\x7f\xc0\0\x01", b"d\xff\xf8" + b"\0" * 5 + b"\x01",
             b"D\x02\x80\0\0\0", b"T\xff" + b"\0" * 7, b"S\0\0\0\0", b"S\0\0\0\x01\xff", b"x\0\0\0\0",
             b"F\0\0\0\0", b"A\0\0\0\0"]
    for unit in units:
        items = unit * (room // len(unit))
        assert assert_agree(wrap(b"\x00A" + wrap(items)))[0] == "value", unit
    assert assert_agree(wrap(b"\x00V" * (room // 2)))[0] == "value"  # session 16's empty keys and voids
    keys = b"".join(b"\x02" + bytes((0x41 + i // 26, 0x41 + i % 26)) + b"V" for i in range(26 * 26))
    assert assert_agree(wrap(keys))[0] == "value"


# -- malformed tables --------------------------------------------------------------------------------

letters = st.sampled_from(list(b"StbBsuIilLfdDTFAVx") + [0, 0x4E, 0xFF]).map(lambda c: bytes([c]))
key_tokens = st.sampled_from([b"\x00", b"\x01k", b"\x02\xc3\xa9"]) | st.sampled_from(
    [b"\x01\xff", b"\x03\xed\xa0\x80", b"\x09k"])  # the second: invalid UTF-8, or a key overrunning
value_tokens = st.one_of(
    letters,
    st.integers(0, 12).map(lambda n: struct.pack(">I", n)),  # plausible lengths
    st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),  # any length
    key_tokens,  # a nested table's keys
    st.binary(max_size=6),
)
entries = st.tuples(key_tokens, letters, st.lists(value_tokens, max_size=6)).map(
    lambda e: e[0] + e[1] + b"".join(e[2]))
bodies = st.lists(entries, max_size=4).map(b"".join)


@ci_settings(max_examples=400)  # `make test`; the 1,500 of the long run below are in the slow set
@given(bodies, st.integers(-3, 3), st.binary(max_size=4))
@example(b"\x01kS\x00\x00\x00\x09abc", 0, b"")  # a string overrunning its table
@example(b"\x01kA\x00\x00\x00\x02S\x00", 0, b"")  # a string's length cut by its array
@example(b"\x01k", 0, b"")  # a key and no value
@example(b"\x01kF\x00\x00\x00\x01", 0, b"")  # a nested table overrunning its container
def test_malformed_tables_fail_alike(body: bytes, length_error: int, trailing: bytes) -> None:
    """Token soup with a length that is right, a little wrong, or cut: the same value or the same text."""
    length = max(0, len(body) + length_error)
    assert_agree(struct.pack(">I", length) + body + trailing)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 1,500 examples
@ci_settings(max_examples=1500)
@given(bodies, st.integers(-3, 3), st.binary(max_size=4))
def test_malformed_tables_fail_alike_long(body: bytes, length_error: int, trailing: bytes) -> None:
    test_malformed_tables_fail_alike.hypothesis.inner_test(body, length_error, trailing)


@ci_settings(max_examples=800)
@given(st.binary(max_size=40), st.binary(max_size=40))
def test_any_key_and_string_bytes_decode_alike(key: bytes, text: bytes) -> None:
    """Python's strict UTF-8 (surrogates, overlong forms, past U+10FFFF, cut sequences) decides both
    whether a key is refused and whether an `S` value is `str` or `bytes`, in both decoders."""
    assert_agree(wrap(bytes([len(key)]) + key + b"S" + wrap(text)))
    assert_agree(wrap(b"\x01kS" + wrap(text)))


@ci_settings(max_examples=200)  # `make test`; the 600 of the long run below are in the slow set
@given(canonical_tables, st.data())
def test_mutated_encodings_fail_or_decode_alike(value: dict[str, Any], data: st.DataObject) -> None:
    raw = bytearray(encode_table(value))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        choice = data.draw(st.integers(0, 2))
        if choice == 0:
            raw[i] = data.draw(st.integers(0, 255))
        elif choice == 1:
            del raw[i:]
            if not raw:
                raw = bytearray(b"\x00")
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=3))
    assert_agree(bytes(raw))


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 600 examples
@ci_settings(max_examples=600)
@given(canonical_tables, st.data())
def test_mutated_encodings_fail_or_decode_alike_long(value: dict[str, Any], data: st.DataObject) -> None:
    test_mutated_encodings_fail_or_decode_alike.hypothesis.inner_test(value, data)


@pytest.mark.parametrize("raw", [b"", b"\x00\x00\x00", b"\x00\x00\x00\x05\x01", b"\xff\xff\xff\xff"])
def test_cut_lengths_fail_alike(raw: bytes) -> None:
    kind, (code, _) = assert_agree(raw)
    assert kind == "error" and code == FRAME_ERROR


def test_an_offset_past_the_end_fails_alike() -> None:
    assert assert_agree(wrap(b""), 9)[0] == "error"


# -- which decoder runs ------------------------------------------------------------------------------

def run(code: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": SRC, **env}).stdout.strip()


def test_the_compiled_decoder_is_chosen_unless_hutch_pure() -> None:
    assert table.COMPILED_TABLES is (os.environ.get("HUTCH_PURE", "") in ("", "0"))
    probe = "from hutch.amqp import table, spec; print(table.COMPILED_TABLES, spec._NAMESPACE['_dtable'] is table.decode_table)"
    assert run(probe, HUTCH_PURE="") == "True True"
    assert run(probe, HUTCH_PURE="1") == "False True"


def test_without_the_build_the_pure_decoder_runs() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'hutch.amqp._ctable': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from hutch.amqp import table\n"
        "print(table.COMPILED_TABLES, table.decode_table is table.decode_table_pure,"
        " table.decode_table(b'\\x00\\x00\\x00\\x03\\x01kV', 0))\n"
    )
    assert run(code, HUTCH_PURE="") == "False True ({'k': None}, 7)"
