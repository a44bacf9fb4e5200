"""Policies and operator policies: what they are, which one applies, and what a queue ends up with.

Owns: `Policy` (one validated policy: vhost, name, pattern, definition, priority, apply-to),
`make_policy` (validation with RabbitMQ's rules and error texts), `PolicyStore` (every policy and
operator policy of a node, by vhost, with matching and a JSON-able form for persistence), and the
pure functions that turn a queue's x-arguments plus its policy and operator policy into the
`QueueSettings` it runs with (`effective_settings`), and an exchange's policy into its alternate
exchange (`exchange_alternate`). No IO, no clocks; the runtime (runtime/broker/policies.py) applies results.

Rules (RabbitMQ's rabbit_policy / rabbit_policies; docs/policies.md explains each):
- A policy matches a queue or exchange of its vhost whose name its pattern finds anywhere
  (a search, as Erlang's `re:run`: anchor with `^`/`$`), when `apply-to` fits: `all`, `queues`,
  `exchanges`, or one queue type (`classic_queues`, `quorum_queues`, `streams`). Patterns are RE2
  (core/patterns.py: linear time, so a policymaker's pattern cannot stall the node on a declare); one
  RE2 refuses is a validation error when set, and matches nothing (with a warning) when it was
  stored before (`from_dict`: the definitions log, replicated metadata).
- At most one policy and one operator policy apply to an object: the matching one with the highest
  priority. Equal priorities: RabbitMQ leaves the choice undefined; hutch takes the smallest name, so
  the choice is stable across restarts.
- Definitions never merge across policies. A policy's and an operator policy's definitions merge as
  RabbitMQ's `merge_operator_definitions`: for a key in both, the smaller number for the numeric keys
  (NUMERIC_KEYS), else the operator policy's value. That is what management shows as
  `effective_policy_definition`.
- Precedence for a queue setting (seed 001, docs/policies.md): a client x-argument beats the policy;
  an operator policy beats both, except for the numeric keys, where the smaller of the operator
  policy's value and the (x-argument or policy) value applies. `RESOLVE` holds the rule per key.
- Validation: unknown keys, wrong types and out-of-range values are `PolicyError`s whose text names
  the key or value (one line, RabbitMQ's wording after "Validation failed: "). Ranges are RabbitMQ's,
  with the upper bounds the same x-arguments have (core/arguments.py): message-ttl and expires at most
  10 years in ms (RabbitMQ's check_expiry), the other integers at most 2^63-1.
- Classic queue mirroring (`MIRRORING_KEYS`: ha-mode, ha-params, ...) is refused, in policies and operator
  policies alike, with a text naming quorum queues as the replacement (RabbitMQ 4.0 removed mirroring;
  docs/quorum-queues.md, "Operations").
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .arguments import INT64_MAX, MAX_EXPIRY_MS
from .patterns import PatternError, UserPattern, accepted_before, compile_pattern, compile_stored
from .queue_settings import POLICY_FIELDS, QueueSettings, settings_from_arguments

POLICY = "policy"
OPERATOR_POLICY = "operator_policy"

QUEUE = "queue"
EXCHANGE = "exchange"

APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
# queue type -> the apply-to value that names queues of that type only
QUEUE_TYPE_APPLY_TO = {"classic": "classic_queues", "quorum": "quorum_queues", "stream": "streams"}

NUMERIC_KEYS = frozenset({"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit"})
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")  # the last two: RabbitMQ 3.x names
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")  # quorum queues (docs/quorum-queues.md)


def _format(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _int_at_least(minimum: int, what: str, maximum: int = INT64_MAX) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if type(value) is int and minimum <= value <= maximum:
            return None
        return f"{_format(value)} is not a valid {what}"

    return check


def _string(what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) else f"{_format(value)} is not a valid {what}"

    return check


_DURATION = re.compile(r"^[0-9]+[YMDhms]$")


def _duration(what: str) -> Callable[[Any], str | None]:
    """A stream's max-age: "7D", "12h", "30m", "10s" (units Y M D h m s, as RabbitMQ's)."""
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and _DURATION.match(value) else f"{_format(value)} is not a valid {what}"

    return check


def _one_of(choices: tuple[str, ...], what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and value in choices else f"{_format(value)} is not a valid {what}"

    return check


# policy key -> its check (None when valid, else the error text); rabbit_policies:validate_policy0
POLICY_KEYS: dict[str, Callable[[Any], str | None]] = {
    "message-ttl": _int_at_least(0, "message TTL", MAX_EXPIRY_MS),
    "expires": _int_at_least(1, "queue expiry", MAX_EXPIRY_MS),
    "max-length": _int_at_least(0, "maximum length"),
    "max-length-bytes": _int_at_least(0, "maximum length in bytes"),
    "overflow": _one_of(("drop-head", "reject-publish", "reject-publish-dlx"), "overflow value"),
    "dead-letter-exchange": _string("dead letter exchange name"),
    "dead-letter-routing-key": _string("dead letter routing key"),
    "delivery-limit": _int_at_least(-1, "delivery limit"),  # -1: no limit (RabbitMQ 4.x)
    "dead-letter-strategy": _one_of(DEAD_LETTER_STRATEGIES, "dead letter strategy"),
    "alternate-exchange": _string("alternate exchange name"),
    "queue-leader-locator": _one_of(LEADER_LOCATORS, "queue leader locator value"),
    "max-age": _duration("max age"),  # streams (docs/streams.md)
    "stream-max-segment-size-bytes": _int_at_least(1, "stream max segment size"),
}
# the keys an operator policy may set (RabbitMQ's operator_policy_validator registrations, plus
# overflow, which RabbitMQ 4.x added with "operator policy value" as its merge rule, and
# dead-letter-strategy, which issue 16 asks operators to be able to enforce; same rule)
OPERATOR_POLICY_KEYS = frozenset({"message-ttl", "expires", "max-length", "max-length-bytes",
                                  "delivery-limit", "overflow", "dead-letter-strategy"})


# classic queue mirroring, removed in RabbitMQ 4.0: refused with the replacement named, not as unknown keys
MIRRORING_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure",
                  "ha-sync-batch-size")


class PolicyError(ValueError):
    """An invalid policy: the text is the reason given to the client (one line)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """One validated policy or operator policy. Invariant: built by `make_policy` (or `from_dict`,
    which calls it), so the pattern compiles and the definition passed validation."""

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int | float = 0
    apply_to: str = "all"
    stored: bool = field(default=False, repr=False, compare=False)
    regex: UserPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stored:  # the pattern was accepted before: never refuse it now (a node must start)
            regex = compile_stored(self.pattern, f"pattern of policy '{self.name}' in vhost '{self.vhost}'")
        else:
            regex = compile_pattern(self.pattern)
        object.__setattr__(self, "regex", regex)

    def applies_to(self, kind: str, queue_type: str = "classic") -> bool:
        apply_to = self.apply_to
        if apply_to == "all":
            return True
        if kind == EXCHANGE:
            return apply_to == "exchanges"
        return apply_to == "queues" or apply_to == QUEUE_TYPE_APPLY_TO.get(queue_type)

    def matches(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        return self.applies_to(kind, queue_type) and self.regex.search(name)

    def to_dict(self) -> dict[str, Any]:
        """RabbitMQ's JSON shape of a policy (GET /api/policies)."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], operator: bool = False) -> Policy:
        """A stored policy (the definitions log, replicated metadata): validated as `make_policy`
        does, except that a pattern RE2 refuses matches nothing (logged) instead of being refused."""
        return make_policy(doc["vhost"], doc["name"], doc["pattern"], doc["definition"],
                           doc.get("priority", 0), doc.get("apply-to", "all"), operator=operator, stored=True)


def validate_definition(definition: Any, operator: bool = False) -> dict[str, Any]:
    """A copy of a valid definition; raises PolicyError naming the first bad key or value."""
    if not isinstance(definition, dict):
        raise PolicyError(f"Validation failed: definition must be a dictionary: {_format(definition)}")
    if not definition:
        raise PolicyError("Validation failed: no policy provided")
    kind = "operator policy" if operator else "policy"
    mirroring = [key for key in definition if key in MIRRORING_KEYS]
    if mirroring:  # RabbitMQ 4.x's text, and what to do instead
        raise PolicyError(f"Validation failed: {_format(mirroring)} are not recognised {kind} settings: classic "
                          "queue mirroring was removed; use quorum queues (x-queue-type: quorum) for replicated "
                          "queues; see hutch-queues migrate_mirrored")
    allowed = OPERATOR_POLICY_KEYS if operator else POLICY_KEYS.keys()
    unknown = [key for key in definition if key not in allowed]
    if unknown:
        raise PolicyError(f"Validation failed: {_format(unknown)} are not recognised {kind} settings")
    for key, value in definition.items():
        error = POLICY_KEYS[key](value)
        if error is not None:
            raise PolicyError(f"Validation failed: {error}")
    return dict(definition)


def make_policy(vhost: str, name: str, pattern: Any, definition: Any, priority: Any = 0,
                apply_to: Any = "all", operator: bool = False, stored: bool = False) -> Policy:
    """A validated Policy; raises PolicyError (RabbitMQ's checks: rabbit_policy:policy_validation).
    `stored`: the policy was accepted before (see `Policy.from_dict`); its pattern is not refused."""
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise PolicyError(f"Validation failed: priority should be a number, actually was {_format(priority)}")
    if not isinstance(pattern, str):
        raise PolicyError(f"Validation failed: pattern should be a string, actually was {_format(pattern)}")
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        if not (stored and accepted_before(pattern)):  # a stored one compiles to "matches nothing"
            raise PolicyError(f"Validation failed: {_format(pattern)} is not a valid regular expression: "
                              f"{exc.reason}") from None
    if apply_to is None:
        apply_to = "all"
    if apply_to not in APPLY_TO:
        raise PolicyError(f"Validation failed: apply-to '{apply_to}' unrecognised; should be one of: "
                          "'queues', 'classic_queues', 'quorum_queues', 'streams', 'exchanges', or 'all'")
    return Policy(vhost, name, pattern, validate_definition(definition, operator), priority, apply_to, stored)


def select(policies: Iterable[Policy], kind: str, name: str, queue_type: str = "classic") -> Policy | None:
    """The policy that applies to an object: the matching one with the highest priority, then the
    smallest name."""
    best: Policy | None = None
    for p in policies:
        if not p.matches(kind, name, queue_type):
            continue
        if best is None or p.priority > best.priority or (p.priority == best.priority and p.name < best.name):
            best = p
    return best


# -- what a queue and an exchange end up with ---------------------------------------------------------


def merged_definition(policy: Policy | None, operator_policy: Policy | None) -> dict[str, Any]:
    """RabbitMQ's merge_operator_definitions: the union of both definitions; a key in both takes the
    smaller number for NUMERIC_KEYS, else the operator policy's value."""
    out = dict(policy.definition) if policy is not None else {}
    if operator_policy is not None:
        for key, op_value in operator_policy.definition.items():
            if key in out and key in NUMERIC_KEYS:
                out[key] = _smaller(out[key], op_value, key)
            else:
                out[key] = op_value
    return out


def _client_first(arg: Any, policy: Any, op: Any) -> Any:
    """x-argument beats the policy; an operator policy beats both."""
    if op is not None:
        return op
    return arg if arg is not None else policy


def _smaller(a: Any, b: Any, key: str) -> Any:
    """The smaller of two values of a numeric key; a negative delivery limit means "no limit", so it is
    the larger one (RabbitMQ 4.x's rabbit_quorum_queue:resolve_delivery_limit)."""
    if key == "delivery-limit" and (a < 0 or b < 0):
        return max(a, b)
    return min(a, b)


def _smaller_of_operator(arg: Any, policy: Any, op: Any, key: str = "") -> Any:
    """x-argument beats the policy; the operator policy caps the result (the smaller one applies)."""
    base = arg if arg is not None else policy
    if op is None:
        return base
    return op if base is None else _smaller(base, op, key)


def _numeric(key: str) -> Callable[[Any, Any, Any], Any]:
    return lambda arg, policy, op: _smaller_of_operator(arg, policy, op, key)


# policy key -> how (x-argument, policy value, operator policy value) resolve; None means "not set"
RESOLVE: dict[str, Callable[[Any, Any, Any], Any]] = {
    key: _numeric(key) if key in NUMERIC_KEYS else _client_first for key in POLICY_FIELDS
}


def effective_settings(arguments: dict[str, Any], policy: Policy | None,
                       operator_policy: Policy | None) -> QueueSettings:
    """The settings a queue runs with, from its (validated) x-arguments, the policy and the operator
    policy that apply to it (either may be None)."""
    base = settings_from_arguments(arguments)
    if policy is None and operator_policy is None:
        return base
    pdef = policy.definition if policy is not None else {}
    odef = operator_policy.definition if operator_policy is not None else {}
    changes: dict[str, Any] = {}
    for key, fld in POLICY_FIELDS.items():
        xarg = "x-" + key
        arg_value = getattr(base, fld) if arguments.get(xarg) is not None else None
        value = RESOLVE[key](arg_value, pdef.get(key), odef.get(key))
        if value is not None:
            changes[fld] = value
    return replace(base, **changes,
                   policy=policy.name if policy is not None else None,
                   operator_policy=operator_policy.name if operator_policy is not None else None,
                   effective_policy_definition=merged_definition(policy, operator_policy))


def exchange_alternate(arguments: dict[str, Any], policy: Policy | None) -> str | None:
    """An exchange's alternate exchange: its `alternate-exchange` argument, else its policy's."""
    argument = arguments.get("alternate-exchange")
    if isinstance(argument, str):
        return argument
    if policy is not None:
        value = policy.definition.get("alternate-exchange")
        if isinstance(value, str):
            return value
    return None


# -- the store ------------------------------------------------------------------------------------------


class PolicyStore:
    """Every policy and operator policy of a node. Invariant: `_by_kind[kind][vhost][name]` is the
    policy `name` of that kind in `vhost`; empty vhost maps are removed."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, dict[str, Policy]]] = {POLICY: {}, OPERATOR_POLICY: {}}

    @staticmethod
    def kind(operator: bool) -> str:
        return OPERATOR_POLICY if operator else POLICY

    def set(self, policy: Policy, operator: bool = False) -> bool:
        """Add or replace a policy; True if it was new."""
        by_name = self._by_kind[self.kind(operator)].setdefault(policy.vhost, {})
        created = policy.name not in by_name
        by_name[policy.name] = policy
        return created

    def clear(self, vhost: str, name: str, operator: bool = False) -> Policy | None:
        """Remove a policy; returns it, or None if there was none."""
        by_vhost = self._by_kind[self.kind(operator)]
        by_name = by_vhost.get(vhost)
        if by_name is None:
            return None
        removed = by_name.pop(name, None)
        if not by_name:
            del by_vhost[vhost]
        return removed

    def get(self, vhost: str, name: str, operator: bool = False) -> Policy | None:
        return self._by_kind[self.kind(operator)].get(vhost, {}).get(name)

    def list(self, vhost: str | None = None, operator: bool = False) -> builtins.list[Policy]:
        """Policies of one vhost (or all), by vhost then name."""
        by_vhost = self._by_kind[self.kind(operator)]
        names = [vhost] if vhost is not None else sorted(by_vhost)
        return [p for v in names for _, p in sorted(by_vhost.get(v, {}).items())]

    def vhosts(self) -> builtins.set[str]:
        return {v for by_vhost in self._by_kind.values() for v in by_vhost}

    def match_queue(self, vhost: str, name: str, queue_type: str = "classic") -> tuple[Policy | None, Policy | None]:
        """(policy, operator policy) that apply to a queue."""
        return (select(self._by_kind[POLICY].get(vhost, {}).values(), QUEUE, name, queue_type),
                select(self._by_kind[OPERATOR_POLICY].get(vhost, {}).values(), QUEUE, name, queue_type))

    def match_exchange(self, vhost: str, name: str) -> tuple[Policy | None, Policy | None]:
        return (select(self._by_kind[POLICY].get(vhost, {}).values(), EXCHANGE, name),
                select(self._by_kind[OPERATOR_POLICY].get(vhost, {}).values(), EXCHANGE, name))

    def delete_vhost(self, vhost: str) -> int:
        """Drop every policy of a vhost; returns how many."""
        return sum(len(by_vhost.pop(vhost, {})) for by_vhost in self._by_kind.values())

    def __iter__(self) -> Iterator[tuple[bool, Policy]]:
        """(operator, policy) for every policy, regular ones first."""
        for operator in (False, True):
            for p in self.list(operator=operator):
                yield operator, p

    def to_dict(self) -> dict[str, Any]:
        return {"policies": [p.to_dict() for p in self.list()],
                "operator_policies": [p.to_dict() for p in self.list(operator=True)]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PolicyStore:
        store = cls()
        for item in doc.get("policies", []):
            store.set(Policy.from_dict(item))
        for item in doc.get("operator_policies", []):
            store.set(Policy.from_dict(item, operator=True), operator=True)
        return store


__all__ = [
    "APPLY_TO",
    "EXCHANGE",
    "MIRRORING_KEYS",
    "NUMERIC_KEYS",
    "OPERATOR_POLICY",
    "OPERATOR_POLICY_KEYS",
    "POLICY",
    "POLICY_KEYS",
    "QUEUE",
    "RESOLVE",
    "Policy",
    "PolicyError",
    "PolicyStore",
    "effective_settings",
    "exchange_alternate",
    "make_policy",
    "merged_definition",
    "select",
    "validate_definition",
]
