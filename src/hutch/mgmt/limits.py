"""Service layer: vhost limits (`/api/vhost-limits`) and user limits (`/api/user-limits`), as the
management API and hutchctl see them.

Owns: listing, setting and clearing limits on behalf of an authenticated `Principal`. Functions return
JSON-able data and raise `ApiError`. No IO, no awaiting; validation is `hutch.core.limits`, recording
and enforcing `hutch.runtime.broker.limits`.

Rules (RabbitMQ 4.x's rabbit_mgmt_wm_limits / _limit / _user_limits / _user_limit):
- `GET /api/vhost-limits[/{vhost}]`: users who can see the vhost (administrators and monitors all of
  them); items `{"vhost": V, "value": {name: N}}`, only vhosts that have a limit. A missing vhost is 404.
- `GET /api/user-limits`: administrators; `GET /api/user-limits/{user}`: administrators, monitors or
  the user itself; items `{"user": U, "value": {...}}`. A missing user is 404.
- `PUT .../{name}` with `{"value": N}` sets one limit, keeping the others; `DELETE .../{name}`
  removes one (user limits: the name `all` removes every one). Administrators only. A missing body
  key is 400 `[{key_missing,value}]`; a bad name or value 400 with RabbitMQ's validation text
  ("Validation failed" and the reason, for vhost limits, as rabbit_runtime_parameters says it).
  A missing vhost is 404 `vhost_not_found`, a missing user 404 `user_not_found`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.core import limits as core
from hutch.runtime.broker import limits as runtime_limits

from .access import Principal, require_admin, require_monitor, vhost_for_read, visible_vhosts
from .errors import bad_request, not_found, not_found_because

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node


def _item(key: str, owner: str, value: dict[str, int]) -> dict[str, Any]:
    return {key: owner, "value": value}


# -- vhost limits -----------------------------------------------------------------------------------


def list_vhost_limits(node: Node, p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    if vhost is not None:
        vhost_for_read(node, p, vhost)
        value = node.limits.vhost(vhost)
        return [_item("vhost", vhost, value)] if value else []
    visible = set(visible_vhosts(node, p))
    return [_item("vhost", v, value) for v, value in node.limits.iter_vhosts() if v in visible]


def _value(body: Any) -> Any:
    if not isinstance(body, dict):
        raise bad_request("not_json")
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    return body["value"]


def put_vhost_limit(node: Node, p: Principal, vhost: str, name: str, body: Any) -> None:
    """Set one limit of a vhost (RabbitMQ's update_limit: the others stay)."""
    require_admin(p)
    if vhost not in node.vhosts:
        raise not_found_because("vhost_not_found")
    value = _value(body)
    try:
        limits = core.validate_vhost_limits(node.limits.vhost(vhost) | {name: value})
    except core.LimitError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None
    runtime_limits.set_vhost_limits(node, vhost, limits)


def delete_vhost_limit(node: Node, p: Principal, vhost: str, name: str) -> None:
    """Clear one limit of a vhost (clearing one it does not have is fine, as RabbitMQ)."""
    require_admin(p)
    if vhost not in node.vhosts:
        raise not_found_because("vhost_not_found")
    limits = node.limits.vhost(vhost)
    limits.pop(name, None)
    runtime_limits.set_vhost_limits(node, vhost, limits)


def set_vhost_limits(node: Node, p: Principal, vhost: str, doc: Any) -> None:
    """Replace every limit of a vhost (rabbitmqctl set_vhost_limits; `{}` clears them). hutchctl's."""
    require_admin(p)
    if vhost not in node.vhosts:
        raise not_found_because("vhost_not_found")
    try:
        limits = core.validate_vhost_limits(doc)
    except core.LimitError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None
    runtime_limits.set_vhost_limits(node, vhost, limits)


# -- user limits ------------------------------------------------------------------------------------


def list_user_limits(node: Node, p: Principal, user: str | None = None) -> list[dict[str, Any]]:
    if user is None:
        require_admin(p)
        return [_item("user", u, value) for u, value in node.limits.iter_users()]
    if p.name != user:
        require_monitor(p)
    if node.auth.get_user(user) is None:
        raise not_found()
    value = node.limits.user(user)
    return [_item("user", user, value)] if value else []


def _existing_user(node: Node, user: str) -> None:
    if node.auth.get_user(user) is None:
        raise not_found_because("user_not_found")


def put_user_limit(node: Node, p: Principal, user: str, name: str, body: Any) -> None:
    """Set one limit of a user (RabbitMQ's set_user_limits merges it into the user's limits)."""
    require_admin(p)
    _existing_user(node, user)
    value = _value(body)
    try:
        limits = core.validate_user_limits(node.limits.user(user) | {name: value})
    except core.LimitError as exc:
        raise bad_request(str(exc)) from None
    runtime_limits.set_user_limits(node, user, limits)


def delete_user_limit(node: Node, p: Principal, user: str, name: str) -> None:
    """Clear one limit of a user, or every one with the name `all`."""
    require_admin(p)
    _existing_user(node, user)
    limits = {} if name == "all" else node.limits.user(user)
    limits.pop(name, None)
    runtime_limits.set_user_limits(node, user, limits)


__all__ = ["delete_user_limit", "delete_vhost_limit", "list_user_limits", "list_vhost_limits", "put_user_limit",
           "put_vhost_limit", "set_vhost_limits"]
