"""Who may do what through the management API: user tags, vhost visibility, AMQP permissions.

Owns: `Principal` (the authenticated caller) and the checks every service function starts with.
Pure: reads the node's `AuthStore`, never awaits, never touches a socket.

Rules (RabbitMQ's management tags; docs/management.md has the table):
- A caller needs one of the tags `administrator`, `monitoring`, `policymaker`, `management`,
  else every request is refused with 401 "Not management user" (done at login, in http.py).
- `administrator` may do everything. `monitoring` may read everything (every vhost, every
  connection and channel, node data). `policymaker` and `management` see and act on the vhosts
  they have a permission entry for ("login vhosts"), and only their own connections and channels.
- Topology changes made over HTTP (declare/delete queue or exchange, purge) run *as the caller*:
  they need the caller's AMQP permissions on the vhost, even for administrators, exactly as
  RabbitMQ's HTTP API opens a direct AMQP connection as the caller. A refusal is 401
  "Access refused.".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import access_refused, not_authorised, not_found

if TYPE_CHECKING:
    from hutch.core.auth import PermissionKind
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node

ADMINISTRATOR = "administrator"
MONITORING = "monitoring"
POLICYMAKER = "policymaker"
MANAGEMENT = "management"
MANAGEMENT_TAGS = frozenset({ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT})


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request. Invariant: `tags` are the user's tags at login."""

    name: str
    tags: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return ADMINISTRATOR in self.tags

    @property
    def is_monitor(self) -> bool:
        return ADMINISTRATOR in self.tags or MONITORING in self.tags

    @property
    def is_policymaker(self) -> bool:
        return ADMINISTRATOR in self.tags or POLICYMAKER in self.tags

    @property
    def is_management(self) -> bool:
        return not MANAGEMENT_TAGS.isdisjoint(self.tags)


def parse_tags(value: object) -> list[str]:
    """Tags from a JSON body: a comma-separated string or a list of strings (RabbitMQ takes both)."""
    if value is None:
        return []
    if isinstance(value, str):
        items: Iterable[object] = value.split(",")
    elif isinstance(value, list):
        items = value
    else:
        raise ValueError("tags must be a comma-separated string or a list of strings")
    tags: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError("tags must be a comma-separated string or a list of strings")
        tag = item.strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tags


# -- checks -----------------------------------------------------------------------------------------


def require_admin(p: Principal) -> None:
    if not p.is_admin:
        raise not_authorised("Not administrator user")


def require_monitor(p: Principal) -> None:
    if not p.is_monitor:
        raise not_authorised("Not monitor user")


def login_vhosts(node: Node, p: Principal) -> list[str]:
    """Vhosts the caller has a permission entry for, i.e. could open over AMQP."""
    auth = node.auth
    return [name for name in node.vhosts if auth.can_access_vhost(p.name, name)]


def visible_vhosts(node: Node, p: Principal) -> list[str]:
    """Vhosts whose objects the caller may read: all of them for administrators and monitors."""
    if p.is_monitor:
        return sorted(node.vhosts)
    return sorted(login_vhosts(node, p))


def vhost_for_read(node: Node, p: Principal, name: str) -> VirtualHost:
    """The named vhost if the caller may read it: 404 if it does not exist, 401 if not visible."""
    vhost = node.vhosts.get(name)
    if vhost is None:
        raise not_found()
    if not p.is_monitor and not node.auth.can_access_vhost(p.name, name):
        raise not_authorised("User not authorised to access virtual host")
    return vhost


def vhost_for_write(node: Node, p: Principal, name: str) -> VirtualHost:
    """The named vhost if the caller may change objects in it (administrator or login vhost)."""
    vhost = node.vhosts.get(name)
    if vhost is None:
        raise not_found()
    if not p.is_admin and not node.auth.can_access_vhost(p.name, name):
        raise not_authorised("User not authorised to access virtual host")
    return vhost


def require_amqp(node: Node, p: Principal, vhost: str, kind: PermissionKind, resource_type: str, name: str) -> None:
    """The AMQP check a direct connection as the caller would make: vhost login, then the permission."""
    auth = node.auth
    if not auth.can_access_vhost(p.name, vhost):
        raise access_refused()
    if not auth.check(p.name, vhost, kind, name, resource_type):
        raise access_refused()


def may_see_user_object(p: Principal, owner: str) -> bool:
    """Connections and channels: monitors see everyone's, others only their own."""
    return p.is_monitor or p.name == owner


def may_close_user_object(p: Principal, owner: str) -> bool:
    """Closing a connection: administrators may close any, others only their own."""
    return p.is_admin or p.name == owner


__all__ = [
    "ADMINISTRATOR",
    "MANAGEMENT",
    "MANAGEMENT_TAGS",
    "MONITORING",
    "POLICYMAKER",
    "Principal",
    "login_vhosts",
    "may_close_user_object",
    "may_see_user_object",
    "parse_tags",
    "require_admin",
    "require_amqp",
    "require_monitor",
    "vhost_for_read",
    "vhost_for_write",
    "visible_vhosts",
]
