"""The pure stream log parts: chunk encoding, tracking blocks, the retention rule, offset specs."""

from __future__ import annotations

import datetime
import gzip
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.table import Timestamp
from hutch.queues.stream import chunk as ck
from hutch.queues.stream import tracking as trk
from hutch.queues.stream.offset_spec import OffsetSpec, SpecKind, interval_ms, parse_amqp
from hutch.queues.stream.retention import Retention, segments_to_drop

entries = st.lists(st.binary(max_size=64), min_size=1, max_size=20)


@settings(deadline=None)
@given(entries, st.integers(0, 2**40), st.integers(-2**40, 2**40), st.integers(0, 2**20), st.binary(max_size=40))
def test_chunk_round_trip(items: list[bytes], chunk_id: int, ts: int, epoch: int, trailer: bytes) -> None:
    raw = ck.encode(items, timestamp=ts, epoch=epoch, chunk_id=chunk_id, trailer=trailer)
    assert ck.verify(raw)
    h, bloom, data, tail = ck.parts(raw)
    assert (h.chunk_id, h.timestamp, h.epoch, h.num_entries, h.num_records) == (chunk_id, ts, epoch, len(items),
                                                                                 len(items))
    assert h.size == len(raw) and bytes(tail) == trailer and not bloom
    assert list(ck.iter_records(raw)) == [(chunk_id + i, e) for i, e in enumerate(items)]
    assert ck.FORMAT.info(raw[:ck.HEADER_SIZE]).size == len(raw)


@settings(deadline=None)
@given(entries, st.data())
def test_any_flipped_data_bit_or_cut_fails_verify(items: list[bytes], data: st.DataObject) -> None:
    raw = bytearray(ck.encode(items, timestamp=1, epoch=0, chunk_id=0))
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert not ck.verify(bytes(raw[:cut]))
    bit = data.draw(st.integers(ck.HEADER_SIZE * 8, len(raw) * 8 - 1))
    raw[bit // 8] ^= 0x80 >> (bit % 8)
    assert not ck.verify(bytes(raw))


@settings(deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=6))
def test_the_chunk_crc_is_zlibs_crc32_whatever_computes_it(parts: list[bytes]) -> None:
    """`ck.crc32` (ISA-L's when installed) is CRC-32 as zlib and osiris compute it, in one call or
    continued part by part, over bytes or views; and the installed one is the fast one."""
    whole = b"".join(parts)
    running = 0
    for part in parts:
        running = ck.crc32(memoryview(part), running)
    assert running == ck.crc32(whole, 0) == zlib.crc32(whole)
    data = parts if whole else [b"\0\0\0\0"]
    raw = ck.encode_data(data, entries=1, records=1, timestamp=1, epoch=0, chunk_id=0)
    assert ck.decode_header(raw).crc == zlib.crc32(b"".join(data))


def test_the_fast_crc_is_installed() -> None:
    assert ck.crc32 is not zlib.crc32  # pyproject.toml requires isal: the stream hot path's CRC


def test_header_layout_is_osiris() -> None:
    raw = ck.encode([b"abc"], timestamp=7, epoch=2, chunk_id=5)
    assert raw[0] == 0x50 and raw[1] == ck.USER
    assert int.from_bytes(raw[2:4], "big") == 1 and int.from_bytes(raw[4:8], "big") == 1
    assert int.from_bytes(raw[24:32], "big") == 5
    assert raw[48:] == b"\x00\x00\x00\x03abc"
    with pytest.raises(ValueError):
        ck.decode_header(b"\x51" + raw[1:])
    with pytest.raises(ValueError):
        ck.encode([], timestamp=0, epoch=0, chunk_id=0)


