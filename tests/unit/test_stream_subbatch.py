"""Sub-batches read for an AMQP 0-9-1 consumer (queues/stream/chunk.py): uncompressed, gzip, snappy, lz4
and zstd ones split into records, unknown codecs and hostile bodies refused within the budget, never
decoded past it."""

from __future__ import annotations

import gzip
from collections.abc import Callable

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.queues.stream import chunk as ck


def framed(records: list[bytes]) -> bytes:
    return b"".join(len(r).to_bytes(4, "big") + r for r in records)


def gz_batch(records: list[bytes]) -> ck.SubBatch:
    plain = framed(records)
    return ck.SubBatch(len(records), ck.GZIP, len(plain), gzip.compress(plain))


@settings(deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=30))
def test_gzip_sub_batch_gives_its_records(records: list[bytes]) -> None:
    assert ck.decoded_records(gz_batch(records)) == records
    raw = ck.encode([b"a", gz_batch(records), b"z"], timestamp=0, epoch=1, chunk_id=100)
    want = [b"a", *records, b"z"]
    assert [r for _, r in ck.iter_records(raw)] == want
    assert [(o, r) for o, r in ck.record_list(raw)] == [(100 + i, r) for i, r in enumerate(want) if r]


def test_concatenated_gzip_members_are_read_in_turn() -> None:
    plain = framed([b"one", b"two"])
    body = gzip.compress(plain[:5]) + gzip.compress(plain[5:])
    assert ck.decoded_records(ck.SubBatch(2, ck.GZIP, len(plain), body)) == [b"one", b"two"]


def test_declared_size_over_the_budget_is_refused_before_inflating() -> None:
    plain = framed([b"x" * 100])
    batch = ck.SubBatch(1, ck.GZIP, len(plain), gzip.compress(plain))
    with pytest.raises(ck.BadSubBatch, match="over the limit of 50"):
        ck.decoded_records(batch, budget=50)


def test_a_bomb_is_never_inflated_past_its_declared_length() -> None:
    bomb = gzip.compress(b"\0" * (32 * 1024 * 1024))  # ~32 KiB that inflate to 32 MiB
    assert len(bomb) < 64 * 1024
    with pytest.raises(ck.BadSubBatch, match="past its declared 16"):
        ck.inflate_gzip(bomb, 16, budget=ck.MAX_UNCOMPRESSED_BYTES)


@pytest.mark.parametrize(("body", "declared", "count", "why"), [
    (b"not gzip at all", 8, 1, "does not inflate"),
    (gzip.compress(framed([b"abc"]), mtime=0)[:-12], 7, 1, "cut short"),
    (gzip.compress(framed([b"abc"]), mtime=0), 9, 1, "not the declared 9"),
    (gzip.compress(framed([b"abc"]), mtime=0), 7, 2, "fewer than its 2 records"),
    (gzip.compress(framed([b"abc"]) + b"zz", mtime=0), 9, 1, "2 bytes follow"),
    (gzip.compress(b"\0\0\0\x09abc", mtime=0), 7, 1, "runs past"),
], ids=["not-gzip", "cut-short", "inflates-short", "too-few-records", "bytes-after", "record-past-end"])
def test_a_sub_batch_that_is_not_what_it_declares_is_refused(body: bytes, declared: int, count: int,
                                                             why: str) -> None:
    with pytest.raises(ck.BadSubBatch, match=why):
        ck.decoded_records(ck.SubBatch(count, ck.GZIP, declared, body))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_codecs_hutch_does_not_decode_are_skipped_and_noted(codec: int) -> None:
    batch = ck.SubBatch(3, codec, 20, b"\x01" * 12)
    raw = ck.encode([b"a", batch, b"b"], timestamp=0, epoch=1, chunk_id=7)
    skipped: list[tuple[int, int, str]] = []
    assert ck.record_list(raw, 0, skipped) == [(7, b"a"), (11, b"b")]
    assert skipped == [(8, 3, f"sub-batch compressed with codec {codec}, which hutch does not decode")]
    noted: list[tuple[int, int, str]] = []
    assert list(ck.iter_records(raw, noted)) == [(7, b"a"), (8, b""), (9, b""), (10, b""), (11, b"b")]
    assert noted == skipped


# snappy's framing format, the LZ4 frame format and zstd frames: what the Java client writes
COMPRESS = {ck.SNAPPY: cramjam.snappy.compress, ck.LZ4: cramjam.lz4.compress, ck.ZSTD: cramjam.zstd.compress}
FRAMED_CODECS = pytest.mark.parametrize("codec", [ck.SNAPPY, ck.LZ4, ck.ZSTD], ids=["snappy", "lz4", "zstd"])


def packed(codec: int, plain: bytes) -> bytes:
    return bytes(COMPRESS[codec](plain))


def framed_batch(codec: int, records: list[bytes]) -> ck.SubBatch:
    plain = framed(records)
    return ck.SubBatch(len(records), codec, len(plain), packed(codec, plain))


