"""The stream-protocol codec (hutch.streamproto): every record round-trips, frames are read whole, one
byte at a time and with a trailing partial frame, bad input gets the protocol's typed errors, and the
bytes agree with rstream's own encoder (an independent implementation) in both directions."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rstream import encoding as rs_encoding
from rstream import schema as rs

from hutch.queues.stream import chunk as ck
from hutch.streamproto import commands as c
from hutch.streamproto.codes import RESPONSE_BIT, SERVER_VERSIONS, Code, Key, OffsetType
from hutch.streamproto.errors import FrameTooLarge, UnknownFrame
from hutch.streamproto.framer import FrameReader
from hutch.streamproto.wire import OffsetSpec

from .support import ci_settings

SAMPLES: list[c.Command] = [
    c.PeerProperties(1, {"product": "x", "version": "1"}),
    c.PeerPropertiesResponse(1, Code.OK, {"product": "hutch"}),
    c.SaslHandshake(2),
    c.SaslHandshakeResponse(2, Code.OK, ["PLAIN", "AMQPLAIN"]),
    c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"),
    c.SaslAuthenticateResponse(3, Code.OK),
    c.SaslAuthenticateResponse(3, Code.SASL_CHALLENGE, b"more"),
    c.Tune(1_048_576, 60),
    c.TuneResponse(1_048_576, 30),
    c.Open(4, "/"),
    c.OpenResponse(4, Code.OK, {"advertised_host": "h", "advertised_port": "5552"}),
    c.OpenResponse(4, Code.VIRTUAL_HOST_ACCESS_FAILURE),
    c.Close(5, 1, "OK"),
    c.Heartbeat(),
    c.ExchangeCommandVersions(6, [(Key.PUBLISH, 1, 2), (Key.DELIVER, 1, 2)]),
    c.ExchangeCommandVersionsResponse(6, Code.OK, [(Key.PUBLISH, 1, 2)]),
    c.DeclarePublisher(7, 3, "ref", "s1"),
    c.DeletePublisher(8, 3),
    c.QueryPublisherSequence(9, "ref", "s1"),
    c.QueryPublisherSequenceResponse(9, Code.OK, 2**64 - 1),
    c.Publish(3, [c.PublishedEntry(0, b""), c.PublishedEntry(2**64 - 1, b"\x00Sw\xa1\x03abc")]),
    c.Publish(3, [c.PublishedEntry(1, b"m", "eu"), c.PublishedEntry(2, b"n", None)], version=2),
    c.Publish(3, [c.SubBatchEntry(10, 0, 2, 12, b"\x00\x00\x00\x02ab\x00\x00\x00\x02cd")]),
    c.PublishConfirm(3, [1, 2, 3]),
    c.PublishError(3, [(1, Code.PUBLISHER_DOES_NOT_EXIST), (2, Code.STREAM_DOES_NOT_EXIST)]),
    c.Subscribe(10, 1, "s1", OffsetSpec(OffsetType.FIRST), 10),
    c.Subscribe(10, 1, "s1", OffsetSpec(OffsetType.OFFSET, 42), 10, {"single-active-consumer": "true", "name": "g"}),
    c.Subscribe(10, 1, "s1", OffsetSpec(OffsetType.TIMESTAMP, -5), 10),
    c.Unsubscribe(11, 1),
    c.Credit(1, 5),
    c.CreditResponse(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST, 9),
    c.Deliver(1, b"chunk-bytes"),
    c.Deliver(1, b"chunk-bytes", committed_offset=99),
    c.StoreOffset("consumer", "s1", 77),
    c.QueryOffset(12, "consumer", "s1"),
    c.QueryOffsetResponse(12, Code.NO_OFFSET, 0),
    c.ConsumerUpdate(13, 1, True),
    c.ConsumerUpdateResponse(13, Code.OK, OffsetSpec(OffsetType.NONE)),
    c.ConsumerUpdateResponse(13, Code.OK, OffsetSpec(OffsetType.NEXT)),
    c.ResolveOffsetSpec(14, "s1", OffsetSpec(OffsetType.LAST), {"filter.0": "eu"}),
    c.ResolveOffsetSpecResponse(14, Code.OK, OffsetType.OFFSET, 12),
    c.Create(15, "s1", {"max-age": "1h"}),
    c.Delete(16, "s1"),
    c.Metadata(17, ["s1", "s2"]),
    c.MetadataResponse(17, [(0, "localhost", 5552)], [("s1", Code.OK, 0, []), ("s2", Code.STREAM_DOES_NOT_EXIST,
                                                                                 0xFFFF, [])]),
    c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, "s1"),
    c.StreamStats(18, "s1"),
    c.StreamStatsResponse(18, Code.OK, {"first_chunk_id": 0, "committed_chunk_id": -1}),
    c.Route(19, "key", "super"),
    c.RouteResponse(19, Code.OK, ["super-0"]),
    c.Partitions(20, "super"),
    c.PartitionsResponse(20, Code.OK, ["super-0", "super-1"]),
    c.CreateSuperStream(21, "super", ["super-0", "super-1"], ["0", "1"], {}),
    c.DeleteSuperStream(22, "super"),
    *(c.Response(k, 23, Code.OK) for k in (Key.DECLARE_PUBLISHER, Key.DELETE_PUBLISHER, Key.SUBSCRIBE,
                                            Key.UNSUBSCRIBE, Key.CREATE, Key.DELETE, Key.CLOSE,
                                            Key.CREATE_SUPER_STREAM, Key.DELETE_SUPER_STREAM)),
]


def test_every_key_of_the_protocol_has_a_record():
    keys = {c.request_key(cmd) for cmd in SAMPLES}
    assert keys == set(Key)
    assert set(SERVER_VERSIONS) == set(Key)


@pytest.mark.parametrize("cmd", SAMPLES, ids=lambda cmd: type(cmd).__name__)
def test_round_trip(cmd):
    frame = c.encode(cmd)
    assert struct.unpack_from(">I", frame)[0] == len(frame) - 4
    assert c.decode(frame[4:]) == cmd


def _read_all(data: bytes, step: int | None, frame_max: int = 0) -> list[c.Command]:
    reader = FrameReader(frame_max)
    out: list[c.Command] = []
    chunks = [data] if step is None else [data[i:i + step] for i in range(0, len(data), step)]
    for chunk in chunks:
        reader.feed(chunk)
        out.extend(c.decode(f) for f in reader.frames())
    return out


def test_framing_whole_byte_at_a_time_and_with_a_partial_tail():
    stream = b"".join(c.encode(cmd) for cmd in SAMPLES)
    assert _read_all(stream, None) == SAMPLES
    assert _read_all(stream, 1) == SAMPLES
    assert _read_all(stream, 7) == SAMPLES
    reader = FrameReader(0)
    reader.feed(stream + c.encode(c.Heartbeat())[:5])
    assert [c.decode(f) for f in reader.frames()] == SAMPLES
    assert reader.buffered() == 5


def test_frame_views_are_the_frames_without_a_copy_and_a_held_view_survives_the_next_feed():
    stream = b"".join(c.encode(cmd) for cmd in SAMPLES)
    for step in (1, 7, len(stream)):
        reader = FrameReader(0)
        got: list[c.Command] = []
        for i in range(0, len(stream), step):
            reader.feed(stream[i:i + step])
            got.extend(c.decode(bytes(view)) for view in reader.frame_views())
        assert got == SAMPLES
    # a view kept past the next feed keeps its bytes; the reader goes on with a buffer of its own
    reader = FrameReader(0)
    first, second = c.encode(SAMPLES[0]), c.encode(SAMPLES[1])
    reader.feed(first + second[:3])
    views = reader.frame_views()
    held = next(views)
    assert list(views) == []
    reader.feed(second[3:])
    assert c.decode(bytes(held)) == SAMPLES[0]
    assert [c.decode(bytes(v)) for v in reader.frame_views()] == [SAMPLES[1]]
    assert reader.buffered() == 0


def test_a_frame_past_frame_max_is_refused_from_its_size_field():
    reader = FrameReader(100)
    reader.feed(struct.pack(">I", 101))
    with pytest.raises(FrameTooLarge) as err:
        list(reader.frames())
    assert err.value.code == Code.FRAME_TOO_LARGE
    assert reader.buffered() == 4  # the body is never waited for


@pytest.mark.parametrize("cmd", SAMPLES, ids=lambda cmd: type(cmd).__name__)
def test_trailing_garbage_and_truncation_are_unknown_frames(cmd):
    body = c.encode(cmd)[4:]
    if not isinstance(cmd, c.Deliver | c.ConsumerUpdateResponse):  # these run to the end of their frame
        with pytest.raises(UnknownFrame):
            c.decode(body + b"\x00")
    if len(body) > 4 and not isinstance(cmd, c.Deliver | c.Heartbeat):
        with pytest.raises(UnknownFrame):
            for cut in range(4, len(body)):
                try:
                    c.decode(body[:cut])
                except UnknownFrame:
                    continue
                # an optional tail may legitimately be absent: only those cuts may decode
                assert isinstance(cmd, c.OpenResponse | c.Subscribe | c.ResolveOffsetSpec
                                  | c.SaslAuthenticateResponse)
            raise UnknownFrame("every shorter body was refused or was a valid shorter form")


def test_unknown_key_and_version_and_bad_fields():
    with pytest.raises(UnknownFrame, match="0x0063"):
        c.decode(struct.pack(">HH", 0x63, 1))
    with pytest.raises(UnknownFrame):
        c.decode(struct.pack(">HH", Key.OPEN, 3) + b"\0\0\0\1\0\1/")
    with pytest.raises(UnknownFrame, match="UTF-8"):
        c.decode(struct.pack(">HHIH", Key.OPEN, 1, 1, 2) + b"\xff\xfe")
    with pytest.raises(UnknownFrame, match="announces 2"):
        c.decode(c.encode(c.Publish(1, [c.PublishedEntry(1, b"x")]))[4:].replace(b"\0\0\0\1", b"\0\0\0\2", 1))
    with pytest.raises(UnknownFrame, match="offset type"):
        c.decode(struct.pack(">HHIBH", Key.SUBSCRIBE, 1, 1, 1, 1) + b"s" + struct.pack(">HH", 9, 10))
    with pytest.raises(UnknownFrame):  # a huge array count with no data behind it costs nothing
        c.decode(struct.pack(">HHIi", Key.METADATA, 1, 1, 2**31 - 1))


entries_v2 = st.lists(st.builds(c.PublishedEntry, st.integers(0, 2**64 - 1), st.binary(max_size=64),
                                st.none() | st.text(max_size=10)), max_size=20)


@ci_settings(100)
@given(publisher=st.integers(0, 255), entries=entries_v2, version=st.sampled_from([1, 2]))
def test_publish_round_trips(publisher, entries, version):
    if version == 1:
        entries = [c.PublishedEntry(e.publishing_id, e.message) for e in entries]
    cmd = c.Publish(publisher, entries, version)
    assert c.decode(c.encode(cmd)[4:]) == cmd


def scan_oracle(frame: bytes) -> c.SimplePublish | None:
    """What `scan_simple_publish` must answer: `decode`'s reading, for a version 1 publish of simple
    entries, with the entries framed as a chunk's data section; None for anything else."""
    try:
        cmd = c.decode(frame)
    except UnknownFrame:
        return None
    if not isinstance(cmd, c.Publish) or cmd.version != 1 or not cmd.entries \
            or not all(isinstance(e, c.PublishedEntry) for e in cmd.entries):
        return None
    messages = [e.message for e in cmd.entries]  # type: ignore[union-attr]
    return c.SimplePublish(cmd.publisher_id, [e.publishing_id for e in cmd.entries], ck.encode_entries(messages)[0])


