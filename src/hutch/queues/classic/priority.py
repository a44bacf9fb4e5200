"""Message priorities for classic queues (x-max-priority): the ready messages as one FIFO per level.

Owns: `PriorityReady`, a drop-in for the classic queue's ready deque (the operations the queue uses:
append, popleft, appendleft, pop, [0], [-1], len, iteration, clear) that keeps one deque per priority
level. Delivery order is highest level first, FIFO within a level; a requeued message goes back to its
seq position within its level (`insert_by_seq`).

Rules (RabbitMQ's): a message's level is its `priority` property capped at the queue's x-max-priority;
no priority property means 0. `[0]` is the next message to deliver; `[-1]` / `pop()` the last one (the
tail of the lowest non-empty level).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from hutch.amqp.spec import FLAG_PRIORITY
from hutch.core.message import Message
from hutch.core.queue_type import QueueEntry

_PRIORITY_HI = FLAG_PRIORITY >> 8


def message_priority(msg: Message, max_priority: int) -> int:
    if not msg.properties_raw[0] & _PRIORITY_HI:
        return 0
    p = msg.properties.priority or 0
    return p if p < max_priority else max_priority


class PriorityReady:
    __slots__ = ("levels", "max_priority", "_n")

    def __init__(self, max_priority: int) -> None:
        self.max_priority = max_priority
        self.levels: list[deque[QueueEntry]] = [deque() for _ in range(max_priority + 1)]
        self._n = 0

    def _level(self, entry: QueueEntry) -> deque[QueueEntry]:
        return self.levels[message_priority(entry.msg, self.max_priority)]

    def append(self, entry: QueueEntry) -> None:
        self._level(entry).append(entry)
        self._n += 1

    def appendleft(self, entry: QueueEntry) -> None:
        self._level(entry).appendleft(entry)
        self._n += 1

    def insert_by_seq(self, entry: QueueEntry) -> None:
        level = self._level(entry)
        seq = entry.seq
        if not level or seq < level[0].seq:
            level.appendleft(entry)
        elif seq > level[-1].seq:
            level.append(entry)
        else:
            lo, hi = 0, len(level)
            while lo < hi:
                mid = (lo + hi) // 2
                if level[mid].seq < seq:
                    lo = mid + 1
                else:
                    hi = mid
            level.insert(lo, entry)
        self._n += 1

    def popleft(self) -> QueueEntry:
        for level in reversed(self.levels):
            if level:
                self._n -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def pop(self) -> QueueEntry:
        for level in self.levels:
            if level:
                self._n -= 1
                return level.pop()
        raise IndexError("pop from an empty queue")

    def __getitem__(self, i: int) -> QueueEntry:
        if i == 0:
            for level in reversed(self.levels):
                if level:
                    return level[0]
        elif i == -1:
            for level in self.levels:
                if level:
                    return level[-1]
        else:
            raise IndexError("only the head [0] and the tail [-1] can be read")
        raise IndexError("empty queue")

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[QueueEntry]:
        for level in reversed(self.levels):
            yield from level

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self._n = 0