def test_sub_batch_records_count_as_offsets() -> None:
    body = b"".join(len(r).to_bytes(4, "big") + r for r in (b"x", b"yy", b"zzz"))
    raw = ck.encode([b"a", ck.SubBatch(3, 0, len(body), body), b"b"], timestamp=0, epoch=0, chunk_id=10)
    h = ck.decode_header(raw)
    assert (h.num_entries, h.num_records, h.next_offset) == (3, 5, 15)
    assert list(ck.iter_records(raw)) == [(10, b"a"), (11, b"x"), (12, b"yy"), (13, b"zzz"), (14, b"b")]


@settings(deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=10), min_size=1, max_size=10), st.booleans())
def test_bloom_has_no_false_negatives(values: list[bytes], unfiltered: bool) -> None:
    bits = ck.bloom([*values, None] if unfiltered else values)
    for v in values:
        assert ck.bloom_may_match(bits, [v], False)
    # bit 0 says "an entry without a value": match-unfiltered readers want the chunk exactly then
    assert ck.bloom_may_match(bits, [], True) == unfiltered
    # ... and its absence that every entry had one (what a reader knows of a stream-protocol entry)
    assert ck.bloom_all_valued(bits) == (not unfiltered)


def test_bloom_without_values_matches_only_unfiltered() -> None:
    assert ck.bloom([None, b""]) == b""
    assert ck.bloom_may_match(b"", [b"eu"], True)
    assert not ck.bloom_may_match(b"", [b"eu"], False)
    assert not ck.bloom_all_valued(b"")


@settings(deadline=None)
@given(st.lists(st.binary(max_size=6), max_size=12), st.booleans(),
       st.lists(st.binary(min_size=1, max_size=4, ), min_size=1, max_size=8) | st.just([]),
       st.sampled_from([1, 2, 16, 255]), st.booleans())
def test_bloom_query_answers_as_bloom_may_match(values: list[bytes], unfiltered: bool, wanted: list[bytes],
                                               size: int, none_in_chunk: bool) -> None:
    """`BloomQuery` (hashed once per filter size, one AND per value) answers what the reference function
    answers, for every filter size a stream may use, and again from its memo."""
    bits = ck.bloom([*values, None] if none_in_chunk else values, size)
    query = ck.BloomQuery(wanted, unfiltered)
    for _ in range(2):
        assert query.may_match(bits) == ck.bloom_may_match(bits, wanted, unfiltered)
    assert query.cost == 1 + min(len(set(v for v in wanted if v)), 2048)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.binary(max_size=6), max_size=12), st.booleans(), st.integers(0, 2**32),
       st.integers(ck.BloomQuery.TABLE_MIN, 3 * ck.BloomQuery.PREPARE_STEP), st.sampled_from([1, 2, 16, 255]),
       st.booleans())
def test_a_bloom_query_of_many_values_answers_as_bloom_may_match(values: list[bytes], unfiltered: bool, seed: int,
                                                                count: int, size: int, prepared: bool) -> None:
    """Past `TABLE_MIN` values (a table from first bits to second bits, walked over the chunk's set bits),
    prepared ahead in steps or hashed at the first check: the same answers."""
    wanted = [b"%d-%d" % (seed, i) for i in range(count)]
    bits = ck.bloom(values, size)
    query = ck.BloomQuery(wanted, unfiltered)
    if prepared:
        steps = sum(1 for _ in query.prepare(size * 8))
        assert steps == (count - 1) // ck.BloomQuery.PREPARE_STEP
    assert query.may_match(bits) == ck.bloom_may_match(bits, wanted, unfiltered)
    assert query.may_match(bits[:0]) == unfiltered
    assert query.cost == 1 + min(count, 2048)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.binary(max_size=3), max_size=3 * ck.BloomQuery.PREPARE_STEP), st.booleans(),
       st.lists(st.binary(max_size=6), max_size=12), st.sampled_from([1, 16, 255]))