frame_edits = st.sampled_from(["none", "cut", "extra", "count+1", "count-1", "sub-batch"])


@ci_settings(300)
@given(publisher=st.integers(0, 255), ids=st.lists(st.integers(0, 2**64 - 1), max_size=30),
       one_size=st.booleans(), sizes=st.lists(st.integers(0, 40) | st.integers(120, 300), min_size=30, max_size=30),
       edit=frame_edits, where=st.integers(0, 10**6))
def test_scanning_a_publish_agrees_with_decoding_it(publisher, ids, one_size, sizes, edit, where):
    """The publish hot path (`scan_simple_publish`, both its uniform and per-entry readings) takes
    exactly the frames `decode` reads as a version 1 publish of simple entries, with the same ids and
    messages, and declines everything else, whole, cut, with bytes added or a lying count."""
    entries = [c.PublishedEntry(pid, b"m" * (sizes[0] if one_size else sizes[i])) for i, pid in enumerate(ids)]
    frame = bytearray(c.encode(c.Publish(publisher, entries))[4:])
    if edit == "cut" and len(frame) > 9:
        del frame[9 + where % (len(frame) - 9):]
    elif edit == "extra":
        frame += b"\0" * (1 + where % 40)
    elif edit in ("count+1", "count-1"):
        struct.pack_into(">I", frame, 5, max(len(ids) + (1 if edit == "count+1" else -1), 0))
    elif edit == "sub-batch" and ids:
        frame[9 + 8] |= 0x80
    assert c.scan_simple_publish(bytes(frame)) == scan_oracle(bytes(frame))
    assert c.scan_simple_publish(memoryview(frame)) == scan_oracle(bytes(frame))  # a view of the input buffer


