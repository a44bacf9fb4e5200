"""Single active consumer groups (runtime/stream_session/sac.py), pure: RabbitMQ's rules for a plain
stream and for a super stream partition, and a Hypothesis property over any sequence of joins, leaves
and answers: never more than one member active or stepping down, and once every stepping-down member
has answered, exactly one active member in a non-empty group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.runtime.stream_session.sac import Notify, SacGroups, Status

KEY = ("/", "s", "app")


def test_plain_stream_first_is_active_next_takes_over():
    g = SacGroups()
    a, notes = g.register(KEY, -1, "A", 1)
    assert notes == [Notify(a, True)]
    b, notes = g.register(KEY, -1, "B", 1)
    assert notes == [] and b.status is Status.WAITING
    c, _ = g.register(KEY, -1, "C", 1)
    assert g.unregister(KEY, b) == []  # a waiting one leaving changes nothing
    assert g.unregister(KEY, a) == [Notify(c, True)]
    assert g.unregister(KEY, c) == [] and KEY not in g.groups


def test_partition_rebalances_through_stepping_down():
    g = SacGroups()
    a, notes = g.register(KEY, 1, "A", 1)  # partition 1
    assert notes == [Notify(a, True)]
    b, notes = g.register(KEY, 1, "B", 1)  # 1 % 2 = 1: B should be active, A steps down first
    assert notes == [Notify(a, False, stepping_down=True)] and a.status is Status.DEACTIVATING
    assert b.status is Status.WAITING
    assert g.stepped_down(KEY, a) == [Notify(b, True)]
    assert g.unregister(KEY, b) == [Notify(a, True)]  # back to one member: it is chosen


def test_rows_for_the_listing_commands():
    """What list_stream_consumer_groups and list_stream_group_consumers show (RabbitMQ's states)."""
    from types import SimpleNamespace
    g = SacGroups()
    a, _ = g.register(KEY, 1, SimpleNamespace(name="conn-a"), 3)
    g.register(KEY, 1, SimpleNamespace(name="conn-b"), 7)  # a steps down for b
    g.register(("/", "other", "app"), -1, SimpleNamespace(name="conn-c"), 0)
    g.register(("v2", "s", "app"), -1, SimpleNamespace(name="conn-d"), 0)
    assert g.group_rows("/") == [
        {"vhost": "/", "stream": "other", "reference": "app", "partition_index": -1, "consumers": 1},
        {"vhost": "/", "stream": "s", "reference": "app", "partition_index": 1, "consumers": 2}]
    assert g.member_rows(KEY) == [
        {"subscription_id": 3, "connection_name": "conn-a", "state": "deactivating (connected)"},
        {"subscription_id": 7, "connection_name": "conn-b", "state": "waiting (connected)"}]
    g.stepped_down(KEY, a)
    assert [r["state"] for r in g.member_rows(KEY) or []] == ["waiting (connected)", "active (connected)"]
    assert g.member_rows(("/", "s", "nobody")) is None


def test_partition_active_leaving_while_another_steps_down():
    g = SacGroups()
    a, _ = g.register(KEY, 0, "A", 1)
    b, _ = g.register(KEY, 0, "B", 1)  # 0 % 2 = 0: A stays
    assert a.status is Status.ACTIVE and b.status is Status.WAITING
    assert g.unregister(KEY, a) == [Notify(b, True)]


ops = st.lists(st.tuples(st.sampled_from(["join", "leave", "answer"]), st.integers(0, 7)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=ops, index=st.integers(-1, 3))
def test_at_most_one_active_and_one_after_all_answers(ops, index):
    g = SacGroups()
    members = []
    for op, n in ops:
        if op == "join":
            m, _ = g.register(KEY, index, "conn", n)
            members.append(m)
        elif op == "leave" and members:
            g.unregister(KEY, members.pop(n % len(members)))
        elif op == "answer":
            for m in members:
                if m.status is Status.DEACTIVATING:
                    g.stepped_down(KEY, m)
                    break
        busy = [m for m in members if m.status is not Status.WAITING]
        assert len(busy) <= 1
    for m in list(members):
        if m.status is Status.DEACTIVATING:
            g.stepped_down(KEY, m)
    if members:
        active = [m for m in members if m.status is Status.ACTIVE]
        assert len(active) == 1
        if index >= 0:
            assert active[0] is members[index % len(members)]


def test_a_member_claiming_to_be_active_stays_so_only_if_no_other_is():
    g = SacGroups()
    a, notes = g.register(KEY, -1, "A", 1, claims_active=True)  # its group moved here: it reads already
    assert notes == [] and a.status is Status.ACTIVE
    b, notes = g.register(KEY, -1, "B", 2, claims_active=True)  # a second claim: told inactive
    assert notes == [Notify(b, False)] and b.status is Status.WAITING
    assert g.unregister(KEY, a) == [Notify(b, True)]


def test_a_claim_on_a_partition_is_rebalanced_as_a_join():
    g = SacGroups()
    a, _ = g.register(KEY, 1, "A", 1)
    b, notes = g.register(KEY, 1, "B", 2, claims_active=False)  # 1 % 2: B is the chosen one
    assert notes == [Notify(a, False, stepping_down=True)]
    g2 = SacGroups()
    c, _ = g2.register(KEY, 1, "C", 1)
    d, notes = g2.register(KEY, 1, "D", 2, claims_active=True)  # C is active: D's claim is refused
    assert notes == [Notify(d, False)] and c.status is Status.ACTIVE
