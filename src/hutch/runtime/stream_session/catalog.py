"""`QueueCatalog`: the node's streams as the stream protocol sees them, which are its stream queues.

Owns: the `StreamCatalog` port (ports.py) over the broker: a stream is a queue of type stream (declared,
restored, deleted and shown by the stream queue type, runtime/queue_types/stream/), its handle the
queue's `handle`; creating one is a durable `queue.declare` with `x-queue-type: stream` and the create
arguments mapped to their x-arguments, so AMQP 0-9-1 clients and management see the same stream;
deleting one deletes the queue. On a clustered node both wait until the definition change is replicated.

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
from hutch.runtime.stream_session.ports import Members, StreamExists, StreamForwarder, StreamRefused
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
    def __init__(self, broker: BrokerPort) -> None:
        self.broker = broker

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
        if self.broker.cluster is not None:
            await self.broker.cluster.wait_replicated()
