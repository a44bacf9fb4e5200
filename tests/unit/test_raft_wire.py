"""The Raft wire format (cluster/raft_wire.py): round trips through msgpack, coalescing, and garbage.

Round trips are Hypothesis properties over every message shape the core makes (entries, snapshots with
configurations, conf change entries, rejections, campaigns); garbage of any msgpack-able shape must give
`RaftWireError` and nothing else.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster.raft_wire import (
    PeerBatch,
    RaftWireError,
    decode_batch,
    decode_message,
    encode_message,
)
from hutch.raft import (
    CampaignType,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

U64 = st.integers(0, (1 << 64) - 1)
SMALL = st.integers(0, 1000)
IDS = st.integers(1, 1 << 40)


@st.composite
def entries(draw: st.DrawFn) -> tuple[Entry, ...]:
    n = draw(st.integers(0, 6))
    first = draw(st.integers(1, (1 << 64) - 8))
    out = []
    for i in range(n):
        if draw(st.booleans()):
            cc = ConfChange(draw(st.sampled_from(ConfChangeType)), draw(IDS))
            out.append(Entry(draw(U64), first + i, EntryType.CONF_CHANGE, cc.encode()))
        else:
            out.append(Entry(draw(U64), first + i, EntryType.NORMAL, draw(st.binary(max_size=40))))
    return tuple(out)


snapshots = st.builds(
    lambda index, term, voters, data: Snapshot(SnapshotMeta(index, term, ConfState(tuple(sorted(voters)))), data),
    U64, U64, st.sets(IDS, max_size=7), st.binary(max_size=100),
)

messages = st.builds(
    Message,
    type=st.sampled_from(MessageType),
    to=IDS,
    sender=IDS,
    term=U64,
    log_term=U64,
    index=U64,
    entries=entries(),
    commit=U64,
    reject=st.booleans(),
    reject_hint=U64,
    snapshot=st.none() | snapshots,
    campaign=st.none() | st.sampled_from(CampaignType),
)


def wire(v: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(v))


@given(messages)
@settings(max_examples=200)  # `make test`; the 400 of the long run below are in the slow set
def test_message_round_trip(m: Message) -> None:
    assert decode_message(wire(encode_message(m))) == m
    assert decode_message(encode_message(m)) == m  # tuples or lists, before or after msgpack


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 400 examples
@given(messages)
@settings(max_examples=400)
def test_message_round_trip_long(m: Message) -> None:
    test_message_round_trip.hypothesis.inner_test(m)


def test_encoding_is_compact() -> None:
    vote_resp = Message(MessageType.VOTE_RESP, to=2, sender=1, term=5)
    assert encode_message(vote_resp) == [13, 2, 1, 5]
    app = Message(MessageType.APP, 2, 1, 5, 5, 9, (Entry(5, 10, data=b"a"), Entry(5, 11, data=b"b")), 9)
    assert encode_message(app) == [10, 2, 1, 5, 5, 9, 9, 0, 0, 0, [10, 5, 0, b"a", 5, 0, b"b"]]
    assert len(msgpack.packb(encode_message(app))) < 24


def test_entries_must_be_consecutive() -> None:
    m = Message(MessageType.APP, 2, 1, entries=(Entry(1, 1), Entry(1, 3)))
    with pytest.raises(ValueError):
        encode_message(m)


@given(st.lists(st.tuples(st.integers(1, 1 << 32), messages), max_size=12),
       st.lists(st.tuples(st.integers(1, 1 << 32), U64, U64), max_size=5))
@settings(max_examples=100)  # `make test`; the 200 of the long run below are in the slow set
def test_batch_round_trip(items: list[tuple[int, Message]], notices: list[tuple[int, int, int]]) -> None:
    b = PeerBatch()
    want = []
    for gid, m in items:
        m = Message(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "to": 7, "sender": 3})
        b.add(gid, m)
        want.append((gid, m, False))
    for gid, term, commit in notices:
        b.add_quiesce(gid, term, commit)
        want.append((gid, Message(MessageType.HEARTBEAT, 7, 3, term, commit=commit), True))
    assert len(b) == len(want)
    got = decode_batch(wire(b.payload()), sender=3, to=7)
    key = lambda x: (x[0], x[2], repr(x[1]))  # noqa: E731  (sections reorder; within one, order is kept)
    assert sorted(got, key=key) == sorted(want, key=key)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 200 examples
@given(st.lists(st.tuples(st.integers(1, 1 << 32), messages), max_size=12),
       st.lists(st.tuples(st.integers(1, 1 << 32), U64, U64), max_size=5))
@settings(max_examples=200)
def test_batch_round_trip_long(items: list[tuple[int, Message]], notices: list[tuple[int, int, int]]) -> None:
    test_batch_round_trip.hypothesis.inner_test(items, notices)


def test_heartbeats_are_coalesced_as_triples() -> None:
    b = PeerBatch()
    for gid in range(1, 1001):
        b.add(gid, Message(MessageType.HEARTBEAT, to=2, sender=1, term=3, commit=gid))
        b.add(gid, Message(MessageType.HEARTBEAT_RESP, to=2, sender=1, term=3))
    p = b.payload()
    assert p[1][:6] == [1, 3, 1, 2, 3, 2] and p[2][:4] == [1, 3, 2, 3] and p[3] == [] and p[4] == []
    assert len(msgpack.packb(p)) < 11 * 1000  # ~4 bytes per heartbeat, ~3 per answer, at 1,000 groups
    # a heartbeat carrying anything else falls back to the general encoding
    b = PeerBatch()
    b.add(5, Message(MessageType.HEARTBEAT, to=2, sender=1, term=3, index=1))
    assert b.payload()[1] == [] and len(b.payload()[3]) == 2


def test_batch_checks_addresses() -> None:
    b = PeerBatch()
    b.add(1, Message(MessageType.VOTE, to=2, sender=1, term=3))
    with pytest.raises(RaftWireError):
        decode_batch(b.payload(), sender=9, to=2)
    assert decode_batch(b.payload(), sender=1, to=2)[0][1].type is MessageType.VOTE


BAD = [
    None, 1, b"x", [], [1], [1, 2, 3, 4], [2, [], [], [], []], [1, [1, 2], [], [], []], [1, [0, 1, 1], [], [], []],
    [1, [], [], [1, [99, 1, 2]], []], [1, [], [], [1, [10, 1]], []], [1, [], [], [1, [10, 1, 2, -1]], []],
    [1, [], [], [1, [10, 1, 2, 3, 4, 5, 6, 2]], []], [1, [], [], [1, [10, 1, 2, 0, 0, 0, 0, 0, 0, 9]], []],
    [1, [], [], [1, [10, 1, 2, 0, 0, 0, 0, 0, 0, 0, [1, 1]]], []],
    [1, [], [], [1, [10, 1, 2, 0, 0, 0, 0, 0, 0, 0, [0, 1, 0, b""]]], []],
    [1, [], [], [1, [10, 1, 2, 0, 0, 0, 0, 0, 0, 0, [1, 1, 5, b""]]], []],
    [1, [], [], [1, [10, 1, 2, 0, 0, 0, 0, 0, 0, 0, [1, 1, 0, "s"]]], []],
    [1, [], [], [1, [16, 1, 2, 0, 0, 0, 0, 0, 0, 0, [], [1, 1, [3, 2], b""]]], []],
    [1, [], [], [1, [16, 1, 2, 0, 0, 0, 0, 0, 0, 0, [], [1, 1, [2], b"", 5]]], []],
    [1, [1, 1 << 64, 0], [], [], []], [1, [1, 1.5, 0], [], [], []], [1, [1, True, 0], [], [], []],
]


@pytest.mark.parametrize("payload", BAD)
def test_malformed_batches_raise_wire_error(payload: Any) -> None:
    with pytest.raises(RaftWireError):
        decode_batch(payload, sender=2, to=1)


garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 1 << 65) | st.binary(max_size=4) | st.text(max_size=2)
    | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=12),
    max_leaves=40,
)


@given(garbage)
@settings(max_examples=150)  # `make test`; the 500 of the long run below are in the slow set
def test_any_garbage_is_a_wire_error_or_decodes(payload: Any) -> None:
    for candidate in (payload, [1, [], [], payload, []], [1, [], [], [1, payload], []]):
        try:
            decode_batch(candidate, sender=2, to=1)
        except RaftWireError:
            pass


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 500 examples
@given(garbage)
@settings(max_examples=500)
def test_any_garbage_is_a_wire_error_or_decodes_long(payload: Any) -> None:
    test_any_garbage_is_a_wire_error_or_decodes.hypothesis.inner_test(payload)
