"""The inter-node message records and their codec (hutch.cluster.messages): every kind round-trips through
`encode`/`decode` and through the transport's path (`to_wire`, a msgpack frame, `from_wire`); unknown and
malformed values raise `MessageError` subclasses only; the registry dispatches by kind."""

from __future__ import annotations

import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster import messages as cm
from hutch.cluster import wire
from hutch.core.message import Message

# -- strategies ------------------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                     st.binary(max_size=20))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    msg = Message(draw(st.text(max_size=30)), draw(st.text(max_size=30)), None, draw(st.binary(max_size=200)),
                  draw(st.binary(max_size=30)), draw(st.binary(min_size=1, max_size=30)))
    msg.foreign_deaths = draw(st.booleans())
    return msg


def _strategy(annotation: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return st.one_of(*(_strategy(a) for a in typing.get_args(annotation)))
    base = origin or annotation
    return {
        int: st.integers(-(2**63), 2**64 - 1), str: st.text(max_size=30), bytes: st.binary(max_size=100),
        bool: st.booleans(), list: st.lists(_values, max_size=5), type(None): st.none(), Any: _values,
        Message: messages(),
    }[base]


def records(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, *(_strategy(hints[f]) for f in cls._fields))  # type: ignore[attr-defined]


def same(a: Any, b: Any) -> bool:
    """Equal as records: Message fields compared by what travels."""
    if type(a) is not type(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, Message):
            if cm.message_to_wire(x) != cm.message_to_wire(y) or bytes(x.body) != bytes(y.body):
                return False
        elif x != y:
            return False
    return True


# -- round trips -------------------------------------------------------------------------------------------


# `make test` runs every kind's round trips at 12 and 6 examples (70 kinds: ~1,300 records); the long runs
# (`make test-slow`), 60 and 30 per kind, are the `_long` twins below (docs/testing.md, session 21)
@pytest.mark.parametrize("cls", cm.RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_every_kind_round_trips_through_the_codec(cls: type, data: st.DataObject) -> None:
    record = data.draw(records(cls))
    assert same(cm.decode(cm.encode(record)), record)


def _long_run(test: Any, examples: int) -> Any:
    """The slow twin of a per-kind property: the same test at `examples` per kind (`make test-slow`)."""
    @pytest.mark.slow
    @pytest.mark.parametrize("cls", cm.RECORDS, ids=lambda c: c.__name__)
    @settings(max_examples=examples, deadline=None)
    @given(data=st.data())
    def long_run(cls: type, data: st.DataObject) -> None:
        test.hypothesis.inner_test(cls, data)
    return long_run


test_every_kind_round_trips_through_the_codec_long = _long_run(test_every_kind_round_trips_through_the_codec, 60)


@pytest.mark.parametrize("cls", cm.RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_every_kind_round_trips_through_a_transport_batch(cls: type, data: st.DataObject) -> None:
    """As the transport carries it: packed into a MESSAGE entry, a batch frame, decoded with the frame."""
    record = data.draw(records(cls))
    frame = wire.encode_batch([wire.pack_message_raw(cm.encode(record))])
    (batch,) = wire.FrameDecoder(1 << 20).feed(frame)
    kind, value = batch[0]
    assert kind == wire.MESSAGE
    assert same(cm.from_wire(value), record)


test_every_kind_round_trips_through_a_transport_batch_long = _long_run(
    test_every_kind_round_trips_through_a_transport_batch, 30)


def test_tags_are_distinct_and_every_kind_is_listed() -> None:
    tags = [cls.TAG for cls in cm.RECORDS]  # type: ignore[attr-defined]
    assert len(set(tags)) == len(tags)
    records_in_module = {v for v in vars(cm).values() if isinstance(v, type) and issubclass(v, tuple)
                         and hasattr(v, "TAG")}
    assert records_in_module == set(cm.RECORDS)


def test_a_request_reply_is_decoded_into_its_reply_record() -> None:
    reply = cm.QueueGetReply([1, 0, 2], None)
    value = msgpack.unpackb(msgpack.packb(cm.to_wire(reply)), raw=False)
    assert cm.reply_from_wire(cm.QueueGet("/", "q", False), value) == reply
    assert cm.reply_from_wire(cm.QueuePurge("/", "q"), 5) == 5  # a request without a reply record
    with pytest.raises(cm.MalformedMessage, match="reply to QueueGet is QuorumGetReply"):
        cm.reply_from_wire(cm.QueueGet("/", "q", False), list(cm.to_wire(cm.QuorumGetReply(1, None))))


# -- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "error", "text"), [
    ([999, 1], cm.UnknownMessage, "unknown inter-node message kind 999"),
    (["qp", 1], cm.UnknownMessage, "unknown inter-node message kind 'qp'"),
    ({"t": "qp"}, cm.MalformedMessage, "must be a non-empty array"),
    ([], cm.MalformedMessage, "must be a non-empty array"),
    (None, cm.MalformedMessage, "must be a non-empty array"),
    ([cm.RemoteCancel.TAG], cm.MalformedMessage, "RemoteCancel: expected 1 fields, got 0"),
    ([cm.RemoteCancel.TAG, 1, 2], cm.MalformedMessage, "RemoteCancel: expected 1 fields, got 2"),
    ([cm.RemoteCancel.TAG, "1"], cm.MalformedMessage, "RemoteCancel: field 'consumer_id' is str '1'"),
    ([cm.RemoteConfirm.TAG, 1, [1]], cm.MalformedMessage, "RemoteConfirm: field 'ok' is int 1"),
    ([cm.RemotePublish.TAG, "/", "q", 1, ["x", "rk"]], cm.MalformedMessage, "a message must be"),
    ([cm.RemotePublish.TAG, "/", "q", 1, ["x", "rk", "props", b"", b"", False]], cm.MalformedMessage,
     "a message must be"),
    ([cm.QueueGetReply.TAG, [0, 0, 0], 5], cm.MalformedMessage, "field 'entry' is int 5"),
    ([cm.RaftMessage.TAG, b"x"], cm.MalformedMessage, "RaftMessage: field 'payload' is bytes"),
])
def test_unknown_and_malformed_values_raise_a_message_error(value: Any, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        cm.from_wire(value)


@settings(max_examples=150, deadline=None)  # `make test`; the 300 of the long run below are in the slow set
@given(value=_values)
def test_from_wire_raises_only_message_errors(value: Any) -> None:
    try:
        cm.from_wire(value)
    except cm.MessageError:
        pass


@pytest.mark.slow  # the long run: the same test, 300 examples
@settings(max_examples=300, deadline=None)
@given(value=_values)
def test_from_wire_raises_only_message_errors_long(value: Any) -> None:
    test_from_wire_raises_only_message_errors.hypothesis.inner_test(value)


@settings(max_examples=200, deadline=None)
@given(tag=st.sampled_from([cls.TAG for cls in cm.RECORDS]), fields=st.lists(_values, max_size=9))
def test_a_known_tag_with_arbitrary_fields_raises_only_message_errors(tag: int, fields: list[Any]) -> None:
    try:
        cm.from_wire([tag, *fields])
    except cm.MessageError:
        pass


def test_undecodable_bytes_are_a_malformed_message() -> None:
    with pytest.raises(cm.MalformedMessage, match="undecodable"):
        cm.decode(b"\xc1")


def test_encoding_a_value_that_is_not_a_record_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not an inter-node message record: dict"):
        cm.encode({"t": "qp"})


# -- the batch records of the queue link -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10), st.integers(0, 2**63), messages()),
                      max_size=20))
