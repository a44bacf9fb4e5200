"""Service layer and routes: runtime parameters (`/api/parameters/{component}[/{vhost}[/{name}]]`: shovel,
federation-upstream, federation-upstream-set; vhost-limits has its own routes in limits_routes.py), the
dynamic shovels' status (`/api/shovels[/{vhost}]`, `/api/shovels/vhost/{vhost}/{name}`, and its
`/restart`) and the federation links' (`/api/federation-links[/{vhost}]`).

Rules (RabbitMQ's rabbit_mgmt_wm_parameter(s) and rabbit_shovel_mgmt):
- Reading or changing a parameter: administrators, or `policymaker` users on their login vhosts (else
  401 "User not authorised to access object"); lists show what the caller may see.
- PUT body `{"value": ...}` (`[{key_missing,value}]` without it); an invalid value is a 400
  "Validation failed" with the component's texts (core/shovel.py); an unknown component is a 400.
- The user who sets a shovel is recorded: its local connections act as that user (docs/shovel.md).
- Shovel and federation status is for any management user, over the vhosts it may see, gathered from
  every running member of a cluster (`LinkStatus` requests: the links run on the metadata leader);
  `restart` needs the same rights as changing the parameter and acts on the node that runs the shovel
  only (404 elsewhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.cluster import messages as cm
from hutch.runtime.broker import parameters as runtime_parameters

from . import listing
from .access import Principal, login_vhosts
from .calls import NO_CONTENT, Call, created, route
from .cluster import cluster_service
from .errors import bad_request, not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

TAG = "parameters"
SORT = ("vhost", "component", "name")


def _may_change(node: Node, p: Principal, vhost: str) -> None:
    if not (p.is_admin or (p.is_policymaker and node.auth.can_access_vhost(p.name, vhost))):
        raise not_authorised("User not authorised to access object")
    if vhost not in node.vhosts:
        raise not_found()


def _visible(node: Node, p: Principal) -> set[str] | None:
    return None if p.is_admin else set(login_vhosts(node, p))


def list_parameters(node: Node, p: Principal, component: str, vhost: str | None = None) -> list[dict[str, Any]]:
    if vhost is not None and vhost not in node.vhosts:
        raise not_found()
    if not (p.is_admin or p.is_policymaker):
        return []
    allowed = _visible(node, p)
    return [x.to_dict() for x in node.parameters.list(component, vhost)
            if allowed is None or x.vhost in allowed]


def get_parameter(node: Node, p: Principal, component: str, vhost: str, name: str) -> dict[str, Any]:
    _may_change(node, p, vhost)
    found = node.parameters.get(component, vhost, name)
    if found is None:
        raise not_found()
    return found.to_dict()


def put_parameter(node: Node, p: Principal, component: str, vhost: str, name: str, body: Any) -> bool:
    """Set a parameter; True when it is new."""
    _may_change(node, p, vhost)
    if not isinstance(body, dict) or "value" not in body:
        raise bad_request("[{key_missing,value}]")
    new = node.parameters.get(component, vhost, name) is None
    try:
        runtime_parameters.set_parameter(node, component, vhost, name, body["value"], p.name)
    except runtime_parameters.UnknownComponent:
        raise bad_request(f"Validation failed\n\ncomponent {component} not found\n") from None
    except ValueError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None
    return new


def delete_parameter(node: Node, p: Principal, component: str, vhost: str, name: str) -> None:
    _may_change(node, p, vhost)
    if not runtime_parameters.clear_parameter(node, component, vhost, name):
        raise not_found()


def _own_links(node: Node, what: str, vhost: str | None) -> list[dict[str, Any]]:
    service = node.shovels if what == "shovels" else node.federation
    return list(service.status(vhost)) if service is not None else []


def serve_link_status(node: Node) -> None:
    """Let the other nodes of a cluster ask this one for the shovels and federation links it runs."""
    cluster = cluster_service(node)
    if cluster is not None:
        cluster.register(cm.LinkStatus, lambda _peer, req: _own_links(node, req.what, req.vhost or None))


async def _links(node: Node, p: Principal, what: str, vhost: str | None) -> list[dict[str, Any]]:
    """This node's links and every other running member's (they run on the metadata leader, wherever that is)."""
    if vhost is not None and vhost not in node.vhosts:
        raise not_found()
    found = _own_links(node, what, vhost)
    cluster = cluster_service(node)
    if cluster is not None:
        for member in cluster.machine.members:
            if member == node.name or not cluster.transport.connected(member):
                continue
            try:
                found += await cluster.call(member, cm.LinkStatus(what, vhost or ""), timeout=2.0)
            except Exception:  # noqa: BLE001 - a member that does not answer runs none we can show
                continue
    allowed = _visible(node, p)
    return [s for s in found if allowed is None or s["vhost"] in allowed]


async def shovel_status(node: Node, p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    return await _links(node, p, "shovels", vhost)


def restart_shovel(node: Node, p: Principal, vhost: str, name: str) -> None:
    _may_change(node, p, vhost)
    if node.shovels is None or not node.shovels.restart(vhost, name):
        raise not_found()


async def federation_links(node: Node, p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    """RabbitMQ's /api/federation-links: the links of every running node, over the vhosts the caller may see."""
    return await _links(node, p, "federation", vhost)


