"""Stream chunks: osiris's chunk format, encoded and decoded as pure functions over bytes.

Owns: the 48-byte chunk header, the entry framing (simple entries and sub-batches), the CRC (CRC-32
over the entry data, as osiris's `erlang:crc32`: `crc32`, ISA-L's when installed, else zlib's, the same
checksum), the chunk's bloom filter of filter values, and
`FORMAT`, the `ChunkFormat` through which `hutch.storage.stream_log` reads chunks from files.

A chunk (all integers big-endian; `osiris_log.erl`'s header comment):

    u4 magic=5 | u4 version=0 | u8 chunk type | u16 entries | u32 records | i64 timestamp ms
    | u64 epoch | u64 chunk id (offset of its first record) | u32 data CRC | u32 data length
    | u32 trailer length | u8 bloom size | 3 bytes reserved
    then the bloom filter (bloom size bytes), the data (entries), the trailer.

    simple entry:  u1 0 | u31 length | body
    sub-batch:     u1 1 | u3 compression | u4 reserved | u16 records | u32 uncompressed length
                   | u32 length | body (records, each u32 length + bytes, compressed as a whole)

Chunk types: USER (messages), TRACKING_DELTA and TRACKING_SNAPSHOT (hutch.queues.stream.tracking).
Every chunk has at least one record, so it consumes at least one offset (osiris's rule: a tracking
chunk holds one entry).

Compression codecs (the stream protocol's, as rstream and RabbitMQ's Java client number them): 0 none,
1 gzip, 2 snappy, 3 lz4, 4 zstd. The broker stores a sub-batch as it came; for a reader that needs the
records (an AMQP 0-9-1 consumer) every one of these is decoded and split into records here: gzip with
the standard library's zlib, snappy, lz4 and zstd with cramjam, in the framings the Java client writes
(snappy's framing format as xerial's `SnappyFramedOutputStream`, the LZ4 frame format as
`LZ4FrameOutputStream`, zstd frames as `ZstdOutputStream`; not raw snappy or bare LZ4 blocks). A
sub-batch of another codec (5-7) is skipped.

Rules:
- Decoding a compressed sub-batch is bounded: its declared uncompressed length is checked against the
  caller's budget (`MAX_UNCOMPRESSED_BYTES` per chunk) before anything is decoded, the decoder is never
  allowed past that length plus one byte (zlib's `max_length`; cramjam's `decompress_into`, which
  streams into a buffer of that size and fails when the output would not fit), and a sub-batch that
  decodes to anything but exactly its declared length, or whose records do not fill it exactly, is
  refused (`BadSubBatch`): a hostile publisher's small frame cannot make a reader allocate more than
  the budget.
- The CRC covers the data only (osiris); a torn or flipped data byte fails `verify`. A torn header is
  caught by the lengths (the chunk would end past the file) or the magic.
- The bloom filter is osiris_bloom's layout (bit 0 set: some entry has no filter value; each value
  sets two bits) with our own hash (crc32, not `erlang:phash2`): a filter never excludes a chunk that
  holds a wanted value (no false negatives); the reader still checks each message's value.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import cramjam

from hutch.storage.stream_log import ChunkInfo

crc32: Callable[[bytes | memoryview, int], int]
try:  # ISA-L's CRC-32: the same checksum as zlib's, about ten times faster (docs/dependencies.md)
    from isal.isal_zlib import crc32
except ImportError:  # without it (a platform with no wheel), zlib's
    crc32 = zlib.crc32

MAGIC_VERSION = 0x50  # magic 5, version 0
HEADER = struct.Struct(">BBHIqQQIIIB3x")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 48

USER = 0
TRACKING_DELTA = 1
TRACKING_SNAPSHOT = 2
CHUNK_TYPES = (USER, TRACKING_DELTA, TRACKING_SNAPSHOT)

MAX_ENTRIES = 0xFFFF
MAX_ENTRY_SIZE = (1 << 31) - 1
DEFAULT_FILTER_SIZE = 16  # bytes (osiris's default; 16..255)
NO_COMPRESSION = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024  # per chunk: what a reader may inflate its sub-batches to

_SIMPLE = struct.Struct(">I")
_BATCH = struct.Struct(">BHII")
# cramjam's framed formats: snappy's framing format, the LZ4 frame format, zstd frames
_CRAMJAM_CODECS: dict[int, ModuleType] = {SNAPPY: cramjam.snappy, LZ4: cramjam.lz4, ZSTD: cramjam.zstd}


@dataclass(frozen=True)
class Header:
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    chunk_id: int
    crc: int
    data_size: int
    trailer_size: int
    bloom_size: int

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.bloom_size + self.data_size + self.trailer_size

    @property
    def next_offset(self) -> int:
        return self.chunk_id + self.num_records

    def info(self) -> ChunkInfo:
        return ChunkInfo(self.chunk_id, self.timestamp, self.epoch, self.chunk_type, self.num_records, self.size)


@dataclass(frozen=True)
class SubBatch:
    """A sub-batch entry as a publisher sent it (stream protocol publish with a sub-entry batch): its
    records' bytes, stored as they came (`body`, compressed or not)."""

    num_records: int
    compression: int
    uncompressed_size: int
    body: bytes


