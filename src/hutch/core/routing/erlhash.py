"""Erlang's `erlang:phash2/1`, `rand`'s exs1024 generator and RabbitMQ's jump consistent hash, bit for bit.

Part of `hutch.core.routing`. RabbitMQ's consistent-hash exchange picks a bucket with
`jump_consistent_hash(Key, N)`: an integer key seeds `rand:seed_s(exs1024, {Key, Key, Key})`, any other
term is first hashed with `erlang:phash2` (the ERTS `make_hash2` function masked to 27 bits), and the
bucket is drawn by Lamping and Veach's jump hash with `rand:uniform_s` as its generator. Reproducing the
three exactly is what makes a key land in the same queue as on RabbitMQ for the same bindings.

Terms are modelled with Python values: `bytes` is a binary, `int` an integer, `float` a float, `Atom` an
atom, `tuple` a tuple and `list` a list of terms. Pure: no IO, no clock.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_M21 = 0x1FFFFF
_PHASH2_RANGE = 1 << 27

_HCONST = 0x9E3779B9
_HCONST_2 = 0x3C6EF372
_HCONST_3 = 0xDAA66D2B
_HCONST_4 = 0x78DDE6E4
_HCONST_9 = 0x8FF34781
_HCONST_10 = 0x2E2AC13A
_HCONST_11 = 0xCC623AF3
_HCONST_12 = 0x6A99B4AC
_HCONST_13 = 0x08D12E65
_NIL_HASH = 3468870702  # make_hash2 of [] when nothing was hashed before it
_NIL_DEF = 2  # NIL_DEF, mixed in when [] ends a list that was hashed


class Atom(str):
    """An Erlang atom (`undefined`, `true`, ...), told apart from a binary by its type."""

    __slots__ = ()


UNDEFINED = Atom("undefined")


def _mix3(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' 96-bit mix as ERTS writes it."""
    a = ((a - b - c) & _M32) ^ (c >> 13)
    b = ((b - c - a) & _M32) ^ ((a << 8) & _M32)
    c = ((c - a - b) & _M32) ^ (b >> 13)
    a = ((a - b - c) & _M32) ^ (c >> 12)
    b = ((b - c - a) & _M32) ^ ((a << 16) & _M32)
    c = ((c - a - b) & _M32) ^ (b >> 5)
    a = ((a - b - c) & _M32) ^ (c >> 3)
    b = ((b - c - a) & _M32) ^ ((a << 10) & _M32)
    return a, b, ((c - a - b) & _M32) ^ (b >> 15)


def _mix(a: int, b: int, c: int) -> int:
    return _mix3(a, b, c)[2]


def _hash2(x: int, y: int, const: int, h: int) -> int:
    return _mix((const + x) & _M32, (const + y) & _M32, h)


def _block_hash(data: bytes, initval: int) -> int:
    a = b = _HCONST
    c = initval
    full = len(data) - len(data) % 12
    for i in range(0, full, 12):
        wa, wb, wc = struct.unpack_from("<III", data, i)
        a, b, c = _mix3((a + wa) & _M32, (b + wb) & _M32, (c + wc) & _M32)
    tail = data[full:] + bytes(12 - (len(data) - full))
    c = (c + len(data)) & _M32
    wa, wb, wc = struct.unpack("<III", tail)
    a = (a + wa) & _M32
    b = (b + wb) & _M32
    c = (c + (wc << 8)) & _M32  # the first byte of c is reserved for the length
    return _mix(a, b, c)


def _atom_hash(name: str) -> int:
    """ERTS atom_hash: hashpjw over the latin-1 text of the atom."""
    h = 0
    for v in name.encode("latin-1"):
        h = ((h << 4) + v) & _M32
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def _int_hash(value: int, h: int) -> int:
    if -(1 << 27) <= value < (1 << 27):  # a 28-bit small: SINT32_HASH
        if value < 0:
            h = _hash2(-value, 0, _HCONST, h)
        return _hash2(value & _M32, 0, _HCONST, h)
    const = _HCONST_10 if value < 0 else _HCONST_11
    magnitude = -value if value < 0 else value
    while True:  # 64-bit digits, low first, each mixed as (low 32, high 32)
        digit = magnitude & _M64
        h = _hash2(digit & _M32, digit >> 32, const, h)
        magnitude >>= 64
        if not magnitude:
            return h


