"""Service layer: policies and operator policies, as the management API and hutchctl see them.

Owns: listing, showing, setting and clearing policies (`/api/policies`) and operator policies
(`/api/operator-policies`) on behalf of an authenticated `Principal`. Functions return JSON-able data
(or whether a PUT created something) and raise `ApiError`. No IO, no awaiting; the node-side work
(recording, applying to queues and exchanges) is `hutch.runtime.broker.policies`.

Rules (RabbitMQ's rabbit_mgmt_wm_policies / _policy / _operator_policy):
- Lists: any management user; administrators see every vhost's policies, others those of their
  login vhosts. A named vhost the caller cannot log in to is 401 "User not authorised to access
  virtual host" (administrators excepted).
- One policy (GET, PUT, DELETE): administrators, or `policymaker` users on their login vhosts, else
  401 "User not authorised to access object".
- Operator policies, listed or not: administrators only ("Not administrator user").
- PUT body: `pattern` and `definition` are required (`[{key_missing,pattern}]`), `priority` defaults
  to 0 and `apply-to` to "all". An invalid policy is a 400 with the validation text
  (hutch.core.policy). A missing vhost or policy is a 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch.core.policy import PolicyError, make_policy
from hutch.runtime.broker import policies as runtime_policies

from . import formats
from .access import Principal, login_vhosts, require_admin
from .errors import bad_request, not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node


def _may_list(node: Node, p: Principal, vhost: str | None, operator: bool) -> list[str] | None:
    """The vhosts whose policies the caller may list (None: all of them)."""
    if operator:
        require_admin(p)
    if vhost is not None:
        if vhost not in node.vhosts:
            raise not_found()
        if not p.is_admin and not node.auth.can_access_vhost(p.name, vhost):
            raise not_authorised("User not authorised to access virtual host")
        return [vhost]
    return None if p.is_admin else login_vhosts(node, p)


def _may_change(node: Node, p: Principal, vhost: str, operator: bool) -> None:
    if operator:
        require_admin(p)
    elif not (p.is_admin or (p.is_policymaker and node.auth.can_access_vhost(p.name, vhost))):
        raise not_authorised("User not authorised to access object")
    if vhost not in node.vhosts:
        raise not_found()


def list_policies(node: Node, p: Principal, vhost: str | None = None,
                  operator: bool = False) -> list[dict[str, Any]]:
    allowed = _may_list(node, p, vhost, operator)
    store = node.policies
    if allowed is None:
        return [formats.policy_json(x) for x in store.list(operator=operator)]
    return [formats.policy_json(x) for v in allowed for x in store.list(v, operator)]


def get_policy(node: Node, p: Principal, vhost: str, name: str, operator: bool = False) -> dict[str, Any]:
    _may_change(node, p, vhost, operator)
    policy = node.policies.get(vhost, name, operator)
    if policy is None:
        raise not_found()
    return formats.policy_json(policy)


def put_policy(node: Node, p: Principal, vhost: str, name: str, body: Any, operator: bool = False) -> bool:
    """Set a policy; True if it was created."""
    _may_change(node, p, vhost, operator)
    if not isinstance(body, dict):
        raise bad_request("not_json")
    missing = [k for k in ("pattern", "definition") if k not in body]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    try:
        policy = make_policy(vhost, name, body["pattern"], body["definition"], body.get("priority"),
                             body.get("apply-to"), operator=operator)
    except PolicyError as exc:
        raise bad_request(str(exc)) from None
    return runtime_policies.set_policy(node, policy, operator)


def delete_policy(node: Node, p: Principal, vhost: str, name: str, operator: bool = False) -> None:
    _may_change(node, p, vhost, operator)
    if not runtime_policies.clear_policy(node, vhost, name, operator):
        raise not_found()


__all__ = ["delete_policy", "get_policy", "list_policies", "put_policy"]
