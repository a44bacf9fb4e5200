"""`StreamEntry` (runtime/queue_types/stream/queue.py) sets `QueueEntry`'s fields itself, without calling
its `__init__` (one call fewer per delivery on the hot path): it must set every one of them, to what
`QueueEntry.__init__` sets, so a field added to `QueueEntry` later cannot be left unset on a stream's
deliveries."""

from __future__ import annotations

from typing import Any

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_type import QueueEntry
from hutch.runtime.queue_types.stream.queue import StreamEntry


def test_stream_entry_sets_every_queue_entry_field_as_queue_entry_does() -> None:
    msg = Message("", "s", BasicProperties(), b"x")
    consumer: Any = object()
    entry = StreamEntry(42, msg, consumer)
    reference = QueueEntry(42, msg)
    for name in QueueEntry.__slots__:
        assert getattr(entry, name) == getattr(reference, name), name
    assert entry.consumer is consumer
    assert entry.seq == 42 and entry.msg is msg
