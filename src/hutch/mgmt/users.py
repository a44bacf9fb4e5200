"""Service layer: users, virtual hosts and permissions, as the management API and hutchctl see them.

Owns: reading and changing the node's `AuthStore` and vhost table on behalf of an authenticated
`Principal`, with RabbitMQ's HTTP semantics (what a PUT body may hold, what a missing key means,
which status each outcome gets). Functions take the node, the caller and plain values, return
JSON-able data (or whether a PUT created something), and raise `ApiError`. No IO, no awaiting.

Rules:
- Every change calls `node.permissions_changed()` so channels drop their cached permission checks.
- Creating a vhost gives its creator `.* .* .*` on it (RabbitMQ's HTTP API does the same).
- Deleting a user closes its connections; deleting a vhost closes the connections on it and
  deletes its queues (`Node.delete_vhost`).
- PUT /api/users/{name} follows RabbitMQ: `password` or `password_hash` (not both; neither, or
  `password_hash: ""`, means the user cannot log in with a password); `tags` is a comma-separated
  string or a list, missing means no tags.
- Topic permissions (`/api/topic-permissions`, administrators only) are kept in
  `Node.topic_permissions`, which the channel checks when a user publishes to a topic exchange
  (RabbitMQ's write check; the read check, on binding, is not made). They are not saved: a restart
  forgets them. Deleting the user or the vhost deletes them, as in RabbitMQ.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from hutch.core.arguments import default_queue_type_problem
from hutch.core.auth import (
    FULL_PERMISSION,
    AuthError,
    NoSuchUser,
    NoSuchVhost,
    Permission,
    hash_password,
    validate_password_hash,
)
from hutch.core.patterns import PatternError, check_pattern

from . import formats
from .access import Principal, parse_tags, require_admin, visible_vhosts
from .errors import bad_request, not_authorised, not_found

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import ManagementAgentPort

    from .stats import StatsView

USER_DELETED_REASON = "user '{}' was deleted"


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("not_json")
    return body


def _string(body: dict[str, Any], key: str, default: str | None = None) -> str | None:
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def _tags(body: dict[str, Any], key: str = "tags") -> list[str]:
    try:
        return parse_tags(body.get(key))
    except ValueError as exc:
        raise bad_request(str(exc)) from None


# -- users ------------------------------------------------------------------------------------------


def list_users(node: Node, p: Principal) -> list[dict[str, Any]]:
    require_admin(p)
    return [formats.user_json(u) for u in node.auth.list_users()]


def get_user(node: Node, p: Principal, name: str) -> dict[str, Any]:
    require_admin(p)
    user = node.auth.get_user(name)
    if user is None:
        raise not_found()
    return formats.user_json(user)


def put_user(node: Node, p: Principal, name: str, body: Any) -> bool:
    """Create or update a user; True if created."""
    require_admin(p)
    body = _body(body)
    password = _string(body, "password")
    password_hash = _string(body, "password_hash")
    if password is not None and password_hash is not None:
        raise bad_request("both_password_and_password_hash_are_provided")
    tags = _tags(body)
    if password_hash:
        try:
            validate_password_hash(password_hash)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
    auth = node.auth
    user = auth.get_user(name)
    if user is None:
        auth.add_user(name, password, tags, password_hash=password_hash or None)
        created = True
    else:
        if password is not None:
            auth.change_password(name, password)
        elif password_hash:
            user.password_hash = password_hash  # validated above
        else:
            auth.clear_password(name)
        auth.set_user_tags(name, tags)
        created = False
    node.permissions_changed()
    return created


def hash_plain_password(body: Any) -> Any:
    """A PUT /api/users body whose plaintext `password` is replaced by its scrypt `password_hash`, so
    that `put_user` stores it without hashing on the event loop (this runs in an executor thread: ~40
    ms). A body it cannot improve (not an object, no or an empty password, both fields) is returned as
    it is, for `put_user` to judge."""
    if not isinstance(body, dict) or "password_hash" in body:
        return body
    password = body.get("password")
    if not isinstance(password, str) or password == "":
        return body
    out = {key: value for key, value in body.items() if key != "password"}
    out["password_hash"] = hash_password(password)
    return out


async def put_user_off_loop(node: Node, p: Principal, name: str, body: Any) -> bool:
    """PUT /api/users/{name}: `put_user`, with a plaintext password hashed off the loop first."""
    require_admin(p)
    body = await asyncio.get_running_loop().run_in_executor(None, hash_plain_password, body)
    return put_user(node, p, name, body)


async def delete_user(agent: ManagementAgentPort, node: Node, p: Principal, name: str) -> None:
    """DELETE /api/users/{name}: the user, its topic permissions, and its connections closed in every
    process of the node (through the agent: a node of workers closes them in every worker)."""
    require_admin(p)
    try:
        node.auth.delete_user(name)
    except NoSuchUser:
        raise not_found() from None
    gone = [k for k in node.topic_permissions if k[1] == name]
    for key in gone:
        del node.topic_permissions[key]
    if gone:
        node.topic_permissions_changed()
    node.permissions_changed()
    reason = USER_DELETED_REASON.format(name)
    await agent.close_user_connections(name, f"broker forced connection closure with reason '{reason}'")


def user_permissions(node: Node, p: Principal, name: str) -> list[dict[str, Any]]:
    require_admin(p)
    if node.auth.get_user(name) is None:
        raise not_found()
    return [formats.permission_json(e) for e in node.auth.list_permissions(user=name)]


def whoami(p: Principal) -> dict[str, Any]:
    return {"name": p.name, "tags": list(p.tags)}


# -- vhosts -----------------------------------------------------------------------------------------


async def _vhost_totals(agent: ManagementAgentPort, names: list[str]) -> dict[str, dict[str, int]]:
    """Per vhost: its queues' message counts and its connections' byte counts, as the node's agent
    answers them."""
    totals = {name: {"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0, "recv_oct": 0,
                     "send_oct": 0} for name in names}
    for q in await agent.queues(names):
        t = totals[q["vhost"]]
        t["messages_ready"] += q["messages_ready"]
        t["messages_unacknowledged"] += q["messages_unacknowledged"]
        t["messages"] += q["messages_ready"] + q["messages_unacknowledged"]
    for conn in await agent.connections():
        held = totals.get(conn["vhost"])  # "" until connection.open chose a vhost
        if held is not None:
            held["recv_oct"] += conn["recv_oct"]
            held["send_oct"] += conn["send_oct"]
    return totals


def _vhost_json(node: Node, v: Any, totals: dict[str, int], stats: StatsView | None) -> dict[str, Any]:
    out = formats.vhost_json(v, node.public_name, totals)
    if stats is not None:
        stats.vhost(v.name, (totals["messages_ready"], totals["messages_unacknowledged"]), out)
    return out


async def list_vhosts(agent: ManagementAgentPort, node: Node, p: Principal, stats: StatsView | None = None
                      ) -> list[dict[str, Any]]:
    visible = set(visible_vhosts(node, p))
    shown = [v for v in node.auth.list_vhosts() if v.name in visible]
    totals = await _vhost_totals(agent, [v.name for v in shown])
    return [_vhost_json(node, v, totals[v.name], stats) for v in shown]


async def get_vhost(agent: ManagementAgentPort, node: Node, p: Principal, name: str,
                    stats: StatsView | None = None) -> dict[str, Any]:
    v = node.auth.get_vhost(name)
    if v is None:
        raise not_found()
    if name not in visible_vhosts(node, p):
        raise not_authorised("User not authorised to access virtual host")
    totals = await _vhost_totals(agent, [name])
    return _vhost_json(node, v, totals[name], stats)


def put_vhost(node: Node, p: Principal, name: str, body: Any) -> bool:
    """Create or update a vhost; True if created. `description` and `tags` are replaced. Like
    RabbitMQ, the user who creates a vhost gets full permissions on it."""
    require_admin(p)
    body = _body(body)
    description = _string(body, "description", "") or ""
    tags = _tags(body)
    queue_type = _string(body, "default_queue_type")
    problem = default_queue_type_problem(queue_type, getattr(node, "cluster", None) is not None)
    if problem is not None:
        raise bad_request(problem)
    auth = node.auth
    created = auth.get_vhost(name) is None
    if created:
        node.add_vhost(name, description=description, tags=tags)
        if auth.get_user(p.name) is not None:  # RabbitMQ's maybe_grant_full_permissions
            auth.set_permissions(p.name, name, FULL_PERMISSION, FULL_PERMISSION, FULL_PERMISSION)
    v = auth.get_vhost(name)
    assert v is not None
    v.description = description
    v.tags = tags
    if queue_type is not None:
        v.default_queue_type = queue_type
    node.permissions_changed()
    return created


def delete_vhost(node: Node, p: Principal, name: str) -> None:
    require_admin(p)
    if node.auth.get_vhost(name) is None:
        raise not_found()
    gone = [k for k in node.topic_permissions if k[0] == name]
    for key in gone:
        del node.topic_permissions[key]
    if gone:
        node.topic_permissions_changed()
    node.delete_vhost(name)


def vhost_permissions(node: Node, p: Principal, name: str) -> list[dict[str, Any]]:
    require_admin(p)
    if node.auth.get_vhost(name) is None:
        raise not_found()
    return [formats.permission_json(e) for e in node.auth.list_permissions(vhost=name)]


# -- permissions ------------------------------------------------------------------------------------


def list_permissions(node: Node, p: Principal) -> list[dict[str, Any]]:
    require_admin(p)
    return [formats.permission_json(e) for e in node.auth.list_permissions()]


def get_permission(node: Node, p: Principal, vhost: str, user: str) -> dict[str, Any]:
    require_admin(p)
    entries = node.auth.list_permissions(vhost=vhost, user=user)
    if not entries:
        raise not_found()
    return formats.permission_json(entries[0])


def put_permission(node: Node, p: Principal, vhost: str, user: str, body: Any) -> bool:
    """Set a user's configure/write/read expressions on a vhost; True if there were none before."""
    require_admin(p)
    auth = node.auth
    if auth.get_user(user) is None or auth.get_vhost(vhost) is None:
        raise bad_request("vhost_or_user_not_found")
    body = _body(body)
    missing = [k for k in ("configure", "write", "read") if body.get(k) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    values = [body[k] for k in ("configure", "write", "read")]
    if not all(isinstance(v, str) for v in values):
        raise bad_request("configure, write and read must be strings")
    try:
        Permission(*values)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    created = auth.get_permissions(user, vhost) is None
    try:
        auth.set_permissions(user, vhost, *values)
    except AuthError as exc:
        raise bad_request(str(exc)) from None
    node.permissions_changed()
    return created


def delete_permission(node: Node, p: Principal, vhost: str, user: str) -> None:
    require_admin(p)
    auth = node.auth
    if auth.get_permissions(user, vhost) is None:
        raise not_found()
    try:
        auth.clear_permissions(user, vhost)
    except (NoSuchUser, NoSuchVhost):
        raise not_found() from None
    node.permissions_changed()


# -- topic permissions ------------------------------------------------------------------------------


def _topic_entries(node: Node, vhost: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for (v, u), by_exchange in node.topic_permissions.items():
        if (vhost is None or v == vhost) and (user is None or u == user):
            out.extend({"user": u, "vhost": v, "exchange": x, "write": w, "read": r}
                       for x, (w, r) in by_exchange.items())
    return out


def list_topic_permissions(node: Node, p: Principal, vhost: str | None = None, user: str | None = None
                           ) -> list[dict[str, Any]]:
    """GET /api/topic-permissions, /api/users/{user}/topic-permissions, /api/vhosts/{vhost}/topic-permissions."""
    require_admin(p)
    if user is not None and node.auth.get_user(user) is None:
        raise not_found()
    if vhost is not None and node.auth.get_vhost(vhost) is None:
        raise not_found()
    return _topic_entries(node, vhost, user)


def get_topic_permission(node: Node, p: Principal, vhost: str, user: str, exchange: str | None = None
                         ) -> list[dict[str, Any]]:
    """GET /api/topic-permissions/{vhost}/{user}[/{exchange}]: a list (one entry per exchange); 404 if none."""
    require_admin(p)
    found = [e for e in _topic_entries(node, vhost, user) if exchange is None or e["exchange"] == exchange]
    if not found:
        raise not_found()
    return found


def put_topic_permission(node: Node, p: Principal, vhost: str, user: str, body: Any) -> bool:
    """Set the user's write/read expressions for one exchange; True when the user had none on the vhost."""
    require_admin(p)
    auth = node.auth
    if auth.get_user(user) is None or auth.get_vhost(vhost) is None:
        raise bad_request("vhost_or_user_not_found")
    body = _body(body)
    missing = [k for k in ("exchange", "write", "read") if body.get(k) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    exchange, write, read = body["exchange"], body["write"], body["read"]
    if not all(isinstance(v, str) for v in (exchange, write, read)):
        raise bad_request("exchange, write and read must be strings")
    for pattern in (write, read):
        try:
            check_pattern(pattern)  # RE2 (hutch.core.patterns): what the broker will match with
        except PatternError as exc:
            raise bad_request(str(exc)) from None
    key = (vhost, user)
    created = key not in node.topic_permissions
    node.topic_permissions.setdefault(key, {})[exchange] = (write, read)
    node.topic_permissions_changed()
    return created


def delete_topic_permission(node: Node, p: Principal, vhost: str, user: str, exchange: str | None = None) -> None:
    require_admin(p)
    key = (vhost, user)
    by_exchange = node.topic_permissions.get(key)
    if not by_exchange or (exchange is not None and exchange not in by_exchange):
        raise not_found()
    if exchange is None:
        del node.topic_permissions[key]
    else:
        del by_exchange[exchange]
        if not by_exchange:
            del node.topic_permissions[key]
    node.topic_permissions_changed()


__all__ = [
    "delete_permission",
    "delete_topic_permission",
    "get_topic_permission",
    "list_topic_permissions",
    "put_topic_permission",
    "delete_user",
    "delete_vhost",
    "get_permission",
    "get_user",
    "get_vhost",
    "list_permissions",
    "list_users",
    "list_vhosts",
    "put_permission",
    "put_user",
    "put_user_off_loop",
    "put_vhost",
    "user_permissions",
    "vhost_permissions",
    "whoami",
]