# -- routes ----------------------------------------------------------------------------------------------


@route("GET", "/api/parameters/{component}", "Runtime parameters of a component (shovel)", tag=TAG,
       reply="Any[]", listing=True)
def _list_component(c: Call) -> Any:
    return listing.list_reply(list_parameters(c.node, c.principal, c.params["component"]), c.query, SORT)


@route("GET", "/api/parameters/{component}/{vhost}", "Runtime parameters of a component in a vhost", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
def _list_vhost(c: Call) -> Any:
    found = list_parameters(c.node, c.principal, c.params["component"], c.params["vhost"])
    return listing.list_reply(found, c.query, SORT)


@route("GET", "/api/parameters/{component}/{vhost}/{name}", "One runtime parameter", tag=TAG, reply="Any",
       codes=(401, 404))
def _get(c: Call) -> Any:
    return get_parameter(c.node, c.principal, c.params["component"], c.params["vhost"], c.params["name"])


@route("PUT", "/api/parameters/{component}/{vhost}/{name}",
       "Set a runtime parameter: {\"value\": {...}} (a shovel's definition)", tag=TAG, body="Any",
       codes=(201, 204, 400, 401, 404))
def _put(c: Call) -> Any:
    return created(put_parameter(c.node, c.principal, c.params["component"], c.params["vhost"], c.params["name"],
                                 c.body))


@route("DELETE", "/api/parameters/{component}/{vhost}/{name}", "Clear a runtime parameter (a shovel stops)",
       tag=TAG, codes=(204, 401, 404))
def _delete(c: Call) -> Any:
    delete_parameter(c.node, c.principal, c.params["component"], c.params["vhost"], c.params["name"])
    return NO_CONTENT


@route("GET", "/api/shovels", "Dynamic shovels and their state (running, starting, terminated)", tag="shovels",
       reply="Any[]", listing=True)
async def _shovels(c: Call) -> Any:
    return listing.list_reply(await shovel_status(c.node, c.principal), c.query, ("vhost", "name"))


@route("GET", "/api/shovels/vhost/{vhost}/{name}", "One dynamic shovel's state", tag="shovels", reply="Any",
       codes=(404,))
async def _one_shovel(c: Call) -> Any:
    for s in await shovel_status(c.node, c.principal, c.params["vhost"]):
        if s["name"] == c.params["name"]:
            return listing.one_reply(s, c.query)
    raise not_found()


@route("DELETE", "/api/shovels/vhost/{vhost}/{name}/restart", "Restart a dynamic shovel", tag="shovels",
       codes=(204, 401, 404))
def _restart(c: Call) -> Any:
    restart_shovel(c.node, c.principal, c.params["vhost"], c.params["name"])
    return NO_CONTENT


@route("GET", "/api/shovels/{vhost}", "Dynamic shovels of a vhost", tag="shovels", reply="Any[]", listing=True,
       codes=(404,))
async def _vhost_shovels(c: Call) -> Any:
    return listing.list_reply(await shovel_status(c.node, c.principal, c.params["vhost"]), c.query,
                              ("vhost", "name"))


@route("GET", "/api/federation-links", "Federation links and their status (running, starting, error)",
       tag="federation", reply="Any[]", listing=True)
async def _federation_links(c: Call) -> Any:
    return listing.list_reply(await federation_links(c.node, c.principal), c.query, ("vhost", "id"))


@route("GET", "/api/federation-links/{vhost}", "Federation links of a vhost", tag="federation", reply="Any[]",
       listing=True, codes=(404,))
async def _vhost_federation_links(c: Call) -> Any:
    return listing.list_reply(await federation_links(c.node, c.principal, c.params["vhost"]), c.query,
                              ("vhost", "id"))


__all__ = ["delete_parameter", "federation_links", "serve_link_status", "get_parameter", "list_parameters", "put_parameter", "restart_shovel",
           "shovel_status"]
