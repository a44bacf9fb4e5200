"""Every command of the stream protocol as a record, with one encoder and one decoder for both sides.

Owns: the records (requests a client sends, responses and commands a server sends, and the few that go
both ways: close, heartbeat, tune), the table from a frame's key and version to its decoder
(`decode`), the encoder (`encode`, a whole frame with its size prefix), and the two hot commands'
hand-written forms: a publish's entries (`PublishedEntry`, `SubBatchEntry`) and a delivery's header
(`deliver_header`, so that a chunk read from a segment file goes out without being copied), and a
publish of simple entries taken apart without a record per message (`scan_simple_publish`).

Rules: a record lists its wire fields in `FIELDS`, in the order of its dataclass fields; a key or a
version not in the table, a body that ends early or has bytes left over raises `UnknownFrame`.
Irregularities of the protocol are kept as RabbitMQ has them (rabbit_stream_core.erl): tune and
credit's response carry no correlation id, metadata's response carries no response code, a publish
error frame carries one code per publishing id.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple

from hutch.streamproto import wire
from hutch.streamproto.codes import RESPONSE_BIT, Code, Key
from hutch.streamproto.errors import UnknownFrame
from hutch.streamproto.wire import (
    BOOL,
    BYTES,
    I16,
    INT_MAP,
    OFFSET_SPEC,
    STRING,
    STRING_MAP,
    STRINGS,
    U8,
    U16,
    U32,
    U64,
    U64S,
    Array,
    Field,
    In,
    OffsetSpec,
    OffsetSpecField,
    OptionalTail,
    Steps,
)

_HEAD = struct.Struct(">IHH")          # size, key, version
_PUBLISH_HEAD = struct.Struct(">IHHBI")  # size, key, version, publisher id, count
_DELIVER_V1 = struct.Struct(">IHHB")
_DELIVER_V2 = struct.Struct(">IHHBQ")
_ENTRY = struct.Struct(">QI")           # publishing id, (0:1, size:31)
_SUB_BATCH = struct.Struct(">QBHII")    # publishing id, (1:1, compression:3, 0:4), count, raw size, size
_KEY_VERSION = struct.Struct(">HH")
_PUBLISH_COUNT = struct.Struct(">BI")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")


class Command:
    """A record of the protocol. KEY carries RESPONSE_BIT for a response."""

    KEY: ClassVar[int]
    FIELDS: ClassVar[tuple[Field, ...]] = ()
    VERSION: ClassVar[int] = 1

    def body(self, out: bytearray) -> None:
        for f, spec in zip(fields(self), self.FIELDS, strict=True):  # type: ignore[arg-type]  # every Command is a dataclass
            spec.write(out, getattr(self, f.name))

    @classmethod
    def read(cls, version: int, r: In) -> Command:
        return cls(*(spec.read(r) for spec in cls.FIELDS))

    @classmethod
    def steps(cls, version: int, r: In) -> Steps:
        """`read` as a stepped read (wire.Field.steps); a record with a `read` of its own (publish,
        deliver) is read in one step."""
        if cls.read.__func__ is not Command.read.__func__:  # type: ignore[attr-defined]  # a bound classmethod has __func__; typeshed does not say so
            return cls.read(version, r)
        values = []
        for spec in cls.FIELDS:
            values.append((yield from spec.steps(r)))
        return cls(*values)


def _simple(key: Key, *specs: Field, response: bool = False) -> Callable[[type[Command]], type[Command]]:
    def apply(cls: type[Command]) -> type[Command]:
        cls.KEY = key | (RESPONSE_BIT if response else 0)
        cls.FIELDS = specs
        return cls
    return apply


# -- connection -----------------------------------------------------------------------------------

@_simple(Key.PEER_PROPERTIES, U32, STRING_MAP)
@dataclass
class PeerProperties(Command):
    correlation_id: int
    properties: dict[str, str]


@_simple(Key.PEER_PROPERTIES, U32, U16, STRING_MAP, response=True)
@dataclass
class PeerPropertiesResponse(Command):
    correlation_id: int
    code: int
    properties: dict[str, str]


@_simple(Key.SASL_HANDSHAKE, U32)
@dataclass
class SaslHandshake(Command):
    correlation_id: int


@_simple(Key.SASL_HANDSHAKE, U32, U16, STRINGS, response=True)
@dataclass
class SaslHandshakeResponse(Command):
    correlation_id: int
    code: int
    mechanisms: list[str]


@_simple(Key.SASL_AUTHENTICATE, U32, STRING, BYTES)
@dataclass
class SaslAuthenticate(Command):
    correlation_id: int
    mechanism: str
    data: bytes


@_simple(Key.SASL_AUTHENTICATE, U32, U16, OptionalTail(BYTES, b""), response=True)
@dataclass
class SaslAuthenticateResponse(Command):
    correlation_id: int
    code: int
    challenge: bytes = b""


@_simple(Key.TUNE, U32, U32)
@dataclass
class Tune(Command):
    """The server's proposal (a request without correlation id)."""

    frame_max: int
    heartbeat_s: int