def _term_hash(term: object, h: int) -> int:
    if isinstance(term, Atom):
        return _atom_hash(term) if h == 0 else _hash2(_atom_hash(term), 0, _HCONST_3, h)
    if isinstance(term, (bytes, bytearray)):
        const = (_HCONST_13 + h) & _M32
        return const if not term else _block_hash(bytes(term), const)
    if isinstance(term, bool):
        return _term_hash(Atom("true" if term else "false"), h)
    if isinstance(term, int):
        return _int_hash(term, h)
    if isinstance(term, float):
        bits = struct.unpack("<Q", struct.pack("<d", term + 0.0))[0]  # + 0.0: -0.0 hashes as 0.0
        return _hash2(bits >> 32, bits & _M32, _HCONST_12, h)
    if isinstance(term, tuple):
        h = _hash2(len(term), 0, _HCONST_9, h)
        for element in term:
            h = _term_hash(element, h)
        return h
    if isinstance(term, list):
        return _list_hash(term, h)
    raise TypeError(f"no Erlang term for {type(term).__name__}")


def _list_hash(items: Sequence[object], h: int) -> int:
    i = 0
    n = len(items)
    while i < n:
        packed = count = 0
        while i < n:
            byte = items[i]
            if not isinstance(byte, int) or isinstance(byte, bool) or not 0 <= byte <= 255:
                break  # a run of bytes ends at the first element that is not an integer 0..255
            packed = (packed << 8) + byte
            i += 1
            if count == 3:
                h = _hash2(packed, 0, _HCONST_4, h)
                packed = count = 0
            else:
                count += 1
        if count:
            h = _hash2(packed, 0, _HCONST_4, h)
        if i < n:
            h = _term_hash(items[i], h)
            i += 1
    return _NIL_HASH if h == 0 else _hash2(_NIL_DEF, 0, _HCONST_2, h)


def phash2(term: object) -> int:
    """`erlang:phash2(Term)`: 0 ≤ result < 2**27, identical to the Erlang VM's."""
    return _term_hash(term, 0) % _PHASH2_RANGE


# ---------------------------------------------------------------------------------------------------
# rand's exs1024 (xorshift1024*) as `rand:seed_s(exs1024, {A, A, A})` and `rand:uniform_s/1` run it


class Exs1024:
    """`rand:seed_s(exs1024, {A1, A2, A3})`; `uniform()` is `rand:uniform_s/1` (a float in [0, 1))."""

    __slots__ = ("_state", "_p")

    def __init__(self, a1: int, a2: int, a3: int) -> None:
        b1 = (((a1 & _M21) + 1) * 2097131) & _M21
        b2 = (((a2 & _M21) + 1) * 2097133) & _M21
        b3 = (((a3 & _M21) + 1) * 2097143) & _M21
        r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
        generated = []
        for _ in range(16):  # exs1024_gen1024: 16 draws of xorshift64*, newest first in Erlang's list
            r ^= r >> 12
            r ^= (r << 25) & _M64
            r ^= r >> 27
            generated.append((r * 2685821657736338717) & _M64)
        self._state = generated[::-1]
        self._p = 0

    def next(self) -> int:
        s = self._state
        p = self._p
        s0 = s[p]
        p = (p + 1) & 15
        s1 = s[p]
        s1 ^= (s1 << 31) & _M64
        s1 ^= s1 >> 11
        s0 ^= s0 >> 30
        s[p] = s0 ^ s1
        self._p = p
        return (s[p] * 1181783497276652981) & _M64

    def uniform(self) -> float:
        return self.next() / 18446744073709551616.0


def jump_consistent_hash(key: object, buckets: int) -> int:
    """RabbitMQ's `jump_consistent_hash(Key, N)`: the bucket in [0, N) for an Erlang term `key`.

    A list hashes its head (an empty list hashes as `phash2([])`), an integer seeds the generator as
    is, any other term seeds it with its `phash2`.
    """
    if buckets == 1:
        return 0
    if isinstance(key, list):
        key = key[0] if key else phash2([])
    if not isinstance(key, int) or isinstance(key, bool):
        key = phash2(key)
    rng = Exs1024(key, key, key)
    b, j = -1, 0
    while j < buckets:
        b = j
        j = int((b + 1) / rng.uniform())
    return b
