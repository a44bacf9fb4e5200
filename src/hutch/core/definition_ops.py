"""Definition operations: every change to the durable definitions as a typed record, with one codec and
one dispatch table.

Owns:
- The records (frozen dataclasses): users, vhosts and permissions (`SetAuth`: the whole auth store, in
  snapshots and older logs; `PatchAuth`: the entries one change added, changed or removed, which is what a
  node records for a change; `RehashUser`: one user's re-hash on first login), topic permissions, the cluster name, exchanges, queues (declare,
  delete, a quorum queue's members), bindings, policies and operator policies, runtime parameters (`SetParameter`, `ClearParameter`: shovels,
  federation upstreams), and the operations of the
  cluster's metadata group (`ClusterJoin`, `ClusterLeave`, `Noop`).
- The stored form: `to_stored(op)` -> a msgpack-able map whose "op" key names the kind
  (`{"op": "queue.declare", "vhost": ..., ...}`), `from_stored(map)` -> the record. This is the form the
  definitions log and snapshot (runtime/broker/definitions.py) and the metadata Raft group
  (cluster/metadata.py) hold on disk, unchanged from before the records existed, so existing data
  directories load: fields that older versions did not write take the defaults they implied
  (`durable` true, `exclusive` false, a queue's `node` this node).
- The dispatch table: `Dispatch(handlers)` maps each kind to its handler and refuses a table that misses
  one of the kinds it must cover (`NODE_OPS` for the node's apply), so a new kind cannot be forgotten.

Rules: pure (no IO, no asyncio). `from_stored` raises only `DefinitionOpError` subclasses: `UnknownOp`
for a kind this version does not know (a reader logs and skips it: a newer node's operation must not stop
an older one from loading), `MalformedOp` for a known kind with a missing field or one of the wrong type.
x-arguments are kept as AMQP-encoded field tables (bytes, so every field type survives); a policy document
as JSON text (so any JSON number survives; msgpack caps integers at 64 bits).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


class DefinitionOpError(ValueError):
    """A stored operation this version cannot turn into a record."""


class UnknownOp(DefinitionOpError):
    pass


class MalformedOp(DefinitionOpError):
    pass


@dataclass(frozen=True, slots=True)
class SetAuth:
    """Users, vhosts and permissions: the whole `AuthStore.to_dict()` after a change."""

    KIND: ClassVar[str] = "auth"
    auth: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PatchAuth:
    """Users, vhosts and permissions: the entries a change added, changed or removed (`core.auth.auth_diff`:
    `[section, key, entry or None]` each). What a node records for a change, so that two members changing
    different entries at once keep both (whole `SetAuth` snapshots from each undid the other's change)."""

    KIND: ClassVar[str] = "auth.patch"
    changes: list[Any]


@dataclass(frozen=True, slots=True)
class RehashUser:
    """A user's imported RabbitMQ hash replaced by scrypt on its first login, if the user's hash is still
    `previous_hash` (a password change since then wins). Its own record, not a `SetAuth`: a whole auth
    document from the member (or worker) where the login happened would undo a change another member
    committed meanwhile."""

    KIND: ClassVar[str] = "auth.rehash"
    user: str
    previous_hash: str
    new_hash: str


@dataclass(frozen=True, slots=True)
class SetClusterName:
    KIND: ClassVar[str] = "cluster_name"
    name: str


@dataclass(frozen=True, slots=True)
class SetTopicPermissions:
    """Every topic permission: rows [vhost, user, exchange, write regex, read regex] (snapshots, older logs)."""

    KIND: ClassVar[str] = "topic_permissions"
    table: list[list[str]]


@dataclass(frozen=True, slots=True)
class PatchTopicPermissions:
    """The topic permissions a change set ([vhost, user, exchange, write regex, read regex]) or removed
    ([vhost, user, exchange]): what a node records for a change, as `PatchAuth` for users."""

    KIND: ClassVar[str] = "topic_permissions.patch"
    changes: list[list[str]]


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    KIND: ClassVar[str] = "exchange.declare"
    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: bytes  # an AMQP field table
    durable: bool = True


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    KIND: ClassVar[str] = "exchange.delete"
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """A queue, with its home node (None: the node reading it) and, for a quorum queue, its Raft group
    id and members."""

    KIND: ClassVar[str] = "queue.declare"
    vhost: str
    name: str
    auto_delete: bool
    arguments: bytes  # an AMQP field table
    node: str | None = None
    durable: bool = True
    exclusive: bool = False
    type: str | None = None  # "quorum", or None for a classic queue
    gid: int | None = None
    members: list[str] | None = None


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    KIND: ClassVar[str] = "queue.delete"
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class SetQueueMembers:
    """A quorum queue's member list changed (hutch-queues add_member / delete_member / grow / shrink)."""

    KIND: ClassVar[str] = "queue.members"
    vhost: str
    name: str
    members: list[str]


@dataclass(frozen=True, slots=True)
class Bind:
    KIND: ClassVar[str] = "bind"
    vhost: str
    source: str
    dest_kind: str  # "queue" or "exchange"
    dest: str
    routing_key: str
    arguments: bytes  # an AMQP field table


@dataclass(frozen=True, slots=True)
class Unbind:
    KIND: ClassVar[str] = "unbind"
    vhost: str
    source: str
    dest_kind: str
    dest: str
    routing_key: str
    arguments: bytes


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """A policy (`operator`: an operator policy) as the JSON text of `Policy.to_dict()`."""

    KIND: ClassVar[str] = "policy.set"
    vhost: str
    name: str
    policy: str
    operator: bool = False


@dataclass(frozen=True, slots=True)
class ClearPolicy:
    KIND: ClassVar[str] = "policy.clear"
    vhost: str
    name: str
    operator: bool = False


@dataclass(frozen=True, slots=True)
class SetVhostLimits:
    """A vhost's whole limits document (`max-connections`, `max-queues`); empty: no limits."""

    KIND: ClassVar[str] = "vhost_limits.set"
    vhost: str
    limits: dict[str, int]


@dataclass(frozen=True, slots=True)
class SetUserLimits:
    """A user's whole limits document (`max-connections`, `max-channels`); empty: no limits."""

    KIND: ClassVar[str] = "user_limits.set"
    user: str
    limits: dict[str, int]


@dataclass(frozen=True, slots=True)
class SetParameter:
    """A runtime parameter (RabbitMQ's component/vhost/name, e.g. a `shovel`): its value as JSON text, and
    the user who set it (a shovel's local connections act as that user: docs/shovel.md)."""

    KIND: ClassVar[str] = "parameter.set"
    component: str
    vhost: str
    name: str
    value: str
    user: str = ""


@dataclass(frozen=True, slots=True)
class ClearParameter:
    KIND: ClassVar[str] = "parameter.clear"
    component: str
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class ClusterJoin:
    """The metadata group's member table: a node joined (`raft_id` None: the next free id)."""

    KIND: ClassVar[str] = "cluster.join"
    name: str
    host: str
    port: int
    raft_id: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterLeave:
    KIND: ClassVar[str] = "cluster.leave"
    name: str


@dataclass(frozen=True, slots=True)
class Noop:
    """Changes nothing: a read barrier of the metadata group."""

    KIND: ClassVar[str] = "noop"


DefinitionOp = (SetAuth | PatchAuth | RehashUser | SetClusterName | SetTopicPermissions | PatchTopicPermissions | DeclareExchange | DeleteExchange | DeclareQueue
                | DeleteQueue | SetQueueMembers | Bind | Unbind | SetPolicy | ClearPolicy | SetVhostLimits
                | SetUserLimits | SetParameter | ClearParameter | ClusterJoin | ClusterLeave | Noop)

NODE_OPS: tuple[type[DefinitionOp], ...] = (SetAuth, PatchAuth, RehashUser, SetClusterName, SetTopicPermissions,
                                             PatchTopicPermissions, DeclareExchange,
                                             DeleteExchange, DeclareQueue, DeleteQueue, SetQueueMembers, Bind, Unbind,
                                             SetPolicy, ClearPolicy, SetVhostLimits, SetUserLimits, SetParameter,
                                             ClearParameter)
"""The kinds a node applies to its definitions (the rest belong to the metadata group)."""
CLUSTER_OPS: tuple[type[DefinitionOp], ...] = (ClusterJoin, ClusterLeave, Noop)
ALL_OPS: tuple[type[DefinitionOp], ...] = NODE_OPS + CLUSTER_OPS

_OPERATOR_KINDS: dict[str, type[SetPolicy | ClearPolicy]] = {"operator_policy.set": SetPolicy, "operator_policy.clear": ClearPolicy}

# -- the codec -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    types: tuple[type, ...]  # what the stored value may be (None allowed when NoneType is in it)
    required: bool
    default: Any = None


@dataclass(frozen=True, slots=True)
class _Spec:
    cls: type[DefinitionOp]
    fields: tuple[_Field, ...] = field(default_factory=tuple)


def _types_of(annotation: Any) -> tuple[type, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(t for a in typing.get_args(annotation) for t in _types_of(a))
    if annotation is type(None):
        return (type(None),)
    base = origin or annotation
    return (int,) if base is int else (base,)


def _spec(cls: type[DefinitionOp]) -> _Spec:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if cls in (SetPolicy, ClearPolicy) and f.name == "operator":
            continue  # stored in the kind's name, not as a field
        required = f.default is dataclasses.MISSING
        fields.append(_Field(f.name, _types_of(hints[f.name]), required, None if required else f.default))
    return _Spec(cls, tuple(fields))


_SPECS: dict[str, _Spec] = {cls.KIND: _spec(cls) for cls in ALL_OPS}
_SPECS.update({kind: _SPECS[cls.KIND] for kind, cls in _OPERATOR_KINDS.items()})


def kind_of(op: DefinitionOp) -> str:
    """The stored name of an operation's kind ("queue.declare", "operator_policy.set", ...)."""
    if isinstance(op, SetPolicy | ClearPolicy) and op.operator:
        return "operator_" + op.KIND
    return op.KIND


def to_stored(op: Any) -> dict[str, Any]:
    """The map the definitions log and the metadata group store for `op`."""
    kind = getattr(op, "KIND", None)
    spec = _SPECS.get(kind) if isinstance(kind, str) else None
    if spec is None or type(op) is not spec.cls:
        raise TypeError(f"not a definition operation: {type(op).__name__}")
    out: dict[str, Any] = {"op": kind_of(op)}
    for f in spec.fields:
        value = getattr(op, f.name)
        if value is not None or f.required:  # an unset optional field is left out, as before the records
            out[f.name] = value
    return out


def from_stored(stored: Any) -> DefinitionOp:
    """The record of a stored operation, as written by this version or an earlier one."""
    if not isinstance(stored, dict):
        raise MalformedOp(f"a definition operation must be a map, got {type(stored).__name__}")
    kind = stored.get("op")
    spec = _SPECS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise UnknownOp(f"unknown definition operation {kind!r}")
    values: dict[str, Any] = {}
    for f in spec.fields:
        if f.name not in stored:
            if f.required:
                raise MalformedOp(f"definition operation {kind!r} has no {f.name!r}")
            continue
        value = stored[f.name]
        if type(value) is int and bool in f.types:
            value = bool(value)
        if not isinstance(value, f.types) or (isinstance(value, bool) and bool not in f.types):
            raise MalformedOp(f"definition operation {kind!r}: {f.name!r} is {type(value).__name__}")
        values[f.name] = list(value) if isinstance(value, tuple) else value
    if kind in _OPERATOR_KINDS:
        values["operator"] = True
    return spec.cls(**values)


# -- the dispatch table ----------------------------------------------------------------------------------


class Dispatch:
    """`handlers` by kind; `dispatch(op)` calls the one for `type(op)`. Construction fails when a kind of
    `covers` has no handler, so adding a kind without its handler is caught when the table is built."""

    __slots__ = ("_handlers",)

    def __init__(self, handlers: Mapping[type, Callable[[Any], Any]], covers: tuple[type, ...] = NODE_OPS) -> None:
        missing = [k.__name__ for k in covers if k not in handlers]
        if missing:
            raise TypeError(f"no handler for definition operations {', '.join(missing)}")
        self._handlers = dict(handlers)

    def __call__(self, op: Any) -> Any:
        handler = self._handlers.get(type(op))
        if handler is None:
            raise UnknownOp(f"no handler for definition operation {type(op).__name__}")
        return handler(op)


__all__ = [
    "ALL_OPS", "CLUSTER_OPS", "NODE_OPS", "Bind", "ClearParameter", "ClearPolicy", "ClusterJoin", "ClusterLeave", "DeclareExchange",
    "DeclareQueue", "DefinitionOp", "DefinitionOpError", "DeleteExchange", "DeleteQueue", "Dispatch", "MalformedOp",
    "Noop", "PatchAuth", "PatchTopicPermissions", "RehashUser", "SetAuth", "SetClusterName", "SetParameter", "SetPolicy", "SetQueueMembers", "SetTopicPermissions", "SetUserLimits", "SetVhostLimits", "Unbind",
    "UnknownOp", "from_stored", "kind_of", "to_stored",
]
