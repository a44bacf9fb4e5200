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

Rules:
- The CRC covers the data only (osiris); a torn or flipped data byte fails `verify`. A torn header is
  caught by the lengths (the chunk would end past the file) or the magic.
- The bloom filter is osiris_bloom's layout (bit 0 set: some entry has no filter value; each value
  sets two bits) with our own hash (crc32, not `erlang:phash2`): a filter never excludes a chunk that
  holds a wanted value (no false negatives); the reader still checks each message's value.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

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

_SIMPLE = struct.Struct(">I")
_BATCH = struct.Struct(">BHII")


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
    without a value)? No filter: the chunk has only unfiltered entries."""
    if not filter_bits:
        return match_unfiltered
    bit_size = len(filter_bits) * 8

    def is_set(bit: int) -> bool:
        return bool(filter_bits[bit // 8] & (0x80 >> (bit % 8)))

    if match_unfiltered and is_set(0):
        return True
    return any(all(is_set(b) for b in _hash_pair(v, bit_size)) for v in values if v)


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
            yield SubBatch(n, (flags >> 4) & 0x7, usize, bytes(data[pos:pos + length]))
            pos += length
        else:
            (length,) = _SIMPLE.unpack_from(data, pos)
            pos += _SIMPLE.size
            if pos + length > end:
                raise ValueError("an entry runs past the chunk's data")
            yield bytes(data[pos:pos + length])
            pos += length


def sub_batch_records(batch: SubBatch) -> list[bytes]:
    """The records of an uncompressed sub-batch (each u32 length + bytes). Compressed sub-batches are the
    client's business (RabbitMQ does not decompress them either): ValueError."""
    if batch.compression != NO_COMPRESSION:
        raise ValueError(f"sub-batch compressed with codec {batch.compression}")
    out: list[bytes] = []
    body, pos = batch.body, 0
    for _ in range(batch.num_records):
        (length,) = _SIMPLE.unpack_from(body, pos)
        out.append(body[pos + 4:pos + 4 + length])
        pos += 4 + length
    return out


def iter_records(chunk: bytes | memoryview) -> Iterator[tuple[int, bytes]]:
    """(offset, record bytes) of every record of a USER chunk; a compressed sub-batch's records cannot be
    split here, so each is given as b"" (the reader skips them; docs/streams.md)."""
    h, _, data, _ = parts(chunk)
    offset = h.chunk_id
    for entry in iter_entries(data):
        if isinstance(entry, SubBatch):
            if entry.compression == NO_COMPRESSION:
                for rec in sub_batch_records(entry):
                    yield offset, rec
                    offset += 1
            else:
                for _ in range(entry.num_records):
                    yield offset, b""
                    offset += 1
        else:
            yield offset, entry
            offset += 1


def record_list(chunk: bytes, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, record) of a USER chunk's non-empty records at offset `start` or later, in one pass: what
    `iter_records` gives, without its empty records (a compressed sub-batch's) and without a generator per
    level (the AMQP 0-9-1 consumer's hot path: one call per chunk, not one step per record)."""
    h = decode_header(chunk)
    pos = HEADER_SIZE + h.bloom_size
    end = pos + h.data_size
    if len(chunk) < end:
        raise ValueError(f"chunk {h.chunk_id} is short: {len(chunk)} of {h.size} bytes")
    offset = h.chunk_id
    out: list[tuple[int, bytes]] = []
    unpack = _SIMPLE.unpack_from
    while pos < end:
        if chunk[pos] & 0x80:
            flags, n, usize, length = _BATCH.unpack_from(chunk, pos)
            pos += _BATCH.size
            batch = SubBatch(n, (flags >> 4) & 0x7, usize, bytes(chunk[pos:pos + length]))
            pos += length
            if batch.compression == NO_COMPRESSION:
                for rec in sub_batch_records(batch):
                    if offset >= start and rec:
                        out.append((offset, rec))
                    offset += 1
            else:
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
