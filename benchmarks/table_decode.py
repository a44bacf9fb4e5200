"""How long one frame-sized (~128 KiB) field table takes to decode, pure against compiled, by shape.

    python benchmarks/table_decode.py

Each shape is what an attacker could put in one content header's headers table (docs/security.md,
sessions 16 and 19): session 16's empty keys and voids, the turn-flood benchmark's 11,500 int fields,
arrays of each costly letter, distinct keys. Prints the best of 9 decodes with `table.decode_table_pure`
and with `table.decode_table` (the compiled `_ctable` when built). docs/BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

from hutch.amqp import spec, table


def tab(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def array_of(unit: Callable[[int], bytes], size: int, room: int) -> bytes:
    count = (room - 6) // size
    return tab(b"\x00A" + struct.pack(">I", count * size) + b"".join(unit(i) for i in range(count)))


def shapes() -> dict[str, bytes]:
    room = 131072 - 8 - 12 - 2 - 4 - 16
    return {
        "empty keys, voids": tab(b"\x00V" * (room // 2)),
        "11,500 h{i}=I": spec.BasicProperties(headers={f"h{i}": i for i in range(11500)}).encode()[2:],
        "array of V": array_of(lambda i: b"V", 1, room),
        "array of empty F": array_of(lambda i: b"F\0\0\0\0", 5, room),
        "array of empty A": array_of(lambda i: b"A\0\0\0\0", 5, room),
        "array of D": array_of(lambda i: b"D\x02" + struct.pack(">i", i), 6, room),
        "array of T": array_of(lambda i: b"T" + struct.pack(">Q", i), 9, room),
        "array of invalid S": array_of(lambda i: b"S\0\0\0\1\xff", 6, room),
        "array of l": array_of(lambda i: b"l" + struct.pack(">q", i << 40), 9, room),
        "8,836 distinct keys": tab(b"".join(b"\x02" + bytes((0x21 + i // 94, 0x21 + i % 94)) + b"V"
                                            for i in range(94 * 94))),
    }


def best_ms(fn: Callable[[bytes, int], Any], raw: bytes) -> float:
    times = []
    for _ in range(9):
        start = time.perf_counter()
        fn(raw, 0)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    print(f"compiled decoder: {table.COMPILED_TABLES}")
    for name, raw in shapes().items():
        pure, chosen = best_ms(table.decode_table_pure, raw), best_ms(table.decode_table, raw)
        print(f"{name:22s} {len(raw):7d} B  pure {pure:8.2f} ms  chosen {chosen:7.2f} ms  x{pure / chosen:5.1f}")


if __name__ == "__main__":
    main()
