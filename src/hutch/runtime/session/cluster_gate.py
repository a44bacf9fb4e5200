"""The `MethodGate` of a clustered node: which channel methods wait for the cluster, and for what.

Owns: the choice of methods that go through the cluster (topology methods, which need the metadata
read barrier and the commit of their change; basic.get, queue.purge and basic.consume on a queue that
lives on another node, which fetch their answer first (and basic.consume-ok waits for the home to
have registered the consumer); basic.cancel of a quorum queue's consumer,
whose cancel-ok waits for the commit; basic.get and queue.declare after a reject that went to another
node, which wait until that reject's dead letter is in its queue), and the waits themselves, delegated to the node's cluster
service. The connection only sees the `MethodGate` port (runtime/session/ports.py).

Rules: the gate is one per connection (runtime/session/protocol.py), so what `prepare` notes for the
method in hand is read back by `holds_replies` and `after` of the same method; the cluster service is reached through `node.cluster`, read on every call (a node may gain
its cluster service after connections exist); nothing here touches the connection's buffers.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp import spec
from hutch.runtime.errors import CLUSTER_METHODS

# basic.get, queue.purge, basic.consume: asynchronous first when the queue lives on another node;
# basic.cancel of a quorum queue's consumer: cancel-ok once the cancel is committed
BASIC_GET = (60, 70)
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."
REMOTE_QUEUE_METHODS = frozenset({(60, 70), (50, 30), (60, 20), (60, 30)})


class ClusterGate:
    """`MethodGate` backed by the node's cluster service; wants nothing on a node without one."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self._consume_target: Any = None  # the remote queue of the basic.consume being handled
        self._held_consume: Any = None  # ... whose consume-ok waits for its home
        self._held_commit = False
        self._queue_link: Any = None

    def wants(self, channel: Any, method: spec.Method) -> bool:
        if self.node.cluster is None:
            return False
        key = (method.CLASS_ID, method.METHOD_ID)
        if key == BASIC_GET and self._link() is not None and self._link().discards_pending():
            return True
        return key in CLUSTER_METHODS or (key in REMOTE_QUEUE_METHODS and _remote_target(channel, method))

    def _link(self) -> Any:
        """The node's queue link (runtime/queue_types/remote.py), through the remote queue type."""
        if self._queue_link is None:
            for t in self.node.queue_types:
                if t.name == "remote":
                    self._queue_link = t.link
        return self._queue_link

    async def barrier(self, method: spec.Method) -> None:
        if (method.CLASS_ID, method.METHOD_ID) in CLUSTER_METHODS:
            await self.node.cluster.barrier()

    async def prepare(self, channel: Any, method: spec.Method) -> None:
        if isinstance(method, (spec.Basic.Get, spec.Queue.Declare)) and self._link() is not None:
            await self._link().discards_applied()  # the dead letters of earlier rejects are in their queues
        if isinstance(method, spec.Queue.Declare) and method.queue.startswith(REPLY_TO_PREFIX) \
                and method.queue[len(REPLY_TO_PREFIX):] not in self.node.reply_channels and self._link() is not None:
            channel.prepared_reply_token = await self._link().reply_token_alive(method.queue)
        remote = _remote_target(channel, method)
        if remote is not None and not isinstance(method, (spec.Queue.Bind, spec.Queue.Unbind)):
            await remote.prepare(method)
        # a classic queue in another worker or node (a quorum queue's consumer is registered through its log)
        self._consume_target = remote if isinstance(method, spec.Basic.Consume) \
            and hasattr(remote, "take_consume_sent") else None

    def holds_replies(self) -> bool:
        cluster = self.node.cluster
        target, self._consume_target = self._consume_target, None
        self._held_consume = target if target is not None and target.take_consume_sent() else None
        self._held_commit = cluster is not None and cluster.has_unreplicated
        return self._held_commit or self._held_consume is not None

    async def after(self) -> None:
        consume, self._held_consume = self._held_consume, None
        if self._held_commit:
            cluster = self.node.cluster
            await cluster.wait_replicated()
            await cluster.sync_peers()
        if consume is not None:  # last: the held replies go out in the same turn as it returns, before the
            await consume.consumer_registered()  # deliveries it held (they follow in the next turn)


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
