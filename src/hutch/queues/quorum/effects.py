"""What the quorum queue machine asks the world to do: effects as data, and the replies it returns.

Owns: the effect dataclasses (frozen, slotted), the reply values, and `Out`, the buffer one `apply`
fills and turns into its effect list.

Rules:
- Effects name messages by message id, which says where the body is in the log: the entry at raft
  index `msg_id >> SHIFT`, position `msg_id & (2**SHIFT - 1)` in it (messages.py); the runtime reads
  the body back from there (`commands.payloads_of`). The machine never holds a body.
- Every effect is safe to repeat after a leader change: deliveries carry stable message ids (the raft
  index of the message's current log entry), so a runtime that re-sends a `Deliver` drops the ids the
  consumer's channel already has; confirms and rejects are idempotent per (publisher, seq); the status
  effects describe a state, not a transition.
- Only the leader's runtime executes effects; followers compute and drop them. `leader_effects`
  (machine.py) lists what a new leader re-issues.
- The effect list of one apply is built in a fixed order (status effects in the order they arose,
  then confirms, rejects, deliveries, dead letters, drops, release cursor), so two replicas produce
  equal lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ConsumerKey = Any  # str | int | tuple of those: chosen by the runtime, msgpack-able and hashable
PublisherId = Any  # likewise

# (msg_id, body_ref, redelivered, delivery_count): body_ref == msg_id, the body's place in the log;
# delivery_count is the number of failed deliveries so far (`x-delivery-count` when redelivered)
Delivery = tuple[int, int, bool, int]

REASONS = ("rejected", "expired", "maxlen", "delivery_limit")  # dead-letter reasons, by code
REASON_CODES = {reason: code for code, reason in enumerate(REASONS)}
DROPPED_STRATEGY_CHANGED = "dead_letter_strategy_changed"  # at-least-once dead letters deleted (seed 000)

OK = "ok"
DUPLICATE = "duplicate"  # an enqueue of a (publisher, seq) already applied: confirmed again, not enqueued
REJECTED = "rejected"  # reject-publish overflow: not enqueued, the publisher gets a nack


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send these messages to the consumer (basic.deliver), in order."""

    consumer_key: ConsumerKey
    messages: tuple[Delivery, ...]


@dataclass(frozen=True, slots=True)
class Confirm:
    """These publishes were applied (committed, hence on a majority's disk): basic.ack them."""

    publisher_id: PublisherId
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Reject:
    """These publishes were refused by reject-publish overflow: basic.nack them."""

    publisher_id: PublisherId
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """At-most-once: republish these messages to the dead-letter exchange with `reason` (x-death); the
    machine has already forgotten them."""

    reason: str
    raft_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Dropped:
    """These messages left the queue without a dead-letter exchange to go to (or the at-least-once dead
    letters deleted by a strategy change): nothing to send, for metrics and logs."""

    reason: str
    raft_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DlxDeliver:
    """At-least-once: hand these dead letters to the dead-letter worker: (msg_id, raft_index, reason).
    The worker republishes with confirms and settles them with `make_dlx_settle` once confirmed."""

    messages: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True, slots=True)
class DlxWorker:
    """Run (or stop) the dead-letter worker of this queue on the leader: at-least-once started or
    stopped being in force. A running worker registers with `make_dlx_checkout`."""

    running: bool


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """Single active consumer: this consumer is now the active one (True) or waiting (False)."""

    consumer_key: ConsumerKey
    active: bool


@dataclass(frozen=True, slots=True)
class OverflowStatus:
    """reject-publish: the queue is full (`rejecting`), so channels may nack new publishes to it before
    proposing them; False once it drained below 80% of its limits. The machine rejects by itself when
    full, so this is an optimisation the runtime may ignore."""

    rejecting: bool


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """Queue TTL (`expires`): the queue has been unused that long; delete it. Repeated on every tick
    while it holds."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReleaseCursor:
    """Log entries below `index` are no longer needed once a snapshot at (or after) the entry that
    produced this effect is taken: every live message's entry is at or above it."""

    index: int


Effect = (Deliver | Confirm | Reject | DeadLetter | Dropped | DlxDeliver | DlxWorker | ConsumerStatus
          | OverflowStatus | DeleteQueue | ReleaseCursor)


@dataclass(frozen=True, slots=True)
class DequeueReply:
    """basic.get: the message (or None when the queue had no ready message) and the ready count after."""

    message: Delivery | None
    ready: int


@dataclass(frozen=True, slots=True)
class CheckoutReply:
    """basic.consume: whether the consumer is active (False: waiting, single active consumer), and the
    ready count after the deliveries this checkout caused."""

    active: bool
    ready: int


class Out:
    """The effects of one apply, gathered by kind and flattened in a fixed order by `finish`."""

    __slots__ = ("status", "confirms", "rejects", "deliveries", "dlx", "dead", "dropped", "cursor", "fresh")

    def __init__(self) -> None:
        self.status: list[Effect] = []
        self.confirms: dict[PublisherId, list[int]] = {}
        self.rejects: dict[PublisherId, list[int]] = {}
        self.deliveries: dict[ConsumerKey, list[Delivery]] = {}
        self.dlx: list[tuple[int, int, str]] = []
        self.dead: dict[str, list[int]] = {}
        self.dropped: dict[str, list[int]] = {}
        self.cursor: int | None = None
        self.fresh = 1 << 62  # the smallest message id this apply's enqueue added (those are not expired
        # by the delivery this apply makes: a TTL-0 message goes to a consumer that can take it at once)

    def deliver(self, key: ConsumerKey, delivery: Delivery) -> None:
        batch = self.deliveries.get(key)
        if batch is None:
            self.deliveries[key] = [delivery]
        else:
            batch.append(delivery)

    def finish(self) -> list[Effect]:
        effects: list[Effect] = self.status
        if self.confirms:
            for p, s in self.confirms.items():
                effects.append(Confirm(p, tuple(s)))
        if self.rejects:
            for p, s in self.rejects.items():
                effects.append(Reject(p, tuple(s)))
        if self.deliveries:
            for k, d in self.deliveries.items():
                effects.append(Deliver(k, tuple(d)))
        if self.dlx:
            effects.append(DlxDeliver(tuple(self.dlx)))
        if self.dead:
            effects.extend(DeadLetter(r, tuple(i)) for r, i in self.dead.items())
        if self.dropped:
            effects.extend(Dropped(r, tuple(i)) for r, i in self.dropped.items())
        if self.cursor is not None:
            effects.append(ReleaseCursor(self.cursor))
        return effects
