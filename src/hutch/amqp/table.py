"""AMQP 0-9-1 field tables and arrays, in RabbitMQ's dialect.

Owns: encoding and decoding of every field-value type clients send. The type letters are the ones
RabbitMQ (and pika, the Java client, amqplib) use, which differ from the 0-9-1 spec's errata list:

    t bool    b int8     B uint8    s int16    u uint16   I int32    i uint32
    l int64   f float32  d float64  D decimal  S longstr  x bytes    A array
    T timestamp (uint64 seconds)    F table    V void
    (also decoded: L int64 - signed, as RabbitMQ reads it, despite the spec's "unsigned")

Python mapping: `S` decodes to `str` when it is valid UTF-8, else to `bytes`; `x` to `bytes`; `D` to
`decimal.Decimal`; `T` to `Timestamp` (an int subclass, so it re-encodes as `T`); `V` to None.
Encoding picks the letter from the Python type: bool→t, int→I (or l when out of int32 range, or the
letter of an `TypedInt`), float→d, str→S, bytes→x, Decimal→D, datetime/Timestamp→T, dict→F,
list/tuple→A, None→V.

Rule: every decode error raises `FrameError` (501 FRAME_ERROR, as RabbitMQ reports undecodable frames) - never IndexError or struct.error -
so that hostile input closes the connection with the protocol's code and nothing else.
Decoding has two twins: `decode_table_pure` here (the reference) and `_ctable.decode_table`, compiled
with Cython when the install could build it (setup.py), ~30-100 times faster on large tables (a 128 KiB
content header's table is decoded on the event loop when it arrives: ~30-60 ms in Python, ~1 ms
compiled; docs/security.md, session 19). `decode_table` is the compiled one unless it is missing or
`HUTCH_PURE` is set (then the pure one); `COMPILED_TABLES` says which. They agree on every input,
malformed ones included, down to the error text (tests/codec/test_table_compiled.py).

Invariant: tables and arrays nest at most `MAX_NESTING_DEPTH` levels deep; deeper input is a 501, not a
RecursionError (a 131072-byte frame could otherwise nest ~26,000 arrays and exhaust Python's stack).
"""

from __future__ import annotations

import datetime as _dt
import os
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from .errors import FrameError

_unpack_from = struct.unpack_from
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")