@_simple(Key.TUNE, U32, U32, response=True)
@dataclass
class TuneResponse(Command):
    """The client's answer: the values it agrees on."""

    frame_max: int
    heartbeat_s: int


@_simple(Key.OPEN, U32, STRING)
@dataclass
class Open(Command):
    correlation_id: int
    virtual_host: str


@_simple(Key.OPEN, U32, U16, OptionalTail(STRING_MAP, {}), response=True)
@dataclass
class OpenResponse(Command):
    correlation_id: int
    code: int
    properties: dict[str, str] = field(default_factory=dict)


@_simple(Key.CLOSE, U32, U16, STRING)
@dataclass
class Close(Command):
    correlation_id: int
    closing_code: int
    reason: str


@_simple(Key.HEARTBEAT)
@dataclass
class Heartbeat(Command):
    pass


@_simple(Key.EXCHANGE_COMMAND_VERSIONS, U32, Array(U16, U16, U16))
@dataclass
class ExchangeCommandVersions(Command):
    correlation_id: int
    versions: list[tuple[int, int, int]]  # (key, min version, max version)


@_simple(Key.EXCHANGE_COMMAND_VERSIONS, U32, U16, Array(U16, U16, U16), response=True)
@dataclass
class ExchangeCommandVersionsResponse(Command):
    correlation_id: int
    code: int
    versions: list[tuple[int, int, int]]


# -- publishing -----------------------------------------------------------------------------------

@_simple(Key.DECLARE_PUBLISHER, U32, U8, STRING, STRING)
@dataclass
class DeclarePublisher(Command):
    correlation_id: int
    publisher_id: int
    reference: str
    stream: str


@_simple(Key.DELETE_PUBLISHER, U32, U8)
@dataclass
class DeletePublisher(Command):
    correlation_id: int
    publisher_id: int


@_simple(Key.QUERY_PUBLISHER_SEQUENCE, U32, STRING, STRING)
@dataclass
class QueryPublisherSequence(Command):
    correlation_id: int
    reference: str
    stream: str


@_simple(Key.QUERY_PUBLISHER_SEQUENCE, U32, U16, U64, response=True)
@dataclass
class QueryPublisherSequenceResponse(Command):
    correlation_id: int
    code: int
    sequence: int


@dataclass(slots=True)
class PublishedEntry:
    """One message of a publish: its publishing id, the encoded message (AMQP 1.0 sections) and, in a
    version 2 publish, its filter value (None when the publisher gave none)."""

    publishing_id: int
    message: bytes
    filter_value: str | None = None


@dataclass(slots=True)
class SubBatchEntry:
    """A sub-entry batch (version 1 only): `count` messages, maybe compressed (`compression`: 0 none,
    1 gzip, 2 snappy, 3 lz4, 4 zstd), under one publishing id, stored as one entry."""

    publishing_id: int
    compression: int
    count: int
    uncompressed_size: int
    data: bytes


