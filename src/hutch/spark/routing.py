"""Routing a row to a partition of a super stream, as RabbitMQ's stream clients do.

Owns: `murmur3_32` (MurmurHash3, x86 32-bit) and `partition_of` - the hash routing strategy of the
RabbitMQ stream clients (Java's `HashRoutingMurmurStrategy`, the .NET and Go clients): the UTF-8 routing
key hashed with murmur3 and seed 104729, read as unsigned, modulo the number of partitions, which are
taken in the super stream's partition order. So a row written by Spark lands in the partition a Java,
.NET or Go producer would have chosen for the same key. (rstream, the Python client, hashes differently:
128-bit murmur3 of the key's UTF-16 bytes; its producers do not agree with the others.)

Pure: no IO, no pyspark; used on executors for every row of a super stream write.
"""

from __future__ import annotations

import struct

SEED = 104729
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_MASK = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of `data`, unsigned."""
    h = seed & _MASK
    n = len(data)
    body = n - n % 4
    for (k,) in struct.iter_unpack("<I", data[:body]):
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[body:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def partition_of(routing_key: str, partitions: int) -> int:
    """The index (in partition order) of the partition a key routes to."""
    assert partitions > 0, "a super stream has at least one partition"
    return murmur3_32(routing_key.encode(), SEED) % partitions


__all__ = ["SEED", "murmur3_32", "partition_of"]
