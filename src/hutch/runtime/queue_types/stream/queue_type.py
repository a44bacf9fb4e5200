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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.core.arguments import validate_queue_arguments
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.policy import merged_definition
from hutch.core.queue_type import Consumer, Queue
from hutch.core.vhost import rs
from hutch.queues.stream.chunk import DEFAULT_FILTER_SIZE
from hutch.queues.stream.offset_spec import interval_ms
from hutch.runtime.broker.definitions import pack_arguments
from hutch.runtime.ports import Clock, queues_of
from hutch.runtime.queue_types.base import QueueTypeDefaults
from hutch.runtime.queue_types.quorum.queue import leader_locator
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamOptions
from hutch.runtime.queue_types.stream.queue import StreamQueue, retention_of
from hutch.runtime.workers.membership import nodes_of
from hutch.storage.errors import StorageError
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.stream_log import DEFAULT_MAX_SEGMENT_SIZE_BYTES

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService
    from hutch.runtime.queue_types.stream_replication.service import StreamReplicationService

log = logging.getLogger("hutch.stream")

RETENTION_TICK_S = 10.0
DECLARE_WAIT_S = 10.0  # a replicated stream's declare-ok waits this long (at most) for its first writer
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
        # on a clustered node (runtime/app.py): streams of more than one member are replicated
        self.cluster: ClusterService | None = None
        self.replication: StreamReplicationService | None = None
        # a worker of a lone node (runtime/app.py): a new stream whose leader locator is `balanced` goes to
        # the worker holding the fewest streams (remote_type.py's `place_stream_on_fewest`); None: here
        self.elsewhere: Callable[[VirtualHost, str, dict[str, Any], int], Queue | None] | None = None

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
        stream_id = secrets.randbits(62) + 2  # (0 and 1 are no Raft group ids)
        if self.elsewhere is not None and self._balanced_over_workers(vhost, name, arguments):
            placed = self.elsewhere(vhost, name, dict(arguments), stream_id)
            if placed is not None:  # another worker of this node holds its one copy
                return placed
        q = self._open(vhost, name, dict(arguments), stream_id, durable=False)
        members = self._choose_members(q.arguments, q.settings.effective_policy_definition)
        self.node.add_queue(vhost, q)
        if len(members) > 1:
            self._replicate(q, members, founding=True, fresh=True)
        return q

    def _choose_members(self, arguments: dict[str, Any], policy: dict[str, Any]) -> list[str]:
        """A new stream's members: `x-initial-cluster-size` of them (default: every node of the cluster,
        as RabbitMQ's streams), the writer first, where the leader locator puts it. Members are nodes: in
        a node of workers one worker per node holds the stream (its home; the node's other workers read
        and write it over the worker link, runtime/stream_session/home_link.py), so a lone node of
        workers holds one copy, in the declaring worker."""
        cluster = self.cluster
        if cluster is None or self.replication is None:
            return [self.node.name]
        nodes = len(nodes_of(cluster.machine.members)) or 1
        size = arguments.get("x-initial-cluster-size")
        size = min(size, nodes) if isinstance(size, int) and size > 0 else nodes
        if size == 1:
            return [self.node.name]
        locator = leader_locator(policy, arguments, self.node.config.queue_leader_locator)
        return cluster.choose_members(size, self._choose_writer(locator) if size > 1 else self.node.name)

    def _balanced_over_workers(self, vhost: VirtualHost, name: str, arguments: dict[str, Any]) -> bool:
        """Whether a new stream of a lone node of workers is placed by `balanced` (its policy's, else its
        argument's, else the node's leader locator): then its one copy goes to the worker with the fewest
        streams. On a multi-node cluster the members are nodes, placed by `_choose_members`."""
        cluster = self.cluster
        if cluster is None or len(nodes_of(cluster.machine.members)) > 1:
            return False
        policy = merged_definition(*self.node.policies.match_queue(vhost.name, name, "stream"))
        return leader_locator(policy, arguments, self.node.config.queue_leader_locator) == "balanced"

    def _choose_writer(self, locator: str) -> str:
        """client-local: this node; balanced: the running node that writes the fewest streams."""
        assert self.cluster is not None and self.replication is not None
        if locator != "balanced":
            return self.node.name
        running = [self.node.name, *sorted(m for m in self.cluster.machine.members
                                           if m != self.node.name and self.cluster.connected(m))]
        writes = dict.fromkeys(running, 0)
        for gid in self.replication.streams:
            writer = self.replication.writer_of(gid)
            if writer in writes:
                writes[writer] += 1
        return min(running, key=lambda m: writes[m])

    def _replicate(self, q: StreamQueue, members: list[str], *, founding: bool, fresh: bool) -> None:
        """Make `q` a member of its replicated stream (the group opened here; the member starts after a read
        barrier). A founding declare names the writer (`members[0]`) once the record is committed."""
        svc, cluster = self.replication, self.cluster
        assert svc is not None and cluster is not None
        directory = f"{self.root}/{q.stream_id:016x}"
        hosted = svc.attach(q.stream_id, tuple(members), directory, founding=founding, handle=q.handle, fresh=fresh)
        q.members = list(members)
        q.replication = svc.route(q.stream_id)
        svc.when_started(q.stream_id, lambda member: member.readers_moved.append(q.readers_moved))
        if founding:
            async def elect() -> None:
                await cluster.sync_peers()
                if not hosted.group.leader:
                    hosted.group.campaign()
                await svc.declare(q.stream_id, members[0])
                await svc.wait_writer(q.stream_id, DECLARE_WAIT_S)
            cluster.post_commit.append(elect)

    def _open(self, vhost: VirtualHost, name: str, arguments: dict[str, Any], stream_id: int,
              durable: bool = True) -> StreamQueue:
        """The stream's queue over its files; `durable=False` (a declare, a new directory): the files are
        synced with the stream's first data, not now (its record is what a restart needs)."""
        root = self.root
        assert root is not None
        if not durable:
            self.fs.make_dirs(root)  # the streams directory itself durably (a no-op once it exists)
        seg_bytes = arguments.get("x-stream-max-segment-size-bytes")
        filter_bytes = arguments.get("x-stream-filter-size-bytes")
        options = StreamOptions(max_segment_size_bytes=seg_bytes if isinstance(seg_bytes, int) and seg_bytes > 0
                                else DEFAULT_MAX_SEGMENT_SIZE_BYTES,
                                retention=retention_of(arguments, {}),
                                filter_size_bytes=min(255, max(16, filter_bytes)) if isinstance(filter_bytes, int)
                                else DEFAULT_FILTER_SIZE)
        handle = StreamHandle.open_now(self.fs, f"{root}/{stream_id:016x}", options=options, clock=self.clock,
                                       durable=durable)
        q = StreamQueue(vhost.name, name, arguments, handle, stream_id, self.clock)
        q.node_name = self.node.name
        q.members = [self.node.name]
        return q

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        if not isinstance(op, DeclareQueue) or op.type != "stream":
            return False
        if op.gid is None:
            raise ValueError(f"stream '{op.name}' declared without its stream id")
        if self.node.cluster is None:  # a node alone holds every stream its definitions name (whatever
            members = [self.node.name]  # node name they were recorded under)
        else:
            members = list(op.members or [op.node or self.node.name])
        replicated = len(members) > 1
        existing = vhost.queues.get(op.name)
        same = isinstance(existing, StreamQueue) and existing.stream_id == op.gid
        if self.node.name not in members or (replicated and self.replication is None):
            if same:  # removed from the stream's members (delete_member): its files and group go
                assert existing is not None
                self.node.delete_queue(vhost, existing)
            return False  # another node's stream: a stand-in for it (remote_type.py) takes the record
        if same:
            assert isinstance(existing, StreamQueue)
            if replicated and existing.replication is None:
                # a stream of one member grown with add_member, as the records replay after a restart: its
                # first record opened it alone, this one names its members (its group is on disk)
                assert self.cluster is not None and self.cluster.driver is not None
                on_disk = op.gid in self.cluster.driver.groups_on_disk()
                self._replicate(existing, members, founding=not on_disk, fresh=False)
                return True
            existing.members = members  # (a member added or removed elsewhere)
            return True
        # a member from the start opens the stream's group as a founder, once (then from disk); a member
        # added later (this node held a stand-in of the stream) opens it empty and catches up
        founding = existing is None
        if existing is not None:
            self.node.delete_queue(vhost, existing)
        if self.root is None:
            log.error("stream '%s' in vhost '%s' cannot open: the node has no data directory", op.name, vhost.name)
            return True
        fresh = not self.fs.exists(f"{self.root}/{op.gid:016x}")
        try:
            q = self._open(vhost, op.name, self.node.unpack_arguments(op.arguments), op.gid)
        except StorageError as exc:  # one damaged stream must not keep the node from starting
            log.error("stream '%s' in vhost '%s' cannot be opened and is left out (its files stay in %s): %s",
                      op.name, vhost.name, f"{self.root}/{op.gid:016x}", exc)
            self._unopened.add(f"{op.gid:016x}")
            return True
        self.node.add_queue(vhost, q, count=False)
        if replicated:
            assert self.cluster is not None and self.cluster.driver is not None
            on_disk = op.gid in self.cluster.driver.groups_on_disk()  # (then it recovers from disk)
            self._replicate(q, members, founding=founding and not on_disk, fresh=fresh)
        return True

    async def change_member(self, vhost: VirtualHost, q: StreamQueue, member: str, add: bool) -> None:
        """hutch-queues add_member / delete_member of a replicated stream (on a member node). Adding: the
        record names the new member first (it opens the stream's group empty), then the group's leader
        makes it a voter and a member in a new epoch; it catches up from the writer's files. Removing:
        the leader first (a new epoch; another writer if it wrote), then the record (the node drops its
        files and keeps a stand-in). ValueError for what cannot be done, as the API's 400."""
        svc, cluster = self.replication, self.cluster
        what = rs("queue", q.name, q.vhost)
        if svc is None or cluster is None:
            raise ValueError(f"{what} is on a node that is not clustered: it cannot change members")
        if add and member in q.members:
            raise ValueError(f"node '{member}' is already a member of {what}")
        if q.replication is None:
            if not add:
                raise ValueError(f"{what} has one member: delete the stream instead")
            await self._replicate_existing(q)
        if add:
            self._record_members(vhost, q, [*q.members, member])
            await cluster.wait_replicated()
            await cluster.sync_peers()
            await svc.change_member(q.stream_id, member, add=True)
        else:
            if member not in q.members:
                raise ValueError(f"node '{member}' is not a member of {what}")
            if len(q.members) <= 2:
                raise ValueError(f"{what} has {len(q.members)} members: a replicated stream keeps two at least")
            await svc.change_member(q.stream_id, member, add=False)
            self._record_members(vhost, q, [m for m in q.members if m != member])
            await cluster.wait_replicated()

    async def _replicate_existing(self, q: StreamQueue) -> None:
        """A stream of one member (this node's, declared on a cluster of one or with an initial cluster size
        of 1) becomes a replicated stream of one member before it grows: its coordinator group is founded
        here alone, epoch 1 names this node the writer over the files it has (older chunks are epoch 0),
        and the writer's recorded epoch start commits what is there (no chunk, no offset). The record
        still says one member until the first one is added, so a restart in between opens it as before
        (the group then unused)."""
        assert self.replication is not None and self.cluster is not None
        self._replicate(q, [self.node.name], founding=True, fresh=False)
        await self.cluster.wait_replicated()  # (runs the founding's election: campaign, Declare, writer)
        if not await self.replication.wait_writer(q.stream_id, DECLARE_WAIT_S):
            raise TimeoutError(f"{rs('queue', q.name, q.vhost)}: no writer of its replicated stream in time")

    def _record_members(self, vhost: VirtualHost, q: StreamQueue, members: list[str]) -> None:
        """The stream's `queue.declare` record with new members, applied here and replicated."""
        assert self.cluster is not None
        op = DeclareQueue(vhost.name, q.name, False, pack_arguments(q.arguments), members[0], True, False,
                          "stream", q.stream_id, members)
        self.node.apply_op(op)
        self.cluster.replicate(op)

    def unreplicated(self, gid: int) -> StreamHandle | None:
        """The handle of this node's stream of one member whose id is `gid`, if open (a node that is not a
        member asks for its writer, offsets and sequences: `StreamLookup`)."""
        for _v, q in queues_of(self.node.vhosts.values()):
            if isinstance(q, StreamQueue) and q.stream_id == gid and q.replication is None and not q.deleted:
                return q.handle
        return None

    def record_fields(self, q: Queue) -> dict[str, Any]:
        assert isinstance(q, StreamQueue)
        return {"type": "stream", "gid": q.stream_id, "members": list(q.members)}

    def deleted(self, q: Queue) -> None:
        assert isinstance(q, StreamQueue)
        q.delete()
        if q.replication is not None and self.replication is not None:
            self._spawn(self._delete_replicated(q))
        else:
            self._spawn(q.handle.delete())

    async def _delete_replicated(self, q: StreamQueue) -> None:
        assert self.replication is not None
        await self.replication.detach(q.stream_id, delete=True)  # (closes the member's handle)
        await q.handle.delete()

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
        if self.replication is not None:
            await self.replication.stop()
        for _v, q in queues_of(self.node.vhosts.values()):
            if isinstance(q, StreamQueue):
                await q.handle.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
