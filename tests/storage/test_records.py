"""Record framing: round trips, torn tails at every byte, corruption in the middle, salvage."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.storage import records
from hutch.storage.errors import CorruptRecord

PAYLOADS = [b"first", b"", b"x" * 300, bytes(range(256)), b"last one"]


def frame(payloads: list[bytes], rtype: int = 1) -> bytes:
    return b"".join(records.encode(rtype, p) for p in payloads)


def payloads_of(result: records.ScanResult) -> list[bytes]:
    return [bytes(r.payload) for r in result.records]


def test_layout_is_length_crc_type_then_payload() -> None:
    data = records.encode(7, b"abc")
    assert data == struct.pack("<IIB", 3, zlib.crc32(b"\x07abc"), 7) + b"abc"
    assert records.HEADER_BYTES == 9


def test_round_trip() -> None:
    data = frame(PAYLOADS)
    result = records.scan(data)
    assert payloads_of(result) == PAYLOADS
    assert result.valid_length == len(data) and result.torn_tail is None
    assert [r.type for r in result.records] == [1] * 5
    assert result.records[1].offset == records.HEADER_BYTES + 5


def test_encode_parts_equals_encode_of_the_joined_payload() -> None:
    parts = [b"ab", memoryview(b"cde"), bytearray(b""), b"f"]
    assert b"".join(records.encode_parts(3, parts)) == records.encode(3, b"abcdef")


def test_header_for_then_payload_equals_encode() -> None:
    for seed in (0, 0x1234567):
        payload = b"abc\x00def" * 7
        assert records.header_for(0x31, payload, seed) + payload == records.encode(0x31, payload, seed)
    with pytest.raises(ValueError):
        records.header_for(0, b"x")


def test_type_zero_and_out_of_range_types_are_rejected() -> None:
    for bad in (0, 256, -1):
        with pytest.raises(ValueError):
            records.encode(bad, b"")


def test_empty_input_and_scan_from_an_offset() -> None:
    assert records.scan(b"").records == []
    data = frame(PAYLOADS)
    start = records.scan(data).records[2].offset
    assert payloads_of(records.scan(data, start=start)) == PAYLOADS[2:]


def test_torn_tail_at_every_byte_offset_of_the_last_record() -> None:
    data = frame(PAYLOADS)
    last_start = records.scan(data).records[-1].offset
    for cut in range(last_start, len(data)):
        result = records.scan(data[:cut], file="seg")
        assert payloads_of(result) == PAYLOADS[:-1], cut
        assert result.valid_length == last_start
        if cut == last_start:
            assert result.torn_tail is None  # a clean end at a record boundary
        else:
            assert result.torn_tail is not None
            assert result.torn_tail.offset == last_start
            assert result.torn_tail.dropped_bytes == cut - last_start


def test_bad_checksum_in_the_last_record_is_a_torn_tail() -> None:
    data = bytearray(frame(PAYLOADS))
    data[-1] ^= 0x40
    result = records.scan(bytes(data))
    assert payloads_of(result) == PAYLOADS[:-1]
    assert result.torn_tail is not None and result.torn_tail.reason == "checksum mismatch"


@pytest.mark.parametrize("tail", [bytes(4096), b"\xff" * 100, bytes(range(256)) * 4])
def test_zeros_or_garbage_after_the_last_record_are_a_torn_tail(tail: bytes) -> None:
    data = frame(PAYLOADS)
    result = records.scan(data + tail)
    assert payloads_of(result) == PAYLOADS
    assert result.valid_length == len(data) and result.torn_tail is not None


def test_every_bit_flip_before_the_last_record_raises_corrupt_record() -> None:
    data = frame(PAYLOADS)
    boundaries = [r.offset for r in records.scan(data).records]
    last_start = boundaries[-1]
    for bit in range(last_start * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptRecord) as info:
            records.scan(bytes(damaged), file="seg-1")
        # The damaged record is the one holding the flipped bit.
        holder = max(b for b in boundaries if b <= bit // 8)
        assert info.value.offset == holder and info.value.file == "seg-1"
        assert "seg-1" in str(info.value) and str(holder) in str(info.value)


def test_corrupt_length_claiming_past_the_end_in_the_middle_is_corruption_not_a_torn_tail() -> None:
    data = bytearray(frame(PAYLOADS))
    struct.pack_into("<I", data, 0, 1 << 20)  # first record now "runs past the end"
    with pytest.raises(CorruptRecord) as info:
        records.scan(bytes(data))
    assert info.value.offset == 0 and "past the end" in info.value.reason


def test_max_payload_bound_and_type_filter() -> None:
    data = frame([b"a" * 100, b"b"])
    with pytest.raises(CorruptRecord, match="over the bound"):
        records.scan(data, max_payload_bytes=50)
    with pytest.raises(CorruptRecord, match="unknown record type"):
        records.scan(frame([b"a"], rtype=2) + frame([b"b"], rtype=1), types=frozenset({1}))
    assert payloads_of(records.scan(frame([b"a"], rtype=2), types=frozenset({1, 2}))) == [b"a"]


def test_salvage_recovers_the_records_around_damage() -> None:
    data = bytearray(frame(PAYLOADS))
    offsets = [r.offset for r in records.scan(bytes(data)).records]
    data[offsets[1] + 2] ^= 0xFF  # damage record 1's header (its crc field)
    data[offsets[3] + 20] ^= 0x01  # and record 3's payload
    result = records.salvage(bytes(data), types=frozenset({1}))
    assert [bytes(r.payload) for r in result.records] == [PAYLOADS[0], PAYLOADS[2], PAYLOADS[4]]
    assert [start for start, _ in result.damaged] == [offsets[1], offsets[3]]
    assert result.damaged[0][1] == offsets[2]


def test_salvage_reports_a_damaged_tail() -> None:
    data = frame(PAYLOADS[:2]) + b"\x01" * 30
    result = records.salvage(data)
    assert [bytes(r.payload) for r in result.records] == PAYLOADS[:2]
    assert result.damaged == [(len(data) - 30, len(data))]


def test_find_valid_record_with_and_without_types() -> None:
    junk = b"\x01\x02\x03" * 5
    data = junk + records.encode(2, b"payload")
    assert records.find_valid_record(data, 0) == len(junk)
    assert records.find_valid_record(data, 0, types=frozenset({2})) == len(junk)
    assert records.find_valid_record(data, 0, types=frozenset({1})) is None
    assert records.find_valid_record(data, len(junk) + 1) is None


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 255), st.binary(max_size=64)), max_size=12), st.data())
def test_any_prefix_of_a_framed_stream_reads_back_as_a_prefix_of_its_records(
        items: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = b"".join(records.encode(t, p) for t, p in items)
    cut = data.draw(st.integers(0, len(stream)))
    result = records.scan(stream[:cut])
    got = [(r.type, bytes(r.payload)) for r in result.records]
    assert got == items[: len(got)]
    assert result.valid_length <= cut
    assert (result.torn_tail is None) == (result.valid_length == cut)
