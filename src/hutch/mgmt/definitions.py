"""Service layer: definitions, RabbitMQ's JSON document of a node's users, vhosts, permissions, policies
and topology, exported and imported (`GET`/`POST /api/definitions[/{vhost}]`, `load_definitions`).

Owns: the document as hutch writes it (`export_definitions`, `export_vhost_definitions`) and its
import in three steps: `parse_document` (bytes to a JSON object), `prepare` (pure: hashes plaintext
passwords with scrypt, so the HTTP layer runs it in an executor thread), then `plan_import` (checks the
whole document against the node's current state and returns a `Plan`) and `apply_plan` (makes the
changes through the node's normal methods, so each one is recorded durably and takes effect as if
made over the API). `import_definitions` is the HTTP service function, `load_definitions_file` the
boot-time import. No aiohttp, no awaiting.

Rules (RabbitMQ 3.10's rabbit_mgmt_wm_definitions and rabbit_definitions, checked against 3.10.8):
- Administrators only (401 "Not administrator user").
- Export: users (name, password_hash, hashing_algorithm, tags as a list, limits), vhosts (name,
  limits, metadata), permissions, topic_permissions (Node.topic_permissions), parameters (operator policies, as
  component "operator_policy", vhost limits, as component "vhost-limits" named "limits", as RabbitMQ 4.x
  writes both, and shovels, component "shovel"), global_parameters (empty), policies, and, as RabbitMQ does, every
  non-exclusive queue, every exchange but the default and `amq.*` ones, and every binding whose
  source is not the default exchange and whose destination is exported (or is an exchange): durable
  or not. The per-vhost form is `rabbit_version`, parameters, policies, queues, exchanges, bindings,
  with `vhost` dropped from queues, exchanges and bindings.
- Import, whole node: users (with their limits, merged into a user's own), vhosts, permissions, topic
  permissions, vhost limits (the vhost-limits parameter; also a vhost object's `limits`, which RabbitMQ's
  import ignores), operator policies, policies, exchanges, queues, bindings, then shovels (component
  "shovel", validated as `set_parameter` validates them; their local connections act as the importing
  user, or the default user at boot). Queues that would take a
  vhost past its max-queues refuse the document (RabbitMQ's "Adding N queue(s) ... Import aborted!"). Users, vhosts, permissions and policies are created or updated (a user
  given neither password nor password_hash loses its password, as in RabbitMQ); an exchange or queue
  that exists is kept as it is, without an equivalence check; names starting `amq.` and the default
  exchange are skipped. A new vhost gives the importing user `.* .* .*` (the document's permissions,
  applied after, win). Per vhost: parameters, policies, exchanges, queues, bindings, all into the
  vhost of the URL; the rest of the document is ignored.
- All or nothing: the whole document is checked before anything changes, and the changes are made in
  one go on the event loop, so a document with an error changes nothing (400 with the reason).
  RabbitMQ applies category by category and keeps what it did before the error.
- What hutch cannot honour is refused, not dropped: runtime parameters other than operator policies,
  vhost limits and shovels, unknown limit names, queue types other than classic and quorum (quorum queues
  only on a clustered node, which a lone `hutch-server` is by default), unknown exchange types,
  unknown policy keys. Global parameters (RabbitMQ's cluster id and name) are ignored.
- Passwords: `hashing_algorithm` may be hutch's scrypt or RabbitMQ's sha256/sha512/md5
  (hutch.core.auth.import_password_hash); without it, RabbitMQ's default applies (md5 for exports of
  RabbitMQ before 3.6, else sha256; a hutch scrypt hash is recognised by its form).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.amqp.errors import AMQPError
from hutch.core import limits as core_limits
from hutch.core.arguments import default_queue_type_problem, validate_queue_arguments, with_default_queue_type
from hutch.core.auth import (
    FULL_PERMISSION,
    HUTCH_HASHING_ALGORITHM,
    Permission,
    export_password_hash,
    hash_password,
    import_password_hash,
)
from hutch.core.patterns import PatternError, check_pattern, compile_stored
from hutch.core.policy import Policy, PolicyError, make_policy
from hutch.core.routing import (
    EXCHANGE,
    EXCHANGE_TYPES,
    QUEUE,
    InvalidBinding,
    InvalidExchange,
    routing_type,
    validate_binding,
    validate_exchange,
)
from hutch.core.vhost import BUILTIN_EXCHANGES, rs
from hutch.runtime.broker import limits as runtime_limits
from hutch.runtime.broker import parameters as runtime_parameters
from hutch.runtime.broker import policies as runtime_policies

from . import formats
from .access import Principal, parse_tags, require_admin
from .errors import bad_request, not_found_because
from .jsontext import loads_bounded

if TYPE_CHECKING:
    from hutch.core.queue_type import Queue
    from hutch.core.routing import Binding, Exchange
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node

log = logging.getLogger("hutch.mgmt.definitions")

PRODUCT_NAME = "hutch"
MAX_NAME_BYTES = 255
OPERATOR_POLICY_COMPONENT = "operator_policy"
VHOST_LIMITS_COMPONENT = "vhost-limits"  # RabbitMQ keeps vhost limits as this runtime parameter
# RabbitMQ versions whose exports carry MD5 hashes without naming the algorithm (rabbit_auth_backend_internal)
MD5_VERSIONS = ("3.0.", "3.1.", "3.2.", "3.3.", "3.4.", "3.5.")
RABBIT_DEFAULT_HASHING = "rabbit_password_hashing_sha256"


class DefinitionsError(ValueError):
    """A document that cannot be imported; `str()` is the one-line reason."""


class NotJson(DefinitionsError):
    """The payload is not a JSON object (RabbitMQ's `failed_to_parse_json`)."""


# -- export -----------------------------------------------------------------------------------------


def _exported_queues(v: VirtualHost) -> list[Queue]:
    """Every non-exclusive queue, as RabbitMQ (exclusive ones cannot be restored), but the replicas of
    delayed exchanges (runtime/queue_types/delayed.py: made with their exchange)."""
    return [v.queues[n] for n in sorted(v.queues)
            if v.queues[n].exclusive_owner is None and not n.startswith("amq.delayed-message.")]


def _exported_exchanges(v: VirtualHost) -> list[Exchange]:
    return [v.exchanges[n] for n in sorted(v.exchanges) if n and not n.startswith("amq.")]


def _exported_bindings(v: VirtualHost, queue_names: set[str]) -> list[Binding]:
    def exported(b: Binding) -> bool:
        kind, name = b.destination
        return b.source != "" and (name in queue_names if kind == QUEUE else name != "")

    found = [b for b in v.bindings() if exported(b)]
    found.sort(key=lambda b: (b.source, b.destination[0], b.destination[1], b.routing_key,
                              json.dumps(formats.jsonable(b.arguments), sort_keys=True)))
    return found


def _queue_json(q: Queue) -> dict[str, Any]:
    return {"name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
            "arguments": formats.jsonable(q.arguments)}


def _exchange_json(x: Exchange) -> dict[str, Any]:
    return {"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
            "auto_delete": x.auto_delete, "internal": x.internal, "arguments": formats.jsonable(x.arguments)}


def _binding_json(vhost: str, b: Binding) -> dict[str, Any]:
    kind, name = b.destination
    return {"source": b.source, "vhost": vhost, "destination": name, "destination_type": kind,
            "routing_key": b.routing_key, "arguments": formats.jsonable(b.arguments)}


def _topology(v: VirtualHost) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    queues = _exported_queues(v)
    names = {q.name for q in queues}
    return ([_queue_json(q) for q in queues], [_exchange_json(x) for x in _exported_exchanges(v)],
            [_binding_json(v.name, b) for b in _exported_bindings(v, names)])


def _operator_policy_parameter(p: Policy) -> dict[str, Any]:
    """An operator policy as RabbitMQ exports it: a runtime parameter of component operator_policy."""
    value = {"pattern": p.pattern, "definition": dict(p.definition), "priority": p.priority,
             "apply-to": p.apply_to}
    return {"value": value, "vhost": p.vhost, "component": OPERATOR_POLICY_COMPONENT, "name": p.name}


def _vhost_limits_parameter(vhost: str, limits: dict[str, int]) -> dict[str, Any]:
    """A vhost's limits as RabbitMQ exports them: the runtime parameter vhost-limits/limits."""
    return {"value": limits, "vhost": vhost, "component": VHOST_LIMITS_COMPONENT, "name": "limits"}


def _parameters(node: Node, vhost: str | None = None) -> list[dict[str, Any]]:
    found = [_operator_policy_parameter(x) for x in node.policies.list(vhost, operator=True)]
    found += [p.to_dict() for p in node.parameters.list(vhost=vhost)]
    found += [_vhost_limits_parameter(v, limits) for v, limits in node.limits.iter_vhosts()
              if vhost is None or v == vhost]
    return found


def _user_json(name: str, stored: str | None, tags: list[str], limits: dict[str, int]) -> dict[str, Any]:
    password_hash, algorithm = export_password_hash(stored)
    return {"name": name, "password_hash": password_hash, "hashing_algorithm": algorithm,
            "tags": list(tags), "limits": limits}


def export_definitions(node: Node, p: Principal) -> dict[str, Any]:
    """GET /api/definitions: the whole node."""
    require_admin(p)
    auth = node.auth
    queues: list[dict[str, Any]] = []
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    for name in sorted(node.vhosts):
        qs, xs, bs = _topology(node.vhosts[name])
        queues += qs
        exchanges += xs
        bindings += bs
    return {
        "rabbit_version": __version__,
        "rabbitmq_version": __version__,
        "product_name": PRODUCT_NAME,
        "product_version": __version__,
        "users": [_user_json(u.name, u.password_hash, u.tags, node.limits.user(u.name)) for u in auth.list_users()],
        "vhosts": [{"name": v.name, "limits": node.limits.vhost(v.name),
                    "metadata": {"description": v.description, "tags": list(v.tags),
                                 "default_queue_type": v.default_queue_type}}
                   for v in auth.list_vhosts()],
        "permissions": [formats.permission_json(e) for e in auth.list_permissions()],
        "topic_permissions": [{"user": u, "vhost": v, "exchange": x, "write": w, "read": r}
                              for (v, u), by_exchange in sorted(node.topic_permissions.items())
                              for x, (w, r) in sorted(by_exchange.items())],
        "parameters": _parameters(node),
        "global_parameters": [],
        "policies": [formats.policy_json(x) for x in node.policies.list()],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def export_vhost_definitions(node: Node, p: Principal, vhost: str) -> dict[str, Any]:
    """GET /api/definitions/{vhost}: RabbitMQ's per-vhost form (a missing vhost is a 400, as there)."""
    require_admin(p)
    v = node.vhosts.get(vhost)
    if v is None:
        raise bad_request("vhost_not_found")
    queues, exchanges, bindings = _topology(v)
    for item in (*queues, *exchanges, *bindings):
        del item["vhost"]
    return {
        "rabbit_version": __version__,
        "parameters": _parameters(node, vhost),
        "policies": [formats.policy_json(x) for x in node.policies.list(vhost)],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


# -- import: parse and prepare (pure) ---------------------------------------------------------------


def parse_document(payload: bytes | str) -> dict[str, Any]:
    """The JSON object of an upload or file; empty is {} (nothing to import). NotJson otherwise."""
    text = payload.strip()
    if not text:
        return {}
    try:
        doc = loads_bounded(text)
    except (ValueError, UnicodeDecodeError) as exc:  # JsonTooDeep is a ValueError
        raise NotJson(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise NotJson(f"not a JSON object but a JSON {type(doc).__name__}")
    return doc


@dataclass(frozen=True)
class Prepared:
    """A parsed document and the scrypt hashes of the plaintext passwords it gives.
    Invariant: `password_hashes[i]` is the hash of `doc["users"][i]["password"]`."""

    doc: dict[str, Any]
    password_hashes: dict[int, str] = field(default_factory=dict)


def prepare(doc: dict[str, Any], vhost: str | None = None) -> Prepared:
    """Hash the plaintext passwords of `users` (~40 ms of scrypt each: call from an executor thread).
    Pure; a per-vhost import ignores users, so there is nothing to hash."""
    hashes: dict[int, str] = {}
    users = doc.get("users")
    if vhost is None and isinstance(users, list):
        for i, user in enumerate(users):
            if isinstance(user, dict) and isinstance(user.get("password"), str) and user["password"]:
                hashes[i] = hash_password(user["password"])
    return Prepared(doc, hashes)


# -- import: plan (checks everything, changes nothing) ----------------------------------------------


@dataclass(frozen=True)
class _User:
    name: str
    password_hash: str | None
    tags: list[str]
    limits: dict[str, int]  # merged into the user's limits (RabbitMQ's update_limits(add, ...))


@dataclass(frozen=True)
class _Vhost:
    name: str
    description: str | None
    tags: list[str] | None
    default_queue_type: str | None
    limits: dict[str, int] | None  # the vhost object's "limits" (RabbitMQ's own import ignores them)


@dataclass(frozen=True)
class _Permission:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class _Exchange:
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


@dataclass(frozen=True)
class _Queue:
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]


@dataclass(frozen=True)
class _Binding:
    vhost: str
    source: str
    destination_type: str
    destination: str
    routing_key: str
    arguments: dict[str, Any]


@dataclass
class Plan:
    """What an import will do, in order. Invariant: built by `plan_import` against the node's state
    at that moment, so `apply_plan` (called in the same event-loop turn) cannot fail on it."""

    users: list[_User] = field(default_factory=list)
    vhosts: list[_Vhost] = field(default_factory=list)
    permissions: list[_Permission] = field(default_factory=list)
    topic_permissions: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # user, vhost, x, w, r
    policies: list[tuple[Policy, bool]] = field(default_factory=list)  # (policy, operator)
    vhost_limits: dict[str, dict[str, int]] = field(default_factory=dict)  # vhost -> its whole limits
    parameters: list[tuple[str, str, str, Any]] = field(default_factory=list)  # component, vhost, name, value
    exchanges: list[_Exchange] = field(default_factory=list)
    queues: list[_Queue] = field(default_factory=list)
    bindings: list[_Binding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each skipped item was skipped (logged)
    # a boot-time file's patterns RE2 refuses match nothing (logged) instead of failing the start
    stored_patterns: bool = False

    def summary(self) -> str:
        counts = (("users", self.users), ("vhosts", self.vhosts), ("permissions", self.permissions),
                  ("policies", self.policies), ("exchanges", self.exchanges), ("queues", self.queues),
                  ("bindings", self.bindings))
        text = ", ".join(f"{len(items)} {what}" for what, items in counts)
        return text + (f" ({len(self.skipped)} skipped)" if self.skipped else "")


def _items(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionsError(f"'{key}' must be a list of objects")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise DefinitionsError(f"{key}[{i}] must be a JSON object")
    return value


def _string(item: dict[str, Any], key: str, where: str, default: str | None = None,
            empty: bool = False) -> str:
    value = item.get(key, default)
    if value is None:
        raise DefinitionsError(f"{where}: '{key}' is missing")
    if not isinstance(value, str) or (not empty and not value):
        raise DefinitionsError(f"{where}: '{key}' must be a {'' if empty else 'non-empty '}string")
    return value


def _bool(item: dict[str, Any], key: str, where: str, default: bool | None = False) -> bool:
    value = item.get(key, default)
    if value is None:
        raise DefinitionsError(f"{where}: '{key}' is missing")
    if not isinstance(value, bool):
        raise DefinitionsError(f"{where}: '{key}' must be true or false")
    return value


def _arguments(item: dict[str, Any], where: str) -> dict[str, Any]:
    value = item.get("arguments")
    if value is None or value == []:  # RabbitMQ's args(undefined) and args([])
        return {}
    if not isinstance(value, dict):
        raise DefinitionsError(f"{where}: 'arguments' must be a JSON object")
    return value


def _tags(value: Any, where: str) -> list[str]:
    try:
        return parse_tags(value)
    except ValueError as exc:
        raise DefinitionsError(f"{where}: {exc}") from None


def _limits(item: dict[str, Any], where: str, user: bool) -> dict[str, int] | None:
    """The `limits` of a user or vhost object, checked; None when absent or empty."""
    doc = item.get("limits")
    if doc is None:
        return None
    try:
        found = core_limits.validate_user_limits(doc) if user else core_limits.validate_vhost_limits(doc)
    except core_limits.LimitError as exc:
        raise DefinitionsError(f"{where}: {exc}") from None
    return found or None


def _check_name_length(name: str, where: str) -> None:
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise DefinitionsError(f"{where}: name is longer than {MAX_NAME_BYTES} bytes")


def _default_hashing(password_hash: str, version: Any) -> str:
    if password_hash.startswith("scrypt$"):
        return HUTCH_HASHING_ALGORITHM
    if isinstance(version, str) and version.startswith(MD5_VERSIONS):
        return "rabbit_password_hashing_md5"
    return RABBIT_DEFAULT_HASHING


class _Planner:
    """Builds a Plan, tracking what will exist once the earlier categories are applied."""

    def __init__(self, node: Node, prepared: Prepared, scope: str | None, stored_patterns: bool = False) -> None:
        self.node = node
        self.prepared = prepared
        self.scope = scope
        self.plan = Plan(stored_patterns=stored_patterns)
        self.users = {u.name for u in node.auth.list_users()}
        self.vhosts = set(node.vhosts)
        self.exchange_types = {(v.name, x.name): routing_type(x.type, x.arguments) for v in node.vhosts.values()
                               for x in v.exchanges.values()}
        self.queues = {(v.name, name) for v in node.vhosts.values() for name in v.queues}

    def vhost_of(self, item: dict[str, Any], where: str) -> str:
        if self.scope is not None:
            return self.scope
        vhost = _string(item, "vhost", where)
        if vhost not in self.vhosts:
            raise DefinitionsError(f"{where}: virtual host '{vhost}' does not exist and the definitions "
                                   "do not create it")
        return vhost

    def user(self, i: int, item: dict[str, Any], version: Any) -> None:
        name = _string(item, "name", f"users[{i}]")
        where = f"user '{name}'"
        if "password" in item and "password_hash" in item:
            raise DefinitionsError(f"{where}: both_password_and_password_hash_are_provided")
        if "tags" in item:
            tags = _tags(item["tags"], where)
        elif "administrator" in item:  # exports of RabbitMQ before 3.0
            tags = ["administrator"] if item["administrator"] in (True, "true") else []
        else:
            raise DefinitionsError(f"{where}: tags_not_present")
        user_limits = _limits(item, where, user=True) or {}
        stored: str | None = None
        if item.get("password") is not None:
            password = _string(item, "password", where, empty=True)
            if password:
                stored = self.prepared.password_hashes.get(i) or hash_password(password)
        elif item.get("password_hash") is not None:
            password_hash = _string(item, "password_hash", where, empty=True)
            algorithm = item.get("hashing_algorithm") or _default_hashing(password_hash, version)
            try:
                stored = import_password_hash(password_hash, str(algorithm))
            except ValueError as exc:
                raise DefinitionsError(f"{where}: {exc}") from None
        self.users.add(name)
        self.plan.users.append(_User(name, stored, tags, user_limits))

    def vhost(self, i: int, item: dict[str, Any]) -> None:
        name = _string(item, "name", f"vhosts[{i}]")
        where = f"vhost '{name}'"
        metadata = item.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise DefinitionsError(f"{where}: 'metadata' must be a JSON object")
        description = item.get("description", metadata.get("description"))
        if description is not None and not isinstance(description, str):
            raise DefinitionsError(f"{where}: 'description' must be a string")
        raw_tags = item.get("tags", metadata.get("tags"))
        tags = None if raw_tags is None else _tags(raw_tags, where)
        queue_type = item.get("default_queue_type", metadata.get("default_queue_type"))
        problem = default_queue_type_problem(queue_type, getattr(self.node, "cluster", None) is not None)
        if problem is not None:
            raise DefinitionsError(f"{where}: {problem}")
        vhost_limits = _limits(item, where, user=False)
        if name not in self.vhosts:  # a new vhost comes with the default and amq.* exchanges
            self.exchange_types.update({(name, x): type_ for x, type_ in BUILTIN_EXCHANGES})
        self.vhosts.add(name)
        self.plan.vhosts.append(_Vhost(name, description, tags, queue_type, vhost_limits))
        if vhost_limits is not None:
            self.plan.vhost_limits[name] = vhost_limits

    def permission(self, i: int, item: dict[str, Any]) -> None:
        where = f"permissions[{i}]"
        user = _string(item, "user", where)
        vhost = _string(item, "vhost", where)
        where = f"permission of user '{user}' on vhost '{vhost}'"
        if user not in self.users:
            raise DefinitionsError(f"{where}: user '{user}' does not exist and the definitions do not "
                                   "create it")
        if vhost not in self.vhosts:
            raise DefinitionsError(f"{where}: virtual host '{vhost}' does not exist and the definitions "
                                   "do not create it")
        values = [_string(item, k, where, empty=True) for k in ("configure", "write", "read")]
        try:
            Permission(values[0], values[1], values[2], stored=self.plan.stored_patterns)
        except ValueError as exc:
            raise DefinitionsError(f"{where}: {exc}") from None
        self.plan.permissions.append(_Permission(user, vhost, *values))

    def topic_permission(self, i: int, item: dict[str, Any]) -> None:
        where = f"topic_permissions[{i}]"
        user = _string(item, "user", where)
        vhost = _string(item, "vhost", where)
        where = f"topic permission of user '{user}' on vhost '{vhost}'"
        if user not in self.users:
            raise DefinitionsError(f"{where}: user '{user}' does not exist and the definitions do not "
                                   "create it")
        if vhost not in self.vhosts:
            raise DefinitionsError(f"{where}: virtual host '{vhost}' does not exist and the definitions "
                                   "do not create it")
        exchange, write, read = (_string(item, k, where, empty=True) for k in ("exchange", "write", "read"))
        for pattern in (write, read):
            try:
                if self.plan.stored_patterns:
                    compile_stored(pattern, f"{where}: pattern")
                else:
                    check_pattern(pattern)
            except PatternError as exc:
                raise DefinitionsError(f"{where}: {exc}") from None
        self.plan.topic_permissions.append((user, vhost, exchange, write, read))

    def policy(self, vhost: str, name: str, body: dict[str, Any], operator: bool) -> None:
        kind = "operator policy" if operator else "policy"
        try:
            policy = make_policy(vhost, name, body.get("pattern"), body.get("definition"), body.get("priority"),
                                 body.get("apply-to"), operator=operator, stored=self.plan.stored_patterns)
        except PolicyError as exc:
            raise DefinitionsError(f"{kind} '{name}' in vhost '{vhost}': {exc}") from None
        self.plan.policies.append((policy, operator))

    def parameter(self, i: int, item: dict[str, Any]) -> None:
        where = f"parameters[{i}]"
        name = _string(item, "name", where)
        vhost = self.vhost_of(item, where)
        component = item.get("component")
        if component == VHOST_LIMITS_COMPONENT:
            self.vhost_limits_parameter(vhost, name, item.get("value"))
            return
        if component in runtime_parameters.VALIDATORS:  # shovels, federation upstreams and upstream sets
            try:
                runtime_parameters.validate(str(component), name, item.get("value"))
            except ValueError as exc:
                raise DefinitionsError(f"{component} '{name}' in vhost '{vhost}': {exc}") from None
            self.plan.parameters.append((str(component), vhost, name, item.get("value")))
            return
        if component != OPERATOR_POLICY_COMPONENT:
            raise DefinitionsError(f"runtime parameter '{name}' in vhost '{vhost}': component '{component}' "
                                   f"is not supported by hutch (only '{OPERATOR_POLICY_COMPONENT}', "
                                   f"'{VHOST_LIMITS_COMPONENT}', {', '.join(map(repr, runtime_parameters.VALIDATORS))} "
                                   "are)")
        value = item.get("value")
        if not isinstance(value, dict):
            raise DefinitionsError(f"operator policy '{name}' in vhost '{vhost}': 'value' must be a JSON object")
        self.policy(vhost, name, value, operator=True)

    def vhost_limits_parameter(self, vhost: str, name: str, value: Any) -> None:
        """RabbitMQ's vhost-limits parameter (always named `limits`): the vhost's whole limits."""
        where = f"limits of vhost '{vhost}'"
        if name != "limits":
            raise DefinitionsError(f"{where}: a '{VHOST_LIMITS_COMPONENT}' parameter must be named 'limits', "
                                   f"not '{name}'")
        try:
            self.plan.vhost_limits[vhost] = core_limits.validate_vhost_limits(value)
        except core_limits.LimitError as exc:
            raise DefinitionsError(f"{where}: {exc}") from None

    def check_queue_limits(self) -> None:
        """Refuse a document whose queues would take a vhost past its max-queues (the limit the import
        leaves in force), as rabbit_definitions' validate_limits does."""
        adding: dict[str, int] = {}
        for q in self.plan.queues:
            adding[q.vhost] = adding.get(q.vhost, 0) + 1
        for vhost, count in sorted(adding.items()):
            limits = self.plan.vhost_limits.get(vhost)
            if limits is None:
                limits = self.node.limits.vhost(vhost)
            limit = core_limits.effective(limits, "max-queues")
            existing = len(self.node.vhosts[vhost].queues) if vhost in self.node.vhosts else 0
            if limit is not None and existing + count > limit:
                raise DefinitionsError(core_limits.import_refused(vhost, count, limit, existing))

    def exchange(self, i: int, item: dict[str, Any]) -> None:
        name = _string(item, "name", f"exchanges[{i}]", empty=True)
        vhost = self.vhost_of(item, f"exchanges[{i}]")
        where = rs("exchange", name, vhost)
        if name == "" or name.startswith("amq."):
            self.plan.skipped.append(f"{where}: reserved name")
            return
        if (vhost, name) in self.exchange_types:
            self.plan.skipped.append(f"{where}: exists")
            return
        type_ = _string(item, "type", where)
        if type_ not in EXCHANGE_TYPES:
            raise DefinitionsError(f"{where}: unknown exchange type '{type_}' (supported: "
                                   f"{', '.join(EXCHANGE_TYPES)})")
        arguments = _arguments(item, where)
        try:
            validate_exchange(type_, arguments)
        except InvalidExchange as exc:
            raise DefinitionsError(f"{where}: {exc}") from None
        alternate = arguments.get("alternate-exchange")
        if alternate is not None and not isinstance(alternate, str):
            raise DefinitionsError(f"{where}: 'alternate-exchange' must be a string")
        _check_name_length(name, where)
        self.exchange_types[(vhost, name)] = routing_type(type_, arguments)
        self.plan.exchanges.append(_Exchange(vhost, name, type_, _bool(item, "durable", where, None),
                                             _bool(item, "auto_delete", where), _bool(item, "internal", where),
                                             arguments))

    def queue(self, i: int, item: dict[str, Any]) -> None:
        name = _string(item, "name", f"queues[{i}]")
        vhost = self.vhost_of(item, f"queues[{i}]")
        where = rs("queue", name, vhost)
        if name.startswith("amq."):
            self.plan.skipped.append(f"{where}: reserved name")
            return
        if (vhost, name) in self.queues:
            self.plan.skipped.append(f"{where}: exists")
            return
        durable = _bool(item, "durable", where, None)
        auto_delete = _bool(item, "auto_delete", where)
        arguments = _arguments(item, where)
        _check_name_length(name, where)
        # a queue without x-queue-type takes its vhost's default type, as a client's declare does
        # (node.declare_queue applies the same rule when the plan is applied)
        queue_type = with_default_queue_type(arguments, self.default_queue_type(vhost), durable,
                                             False, auto_delete).get("x-queue-type", "classic")
        if queue_type == "quorum" and getattr(self.node, "cluster", None) is None:
            raise DefinitionsError(f"{where}: quorum queues need a clustered node (this node "
                                   "was started with --no-cluster; see docs/clustering.md)")
        try:
            validate_queue_arguments(name, vhost, queue_type, arguments)
        except AMQPError as exc:
            raise DefinitionsError(exc.text) from None
        self.queues.add((vhost, name))
        self.plan.queues.append(_Queue(vhost, name, durable, auto_delete, arguments))

    def default_queue_type(self, vhost: str) -> str | None:
        """The default queue type `vhost` will have once the plan is applied."""
        for v in reversed(self.plan.vhosts):
            if v.name == vhost and v.default_queue_type is not None:
                return v.default_queue_type
        record = self.node.auth.get_vhost(vhost)
        return record.default_queue_type if record is not None else None

    def binding(self, i: int, item: dict[str, Any]) -> None:
        where = f"bindings[{i}]"
        vhost = self.vhost_of(item, where)
        source = _string(item, "source", where, empty=True)
        destination = _string(item, "destination", where)
        kind = item.get("destination_type")
        if kind not in (QUEUE, EXCHANGE):
            raise DefinitionsError(f"{where}: 'destination_type' must be \"queue\" or \"exchange\"")
        routing_key = _string(item, "routing_key", where, default="", empty=True)
        where = f"binding of {rs(kind, destination, vhost)} to exchange '{source}'"
        arguments = _arguments(item, where)
        if source == "":
            self.plan.skipped.append(f"{where}: bindings to the default exchange are implicit")
            return
        source_type = self.exchange_types.get((vhost, source))
        if source_type is None:
            raise DefinitionsError(f"{where}: no exchange '{source}' in vhost '{vhost}'")
        known = self.queues if kind == QUEUE else self.exchange_types
        if (vhost, destination) not in known:
            raise DefinitionsError(f"{where}: no {kind} '{destination}' in vhost '{vhost}'")
        try:
            validate_binding(source_type, arguments, routing_key)
        except InvalidBinding as exc:
            raise DefinitionsError(f"{where}: {exc}") from None
        self.plan.bindings.append(_Binding(vhost, source, kind, destination, routing_key, arguments))


def plan_import(node: Node, prepared: Prepared, vhost: str | None = None, *, stored_patterns: bool = False) -> Plan:
    """Check a document against the node and list what importing it does; DefinitionsError if any
    part cannot be imported. `vhost` given: RabbitMQ's per-vhost import into that (existing) vhost.
    `stored_patterns` (the boot-time file): a pattern RE2 refuses matches nothing, with a warning."""
    doc = prepared.doc
    planner = _Planner(node, prepared, vhost, stored_patterns)
    if vhost is None:
        version = doc.get("rabbitmq_version", doc.get("rabbit_version"))
        for i, item in enumerate(_items(doc, "users")):
            planner.user(i, item, version)
        for i, item in enumerate(_items(doc, "vhosts")):
            planner.vhost(i, item)
        for i, item in enumerate(_items(doc, "permissions")):
            planner.permission(i, item)
        for i, item in enumerate(_items(doc, "topic_permissions")):
            planner.topic_permission(i, item)
        ignored = [str(p.get("name")) for p in _items(doc, "global_parameters")]
        if ignored:
            planner.plan.skipped.append(f"global parameters {', '.join(ignored)}: hutch has none")
    for i, item in enumerate(_items(doc, "parameters")):
        planner.parameter(i, item)
    for i, item in enumerate(_items(doc, "policies")):
        where = f"policies[{i}]"
        planner.policy(planner.vhost_of(item, where), _string(item, "name", where), item, operator=False)
    for i, item in enumerate(_items(doc, "exchanges")):
        planner.exchange(i, item)
    for i, item in enumerate(_items(doc, "queues")):
        planner.queue(i, item)
    for i, item in enumerate(_items(doc, "bindings")):
        planner.binding(i, item)
    planner.check_queue_limits()
    return planner.plan


# -- import: apply -----------------------------------------------------------------------------------


def _apply_auth(node: Node, plan: Plan, acting_user: str | None) -> None:
    auth = node.auth
    for u in plan.users:
        if auth.get_user(u.name) is None:
            auth.add_user(u.name, None, u.tags, password_hash=u.password_hash)
        else:
            auth.set_password_hash(u.name, u.password_hash)
            auth.set_user_tags(u.name, u.tags)
    for v in plan.vhosts:
        if auth.get_vhost(v.name) is None:
            node.add_vhost(v.name, description=v.description or "", tags=v.tags or ())
            if acting_user is not None and auth.get_user(acting_user) is not None:
                auth.set_permissions(acting_user, v.name, FULL_PERMISSION, FULL_PERMISSION, FULL_PERMISSION)
        record = auth.get_vhost(v.name)
        assert record is not None
        if v.description is not None:
            record.description = v.description
        if v.tags is not None:
            record.tags = list(v.tags)
        if v.default_queue_type is not None:
            record.default_queue_type = v.default_queue_type
    for p in plan.permissions:
        auth.set_permissions(p.user, p.vhost, p.configure, p.write, p.read, stored=plan.stored_patterns)
    for user, vhost, exchange, write, read in plan.topic_permissions:
        node.topic_permissions.setdefault((vhost, user), {})[exchange] = (write, read)
    if plan.topic_permissions:
        node.topic_permissions_changed()
    if plan.users or plan.vhosts or plan.permissions:
        node.permissions_changed()  # drops cached permission checks and records the auth state
    for u in plan.users:
        if u.limits:
            runtime_limits.set_user_limits(node, u.name, node.limits.user(u.name) | u.limits)
    for vhost, limits in plan.vhost_limits.items():
        runtime_limits.set_vhost_limits(node, vhost, limits)


def apply_plan(node: Node, plan: Plan, acting_user: str | None = None) -> None:
    """Make the changes of a plan through the node's methods (each recorded durably). `acting_user`
    (the HTTP caller; None at boot) gets full permissions on the vhosts the import creates."""
    _apply_auth(node, plan, acting_user)
    for policy, operator in plan.policies:
        runtime_policies.set_policy(node, policy, operator)
    for x in plan.exchanges:
        node.declare_exchange(node.vhosts[x.vhost], x.name, x.type, x.durable, x.auto_delete, x.internal,
                              x.arguments)
    for q in plan.queues:
        node.declare_queue(node.vhosts[q.vhost], q.name, q.durable, False, q.auto_delete, q.arguments, None)
    for b in plan.bindings:
        vhost = node.vhosts[b.vhost]
        node.bind(vhost, vhost.exchanges[b.source], (b.destination_type, b.destination), b.routing_key,
                  b.arguments)
    for component, vhost_name, name, value in plan.parameters:  # shovels last: what they use exists
        runtime_parameters.set_parameter(node, component, vhost_name, name, value,
                                         acting_user or node.config.default_user)
    for reason in plan.skipped:
        log.info("definitions import: skipped %s", reason)


# -- service functions ------------------------------------------------------------------------------


def export(node: Node, p: Principal, vhost: str | None = None) -> dict[str, Any]:
    """GET /api/definitions or /api/definitions/{vhost}."""
    return export_definitions(node, p) if vhost is None else export_vhost_definitions(node, p, vhost)


def check_import(node: Node, p: Principal, vhost: str | None = None) -> None:
    """May the caller import (into `vhost`)? 401 unless administrator, 404 for a missing vhost."""
    require_admin(p)
    if vhost is not None and vhost not in node.vhosts:
        raise not_found_because("vhost_not_found")


def import_definitions(node: Node, p: Principal, prepared: Prepared, vhost: str | None = None) -> str:
    """POST /api/definitions[/{vhost}]: import everything or nothing; returns the summary."""
    check_import(node, p, vhost)
    try:
        plan = plan_import(node, prepared, vhost)
    except DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    apply_plan(node, plan, p.name)
    summary = plan.summary()
    log.info("definitions imported by user '%s'%s: %s", p.name,
             f" into vhost '{vhost}'" if vhost is not None else "", summary)
    return summary


def load_definitions_file(node: Node, path: str) -> str:
    """Import a definitions file at boot (`load_definitions`), before clients can connect; returns
    the summary. DefinitionsError with a one-line reason (file unreadable, not JSON, not importable)."""
    try:
        with open(path, "rb") as handle:
            payload = handle.read()
    except OSError as exc:
        raise DefinitionsError(exc.strerror or str(exc)) from None
    plan = plan_import(node, prepare(parse_document(payload)), stored_patterns=True)
    apply_plan(node, plan)
    summary = plan.summary()
    log.info("definitions loaded from %s: %s", path, summary)
    return summary


__all__ = [
    "DefinitionsError",
    "NotJson",
    "Plan",
    "Prepared",
    "apply_plan",
    "check_import",
    "export",
    "export_definitions",
    "export_vhost_definitions",
    "import_definitions",
    "load_definitions_file",
    "parse_document",
    "plan_import",
    "prepare",
]


def boot_definitions(node: Node) -> str | None:
    """`load_definitions` at start-up (hutch-server passes this to run_node): None, or a one-line error."""
    path = node.config.load_definitions
    if not path:
        return None
    try:
        load_definitions_file(node, path)
    except DefinitionsError as exc:
        return f"cannot load definitions from {path}: {exc}"
    return None
