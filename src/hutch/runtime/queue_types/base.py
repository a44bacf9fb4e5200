"""What a queue type does when it has nothing to do: the no-op parts of `QueueTypePort`.

Owns: `QueueTypeDefaults`, a base for queue types whose queues need nothing from the broker at a
redeclare, a delete, memory pressure, recovery, start or stop (remote stand-ins, quorum queues, whose
state lives in their Raft group), and whose consumers are checked only by their arguments
(`check_consume`: core/arguments.py's rules for the type's `name`). A type that needs more overrides it.
"""

from __future__ import annotations

from hutch.core.arguments import validate_consumer_arguments
from hutch.core.queue_type import Consumer, Queue


class QueueTypeDefaults:
    name: str

    def check_consume(self, q: Queue, consumer: Consumer) -> None:
        validate_consumer_arguments(q.name, q.vhost, self.name, consumer.arguments)

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
