"""Single active consumer for streams: which consumer of a named group on a stream reads (RabbitMQ's
rabbit_stream_sac_coordinator, for one node).

Owns the groups, keyed by (vhost, stream, consumer name), each an ordered list of members (a
connection's subscription) and a partition index (-1 for a plain stream; a super stream partition's
index, from its binding's `x-stream-partition-order`). Pure: no IO, no loop; every change returns the
notifications to send as data (`Notify`), and the caller (the connection owning the member) turns
each into a ConsumerUpdate frame.

Rules (as RabbitMQ):
- plain stream: the first member is active; when the active one leaves, the next in arrival order
  becomes active (notified active=true). A new member of a group with an active one waits, unnotified.
- partition (index >= 0): the active member is `members[index % len(members)]`. When a join or leave
  changes who that is, the current active one is told active=false with `stepping_down`, and becomes
  DEACTIVATING; the new one is only activated (notified active=true) when the old one's client has
  answered (`stepped_down`), or at once if the old one left.
- a member that joins claiming to be active (the group's state moved to this node with the stream's
  writer, and that member was reading) stays active if no other member is, else it is told inactive;
  on a partition the group is then rebalanced as for a join.
Invariant: a group has at most one member that is ACTIVE or DEACTIVATING.

Where the groups live: on one node, for every member wherever its connection is. A group of a stream
of this node only, or of a replicated stream this node writes, is here; the members on other nodes are
`sac_router.RemoteOwner`s (sac_router.py carries their joins, leaves and notifications).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    DEACTIVATING = "deactivating"


@dataclass(eq=False)
class Member:
    owner: Any  # the connection that holds the subscription
    subscription_id: int
    status: Status = Status.WAITING


@dataclass(frozen=True)
class Notify:
    member: Member
    active: bool
    stepping_down: bool = False


GroupKey = tuple[str, str, str]  # vhost, stream, consumer name


@dataclass
class Group:
    partition_index: int
    members: list[Member] = field(default_factory=list)

    def current(self) -> Member | None:
        for m in self.members:
            if m.status is not Status.WAITING:
                return m
        return None

    def chosen(self) -> Member | None:
        if not self.members:
            return None
        if self.partition_index < 0:
            return self.members[0]
        return self.members[self.partition_index % len(self.members)]


class SacGroups:
    def __init__(self) -> None:
        self.groups: dict[GroupKey, Group] = {}

    def register(self, key: GroupKey, partition_index: int, owner: Any, subscription_id: int,
                 claims_active: bool = False, deferred: bool = False) -> tuple[Member, list[Notify]]:
        """A member joins (last in arrival order). `claims_active`: it is reading already (it was active
        in the group's state on another node, which moved here: `SacRouter`); it stays active without a
        notification if the group has no active member, else it is told inactive. `deferred` (a member
        of a group that is moving here, not reading): it waits, nobody is activated now, so that the
        member that was reading can claim the group first (`activate_idle` later)."""
        group = self.groups.setdefault(key, Group(partition_index))
        member = Member(owner, subscription_id)
        group.members.append(member)
        if deferred and not claims_active:
            return member, []
        if claims_active:
            if group.current() is not None:
                return member, [Notify(member, False)]
            member.status = Status.ACTIVE
            return member, [] if group.partition_index < 0 else self._rebalance(group)
        if len(group.members) == 1:
            return member, self._activate(member)
        if group.partition_index < 0:
            return member, []
        return member, self._rebalance(group)

    def unregister(self, key: GroupKey, member: Member) -> list[Notify]:
        group = self.groups.get(key)
        if group is None or member not in group.members:
            return []
        group.members.remove(member)
        if not group.members:
            del self.groups[key]
            return []
        if group.partition_index < 0:
            if member.status is Status.WAITING or group.current() is not None:
                return []
            return self._activate(group.members[0])
        if group.current() is None:
            chosen = group.chosen()
            return self._activate(chosen) if chosen is not None else []
        return self._rebalance(group)

    def activate_idle(self, key: GroupKey) -> list[Notify]:
        """Activate the chosen member of a group that has members and none active (after a move)."""
        group = self.groups.get(key)
        if group is None or group.current() is not None:
            return []
        chosen = group.chosen()
        return self._activate(chosen) if chosen is not None else []

    def group_rows(self, vhost: str) -> list[dict[str, Any]]:
        """The groups of `vhost` as RabbitMQ's `list_stream_consumer_groups` shows them, by stream then
        name: stream, reference (the consumer name), partition_index (-1: not a partition), consumers."""
        return [{"vhost": v, "stream": stream, "reference": name, "partition_index": group.partition_index,
                 "consumers": len(group.members)}
                for (v, stream, name), group in sorted(self.groups.items(), key=lambda kv: kv[0]) if v == vhost]

    def member_rows(self, key: GroupKey) -> list[dict[str, Any]] | None:
        """The members of one group in arrival order, as RabbitMQ's `list_stream_group_consumers` shows
        them (subscription_id, connection_name, state: `active (connected)`, `waiting (connected)` or
        `deactivating (connected)`; a member here is always on a live connection); None: no such group."""
        group = self.groups.get(key)
        if group is None:
            return None
        return [{"subscription_id": m.subscription_id, "connection_name": getattr(m.owner, "name", None),
                 "state": f"{m.status.value} (connected)"} for m in group.members]

    def stepped_down(self, key: GroupKey, member: Member) -> list[Notify]:
        """The client of a DEACTIVATING member answered its consumer update: activate the chosen one."""
        group = self.groups.get(key)
        if group is None or member.status is not Status.DEACTIVATING:
            return []
        member.status = Status.WAITING
        chosen = group.chosen()
        return self._activate(chosen) if chosen is not None and group.current() is None else []

    def _rebalance(self, group: Group) -> list[Notify]:
        current, chosen = group.current(), group.chosen()
        if current is None or chosen is None or current is chosen or current.status is Status.DEACTIVATING:
            return [] if current is not None or chosen is None else self._activate(chosen)
        current.status = Status.DEACTIVATING
        return [Notify(current, False, stepping_down=True)]

    @staticmethod
    def _activate(member: Member) -> list[Notify]:
        member.status = Status.ACTIVE
        return [Notify(member, True)]
