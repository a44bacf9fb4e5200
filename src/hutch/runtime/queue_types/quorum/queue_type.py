"""The quorum queue type, as the broker sees it: making, restoring and re-membering quorum queues.

Owns: the declare-time rules of quorum queues (durable, not exclusive, not auto-delete, not server-named,
no `reject-publish-dlx`; RabbitMQ's texts), choosing a new queue's members and leader, and applying
`queue.declare` / `queue.members` records of quorum queues. The queue object is `queue.py`, the node's
Raft-backed service `service.py`, membership operations `members.py`.

Rules:
- A node that is not clustered has no quorum service: a quorum declare is refused with a clear text
  after the property checks (as before the split).
- A record of a quorum queue is applied only on a clustered node; the queue's Raft group opens without
  campaigning (its leader is already known to the group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.core.arguments import validate_queue_arguments
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.queue_type import Queue
from hutch.core.vhost import rs
from hutch.runtime.queue_types.base import QueueTypeDefaults
from hutch.runtime.queue_types.quorum.queue import QuorumQueue, leader_locator

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService
    from hutch.runtime.queue_types.quorum.service import QuorumService


class QuorumQueueType(QueueTypeDefaults):
    """Message bodies live in the Raft log (the service's own bounds apply): no storage, paging or
    timers of the broker's to run."""

    name = "quorum"
    declarable = True

    def __init__(self, node: Node, cluster: ClusterService | None, service: QuorumService | None) -> None:
        self.node = node
        self.cluster = cluster
        self.service = service

    def owns(self, q: Queue) -> bool:
        return isinstance(q, QuorumQueue)

    def declare(self, vhost: VirtualHost, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], owner: object) -> Queue:
        """A new quorum queue: checked as RabbitMQ does, members chosen, its Raft group opened here; the
        other members open theirs when they apply the metadata record."""
        what = rs("queue", name, vhost.name)
        for bad, prop in ((not durable, "non-durable"), (exclusive, "exclusive-owner"),
                          (auto_delete, "auto-delete"), (name.startswith("amq.gen-"), "server-named")):
            if bad:
                raise ChannelError(PRECONDITION_FAILED, f"invalid property '{prop}' for {what}", 50, 10)
        svc, cluster = self.service, self.cluster
        if svc is None or cluster is None:
            raise ChannelError(PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for {what}: quorum queues need a clustered node "
                               "(this node was started with --no-cluster; see docs/clustering.md)", 50, 10)
        validate_queue_arguments(name, vhost.name, "quorum", arguments)
        if arguments.get("x-overflow") == "reject-publish-dlx":
            raise ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-overflow' for {what}: "
                               "'reject-publish-dlx' is not supported by quorum queues", 50, 10)
        config = self.node.config
        size = int(arguments.get("x-quorum-initial-group-size") or config.quorum_cluster_size)
        q = QuorumQueue(svc, vhost.name, name, dict(arguments), svc.new_gid(), [self.node.name])
        self.node.add_queue(vhost, q)
        locator = leader_locator(q.settings.effective_policy_definition, arguments, config.queue_leader_locator)
        q.members = cluster.choose_members(size, svc.choose_leader(locator) if size > 1 else self.node.name)
        svc.attach(q, campaign=False)
        cluster.post_commit.append(lambda: svc.elect(q))
        return q

    def restore(self, vhost: VirtualHost, op: DeclareQueue | SetQueueMembers) -> bool:
        if self.service is None:
            return False
        if isinstance(op, SetQueueMembers):
            q = vhost.queues.get(op.name)
            if not isinstance(q, QuorumQueue):
                return False
            self.service.members_changed(q, list(op.members))
            return True
        if op.type != "quorum":
            return False
        if op.gid is None or op.members is None:
            raise ValueError(f"quorum queue '{op.name}' declared without its group id or members")
        existing = vhost.queues.get(op.name)
        if existing is not None:
            if getattr(existing, "gid", None) == op.gid:
                return True
            self.node.delete_queue(vhost, existing)
        q = QuorumQueue(self.service, vhost.name, op.name, self.node.unpack_arguments(op.arguments),
                        op.gid, list(op.members))
        self.node.add_queue(vhost, q, count=False)
        # a one-member queue of this node (every quorum queue of a cluster of one) has no one to wait
        # for: it elects itself now rather than after an election timeout (after a restart, too)
        self.service.attach(q, campaign=list(op.members) == [self.node.name])
        return True

    def record_fields(self, q: Queue) -> dict[str, Any]:
        assert isinstance(q, QuorumQueue)
        return {"type": "quorum", "gid": q.gid, "members": list(q.members)}

    def redeclared(self, q: Queue) -> None:
        assert isinstance(q, QuorumQueue)
        q.touch()  # a redeclare is a use: x-expires restarts
