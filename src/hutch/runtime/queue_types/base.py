"""What a queue type does when it has nothing to do: the no-op parts of `QueueTypePort`.

Owns: `QueueTypeDefaults`, a base for queue types whose queues need nothing from the broker at a
redeclare, a delete, memory pressure, recovery, start or stop (remote stand-ins, quorum queues, whose
state lives in their Raft group). A type that needs one of these overrides it.
"""

from __future__ import annotations

from hutch.core.queue_type import Queue


class QueueTypeDefaults:
    def redeclared(self, q: Queue) -> None:
        pass

    def deleted(self, q: Queue) -> None:
        pass

    def memory_pressure(self, on: bool) -> None:
        pass

    def recover(self) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass
