"""Checksummed snapshot files, replaced atomically: durable definitions, Raft snapshots, index checkpoints.

Owns the snapshot file format and the write-then-rename protocol. A reader sees either the previous
complete snapshot or the new complete one, never a mix, whatever the moment of a crash.

Layout (little-endian)::

    offset 0   8 bytes  magic  b"HUTCHSNP"
    offset 8   u8       format version (1)
    offset 9   u8       kind   (caller's tag: what the payload is; checked on read if given)
    offset 10  u16      reserved, 0
    offset 12  u64      payload length
    offset 20  u32      zlib.crc32 over bytes 0..19 and the payload
    offset 24  ...      payload

Write protocol: write ``<path>.tmp`` (removing a stale one first), fdatasync it, rename it over ``<path>``,
fsync the directory. The rename is only issued once the data is durable, so whichever name survives a crash
points at complete bytes; the directory fsync makes the new name itself durable before ``write_snapshot``
returns.
"""

from __future__ import annotations

import posixpath
import struct
import zlib
from collections.abc import Sequence

from hutch.storage.errors import CorruptSnapshot, StorageError
from hutch.storage.fs import Bytes, FileSystem

MAGIC = b"HUTCHSNP"
VERSION = 1
_HEAD = struct.Struct("<8sBBHQ")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _CRC.size  # 24
TMP_SUFFIX = ".tmp"


def encode_snapshot(payload: Bytes | Sequence[Bytes], kind: int = 0) -> list[Bytes]:
    """The snapshot file's bytes as a list of parts (header first); ``payload`` may be given in parts."""
    parts: list[Bytes] = [payload] if isinstance(payload, bytes | bytearray | memoryview) else list(payload)
    if not 0 <= kind <= 255:
        raise ValueError("kind must be 0..255")
    head = _HEAD.pack(MAGIC, VERSION, kind, 0, sum(len(p) for p in parts))
    crc = zlib.crc32(head)
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [head + _CRC.pack(crc), *parts]


def decode_snapshot(data: Bytes, *, file: str = "<buffer>", kind: int | None = None) -> bytes:
    """Verify a snapshot file's bytes and return its payload; raises :class:`CorruptSnapshot`."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise CorruptSnapshot(file, f"{len(view)} bytes is shorter than the header")
    magic, version, found_kind, _reserved, length = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise CorruptSnapshot(file, "bad magic (not a hutch snapshot)")
    if version != VERSION:
        raise CorruptSnapshot(file, f"unknown format version {version}")
    if len(view) != HEADER_BYTES + length:
        raise CorruptSnapshot(file, f"header says {length} payload bytes, file has {len(view) - HEADER_BYTES}")
    (stored_crc,) = _CRC.unpack_from(view, _HEAD.size)
    payload = view[HEADER_BYTES:]
    if zlib.crc32(payload, zlib.crc32(view[:_HEAD.size])) != stored_crc:
        raise CorruptSnapshot(file, "checksum mismatch")
    if kind is not None and found_kind != kind:
        raise CorruptSnapshot(file, f"kind {found_kind}, expected {kind}")
    return bytes(payload)


def write_snapshot(fs: FileSystem, path: str, payload: Bytes | Sequence[Bytes], *, kind: int = 0) -> None:
    """Atomically replace the snapshot at ``path``; durable when this returns."""
    tmp = path + TMP_SUFFIX
    directory = posixpath.dirname(path) or "."
    if fs.exists(tmp):
        fs.delete(tmp)  # left over from a crash during an earlier write
    handle = fs.open_append(tmp)
    try:
        handle.write(b"".join(encode_snapshot(payload, kind)))
        handle.sync()
    except StorageError:
        handle.close()
        try:
            fs.delete(tmp)
        except StorageError:
            pass  # the next write removes it
        raise
    handle.close()
    fs.rename(tmp, path)
    fs.fsync_dir(directory)


def read_snapshot(fs: FileSystem, path: str, *, kind: int | None = None) -> bytes | None:
    """The payload of the snapshot at ``path``, None if there is none; raises :class:`CorruptSnapshot`."""
    if not fs.exists(path):
        return None
    return decode_snapshot(fs.read(path), file=path, kind=kind)