@settings(deadline=None, max_examples=40)
@given(st.sampled_from([ck.SNAPPY, ck.LZ4, ck.ZSTD]), st.lists(st.binary(max_size=200), min_size=1, max_size=30))
def test_snappy_lz4_and_zstd_sub_batches_give_their_records(codec: int, records: list[bytes]) -> None:
    assert ck.decoded_records(framed_batch(codec, records)) == records
    raw = ck.encode([b"a", framed_batch(codec, records), gz_batch([b"g"]), b"z"], timestamp=0, epoch=1,
                    chunk_id=100)
    want = [b"a", *records, b"g", b"z"]
    assert [r for _, r in ck.iter_records(raw)] == want
    assert ck.record_list(raw) == [(100 + i, r) for i, r in enumerate(want) if r]
    assert all(type(r) is bytes for _, r in ck.record_list(raw))


@FRAMED_CODECS
def test_a_framed_bomb_is_never_decoded_past_its_declared_length(codec: int) -> None:
    bomb = packed(codec, b"\0" * (32 * 1024 * 1024))  # a small frame that expands to 32 MiB
    assert len(bomb) < 2 * 1024 * 1024
    with pytest.raises(ck.BadSubBatch, match="declared 16 bytes"):
        ck.decompress_framed(codec, bomb, 16, budget=ck.MAX_UNCOMPRESSED_BYTES)
    records = [b"\0" * 32 * 1024 * 1024]
    with pytest.raises(ck.BadSubBatch, match="declared 16 bytes"):
        ck.decoded_records(ck.SubBatch(1, codec, 16, packed(codec, framed(records))))


@FRAMED_CODECS
def test_a_framed_declared_size_over_the_budget_is_refused_before_decoding(codec: int) -> None:
    batch = framed_batch(codec, [b"x" * 100])
    with pytest.raises(ck.BadSubBatch, match="over the limit of 50"):
        ck.decoded_records(batch, budget=50)


@FRAMED_CODECS
def test_one_byte_past_the_declared_length_is_refused(codec: int) -> None:
    plain = framed([b"abc"])
    with pytest.raises(ck.BadSubBatch, match="past its declared 6"):
        ck.decompress_framed(codec, packed(codec, plain), len(plain) - 1, budget=100)


@FRAMED_CODECS
@pytest.mark.parametrize(("make", "declared", "count", "why"), [
    (lambda c: b"not compressed at all", 8, 1, "does not decode"),
    (lambda c: packed(c, framed([b"abc" * 50]))[:-5], 154, 1, "does not decode"),
    (lambda c: packed(c, framed([b"abc"])) + b"trailing", 7, 1, "does not decode"),
    (lambda c: packed(c, framed([b"abc"])), 9, 1, "decodes to 7 bytes, not the declared 9"),
    (lambda c: packed(c, framed([b"abc"])), 7, 2, "fewer than its 2 records"),
    (lambda c: packed(c, framed([b"abc"]) + b"zz"), 9, 1, "2 bytes follow"),
    (lambda c: packed(c, b"\0\0\0\x09abc"), 7, 1, "runs past"),
], ids=["not-compressed", "cut-short", "trailing-bytes", "decodes-short", "too-few-records", "bytes-after",
        "record-past-end"])
def test_a_framed_sub_batch_that_is_not_what_it_declares_is_refused(codec: int, make: Callable[[int], bytes],
                                                                    declared: int, count: int, why: str) -> None:
    with pytest.raises(ck.BadSubBatch, match=why):
        ck.decoded_records(ck.SubBatch(count, codec, declared, make(codec)))


@FRAMED_CODECS
def test_a_bad_framed_sub_batch_is_skipped_and_what_follows_it_is_read(codec: int) -> None:
    bomb = ck.SubBatch(2, codec, 16, packed(codec, b"\0" * (1024 * 1024)))
    raw = ck.encode([framed_batch(codec, [b"one"]), bomb, framed_batch(codec, [b"two", b"three"])],
                    timestamp=0, epoch=1, chunk_id=0)
    skipped: list[tuple[int, int, str]] = []
    assert ck.record_list(raw, 0, skipped) == [(0, b"one"), (3, b"two"), (4, b"three")]
    assert [(o, n) for o, n, _ in skipped] == [(1, 2)]
    assert ck.record_list(raw, 4) == [(4, b"three")]


def test_the_budget_is_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    big = framed([b"y" * 1000])
    batch = ck.SubBatch(1, ck.GZIP, len(big), gzip.compress(big))
    raw = ck.encode([batch] * 3, timestamp=0, epoch=1, chunk_id=0)
    monkeypatch.setattr(ck, "MAX_UNCOMPRESSED_BYTES", 2 * len(big))
    skipped: list[tuple[int, int, str]] = []
    assert [o for o, _ in ck.record_list(raw, 0, skipped)] == [0, 1]
    assert [(o, n) for o, n, _ in skipped] == [(2, 1)]
