"""Validation of queue x-arguments (queue.declare) and consumer arguments (basic.consume).

Owns: which x-arguments each queue type accepts, the values each may take, and the 406 errors a client
sees otherwise. It follows RabbitMQ 4.x (`rabbit_amqqueue:check_declare_arguments/3`,
`declare_args/0`, `consume_args/0` and the `queue_arguments` / `consumer_arguments` capabilities of
`rabbit_classic_queue`, `rabbit_quorum_queue` and `rabbit_stream_queue`); the error texts start as
RabbitMQ's do ("invalid arg 'x-max-length' for queue 'q' in vhost '/': ...") but the detail is a
sentence naming the value and what is allowed, not an Erlang term such as `{value_negative,-1}`.

Rules:
- An argument in the queue type's table is checked; an argument another queue type supports (e.g.
  x-max-age, a stream argument, on a classic queue) is refused, as RabbitMQ does; any other key,
  x- or not, is accepted and ignored (RabbitMQ does the same, and clients rely on it).
- Value checks run in the table's order (RabbitMQ's `declare_args()` order), then unsupported keys,
  so one declaration always yields the same error.
- Integers: a Python int from any AMQP integer field (b B s u I i l L). `bool` (field `t`) and
  `Timestamp` (field `T`) are int subclasses in Python but not integers to RabbitMQ
  (`?INTEGER_ARG_TYPES`), so they are refused, as are floats, decimals, strings and void.
- Only declarations that create a queue are validated (RabbitMQ runs these checks in
  `rabbit_amqqueue:declare/7`, after an existing queue was found equivalent or not).

Pure: no IO; raises `ChannelError` (406, class/method of the method being validated).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hutch.amqp.errors import PRECONDITION_FAILED, REPLY_NAMES, ChannelError
from hutch.amqp.table import Timestamp

from .queue_settings import OVERFLOW_MODES

QUEUE_DECLARE = (50, 10)
BASIC_CONSUME = (60, 20)

INT64_MAX = 2**63 - 1  # the largest value an AMQP table integer ('l') carries
# rabbit_misc:check_expiry/1 (4.x; 3.10 had no upper bound): TTLs and queue expiry are capped at 10 years in ms
MAX_EXPIRY_MS = 315_360_000_000
MAX_PRIORITY = 255  # rabbit.hrl ?MAX_SUPPORTED_PRIORITY
QUEUE_MODES = ("default", "lazy")  # rabbit_amqqueue ?KNOWN_QUEUE_MODES (no effect since 3.12)
QUEUE_VERSIONS = (1, 2)  # check_queue_version/2 in 3.10-4.2 (hutch has one format; both are accepted)
# rabbit_queue_location ?QUEUE_LEADER_LOCATORS; RabbitMQ 4.x reads x-queue-master-locator as an alias
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")

# the reply text is a shortstr: RabbitMQ clips it to 255 characters (rabbit_binary_generator:map_exception)
_REPLY_TEXT_MAX_BYTES = 255 - len(f"{REPLY_NAMES[PRECONDITION_FAILED]} - ")
_SHOW_MAX_CHARS = 40


# -- how values are shown in errors -------------------------------------------------------------------
def _kind(value: Any) -> str:
    """What the client sent, in AMQP field-table terms, with an article."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Timestamp | _dt.datetime):
        return "a timestamp"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, Decimal):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bytes | bytearray | memoryview):
        return "a byte string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = f"'{value}'"
    elif isinstance(value, Timestamp):
        text = str(int(value))
    elif isinstance(value, int) and value.bit_length() > 128:  # str() of a huge int is slow, or refused
        text = f"a {value.bit_length()}-bit number"
    else:
        text = repr(value) if not isinstance(value, int | float | Decimal) else str(value)
    if len(text) > _SHOW_MAX_CHARS:
        text = text[: _SHOW_MAX_CHARS - 3] + "..."
    return text


def _wrong_type(value: Any, wanted: str, expected: str) -> str:
    if value is None:
        return f"no value (void); expected {expected}"
    return f"{_show(value)} is {_kind(value)}, not {wanted}; expected {expected}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool | Timestamp)


