"""Pure parts of the stream sink: the murmur3 routing of a super stream write, the deduplication keys,
and the options of a write to a stream (no Spark session, no broker)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.spark.options import STREAM_PORT, STREAM_TLS_PORT, HutchOptionError, write_options
from hutch.spark.routing import SEED, murmur3_32, partition_of
from hutch.spark.stream_sink import MAX_ROWS_PER_TASK, publisher_reference, publishing_id

URI = "amqp://guest:guest@127.0.0.1:5673/%2F"


@pytest.mark.parametrize(("data", "seed", "expected"), [
    # MurmurHash3_x86_32's published test vectors (SMHasher's), every tail length
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\0\0\0\0", 0, 0x2362F9DE),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"aa", 0x9747B28C, 0x5D211726),
    (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"abcd", 0x9747B28C, 0xF0478627),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
])
def test_murmur3_matches_the_reference_vectors(data: bytes, seed: int, expected: int) -> None:
    assert murmur3_32(data, seed) == expected


@given(st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_murmur3_matches_mmh3(data: bytes, seed: int) -> None:
    import mmh3  # the C implementation (a dependency of rstream, in the test extra) as an oracle

    assert murmur3_32(data, seed) == mmh3.hash(data, seed, signed=False)


@given(st.text(max_size=40), st.integers(1, 128))
def test_partition_of_is_the_unsigned_hash_with_the_clients_seed_mod_n(key: str, n: int) -> None:
    index = partition_of(key, n)
    assert 0 <= index < n
    assert index == murmur3_32(key.encode(), SEED) % n


@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, MAX_ROWS_PER_TASK - 1)), min_size=2))
def test_publishing_ids_grow_with_batch_then_row(keys: list[tuple[int, int]]) -> None:
    # the broker deduplicates by "id at or below the last stored": ids must order as (batch, row) do
    ordered = sorted(set(keys))
    ids = [publishing_id(b, r) for b, r in ordered]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and min(ids) >= 1 and max(ids) < 2**64


def test_publisher_reference_fits_the_protocol() -> None:
    assert len(publisher_reference("x" * 200, 9999)) <= 256


def test_stream_write_options() -> None:
    o = write_options({"uri": URI, "stream": "s"})
    assert (o.to_stream, o.target, o.stream_port) == (True, "s", STREAM_PORT)
    assert o.stream_uri().port == STREAM_PORT and o.stream_uri().host == "127.0.0.1"
    tls = write_options({"uri": "amqps://h/%2F", "superStream": "orders", "streamPort": "6000"})
    assert (tls.super_stream, tls.stream_port, tls.stream_uri().tls) == ("orders", 6000, True)
    assert write_options({"uri": "amqps://h/%2F", "stream": "s"}).stream_port == STREAM_TLS_PORT
    assert not write_options({"uri": URI, "routing_key": "q"}).to_stream


@pytest.mark.parametrize(("options", "fragment"), [
    ({"stream": "a", "superStream": "b"}, "exclude each other"),
    ({"stream": "a", "mandatory": "false"}, "mandatory are for writes to an exchange"),
    ({"superStream": "a", "routing_key": "k"}, "routing_key are for writes to an exchange"),
    ({"routing_key": "q", "streamPort": "5552"}, "'streamPort' is for writes to a 'stream'"),
    ({"stream": ""}, "1 to 255 bytes"),
    ({"stream": "s", "writeId": "w" * 201}, "at most 200 characters"),
    ({"stream": "s", "streamPort": "70000"}, "between 1 and 65535"),
])
def test_stream_write_option_errors(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(HutchOptionError, match=fragment):
        write_options({"uri": URI, **options})