def test_a_publish_batch_reads_back_every_publish_in_order(items: list[tuple[str, str, int, Message]]) -> None:
    entries: list[Any] = []
    for vhost, queue, pid, msg in items:
        entries.extend((vhost, queue, pid, *cm.message_to_wire(msg)))
    record = cm.decode(cm.encode(cm.RemotePublishBatch(entries)))
    assert isinstance(record, cm.RemotePublishBatch)
    got = cm.publishes_of(record)
    assert [g[:3] for g in got] == [i[:3] for i in items]
    assert [cm.message_to_wire(g[3]) for g in got] == [cm.message_to_wire(i[3]) for i in items]


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.tuples(st.integers(0, 2**63), st.integers(0, 2**63), st.booleans(), st.booleans(),
                                messages()), max_size=20))
def test_a_delivery_batch_reads_back_every_delivery_in_order(items: list[tuple[int, int, bool, bool, Message]]) -> None:
    entries: list[Any] = []
    for cid, did, redelivered, no_ack, msg in items:
        entries.extend((cid, did, redelivered, no_ack, *cm.message_to_wire(msg)))
    record = cm.decode(cm.encode(cm.RemoteDeliverBatch(entries)))
    assert isinstance(record, cm.RemoteDeliverBatch)
    got = cm.deliveries_of(record)
    assert [g[:4] for g in got] == [i[:4] for i in items]
    assert [cm.message_to_wire(g[4]) for g in got] == [cm.message_to_wire(i[4]) for i in items]