@dataclass
class Publish(Command):
    """Version 1, or version 2 when any entry carries a filter value (the client chooses)."""

    KEY: ClassVar[int] = Key.PUBLISH
    publisher_id: int
    entries: list[PublishedEntry | SubBatchEntry]
    version: int = 1

    def body(self, out: bytearray) -> None:
        out += struct.pack(">BI", self.publisher_id, len(self.entries))
        for e in self.entries:
            if isinstance(e, SubBatchEntry):
                if self.version != 1:
                    raise ValueError("a sub-entry batch is only valid in a version 1 publish")
                out += _SUB_BATCH.pack(e.publishing_id, 0x80 | (e.compression << 4), e.count,
                                       e.uncompressed_size, len(e.data))
                out += e.data
                continue
            out += struct.pack(">Q", e.publishing_id)
            if self.version == 2:
                wire.write_string(out, e.filter_value)
            out += _U32.pack(len(e.message))
            out += e.message

    @classmethod
    def read(cls, version: int, r: In) -> Command:
        """The hot path: one `unpack_from` per simple entry, no field objects (a version 1 publish of
        small messages is most of what a busy stream connection reads)."""
        data, end = r.data, len(r.data)
        if r.pos + 5 > end:
            raise UnknownFrame("publish ends before its message count")
        publisher_id, count = _PUBLISH_COUNT.unpack_from(data, r.pos)
        pos = r.pos + 5
        entries: list[PublishedEntry | SubBatchEntry] = []
        append = entries.append
        while pos < end:
            filter_value = None
            if version == 2:
                r.pos = pos + 8
                (pid,) = _U64.unpack_from(data, pos) if pos + 8 <= end else (None,)
                if pid is None:
                    raise UnknownFrame("publish entry ends inside its publishing id")
                filter_value = wire.read_string(r)
                pos = r.pos
                if pos + 4 > end:
                    raise UnknownFrame("publish entry ends before its size")
                (size,) = _U32.unpack_from(data, pos)
                pos += 4
            else:
                if pos + 12 > end:
                    raise UnknownFrame("publish entry ends inside its header")
                pid, size = _ENTRY.unpack_from(data, pos)
                if size & 0x80000000:
                    r.pos = pos + 8
                    append(_sub_batch(pid, r))
                    pos = r.pos
                    continue
                pos += 12
            if size & 0x80000000:
                raise UnknownFrame("sub-entry batches are not supported in a version 2 publish")
            nxt = pos + size
            if nxt > end:
                raise UnknownFrame("publish entry runs past the frame")
            append(PublishedEntry(pid, data[pos:nxt], filter_value))
            pos = nxt
        r.pos = pos
        if len(entries) != count:
            raise UnknownFrame(f"publish announces {count} messages and carries {len(entries)}")
        return cls(publisher_id, entries, version)


PUBLISH_V1_PREFIX = _KEY_VERSION.pack(Key.PUBLISH, 1)


class SimplePublish(NamedTuple):
    """A version 1 publish of simple entries only, taken apart without a record per message."""

    publisher_id: int
    publishing_ids: list[int]
    data: bytes  # the entries as a chunk's data section: each u32 size + message (chunk.encode_entries)


