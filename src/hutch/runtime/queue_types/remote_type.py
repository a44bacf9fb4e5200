"""Queues whose home is another node, as the broker sees them (the stand-ins of `remote.py`).

Owns: applying `queue.declare` records of queues that live on another node of the cluster: a
`RemoteQueue` stand-in here, so routing, permissions and exclusivity work as for a local queue. Clients
never declare this type: a declare on this node makes a queue of this node.

Rules:
- When two nodes declared the same name at once, the record that arrives last wins and the other
  queue is deleted here (logged).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.queue_type import Queue
from hutch.runtime.queue_types.base import QueueTypeDefaults
from hutch.runtime.queue_types.remote import QueueLink, RemoteQueue

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node

log = logging.getLogger("hutch.node")


class RemoteQueueType(QueueTypeDefaults):
    name = "remote"
    declarable = False

    def __init__(self, node: Node, link: QueueLink) -> None:
        self.node = node
        self.link = link

    def owns(self, q: Queue) -> bool:
        return isinstance(q, RemoteQueue)

    def declare(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], owner: object) -> Queue:
        raise ChannelError(PRECONDITION_FAILED, "remote queues are declared on their home node")

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        if not isinstance(op, DeclareQueue):
            return False
        home = op.node or self.node.name
        if home == self.node.name:
            return False
        existing = vhost.queues.get(op.name)
        if existing is not None:
            if getattr(existing, "home", None) == home:
                return True
            log.warning("queue '%s' in vhost '%s' was declared on %s and here at once; %s's wins",
                        op.name, vhost.name, home, home)
            self.node.delete_queue(vhost, existing)
        q = RemoteQueue(self.link, home, vhost.name, op.name, op.durable, op.exclusive, op.auto_delete,
                        self.node.unpack_arguments(op.arguments))
        self.node.add_queue(vhost, q, count=False)
        return True

    def record_fields(self, q: Queue) -> dict[str, Any]:
        assert isinstance(q, RemoteQueue)
        return {"node": q.home}