@pytest.mark.parametrize("sizes", [[200, 150, 250], [20, 10, 30], [300, 300, 299, 301], [1000] * 100])
def test_scanning_entries_of_one_frame_length_but_different_sizes(sizes):
    """A frame whose length is `count` times one stride, its first entry of that size, and the others
    not (the uniform readings must check every size, not only the frame's arithmetic)."""
    frame = c.encode(c.Publish(7, [c.PublishedEntry(i, bytes([i % 251]) * n) for i, n in enumerate(sizes)]))[4:]
    expected = scan_oracle(frame)
    assert expected is not None
    assert c.scan_simple_publish(frame) == expected
    assert c.scan_simple_publish(memoryview(frame)) == expected


def test_scanning_declines_other_commands_and_a_version_2_publish():
    v2 = c.encode(c.Publish(1, [c.PublishedEntry(1, b"x", "eu")], 2))[4:]
    assert c.scan_simple_publish(v2) is None
    assert c.scan_simple_publish(c.encode(c.Credit(1, 1))[4:]) is None
    assert c.scan_simple_publish(c.encode(c.Publish(1, [c.SubBatchEntry(1, 0, 2, 9, b"\0\0\0\1a\0\0\0\0")]))[4:]) is None


@ci_settings(100)
@given(props=st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=10),
       corr=st.integers(0, 2**32 - 1))
