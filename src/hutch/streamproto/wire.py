"""The stream protocol's field types: how each is read from and written to a frame body.

Owns the primitive codecs (integers, `string`: int16 length, `bytes`: int32 length, -1 for null, and
arrays: an int32 count) and the composite fields the commands share (string maps, offset
specifications, broker and stream metadata, command versions, statistics). A `Field` reads with
`read(In)` and writes with `write(out, value)`; the records in `commands` list their fields in order.

Rules: reading past the end or a string that is not UTF-8 raises `UnknownFrame`; an array's count is
never trusted for an allocation (elements are read one by one, so a frame's size bounds the work and
the memory). A map or array holds any count its frame holds, as RabbitMQ's `parse_map` reads it: a 1 MiB
frame holds ~45,000 small entries, ~100 ms of decoding. `Field.steps` is `read` as a generator that
yields after every `STEP_ENTRIES` entries of a map or array, so that the connection decodes a large
command across loop turns (runtime/stream_session/connection.py, `STEP_BYTES`) and never spends a
frame's worth of decoding in one turn; each yield is the list of what that array has read so far (a map's
(key, value) pairs), so the caller can count what the decoding holds as it grows (a subscribe's
properties against the connection's budget: stream_session/consuming.py) and stop it.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from hutch.streamproto.codes import OffsetType
from hutch.streamproto.errors import UnknownFrame

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class In:
    """A frame body being read: `data` and the position of the next unread byte."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def fixed(self, st: struct.Struct) -> Any:
        if self.pos + st.size > len(self.data):
            raise UnknownFrame("frame body ends inside a field")
        (value,) = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return value

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise UnknownFrame("frame body ends inside a field")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(chunk)

    def rest(self) -> bytes:
        chunk = self.data[self.pos:]
        self.pos = len(self.data)
        return bytes(chunk)


Steps = Generator[Any, None, Any]
"""A stepped read (`Field.steps`): yields between slices of work (an array: what it read so far, for the
caller to read and never change; anything else: None), returns the value."""


def one_step(value: Any) -> Steps:
    """`value` as a stepped read of no yield (a field whose reading is small)."""
    if False:  # pragma: no cover  (a generator that yields nothing)
        yield
    return value


class Field:
    """One field type: `read` from an `In`, `write` appends to a bytearray; `steps` reads as `read`
    does, yielding between slices of a large map or array (at most `STEP_ENTRIES` entries each)."""

    def read(self, r: In) -> Any:
        raise NotImplementedError

    def steps(self, r: In) -> Steps:
        return one_step(self.read(r))

    def write(self, out: bytearray, value: Any) -> None:
        raise NotImplementedError


class Fixed(Field):
    def __init__(self, st: struct.Struct) -> None:
        self.st = st

    def read(self, r: In) -> Any:
        return r.fixed(self.st)

    def write(self, out: bytearray, value: Any) -> None:
        out += self.st.pack(value)


U8, U16, I16, U32, I32, U64, I64 = (Fixed(s) for s in (_U8, _U16, _I16, _U32, _I32, _U64, _I64))


class Bool(Field):
    def read(self, r: In) -> bool:
        return bool(r.fixed(_U8))

    def write(self, out: bytearray, value: Any) -> None:
        out += _U8.pack(1 if value else 0)


def read_string(r: In) -> str | None:
    n = r.fixed(_I16)
    if n == -1:
        return None
    raw = r.take(n)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise UnknownFrame("a string field is not UTF-8") from None


def write_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    raw = value.encode()
    if len(raw) > 32767:
        raise ValueError(f"string of {len(raw)} bytes is longer than the protocol's 32767")
    out += _I16.pack(len(raw))
    out += raw


def read_strings(r: In, count: int) -> list[str]:
    """`count` strings one after the other (null as ""), as `String.read` reads each: the codec's hot
    loop for maps and string arrays (a 1 MiB map of ~45,000 entries). A count past what the bytes left
    hold fails when the bytes end, never allocating for the count."""
    data, pos, end = r.data, r.pos, len(r.data)
    unpack = _I16.unpack_from
    out: list[str] = []
    append = out.append
    try:
        for _ in range(count):
            if pos + 2 > end:
                raise UnknownFrame("frame body ends inside a field")
            (n,) = unpack(data, pos)
            pos += 2
            if n <= 0:
                if n < -1:
                    raise UnknownFrame("frame body ends inside a field")
                append("")
                continue
            if pos + n > end:
                raise UnknownFrame("frame body ends inside a field")
            append(str(data[pos:pos + n], "utf-8"))
            pos += n
    except UnicodeDecodeError:
        raise UnknownFrame("a string field is not UTF-8") from None
    finally:
        r.pos = pos
    return out


class String(Field):
    """`string`; null (-1) reads as the empty string (no command distinguishes them)."""

    def read(self, r: In) -> str:
        return read_string(r) or ""

    def write(self, out: bytearray, value: Any) -> None:
        write_string(out, value)


class Bytes(Field):
    """`bytes`; null (-1) reads as empty."""

    def read(self, r: In) -> bytes:
        n = r.fixed(_I32)
        return b"" if n == -1 else r.take(n)

    def write(self, out: bytearray, value: Any) -> None:
        out += _I32.pack(len(value))
        out += value


