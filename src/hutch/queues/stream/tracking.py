"""Tracking kept in the log: publisher deduplication and consumer offsets (osiris's tracking chunks).

Owns: the tracking blocks (osiris's format, big-endian), `Tracking` (what they add up to) and how they
are encoded into a user chunk's trailer, a TRACKING_DELTA chunk and a TRACKING_SNAPSHOT chunk.

    block: u8 type | u8 id size | id | data
      type 0, sequence (a publisher reference → its last publishing id): u64 chunk id | u64 sequence
      type 1, offset (a consumer name → its stored offset):              u64 offset
      type 2, timestamp (reserved by osiris; read and ignored here):      i64 timestamp

    in a user chunk's trailer (osiris_tracking's `flush` / `parse_trailer`), every block's data is
    8 bytes: a sequence block is u64 sequence alone, its chunk id the chunk's own (`trailer_block`,
    `iter_trailer`). Trailers written before hutch followed that carry the chunk id too (one sequence
    block of 16 bytes of data); they read as they did.

Rules:
- A user chunk written for publishes with a publisher reference carries one sequence block per
  reference in its trailer: replaying the log's chunks (trailers, deltas, snapshots) in order rebuilds
  `Tracking`, so deduplication and stored offsets survive a restart and replicate with the log.
- Every new segment starts with a TRACKING_SNAPSHOT chunk when there is anything to track, so deleting
  old segments (retention) never loses tracking: recovery reads only the last segment.
- Bounds: references are 1..255 bytes (the stream protocol's rule for a consumer name and a publisher
  reference is 256 characters; ids here are u8-sized); a snapshot keeps the `MAX_WRITERS` most recently
  written publishers (osiris's `max_sequences` idea) and every stored offset up to `MAX_OFFSETS`; in
  memory, too, at most `MAX_OFFSETS` consumer references are kept, the one stored longest ago dropped
  for a new one (a client storing offsets under ever new references must not grow the node without
  bound between two snapshots).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

SEQUENCE = 0
OFFSET = 1
TIMESTAMP = 2

MAX_ID_BYTES = 255
MAX_WRITERS = 255
MAX_OFFSETS = 100_000

_U64 = struct.Struct(">Q")
_Q2 = struct.Struct(">QQ")


def _check_id(ref: bytes) -> None:
    if not 0 < len(ref) <= MAX_ID_BYTES:
        raise ValueError(f"a tracking reference is 1..{MAX_ID_BYTES} bytes, not {len(ref)}")


def sequence_block(ref: bytes, chunk_id: int, sequence: int) -> bytes:
    _check_id(ref)
    return bytes((SEQUENCE, len(ref))) + ref + _Q2.pack(chunk_id, sequence)


def trailer_block(ref: bytes, sequence: int) -> bytes:
    """A user chunk's trailer for a publisher reference (osiris's: the chunk id is the chunk's own)."""
    _check_id(ref)
    return bytes((SEQUENCE, len(ref))) + ref + _U64.pack(sequence)


def offset_block(ref: bytes, offset: int) -> bytes:
    _check_id(ref)
    return bytes((OFFSET, len(ref))) + ref + _U64.pack(offset)


def iter_blocks(data: bytes | memoryview) -> Iterator[tuple[int, bytes, tuple[int, ...]]]:
    """(type, id, values) of every block; ValueError on a malformed one."""
    return _blocks(memoryview(data), None)


def iter_trailer(data: bytes | memoryview, chunk_id: int) -> Iterator[tuple[int, bytes, tuple[int, ...]]]:
    """(type, id, values) of a user chunk's trailer blocks, a sequence's values as (chunk id, sequence);
    ValueError on a malformed one. A trailer that is exactly one sequence block with 16 bytes of data is
    the earlier format (its chunk id written out): it cannot be read the other way, since a block
    after an 8-byte sequence would be at least 11 bytes, not 8."""
    view = memoryview(data)
    if len(view) >= 2 and view[0] == SEQUENCE and len(view) == 2 + view[1] + 16:
        return _blocks(view, None)
    return _blocks(view, chunk_id)


def _blocks(view: memoryview, trailer_of: int | None) -> Iterator[tuple[int, bytes, tuple[int, ...]]]:
    """The blocks of `view`: a sequence's data is (chunk id, sequence), or, in the trailer of the
    chunk `trailer_of`, the sequence alone."""
    pos, end = 0, len(view)
    while pos < end:
        if pos + 2 > end:
            raise ValueError("a tracking block is cut short")
        kind, size = view[pos], view[pos + 1]
        ref = bytes(view[pos + 2:pos + 2 + size])
        pos += 2 + size
        if kind not in (SEQUENCE, OFFSET, TIMESTAMP):
            raise ValueError(f"unknown tracking type {kind}")
        width = 16 if kind == SEQUENCE and trailer_of is None else 8
        if pos + width > end:
            raise ValueError("a tracking block is cut short")
        if width == 16:
            values: tuple[int, ...] = _Q2.unpack_from(view, pos)
        elif kind == SEQUENCE:
            assert trailer_of is not None
            values = (trailer_of, _U64.unpack_from(view, pos)[0])
        else:
            values = _U64.unpack_from(view, pos)
        pos += width
        yield kind, ref, values


@dataclass
class Tracking:
    """Publisher sequences and consumer offsets, as the log's chunks so far say.

    Invariant: `sequences[ref]` is (chunk id, last publishing id) of the last chunk written with that
    reference; sequences only grow."""

    sequences: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    offsets: dict[bytes, int] = field(default_factory=dict)

    def apply(self, data: bytes | memoryview) -> None:
        """Fold a delta or snapshot's blocks in."""
        self._fold(iter_blocks(data))

    def apply_trailer(self, data: bytes | memoryview, chunk_id: int) -> None:
        """Fold the trailer of the user chunk `chunk_id` in."""
        self._fold(iter_trailer(data, chunk_id))

    def _fold(self, blocks: Iterator[tuple[int, bytes, tuple[int, ...]]]) -> None:
        for kind, ref, values in blocks:
            if kind == SEQUENCE:
                chunk_id, seq = values
                old = self.sequences.get(ref)
                if old is None or seq >= old[1]:
                    self.sequences[ref] = (chunk_id, seq)
            elif kind == OFFSET:
                offsets = self.offsets
                if ref in offsets:
                    del offsets[ref]  # (stored again: it becomes the newest, the last one dropped)
                elif len(offsets) >= MAX_OFFSETS:
                    del offsets[next(iter(offsets))]  # the reference stored longest ago makes room
                offsets[ref] = values[0]

    def sequence(self, ref: bytes) -> int | None:
        entry = self.sequences.get(ref)
        return None if entry is None else entry[1]

    def is_empty(self) -> bool:
        return not self.sequences and not self.offsets

    def snapshot(self) -> bytes:
        """Blocks for everything tracked (bounded, see the module rules)."""
        writers = sorted(self.sequences.items(), key=lambda kv: kv[1][0])[-MAX_WRITERS:]
        self.sequences = dict(writers)
        if len(self.offsets) > MAX_OFFSETS:
            self.offsets = dict(list(self.offsets.items())[-MAX_OFFSETS:])
        out = [sequence_block(ref, cid, seq) for ref, (cid, seq) in writers]
        out.extend(offset_block(ref, off) for ref, off in self.offsets.items())
        return b"".join(out)