def test_a_bloom_query_built_in_steps_is_the_one_made_at_once(values: list[bytes], unfiltered: bool,
                                                              chunk_values: list[bytes], size: int) -> None:
    """`BloomQuery.build` (a remote reader's filter at the stream's home, a subscribe's: in steps of
    `PREPARE_STEP` values) makes the query the constructor makes: the same values, cost and answers."""
    steps = ck.BloomQuery.build(values, unfiltered)
    yields = 0
    try:
        while True:
            next(steps)
            yields += 1
    except StopIteration as done:
        built = done.value
    once = ck.BloomQuery(values, unfiltered)
    assert yields == max(0, (len(values) - 1) // ck.BloomQuery.PREPARE_STEP)
    assert (built.values, built.cost, built.match_unfiltered) == (once.values, once.cost, once.match_unfiltered)
    bits = ck.bloom(chunk_values, size)
    assert built.may_match(bits) == once.may_match(bits) == ck.bloom_may_match(bits, values, unfiltered)


def test_bloom_query_forgets_filter_sizes_past_its_memo() -> None:
    query = ck.BloomQuery([b"eu", b"us"], False)
    for size in range(1, 3 * ck.BloomQuery.MAX_SIZES):
        assert query.may_match(ck.bloom([b"us"], size))
    assert len(query._masks) <= ck.BloomQuery.MAX_SIZES


def test_tracking_keeps_at_most_max_offsets_references_in_memory() -> None:
    """A client storing offsets under ever new references: the oldest stored is dropped, one stored
    again becomes the newest."""
    t = trk.Tracking()
    t.apply(trk.offset_block(b"first", 1))
    for i in range(trk.MAX_OFFSETS - 1):
        t.apply(trk.offset_block(b"r%d" % i, i))
    t.apply(trk.offset_block(b"first", 2))  # stored again: now the newest
    t.apply(trk.offset_block(b"new", 3))
    assert len(t.offsets) == trk.MAX_OFFSETS
    assert t.offsets[b"first"] == 2 and b"r0" not in t.offsets and t.offsets[b"new"] == 3


refs = st.binary(min_size=1, max_size=12)


@settings(deadline=None)
@given(st.lists(st.tuples(st.booleans(), refs, st.integers(0, 2**63)), max_size=30))
def test_tracking_snapshot_replays_to_the_same_state(ops: list[tuple[bool, bytes, int]]) -> None:
    t = trk.Tracking()
    for i, (is_seq, ref, value) in enumerate(ops):
        t.apply(trk.sequence_block(ref, i, value) if is_seq else trk.offset_block(ref, value))
    again = trk.Tracking()
    again.apply(t.snapshot())
    assert again == t


def test_tracking_sequences_never_go_back_and_bad_blocks_are_refused() -> None:
    t = trk.Tracking()
    t.apply(trk.sequence_block(b"p", 0, 10) + trk.sequence_block(b"p", 5, 3))
    assert t.sequence(b"p") == 10
    with pytest.raises(ValueError):
        t.apply(b"\x07\x01p")
    with pytest.raises(ValueError):
        trk.offset_block(b"", 1)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 10_000)), max_size=12),
       st.one_of(st.none(), st.integers(0, 5000)), st.one_of(st.none(), st.integers(0, 10_000)))
def test_retention_keeps_the_last_segment_and_drops_only_a_prefix(segs: list[tuple[int, int]], max_bytes: int | None,
                                                                  max_age: int | None) -> None:
    segs = [(size, ts) for size, ts in segs]
    segs_sorted = sorted(segs, key=lambda s: s[1])
    drop = segments_to_drop(segs_sorted, Retention(max_bytes, max_age), 10_000)
    assert 0 <= drop <= max(0, len(segs) - 1)
    rest = segs_sorted[drop:]
    if max_bytes is not None and drop and max_age is None:
        # the last dropped segment was needed to get under the limit
        assert sum(s for s, _ in segs_sorted[drop - 1:]) > max_bytes
    if max_age is not None and len(rest) > 1:
        assert rest[0][1] >= 10_000 - max_age or (max_bytes is not None)


