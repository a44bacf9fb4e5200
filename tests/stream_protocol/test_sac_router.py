"""`SacRouter` (runtime/stream_session/sac_router.py) on two nodes linked in memory: a group of a
replicated stream lives on its writer's node, members elsewhere join, leave and get their consumer
updates through records (the cluster codec's, delivered in order), a member's node going down hands
the group on, and a change of writer moves the group with the active member kept active."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from hutch.cluster import messages as cm
from hutch.runtime.stream_session.sac import Notify, SacGroups, Status
from hutch.runtime.stream_session.sac_router import SacRouter

pytestmark = pytest.mark.asyncio
KEY = ("/", "s", "app")


@dataclass
class Sub:
    sac_member: Any = None


@dataclass
class FakeConn:
    name: str
    subscriptions: dict[int, Sub] = field(default_factory=dict)
    notes: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def consuming(self) -> FakeConn:
        return self

    def sac_notify(self, note: Notify) -> None:
        sub = self.subscriptions.get(note.member.subscription_id)
        if sub is not None and sub.sac_member is note.member:  # (as Consuming.sac_notify checks)
            self.notes.append((note.member.subscription_id, note.active))

    def subscribe(self, router: SacRouter, sid: int) -> Sub:
        sub = self.subscriptions[sid] = Sub()
        sub.sac_member = router.join(self, sid, KEY, -1)
        return sub


class Net:
    """Two or more nodes' links; records wait in `queue` until `pump` (through the wire codec)."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[type, Any]] = {}
        self.queue: list[tuple[str, str, Any]] = []
        self.writer = "a"

    def pump(self) -> None:
        while self.queue:
            sender, peer, record = self.queue.pop(0)
            decoded = cm.decode(cm.encode(record))
            self.handlers[peer][type(decoded)](sender, decoded)


class Link:
    def __init__(self, net: Net, name: str) -> None:
        self.net, self.name = net, name
        net.handlers[name] = {}

    def send(self, peer: str, record: Any) -> bool:
        self.net.queue.append((self.name, peer, record))
        return True

    def register(self, kind: type[Any], handler: Any) -> None:
        self.net.handlers[self.name][kind] = handler

    def connected(self, peer: str) -> bool:
        return True


class Catalog:
    def __init__(self, net: Net, name: str) -> None:
        self.net, self.name = net, name

    def members(self, vhost: str, name: str) -> Any:
        return self.name, self.net.writer, [("a", None), ("b", None)]


def node(net: Net, name: str) -> tuple[SacRouter, SacGroups]:
    groups = SacGroups()
    router = SacRouter(groups, Catalog(net, name))  # type: ignore[arg-type]
    router.start(Link(net, name))
    return router, groups


async def test_members_on_two_nodes_are_one_group() -> None:
    net = Net()
    (ra, ga), (rb, gb) = node(net, "a"), node(net, "b")
    ca, cb = FakeConn("conn-a"), FakeConn("conn-b")
    try:
        cb.subscribe(rb, 1)  # on b, the group lives on a (the writer's)
        net.pump()
        assert cb.notes == [(1, True)] and KEY not in gb.groups
        ca.subscribe(ra, 7)  # on a: waits behind b's
        net.pump()
        assert ca.notes == [] and [m.status for m in ga.groups[KEY].members] == [Status.ACTIVE, Status.WAITING]
        assert ga.member_rows(KEY) == [
            {"subscription_id": 1, "connection_name": "conn-b", "state": "active (connected)"},
            {"subscription_id": 7, "connection_name": "conn-a", "state": "waiting (connected)"}]
        rb.leave(KEY, cb.subscriptions.pop(1).sac_member)  # b's leaves: a's is activated
        net.pump()
        assert ca.notes == [(7, True)]
        cb.subscribe(rb, 2)
        net.pump()
        ra.leave(KEY, ca.subscriptions.pop(7).sac_member)  # a's leaves: b's (remote) is activated
        net.pump()
        assert cb.notes == [(1, True), (2, True)]
        ca.subscribe(ra, 8)
        net.pump()
        ra.peer_changed("b", up=False)  # b's node is gone: its member leaves, a's is activated
        assert ca.notes == [(7, True), (8, True)]
        ra.peer_changed("b", up=True)
        rb.peer_changed("a", up=True)  # b joins its member again, claiming to be active: told it is not
        net.pump()
        assert cb.notes == [(1, True), (2, True), (2, False)]
        assert [m.status for m in ga.groups[KEY].members] == [Status.ACTIVE, Status.WAITING]
    finally:
        ra.stop()
        rb.stop()


async def test_the_group_moves_with_the_writer_and_its_active_member_stays_active() -> None:
    net = Net()
    (ra, ga), (rb, gb) = node(net, "a"), node(net, "b")
    ca, cb = FakeConn("conn-a"), FakeConn("conn-b")
    try:
        ca.subscribe(ra, 1)  # active, on the writer's node
        cb.subscribe(rb, 2)
        net.pump()
        assert ca.notes == [(1, True)] and cb.notes == []
        net.writer = "b"  # a new epoch: b writes; the sweep on each node moves the group there
        ra._move_groups()
        rb._move_groups()
        net.pump()
        assert KEY not in ga.groups  # dropped on a, without notifications
        group = gb.groups[KEY]
        assert [(m.subscription_id, m.status) for m in group.members] == [(2, Status.WAITING), (1, Status.ACTIVE)]
        assert ca.notes == [(1, True)] and cb.notes == []  # nobody told anything: a's still reads
        ra.leave(KEY, ca.subscriptions.pop(1).sac_member)  # a's leaves: b's (now local) is activated
        net.pump()
        assert cb.notes == [(2, True)]
    finally:
        ra.stop()
        rb.stop()


async def test_a_moved_group_whose_active_member_is_gone_activates_the_next_after_a_sweep() -> None:
    net = Net()
    (ra, _), (rb, gb) = node(net, "a"), node(net, "b")
    cb = FakeConn("conn-b")
    try:
        ca = FakeConn("conn-a")
        ca.subscribe(ra, 1)
        cb.subscribe(rb, 2)
        net.pump()
        net.writer = "b"  # a's node died with its member: only b moves its member, deferred
        rb._move_groups()
        net.pump()
        assert cb.notes == [] and gb.groups[KEY].members[0].status is Status.WAITING
        rb._move_groups()  # one sweep with nobody claiming the group: b's is activated
        assert cb.notes == [(2, True)]
    finally:
        ra.stop()
        rb.stop()