def test_string_maps_round_trip(props, corr):
    cmd = c.PeerProperties(corr, props)
    assert c.decode(c.encode(cmd)[4:]) == cmd


def test_a_consumer_update_response_may_carry_an_unused_offset_value():
    # rstream answers `next` with 8 bytes of offset after it; RabbitMQ ignores them
    body = struct.pack(">HHIHHQ", Key.CONSUMER_UPDATE | RESPONSE_BIT, 1, 5, Code.OK, OffsetType.NEXT, 0)
    assert c.decode(body) == c.ConsumerUpdateResponse(5, Code.OK, OffsetSpec(OffsetType.NEXT))


def test_deliver_header_plus_chunk_is_the_frame():
    chunk = bytes(range(50))
    assert c.deliver_header(4, len(chunk), None) + chunk == c.encode(c.Deliver(4, chunk))
    assert c.deliver_header(4, len(chunk), 17) + chunk == c.encode(c.Deliver(4, chunk, 17))


# -- rstream's encoder and decoder as an oracle ------------------------------------------------------

def _props(d):
    return [rs.Property(k, v) for k, v in d.items()]


ORACLE = [
    (rs.PeerProperties(1, _props({"a": "b"})), c.PeerProperties(1, {"a": "b"})),
    (rs.SaslHandshake(2), c.SaslHandshake(2)),
    (rs.SaslAuthenticate(3, "PLAIN", b"\0u\0p"), c.SaslAuthenticate(3, "PLAIN", b"\0u\0p")),
    (rs.Tune(131072, 60), c.TuneResponse(131072, 60)),
    (rs.Open(4, "/"), c.Open(4, "/")),
    (rs.Create(5, "s", _props({"max-age": "1h"})), c.Create(5, "s", {"max-age": "1h"})),
    (rs.DeclarePublisher(6, 1, "ref", "s"), c.DeclarePublisher(6, 1, "ref", "s")),
    (rs.QueryPublisherSequence(7, "ref", "s"), c.QueryPublisherSequence(7, "ref", "s")),
    (rs.Metadata(8, ["a", "b"]), c.Metadata(8, ["a", "b"])),
    (rs.StoreOffset("r", "s", 9), c.StoreOffset("r", "s", 9)),
    (rs.QueryOffset(9, "r", "s"), c.QueryOffset(9, "r", "s")),
    (rs.Credit(1, 10), c.Credit(1, 10)),
    (rs.Unsubscribe(10, 1), c.Unsubscribe(10, 1)),
    (rs.SuperStreamRoute(11, "k", "ss"), c.Route(11, "k", "ss")),
    (rs.SuperStreamPartitions(12, "ss"), c.Partitions(12, "ss")),
    (rs.Close(13, 1, "bye"), c.Close(13, 1, "bye")),
    (rs.Heartbeat(), c.Heartbeat()),
]


