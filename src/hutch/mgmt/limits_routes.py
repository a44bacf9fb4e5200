"""The routes of vhost and user limits: thin handlers over limits.py, registered in the route table like
routes.py's (http.py imports this module). RabbitMQ's paths: `/api/vhost-limits[/{vhost}[/{name}]]`,
`/api/user-limits[/{user}[/{name}]]`, and the vhost-limits runtime parameter
`/api/parameters/vhost-limits/{vhost}/limits` (the whole document at once; what hutchctl
set_vhost_limits/clear_vhost_limits use). Other runtime parameter components are not served.
"""

from __future__ import annotations

from typing import Any

from . import limits, listing
from .calls import NO_CONTENT, Call, route
from .errors import bad_request, not_found

TAG = "limits"
VHOST_COMPONENT = "vhost-limits"


@route("GET", "/api/vhost-limits", "Every visible vhost's limits", tag=TAG, reply="Any[]", listing=True)
def _vhost_limits(c: Call) -> Any:
    return listing.list_reply(limits.list_vhost_limits(c.node, c.principal), c.query, ("vhost",))


@route("GET", "/api/vhost-limits/{vhost}", "A vhost's limits", tag=TAG, reply="Any[]", listing=True,
       codes=(404,))
def _one_vhost_limits(c: Call) -> Any:
    return listing.list_reply(limits.list_vhost_limits(c.node, c.principal, c.params["vhost"]), c.query, ("vhost",))


@route("PUT", "/api/vhost-limits/{vhost}/{name}", "Set one limit of a vhost: {\"value\": N} (administrators)",
       tag=TAG, body="Any", codes=(204, 400, 404))
def _put_vhost_limit(c: Call) -> Any:
    limits.put_vhost_limit(c.node, c.principal, c.params["vhost"], c.params["name"], c.body)
    return NO_CONTENT


@route("DELETE", "/api/vhost-limits/{vhost}/{name}", "Clear one limit of a vhost (administrators)", tag=TAG,
       codes=(204, 404))
def _delete_vhost_limit(c: Call) -> Any:
    limits.delete_vhost_limit(c.node, c.principal, c.params["vhost"], c.params["name"])
    return NO_CONTENT


@route("GET", "/api/parameters/vhost-limits/{vhost}/limits", "A vhost's limits as RabbitMQ's runtime parameter",
       tag=TAG, reply="Any", codes=(404,))
def _get_vhost_parameter(c: Call) -> Any:
    vhost = c.params["vhost"]
    found = limits.list_vhost_limits(c.node, c.principal, vhost)
    if not found:
        raise not_found()
    return {"vhost": vhost, "component": VHOST_COMPONENT, "name": "limits", "value": found[0]["value"]}


@route("PUT", "/api/parameters/vhost-limits/{vhost}/limits",
       "Replace every limit of a vhost: {\"value\": {name: N}} (administrators)", tag=TAG, body="Any",
       codes=(204, 400, 404))
def _put_vhost_parameter(c: Call) -> Any:
    body = c.body
    value = body.get("value") if isinstance(body, dict) else None
    if value is None:
        raise bad_request("[{key_missing,value}]")
    limits.set_vhost_limits(c.node, c.principal, c.params["vhost"], value)
    return NO_CONTENT


@route("DELETE", "/api/parameters/vhost-limits/{vhost}/limits", "Clear every limit of a vhost (administrators)",
       tag=TAG, codes=(204, 404))
def _delete_vhost_parameter(c: Call) -> Any:
    limits.set_vhost_limits(c.node, c.principal, c.params["vhost"], {})
    return NO_CONTENT


@route("GET", "/api/user-limits", "Every user's limits (administrators)", tag=TAG, reply="Any[]", listing=True)
def _user_limits(c: Call) -> Any:
    return listing.list_reply(limits.list_user_limits(c.node, c.principal), c.query, ("user",))


@route("GET", "/api/user-limits/{user}", "A user's limits (administrators, monitors, the user itself)", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
def _one_user_limits(c: Call) -> Any:
    return listing.list_reply(limits.list_user_limits(c.node, c.principal, c.params["user"]), c.query, ("user",))


@route("PUT", "/api/user-limits/{user}/{name}", "Set one limit of a user: {\"value\": N} (administrators)",
       tag=TAG, body="Any", codes=(204, 400, 404))
def _put_user_limit(c: Call) -> Any:
    limits.put_user_limit(c.node, c.principal, c.params["user"], c.params["name"], c.body)
    return NO_CONTENT


@route("DELETE", "/api/user-limits/{user}/{name}", "Clear one limit of a user, or `all` of them (administrators)",
       tag=TAG, codes=(204, 404))
def _delete_user_limit(c: Call) -> Any:
    limits.delete_user_limit(c.node, c.principal, c.params["user"], c.params["name"])
    return NO_CONTENT