class OptionalTail(Field):
    """A trailing field some peers leave out (open's connection properties, subscribe's properties,
    a SASL challenge): absent reads as `empty`; writing `empty` writes nothing."""

    def __init__(self, inner: Field, empty: Any) -> None:
        self.inner = inner
        self.empty = empty

    def read(self, r: In) -> Any:
        return self.empty if r.at_end() else self.inner.read(r)

    def steps(self, r: In) -> Steps:
        if r.at_end():
            return self.empty
        return (yield from self.inner.steps(r))

    def write(self, out: bytearray, value: Any) -> None:
        if value != self.empty:
            self.inner.write(out, value)


STEP_ENTRIES = 512
"""Entries of a map or array a stepped read (`Field.steps`) reads between two yields: ~1 ms of decoding."""


class Array(Field):
    """`[T]`: an int32 count then the elements (a tuple of fields per element when `row`), as many as
    the frame holds (the count is checked against the bytes left, never used to allocate)."""

    def __init__(self, *row: Field) -> None:
        self.row = row
        self._strings = all(type(f) is String for f in row)  # read by `read_strings`, the fast path

    def _count(self, r: In) -> int:
        count: int = r.fixed(_I32)
        if count < 0:
            raise UnknownFrame("negative array length")
        return count

    def _elements(self, r: In, count: int) -> list[Any]:
        width = len(self.row)
        if self._strings:
            flat = read_strings(r, count * width)
            return flat if width == 1 else list(zip(*(flat[i::width] for i in range(width)), strict=True))
        if width == 1:
            return [self.row[0].read(r) for _ in range(count)]
        return [tuple(f.read(r) for f in self.row) for _ in range(count)]

    def read(self, r: In) -> list[Any]:
        return self._elements(r, self._count(r))

    def steps(self, r: In) -> Steps:
        count = self._count(r)
        items: list[Any] = []
        for start in range(0, count, STEP_ENTRIES):
            if start:
                yield items
            items += self._elements(r, min(STEP_ENTRIES, count - start))
        return items

    def write(self, out: bytearray, value: Any) -> None:
        out += _I32.pack(len(value))
        for item in value:
            if len(self.row) == 1:
                self.row[0].write(out, item)
            else:
                for f, v in zip(self.row, item, strict=True):
                    f.write(out, v)


class StringMap(Field):
    """`[Key Value]` with two strings each, as a dict (properties, arguments)."""

    _pairs = Array(String(), String())

    def read(self, r: In) -> dict[str, str]:
        return dict(self._pairs.read(r))

    def steps(self, r: In) -> Steps:
        return dict((yield from self._pairs.steps(r)))

    def write(self, out: bytearray, value: Any) -> None:
        self._pairs.write(out, list(value.items()))


class IntMap(Field):
    """`[Key int64]` as a dict (stream statistics)."""

    _pairs = Array(String(), I64)

    def read(self, r: In) -> dict[str, int]:
        return dict(self._pairs.read(r))

    def write(self, out: bytearray, value: Any) -> None:
        self._pairs.write(out, list(value.items()))


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a subscription starts: `type` (codes.OffsetType) and, for OFFSET and TIMESTAMP, `value`
    (an offset, or milliseconds since the epoch)."""

    type: OffsetType
    value: int = 0


class OffsetSpecField(Field):
    """OffsetType (uint16) then, for OFFSET a uint64 and for TIMESTAMP an int64."""

    def __init__(self, allow_none: bool = False) -> None:
        # allow_none: a consumer update response, where RabbitMQ also ignores whatever value follows a
        # type without one (rstream always sends 8 bytes of offset, even for `next`)
        self.allow_none = allow_none

    def read(self, r: In) -> OffsetSpec:
        raw = r.fixed(_U16)
        try:
            kind = OffsetType(raw)
        except ValueError:
            raise UnknownFrame(f"unknown offset type {raw}") from None
        if kind == OffsetType.NONE and not self.allow_none:
            raise UnknownFrame("offset type 0 (none) is only valid in a consumer update response")
        if kind == OffsetType.OFFSET:
            return OffsetSpec(kind, r.fixed(_U64))
        if kind == OffsetType.TIMESTAMP:
            return OffsetSpec(kind, r.fixed(_I64))
        if self.allow_none:
            r.rest()
        return OffsetSpec(kind)

    def write(self, out: bytearray, value: Any) -> None:
        out += _U16.pack(value.type)
        if value.type == OffsetType.OFFSET:
            out += _U64.pack(value.value)
        elif value.type == OffsetType.TIMESTAMP:
            out += _I64.pack(value.value)


STRING = String()
BYTES = Bytes()
BOOL = Bool()
STRING_MAP = StringMap()
INT_MAP = IntMap()
STRINGS = Array(STRING)
U64S = Array(U64)
OFFSET_SPEC = OffsetSpecField()

__all__ = ["BOOL", "BYTES", "I16", "I32", "I64", "INT_MAP", "OFFSET_SPEC", "STEP_ENTRIES", "STRING", "STRINGS",
           "STRING_MAP", "U8", "U16", "U32", "U64", "U64S", "Array", "Field", "In", "OffsetSpec", "OffsetSpecField",
           "OptionalTail", "Steps", "one_step", "read_string", "write_string"]