def _clip(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= _REPLY_TEXT_MAX_BYTES:
        return text
    return raw[: _REPLY_TEXT_MAX_BYTES - 3].decode("utf-8", "ignore") + "..."


# -- value rules --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class IntRule:
    """An integer from `minimum` to `maximum` (inclusive; None: any 64-bit integer); `unit` is said in
    the expectation."""

    minimum: int | None = 0
    maximum: int = INT64_MAX
    unit: str = ""

    def expected(self) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        if self.minimum is None:
            return f"an integer{unit}"
        if self.maximum >= INT64_MAX:
            return f"an integer >= {self.minimum}{unit}"
        return f"an integer from {self.minimum} to {self.maximum}{unit}"

    def problem(self, value: Any, _arguments: dict[str, Any]) -> str | None:
        if not _is_int(value):
            return _wrong_type(value, "an integer", self.expected())
        if not -INT64_MAX - 1 <= value <= INT64_MAX:  # only from the HTTP API: the wire carries 64 bits
            return f"{_show(value)} does not fit in 64 bits; expected {self.expected()}"
        if self.minimum is not None and value < self.minimum:
            what = "negative" if value < 0 else "too small"
            return f"{value} is {what}; expected {self.expected()}"
        if value > self.maximum:
            return f"{value} is too large; expected {self.expected()}"
        return None


@dataclass(frozen=True, slots=True)
class IntChoiceRule:
    """One of a few integers (x-queue-version)."""

    choices: tuple[int, ...]

    def expected(self) -> str:
        return "one of " + ", ".join(str(c) for c in self.choices)

    def problem(self, value: Any, _arguments: dict[str, Any]) -> str | None:
        if not _is_int(value):
            return _wrong_type(value, "an integer", "the integer " + " or ".join(str(c) for c in self.choices))
        if value not in self.choices:
            return f"{value} is not {self.expected()}"
        return None


@dataclass(frozen=True, slots=True)
class ChoiceRule:
    """One of a few strings (x-overflow, x-queue-mode, locators)."""

    choices: tuple[str, ...]

    def expected(self) -> str:
        return "one of " + ", ".join(self.choices)

    def problem(self, value: Any, _arguments: dict[str, Any]) -> str | None:
        if not isinstance(value, str):
            return _wrong_type(value, "a string", self.expected())
        if value not in self.choices:
            return f"{_show(value)} is not {self.expected()}"
        return None


@dataclass(frozen=True, slots=True)
class StrRule:
    """A string; `requires` names an argument that must be present too (RabbitMQ refuses a dead-letter
    routing key without a dead-letter exchange: `routing_key_but_no_dlx_defined`)."""

    what: str
    requires: str | None = None

    def problem(self, value: Any, arguments: dict[str, Any]) -> str | None:
        if not isinstance(value, str):
            return _wrong_type(value, "a string", self.what)
        if self.requires is not None and self.requires not in arguments:
            return f"{_show(value)} is set but {self.requires} is not; {self.what} needs {self.requires}"
        return None


@dataclass(frozen=True, slots=True)
class BoolRule:
    def problem(self, value: Any, _arguments: dict[str, Any]) -> str | None:
        if not isinstance(value, bool):
            return _wrong_type(value, "a boolean", "true or false")
        return None


Rule = IntRule | IntChoiceRule | ChoiceRule | StrRule | BoolRule

# -- the tables ---------------------------------------------------------------------------------------
# Every queue argument RabbitMQ 4.x knows, with its rule (rabbit_amqqueue:declare_args/0). Order matters:
# it is the order checks run in. x-delivery-limit has no validator in RabbitMQ (quorum queues read a
# negative value as "no limit"); hutch requires an integer >= -1, -1 being RabbitMQ 4.x's documented "no
# limit" (quorum queues otherwise default to 20, docs/quorum-queues.md).
DECLARE_RULES: dict[str, Rule] = {
    "x-expires": IntRule(1, MAX_EXPIRY_MS, "ms"),
    "x-message-ttl": IntRule(0, MAX_EXPIRY_MS, "ms"),
    "x-dead-letter-exchange": StrRule("an exchange name"),
    "x-dead-letter-routing-key": StrRule("a dead-letter routing key", requires="x-dead-letter-exchange"),
    "x-dead-letter-strategy": ChoiceRule(("at-most-once", "at-least-once")),
    "x-max-length": IntRule(0),
    "x-max-length-bytes": IntRule(0),
    "x-max-in-memory-length": IntRule(0),
    "x-max-in-memory-bytes": IntRule(0),
    "x-max-priority": IntRule(0, MAX_PRIORITY),
    "x-overflow": ChoiceRule(OVERFLOW_MODES),
    "x-queue-mode": ChoiceRule(QUEUE_MODES),
    "x-queue-version": IntChoiceRule(QUEUE_VERSIONS),
    "x-single-active-consumer": BoolRule(),
    "x-delivery-limit": IntRule(-1),
    "x-consumer-timeout": IntRule(0, INT64_MAX, "ms"),
    "x-quorum-initial-group-size": IntRule(1),
    "x-stream-max-segment-size-bytes": IntRule(0),
    "x-stream-filter-size-bytes": IntRule(0),
    "x-initial-cluster-size": IntRule(1),
    "x-queue-leader-locator": ChoiceRule(LEADER_LOCATORS),
    "x-queue-master-locator": ChoiceRule(LEADER_LOCATORS),
}

# The `queue_arguments` capability of each queue type. Classic is rabbit_classic_queue:capabilities/0
# (v4.2.9) plus what hutch adds to classic queues: x-delivery-limit and x-consumer-timeout. Quorum and
# stream are RabbitMQ's v4.2.9 lists; they serve here to say which type an argument belongs to.
QUEUE_TYPE_ARGUMENTS: dict[str, frozenset[str]] = {
    "classic": frozenset({
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
        "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
        "x-single-active-consumer", "x-queue-type", "x-queue-master-locator", "x-queue-leader-locator",
        "x-delivery-limit", "x-consumer-timeout",
    }),
    "quorum": frozenset({
        "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", "x-expires",
        "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
        "x-overflow", "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size",
        "x-delivery-limit", "x-message-ttl", "x-queue-leader-locator",
    }),
    "stream": frozenset({
        "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
    }),
}
SUPPORTED_QUEUE_TYPES = ("classic", "quorum", "stream")  # the types validate_queue_arguments accepts (node.py creates)
DEFAULTABLE_QUEUE_TYPES = ("classic", "quorum")  # what a vhost's default_queue_type may name
KNOWN_QUEUE_ARGUMENTS = frozenset().union(*QUEUE_TYPE_ARGUMENTS.values())

# basic.consume: rabbit_amqqueue:consume_args/0 and the `consumer_arguments` capabilities. x-priority is
# any integer (check_int_arg/2: no range).
CONSUME_RULES: dict[str, Rule] = {
    "x-priority": IntRule(None),
}
CONSUMER_TYPE_ARGUMENTS: dict[str, frozenset[str]] = {
    "classic": frozenset({"x-priority"}),
    "quorum": frozenset({"x-priority"}),
    "stream": frozenset({"x-stream-offset", "x-stream-filter", "x-stream-match-unfiltered"}),
}
KNOWN_CONSUMER_ARGUMENTS = frozenset().union(*CONSUMER_TYPE_ARGUMENTS.values())


# -- the validators -----------------------------------------------------------------------------------
def _invalid(arg: str, queue: str, vhost: str, detail: str, method: tuple[int, int]) -> ChannelError:
    text = _clip(f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {detail}")
    return ChannelError(PRECONDITION_FAILED, text, *method)


def _types_supporting(arg: str, types: dict[str, frozenset[str]]) -> str:
    owners = [t for t, args in types.items() if arg in args]
    return " and ".join(owners)


def _validate(queue: str, vhost: str, queue_type: str, arguments: dict[str, Any],
              rules: dict[str, Rule], types: dict[str, frozenset[str]], known: frozenset[str],
              method: tuple[int, int], what: str) -> None:
    supported = types[queue_type]
    for arg, rule in rules.items():
        if arg in supported and arg in arguments:
            detail = rule.problem(arguments[arg], arguments)
            if detail is not None:
                raise _invalid(arg, queue, vhost, detail, method)
    for arg in arguments:
        if arg in known and arg not in supported:
            raise _invalid(arg, queue, vhost,
                           f"{queue_type} queues do not support it (it is a {what} of "
                           f"{_types_supporting(arg, types)} queues)", method)


def validate_queue_arguments(queue: str, vhost: str, queue_type: str, arguments: dict[str, Any]) -> None:
    """Check the x-arguments of a queue.declare that creates `queue`; raise a 406 `ChannelError` naming
    the first invalid or unsupported argument and what it allows."""
    if queue_type not in SUPPORTED_QUEUE_TYPES:
        raise _invalid("x-queue-type", queue, vhost,
                       f"{_show(queue_type)} is not {ChoiceRule(SUPPORTED_QUEUE_TYPES).expected()}",
                       QUEUE_DECLARE)
    if arguments:
        _validate(queue, vhost, queue_type, arguments, DECLARE_RULES, QUEUE_TYPE_ARGUMENTS,
                  KNOWN_QUEUE_ARGUMENTS, QUEUE_DECLARE, "queue argument")


def validate_consumer_arguments(queue: str, vhost: str, queue_type: str,
                                arguments: dict[str, Any] | None) -> None:
    """Check the arguments of a basic.consume on `queue` (rabbit_amqqueue:check_consume_arguments/3):
    x-priority must be an integer; a stream's consumer arguments are refused on other queue types."""
    if arguments and queue_type in CONSUMER_TYPE_ARGUMENTS:
        _validate(queue, vhost, queue_type, arguments, CONSUME_RULES, CONSUMER_TYPE_ARGUMENTS,
                  KNOWN_CONSUMER_ARGUMENTS, BASIC_CONSUME, "consumer argument")


# -- the virtual host's default queue type (RabbitMQ 4.x rabbit_amqqueue:augment_declare_args) ----------
def default_queue_type_problem(queue_type: str | None, clustered: bool) -> str | None:
    """Why a vhost cannot have `queue_type` as its default on this node (None: it can)."""
    if queue_type is None:
        return None
    if queue_type not in DEFAULTABLE_QUEUE_TYPES:
        return (f"default_queue_type '{queue_type}' is not supported by this node "
                f"(supported: {', '.join(DEFAULTABLE_QUEUE_TYPES)})")
    if queue_type == "quorum" and not clustered:
        return ("default_queue_type 'quorum' is not supported by this node: quorum queues need a clustered "
                "node (start hutch with --cluster-port; see docs/clustering.md)")
    return None


def type_compatible(queue_type: str, durable: bool, exclusive: bool, auto_delete: bool) -> bool:
    """Whether a declare with these properties can make a queue of `queue_type` (rabbit_queue_type's
    is_compatible/4: quorum queues and streams must be durable, not exclusive, not auto-delete)."""
    if queue_type in ("quorum", "stream"):
        return durable and not exclusive and not auto_delete
    return True


def with_default_queue_type(arguments: dict[str, Any], default_type: str | None, durable: bool,
                            exclusive: bool, auto_delete: bool) -> dict[str, Any]:
    """The arguments a new queue is declared with, given its vhost's `default_queue_type` (RabbitMQ
    4.x): an explicit `x-queue-type` is kept; otherwise the default type is written in when the declare's
    properties suit it, else the fallback type, classic (so an exclusive, auto-delete or non-durable
    queue stays classic in a vhost whose default is quorum). Nothing is added while the default is
    classic (or unset): hutch records `x-queue-type` only when it says something."""
    if "x-queue-type" in arguments or not default_type or default_type == "classic":
        return arguments
    chosen = default_type if type_compatible(default_type, durable, exclusive, auto_delete) else "classic"
    return {**arguments, "x-queue-type": chosen}


def equivalence_arguments(arguments: dict[str, Any], default_type: str | None,
                          existing_type: str) -> dict[str, Any]:
    """The arguments a redeclare of an existing queue is compared with. A declare without
    `x-queue-type` in a vhost with a non-classic default type asks for no type in particular: it is
    equivalent to the existing queue's type (an existing classic queue redeclared in a vhost whose
    default became quorum is no 406). With a classic default, "no type" means classic, as before."""
    if "x-queue-type" in arguments or not default_type or default_type == "classic":
        return arguments
    return {**arguments, "x-queue-type": existing_type}