def test_retention_examples() -> None:
    segs = [(100, 1), (100, 2), (100, 3)]
    assert segments_to_drop(segs, Retention(), 10) == 0
    assert segments_to_drop(segs, Retention(max_bytes=250), 10) == 1
    assert segments_to_drop(segs, Retention(max_bytes=0), 10) == 2
    assert segments_to_drop(segs, Retention(max_age_ms=8), 10) == 1
    assert segments_to_drop(segs, Retention(max_age_ms=0), 10) == 2


def test_offset_specs_from_amqp_arguments() -> None:
    now = 1_000_000_000
    assert parse_amqp("first", now) == OffsetSpec.first()
    assert parse_amqp(b"last", now).kind is SpecKind.LAST
    assert parse_amqp("next", now).kind is SpecKind.NEXT
    assert parse_amqp(42, now) == OffsetSpec.offset(42)
    assert parse_amqp("30m", now) == OffsetSpec.timestamp(now - 30 * 60_000)
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    assert parse_amqp(when, now) == OffsetSpec.timestamp(1704067200000)
    assert parse_amqp(Timestamp(1_700_000_000), now) == OffsetSpec.timestamp(1_700_000_000_000)
    assert interval_ms("7D") == 7 * 86_400_000 and interval_ms("12x") is None
    for bad in (-1, "sometime", True, 1.5, "30"):
        with pytest.raises(ValueError):
            parse_amqp(bad, now)


def _gzip_batch(records: list[bytes]) -> ck.SubBatch:
    plain = b"".join(len(r).to_bytes(4, "big") + r for r in records)
    return ck.SubBatch(len(records), ck.GZIP, len(plain), gzip.compress(plain))


def _framed_batch(codec: int, records: list[bytes]) -> ck.SubBatch:
    plain = b"".join(len(r).to_bytes(4, "big") + r for r in records)
    compress = {ck.SNAPPY: cramjam.snappy.compress, ck.LZ4: cramjam.lz4.compress, ck.ZSTD: cramjam.zstd.compress}
    return ck.SubBatch(len(records), codec, len(plain), bytes(compress[codec](plain)))


sub_batch_or_entry = st.one_of(
    st.binary(max_size=40),
    st.lists(st.binary(max_size=12), min_size=1, max_size=5).map(
        lambda rs: ck.SubBatch(len(rs), 0, 0, b"".join(len(r).to_bytes(4, "big") + r for r in rs))),
    st.integers(1, 4).map(lambda n: ck.SubBatch(n, 1, 0, b"\x00" * 7)),  # not gzip: skipped
    st.integers(1, 4).map(lambda n: ck.SubBatch(n, 2, 7, b"\x00" * 7)),  # not snappy-framed: skipped
    st.integers(1, 4).map(lambda n: ck.SubBatch(n, 6, 7, b"\x00" * 7)),  # unknown codec: skipped
    st.lists(st.binary(max_size=12), min_size=1, max_size=5).map(_gzip_batch),
    st.tuples(st.sampled_from([ck.SNAPPY, ck.LZ4, ck.ZSTD]),
              st.lists(st.binary(max_size=12), min_size=1, max_size=5)).map(lambda a: _framed_batch(*a)),
)


@settings(deadline=None)
@given(st.lists(sub_batch_or_entry, min_size=1, max_size=12), st.integers(0, 2**40), st.integers(0, 40))
def test_record_list_is_iter_records_without_empty_records_from_start(items: list[ck.Entry], chunk_id: int,
                                                                       skip: int) -> None:
    raw = ck.encode(items, timestamp=0, epoch=0, chunk_id=chunk_id)
    start = chunk_id + skip
    want = [(o, bytes(r)) for o, r in ck.iter_records(raw) if r and o >= start]
    assert [(o, bytes(r)) for o, r in ck.record_list(raw, start)] == want


@settings(deadline=None)
@given(st.lists(sub_batch_or_entry, min_size=1, max_size=12), st.integers(0, 2**40), st.integers(0, 40),
       st.integers(1, 7))
