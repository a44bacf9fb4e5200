"""`QueueCatalog`: the node's streams as the stream protocol sees them, which are its stream queues.

Owns: the `StreamCatalog` port (ports.py) over the broker: a stream is a queue of type stream (declared,
restored, deleted and shown by the stream queue type, runtime/queue_types/stream/), its handle the
queue's `handle`; creating one is a durable `queue.declare` with `x-queue-type: stream` and the create
arguments mapped to their x-arguments, so AMQP 0-9-1 clients and management see the same stream;
deleting one deletes the queue. On a clustered node both wait until the definition change is replicated.
On a node that is not a member of a replicated stream (its queue a stand-in that carries the stream's
group id and members), `locate` and `ask` answer from a member (`StreamLocator`, the replication
service), so the stream protocol's metadata and queries answer on every node, as RabbitMQ's do. In a
node of workers a stream has one copy per node, in its home worker; `home` names it to the node's other
workers, which read and write it over the worker link (home_link.py).

Rules (rabbit_stream_manager): `max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`,
`initial-cluster-size`, `queue-leader-locator` and `stream-filter-size-bytes` are the arguments a create
may carry; anything else, or a value the queue type refuses, is PRECONDITION_FAILED; a queue of that
name that exists (of any type) is STREAM_ALREADY_EXISTS.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp.errors import AMQPError
from hutch.runtime.ports import BrokerPort
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.stream_session.ports import (
    Members,
    StreamExists,
    StreamForwarder,
    StreamLocator,
    StreamRefused,
)
from hutch.runtime.workers.spec import node_of_worker
from hutch.streamproto.codes import Code

_INT_ARGUMENTS = {"max-length-bytes": "x-max-length-bytes",
                  "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
                  "initial-cluster-size": "x-initial-cluster-size",
                  "stream-filter-size-bytes": "x-stream-filter-size-bytes"}
_TEXT_ARGUMENTS = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}


def queue_arguments(arguments: dict[str, str]) -> dict[str, Any]:
    """A create's arguments as the x-arguments of a stream declare; StreamRefused if one is bad."""
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key in _INT_ARGUMENTS:
            try:
                out[_INT_ARGUMENTS[key]] = int(value)
            except ValueError:
                raise StreamRefused(Code.PRECONDITION_FAILED, f"invalid value {value!r} for {key}") from None
        elif key in _TEXT_ARGUMENTS:
            out[_TEXT_ARGUMENTS[key]] = value
        else:
            raise StreamRefused(Code.PRECONDITION_FAILED, f"unknown stream argument {key}")
    return out


class QueueCatalog:
    def __init__(self, broker: BrokerPort, locator: StreamLocator | None = None) -> None:
        self.broker = broker
        self.locator = locator  # a clustered node's replication service

    def _queue(self, vhost: str, name: str) -> Any:
        v = self.broker.vhosts.get(vhost)
        return None if v is None else v.queues.get(name)

    def lookup(self, vhost: str, name: str) -> StreamHandle | None:
        handle = getattr(self._queue(vhost, name), "handle", None)
        return handle if isinstance(handle, StreamHandle) else None

    def members(self, vhost: str, name: str) -> Members | None:
        """A replicated stream's (this node, its writer's node, [(member node, its stream listener)]);
        None for a stream of this node only."""
        replication = getattr(self._queue(vhost, name), "replication", None)
        return None if replication is None else replication.nodes()

    def forwarder(self, vhost: str, name: str) -> StreamForwarder | None:
        """A replicated stream's route to its writer (its queue's `replication`); None for a stream of this
        node only."""
        replication = getattr(self._queue(vhost, name), "replication", None)
        return None if replication is None else replication

    def _group(self, vhost: str, name: str) -> tuple[int, tuple[str, ...]] | None:
        """(group id, members) of another node's replicated stream held here as a stand-in."""
        group = getattr(self._queue(vhost, name), "stream_group", None)
        return group if self.locator is not None else None

    def elsewhere(self, vhost: str, name: str) -> bool:
        return self._group(vhost, name) is not None

    def home(self, vhost: str, name: str) -> str | None:
        """The worker of this node that holds stream `name`'s one copy on the node, when this worker holds
        none (a stand-in): the stream's member that is a worker of this node (None: the stream is this
        worker's, or no worker of this node holds it)."""
        group = self._group(vhost, name)
        if group is None:
            return None
        here = self.broker.name
        node = node_of_worker(here)
        return next((m for m in group[1] if m != here and node_of_worker(m) == node), None)

    async def locate(self, vhost: str, name: str) -> Members | None:
        group, locator = self._group(vhost, name), self.locator
        if group is None or locator is None:
            return None
        gid, members = group
        writer = await locator.lookup(gid, members, "writer")
        writer = writer if isinstance(writer, str) and writer in members else None
        order = ([writer] if writer is not None else []) + [m for m in members if m != writer]
        return self.broker.name, writer, [(m, locator.endpoint_of(m)) for m in order]

    async def ask(self, vhost: str, name: str, what: str, reference: str) -> Any:
        group, locator = self._group(vhost, name), self.locator
        if group is None or locator is None:
            return None
        return await locator.lookup(group[0], group[1], what, reference.encode())

    def is_stream(self, vhost: str, name: str) -> bool:
        q = self._queue(vhost, name)
        return q is not None and q.queue_type == "stream"

    async def create(self, vhost: str, name: str, arguments: dict[str, str]) -> None:
        v = self.broker.vhosts.get(vhost)
        if v is None:
            raise StreamRefused(Code.VIRTUAL_HOST_ACCESS_FAILURE, f"vhost {vhost} does not exist")
        if name in v.queues:
            raise StreamExists(f"there is already a queue named {name}")
        try:
            self.broker.declare_queue(v, name, True, False, False, queue_arguments(arguments), None)
        except AMQPError as exc:
            raise StreamRefused(Code.PRECONDITION_FAILED, exc.text) from None
        await self._replicated()

    async def delete(self, vhost: str, name: str) -> bool:
        v = self.broker.vhosts.get(vhost)
        q = None if v is None else v.queues.get(name)
        if v is None or q is None or q.queue_type != "stream":
            return False
        self.broker.delete_queue(v, q)
        await self._replicated()
        return True

    async def _replicated(self) -> None:
        if self.broker.cluster is not None and not self.broker.in_group():  # (else: at the group's end)
            await self.broker.cluster.wait_replicated()
            # every connected member (every worker of a node) has it too: a client that creates a stream
            # here and publishes through another worker finds it there (its copy is this worker's alone)
            await self.broker.cluster.sync_peers()
