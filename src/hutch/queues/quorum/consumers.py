"""Consumers of a quorum queue: credit, priorities, round robin and single active consumer.

Owns: `Consumer` (one subscription or one basic.get holder and the messages checked out to it) and
`Consumers` (every consumer, the service order, the single-active-consumer state).

Rules:
- Credit. A manual-ack consumer may hold `prefetch` unsettled messages (prefetch 0 means
  UNLIMITED_PREFETCH, as RabbitMQ's quorum queues do); invariant: its `credit` == limit -
  len(checked_out). An auto-ack consumer's deliveries are settled at once, so its credit is spent by
  deliveries and given back by `Credit` commands (the runtime's flow control).
- Service order. Consumers that are ACTIVE and have credit sit in one round-robin deque per priority
  (x-priority); a message goes to the head of the highest non-empty group, which then moves to the back
  of its deque if it still has credit. Invariant: `in_service` is True exactly when the consumer's key is
  in its priority's deque, and each key is there at most once. Removal is eager, so the deques (which
  snapshots carry) hold nothing stale.
- Single active consumer: one consumer is ACTIVE, the others WAITING in arrival order. When the active
  one cancels or goes, the waiting consumer with the highest priority (earliest among equals) becomes
  active. An active consumer stays active until it goes (RabbitMQ 3.12+ also hands over to a newly
  arrived higher-priority consumer; hutch does not).
- A CANCELLED consumer gets no more messages but keeps its checked-out ones until they are settled or
  its channel goes (basic.cancel does not requeue); a GET holder holds basic.get messages taken without
  auto-ack. Both are removed when they hold nothing.
- Dict order is insertion order and every structure here is serialised in order, so a replica restored
  from a snapshot serves consumers in exactly the order the others do.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import Any

from .effects import ConsumerKey, ConsumerStatus, Out

UNLIMITED_PREFETCH = 2000  # prefetch 0 on a quorum queue: RabbitMQ's ?UNLIMITED_PREFETCH_COUNT

CheckedOut = tuple[int, int, int]  # (size_bytes, expires_at_ms or 0, delivery_count), by msg id


class Status(IntEnum):
    ACTIVE = 0
    WAITING = 1  # single active consumer: not the active one
    CANCELLED = 2
    GET = 3  # holds basic.get messages taken without auto-ack


class Consumer:
    __slots__ = ("key", "tag", "node", "channel", "prefetch", "auto_ack", "priority", "status", "credit",
                 "checked_out", "in_service")

    def __init__(self, key: ConsumerKey, tag: str, node: str, channel: str, prefetch: int, auto_ack: bool,
                 priority: int, status: Status) -> None:
        self.key = key
        self.tag = tag
        self.node = node
        self.channel = channel
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.priority = priority
        self.status = status
        self.credit = self.limit
        self.checked_out: dict[int, CheckedOut] = {}  # msg id (raft index) -> record, in delivery order
        self.in_service = False

    @property
    def limit(self) -> int:
        return self.prefetch or UNLIMITED_PREFETCH

    def owned_by(self, owner: str) -> bool:
        return self.channel == owner or self.node == owner or self.key == owner

    def to_wire(self) -> list[Any]:
        return [self.key, self.tag, self.node, self.channel, self.prefetch, self.auto_ack, self.priority,
                int(self.status), self.credit, self.in_service,
                [[i, s, e, c] for i, (s, e, c) in self.checked_out.items()]]

    @classmethod
    def from_wire(cls, data: list[Any]) -> Consumer:
        key, tag, node, channel, prefetch, auto_ack, priority, status, credit, in_service, checked = data
        c = cls(key, tag, node, channel, prefetch, auto_ack, priority, Status(status))
        c.credit = credit
        c.in_service = in_service
        c.checked_out = {i: (s, e, n) for i, s, e, n in checked}
        return c


class Consumers:
    __slots__ = ("by_key", "groups", "prios", "sac", "active_key", "waiting", "unacked", "unacked_bytes")

    def __init__(self, sac: bool = False) -> None:
        self.by_key: dict[ConsumerKey, Consumer] = {}
        self.groups: dict[int, deque[ConsumerKey]] = {}  # priority -> round robin of servable consumers
        self.prios: list[int] = []  # keys of `groups`, highest first
        self.sac = sac
        self.active_key: ConsumerKey | None = None  # single active consumer
        self.waiting: list[ConsumerKey] = []  # single active consumer, arrival order
        self.unacked = 0  # checked-out messages over all consumers
        self.unacked_bytes = 0

    # -- queries --------------------------------------------------------------------------------
    def get(self, key: ConsumerKey) -> Consumer | None:
        return self.by_key.get(key)

    def count(self) -> int:
        """Subscriptions (active or waiting), as basic.consume counts them."""
        return sum(1 for c in self.by_key.values() if c.status <= Status.WAITING)

    def servable(self) -> bool:
        return bool(self.prios)

    # -- service order --------------------------------------------------------------------------
    def next(self) -> Consumer | None:
        """The consumer the next message goes to, without taking it out of the rotation."""
        prios = self.prios
        if not prios:
            return None
        return self.by_key[self.groups[prios[0]][0]]

    def rotate(self, c: Consumer) -> None:
        """`c` (the head of the highest group) took a message: back of its group, or out of service."""
        group = self.groups[c.priority]
        head = group.popleft()
        assert head == c.key, "rotate: the consumer was not the head of its group"
        if c.credit > 0:
            group.append(c.key)
        else:
            c.in_service = False
            if not group:
                self._drop_group(c.priority)

    def serve(self, c: Consumer) -> None:
        """Put `c` in the rotation if it can take messages and is not there yet."""
        if c.in_service or c.status != Status.ACTIVE or c.credit <= 0:
            return
        group = self.groups.get(c.priority)
        if group is None:
            group = self.groups[c.priority] = deque()
            self.prios.append(c.priority)
            self.prios.sort(reverse=True)
        group.append(c.key)
        c.in_service = True

    def unserve(self, c: Consumer) -> None:
        if not c.in_service:
            return
        group = self.groups[c.priority]
        group.remove(c.key)
        c.in_service = False
        if not group:
            self._drop_group(c.priority)

    def _drop_group(self, priority: int) -> None:
        del self.groups[priority]
        self.prios.remove(priority)

    # -- lifecycle ------------------------------------------------------------------------------
    def checkout(self, key: ConsumerKey, prefetch: int, auto_ack: bool, priority: int, tag: str, node: str,
                 channel: str, out: Out) -> Consumer:
        """Subscribe, or update an existing subscription (a new prefetch, priority or mode)."""
        c = self.by_key.get(key)
        if c is None:
            c = self.by_key[key] = Consumer(key, tag, node, channel, prefetch, auto_ack, priority,
                                             Status.ACTIVE)
            self._admit(c, out)
        else:
            self.unserve(c)
            c.tag, c.node, c.channel = tag, node, channel
            c.prefetch, c.auto_ack, c.priority = prefetch, auto_ack, priority
            c.credit = c.limit if auto_ack else c.limit - len(c.checked_out)
            if c.status >= Status.CANCELLED:
                c.status = Status.ACTIVE
                self._admit(c, out)
        self.serve(c)
        return c

    def _admit(self, c: Consumer, out: Out) -> None:
        """A new subscription: active, or waiting behind the single active consumer."""
        if not self.sac:
            c.status = Status.ACTIVE
            return
        if self.active_key is None:
            c.status = Status.ACTIVE
            self.active_key = c.key
            out.status.append(ConsumerStatus(c.key, True))
        else:
            c.status = Status.WAITING
            self.waiting.append(c.key)
            out.status.append(ConsumerStatus(c.key, False))

    def get_holder(self, key: ConsumerKey, node: str, channel: str) -> Consumer:
        """The record basic.get without auto-ack checks messages out to (a subscription's if `key` is one)."""
        c = self.by_key.get(key)
        if c is None:
            c = self.by_key[key] = Consumer(key, "", node, channel, 0, False, 0, Status.GET)
            c.credit = 0
        return c

    def cancel(self, c: Consumer, out: Out) -> None:
        """basic.cancel: no more deliveries; checked-out messages stay until settled."""
        if c.status >= Status.CANCELLED:
            return
        self._leave(c, out)
        c.status = Status.CANCELLED
        if not c.checked_out:
            del self.by_key[c.key]

    def remove(self, c: Consumer, out: Out) -> None:
        """The consumer is gone (its channel or node went down); its messages were returned already."""
        if c.status <= Status.WAITING:
            self._leave(c, out)
        self.by_key.pop(c.key, None)

    def _leave(self, c: Consumer, out: Out) -> None:
        self.unserve(c)
        if c.status == Status.WAITING:
            self.waiting.remove(c.key)
        elif c.key == self.active_key:
            self.active_key = None
            self._activate_next(out)

    def _activate_next(self, out: Out) -> None:
        if not self.waiting:
            return
        best = 0
        by_key = self.by_key
        for i in range(1, len(self.waiting)):
            if by_key[self.waiting[i]].priority > by_key[self.waiting[best]].priority:
                best = i
        key = self.waiting.pop(best)
        c = by_key[key]
        c.status = Status.ACTIVE
        self.active_key = key
        out.status.append(ConsumerStatus(key, True))
        self.serve(c)

    def maybe_forget(self, c: Consumer) -> None:
        """A cancelled consumer or get holder that holds nothing more is removed."""
        if c.status >= Status.CANCELLED and not c.checked_out:
            del self.by_key[c.key]

    def set_sac(self, sac: bool, out: Out) -> None:
        """Single active consumer switched on or off by a config change: takes effect at once."""
        if sac == self.sac:
            return
        self.sac = sac
        subs = [c for c in self.by_key.values() if c.status <= Status.WAITING]
        if sac:
            self.active_key = None
            for c in subs:
                if self.active_key is None:
                    self.active_key = c.key
                    out.status.append(ConsumerStatus(c.key, True))
                else:
                    self.unserve(c)
                    c.status = Status.WAITING
                    self.waiting.append(c.key)
                    out.status.append(ConsumerStatus(c.key, False))
        else:
            self.active_key = None
            for key in self.waiting:
                c = self.by_key[key]
                c.status = Status.ACTIVE
                out.status.append(ConsumerStatus(key, True))
                self.serve(c)
            self.waiting = []

    # -- snapshot -------------------------------------------------------------------------------
    def to_wire(self) -> list[Any]:
        return [self.sac, self.active_key, list(self.waiting), [c.to_wire() for c in self.by_key.values()],
                [[p, list(self.groups[p])] for p in self.prios], self.unacked, self.unacked_bytes]

    @classmethod
    def from_wire(cls, data: list[Any]) -> Consumers:
        sac, active_key, waiting, consumers, groups, unacked, unacked_bytes = data
        cs = cls(sac)
        cs.active_key = active_key
        cs.waiting = list(waiting)
        for item in consumers:
            c = Consumer.from_wire(item)
            cs.by_key[c.key] = c
        for prio, keys in groups:
            cs.groups[prio] = deque(keys)
            cs.prios.append(prio)
        cs.unacked = unacked
        cs.unacked_bytes = unacked_bytes
        return cs
