"""The replicated configuration of one quorum queue: what its x-arguments and policies add up to.

Owns: `QuorumConfig` (the values the state machine reads, with names that say the unit), its wire form
(a plain dict for the command codec and snapshots) and `QuorumConfig.from_settings`, which maps the
`QueueSettings` every queue type shares (core/queue_settings.py) plus the quorum-only keys
(`x-max-in-memory-*`) onto it.

Rules:
- The config is part of the replicated state: it changes only through an `UpdateConfig` command, so every
  replica applies a policy change at the same raft index and the change takes effect at once.
- At-least-once dead-lettering is in force exactly when the strategy is `at-least-once`, the overflow is
  `reject-publish` and a dead-letter exchange is set (seed 000); otherwise dead-lettering is at-most-once
  (or nothing when no dead-letter exchange is set).
- `reject-publish-dlx` is refused here (ValueError): quorum queues do not support it (seed 000); the
  declare-time validation that gives the client its 406 lives elsewhere.
- Delivery limit (RabbitMQ 4.x): 20 when neither an argument nor a policy sets one (DEFAULT_DELIVERY_LIMIT);
  -1 (any negative value) means no limit. `QuorumConfig.delivery_limit` None is "no limit".
- `max_in_memory_length` / `max_in_memory_bytes` are accepted and kept (management shows them) but have
  no effect: bodies are never in the machine's memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from hutch.core.queue_settings import QueueSettings

OVERFLOWS = ("drop-head", "reject-publish")
STRATEGIES = ("at-most-once", "at-least-once")
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4.0's default for quorum queues


@dataclass(frozen=True, slots=True)
class QuorumConfig:
    message_ttl_ms: int | None = None  # per-queue message TTL; a message's own TTL may be shorter
    expires_ms: int | None = None  # queue TTL: delete the queue when unused this long (driven by ticks)
    max_length: int | None = None  # ready messages (+ at-least-once dead letters not yet settled)
    max_length_bytes: int | None = None  # their body bytes
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    dead_letter_strategy: str = "at-most-once"
    delivery_limit: int | None = None  # failed deliveries allowed; None: unlimited (returns go to the back)
    single_active_consumer: bool = False
    max_in_memory_length: int | None = None  # accepted, no effect (seed 000)
    max_in_memory_bytes: int | None = None  # accepted, no effect (seed 000)

    def __post_init__(self) -> None:
        if self.overflow not in OVERFLOWS:
            raise ValueError(f"overflow {self.overflow!r} is not supported by quorum queues")
        if self.dead_letter_strategy not in STRATEGIES:
            raise ValueError(f"unknown dead-letter strategy {self.dead_letter_strategy!r}")
        for name in ("message_ttl_ms", "max_length", "max_length_bytes", "delivery_limit",
                     "max_in_memory_length", "max_in_memory_bytes"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{name} must be an integer >= 0 or None, not {value!r}")
        if self.expires_ms is not None and (type(self.expires_ms) is not int or self.expires_ms < 1):
            raise ValueError(f"expires_ms must be an integer >= 1 or None, not {self.expires_ms!r}")

    @property
    def at_least_once(self) -> bool:
        """Dead letters stay in the queue until the dead-letter worker settles them (seed 000's three
        conditions)."""
        return (self.dead_letter_strategy == "at-least-once" and self.overflow == "reject-publish"
                and self.dead_letter_exchange is not None)

    @property
    def has_limits(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None

    def to_wire(self) -> dict[str, Any]:
        """Only the fields that differ from the defaults: a compact, stable msgpack map."""
        return {k: v for k, v in asdict(self).items() if v != _DEFAULTS[k]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> QuorumConfig:
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})

    @classmethod
    def from_settings(cls, settings: QueueSettings, arguments: dict[str, Any] | None = None) -> QuorumConfig:
        """The effective settings of a quorum queue. The in-memory limits are not `QueueSettings`
        fields: they come from the x-arguments, else from the effective policy."""
        arguments = arguments or {}
        policy = settings.effective_policy_definition

        def extra(arg: str, key: str) -> Any:
            return arguments[arg] if arguments.get(arg) is not None else policy.get(key)

        overflow = settings.overflow
        if overflow == "reject-publish-dlx":
            raise ValueError("quorum queues do not support overflow 'reject-publish-dlx'")
        return cls(
            message_ttl_ms=settings.message_ttl,
            expires_ms=settings.expires,
            max_length=settings.max_length,
            max_length_bytes=settings.max_length_bytes,
            overflow=overflow,
            dead_letter_exchange=settings.dead_letter_exchange,
            dead_letter_routing_key=settings.dead_letter_routing_key,
            dead_letter_strategy=(settings.dead_letter_strategy
                                  or extra("x-dead-letter-strategy", "dead-letter-strategy") or "at-most-once"),
            delivery_limit=_delivery_limit(settings.delivery_limit),
            single_active_consumer=settings.single_active_consumer,
            max_in_memory_length=extra("x-max-in-memory-length", "max-in-memory-length"),
            max_in_memory_bytes=extra("x-max-in-memory-bytes", "max-in-memory-bytes"),
        )


def _delivery_limit(value: int | None) -> int | None:
    """RabbitMQ 4.x: unset means DEFAULT_DELIVERY_LIMIT, a negative value means no limit (None here)."""
    if value is None:
        return DEFAULT_DELIVERY_LIMIT
    return None if value < 0 else value


_FIELDS = frozenset(f.name for f in fields(QuorumConfig))
_DEFAULTS = asdict(QuorumConfig())
