"""Cluster operations over HTTP: what `hutchctl cluster_status`, `join_cluster` and
`forget_cluster_node` call (hutch extensions; RabbitMQ does these through its CLI's Erlang distribution).

Owns: `GET /api/cluster-status`, `POST /api/cluster-join` {"node": "n1@host:port"} (on a node of workers
it answers `{"node", "joining", "restarting": true}` once the supervisor took it: the workers then
restart joining, and `hutchctl join_cluster` waits for the cluster status to show the join) and
`DELETE /api/cluster-nodes/{node}`, and, only when the node runs with `cluster.fault_injection = true`
(tests), `POST /api/cluster-faults` {"block": [node, ...], "unblock": [...]}, which cuts (or restores)
the inter-node link to those nodes as a network partition would. Administrator only. A node that is not clustered answers 400 with
a reason; a timeout of the metadata store (no majority) is 503.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.runtime.clustering.service import ClusterService

from .access import Principal, require_admin
from .errors import ApiError, bad_request, not_found_because

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node


def cluster_service(node: Node) -> ClusterService | None:
    """The node's cluster service as the management API uses it (members, transport, the quorum
    service); None on a node that is not clustered. The node sees it only as its `MetadataPort`."""
    cluster = node.cluster
    assert cluster is None or isinstance(cluster, ClusterService)  # app.py builds the node's only one
    return cluster


def _cluster(node: Node) -> ClusterService:
    cluster = cluster_service(node)
    if cluster is None:
        raise bad_request("this node is not clustered (it was started with --no-cluster; see docs/clustering.md)")
    return cluster


def _unavailable(exc: Exception) -> ApiError:
    return ApiError(503, "service_unavailable", f"the cluster's metadata store did not answer: {exc}")


async def status(node: Node, p: Principal) -> dict[str, Any]:
    require_admin(p)
    return await _cluster(node).status()


async def join(node: Node, p: Principal, body: Any) -> dict[str, Any]:
    require_admin(p)
    cluster = _cluster(node)
    if not isinstance(body, dict) or not isinstance(body.get("node"), str):
        raise bad_request('expected {"node": "NODE@HOST:PORT"}')
    from hutch.runtime.clustering.service import parse_seed
    from hutch.runtime.errors import ClusterUnavailable
    if node.public_name != node.name:  # a worker (0): its supervisor restarts every worker joining (docs/scaling.md)
        try:
            seed_node = await cluster.join_as_node_of_workers(body["node"])
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        except ClusterUnavailable as exc:
            raise _unavailable(exc) from None
        return {"node": node.public_name, "joining": seed_node, "restarting": True}
    try:
        parse_seed(body["node"])
        await cluster.join(body["node"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except ClusterUnavailable as exc:
        raise _unavailable(exc) from None
    return await cluster.status()


async def forget(node: Node, p: Principal, name: str) -> None:
    require_admin(p)
    cluster = _cluster(node)
    from hutch.runtime.errors import ClusterUnavailable
    try:
        await cluster.forget(name)
    except LookupError as exc:
        raise not_found_because(str(exc).strip("'\"")) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except ClusterUnavailable as exc:
        raise _unavailable(exc) from None


async def faults(node: Node, p: Principal, body: Any) -> dict[str, Any]:
    require_admin(p)
    cluster = _cluster(node)
    if not node.config.cluster_fault_injection:
        raise not_found_because("fault injection is off (cluster.fault_injection = true enables it)")
    if not isinstance(body, dict):
        raise bad_request('expected {"block": [NODE, ...], "unblock": [NODE, ...]}')
    for key, blocked in (("block", True), ("unblock", False)):
        names = body.get(key, [])
        if not isinstance(names, list):
            raise bad_request(f'"{key}" must be a list of node names')
        if names:  # a node of workers: every worker of those nodes, in every worker of this one
            await cluster.set_blocked([str(n) for n in names], blocked)
    return {"connected": sorted(cluster.transport.connected_peers())}
