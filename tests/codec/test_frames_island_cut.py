"""`FrameReader.cut_unfinished_publish` (an island's move, runtime/session/connection.py's
`_process_island`): the buffer is cut before the first complete basic.publish whose content does not
follow it whole, and nothing else. Checked on streams of publishes (one body frame, several, none),
acks and heartbeats over two channels, cut after every byte, for the pure reader and its compiled twin
alike (tests/codec/test_speedups.py compares the rest of them)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.amqp import frames as pure
from hutch.amqp import spec

from .support import ci_settings

try:
    from hutch.amqp import _cframes as compiled
except ImportError:  # not built: the pure path alone
    compiled = None

READERS: list[Any] = [pure.FrameReader] + ([compiled.FrameReader] if compiled is not None else [])
FRAME_MAX = 64  # small: bodies of a few dozen bytes take several frames


def publish(channel: int, body: bytes) -> bytes:
    out = [pure.method_frame(channel, spec.Basic.Publish(exchange="", routing_key="q"))]
    out += pure.content_frames(channel, 60, b"\x00\x00", body, FRAME_MAX)
    return b"".join(out)


METHOD_LEN = len(pure.method_frame(1, spec.Basic.Publish(exchange="", routing_key="q")))


def ack(channel: int) -> bytes:
    return pure.method_frame(channel, spec.Basic.Ack(delivery_tag=1))


ITEM = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 2), st.binary(max_size=150)),
    st.tuples(st.just("ack"), st.integers(1, 2), st.just(b"")),
    st.tuples(st.just("heartbeat"), st.just(0), st.just(b"")),
)


def stream(items: list[tuple[str, int, bytes]]) -> tuple[bytes, list[tuple[int, int, bool]]]:
    """The bytes, and each item's (start, end, is a publish)."""
    out = b""
    spans = []
    for kind, channel, body in items:
        data = publish(channel, body) if kind == "publish" else ack(channel) if kind == "ack" else \
            pure.HEARTBEAT_FRAME
        spans.append((len(out), len(out) + len(data), kind == "publish"))
        out += data
    return out, spans


@pytest.mark.parametrize("reader_type", READERS)
def test_a_stream_of_whole_messages_is_not_cut(reader_type: Any) -> None:
    data, _ = stream([("publish", 1, b"x" * 200), ("ack", 1, b""), ("publish", 2, b""), ("heartbeat", 0, b"")])
    r = reader_type(FRAME_MAX)
    r.feed(data)
    assert r.cut_unfinished_publish() == b""
    assert r.buffered == len(data)


@ci_settings(max_examples=150)
@given(items=st.lists(ITEM, min_size=1, max_size=8), chunk=st.integers(1, 40), data=st.data())
def test_the_cut_is_before_the_first_publish_not_wholly_buffered(items: list[tuple[str, int, bytes]], chunk: int,
                                                                 data: st.DataObject) -> None:
    """Fed the stream's first k bytes (in chunks, some frames consumed first): what stays is the stream up
    to the start of the first publish whose method frame is complete and whose content is not, what is
    cut the rest of what was fed; both readers agree, and feeding the cut back restores the buffer."""
    raw, spans = stream(items)
    k = data.draw(st.integers(0, len(raw)))
    fed = raw[:k]
    expected = next((start for start, end, is_pub in spans if is_pub and end > k and start + METHOD_LEN <= k), k)
    results = []
    for reader_type in READERS:
        r = reader_type(FRAME_MAX)
        for i in range(0, k, chunk):
            r.feed(fed[i:i + chunk])
        consumed = 0
        first = spans[0]
        if not first[2] and first[1] <= k:  # an ack or a heartbeat taken first: the cut starts after it
            next(iter(r.frames()))
            consumed = first[1]
        tail = r.cut_unfinished_publish()
        assert tail == fed[max(expected, consumed):], (reader_type, k, expected)
        assert r.buffered == max(expected, consumed) - consumed
        r.feed(tail)
        assert r.buffered == k - consumed
        assert r.cut_unfinished_publish() == tail  # the same cut again
        results.append(tail)
    assert len(set(results)) == 1
