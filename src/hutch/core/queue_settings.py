"""A queue's effective settings: what its x-arguments, policy and operator policy add up to.

Owns: `QueueSettings` (the features a queue type reads: TTLs, length limits, dead-lettering, delivery
limit, priorities, single active consumer, consumer timeout) and `settings_from_arguments`, which reads
already-validated x-arguments (core/arguments.py validates them at declare time). Policies
(core/policy.py) produce the same object through `QueueSettings` fields, so a queue type never asks where
a value came from.

Pure: no IO, no clocks. Times are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    message_ttl: int | None = None  # ms; x-message-ttl / message-ttl
    expires: int | None = None  # ms unused before the queue is deleted; x-expires / expires
    max_length: int | None = None  # ready messages; x-max-length / max-length
    max_length_bytes: int | None = None  # ready message body bytes; x-max-length-bytes / max-length-bytes
    overflow: str = "drop-head"  # x-overflow / overflow
    dead_letter_exchange: str | None = None  # x-dead-letter-exchange / dead-letter-exchange
    dead_letter_routing_key: str | None = None  # x-dead-letter-routing-key / dead-letter-routing-key
    delivery_limit: int | None = None  # x-delivery-limit / delivery-limit; -1: no limit (RabbitMQ 4.x)
    dead_letter_strategy: str | None = None  # x-dead-letter-strategy / dead-letter-strategy (quorum queues)
    max_priority: int | None = None  # x-max-priority (declare time only)
    single_active_consumer: bool = False  # x-single-active-consumer (declare time only)
    consumer_timeout: int | None = None  # ms; x-consumer-timeout
    alternate_exchange: str | None = None  # policy key for exchanges; kept for completeness
    policy: str | None = None  # the name of the policy that applies, if any
    operator_policy: str | None = None
    # the merged policy definition as management shows it (`effective_policy_definition`)
    effective_policy_definition: dict[str, Any] = field(default_factory=dict)

    @property
    def delivery_limit_or_none(self) -> int | None:
        """The delivery limit in force: None when unset or negative (RabbitMQ 4.x's -1, "no limit")."""
        limit = self.delivery_limit
        return None if limit is None or limit < 0 else limit

    @property
    def has_limits(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


# x-argument -> QueueSettings field
ARGUMENT_FIELDS = {
    "x-message-ttl": "message_ttl",
    "x-expires": "expires",
    "x-max-length": "max_length",
    "x-max-length-bytes": "max_length_bytes",
    "x-overflow": "overflow",
    "x-dead-letter-exchange": "dead_letter_exchange",
    "x-dead-letter-routing-key": "dead_letter_routing_key",
    "x-delivery-limit": "delivery_limit",
    "x-dead-letter-strategy": "dead_letter_strategy",
    "x-max-priority": "max_priority",
    "x-single-active-consumer": "single_active_consumer",
    "x-consumer-timeout": "consumer_timeout",
}

# policy key -> QueueSettings field (seed 001; quorum-queue keys come later)
POLICY_FIELDS = {
    "message-ttl": "message_ttl",
    "expires": "expires",
    "max-length": "max_length",
    "max-length-bytes": "max_length_bytes",
    "overflow": "overflow",
    "dead-letter-exchange": "dead_letter_exchange",
    "dead-letter-routing-key": "dead_letter_routing_key",
    "delivery-limit": "delivery_limit",
    "dead-letter-strategy": "dead_letter_strategy",
    "alternate-exchange": "alternate_exchange",
}


def settings_from_arguments(arguments: dict[str, Any]) -> QueueSettings:
    """Settings from validated x-arguments alone (no policy)."""
    values: dict[str, Any] = {}
    for arg, name in ARGUMENT_FIELDS.items():
        if arg in arguments and arguments[arg] is not None:
            value = arguments[arg]
            if name == "single_active_consumer":
                value = bool(value)
            elif name not in ("overflow", "dead_letter_exchange", "dead_letter_routing_key", "dead_letter_strategy"):
                value = int(value)
            values[name] = value
    return QueueSettings(**values)
