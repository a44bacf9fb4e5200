"""Stream entries as AMQP 1.0 messages, and their conversion from and to AMQP 0-9-1 publishes.

Owns: the AMQP 1.0 type codec (the subset messages use: null, booleans, integers, floats, timestamps,
uuids, binary, strings, symbols, lists, maps, arrays, described values), the message sections (header,
message annotations, properties, application properties, data / amqp-value / amqp-sequence, footer), and
the mapping between a 0-9-1 message and an entry. RabbitMQ stores stream entries as AMQP 1.0 messages,
so a message published with pika reads as AMQP 1.0 in a stream-protocol client, and back.

The mapping (RabbitMQ's `mc_amqpl:convert_to(mc_amqp, ...)`, 4.x):
- header: durable = delivery-mode 2, priority, ttl = expiration (ms);
- properties: message-id, user-id (binary), reply-to, correlation-id, content-type and content-encoding
  (symbols), creation-time = timestamp × 1000, group-id = app-id;
- application-properties: the headers whose names do not start with "x-";
- message-annotations: the "x-" headers, `x-basic-type` (the type property), `x-exchange` and
  `x-routing-key` (where the message was published, RabbitMQ 3.x's annotations), and
  `x-basic-delivery-mode` when it is 1 (so 0-9-1 readers get back exactly what was sent);
- body: one data section.
Back to 0-9-1, the same in reverse, and RabbitMQ 3.x's layout is read too (what 3.10 writes for a 0-9-1
publish: no header section, `x-basic-priority` / `x-basic-delivery-mode` / `x-basic-expiration` among the
annotations, `x-basic-type` / `x-basic-app-id` and every header among the application properties); a message from an AMQP 1.0 client with no 0-9-1 origin gets its data
sections concatenated as the body, an amqp-value holding binary or a string as the body, anything else
the encoded body sections as they are.

Rules: decoding is bounded by its input (no length is trusted past the buffer; nesting at most
`MAX_DEPTH`); bad input raises `ValueError`.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any, NamedTuple

from hutch.amqp.spec import BasicProperties
from hutch.amqp.speedups import stream_plain_run
from hutch.amqp.table import Timestamp, TypedInt
from hutch.core.message import Message, encode_shortstr

MAX_DEPTH = 32


class Symbol(str):
    """An AMQP 1.0 symbol (an ASCII name), kept apart from a string."""

    __slots__ = ()


class Described:
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Described) and (self.descriptor, self.value) == (other.descriptor, other.value)

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class AmqpTimestamp(int):
    """An AMQP 1.0 timestamp: ms since the epoch."""

    __slots__ = ()


class ULong(int):
    __slots__ = ()


_U64 = (1 << 64) - 1


def timestamp_ms(seconds: int) -> AmqpTimestamp:
    """A 0-9-1 timestamp (any u64 of seconds) as an AMQP 1.0 one (a signed 64-bit count of ms), wrapped to 64
    bits as RabbitMQ wraps it (Erlang's `<<T:64/signed>>`): 2^62 s and more do not fit, and a publish carrying
    one is stored, not refused (RabbitMQ 3.10.8 delivers 2^62 and 2^63 back as 0, 2^64-1 as 2^64-1)."""
    ms = (int(seconds) * 1000) & _U64
    return AmqpTimestamp(ms - (1 << 64) if ms >> 63 else ms)


def timestamp_s(ms: int) -> int:
    """An AMQP 1.0 timestamp as 0-9-1 seconds: ms divided towards zero (Erlang's `div`), wrapped to a u64."""
    seconds = ms // 1000 if ms >= 0 else -(-ms // 1000)
    return seconds & _U64


# section descriptors (ulong codes)
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78

_b, _B, _h, _H = struct.Struct(">b"), struct.Struct(">B"), struct.Struct(">h"), struct.Struct(">H")
_i, _I, _q, _Q = struct.Struct(">i"), struct.Struct(">I"), struct.Struct(">q"), struct.Struct(">Q")
_f, _d = struct.Struct(">f"), struct.Struct(">d")


# -- encoding -------------------------------------------------------------------------------------
def encode_value(value: Any, out: list[bytes]) -> None:
    if value is None:
        out.append(b"\x40")
    elif isinstance(value, bool):
        out.append(b"\x41" if value else b"\x42")
    elif isinstance(value, Described):
        out.append(b"\x00")
        encode_value(value.descriptor, out)
        encode_value(value.value, out)
    elif isinstance(value, AmqpTimestamp):
        out.append(b"\x83" + _q.pack(value))
    elif isinstance(value, ULong):
        out.append(b"\x53" + _B.pack(value) if value < 256 else b"\x80" + _Q.pack(value))
    elif isinstance(value, TypedInt):
        _encode_typed_int(value, out)
    elif isinstance(value, int):
        if -128 <= value < 128:
            out.append(b"\x55" + _b.pack(value))
        elif -(2**63) <= value < 2**63:
            out.append(b"\x81" + _q.pack(value))
        else:
            out.append(b"\x80" + _Q.pack(value))
    elif isinstance(value, float):
        out.append(b"\x82" + _d.pack(value))
    elif isinstance(value, Symbol):
        raw = value.encode("utf-8")  # ASCII by the spec; a 0-9-1 shortstr may carry more: kept as UTF-8
        out.append((b"\xa3" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb3" + _I.pack(len(raw))) + raw)
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out.append((b"\xa1" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb1" + _I.pack(len(raw))) + raw)
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out.append((b"\xa0" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb0" + _I.pack(len(raw))) + raw)
    elif isinstance(value, uuid.UUID):
        out.append(b"\x98" + value.bytes)
    elif isinstance(value, list | tuple):
        items: list[bytes] = []
        for item in value:
            encode_value(item, items)
        body = b"".join(items)
        out.append(b"\xd0" + _I.pack(len(body) + 4) + _I.pack(len(value)) + body)
    elif isinstance(value, dict):
        items = []
        for k, v in value.items():
            encode_value(k, items)
            encode_value(v, items)
        body = b"".join(items)
        out.append(b"\xd1" + _I.pack(len(body) + 4) + _I.pack(len(value) * 2) + body)
    elif isinstance(value, Decimal):
        encode_value(str(value), out)
    elif isinstance(value, datetime.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        out.append(b"\x83" + _q.pack(int(when.timestamp() * 1000)))
    else:
        raise ValueError(f"cannot encode {type(value).__name__} as AMQP 1.0")


# a 0-9-1 integer's field letter -> the AMQP 1.0 type code and struct of the same width and sign
_TYPED_INTS: dict[str, tuple[bytes, struct.Struct]] = {
    "b": (b"\x51", _b), "B": (b"\x50", _B), "s": (b"\x61", _h), "u": (b"\x60", _H), "I": (b"\x71", _i),
    "i": (b"\x70", _I), "l": (b"\x81", _q), "L": (b"\x81", _q),
}


def _encode_typed_int(value: TypedInt, out: list[bytes]) -> None:
    code, fmt = _TYPED_INTS.get(value.letter, (b"\x81", _q))
    out.append(code + fmt.pack(value))


def section(code: int, value: Any) -> bytes:
    out: list[bytes] = []
    encode_value(Described(ULong(code), value), out)
    return b"".join(out)


# -- decoding -------------------------------------------------------------------------------------
def _need(buf: memoryview, pos: int, n: int) -> None:
    if pos + n > len(buf):
        raise ValueError("AMQP 1.0 value runs past its buffer")


def _fixed(fmt: struct.Struct, wrap: Callable[[Any], Any] = lambda v: v) -> Callable[[memoryview, int], tuple[Any, int]]:
    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        _need(buf, pos, fmt.size)
        return wrap(fmt.unpack_from(buf, pos)[0]), pos + fmt.size
    return read


def _var(size: struct.Struct, kind: str) -> Callable[[memoryview, int], tuple[Any, int]]:
    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        _need(buf, pos, size.size)
        (n,) = size.unpack_from(buf, pos)
        pos += size.size
        _need(buf, pos, n)
        raw = bytes(buf[pos:pos + n])
        if kind == "str":
            return raw.decode("utf-8"), pos + n
        if kind == "sym":
            return Symbol(raw.decode("utf-8")), pos + n
        return raw, pos + n
    return read


_SIMPLE: dict[int, Callable[[memoryview, int], tuple[Any, int]]] = {
    0x50: _fixed(_B), 0x51: _fixed(_b), 0x60: _fixed(_H), 0x61: _fixed(_h), 0x70: _fixed(_I), 0x71: _fixed(_i),
    0x80: _fixed(_Q, ULong), 0x81: _fixed(_q), 0x72: _fixed(_f), 0x82: _fixed(_d), 0x83: _fixed(_q, AmqpTimestamp),
    0x52: _fixed(_B), 0x53: _fixed(_B, ULong), 0x54: _fixed(_b), 0x55: _fixed(_b), 0x56: _fixed(_B, bool),
    0xa0: _var(_B, "bin"), 0xb0: _var(_I, "bin"), 0xa1: _var(_B, "str"), 0xb1: _var(_I, "str"),
    0xa3: _var(_B, "sym"), 0xb3: _var(_I, "sym"),
}
_CONST: dict[int, Any] = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: ULong(0), 0x45: []}


def decode_value(buf: memoryview, pos: int, depth: int = 0) -> tuple[Any, int]:
    _need(buf, pos, 1)
    return _decode_as(buf[pos], buf, pos + 1, depth)


def _decode_as(code: int, buf: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    """The value of type `code` whose bytes start at `pos` (after the constructor)."""
    if depth > MAX_DEPTH:
        raise ValueError("AMQP 1.0 value nested too deep")
    if code == 0xa1 or code == 0xa3:  # str8 / sym8, the most common values: inlined
        if pos >= len(buf):
            raise ValueError("AMQP 1.0 value runs past its buffer")
        end = pos + 1 + buf[pos]
        if end > len(buf):
            raise ValueError("AMQP 1.0 value runs past its buffer")
        text = bytes(buf[pos + 1:end]).decode("utf-8")
        return (text if code == 0xa1 else Symbol(text)), end
    if code in _CONST:
        value = _CONST[code]
        return (list(value) if isinstance(value, list) else value), pos
    reader = _SIMPLE.get(code)
    if reader is not None:
        return reader(buf, pos)
    if code == 0x00:
        descriptor, pos = decode_value(buf, pos, depth + 1)
        value, pos = decode_value(buf, pos, depth + 1)
        return Described(descriptor, value), pos
    if code == 0x98:
        _need(buf, pos, 16)
        return uuid.UUID(bytes=bytes(buf[pos:pos + 16])), pos + 16
    if code in (0xc0, 0xc1, 0xd0, 0xd1, 0xe0, 0xf0):
        width = _B if code in (0xc0, 0xc1, 0xe0) else _I
        _need(buf, pos, 2 * width.size)
        size, count = width.unpack_from(buf, pos)[0], width.unpack_from(buf, pos + width.size)[0]
        end = pos + width.size + size
        _need(buf, pos, width.size + size)
        pos += 2 * width.size
        values: list[Any] = []
        if code in (0xe0, 0xf0):  # an array: one constructor shared by its count values
            _need(buf, pos, 1)
            ctor = buf[pos]
            pos += 1
            for _ in range(count):
                value, pos = _decode_as(ctor, buf, pos, depth + 1)
                values.append(value)
        else:
            for _ in range(count):
                value, pos = decode_value(buf, pos, depth + 1)
                values.append(value)
        if pos > end:
            raise ValueError("AMQP 1.0 compound runs past its size")
        if code in (0xc1, 0xd1):
            return dict(zip(values[0::2], values[1::2], strict=False)), end
        return values, end
    raise ValueError(f"unknown AMQP 1.0 type code 0x{code:02x}")


def _sections(buf: memoryview) -> list[tuple[int, Any, int, int]]:
    """(descriptor code, value, start, end) of each section; a data section's value is its bytes, sliced
    without the generic decoder (the hot path of a consumer)."""
    out: list[tuple[int, Any, int, int]] = []
    pos, n = 0, len(buf)
    while pos < n:
        start = pos
        if n - pos >= 5 and buf[pos] == 0x00 and buf[pos + 1] == 0x53:
            code = buf[pos + 2]
            pos += 3
            ctor = buf[pos]
            if code == DATA and ctor in (0xa0, 0xb0):
                width = 1 if ctor == 0xa0 else 4
                _need(buf, pos + 1, width)
                length = buf[pos + 1] if width == 1 else _I.unpack_from(buf, pos + 1)[0]
                pos += 1 + width
                _need(buf, pos, length)
                out.append((DATA, bytes(buf[pos:pos + length]), start, pos + length))
                pos += length
                continue
            if code in (HEADER, MESSAGE_ANNOTATIONS):
                # the same few header and annotation sections recur in every message of a publisher
                value, pos = _decode_cached(buf, pos)
            else:
                value, pos = decode_value(buf, pos)
            out.append((code, value, start, pos))
            continue
        value, pos = decode_value(buf, pos)
        if not isinstance(value, Described) or not isinstance(value.descriptor, int):
            raise ValueError("an AMQP 1.0 message section is a described value with a numeric descriptor")
        out.append((int(value.descriptor), value.value, start, pos))
    return out


def _decode_cached(buf: memoryview, pos: int) -> tuple[Any, int]:
    """decode_value through a bounded cache keyed by the value's bytes (callers never mutate the result:
    `to_091` copies what it keeps)."""
    value, end = _compound_end(buf, pos)
    if value is None:
        return decode_value(buf, pos)
    key = bytes(buf[pos:end])
    cached = _DECODED_CACHE.get(key)
    if cached is None:
        cached = _cache_put(_DECODED_CACHE, key, decode_value(memoryview(key), 0)[0])
    return cached, end


def _compound_end(buf: memoryview, pos: int) -> tuple[bool | None, int]:
    """(True, end) of a list or map at `pos` no longer than 512 bytes, else (None, pos)."""
    if pos >= len(buf):
        return None, pos
    code = buf[pos]
    if code in (0xc0, 0xc1) and pos + 1 < len(buf):
        end = pos + 2 + buf[pos + 1]
    elif code in (0xd0, 0xd1) and pos + 5 <= len(buf):
        end = pos + 5 + _I.unpack_from(buf, pos + 1)[0]
    else:
        return None, pos
    if end > len(buf) or end - pos > 512:
        return None, pos
    return True, end


def decode_sections(data: bytes | memoryview) -> list[tuple[int, Any, bytes]]:
    """(descriptor code, value, the section's encoded bytes) of each section of a message."""
    buf = memoryview(data)
    pos = 0
    out: list[tuple[int, Any, bytes]] = []
    while pos < len(buf):
        start = pos
        value, pos = decode_value(buf, pos)
        if not isinstance(value, Described) or not isinstance(value.descriptor, int):
            raise ValueError("an AMQP 1.0 message section is a described value with a numeric descriptor")
        out.append((int(value.descriptor), value.value, bytes(buf[start:pos])))
    return out


# -- 0-9-1 ⇄ entry --------------------------------------------------------------------------------


def _str8(value: str, out: list[bytes]) -> None:
    raw = value.encode("utf-8")
    out.append((b"\xa1" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb1" + _I.pack(len(raw))) + raw)


def _plain_prefix(exchange: str, routing_key: str, mode: int | None) -> bytes:
    """The header and message-annotations sections `from_091`'s plain layout writes."""
    parts: list[bytes] = []
    _str8(exchange, parts)
    _str8(routing_key, parts)
    pairs = b"".join((_SYM_EXCHANGE, parts[0], _SYM_ROUTING_KEY, parts[1], _MODE1_PAIR if mode == 1 else b""))
    count = 6 if mode == 1 else 4
    return b"".join((_HEADER_DURABLE_TRUE if mode == 2 else _HEADER_DURABLE_FALSE,
                     b"\x00\x53\x72\xd1" + _I.pack(len(pairs) + 4) + _I.pack(count) + pairs))


class _PrefixMemo(dict[Any, Any]):
    """A bounded memo of the sections that precede a plain entry's data, both ways (encoding: keyed by
    (exchange, routing key, mode); decoding: keyed by the prefix bytes). A stream's publishers use few
    (exchange, routing key) pairs; past `PREFIX_MEMO_MAX` entries it starts again empty, so it never holds
    more than that many prefixes of at most ~600 bytes whatever clients send."""

    def put(self, key: Any, value: Any) -> Any:
        if len(self) >= PREFIX_MEMO_MAX:
            self.clear()
        self[key] = value
        return value


PREFIX_MEMO_MAX = 1024
_prefixes = _PrefixMemo()  # (exchange, routing key, mode) -> prefix bytes
_heads = _PrefixMemo()  # prefix bytes -> _PlainHead


def plain_mode(raw: bytes) -> int | None | bool:
    """The delivery mode of a plain property list (none, or only the delivery mode, 1 or 2), read from
    the raw list without decoding it: None when there is no property, False when the list is not plain."""
    flags = raw[0] << 8 | raw[1]
    if flags == 0:
        return None
    if flags == 0x1000 and len(raw) == 3 and raw[2] in (1, 2):
        return raw[2]
    return False


def _memo_prefix(exchange: str, routing_key: str, mode: int | None) -> bytes:
    """The sections before a plain entry's data (`_plain_prefix`), memoized."""
    key = (exchange, routing_key, mode)
    prefix: bytes | None = _prefixes.get(key)
    if prefix is None:
        prefix = _prefixes.put(key, _plain_prefix(exchange, routing_key, mode))
    return prefix


def plain_entry(exchange: str, routing_key: str, mode: int | None, body: bytes) -> bytes:
    """The AMQP 1.0 entry of a plain message (`plain_mode` not False): header, the two annotations (three
    with delivery mode 1), data; the same bytes the generic encoder writes. The sections before the data
    depend only on (exchange, routing key, mode): memoized (`_PrefixMemo`)."""
    prefix = _memo_prefix(exchange, routing_key, mode)
    blen = len(body)
    return b"".join((
        prefix, (b"\x00\x53\x75\xa0" + _B.pack(blen) if blen < 256 else b"\x00\x53\x75\xb0" + _I.pack(blen)),
        body))


def plain_entries(exchange: str, routing_key: str, route_tail: bytes, contents: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The entries of a run of publishes to one (exchange, routing key), each given as its content-header
    payload (class 60, weight 0, body size, fixed-size properties only) and body: `plain_entry` of each
    plain one, the generic encoding of any other (a priority, a timestamp); `from_091` of each message."""
    prefixes: dict[bytes, bytes] = {}  # property list -> the sections before the data
    out: list[bytes] = []
    append = out.append
    for header, body in contents:
        raw = header[12:]
        prefix = prefixes.get(raw)
        if prefix is None:
            mode = plain_mode(raw)
            if mode is False:
                append(_from_091(Message(exchange, routing_key, None, body, raw, route_tail, header)))
                continue
            prefix = prefixes[raw] = _memo_prefix(exchange, routing_key, mode)
        blen = len(body)
        append(prefix + (b"\x00\x53\x75\xa0" + _B.pack(blen) if blen < 256 else b"\x00\x53\x75\xb0" + _I.pack(blen))
               + body)
    return out


def from_091(msg: Message) -> bytes:
    """The AMQP 1.0 encoding of a 0-9-1 message, as RabbitMQ stores it in a stream."""
    # plain: no property but (maybe) the delivery mode (the common case), without the generic encoder
    mode = plain_mode(msg.properties_raw)
    if mode is not False:
        return plain_entry(msg.exchange, msg.routing_key, mode, bytes(msg.body))
    return _from_091(msg)


def _from_091(msg: Message) -> bytes:
    p = msg.properties
    headers = p.headers or {}
    out: list[bytes] = []
    ttl = None
    if p.expiration is not None:
        try:
            ttl = int(p.expiration)
        except ValueError:
            ttl = None
    header_key = (p.delivery_mode == 2, p.priority, ttl)
    encoded = _HEADER_CACHE.get(header_key)
    if encoded is None:
        fields: list[Any] = [p.delivery_mode == 2, None if p.priority is None else TypedInt(p.priority, "B"),
                             None if ttl is None else TypedInt(ttl, "i")]
        encoded = _cache_put(_HEADER_CACHE, header_key, section(HEADER, _trim(fields)))
    out.append(encoded)
    if not headers:  # the annotations depend on a few strings only: encoded once per combination
        ma_key = (msg.exchange, msg.routing_key, p.type, p.delivery_mode, None if ttl is not None else p.expiration)
        encoded = _MA_CACHE.get(ma_key)
        if encoded is None:
            encoded = _cache_put(_MA_CACHE, ma_key, section(MESSAGE_ANNOTATIONS, _annotations(msg, ttl, {})))
        out.append(encoded)
    else:
        app: dict[Any, Any] = {}
        annotations = _annotations(msg, ttl, app)
        out.append(section(MESSAGE_ANNOTATIONS, annotations))
    props = [p.message_id, None if p.user_id is None else p.user_id.encode(), None, None, p.reply_to,
             p.correlation_id, None if p.content_type is None else Symbol(p.content_type),
             None if p.content_encoding is None else Symbol(p.content_encoding), None,
             None if p.timestamp is None else timestamp_ms(p.timestamp), p.app_id]
    if any(v is not None for v in props):
        out.append(section(PROPERTIES, _trim(props)))
    if headers and app:
        out.append(section(APPLICATION_PROPERTIES, app))
    body = bytes(msg.body)
    blen = len(body)
    out.append(b"\x00\x53\x75\xa0" + _B.pack(blen) if blen < 256 else b"\x00\x53\x75\xb0" + _I.pack(blen))
    out.append(body)
    return b"".join(out)


_CACHE_MAX = 1024
_HEADER_CACHE: dict[Any, bytes] = {}
_MA_CACHE: dict[Any, bytes] = {}
_DECODED_CACHE: dict[bytes, Any] = {}


def _cache_put(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Remember an encoded or decoded section (bounded: the cache is emptied when full)."""
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def _annotations(msg: Message, ttl: int | None, app: dict[Any, Any]) -> dict[Any, Any]:
    """The message annotations of a 0-9-1 message; its other headers go into `app`."""
    p = msg.properties
    annotations: dict[Any, Any] = {Symbol("x-exchange"): msg.exchange, Symbol("x-routing-key"): msg.routing_key}
    if p.type is not None:
        annotations[Symbol("x-basic-type")] = p.type
    if p.delivery_mode is not None and p.delivery_mode != 2:
        annotations[Symbol("x-basic-delivery-mode")] = TypedInt(p.delivery_mode, "B")
    if p.expiration is not None and ttl is None:
        annotations[Symbol("x-basic-expiration")] = p.expiration
    for key, value in (p.headers or {}).items():
        if key.startswith("x-") and key not in _RESERVED:
            annotations[Symbol(key)] = value
        else:
            app[key] = value
    return annotations


_HEADER_DURABLE_TRUE = section(HEADER, [True])
_HEADER_DURABLE_FALSE = section(HEADER, [False])
_SYM_EXCHANGE = b"\xa3\x0ax-exchange"
_SYM_ROUTING_KEY = b"\xa3\x0dx-routing-key"
_MODE1_PAIR = b"\xa3\x15x-basic-delivery-mode\x50\x01"

# annotations this mapping writes itself: a client header of the same name travels as an application
# property instead (and comes back as the same header)
_RESERVED = frozenset({"x-exchange", "x-routing-key", "x-basic-type", "x-basic-delivery-mode",
                       "x-basic-expiration"})


def _trim(fields: list[Any]) -> list[Any]:
    while fields and fields[-1] is None:
        fields.pop()
    return fields


def _header_value(value: Any) -> Any:
    """An AMQP 1.0 value as a 0-9-1 field-table value."""
    if isinstance(value, AmqpTimestamp):
        return Timestamp(timestamp_s(value))
    if isinstance(value, Symbol):
        return str(value)
    if isinstance(value, ULong):
        return TypedInt(value, "l") if value < 2**63 else str(int(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Described):
        return _header_value(value.value)
    if isinstance(value, list):
        return [_header_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _header_value(v) for k, v in value.items()}
    return value


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return f"urn:uuid:{value}"
    return str(value)


_MA_START = b"\x00\x53\x72\xd1"
_FAST_LEN = len(_HEADER_DURABLE_TRUE)


_OFFSET_FLAGS_MODE = struct.pack(">H", 0x2000 | 0x1000)  # headers and delivery-mode present
_OFFSET_FLAGS = struct.pack(">H", 0x2000)
_OFFSET_TABLE_PREFIX = _I.pack(25) + b"\x0fx-stream-offset" + b"l"


def to_091_at(entry: bytes | memoryview, offset: int, default_routing_key: str = "") -> Message:
    """`to_091` with the header x-stream-offset = `offset` (a long), as a stream delivers an entry. A plain
    entry (what `from_091` writes for a message without properties) gets its 0-9-1 property list packed
    directly (the consumer's hot path: `to_091_list`, a chunk at a time)."""
    bad: list[tuple[int, str]] = []
    got = to_091_list([(offset, bytes(entry))], default_routing_key, bad)
    if bad:
        raise ValueError(bad[0][1])
    return got[0][1]


def to_091_list(records: Iterable[tuple[int, bytes]], default_routing_key: str = "",
                bad: list[tuple[int, str]] | None = None) -> list[tuple[int, Message]]:
    """`to_091_at` over one chunk's records at once: (offset, message) of each. A record that is not an
    AMQP 1.0 message is left out and, with `bad`, listed there as (offset, why)."""
    out: list[tuple[int, Message]] = []
    append = out.append
    split = _plain_parts
    with_mode, without_mode = _OFFSET_FLAGS_MODE + _OFFSET_TABLE_PREFIX, _OFFSET_FLAGS + _OFFSET_TABLE_PREFIX
    # the previous plain record's prefix: a chunk's records mostly share it (one publisher, one route), and
    # a record that starts with those same bytes has the same head, so only its data section is read, by
    # `stream_plain_run` (compiled: amqp/_cframes.pyx) for the whole run of such records at once
    records = records if isinstance(records, list) else list(records)
    last_prefix = b""
    last_head: _PlainHead | None = None
    last_raw = (b"", b"")
    i, n = 0, len(records)
    while i < n:
        if last_head is not None:
            i = stream_plain_run(records, i, last_prefix, last_raw[0], last_raw[1], last_head.exchange,
                                 last_head.routing_key, last_head.route_tail, Message, out)
            if i >= n:
                break
        offset, entry = records[i]
        i += 1
        parts = split(entry)
        if parts is None:
            try:
                append((offset, to_091(entry, "", default_routing_key, {"x-stream-offset": TypedInt(offset, "l")})))
            except ValueError as exc:
                if bad is not None:
                    bad.append((offset, str(exc)))
            continue
        head, end, body = parts
        mode = head.mode
        last_raw = (without_mode, b"") if mode is None else (with_mode, _MODE_BYTE[mode])
        last_head, last_prefix = head, bytes(entry[:end])
        raw = last_raw[0] + _q.pack(offset) + last_raw[1]
        append((offset, Message(head.exchange, head.routing_key, None, body, properties_raw=raw,
                                route_tail=head.route_tail)))
    return out


_MODE_BYTE = {m: bytes((m,)) for m in range(256)}


def _plain_091(entry: bytes | memoryview, extra_headers: dict[str, Any] | None) -> Message | None:
    """The message `from_091`'s fast path wrote (header, x-exchange and x-routing-key, one data section),
    read without the generic decoder; None for any other layout."""
    plain = _plain_split(entry)
    if plain is None:
        return None
    head, body = plain
    props = BasicProperties(delivery_mode=head.mode, headers=dict(extra_headers) if extra_headers else None)
    return Message(head.exchange, head.routing_key, props, body, route_tail=head.route_tail)


class _PlainHead(NamedTuple):
    """What the sections before a plain entry's data say (and the 0-9-1 route tail they make)."""

    exchange: str
    routing_key: str
    mode: int | None
    route_tail: bytes


_MAX_PLAIN_PREFIX = _FAST_LEN + 12 + 2 * 257 + 13 + 15 + len(_MODE1_PAIR)  # two str8 of at most 255 bytes


def _plain_split(entry: bytes | memoryview) -> tuple[_PlainHead, bytes] | None:
    """(head, body) of an entry in `from_091`'s plain layout, else None."""
    parts = _plain_parts(entry)
    return None if parts is None else (parts[0], parts[2])


def _plain_parts(entry: bytes | memoryview) -> tuple[_PlainHead, int, bytes] | None:
    """(head, prefix length, body) of an entry in `from_091`'s plain layout, else None. The head is parsed
    once per distinct prefix (the memo `_heads`); per entry only the prefix lookup and the data section
    remain."""
    data = entry if isinstance(entry, bytes) else bytes(entry)
    size = len(data)
    if size < _FAST_LEN + 12 or data[_FAST_LEN:_FAST_LEN + 4] != _MA_START:
        return None
    end = _FAST_LEN + 8 + _I.unpack_from(data, _FAST_LEN + 4)[0]
    if end > _MAX_PLAIN_PREFIX or end + 5 > size:
        return None
    prefix = data[:end]
    head = _heads.get(prefix)
    if head is None:
        head = _parse_plain_head(prefix)
        if head is None:
            return None
        _heads.put(prefix, head)
    body = _data_body(data, end)
    return None if body is None else (head, end, body)


def _data_body(data: bytes, end: int) -> bytes | None:
    """The body of the one data section that must fill `data` from `end` to its end, else None."""
    size = len(data)
    if end + 5 > size or data[end:end + 3] != b"\x00\x53\x75":
        return None
    ctor = data[end + 3]
    if ctor == 0xa0:
        length, pos = data[end + 4], end + 5
    elif ctor == 0xb0:
        if end + 8 > size:
            return None
        length, pos = _I.unpack_from(data, end + 4)[0], end + 8
    else:
        return None
    if pos + length != size:
        return None
    return data[pos:]


def _parse_plain_head(data: bytes) -> _PlainHead | None:
    """The head of a plain entry from exactly its header and message-annotations sections, else None."""
    head = data[:_FAST_LEN]
    if head == _HEADER_DURABLE_TRUE:
        mode: int | None = 2
    elif head == _HEADER_DURABLE_FALSE:
        mode = None
    else:
        return None
    pos = _FAST_LEN
    if data[pos:pos + 4] != _MA_START or data[pos + 8:pos + 11] != b"\x00\x00\x00" or data[pos + 11] not in (4, 6):
        return None
    pairs = data[pos + 11]
    end = pos + 8 + int.from_bytes(data[pos + 4:pos + 8], "big")
    pos += 12
    texts: list[str] = []
    tail: list[bytes] = []
    for key in (_SYM_EXCHANGE, _SYM_ROUTING_KEY):
        if data[pos:pos + len(key)] != key:
            return None
        pos += len(key)
        if pos + 1 >= len(data) or data[pos] != 0xa1:
            return None
        n = data[pos + 1]
        text = data[pos + 2:pos + 2 + n].decode("utf-8", "replace")
        texts.append(text)
        tail.append(encode_shortstr(text))
        pos += 2 + n
    if pairs == 6:
        if mode is not None or data[pos:pos + len(_MODE1_PAIR)] != _MODE1_PAIR:
            return None
        mode, pos = 1, pos + len(_MODE1_PAIR)
    if pos != end or end != len(data):
        return None
    return _PlainHead(texts[0], texts[1], mode, b"".join(tail))


def to_091(entry: bytes | memoryview, default_exchange: str = "", default_routing_key: str = "",
           extra_headers: dict[str, Any] | None = None) -> Message:
    """The 0-9-1 message for a stream entry (an AMQP 1.0 message); `extra_headers` are added to its
    headers (the consumer's x-stream-offset)."""
    fast = _plain_091(entry, extra_headers)
    if fast is not None:
        return fast
    props = BasicProperties()
    headers: dict[str, Any] = {}
    buf = memoryview(entry)
    bodies: list[bytes] = []
    raw_body: list[bytes] = []
    value_body: Any = None
    exchange, routing_key = default_exchange, default_routing_key
    saw_header = False
    for code, value, start, end in _sections(buf):
        if code == HEADER and isinstance(value, list):
            saw_header = True
            value = value + [None] * (3 - len(value))
            if value[0]:
                props.delivery_mode = 2
            props.priority = value[1]
            if value[2] is not None:
                props.expiration = str(value[2])
        elif code == MESSAGE_ANNOTATIONS and isinstance(value, dict):
            for k, v in value.items():
                key = str(k)
                if key == "x-exchange":
                    exchange = str(v)
                elif key == "x-routing-key":
                    routing_key = str(v)
                elif key == "x-basic-type":
                    props.type = str(v)
                elif key == "x-basic-delivery-mode":
                    props.delivery_mode = int(v)
                elif key == "x-basic-expiration":
                    props.expiration = str(v)
                elif key == "x-basic-priority":  # RabbitMQ 3.x's place for it
                    props.priority = int(v)
                elif key.startswith("x-"):
                    headers[key] = _header_value(v)
        elif code == PROPERTIES and isinstance(value, list):
            f = value + [None] * (13 - len(value))
            props.message_id = _str(f[0])
            props.user_id = _str(f[1])
            props.reply_to = _str(f[4])
            props.correlation_id = _str(f[5])
            props.content_type = _str(f[6])
            props.content_encoding = _str(f[7])
            if f[9] is not None:
                props.timestamp = timestamp_s(int(f[9]))
            props.app_id = _str(f[10])
        elif code == APPLICATION_PROPERTIES and isinstance(value, dict):
            for k, v in value.items():
                key = str(k)
                # RabbitMQ 3.x's places for these two (its layout has no header section; in hutch's and
                # 4.x's, an application property of that name is a client's header)
                if key == "x-basic-type" and not saw_header:
                    props.type = str(v)
                elif key == "x-basic-app-id" and not saw_header:
                    props.app_id = str(v)
                else:
                    headers[key] = _header_value(v)
        elif code == DATA and isinstance(value, bytes):
            bodies.append(value)
            raw_body.append(b"")
        elif code in (AMQP_VALUE, AMQP_SEQUENCE):
            value_body = value
            raw_body.append(bytes(buf[start:end]))
    if bodies and len(bodies) == len(raw_body):
        body = b"".join(bodies)
    elif isinstance(value_body, bytes) and len(raw_body) == 1:
        body = value_body
    elif isinstance(value_body, str) and len(raw_body) == 1:
        body = value_body.encode()
    else:  # an unusual mix of body sections: the encoded sections as they are
        body = b"".join(bytes(buf[start:end]) for code, _v, start, end in _sections(buf)
                        if code in (DATA, AMQP_VALUE, AMQP_SEQUENCE))
    if extra_headers:
        headers.update(extra_headers)
    if headers:
        props.headers = headers
    return Message(exchange, routing_key, props, body)
