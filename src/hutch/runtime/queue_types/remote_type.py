"""Queues whose home is another node, as the broker sees them (the stand-ins of `remote.py`).

Owns: applying `queue.declare` records of queues that live on another node of the cluster: a
`RemoteQueue` stand-in here, so routing, permissions and exclusivity work as for a local queue. Clients
never declare this type: a declare on this node makes a queue of this node.

Also owns the placement of a node's worker processes (docs/scaling.md): `place_on_fewest` puts a new
non-exclusive classic queue on the worker with the fewest queues (`fewest_queues`, pure) by
declaring it here as a stand-in whose record names that worker as its home; the home worker makes the
queue when it applies the record (`ClassicQueueType.restore`). The record is what keeps a durable queue
there across restarts (a transient one is gone with its worker's restart, as with a node's).

Rules:
- When two nodes declared the same name at once, the record that arrives last wins and the other
  queue is dropped here (logged); its bindings stay (they name the queue). A record that moves a queue
  to another worker (compaction of load) replaces the copy or stand-in here the same way, quietly.
- Placement counts the queues each running worker is home to (in every vhost), ties going to the
  lower name; a worker that is down is never chosen. The management API's aliveness test queue
  (`ALIVENESS_QUEUE`) stays in the worker that declares it: the check publishes to it and reads the
  message back at once, in the worker that answers the API (RabbitMQ's checks the node it asks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError
from hutch.core.definition_ops import DeclareQueue, SetQueueMembers
from hutch.core.queue_type import Queue
from hutch.runtime.queue_types.base import QueueTypeDefaults
from hutch.runtime.queue_types.remote import QueueLink
from hutch.runtime.queue_types.remote_queue import RemoteQueue
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node

log = logging.getLogger("hutch.node")

ALIVENESS_QUEUE = "aliveness-test"  # GET /api/aliveness-test's queue (mgmt/system.py), never placed elsewhere


def fewest_queues(here: str, candidates: Iterable[str], homes: Iterable[str]) -> str:
    """The candidate home to the fewest of `homes` (one entry per queue: its home), the lower name on a
    tie; `here` is always a candidate."""
    counts = dict.fromkeys({here, *candidates}, 0)
    for home in homes:
        if home in counts:
            counts[home] += 1
    return min(counts, key=lambda name: (counts[name], name))


def stream_home(q: Queue, here: str, node: str) -> str | None:
    """The worker of node `node` that holds stream `q`'s copy: `here` for a stream of this worker, the
    stream's member of `node` for a stand-in of one; None for any other queue (or a stream of other nodes)."""
    if isinstance(q, RemoteQueue):
        group = q.stream_group
        return None if group is None else next((m for m in group[1] if node_of_worker(m) == node), None)
    return here if q.queue_type == "stream" else None


class RemoteQueueType(QueueTypeDefaults):
    name = "remote"
    declarable = False

    def __init__(self, node: Node, link: QueueLink) -> None:
        self.node = node
        self.link = link
        # compaction of load (runtime/compaction.py): told of every record naming another worker as a queue's
        # home (vhost, queue, home), before it is applied: a move's commit
        self.on_record: Callable[[str, str, str], None] | None = None

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
        if self.on_record is not None:
            self.on_record(vhost.name, op.name, home)
        existing = vhost.queues.get(op.name)
        if isinstance(existing, RemoteQueue) and existing.home == home:
            existing.stream_group = _stream_group(op, home)  # (a member added or removed elsewhere)
            return True
        q = RemoteQueue(self.link, home, vhost.name, op.name, op.durable, op.exclusive, op.auto_delete,
                        self.node.unpack_arguments(op.arguments))
        q.stream_group = _stream_group(op, home)
        if existing is not None:
            self._rehome(vhost, existing, q)
            return True
        self.node.add_queue(vhost, q, count=False)
        return True

    def _rehome(self, vhost: VirtualHost, existing: Queue, q: RemoteQueue) -> None:
        """The record names another home for a queue this worker holds (a copy of its own, or a stand-in for
        another home): `q`, the new stand-in, takes its place, its bindings kept (they name the queue, not
        its copy). A stand-in's home moved (compaction of load, runtime/compaction.py): its consumers here
        get basic.cancel and consume again from the new home, quietly. A copy of its own here: two declares
        raced, or a move committed while this worker was down; the record's home wins (logged)."""
        if existing.remote:
            assert isinstance(existing, RemoteQueue)
            existing.home_down()  # its consumers cancelled (basic.cancel), nothing requeued here
            # its marker to the old home, behind this worker's last publish there: the new home keeps this
            # worker's direct publishes behind the ones the old home forwards (remote_moves.py, `moved_away`)
            self.link.moves.moved_away(vhost.name, q.name, existing.home, q.home)
        else:
            log.warning("queue '%s' in vhost '%s' was declared on %s and here at once; %s's wins",
                        q.name, vhost.name, q.home, q.home)
            self.node.queue_type_of(existing).deleted(existing)
            for consumer in existing.consumers():
                existing.remove_consumer(consumer)
                consumer.channel.consumer_cancelled_by_broker(consumer)
        existing.delete()
        self.node.add_queue(vhost, q, count=False)  # in the old one's place (not a delete: no churn counted)

    def record_fields(self, q: Queue) -> dict[str, Any]:
        assert isinstance(q, RemoteQueue)
        if q.stream_group is not None:  # (another node's stream: its record as the members wrote it)
            gid, members = q.stream_group
            return {"node": q.home, "type": "stream", "gid": gid, "members": list(members)}
        return {"node": q.home}

    def place_on_fewest(self, vhost: VirtualHost, name: str, durable: bool, auto_delete: bool,
                        arguments: dict[str, Any]) -> Queue | None:
        """A new classic queue's stand-in here, homed on the running worker with the fewest queues; None
        when that is this worker (the classic type declares it here)."""
        here = self.node.name
        if name == ALIVENESS_QUEUE:
            return None
        cluster = self.link.cluster
        homes = (q.home if isinstance(q, RemoteQueue) else here
                 for vh in self.node.vhosts.values() for q in vh.queues.values())
        # over this node's own workers: a queue lives on the node where it was declared, even when the node
        # is a member of a multi-node cluster (docs/scaling.md)
        home = fewest_queues(here, cluster.siblings(), homes)
        if home == here:
            return None
        q = RemoteQueue(self.link, home, vhost.name, name, durable, False, auto_delete, arguments)
        self.node.add_queue(vhost, q)
        return q

    def place_stream_on_fewest(self, vhost: VirtualHost, name: str, arguments: dict[str, Any],
                               stream_id: int) -> Queue | None:
        """A new stream's stand-in here, its one copy homed on the running worker of this node that holds
        the fewest streams (the leader locator `balanced` over a node's workers); None when that is this
        worker (the stream type opens it here). The home opens it from the record (`restore`)."""
        here = self.node.name
        node = node_of_worker(here)
        homes = (stream_home(q, here, node) for vh in self.node.vhosts.values() for q in vh.queues.values())
        home = fewest_queues(here, self.link.cluster.siblings(), (h for h in homes if h is not None))
        if home == here:
            return None
        q = RemoteQueue(self.link, home, vhost.name, name, True, False, False, arguments)
        q.stream_group = (stream_id, (home,))
        self.node.add_queue(vhost, q)
        return q


def _stream_group(op: DeclareQueue, home: str) -> tuple[int, tuple[str, ...]] | None:
    """A replicated stream's (group id, members) from its record; None for any other queue."""
    return (op.gid, tuple(op.members or [home])) if op.type == "stream" and op.gid is not None else None
