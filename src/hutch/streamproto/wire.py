"""The stream protocol's field types: how each is read from and written to a frame body.

Owns the primitive codecs (integers, `string`: int16 length, `bytes`: int32 length, -1 for null, and
arrays: an int32 count) and the composite fields the commands share (string maps, offset
specifications, broker and stream metadata, command versions, statistics). A `Field` reads with
`read(In)` and writes with `write(out, value)`; the records in `commands` list their fields in order.

Rules: reading past the end or a string that is not UTF-8 raises `UnknownFrame`; an array's count is
never trusted for an allocation (elements are read one by one, so a frame's size bounds the work). The
maps and arrays a client sends (properties, arguments, stream names, partitions, command versions) hold
at most `MAX_MAP_ENTRIES` entries, checked at the count before any is read (`TooManyEntries`): a 1 MiB
frame holds ~45,000 empty-ish entries, 116 ms of decoding on the loop at once. RabbitMQ's stream plugin
reads any count a frame holds (`parse_map` has no bound) and the clients (rstream, rbfly, the Java and
js clients) set none; what they send is a few properties, the application's filter values (meant for
a Bloom filter of at most 255 bytes: past a few hundred values every chunk matches), at most 128
partitions (`max_super_stream_partitions`) and the streams one metadata request names. The arrays the
server sends (confirms, metadata answers) are not capped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from hutch.streamproto.codes import OffsetType
from hutch.streamproto.errors import TooManyEntries, UnknownFrame

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


class Field:
    """One field type: `read` from an `In`, `write` appends to a bytearray."""

    def read(self, r: In) -> Any:
        raise NotImplementedError

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

    def write(self, out: bytearray, value: Any) -> None:
        if value != self.empty:
            self.inner.write(out, value)


MAX_MAP_ENTRIES = 1024
"""Entries of a map or array a client's command may hold (see the module's rules): 2.6 ms of decoding."""


class Array(Field):
    """`[T]`: an int32 count then the elements (a tuple of fields per element when `row`); at most
    `max_count` of them (None: what the frame holds, for what the server sends)."""

    def __init__(self, *row: Field, max_count: int | None = None) -> None:
        self.row = row
        self.max_count = max_count

    def read(self, r: In) -> list[Any]:
        count = r.fixed(_I32)
        if count < 0:
            raise UnknownFrame("negative array length")
        if self.max_count is not None and count > self.max_count:
            raise TooManyEntries(count, self.max_count)
        items: list[Any] = []
        for _ in range(count):
            if len(self.row) == 1:
                items.append(self.row[0].read(r))
            else:
                items.append(tuple(f.read(r) for f in self.row))
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

    _pairs = Array(String(), String(), max_count=MAX_MAP_ENTRIES)

    def read(self, r: In) -> dict[str, str]:
        return dict(self._pairs.read(r))

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
STRINGS = Array(STRING, max_count=MAX_MAP_ENTRIES)
U64S = Array(U64)
OFFSET_SPEC = OffsetSpecField()

__all__ = ["BOOL", "BYTES", "I16", "I32", "I64", "INT_MAP", "MAX_MAP_ENTRIES", "OFFSET_SPEC", "STRING", "STRINGS",
           "STRING_MAP", "U8", "U16", "U32", "U64", "U64S", "Array", "Field", "In", "OffsetSpec", "OffsetSpecField",
           "OptionalTail", "read_string", "write_string"]