class Timestamp(int):
    """A field-table timestamp ('T'): seconds since the epoch, kept as an int subclass."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class TypedInt(int):
    """An int that remembers which AMQP integer letter to encode it with (e.g. 'l' for x-death count)."""

    letter: str

    def __new__(cls, value: int, letter: str) -> TypedInt:
        obj = super().__new__(cls, value)
        obj.letter = letter
        return obj


_INT_FORMATS = {
    "b": struct.Struct(">b"),
    "B": struct.Struct(">B"),
    "s": struct.Struct(">h"),
    "u": struct.Struct(">H"),
    "I": struct.Struct(">i"),
    "i": struct.Struct(">I"),
    "l": struct.Struct(">q"),
    # RabbitMQ reads 'L' as *signed* 64-bit, like 'l' (rabbit_binary_parser; rabbitmq-server#1093),
    # and so does pamqp; reading it unsigned would turn a client's -1 into 2**64 - 1.
    "L": struct.Struct(">q"),
}
_F = struct.Struct(">f")
_D = struct.Struct(">d")
_DEC = struct.Struct(">Bi")

# Real clients nest 3 levels at most (x-death: array of tables of arrays). 100 levels cost ~300 Python
# frames to decode, far below the default recursion limit of 1000.
MAX_NESTING_DEPTH = 100


def _bad(text: str) -> FrameError:
    return FrameError(text)


def decode_table_pure(buf: bytes | memoryview, offset: int) -> tuple[dict[str, Any], int]:
    """Decode a length-prefixed field table at `offset`; return (table, new offset). The reference:
    `decode_table` is this or its compiled twin (`_ctable.decode_table`), which gives the same result."""
    return _decode_table(buf, offset, 0)


def _decode_table(buf: bytes | memoryview, offset: int, depth: int) -> tuple[dict[str, Any], int]:
    try:
        (length,) = _I.unpack_from(buf, offset)
    except struct.error:
        raise _bad("truncated field table length") from None
    offset += 4
    end = offset + length
    if end > len(buf):
        raise _bad("field table longer than its frame")
    result: dict[str, Any] = {}
    while offset < end:
        klen = buf[offset]
        offset += 1
        kend = offset + klen
        if kend > end:
            raise _bad("field table key overruns table")
        try:
            key = bytes(buf[offset:kend]).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("field table key is not valid UTF-8") from None
        value, offset = _decode_value(buf, kend, end, depth)
        result[key] = value
    if offset != end:
        raise _bad("field table overruns its length")
    return result, offset


def remove_table_key(buf: bytes, offset: int, key: str) -> bytes:
    """Copy of the length-prefixed table at `offset` without `key`, every other entry byte for byte.

    Used where the broker must drop one header (BCC) and forward the rest exactly as the publisher
    encoded them: re-encoding decoded values would change integer type letters. Raises FrameError.
    """
    (length,) = _I.unpack_from(buf, offset)
    pos = offset + 4
    end = pos + length
    target = key.encode("utf-8")
    kept: list[bytes] = []
    while pos < end:
        entry_start = pos
        klen = buf[pos]
        name = bytes(buf[pos + 1 : pos + 1 + klen])
        _value, pos = _decode_value(buf, pos + 1 + klen, end, 1)
        if name != target:
            kept.append(bytes(buf[entry_start:pos]))
    body = b"".join(kept)
    return _I.pack(len(body)) + body


def _decode_array(buf: bytes | memoryview, offset: int, limit: int, depth: int) -> tuple[list[Any], int]:
    if depth > MAX_NESTING_DEPTH:
        raise _bad("field array nested too deeply")
    if offset + 4 > limit:
        raise _bad("truncated field array length")
    (length,) = _I.unpack_from(buf, offset)
    offset += 4
    end = offset + length
    if end > limit:
        raise _bad("field array longer than its container")
    items: list[Any] = []
    while offset < end:
        value, offset = _decode_value(buf, offset, end, depth)
        items.append(value)
    if offset != end:
        raise _bad("field array overruns its length")
    return items, offset


def _decode_value(buf: bytes | memoryview, offset: int, limit: int, depth: int) -> tuple[Any, int]:
    if offset >= limit:
        raise _bad("truncated field value")
    kind = chr(buf[offset])
    offset += 1
    try:
        if kind == "S" or kind == "x":
            (n,) = _I.unpack_from(buf, offset)
            offset += 4
            end = offset + n
            if end > limit:
                raise _bad("long string overruns its container")
            raw = bytes(buf[offset:end])
            if kind == "x":
                return raw, end
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                return raw, end
        if kind == "t":
            if offset + 1 > limit:
                raise _bad("truncated boolean")
            return buf[offset] != 0, offset + 1
        fmt = _INT_FORMATS.get(kind)
        if fmt is not None:
            if offset + fmt.size > limit:
                raise _bad("truncated integer")
            return fmt.unpack_from(buf, offset)[0], offset + fmt.size
        if kind == "F":
            return _decode_nested_table(buf, offset, limit, depth + 1)
        if kind == "A":
            return _decode_array(buf, offset, limit, depth + 1)
        if kind == "V":
            return None, offset
        if kind == "T":
            if offset + 8 > limit:
                raise _bad("truncated timestamp")
            return Timestamp(_Q.unpack_from(buf, offset)[0]), offset + 8
        if kind == "d":
            if offset + 8 > limit:
                raise _bad("truncated double")
            return _D.unpack_from(buf, offset)[0], offset + 8
        if kind == "f":
            if offset + 4 > limit:
                raise _bad("truncated float")
            return _F.unpack_from(buf, offset)[0], offset + 4
        if kind == "D":
            if offset + 5 > limit:
                raise _bad("truncated decimal")
            scale, value = _DEC.unpack_from(buf, offset)
            return Decimal(value).scaleb(-scale), offset + 5
    except struct.error:
        raise _bad("truncated field value") from None
    raise _bad(f"unknown field value type {kind!r}")


def _decode_nested_table(buf: bytes | memoryview, offset: int, limit: int,
                         depth: int) -> tuple[dict[str, Any], int]:
    if depth > MAX_NESTING_DEPTH:
        raise _bad("field table nested too deeply")
    if offset + 4 > limit:
        raise _bad("truncated nested table")
    (length,) = _I.unpack_from(buf, offset)
    if offset + 4 + length > limit:
        raise _bad("nested table overruns its container")
    return _decode_table(buf, offset, depth)


def encode_table(table: dict[str, Any] | None) -> bytes:
    """Encode a dict as a length-prefixed field table."""
    if not table:
        return b"\x00\x00\x00\x00"
    parts: list[bytes] = []
    for key, value in table.items():
        k = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if len(k) > 255:
            raise ValueError(f"field table key too long: {key!r}")
        parts.append(_B.pack(len(k)))
        parts.append(k)
        _encode_value(value, parts)
    body = b"".join(parts)
    return _I.pack(len(body)) + body


def encode_array(items: list[Any] | tuple[Any, ...]) -> bytes:
    parts: list[bytes] = []
    for item in items:
        _encode_value(item, parts)
    body = b"".join(parts)
    return _I.pack(len(body)) + body


def _encode_value(value: Any, parts: list[bytes]) -> None:
    if isinstance(value, str):
        raw = value.encode("utf-8")
        parts.append(b"S" + _I.pack(len(raw)))
        parts.append(raw)
    elif isinstance(value, bool):
        parts.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, Timestamp):
        parts.append(b"T" + _Q.pack(value))
    elif isinstance(value, TypedInt):
        parts.append(value.letter.encode() + _INT_FORMATS[value.letter].pack(value))
    elif isinstance(value, int):
        if -(2**31) <= value < 2**31:
            parts.append(b"I" + _INT_FORMATS["I"].pack(value))
        elif -(2**63) <= value < 2**63:
            parts.append(b"l" + _INT_FORMATS["l"].pack(value))
        else:
            raise ValueError(f"integer out of range for a field table: {value}")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        parts.append(b"x" + _I.pack(len(raw)))
        parts.append(raw)
    elif isinstance(value, dict):
        parts.append(b"F")
        parts.append(encode_table(value))
    elif isinstance(value, (list, tuple)):
        parts.append(b"A")
        parts.append(encode_array(value))
    elif value is None:
        parts.append(b"V")
    elif isinstance(value, float):
        parts.append(b"d" + _D.pack(value))
    elif isinstance(value, Decimal):
        parts.append(b"D" + _encode_decimal(value))
    elif isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        parts.append(b"T" + _Q.pack(int(value.timestamp())))
    else:
        raise ValueError(f"cannot encode {type(value).__name__} in a field table")


def _encode_decimal(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError("cannot encode a non-finite decimal")
    scale = -exponent if exponent < 0 else 0
    unscaled = int(value.scaleb(scale))
    if scale > 255 or not -(2**31) <= unscaled < 2**31:
        raise ValueError(f"decimal out of range for AMQP: {value}")
    return _DEC.pack(scale, unscaled)


def _select_decoder() -> tuple[Callable[[bytes | memoryview, int], tuple[dict[str, Any], int]], bool]:
    """The compiled decoder when it was built and `HUTCH_PURE` is not set (as `speedups` chooses)."""
    if os.environ.get("HUTCH_PURE", "") not in ("", "0"):
        return decode_table_pure, False
    try:
        from . import _ctable
    except ImportError:
        return decode_table_pure, False
    _ctable.configure(Timestamp, MAX_NESTING_DEPTH)
    return _ctable.decode_table, True


decode_table, COMPILED_TABLES = _select_decoder()