@pytest.mark.parametrize(("theirs", "ours"), ORACLE, ids=lambda x: type(x).__name__)
def test_rstream_requests_decode_to_our_records(theirs, ours):
    frame = rs_encoding.encode_frame(theirs)
    decoded = c.decode(frame[4:])
    if isinstance(ours, c.TuneResponse):  # rstream encodes tune (both ways) as a request frame
        ours = c.Tune(ours.frame_max, ours.heartbeat_s)
    assert decoded == ours


def test_rstream_publish_and_subscribe_decode_to_our_records():
    frame = rs_encoding.encode_publish(rs.Publish(2, [rs.Message(5, None, b"body")]))
    assert c.decode(frame[4:]) == c.Publish(2, [c.PublishedEntry(5, b"body")])
    frame = rs_encoding.encode_publish(rs.Publish(2, [rs.Message(5, "eu", b"body")]), version_to_encode=2)
    assert c.decode(frame[4:]) == c.Publish(2, [c.PublishedEntry(5, b"body", "eu")], 2)
    sub = rs.Subscribe(3, 1, "s", rs.OffsetSpecOffset(OffsetType.OFFSET, 7), 10, _props({"name": "n"}))
    assert c.decode(rs_encoding.encode_frame(sub)[4:]) == c.Subscribe(3, 1, "s", OffsetSpec(OffsetType.OFFSET, 7), 10,
                                                                       {"name": "n"})


RESPONSES = [
    c.PeerPropertiesResponse(1, Code.OK, {"product": "hutch"}),
    c.SaslHandshakeResponse(2, Code.OK, ["PLAIN"]),
    c.OpenResponse(4, Code.OK, {"advertised_host": "h", "advertised_port": "1"}),
    c.QueryPublisherSequenceResponse(5, Code.OK, 41),
    c.QueryOffsetResponse(6, Code.OK, 9),
    c.MetadataResponse(7, [(0, "h", 5552)], [("s", Code.OK, 0, [])]),
    c.PublishConfirm(1, [1, 2]),
    c.PublishError(1, [(3, Code.PUBLISHER_DOES_NOT_EXIST)]),
    c.RouteResponse(8, Code.OK, ["p-0"]),
    c.PartitionsResponse(9, Code.OK, ["p-0", "p-1"]),
    c.ConsumerUpdate(10, 1, True),
    c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, "s"),
    c.Response(Key.CREATE, 11, Code.STREAM_ALREADY_EXISTS),
]


@pytest.mark.parametrize("ours", RESPONSES, ids=lambda x: type(x).__name__)
def test_our_server_frames_decode_in_rstream(ours):
    frame = c.encode(ours)
    theirs = rs_encoding.decode_frame(frame[4:])
    key = frame[4] << 8 | frame[5]
    assert theirs.key.value == key & ~RESPONSE_BIT
    for name in ("correlation_id", "publisher_id", "publishing_ids", "streams", "mechanisms", "sequence",
                 "offset", "active", "subscription_id"):
        if hasattr(ours, name) and hasattr(theirs, name):
            assert getattr(theirs, name) == getattr(ours, name), name
    if hasattr(ours, "code") and hasattr(theirs, "response_code"):
        assert theirs.response_code == ours.code
