"""Single active consumer groups across a cluster: `SacRouter`, where each group lives and how its members
on other nodes reach it.

Owns: for every single-active-consumer subscription of this node, the node its group lives on (`Placed`),
and, on the node a group lives on, its members from other nodes (`RemoteOwner`s in the node's
`SacGroups`, sac.py); the records between them (`StreamSacUpdate`, `StreamSacNotify` in
hutch.cluster.messages, tags 66-67); the sweep that moves groups when a stream's writer changes.

Rules (RabbitMQ keeps its groups in one place, its stream coordinator; hutch keeps each on one node):
- A group of a stream of this node only lives here, as before (no records). A group of a replicated
  stream lives on the stream's writer's node: members there register with its `SacGroups` directly,
  members on other nodes send a join and get their consumer updates as `StreamSacNotify` records.
  Consumers of one group connected to different members of the stream are one group: one active
  cluster-wide.
- When the writer's node loses a member's node (peer down), that node's members leave its groups: the
  next one is activated (a ConsumerUpdate to its client), as when a connection closes.
- When a stream's writer changes (`SWEEP_S`), its groups move: the old writer's node drops them without
  notifications (only on a change of its own view from "I write" to "another writes"), every node
  places its members on the new writer's node, each claiming to be active if it was reading (sac.py:
  it stays active if no other member is, else it is told inactive); the others join deferred, and a
  group without an active member after one more sweep has its chosen member activated (the one that was
  reading, if it survived, has claimed it by then). A member whose group's node comes back up joins it
  again (the node dropped it when it went down).
- Records from peers naming groups or members this node does not hold are ignored.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any

from hutch.cluster import messages as cm
from hutch.runtime.stream_session.ports import ClusterLink, StreamCatalog
from hutch.runtime.stream_session.sac import GroupKey, Member, Notify, SacGroups, Status

log = logging.getLogger("hutch.stream")

JOIN, LEAVE, STEPPED, MOVE = 0, 1, 2, 3
SWEEP_S = 0.5


def deliver_notes(notes: list[Notify]) -> None:
    """Each notification to its member's owner: a connection of this node, or a `RemoteOwner`."""
    for note in notes:
        note.member.owner.consuming.sac_notify(note)


@dataclass(eq=False)
class RemoteOwner:
    """A member on another node, as the node its group lives on holds it (a member's `owner`): its
    notifications go there as records (`consuming.sac_notify`, the shape a connection has)."""

    router: SacRouter
    node: str
    member_id: int
    name: str  # its connection's name (the listing commands show it)
    key: GroupKey

    @property
    def consuming(self) -> RemoteOwner:
        return self

    def sac_notify(self, note: Notify) -> None:
        self.router.notify_remote(self, note)


@dataclass(eq=False)
class Placed:
    """A subscription of this node in a group of a replicated stream, and where that group lives (`home`:
    a node name; this node's own when the group is here). `member` is the subscription's `sac_member`:
    the group's own when it lives here, else this node's stand-in for it."""

    conn: Any
    subscription_id: int
    key: GroupKey
    partition_index: int
    member_id: int
    home: str
    member: Member


