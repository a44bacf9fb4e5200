"""The classic queue type: classic queues on this node, with their storage, timers and paging.

Owns: making classic queues (argument validation, `ClassicQueue`), attaching their storage (durable
queues always get an index; others only when they page), their timers (TTL, x-expires), recovery of
stored messages at start, memory-pressure paging, and closing storage at stop. The queue logic itself is
`hutch.queues.classic.queue`; the message store and queue indexes are `persistence.py` beside this file.

Rules:
- A classic queue's home is the node that declared it; a record of a durable classic queue of this node
  is restored by declaring it again (recovery does not re-validate what was once accepted); a record of
  this node's transient queue means the queue did not survive the restart (`stale_transient`).
- `ClassicQueue`'s class-wide RAM limits are set here only (from the config, and lowered under memory
  pressure); its clock is the runtime's clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.core.arguments import validate_consumer_arguments, validate_queue_arguments
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.queue_type import Consumer, Queue
from hutch.queues.classic.queue import (
    PRESSURE_RAM_BYTES_LIMIT,
    PRESSURE_RAM_LIMIT,
    RAM_BYTES_LIMIT,
    ClassicQueue,
)
from hutch.runtime.ports import queues_of
from hutch.runtime.queue_types.classic import features
from hutch.runtime.queue_types.remote_queue import RemoteQueue

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node
    from hutch.runtime.queue_types.classic.persistence import Persistence

log = logging.getLogger("hutch.node")


def is_durable_queue(q: Queue) -> bool:
    return q.durable and q.exclusive_owner is None


class ClassicQueueType:
    name = "classic"
    declarable = True

    def __init__(self, node: Node, persistence: Persistence | None) -> None:
        self.node = node
        self.persistence = persistence
        self.timers = features.QueueTimers(node, node.clock)
        self._transient_ids = 0
        self.started = False  # `start` ran: a queue declared from a record now needs its storage at once
        # a node of workers (runtime/workers/): where a new non-exclusive queue lives when that is another
        # worker (its stand-in here), or None for this one; None on a lone node
        self.elsewhere: Callable[[VirtualHost, str, bool, bool, dict[str, Any]], Queue | None] | None = None
        ClassicQueue.ram_limit = node.config.classic_queue_ram_limit  # class-wide, like the pressure limits
        ClassicQueue.clock = staticmethod(node.clock.wall_ms)
        ClassicQueue.loop_load = node.loop_load

    # -- the broker's port ----------------------------------------------------------------------------
    def owns(self, q: Queue) -> bool:
        return isinstance(q, ClassicQueue)

    def declare(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], owner: object) -> Queue:
        restoring = self.node.replaying
        if not restoring:  # as RabbitMQ, recovery does not re-validate what was once accepted
            validate_queue_arguments(name, vhost.name, "classic", arguments)
        if not restoring and not exclusive and self.elsewhere is not None:
            placed = self.elsewhere(vhost, name, durable, auto_delete, dict(arguments))
            if placed is not None:  # another worker is its home (runtime/workers/, remote_type.py)
                return placed
        q = ClassicQueue(vhost.name, name, durable, owner if exclusive else None, auto_delete, dict(arguments))
        self.node.add_queue(vhost, q)
        if not restoring:
            self._attach_storage(vhost, q)
        features.attach(self.node, self.timers, q)
        return q

    def check_consume(self, q: Queue, consumer: Consumer) -> None:
        validate_consumer_arguments(q.name, q.vhost, self.name, consumer.arguments)

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        if not isinstance(op, DeclareQueue):
            return False
        if op.durable or self.started:  # while running: a queue another worker placed here
            standin = vhost.queues.get(op.name)
            if isinstance(standin, RemoteQueue):  # the queue moved here (compaction of load): it gives way
                self._drop_standin(vhost, standin)
            existed = op.name in vhost.queues
            q = self.node.declare_queue(vhost, op.name, op.durable, False, op.auto_delete,
                                        self.node.unpack_arguments(op.arguments), None)
            if self.started and not existed and isinstance(q, ClassicQueue):
                self._attach_storage(vhost, q)
        else:  # this node's transient queue: it did not survive the restart
            self.node.stale_transient.append((vhost.name, op.name))
        return True

    def record_fields(self, q: Queue) -> dict[str, Any]:
        return {}

    def moved_copy(self, vhost: VirtualHost, standin: Queue) -> ClassicQueue:
        """A queue moving here from another worker (compaction of load, runtime/compaction.py), built aside
        with its storage, for the import: its stand-in stays in place until the move commits
        (`install_moved`), so nothing here reaches the copy before."""
        q = ClassicQueue(vhost.name, standin.name, standin.durable, None, standin.auto_delete, dict(standin.arguments))
        self._attach_storage(vhost, q)
        return q

    def install_moved(self, vhost: VirtualHost, standin: Queue, q: ClassicQueue) -> None:
        """The move committed: the copy takes its stand-in's place (bindings kept: they name the queue)."""
        assert isinstance(standin, RemoteQueue)
        self._drop_standin(vhost, standin)
        self.node.add_queue(vhost, q, count=False)
        features.attach(self.node, self.timers, q)

    def _drop_standin(self, vhost: VirtualHost, standin: RemoteQueue) -> None:
        """A stand-in leaves its place to the local queue: its consumers here (through the hop) get
        basic.cancel and consume again; nothing is deleted at its old home."""
        standin.home_down()
        standin.delete()
        if vhost.queues.get(standin.name) is standin:
            del vhost.queues[standin.name]

    def redeclared(self, q: Queue) -> None:
        assert isinstance(q, ClassicQueue)
        q.touch(self.node.clock.wall_ms())  # a redeclare is a use (x-expires)

    def deleted(self, q: Queue) -> None:
        assert isinstance(q, ClassicQueue)
        self.timers.cancel(q)

    def memory_pressure(self, on: bool) -> None:
        """Over (or back under) the paging threshold: shrink (or restore) what queues keep in RAM, and
        page out what they hold beyond it now. Called on every memory check while paging."""
        ClassicQueue.ram_limit = PRESSURE_RAM_LIMIT if on else self.node.config.classic_queue_ram_limit
        ClassicQueue.ram_bytes_limit = PRESSURE_RAM_BYTES_LIMIT if on else RAM_BYTES_LIMIT
        if not on:
            return
        paged = 0
        for _vhost, q in queues_of(self.node.vhosts.values()):
            if isinstance(q, ClassicQueue):
                paged += q.page_out(PRESSURE_RAM_LIMIT)
        if paged:
            log.info("memory pressure: %d messages paged out to disk", paged)

    async def start(self) -> None:
        self.started = True
        for _vhost, q in queues_of(self.node.vhosts.values()):  # deadlines of recovered queues
            if isinstance(q, ClassicQueue) and (deadline := q.next_deadline()):
                self.timers.request(q, deadline)
        if self.persistence is not None:
            self.persistence.sink.on_drained = self._storage_drained
            self.persistence.sink.placement.follow_loop(self.node.loop_load, count_busy=True)
            self.persistence.start(asyncio.get_running_loop())

    async def stop(self) -> None:
        self.timers.cancel_all()
        if self.persistence is not None:
            for _vhost, q in queues_of(self.node.vhosts.values()):
                if isinstance(q, ClassicQueue):
                    q.close_storage()
            await self.persistence.close()

    # -- storage ---------------------------------------------------------------------------------------
    def _storage_drained(self) -> None:
        """The group commit caught up: publishers paused because the disk was behind may read again."""
        for _vhost, q in queues_of(self.node.vhosts.values()):
            if q.flow_waiters:
                q.release_flow()

    def _attach_storage(self, vhost: VirtualHost, q: ClassicQueue, index: Any = None) -> None:
        """Give a classic queue its index: durable queues always, others only when they page."""
        persistence = self.persistence
        if persistence is None:
            return
        if is_durable_queue(q):
            q.index = index if index is not None else persistence.index(vhost.name, q.name)
            q.persist = True
        else:
            self._transient_ids += 1
            unique = f"transient-{self._transient_ids}"
            q.index_factory = lambda: persistence.index(vhost.name, q.name, unique)

    def recover(self) -> None:
        """Recover the index of every durable queue and the reference counts of the message stores;
        delete what belongs to queues that no longer exist."""
        persistence = self.persistence
        if persistence is None:
            return
        keep: set[str] = set()
        refs_by_vhost: dict[str, dict[int, int]] = {}
        recovered: list[tuple[ClassicQueue, Any]] = []
        for vhost, q in queues_of(self.node.vhosts.values()):
            if not (isinstance(q, ClassicQueue) and is_durable_queue(q)):
                continue
            index = persistence.index(vhost.name, q.name)
            found = index.recover()
            for path in found.torn_tails:
                log.warning("queue index %s: dropped an incomplete write at its end", path)
            store = persistence.store(vhost.name)
            missing = [seq for seq, store_id in found.refs.items() if not store.contains(store_id)]
            if missing:
                log.warning("queue '%s' in vhost '%s': %d messages were never fully written (not "
                            "confirmed); dropped", q.name, vhost.name, len(missing))
                for seq in missing:
                    del found.refs[seq]
                    index.refs.pop(seq, None)  # nothing to release in the store
                index.ack(missing)
                found.live -= len(missing)
            refs = refs_by_vhost.setdefault(vhost.name, {})
            for store_id in found.refs.values():
                refs[store_id] = refs.get(store_id, 0) + 1
            keep.add(os.path.basename(index.directory))
            self._attach_storage(vhost, q, index)
            recovered.append((q, found))
        removed = persistence.remove_orphans(keep)
        persistence.set_store_refs(refs_by_vhost)
        total = 0
        for q, found in recovered:
            q.recover_index(found)
            total += found.live
        persistence.sink.sync_now()
        log.info("messages recovered: %d in %d durable queues (%d stale queue directories removed)",
                 total, len(recovered), removed)
