"""The `MethodGate` of a clustered node: which channel methods wait for the cluster, and for what.

Owns: the choice of methods that go through the cluster (topology methods, which need the metadata
read barrier and the commit of their change; basic.get, queue.purge and basic.consume on a queue that
lives on another node, which fetch their answer first; basic.cancel of a quorum queue's consumer,
whose cancel-ok waits for the commit), and the waits themselves, delegated to the node's cluster
service. The connection only sees the `MethodGate` port (runtime/session/ports.py).

Rules: the cluster service is reached through `node.cluster`, read on every call (a node may gain
its cluster service after connections exist); nothing here touches the connection's buffers.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp import spec
from hutch.runtime.errors import CLUSTER_METHODS

# basic.get, queue.purge, basic.consume: asynchronous first when the queue lives on another node;
# basic.cancel of a quorum queue's consumer: cancel-ok once the cancel is committed
REMOTE_QUEUE_METHODS = frozenset({(60, 70), (50, 30), (60, 20), (60, 30)})


class ClusterGate:
    """`MethodGate` backed by the node's cluster service; wants nothing on a node without one."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def wants(self, channel: Any, method: spec.Method) -> bool:
        if self.node.cluster is None:
            return False
        key = (method.CLASS_ID, method.METHOD_ID)
        return key in CLUSTER_METHODS or (key in REMOTE_QUEUE_METHODS and _remote_target(channel, method))

    async def barrier(self, method: spec.Method) -> None:
        if (method.CLASS_ID, method.METHOD_ID) in CLUSTER_METHODS:
            await self.node.cluster.barrier()

    async def prepare(self, channel: Any, method: spec.Method) -> None:
        remote = _remote_target(channel, method)
        if remote is not None and not isinstance(method, (spec.Queue.Bind, spec.Queue.Unbind)):
            await remote.prepare(method)

    def holds_replies(self) -> bool:
        cluster = self.node.cluster
        return cluster is not None and cluster.has_unreplicated

    async def after(self) -> None:
        cluster = self.node.cluster
        await cluster.wait_replicated()
        await cluster.sync_peers()


def _remote_target(ch: Any, method: spec.Method) -> Any:
    """The queue a method names, if it lives on another node (a RemoteQueue), else None. For
    basic.cancel: the queue of the consumer, if it is a quorum queue."""
    if isinstance(method, spec.Basic.Cancel):
        consumer = ch.consumers.get(method.consumer_tag)
        q = consumer.queue if consumer is not None else None
        return q if q is not None and q.queue_type == "quorum" and q.remote else None
    name = getattr(method, "queue", None)
    if name is None:
        return None
    if name == "":
        name = ch.last_queue_name
        if name is None:
            return None
    vhost = ch.vhost
    q = vhost.queues.get(name) if vhost is not None else None
    return q if q is not None and q.remote else None
