"""The stream queue type, as the broker sees it: declaring, restoring and deleting streams on this node.

Owns: the declare-time rules of streams (durable, not exclusive, not auto-delete, not server-named, the
stream x-arguments; RabbitMQ's texts), where a stream's files live (`<data_dir>/streams/<stream id, 16 hex
digits>/`, the id a random 63-bit number kept in the queue's `queue.declare` record, never reused, so a
stream deleted and declared again never meets its old files), opening them at a declare or a restore,
deleting them with the queue, removing orphaned directories at recovery, and the retention timer.

Rules:
- A node without a data directory cannot hold streams: a stream declare is refused (406) with a text
  saying so.
- `x-max-age` must be a duration such as "7D", "12h", "30m", "10s" (units Y M D h m s).
- Retention (max-age) is evaluated every `RETENTION_TICK_S` and whenever a segment rolls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.core.arguments import validate_queue_arguments
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.queue_type import Consumer, Queue
from hutch.core.vhost import rs
from hutch.queues.stream.chunk import DEFAULT_FILTER_SIZE
from hutch.queues.stream.offset_spec import interval_ms
from hutch.runtime.ports import Clock, queues_of
from hutch.runtime.queue_types.base import QueueTypeDefaults
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamOptions
from hutch.runtime.queue_types.stream.queue import StreamQueue, retention_of
from hutch.storage.errors import StorageError
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.stream_log import DEFAULT_MAX_SEGMENT_SIZE_BYTES

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node

log = logging.getLogger("hutch.stream")

RETENTION_TICK_S = 10.0
STREAMS_DIR = "streams"


class StreamQueueType(QueueTypeDefaults):
    name = "stream"
    declarable = True

    def __init__(self, node: Node, fs: FileSystem | None = None, clock: Clock | None = None) -> None:
        self.node = node
        self.fs: FileSystem = fs or RealFS()
        self.clock: Clock = clock or node.clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        # directories of streams whose files could not be opened at boot: kept for an operator, never
        # taken for orphans (their queue records still name them)
        self._unopened: set[str] = set()

    @property
    def root(self) -> str | None:
        data_dir = self.node.config.data_dir
        return os.path.join(str(data_dir), STREAMS_DIR) if data_dir else None

    def owns(self, q: Queue) -> bool:
        return isinstance(q, StreamQueue)

    def check_consume(self, q: Queue, consumer: Consumer) -> None:
        assert isinstance(q, StreamQueue)
        q.consumer_start(consumer)

    def declare(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], owner: object) -> Queue:
        what = rs("queue", name, vhost.name)
        for bad, prop in ((not durable, "non-durable"), (exclusive, "exclusive-owner"), (auto_delete, "auto-delete")):
            if bad:
                raise ChannelError(PRECONDITION_FAILED, f"invalid property '{prop}' for {what}", 50, 10)
        if name.startswith("amq.gen-"):
            raise ChannelError(PRECONDITION_FAILED,
                               "Cannot declare a server-named queue for type rabbit_stream_queue", 50, 10)
        validate_queue_arguments(name, vhost.name, "stream", arguments)
        age = arguments.get("x-max-age")
        if age is not None and (not isinstance(age, str | bytes) or
                                interval_ms(age.decode() if isinstance(age, bytes) else age) is None):
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-max-age' for {what}: {age!r} is not a duration such as "
                               "7D, 12h, 30m or 10s (units Y, M, D, h, m, s)", 50, 10)
        if self.root is None:
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for {what}: streams need a data directory "
                               "(this node was started without --data-dir; see docs/streams.md)", 50, 10)
        q = self._open(vhost, name, dict(arguments), secrets.randbits(63))
        self.node.add_queue(vhost, q)
        return q

    def _open(self, vhost: VirtualHost, name: str, arguments: dict[str, Any], stream_id: int) -> StreamQueue:
        root = self.root
        assert root is not None
        seg_bytes = arguments.get("x-stream-max-segment-size-bytes")
        filter_bytes = arguments.get("x-stream-filter-size-bytes")
        options = StreamOptions(max_segment_size_bytes=seg_bytes if isinstance(seg_bytes, int) and seg_bytes > 0
                                else DEFAULT_MAX_SEGMENT_SIZE_BYTES,
                                retention=retention_of(arguments, {}),
                                filter_size_bytes=min(255, max(16, filter_bytes)) if isinstance(filter_bytes, int)
                                else DEFAULT_FILTER_SIZE)
        handle = StreamHandle.open_now(self.fs, f"{root}/{stream_id:016x}", options=options, clock=self.clock)
        handle.placement.follow_loop(self.node.loop_load, count_busy=True)
        q = StreamQueue(vhost.name, name, arguments, handle, stream_id, self.clock)
        q.node_name = self.node.name
        return q

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        if not isinstance(op, DeclareQueue) or op.type != "stream":
            return False
        if op.gid is None:
            raise ValueError(f"stream '{op.name}' declared without its stream id")
        existing = vhost.queues.get(op.name)
        if isinstance(existing, StreamQueue) and existing.stream_id == op.gid:
            return True
        if existing is not None:
            self.node.delete_queue(vhost, existing)
        if self.root is None:
            log.error("stream '%s' in vhost '%s' cannot open: the node has no data directory", op.name, vhost.name)
            return True
        try:
            q = self._open(vhost, op.name, self.node.unpack_arguments(op.arguments), op.gid)
        except StorageError as exc:  # one damaged stream must not keep the node from starting
            log.error("stream '%s' in vhost '%s' cannot be opened and is left out (its files stay in %s): %s",
                      op.name, vhost.name, f"{self.root}/{op.gid:016x}", exc)
            self._unopened.add(f"{op.gid:016x}")
            return True
        self.node.add_queue(vhost, q, count=False)
        return True

    def record_fields(self, q: Queue) -> dict[str, Any]:
        assert isinstance(q, StreamQueue)
        return {"type": "stream", "gid": q.stream_id}

    def deleted(self, q: Queue) -> None:
        assert isinstance(q, StreamQueue)
        q.delete()
        self._spawn(q.handle.delete())

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a restore replaying a delete at boot): close it when the loop runs
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("deleting a stream's files failed: %s", task.exception())

    def recover(self) -> None:
        """Remove the directories of streams that no longer exist (deleted while the node was down)."""
        root = self.root
        if root is None or not self.fs.exists(root):
            return
        keep = {f"{q.stream_id:016x}" for _v, q in queues_of(self.node.vhosts.values()) if isinstance(q, StreamQueue)}
        keep |= self._unopened
        for name in self.fs.list_dir(root):
            if name not in keep:
                directory = f"{root}/{name}"
                for f in self.fs.list_dir(directory):
                    self.fs.delete(f"{directory}/{f}")
                self.fs.remove_dir(directory)
                log.info("removed the files of deleted stream %s", name)

    async def start(self) -> None:
        self._tick()

    def _tick(self) -> None:
        for _v, q in queues_of(self.node.vhosts.values()):
            if isinstance(q, StreamQueue) and not q.deleted and q.handle.failed is None:
                q.handle.apply_retention()
        self._timer = asyncio.get_running_loop().call_later(RETENTION_TICK_S, self._tick)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for _v, q in queues_of(self.node.vhosts.values()):
            if isinstance(q, StreamQueue):
                await q.handle.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