_GOOD_PUBLISH = ["/", "q", 1, "", "q", b"", b"body", b"\x00\x01q", False]


@pytest.mark.parametrize(("entries", "text"), [
    (_GOOD_PUBLISH[:-1], "not a multiple of 9"),
    (["/", "q", "1", *_GOOD_PUBLISH[3:]], "publish at 0"),
    ([*_GOOD_PUBLISH, "/", "q", 2, "", "q", "not bytes", b"body", b"t", False], "the message at 12"),
])
def test_a_malformed_publish_batch_is_refused_whole(entries: list[Any], text: str) -> None:
    with pytest.raises(cm.MalformedMessage, match=text):
        cm.publishes_of(cm.RemotePublishBatch(entries))


@settings(max_examples=100, deadline=None)  # `make test`; the 200 of the long run below are in the slow set
@given(entries=st.lists(_values, max_size=30))
def test_arbitrary_batch_entries_raise_only_message_errors(entries: list[Any]) -> None:
    for read, kind in ((cm.publishes_of, cm.RemotePublishBatch), (cm.deliveries_of, cm.RemoteDeliverBatch)):
        try:
            read(kind(entries))  # type: ignore[operator]
        except cm.MessageError:
            pass


@pytest.mark.slow  # the long run: the same test, 200 examples
@settings(max_examples=200, deadline=None)
@given(entries=st.lists(_values, max_size=30))
def test_arbitrary_batch_entries_raise_only_message_errors_long(entries: list[Any]) -> None:
    test_arbitrary_batch_entries_raise_only_message_errors.hypothesis.inner_test(entries)


# -- the registry ----------------------------------------------------------------------------------------


def test_the_registry_dispatches_by_kind_and_refuses_unknown_ones() -> None:
    registry = cm.Registry()
    seen: list[tuple[str, Any]] = []
    registry.register(cm.RemoteCancel, lambda peer, rec: seen.append((peer, rec)))
    registry.register(cm.QueuePurge, lambda _peer, rec: 7)
    registry.handle("n2", list(cm.to_wire(cm.RemoteCancel(5))))
    assert seen == [("n2", cm.RemoteCancel(5))]
    assert registry.handle_record("n1", cm.QueuePurge("/", "q")) == 7
    with pytest.raises(cm.UnknownMessage, match="no handler for inter-node message RemoteConsumerEnded"):
        registry.handle("n2", list(cm.to_wire(cm.RemoteConsumerEnded(5))))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(cm.RemoteCancel, lambda _peer, _rec: None)
    with pytest.raises(TypeError, match="not an inter-node message record"):
        registry.register(dict, lambda _peer, _rec: None)  # type: ignore[arg-type]