Entry = bytes | SubBatch


def decode_header(data: bytes | memoryview) -> Header:
    """The header at the start of `data`; ValueError if it is not one."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"chunk header needs {HEADER_SIZE} bytes, got {len(data)}")
    mv, ctype, entries, records, ts, epoch, cid, crc, dsize, tsize, bsize = HEADER.unpack_from(data, 0)
    if mv != MAGIC_VERSION:
        raise ValueError(f"bad chunk magic/version 0x{mv:02x}")
    if ctype not in CHUNK_TYPES:
        raise ValueError(f"unknown chunk type {ctype}")
    if records < 1 or entries < 1:
        raise ValueError("a chunk without records")
    return Header(ctype, entries, records, ts, epoch, cid, crc, dsize, tsize, bsize)


def _hash_pair(value: bytes, bit_size: int) -> tuple[int, int]:
    if not value:
        return 0, 0
    h1 = zlib.crc32(value) % (bit_size - 1) + 1
    h2 = zlib.crc32(b"\x01" + value) % (bit_size - 1) + 1
    return h1, h2


def bloom(values: Sequence[bytes | None], size_bytes: int = DEFAULT_FILTER_SIZE) -> bytes:
    """The chunk's filter for its entries' filter values (None or b"": no value). Empty when no entry
    has a value (osiris writes no filter then)."""
    wanted = {v or b"" for v in values}
    if not wanted or wanted == {b""}:
        return b""
    bits = bytearray(size_bytes)
    for value in wanted:
        for bit in _hash_pair(value, size_bytes * 8):
            bits[bit // 8] |= 0x80 >> (bit % 8)
    return bytes(bits)


def bloom_may_match(filter_bits: bytes, values: Sequence[bytes], match_unfiltered: bool) -> bool:
    """May a chunk with this filter hold an entry with one of `values` (or, with `match_unfiltered`, one
    without a value)? No filter: the chunk has only unfiltered entries. The rule stated plainly: readers
    match chunks with `BloomQuery` (values hashed once), which tests/unit/test_stream_chunk.py checks
    against this."""
    if not filter_bits:
        return match_unfiltered
    bit_size = len(filter_bits) * 8

    def is_set(bit: int) -> bool:
        return bool(filter_bits[bit // 8] & (0x80 >> (bit % 8)))

    if match_unfiltered and is_set(0):
        return True
    return any(all(is_set(b) for b in _hash_pair(v, bit_size)) for v in values if v)


class BloomQuery:
    """A reader's filter (its values, and whether it takes entries without one), matched against chunks'
    bloom filters as `bloom_may_match` does, at a bounded cost whatever the values: each value is hashed
    once per filter size (not once per chunk: a 32 KB value would cost a 32 KB CRC per chunk skipped),
    duplicates and empty values are dropped. Up to `TABLE_MIN` values a check is one AND per value on the
    filter read as an integer; past it (a subscribe may carry tens of thousands of `filter.N`: RabbitMQ
    takes any count) the values are a table from a value's first bit to the OR of its second bits, and a
    check looks at each bit set in the chunk's filter (at most its size, 2,040 bits). `cost` is what one
    chunk's check counts against a reader's work per loop turn (the caller's budget), so thousands of
    values skip fewer chunks per turn, not the same number more slowly. `prepare(bit_size)` hashes the
    values for a filter size in steps of `PREPARE_STEP` (a caller spreads them over loop turns), and
    `build` makes the query itself in such steps; a check of a size not prepared hashes them all at once.

    Invariant: `may_match(bits) == bloom_may_match(bits, values, match_unfiltered)` for every filter."""

    __slots__ = ("values", "match_unfiltered", "cost", "_masks")

    MAX_SIZES = 8  # filter sizes whose masks are kept (a stream has one; a reader meets a few at most)
    TABLE_MIN = 256  # values from which a check walks the chunk's set bits instead of one AND per value
    PREPARE_STEP = 1024  # values hashed between two yields of `prepare` (~1 ms)

    def __init__(self, values: Sequence[bytes], match_unfiltered: bool) -> None:
        self.values = tuple(dict.fromkeys(v for v in values if v))
        self.match_unfiltered = match_unfiltered
        self.cost = 1 + min(len(self.values), 2048)  # (a table's check: at most the filter's 2,040 bits)
        self._masks: dict[int, tuple[int, ...] | dict[int, int]] = {}

    @classmethod
    def build(cls, values: Sequence[bytes], match_unfiltered: bool) -> Generator[None, None, BloomQuery]:
        """The query `BloomQuery(values, match_unfiltered)`, with its values' duplicates and empty ones
        dropped in steps of PREPARE_STEP values (45,000 values at once are ~10 ms: a caller spreads the
        steps over loop turns)."""
        unique: dict[bytes, None] = {}
        for start in range(0, len(values), cls.PREPARE_STEP):
            if start:
                yield
            unique.update(dict.fromkeys(v for v in values[start:start + cls.PREPARE_STEP] if v))
        query = cls((), match_unfiltered)
        query.values = tuple(unique)
        query.cost = 1 + min(len(query.values), 2048)
        return query

    def prepare(self, bit_size: int) -> Iterator[None]:
        """Hash the values for filters of `bit_size` bits, yielding after every PREPARE_STEP values."""
        if bit_size in self._masks:
            return
        top = bit_size - 1  # bit b of the filter (first byte's high bit is 0) is the integer's bit top - b
        values = self.values
        built: tuple[int, ...] | dict[int, int]
        if len(values) < self.TABLE_MIN:
            built = tuple(dict.fromkeys((1 << (top - h1)) | (1 << (top - h2))
                                        for h1, h2 in (_hash_pair(v, bit_size) for v in values)))
        else:
            table: dict[int, int] = {}
            for start in range(0, len(values), self.PREPARE_STEP):
                if start:
                    yield
                for v in values[start:start + self.PREPARE_STEP]:
                    h1, h2 = _hash_pair(v, bit_size)
                    table[top - h1] = table.get(top - h1, 0) | 1 << (top - h2)
            built = table
        if len(self._masks) >= self.MAX_SIZES:
            self._masks.clear()
        self._masks[bit_size] = built

    def _masks_for(self, bit_size: int) -> tuple[int, ...] | dict[int, int]:
        masks = self._masks.get(bit_size)
        if masks is None:
            for _ in self.prepare(bit_size):
                pass
            masks = self._masks[bit_size]
        return masks

    def may_match(self, filter_bits: bytes | memoryview) -> bool:
        if not filter_bits:
            return self.match_unfiltered
        bit_size = len(filter_bits) * 8
        bits = int.from_bytes(filter_bits, "big")
        if self.match_unfiltered and bits >> (bit_size - 1) & 1:
            return True
        masks = self._masks_for(bit_size)
        if isinstance(masks, tuple):
            return any(bits & mask == mask for mask in masks)
        rest = bits  # a value matches when its first bit is set and one of the second bits it pairs with
        while rest:
            low = rest & -rest
            seconds = masks.get(low.bit_length() - 1)
            if seconds is not None and bits & seconds:
                return True
            rest ^= low
        return False


def bloom_all_valued(filter_bits: bytes) -> bool:
    """Did every entry of the chunk with this filter have a filter value? (Bit 0 marks an entry without
    one; no filter at all means none had one.) A stream-protocol publisher's filter values live only
    here, not in the messages, so this is all a reader knows of such an entry's value."""
    return bool(filter_bits) and not filter_bits[0] & 0x80


def encode_entries(entries: Sequence[Entry]) -> tuple[bytes, int]:
    """The data section for `entries` and its record count."""
    parts: list[bytes] = []
    records = 0
    for entry in entries:
        if isinstance(entry, SubBatch):
            if not 0 < entry.num_records <= 0xFFFF:
                raise ValueError(f"a sub-batch holds 1..65535 records, not {entry.num_records}")
            parts.append(_BATCH.pack(0x80 | (entry.compression & 0x7) << 4, entry.num_records,
                                     entry.uncompressed_size, len(entry.body)))
            parts.append(entry.body)
            records += entry.num_records
        else:
            if len(entry) > MAX_ENTRY_SIZE:
                raise ValueError(f"an entry of {len(entry)} bytes is over the limit")
            parts.append(_SIMPLE.pack(len(entry)))
            parts.append(entry)
            records += 1
    return b"".join(parts), records


def encode(entries: Sequence[Entry], *, chunk_type: int = USER, timestamp: int, epoch: int, chunk_id: int,
           trailer: bytes = b"", filter_bits: bytes = b"") -> bytes:
    """One chunk. `entries`: 1..65535 of them."""
    if not 0 < len(entries) <= MAX_ENTRIES:
        raise ValueError(f"a chunk holds 1..{MAX_ENTRIES} entries, not {len(entries)}")
    if chunk_type not in CHUNK_TYPES:
        raise ValueError(f"unknown chunk type {chunk_type}")
    if len(filter_bits) > 255:
        raise ValueError("a chunk filter is at most 255 bytes")
    data, records = encode_entries(entries)
    return encode_data((data,), entries=len(entries), records=records, chunk_type=chunk_type, timestamp=timestamp,
                       epoch=epoch, chunk_id=chunk_id, trailer=trailer, filter_bits=filter_bits)


def encode_data(data: Sequence[bytes], *, entries: int, records: int, chunk_type: int = USER, timestamp: int,
                epoch: int, chunk_id: int, trailer: bytes = b"", filter_bits: bytes = b"") -> bytes:
    """One chunk around a data section already encoded (`encode_entries`' framing), given as the parts
    to join, holding `entries` entries and `records` records: the stream protocol's publish path hands
    its frames' entries over as they came (runtime/stream_session/publishing.py), without a record per
    message, and the parts are copied once, into the chunk."""
    if not 0 < entries <= MAX_ENTRIES:
        raise ValueError(f"a chunk holds 1..{MAX_ENTRIES} entries, not {entries}")
    crc = size = 0
    for part in data:
        crc = crc32(part, crc)
        size += len(part)
    header = HEADER.pack(MAGIC_VERSION, chunk_type, entries, records, timestamp, epoch, chunk_id,
                         crc, size, len(trailer), len(filter_bits))
    return b"".join((header, filter_bits, *data, trailer))


def verify(chunk: bytes | memoryview) -> bool:
    """The chunk is whole and its data matches its CRC."""
    try:
        h = decode_header(chunk)
    except ValueError:
        return False
    if len(chunk) != h.size:
        return False
    start = HEADER_SIZE + h.bloom_size
    return crc32(memoryview(chunk)[start:start + h.data_size], 0) == h.crc


def parts(chunk: bytes | memoryview) -> tuple[Header, memoryview, memoryview, memoryview]:
    """(header, filter, data, trailer) of a whole chunk."""
    h = decode_header(chunk)
    view = memoryview(chunk)
    if len(view) < h.size:
        raise ValueError(f"chunk {h.chunk_id} is short: {len(view)} of {h.size} bytes")
    a = HEADER_SIZE
    b = a + h.bloom_size
    c = b + h.data_size
    return h, view[a:b], view[b:c], view[c:c + h.trailer_size]


def iter_entries(data: memoryview) -> Iterator[Entry]:
    """The entries of a data section, as stored."""
    pos, end = 0, len(data)
    while pos < end:
        first = data[pos]
        if first & 0x80:
            flags, n, usize, length = _BATCH.unpack_from(data, pos)
            pos += _BATCH.size
            if pos + length > end:
                raise ValueError("a sub-batch runs past the chunk's data")
            yield SubBatch(n, (flags >> 4) & 0x7, usize, bytes(data[pos:pos + length]))
            pos += length
        else:
            (length,) = _SIMPLE.unpack_from(data, pos)
            pos += _SIMPLE.size
            if pos + length > end:
                raise ValueError("an entry runs past the chunk's data")
            yield bytes(data[pos:pos + length])
            pos += length


class BadSubBatch(ValueError):
    """A sub-batch whose records cannot be read: an unknown codec, over the budget, or not
    what it declares."""


def sub_batch_records(batch: SubBatch) -> list[bytes]:
    """The records of an uncompressed sub-batch (each u32 length + bytes). Compressed sub-batches:
    `decoded_records` (ValueError here)."""
    if batch.compression != NO_COMPRESSION:
        raise ValueError(f"sub-batch compressed with codec {batch.compression}")
    out: list[bytes] = []
    body, pos = batch.body, 0
    for _ in range(batch.num_records):
        (length,) = _SIMPLE.unpack_from(body, pos)
        out.append(body[pos + 4:pos + 4 + length])
        pos += 4 + length
    return out


def inflate_gzip(body: bytes, declared: int, budget: int) -> bytes:
    """A gzip sub-batch's body inflated: exactly `declared` bytes, `declared` at most `budget`
    (checked first). Concatenated gzip members are read in turn (gzip allows them). BadSubBatch if
    the body is not gzip, is cut short, or inflates to anything but `declared` bytes."""
    if declared > budget:
        raise BadSubBatch(f"gzip sub-batch declares {declared} bytes uncompressed, over the limit of {budget}")
    out: list[bytes] = []
    size = 0
    rest = body
    try:
        while rest:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            part = inflater.decompress(rest, declared - size + 1)
            size += len(part)
            out.append(part)
            if size > declared or not inflater.eof:
                raise BadSubBatch(f"gzip sub-batch inflates past its declared {declared} bytes"
                                  if size > declared else "gzip sub-batch is cut short")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise BadSubBatch(f"gzip sub-batch does not inflate: {exc}") from None
    if size != declared:
        raise BadSubBatch(f"gzip sub-batch inflates to {size} bytes, not the declared {declared}")
    return b"".join(out)


def split_records(body: bytes | memoryview, count: int) -> list[bytes]:
    """`count` records (each u32 length + bytes) that fill `body` exactly; BadSubBatch otherwise."""
    out: list[bytes] = []
    pos, end = 0, len(body)
    for _ in range(count):
        if pos + 4 > end:
            raise BadSubBatch(f"sub-batch holds fewer than its {count} records")
        (length,) = _SIMPLE.unpack_from(body, pos)
        pos += 4
        if pos + length > end:
            raise BadSubBatch("a sub-batch record runs past its data")
        out.append(bytes(body[pos:pos + length]))
        pos += length
    if pos != end:
        raise BadSubBatch(f"{end - pos} bytes follow the sub-batch's {count} records")
    return out


def decompress_framed(codec: int, body: bytes, declared: int, budget: int) -> memoryview:
    """A snappy, lz4 or zstd sub-batch's body decoded: exactly `declared` bytes, `declared` at most
    `budget` (checked first). The decoder writes into a buffer of `declared` + 1 bytes and is stopped
    when its output would not fit, so a bomb costs that buffer and no more. BadSubBatch if the body is
    not that codec's framed format, is cut short, or decodes to anything but `declared` bytes."""
    name = CODEC_NAMES[codec]
    if declared > budget:
        raise BadSubBatch(f"{name} sub-batch declares {declared} bytes uncompressed, over the limit of {budget}")
    out = bytearray(declared + 1)
    try:
        size: int = _CRAMJAM_CODECS[codec].decompress_into(body, out)
    except cramjam.DecompressionError as exc:
        raise BadSubBatch(f"{name} sub-batch does not decode to its declared {declared} bytes: {exc}") from None
    if size > declared:
        raise BadSubBatch(f"{name} sub-batch decodes past its declared {declared} bytes")
    if size != declared:
        raise BadSubBatch(f"{name} sub-batch decodes to {size} bytes, not the declared {declared}")
    return memoryview(out)[:declared]


def decoded_records(batch: SubBatch, budget: int = MAX_UNCOMPRESSED_BYTES) -> list[bytes]:
    """The records of a sub-batch, uncompressed or compressed with gzip, snappy, lz4 or zstd (decoded
    within `budget` bytes); BadSubBatch for another codec, a body over the budget, or a body that is not
    what it declares."""
    if batch.compression == NO_COMPRESSION:
        return split_records(batch.body, batch.num_records)
    if batch.compression == GZIP:
        return split_records(inflate_gzip(batch.body, batch.uncompressed_size, budget), batch.num_records)
    if batch.compression in _CRAMJAM_CODECS:
        plain = decompress_framed(batch.compression, batch.body, batch.uncompressed_size, budget)
        return split_records(plain, batch.num_records)
    raise BadSubBatch(f"sub-batch compressed with codec {batch.compression}, which hutch does not decode")


def _batch_records(batch: SubBatch, budget: list[int], skipped: list[tuple[int, int, str]] | None,
                   offset: int) -> list[bytes] | None:
    """A compressed sub-batch's records, the chunk's remaining `budget` (one cell) reduced by what it
    inflated; None (and a note in `skipped`: offset, records, why) when it cannot be read."""
    try:
        records = decoded_records(batch, budget[0])
    except BadSubBatch as exc:
        if skipped is not None:
            skipped.append((offset, batch.num_records, str(exc)))
        return None
    budget[0] -= batch.uncompressed_size
    return records


def iter_records(chunk: bytes | memoryview, skipped: list[tuple[int, int, str]] | None = None
                 ) -> Iterator[tuple[int, bytes]]:
    """(offset, record bytes) of every record of a USER chunk; compressed sub-batches are decoded (within
    `MAX_UNCOMPRESSED_BYTES` for the chunk); the records of a sub-batch that cannot be read (codecs 5-7,
    over the budget, damaged) are given as b"" (the reader skips them) and noted in `skipped`."""
    h, _, data, _ = parts(chunk)
    offset = h.chunk_id
    budget = [MAX_UNCOMPRESSED_BYTES]
    for entry in iter_entries(data):
        if isinstance(entry, SubBatch):
            if entry.compression == NO_COMPRESSION:
                for rec in sub_batch_records(entry):
                    yield offset, rec
                    offset += 1
                continue
            records = _batch_records(entry, budget, skipped, offset)
            for rec in records if records is not None else [b""] * entry.num_records:
                yield offset, rec
                offset += 1
        else:
            yield offset, entry
            offset += 1


class RecordCursor:
    """A USER chunk's non-empty records at offset `start` or later, a slice at a time (`take`): what
    `record_list` gives in one list, for a reader that must bound its work per loop turn. Compressed
    sub-batches are inflated one at a time as the cursor reaches them (within the chunk's
    `MAX_UNCOMPRESSED_BYTES`), and their records too are given out in slices: one 128 KB publish of
    gzip sub-batches of empty AMQP 1.0 messages is a chunk of 5.3 million records, which `record_list`
    took 7 s to list and an AMQP 0-9-1 reader 190 s and 5.8 GB to convert, on the event loop.

    Invariant: the records given by successive `take`s until `done` are `record_list(chunk, start)`."""

    __slots__ = ("chunk", "start", "skipped", "offset", "_pos", "_end", "_budget", "_batch", "_at")

    def __init__(self, chunk: bytes, start: int = 0, skipped: list[tuple[int, int, str]] | None = None) -> None:
        h = decode_header(chunk)
        self._pos = HEADER_SIZE + h.bloom_size
        self._end = self._pos + h.data_size
        if len(chunk) < self._end:
            raise ValueError(f"chunk {h.chunk_id} is short: {len(chunk)} of {h.size} bytes")
        self.chunk, self.start, self.skipped = chunk, start, skipped
        self.offset = h.chunk_id  # the offset of the next record looked at
        self._budget = [MAX_UNCOMPRESSED_BYTES]
        self._batch: list[bytes] = []  # the records of the sub-batch being given out
        self._at = 0  # the next of them

    @property
    def done(self) -> bool:
        return self._pos >= self._end and self._at >= len(self._batch)

    def take(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` (offset, record), having looked at about `limit` records at most (empty ones and
        those before `start` count; inflating a sub-batch counts one per KiB): the answer may be empty
        while not `done`."""
        out: list[tuple[int, bytes]] = []
        work = 0
        chunk, start = self.chunk, self.start
        while work < limit:
            if self._at < len(self._batch):
                stop = min(len(self._batch), self._at + limit - work)
                offset = self.offset
                for rec in self._batch[self._at:stop]:
                    if rec and offset >= start:
                        out.append((offset, rec))
                    offset += 1
                work += stop - self._at
                self.offset, self._at = offset, stop
                continue
            pos = self._pos
            if pos >= self._end:
                break
            if chunk[pos] & 0x80:
                flags, n, usize, length = _BATCH.unpack_from(chunk, pos)
                pos += _BATCH.size
                self._pos = pos + length
                self._batch, self._at = [], 0
                if self.offset + n <= start:
                    self.offset += n
                    work += 1
                    continue
                batch = SubBatch(n, (flags >> 4) & 0x7, usize, bytes(chunk[pos:pos + length]))
                records = (sub_batch_records(batch) if batch.compression == NO_COMPRESSION
                           else _batch_records(batch, self._budget, self.skipped, self.offset))
                work += 1 + (usize >> 10 if batch.compression != NO_COMPRESSION else 0)
                if not records:
                    self.offset += n
                    continue
                self._batch = records
                continue
            (length,) = _SIMPLE.unpack_from(chunk, pos)
            pos += 4
            if pos + length > self._end:
                raise ValueError("an entry runs past the chunk's data")
            if length and self.offset >= start:
                out.append((self.offset, chunk[pos:pos + length]))
            self._pos = pos + length
            self.offset += 1
            work += 1
        return out


def record_list(chunk: bytes, start: int = 0, skipped: list[tuple[int, int, str]] | None = None
                ) -> list[tuple[int, bytes]]:
    """(offset, record) of a USER chunk's non-empty records at offset `start` or later, in one pass: what
    `iter_records` gives, without its empty records (those of a sub-batch that cannot be read, noted in
    `skipped`) and without a generator per level (the AMQP 0-9-1 consumer's hot path: one call per
    chunk, not one step per record)."""
    h = decode_header(chunk)
    pos = HEADER_SIZE + h.bloom_size
    end = pos + h.data_size
    if len(chunk) < end:
        raise ValueError(f"chunk {h.chunk_id} is short: {len(chunk)} of {h.size} bytes")
    offset = h.chunk_id
    out: list[tuple[int, bytes]] = []
    budget = [MAX_UNCOMPRESSED_BYTES]
    unpack = _SIMPLE.unpack_from
    while pos < end:
        if chunk[pos] & 0x80:
            flags, n, usize, length = _BATCH.unpack_from(chunk, pos)
            pos += _BATCH.size
            batch = SubBatch(n, (flags >> 4) & 0x7, usize, bytes(chunk[pos:pos + length]))
            pos += length
            records = (sub_batch_records(batch) if batch.compression == NO_COMPRESSION
                       else None if offset + n <= start else _batch_records(batch, budget, skipped, offset))
            for rec in records or ():
                if offset >= start and rec:
                    out.append((offset, rec))
                offset += 1
            if not records:
                offset += n
            continue
        (length,) = unpack(chunk, pos)
        pos += 4
        if pos + length > end:
            raise ValueError("an entry runs past the chunk's data")
        if length and offset >= start:
            out.append((offset, chunk[pos:pos + length]))
        pos += length
        offset += 1
    return out


class _Format:
    """`ChunkFormat` for the files (storage/stream_log.py)."""

    header_size = HEADER_SIZE

    def info(self, header: bytes) -> ChunkInfo:
        return decode_header(header).info()

    def verify(self, chunk: bytes) -> bool:
        return verify(chunk)


FORMAT = _Format()