class SacRouter:
    """The single-active-consumer side of a node's stream connections (one per `StreamHub`)."""

    def __init__(self, groups: SacGroups, catalog: StreamCatalog) -> None:
        self.groups = groups
        self.catalog = catalog
        self.link: ClusterLink | None = None
        self.placed: dict[Member, Placed] = {}  # this node's subscriptions in groups of replicated streams
        self.by_id: dict[int, Placed] = {}  # the same, by member id
        self.remote: dict[tuple[str, int], Member] = {}  # (node, member id) -> its member here
        self.homed: set[GroupKey] = set()  # groups that live here because this node writes their stream
        self._ids = itertools.count(1)
        self._idle: dict[GroupKey, int] = {}  # moved groups without an active member: sweeps waited
        self._timer: asyncio.TimerHandle | None = None

    def start(self, link: ClusterLink) -> None:
        """On a clustered node: take the records and sweep (from the running loop)."""
        self.link = link
        link.register(cm.StreamSacUpdate, self._on_update)
        link.register(cm.StreamSacNotify, self._on_notify)
        self._timer = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- this node's subscriptions -------------------------------------------------------------------

    def _home_of(self, key: GroupKey) -> str | None:
        """The node a group of `key`'s stream lives on: its writer's (None: a stream of this node only,
        or a node without a cluster; while a writer is elected, this node); in a node of workers, a
        stream's home worker."""
        if self.link is None:
            return None
        members = self.catalog.members(key[0], key[1])
        if members is None:  # (a stream whose one copy on this node of workers is another worker's: there)
            return self.catalog.home(key[0], key[1])
        _this, writer, _ = members
        return writer or self.link.name

    def join(self, conn: Any, subscription_id: int, key: GroupKey, partition_index: int) -> Member:
        """A subscription joins its group, wherever it lives; returns its `sac_member`."""
        home = self._home_of(key)
        if home is None:
            member, notes = self.groups.register(key, partition_index, conn, subscription_id)
            sub = conn.consuming.subscriptions.get(subscription_id)
            if sub is not None:
                sub.sac_member = member  # (before its notification, which checks it)
            deliver_notes(notes)
            return member
        placed = Placed(conn, subscription_id, key, partition_index, next(self._ids), home,
                        Member(conn, subscription_id))
        self.by_id[placed.member_id] = placed
        self._place(placed, home, claims_active=False)
        return placed.member

    def _place(self, placed: Placed, home: str, claims_active: bool, moving: bool = False) -> None:
        assert self.link is not None
        placed.home = home
        if home == self.link.name:
            if home == self._home_of(placed.key):
                self.homed.add(placed.key)
            member, notes = self.groups.register(placed.key, placed.partition_index, placed.conn,
                                                 placed.subscription_id, claims_active, deferred=moving)
            if moving and not claims_active:
                self._idle.setdefault(placed.key, 0)
            self._rekey(placed, member)
            deliver_notes(notes)
            return
        proxy = Member(placed.conn, placed.subscription_id,
                       Status.ACTIVE if claims_active else Status.WAITING)
        self._rekey(placed, proxy)
        self._send(placed, MOVE if moving else JOIN, claims_active)

    def _rekey(self, placed: Placed, member: Member) -> None:
        """`member` is now the subscription's `sac_member`."""
        self.placed.pop(placed.member, None)
        placed.member = member
        self.placed[member] = placed
        sub = placed.conn.consuming.subscriptions.get(placed.subscription_id)
        if sub is not None:
            sub.sac_member = member

    def leave(self, key: GroupKey, member: Member) -> None:
        """A subscription leaves its group (unsubscribed, its connection closed, its stream gone)."""
        placed = self.placed.pop(member, None)
        if placed is not None:
            del self.by_id[placed.member_id]
        if placed is None or self.link is None or placed.home == self.link.name:
            deliver_notes(self.groups.unregister(key, member))
            return
        self._send(placed, LEAVE, False)

    def stepped_down(self, key: GroupKey, member: Member) -> None:
        """The client of a member told inactive answered."""
        placed = self.placed.get(member)
        if placed is None or self.link is None or placed.home == self.link.name:
            deliver_notes(self.groups.stepped_down(key, member))
            return
        member.status = Status.WAITING
        self._send(placed, STEPPED, False)

    def _send(self, placed: Placed, op: int, active: bool) -> None:
        assert self.link is not None
        vhost, stream, name = placed.key
        self.link.send(placed.home, cm.StreamSacUpdate(
            op, vhost, stream, name, placed.partition_index, placed.member_id, placed.subscription_id,
            str(getattr(placed.conn, "name", "") or ""), active))

    # -- the node a group lives on -------------------------------------------------------------------

    def notify_remote(self, owner: RemoteOwner, note: Notify) -> None:
        assert self.link is not None
        vhost, stream, name = owner.key
        self.link.send(owner.node, cm.StreamSacNotify(vhost, stream, name, owner.member_id, note.active,
                                                      note.stepping_down))

    def _on_update(self, peer: str, m: cm.StreamSacUpdate) -> None:
        key = (m.vhost, m.stream, m.name)
        ident = (peer, m.member_id)
        member = self.remote.get(ident)
        if m.op in (JOIN, MOVE):
            if member is not None:
                return  # (a join said again: it is in already)
            owner = RemoteOwner(self, peer, m.member_id, m.connection, key)
            member, notes = self.groups.register(key, m.partition_index, owner, m.subscription_id, m.active,
                                                 deferred=m.op == MOVE)
            if m.op == MOVE and not m.active:
                self._idle.setdefault(key, 0)
            self.remote[ident] = member
            if self.link is not None and self._home_of(key) == self.link.name:
                self.homed.add(key)
            deliver_notes(notes)
        elif member is not None and m.op == LEAVE:
            del self.remote[ident]
            deliver_notes(self.groups.unregister(key, member))
        elif member is not None and m.op == STEPPED:
            deliver_notes(self.groups.stepped_down(key, member))

    def _on_notify(self, peer: str, m: cm.StreamSacNotify) -> None:
        """A consumer update for one of this node's subscriptions, from its group's node."""
        key = (m.vhost, m.stream, m.name)
        placed = self.by_id.get(m.member_id)
        if placed is None or placed.home != peer or placed.key != key:
            return
        member = placed.member
        member.status = Status.ACTIVE if m.active else Status.DEACTIVATING if m.stepping_down else Status.WAITING
        placed.conn.consuming.sac_notify(Notify(member, m.active, m.stepping_down))

    def peer_changed(self, peer: str, up: bool) -> None:
        """A peer went down: its members leave the groups that live here (the next one is activated). A
        peer came up: this node's members of groups living there join again (it dropped them)."""
        if up:
            for placed in list(self.placed.values()):
                if placed.home == peer:
                    self._send(placed, JOIN, placed.member.status is Status.ACTIVE)
            return
        for ident in [i for i in self.remote if i[0] == peer]:
            member = self.remote.pop(ident)
            owner = member.owner
            assert isinstance(owner, RemoteOwner)
            deliver_notes(self.groups.unregister(owner.key, member))

    # -- moving groups with their stream's writer ----------------------------------------------------

    def _sweep(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)
        try:
            self._move_groups()
        except Exception:  # noqa: BLE001 - one bad group must not stop the sweep for the others
            log.exception("single active consumer: moving groups failed")

    def _move_groups(self) -> None:
        assert self.link is not None
        me = self.link.name
        for key in list(self.homed):
            if key not in self.groups.groups:  # (emptied: nothing to move)
                self.homed.discard(key)
                continue
            home = self._home_of(key)
            if home is not None and home != me:  # this node no longer writes the stream: drop its groups
                self.homed.discard(key)
                group = self.groups.groups.pop(key, None)
                if group is not None:
                    for member in group.members:
                        if isinstance(member.owner, RemoteOwner):
                            self.remote.pop((member.owner.node, member.owner.member_id), None)
        for placed in list(self.placed.values()):
            home = self._home_of(placed.key)
            if home is None or home == placed.home:
                continue
            claims = placed.member.status is Status.ACTIVE
            if placed.home != me and self.link.connected(placed.home):
                self._send(placed, LEAVE, False)
            elif placed.home == me and placed.key in self.groups.groups:  # (not dropped above: no writer)
                self.groups.unregister(placed.key, placed.member)
            log.info("single active consumer: group %s of stream %s moves to %s with its writer",
                     placed.key[2], placed.key[1], home)
            self._place(placed, home, claims, moving=True)
        for key, sweeps in list(self._idle.items()):
            if sweeps < 1:
                self._idle[key] = sweeps + 1
                continue
            del self._idle[key]
            deliver_notes(self.groups.activate_idle(key))
