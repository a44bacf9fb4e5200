"""Group commit under a slow disk (issue 15's review, docs/security.md "Stream protocol"): while a stream's
sync does not answer, a publisher's held batch stays within CHUNK_ENTRIES entries and HOLD_BYTES bytes
(then it is written and counted as appends in flight), the connection's input is held once
MAX_PENDING_APPENDS appends wait for their commit, and stored offsets (which send no confirm) count
against the same bound. Driven in memory (tests/stream_protocol/memory.py) with the writer thread's
sync blocked on an event."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hutch.runtime.broker.node import Node
from hutch.runtime.queue_types.stream import handle as stream_handle
from hutch.runtime.stream_session.publishing import CHUNK_ENTRIES, HOLD_BYTES, MAX_PENDING_APPENDS
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code
from session.memory import make_node

from .memory import StreamPair, make_hub

pytestmark = pytest.mark.asyncio


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(str(tmp_path / "data"))


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every stream sync waits for the event (set it to let the disk answer)."""
    gate = threading.Event()
    real = stream_handle.sync_together

    def slow(handles: list[object]) -> None:
        assert gate.wait(30), "the test never opened the gate"
        real(handles)  # type: ignore[arg-type]
    monkeypatch.setattr(stream_handle, "sync_together", slow)
    return gate


async def test_publishers_are_held_not_buffered_while_the_sync_does_not_answer(
        node: Node, slow_disk: threading.Event) -> None:
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("slow")
    assert await pair.request(c.DeclarePublisher(pair.next_corr(), 1, "", "slow")) is not None
    conn = pair.conn
    body = b"\x00Su\xa0\x01x" + b"y" * 500
    frame = c.encode(c.Publish(1, [c.PublishedEntry(i, body) for i in range(16)]))
    fed = 0
    try:
        pair.feed(frame)  # the first chunk starts a sync, which blocks
        await pair.until(lambda: any(b.handle.syncing for b in conn.publishing._batches.values())
                         or conn.publishing.pending_appends > 0)
        while pair.transport.reading and fed < 20_000:
            pair.feed(frame)
            fed += 1
            for batch in conn.publishing._batches.values():
                assert batch.entries <= CHUNK_ENTRIES and batch.size < HOLD_BYTES + len(frame)
            assert conn.publishing.pending_appends <= MAX_PENDING_APPENDS
        assert not pair.transport.reading, f"{fed} publish frames taken while the disk did not answer"
        assert conn.publishing.pending_appends == MAX_PENDING_APPENDS
    finally:
        slow_disk.set()
    await pair.until(lambda: pair.transport.reading)
    confirmed = 0
    while confirmed < 16 * (fed + 1):
        for cmd in await pair.expect(1, timeout=30):
            assert isinstance(cmd, c.PublishConfirm), cmd
            confirmed += len(cmd.publishing_ids)


async def test_stored_offsets_count_as_appends_in_flight(node: Node, slow_disk: threading.Event) -> None:
    pair = StreamPair(make_hub(node))
    await pair.open()
    await pair.create("offsets")
    conn = pair.conn
    fed = 0
    try:
        while pair.transport.reading and fed < 20_000:
            pair.feed(c.encode(c.StoreOffset(f"consumer-{fed}", "offsets", fed)))
            fed += 1
        assert not pair.transport.reading, f"{fed} stored offsets taken while the disk did not answer"
        assert conn.publishing.pending_appends == MAX_PENDING_APPENDS
    finally:
        slow_disk.set()
    await pair.until(lambda: pair.transport.reading)
    answer = await pair.request(c.QueryOffset(pair.next_corr(), f"consumer-{fed - 1}", "offsets"))
    assert isinstance(answer, c.QueryOffsetResponse) and (answer.code, answer.offset) == (Code.OK, fed - 1)
