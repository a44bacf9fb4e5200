"""The routes of quorum queue operations (hutch extensions, administrator only): thin handlers over
quorum.py, registered in the route table like routes.py's (http.py imports this module), and `serve`,
which http.py calls at start-up so that the other nodes can ask this one what these routes need.

Membership changes are not in http.py's NO_BARRIER: like every change they take a metadata read
barrier first (the member list is metadata), and they also need a quorum of the queue's own members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import quorum
from .calls import NO_CONTENT, Call, route

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

TAG = "quorum-queues"


def serve(node: Node) -> None:
    """Answer the other nodes' quorum queue requests (a member's view, a leader transfer)."""
    quorum.serve(node)


@route("GET", "/api/queues/{vhost}/{name}/quorum-status", "A quorum queue's members: Raft role, term, log "
       "indexes, replication (hutch-queues quorum_status; hutch)", tag=TAG, reply="Any[]", codes=(400, 404))
async def _quorum_status(c: Call) -> Any:
    return await quorum.quorum_status(c.node, c.principal, c.params["vhost"], c.params["name"])


@route("POST", "/api/queues/{vhost}/{name}/members", "Add a member to a quorum queue: {\"node\": NODE} "
       "(hutch-queues add_member; hutch)", tag=TAG, body="Any", reply="Any", codes=(400, 404, 503))
async def _add_member(c: Call) -> Any:
    return await quorum.add_member(c.node, c.principal, c.params["vhost"], c.params["name"], c.body)


@route("DELETE", "/api/queues/{vhost}/{name}/members/{node}", "Remove a member from a quorum queue "
       "(hutch-queues delete_member; hutch)", tag=TAG, codes=(204, 400, 404, 503))
async def _delete_member(c: Call) -> Any:
    await quorum.delete_member(c.node, c.principal, c.params["vhost"], c.params["name"], c.params["node"])
    return NO_CONTENT


@route("POST", "/api/quorum-queues/grow", "Add a node to every matching quorum queue: {\"node\", \"strategy\": "
       "\"all\"|\"even\", \"vhost_pattern\", \"queue_pattern\"} (hutch-queues grow; hutch)", tag=TAG, body="Any",
       reply="Any[]", codes=(400, 404, 503))
async def _grow(c: Call) -> Any:
    return await quorum.grow(c.node, c.principal, c.body)


@route("POST", "/api/quorum-queues/shrink", "Remove a node from every quorum queue: {\"node\", \"errors_only\"} "
       "(hutch-queues shrink; hutch)", tag=TAG, body="Any", reply="Any[]", codes=(400, 404, 503))
async def _shrink(c: Call) -> Any:
    return await quorum.shrink(c.node, c.principal, c.body)


@route("POST", "/api/quorum-queues/rebalance", "Move quorum queue leaders so every node leads about as many: "
       "{\"vhost_pattern\", \"queue_pattern\"} (hutch-queues rebalance; hutch)", tag=TAG, body="Any",
       reply="Any", codes=(400,))
async def _rebalance(c: Call) -> Any:
    return await quorum.rebalance(c.node, c.principal, c.body)