def scan_simple_publish(frame: bytes | memoryview) -> SimplePublish | None:
    """`frame` (after its size field) as a `SimplePublish`, or None when it is anything else: another
    command or version, a sub-batch entry, or a malformed publish (`decode` then reads it and reports
    what is wrong). A simple entry on the wire is its publishing id then exactly a chunk's simple entry
    (u32 size with the top bit clear, then the message), so the data section is the frame's entries
    without their ids: one slice per message, no copy of a message but the join. `frame` may be a
    view of the input buffer (`FrameReader.frame_views`): the answer keeps no reference to it."""
    end = len(frame)
    if end < 9 or frame[:4] != PUBLISH_V1_PREFIX:
        return None
    publisher_id, count = _PUBLISH_COUNT.unpack_from(frame, 4)
    if not 0 < count <= (end - 9) // 12:
        return None
    if count <= UNIFORM_MAX_ENTRIES and (end - 9) % count == 0:
        uniform = _scan_uniform(frame, publisher_id, count, (end - 9) // count)
        if uniform is not None:
            return uniform
    ids: list[int] = []
    spans: list[memoryview] = []
    add_id, add_span = ids.append, spans.append
    view = memoryview(frame)
    unpack = _ENTRY.unpack_from
    pos = 9
    for _ in range(count):
        if pos + 12 > end:
            return None
        pid, size = unpack(frame, pos)
        nxt = pos + 12 + size  # a sub-batch's top bit makes this run past the frame
        if nxt > end:
            return None
        add_id(pid)
        add_span(view[pos + 8:nxt])
        pos = nxt
    if pos != end:
        return None
    return SimplePublish(publisher_id, ids, b"".join(spans))


UNIFORM_MAX_ENTRIES = 1024  # a publish of up to this many messages of one size takes `_scan_uniform`
UNIFORM_STRIDED_MAX_SIZE = 128  # up to this message size the ids go by eight strided deletions (in C)
UNIFORM_FORMATS_MAX = 64  # (count, size) shapes memoized; the memo starts again empty past that
_uniform_formats: dict[tuple[int, int], struct.Struct] = {}


def _scan_uniform(frame: bytes | memoryview, publisher_id: int, count: int, stride: int) -> SimplePublish | None:
    """`scan_simple_publish` for `count` entries of `stride` bytes each (id, size, message of one
    size: what a client batching one kind of message sends), in C. Small messages: one `unpack_from`
    reads every id and size, and eight strided deletions drop the ids' bytes. Larger ones (past
    UNIFORM_STRIDED_MAX_SIZE): one `unpack_from` reads every id and every entry (size and message) as
    bytes, joined once, and four strided slices of the join check the sizes (a memoryview per entry
    in a Python loop cost 1.7x as much at 1 kB). None when the sizes are not all `stride - 12` (the
    per-entry loop then reads the frame)."""
    size = stride - 12
    if size < 0 or _U32.unpack_from(frame, 17)[0] != size:
        return None
    large = size > UNIFORM_STRIDED_MAX_SIZE
    shape = (count, size)
    fmt = _uniform_formats.get(shape)
    if fmt is None:
        if len(_uniform_formats) >= UNIFORM_FORMATS_MAX:
            _uniform_formats.clear()
        fmt = _uniform_formats[shape] = struct.Struct(">" + (f"Q{size + 4}s" if large else f"QI{size}x") * count)
    fields = fmt.unpack_from(frame, 9)
    if large:
        data = b"".join(fields[1::2])
        want = _U32.pack(size)
        entry = size + 4
        for i in range(4):  # byte i of every entry's size field
            if data[i::entry] != want[i:i + 1] * count:
                return None
        return SimplePublish(publisher_id, list(fields[0::2]), data)
    if fields[1::2].count(size) != count:
        return None
    buf = bytearray(memoryview(frame)[9:])
    for removed in range(8):  # entry i's id starts at i * (stride - removed) once `removed` bytes of each went
        del buf[::stride - removed]
    return SimplePublish(publisher_id, list(fields[0::2]), bytes(buf))


def _sub_batch(publishing_id: int, r: In) -> SubBatchEntry:
    flags = r.fixed(wire._U8)
    n, raw_size, size = r.fixed(wire._U16), r.fixed(wire._U32), r.fixed(wire._U32)
    return SubBatchEntry(publishing_id, (flags >> 4) & 0x07, n, raw_size, r.take(size))


@_simple(Key.PUBLISH_CONFIRM, U8, U64S)
@dataclass
class PublishConfirm(Command):
    publisher_id: int
    publishing_ids: list[int]

    def body(self, out: bytearray) -> None:  # the hot one of the server's frames: one pack for the ids
        n = len(self.publishing_ids)
        out += _PUBLISH_COUNT.pack(self.publisher_id, n)
        out += struct.pack(f">{n}Q", *self.publishing_ids)


@_simple(Key.PUBLISH_ERROR, U8, Array(U64, U16))
@dataclass
class PublishError(Command):
    publisher_id: int
    errors: list[tuple[int, int]]  # (publishing id, response code)


# -- consuming ------------------------------------------------------------------------------------

@_simple(Key.SUBSCRIBE, U32, U8, STRING, OFFSET_SPEC, U16, OptionalTail(STRING_MAP, {}))
@dataclass
class Subscribe(Command):
    correlation_id: int
    subscription_id: int
    stream: str
    offset: OffsetSpec
    credit: int
    properties: dict[str, str] = field(default_factory=dict)


@_simple(Key.UNSUBSCRIBE, U32, U8)
@dataclass
class Unsubscribe(Command):
    correlation_id: int
    subscription_id: int


@_simple(Key.CREDIT, U8, I16)
@dataclass
class Credit(Command):
    """Chunks the subscription may still receive (RabbitMQ reads it as a signed int16)."""

    subscription_id: int
    credit: int


@_simple(Key.CREDIT, U16, U8, response=True)
@dataclass
class CreditResponse(Command):
    """Sent only when a credit names an unknown subscription."""

    code: int
    subscription_id: int


@dataclass
class Deliver(Command):
    """One chunk for a subscription: version 2 when `committed_offset` (the committed chunk id) is set."""

    KEY: ClassVar[int] = Key.DELIVER
    subscription_id: int
    chunk: bytes
    committed_offset: int | None = None

    def body(self, out: bytearray) -> None:
        out += struct.pack(">B", self.subscription_id)
        if self.committed_offset is not None:
            out += struct.pack(">Q", self.committed_offset)
        out += self.chunk

    @classmethod
    def read(cls, version: int, r: In) -> Command:
        sub = r.fixed(wire._U8)
        committed = r.fixed(wire._U64) if version == 2 else None
        return cls(sub, r.rest(), committed)


def deliver_header(subscription_id: int, chunk_size: int, committed_offset: int | None) -> bytes:
    """The frame bytes before a chunk: a delivery is `header + chunk`, written without joining them."""
    if committed_offset is None:
        return _DELIVER_V1.pack(5 + chunk_size, Key.DELIVER, 1, subscription_id)
    return _DELIVER_V2.pack(13 + chunk_size, Key.DELIVER, 2, subscription_id, committed_offset)


@_simple(Key.STORE_OFFSET, STRING, STRING, U64)
@dataclass
class StoreOffset(Command):
    reference: str
    stream: str
    offset: int


@_simple(Key.QUERY_OFFSET, U32, STRING, STRING)
@dataclass
class QueryOffset(Command):
    correlation_id: int
    reference: str
    stream: str


@_simple(Key.QUERY_OFFSET, U32, U16, U64, response=True)
@dataclass
class QueryOffsetResponse(Command):
    correlation_id: int
    code: int
    offset: int


@_simple(Key.CONSUMER_UPDATE, U32, U8, BOOL)
@dataclass
class ConsumerUpdate(Command):
    """Server to client: the subscription became the active (or a passive) consumer of its group."""

    correlation_id: int
    subscription_id: int
    active: bool


@_simple(Key.CONSUMER_UPDATE, U32, U16, OffsetSpecField(allow_none=True), response=True)
@dataclass
class ConsumerUpdateResponse(Command):
    correlation_id: int
    code: int
    offset: OffsetSpec


@_simple(Key.RESOLVE_OFFSET_SPEC, U32, STRING, OFFSET_SPEC, OptionalTail(STRING_MAP, {}))
@dataclass
class ResolveOffsetSpec(Command):
    correlation_id: int
    stream: str
    offset: OffsetSpec
    properties: dict[str, str] = field(default_factory=dict)


@_simple(Key.RESOLVE_OFFSET_SPEC, U32, U16, U16, U64, response=True)
@dataclass
class ResolveOffsetSpecResponse(Command):
    correlation_id: int
    code: int
    offset_type: int
    offset: int


# -- streams and super streams --------------------------------------------------------------------

@_simple(Key.CREATE, U32, STRING, STRING_MAP)
@dataclass
class Create(Command):
    correlation_id: int
    stream: str
    arguments: dict[str, str]


@_simple(Key.DELETE, U32, STRING)
@dataclass
class Delete(Command):
    correlation_id: int
    stream: str


@_simple(Key.METADATA, U32, STRINGS)
@dataclass
class Metadata(Command):
    correlation_id: int
    streams: list[str]


@_simple(Key.METADATA, U32, Array(U16, STRING, U32), Array(STRING, U16, U16, Array(U16)), response=True)
@dataclass
class MetadataResponse(Command):
    correlation_id: int
    brokers: list[tuple[int, str, int]]                        # (reference, host, port)
    streams: list[tuple[str, int, int, list[int]]]             # (stream, code, leader, replicas)


@_simple(Key.METADATA_UPDATE, U16, STRING)
@dataclass
class MetadataUpdate(Command):
    code: int
    stream: str


@_simple(Key.STREAM_STATS, U32, STRING)
@dataclass
class StreamStats(Command):
    correlation_id: int
    stream: str


@_simple(Key.STREAM_STATS, U32, U16, INT_MAP, response=True)
@dataclass
class StreamStatsResponse(Command):
    correlation_id: int
    code: int
    stats: dict[str, int]


@_simple(Key.ROUTE, U32, STRING, STRING)
@dataclass
class Route(Command):
    correlation_id: int
    routing_key: str
    super_stream: str


@_simple(Key.ROUTE, U32, U16, STRINGS, response=True)
@dataclass
class RouteResponse(Command):
    correlation_id: int
    code: int
    streams: list[str]


@_simple(Key.PARTITIONS, U32, STRING)
@dataclass
class Partitions(Command):
    correlation_id: int
    super_stream: str


@_simple(Key.PARTITIONS, U32, U16, STRINGS, response=True)
@dataclass
class PartitionsResponse(Command):
    correlation_id: int
    code: int
    streams: list[str]


@_simple(Key.CREATE_SUPER_STREAM, U32, STRING, STRINGS, STRINGS, STRING_MAP)
@dataclass
class CreateSuperStream(Command):
    correlation_id: int
    name: str
    partitions: list[str]
    binding_keys: list[str]
    arguments: dict[str, str]


@_simple(Key.DELETE_SUPER_STREAM, U32, STRING)
@dataclass
class DeleteSuperStream(Command):
    correlation_id: int
    name: str


@dataclass
class Response(Command):
    """The response that carries only a code (declare/delete publisher, subscribe, unsubscribe, create,
    delete, close, create/delete super stream). `key` is the request's key, without RESPONSE_BIT."""

    KEY: ClassVar[int] = RESPONSE_BIT
    key: int
    correlation_id: int
    code: int = Code.OK

    def body(self, out: bytearray) -> None:
        out += struct.pack(">IH", self.correlation_id, self.code)

    @classmethod
    def read_keyed(cls, key: int, r: In) -> Response:
        return cls(key, r.fixed(wire._U32), r.fixed(wire._U16))


_PLAIN_RESPONSES = frozenset({Key.DECLARE_PUBLISHER, Key.DELETE_PUBLISHER, Key.SUBSCRIBE, Key.UNSUBSCRIBE,
                              Key.CREATE, Key.DELETE, Key.CLOSE, Key.CREATE_SUPER_STREAM,
                              Key.DELETE_SUPER_STREAM})

_RECORDS: tuple[type[Command], ...] = (
    PeerProperties, PeerPropertiesResponse, SaslHandshake, SaslHandshakeResponse, SaslAuthenticate,
    SaslAuthenticateResponse, Tune, TuneResponse, Open, OpenResponse, Close, Heartbeat,
    ExchangeCommandVersions, ExchangeCommandVersionsResponse, DeclarePublisher, DeletePublisher,
    QueryPublisherSequence, QueryPublisherSequenceResponse, Publish, PublishConfirm, PublishError, Subscribe,
    Unsubscribe, Credit, CreditResponse, Deliver, StoreOffset, QueryOffset, QueryOffsetResponse, ConsumerUpdate,
    ConsumerUpdateResponse, ResolveOffsetSpec, ResolveOffsetSpecResponse, Create, Delete, Metadata,
    MetadataResponse, MetadataUpdate, StreamStats, StreamStatsResponse, Route, RouteResponse, Partitions,
    PartitionsResponse, CreateSuperStream, DeleteSuperStream)

DECODERS: dict[tuple[int, int], type[Command]] = {(cls.KEY, 1): cls for cls in _RECORDS}
DECODERS[(Key.PUBLISH, 2)] = Publish
DECODERS[(Key.DELIVER, 2)] = Deliver


def _decoder(frame: bytes) -> tuple[int, int, In, type[Command] | None]:
    if len(frame) < 4:
        raise UnknownFrame("frame shorter than its key and version")
    key, version = _KEY_VERSION.unpack_from(frame, 0)
    cls = DECODERS.get((key, version))
    if cls is None and not (version == 1 and key & RESPONSE_BIT and (key & ~RESPONSE_BIT) in _PLAIN_RESPONSES):
        raise UnknownFrame(f"unknown command key 0x{key:04x} version {version}")
    return key, version, In(frame, 4), cls


def _decoded(key: int, r: In, cmd: Command) -> Command:
    if not r.at_end():
        raise UnknownFrame(f"{len(r.data) - r.pos} bytes left over after a command of key 0x{key:04x}")
    return cmd


def decode(frame: bytes) -> Command:
    """One frame's content (after the size field) as its record. Raises UnknownFrame."""
    key, version, r, cls = _decoder(frame)
    if cls is None:
        return _decoded(key, r, Response.read_keyed(key & ~RESPONSE_BIT, r))
    return _decoded(key, r, cls.read(version, r))


def decode_steps(frame: bytes) -> Steps:
    """`decode` as a stepped read: yields after every `wire.STEP_ENTRIES` entries of a map or array
    and returns the same record (so a caller may spread a large command's decoding over loop turns)."""
    key, version, r, cls = _decoder(frame)
    if cls is None:
        return _decoded(key, r, Response.read_keyed(key & ~RESPONSE_BIT, r))
    return _decoded(key, r, (yield from cls.steps(version, r)))


def subscribe_head(frame: bytes) -> Subscribe:
    """A subscribe's fields before its properties (given as {}), read from `frame` (its content after the
    size) without reading the properties: what a refusal of a subscribe whose properties were not all
    read needs (its correlation id, subscription id and stream). Raises UnknownFrame."""
    key, version, r, cls = _decoder(frame)
    if cls is not Subscribe:
        raise UnknownFrame(f"not a subscribe: key 0x{key:04x} version {version}")
    correlation_id, subscription_id, stream, offset, credit = (spec.read(r) for spec in Subscribe.FIELDS[:-1])
    return Subscribe(correlation_id, subscription_id, stream, offset, credit, {})


def encode(cmd: Command) -> bytes:
    """The whole frame for `cmd`, size prefix included."""
    out = bytearray(8)
    cmd.body(out)
    if isinstance(cmd, Response):
        key, version = cmd.key | RESPONSE_BIT, 1
    else:
        key, version = cmd.KEY, getattr(cmd, "version", None) or cmd.VERSION
        if isinstance(cmd, Deliver):
            version = 1 if cmd.committed_offset is None else 2
    _HEAD.pack_into(out, 0, len(out) - 4, key, version)
    return bytes(out)


def answered_plainly(key: int) -> bool:
    """Whether a request of `key` is answered by a `Response` (a code and nothing else)."""
    return key in _PLAIN_RESPONSES


def request_key(cmd: Command) -> int:
    """The command's key without RESPONSE_BIT (a Response's request key)."""
    return cmd.key if isinstance(cmd, Response) else cmd.KEY & ~RESPONSE_BIT


__all__ = ["DECODERS", "Close", "Command", "ConsumerUpdate", "ConsumerUpdateResponse", "Create",
           "CreateSuperStream", "Credit", "CreditResponse", "DeclarePublisher", "Delete", "DeletePublisher",
           "DeleteSuperStream", "Deliver", "ExchangeCommandVersions", "ExchangeCommandVersionsResponse",
           "Heartbeat", "Metadata", "MetadataResponse", "MetadataUpdate", "Open", "OpenResponse",
           "Partitions", "PartitionsResponse", "PeerProperties", "PeerPropertiesResponse", "Publish",
           "PublishConfirm", "PublishError", "PublishedEntry", "QueryOffset", "QueryOffsetResponse",
           "QueryPublisherSequence", "QueryPublisherSequenceResponse", "ResolveOffsetSpec",
           "ResolveOffsetSpecResponse", "Response", "Route", "RouteResponse", "SaslAuthenticate",
           "SaslAuthenticateResponse", "SaslHandshake", "SaslHandshakeResponse", "StoreOffset",
           "StreamStats", "StreamStatsResponse", "SubBatchEntry", "Subscribe", "subscribe_head", "Tune", "TuneResponse",
           "Unsubscribe", "answered_plainly", "decode", "decode_steps", "deliver_header", "encode", "request_key"]