def test_a_record_cursor_gives_record_list_in_slices(items: list[ck.Entry], chunk_id: int, skip: int,
                                                     limit: int) -> None:
    """Slices of at most `limit`, each after looking at a bounded number of records, add up to
    `record_list` (the AMQP 0-9-1 reader's work per loop turn is bounded by them)."""
    raw = ck.encode(items, timestamp=0, epoch=0, chunk_id=chunk_id)
    start = chunk_id + skip
    cursor = ck.RecordCursor(raw, start)
    got: list[tuple[int, bytes]] = []
    for _ in range(10_000):
        if cursor.done:
            break
        piece = cursor.take(limit)
        assert len(piece) <= limit
        got += piece
    assert cursor.done
    assert [(o, bytes(r)) for o, r in got] == [(o, bytes(r)) for o, r in ck.record_list(raw, start)]


def test_a_record_cursor_over_a_sub_batch_bomb_takes_small_slices() -> None:
    """A gzip sub-batch of 65,535 empty records (1.5 KB compressed, 262 KB inflated): each `take` looks
    at a bounded number of records; none is given."""
    plain = b"\0\0\0\0" * 65_535
    raw = ck.encode([ck.SubBatch(65_535, ck.GZIP, len(plain), gzip.compress(plain))] * 3, timestamp=0, epoch=0,
                    chunk_id=0)
    cursor = ck.RecordCursor(raw)
    takes = 0
    while not cursor.done:
        assert cursor.take(256) == []
        takes += 1
    assert takes >= 3 * 65_535 // 256


def test_a_trailer_is_osiris_s_and_the_earlier_one_still_reads() -> None:
    # osiris's trailer: u8 type | u8 size | reference | u64 sequence (the chunk id is the chunk's own);
    # for rstream's "test-reference" that is 24 bytes, as its test_deliver wants
    block = trk.trailer_block(b"test-reference", 7)
    assert len(block) == 24
    assert list(trk.iter_trailer(block, 40)) == [(trk.SEQUENCE, b"test-reference", (40, 7))]
    t = trk.Tracking()
    t.apply_trailer(block, 40)
    assert t.sequences == {b"test-reference": (40, 7)}
    # hutch's earlier trailer carried the chunk id (one sequence block of 16 bytes of data)
    old = trk.sequence_block(b"test-reference", 40, 7)
    assert len(old) == 32 and list(trk.iter_trailer(old, 99)) == [(trk.SEQUENCE, b"test-reference", (40, 7))]
    # several blocks in osiris's form, and broken ones
    many = trk.trailer_block(b"a", 1) + trk.offset_block(b"c", 9) + trk.trailer_block(b"b", 2)
    assert [(k, r, v) for k, r, v in trk.iter_trailer(many, 5)] == [
        (trk.SEQUENCE, b"a", (5, 1)), (trk.OFFSET, b"c", (9,)), (trk.SEQUENCE, b"b", (5, 2))]
    for bad in (b"\x00", block[:-1], b"\x07\x01p" + bytes(8)):
        with pytest.raises(ValueError):
            list(trk.iter_trailer(bad, 0))


@settings(deadline=None)
@given(st.lists(st.tuples(refs, st.integers(0, 2**64 - 1)), min_size=1, max_size=8), st.integers(0, 2**63))
def test_trailers_round_trip_in_either_form(blocks: list[tuple[bytes, int]], chunk_id: int) -> None:
    new = b"".join(trk.trailer_block(ref, seq) for ref, seq in blocks)
    assert [(r, v) for _, r, v in trk.iter_trailer(new, chunk_id)] == [(r, (chunk_id, s)) for r, s in blocks]
    ref, seq = blocks[0]
    old = trk.sequence_block(ref, chunk_id, seq)
    assert [(r, v) for _, r, v in trk.iter_trailer(old, 0)] == [(ref, (chunk_id, seq))]
