"""Runtime parameters on a running node (RabbitMQ's `rabbit_runtime_parameters`): component, vhost, name
and a JSON value, saved with the durable definitions.

Owns: `ParameterStore` (the parameters of every component this node serves, with the user who set each)
and the node-side operations on it: `set_parameter`, `clear_parameter`, `forget_vhost`, the definition-log
operations (`SetParameter`, `ClearParameter` of core/definition_ops.py) with their replay (`apply_op`) and
their place in a snapshot (`state_ops`), and the watchers told of every change (the shovel service).

Rules:
- A value is validated by its component's validator before it is stored (`VALIDATORS`: `shovel` by
  core/shovel.py, `federation-upstream` and `federation-upstream-set` by core/federation.py); a component with no validator is refused, as RabbitMQ refuses an unknown component.
- A change is recorded (fdatasync'd, or replicated through the metadata group on a clustered node) before
  the caller replies; every node applies it and tells its watchers, so each node's shovel service sees the
  same parameters.
- Deleting a vhost clears its parameters (recorded), so a vhost created again under the same name starts
  without them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hutch.core import federation, shovel
from hutch.core.definition_ops import ClearParameter, SetParameter

if TYPE_CHECKING:
    from hutch.core.definition_ops import DefinitionOp
    from hutch.core.vhost import VirtualHost

# component -> validator(name, value) raising ValueError with the text the client sees
VALIDATORS: dict[str, Callable[[str, Any], object]] = {
    shovel.COMPONENT: shovel.parse_shovel,
    federation.UPSTREAM: federation.parse_upstream,
    federation.UPSTREAM_SET: federation.parse_upstream_set,
}

Key = tuple[str, str, str]  # component, vhost, name


class UnknownComponent(KeyError):
    pass


@dataclass(frozen=True)
class Parameter:
    component: str
    vhost: str
    name: str
    value: Any
    user: str = ""

    def to_dict(self) -> dict[str, Any]:
        """RabbitMQ's form in the API and in definitions files."""
        return {"value": self.value, "vhost": self.vhost, "component": self.component, "name": self.name}


Watcher = Callable[[Parameter | None, Key], None]  # (the new parameter or None when cleared, its key)


class ParameterStore:
    """Every runtime parameter, in the order set. Watchers are told after each change."""

    def __init__(self) -> None:
        self._items: dict[Key, Parameter] = {}
        self.watchers: list[Watcher] = []

    def get(self, component: str, vhost: str, name: str) -> Parameter | None:
        return self._items.get((component, vhost, name))

    def list(self, component: str | None = None, vhost: str | None = None) -> list[Parameter]:
        return [p for p in self._items.values()
                if (component is None or p.component == component) and (vhost is None or p.vhost == vhost)]

    def put(self, p: Parameter) -> bool:
        """Store `p`; False when an identical one was there (nothing changes, nobody is told)."""
        key = (p.component, p.vhost, p.name)
        if self._items.get(key) == p:
            return False
        self._items[key] = p
        for watcher in list(self.watchers):
            watcher(p, key)
        return True

    def remove(self, key: Key) -> bool:
        if self._items.pop(key, None) is None:
            return False
        for watcher in list(self.watchers):
            watcher(None, key)
        return True


class ParameterHost(Protocol):
    """What parameters need of the node (`broker/node.py`)."""

    vhosts: dict[str, VirtualHost]
    parameters: ParameterStore

    def _record(self, op: DefinitionOp) -> None: ...


def validate(component: str, name: str, value: Any) -> None:
    """Raise UnknownComponent, or ValueError with the component's texts."""
    validator = VALIDATORS.get(component)
    if validator is None:
        raise UnknownComponent(component)
    validator(name, value)


def set_parameter(node: ParameterHost, component: str, vhost: str, name: str, value: Any, user: str = "") -> bool:
    """Validate, store and record a parameter; False when it was already set to this value."""
    if vhost not in node.vhosts:
        raise KeyError(f"vhost '{vhost}' does not exist")
    validate(component, name, value)
    if not node.parameters.put(Parameter(component, vhost, name, value, user)):
        return False
    node._record(SetParameter(component, vhost, name, json.dumps(value), user))
    return True


def clear_parameter(node: ParameterHost, component: str, vhost: str, name: str) -> bool:
    """Remove a parameter and record it; False when there was none."""
    if not node.parameters.remove((component, vhost, name)):
        return False
    node._record(ClearParameter(component, vhost, name))
    return True


def forget_vhost(node: ParameterHost, vhost: str) -> None:
    for p in node.parameters.list(vhost=vhost):
        clear_parameter(node, p.component, p.vhost, p.name)


def apply_op(node: ParameterHost, op: SetParameter | ClearParameter) -> None:
    """Replay one saved (or replicated) operation; a parameter this version cannot validate is an
    error the caller logs and skips."""
    if isinstance(op, SetParameter):
        set_parameter(node, op.component, op.vhost, op.name, json.loads(op.value), op.user)
    else:
        clear_parameter(node, op.component, op.vhost, op.name)


def state_ops(node: ParameterHost) -> Iterator[SetParameter]:
    for p in node.parameters.list():
        if p.vhost in node.vhosts:
            yield SetParameter(p.component, p.vhost, p.name, json.dumps(p.value), p.user)


def reset(node: ParameterHost) -> None:
    """Clear every parameter without recording (a metadata snapshot sets them again)."""
    for p in node.parameters.list():
        node.parameters.remove((p.component, p.vhost, p.name))


__all__ = ["VALIDATORS", "Parameter", "ParameterStore", "UnknownComponent", "apply_op", "clear_parameter",
           "forget_vhost", "reset", "set_parameter", "state_ops", "validate"]
