"""The sending side of quorum commands that leave a node (queues/quorum/client.py, `CommandTracker`):
what is resent when, in which order, and that a command whose route dies is applied in the end.
Pure: no event loop; time is a number."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hutch.queues.quorum.client import CommandTracker


def test_a_command_is_kept_until_reported_applied() -> None:
    t = CommandTracker(limit=10)
    t.track(1, b"settle-1", "n2", now=0.0)
    t.track(2, b"settle-2", "n2", now=0.0)
    assert list(t.unapplied) == [1, 2]
    assert t.applied([1, 99]) == 1  # an unknown seq (another incarnation's) forgets nothing
    assert list(t.unapplied) == [2]
    assert t.applied([2], leader="n3") == 1
    assert not t.unapplied
    assert t.leader_hint == "n3"


def test_resend_all_is_in_sequence_order_and_restamps() -> None:
    t = CommandTracker(limit=10)
    for seq in (3, 7, 8):
        t.track(seq, f"c{seq}".encode(), "n2", now=1.0)
    assert t.resend_all(now=5.0) == [(3, b"c3"), (7, b"c7"), (8, b"c8")]
    assert all(s.sent_at == 5.0 for s in t.unapplied.values())


def test_due_resends_from_the_oldest_late_command_on() -> None:
    t = CommandTracker(limit=10)
    t.track(1, b"a", "n2", now=0.0)
    t.track(2, b"b", "n2", now=4.0)
    t.track(3, b"c", "n2", now=9.0)
    assert t.due(now=5.0, older_than_s=3.0) == [(1, b"a"), (2, b"b"), (3, b"c")]  # 2 and 3 follow 1
    assert t.due(now=6.0, older_than_s=3.0) == []  # just resent
    t.applied([1])
    assert t.due(now=8.5, older_than_s=3.0) == [(2, b"b"), (3, b"c")]
    t.track(4, b"d", "n2", now=10.0)
    t.applied([2])
    assert t.due(now=12.0, older_than_s=3.0) == [(3, b"c"), (4, b"d")]


def test_nothing_is_due_while_every_command_is_recent() -> None:
    t = CommandTracker(limit=10)
    t.track(1, b"a", "n2", now=10.0)
    assert t.due(now=11.0, older_than_s=3.0) == []
    assert t.unapplied[1].sent_at == 10.0


def test_the_oldest_command_goes_past_the_limit() -> None:
    t = CommandTracker(limit=2)
    for seq in (1, 2, 3):
        t.track(seq, b"x", "n2", now=0.0)
    assert list(t.unapplied) == [2, 3]
    assert t.dropped == 1


def test_a_lost_route_forgets_the_hint_and_says_whether_it_carried_commands() -> None:
    t = CommandTracker(limit=10)
    t.leader_hint = "n2"
    t.track(1, b"a", "n3", now=0.0)
    assert t.route_lost("n2") is False
    assert t.leader_hint is None
    assert t.route_lost("n3") is True
    t.sent_to(1, "n1")
    assert t.route_lost("n3") is False


def test_a_command_made_with_no_route_waits_for_one() -> None:
    t = CommandTracker(limit=10)
    t.track(1, b"a", "", now=0.0)
    assert t.waiting_for_route()
    t.sent_to(1, "n2")
    assert not t.waiting_for_route()
    t.clear()
    assert not t.unapplied and t.leader_hint is None


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30, unique=True))
def test_resends_never_reorder(seqs: list[int]) -> None:
    t = CommandTracker(limit=100)
    for seq in sorted(seqs):
        t.track(seq, b"x", "n2", now=float(seq))
    half = sorted(seqs)[::2]
    t.applied(half)
    resent = [s for s, _ in t.due(now=1000.0, older_than_s=0.5)]
    assert resent == sorted(set(seqs) - set(half))


class LossyRoute(RuleBasedStateMachine):
    """A node sends commands to a leader through a route that drops commands and answers (a relay or a
    leader killed at any moment). The leader applies what reaches it; an answer that reaches the node
    is `applied`. Resends happen on a route change (`resend_all`) or when a command is late (`due`). In
    the end, with the route healed, every command made has been applied and nothing stays tracked."""

    def __init__(self) -> None:
        super().__init__()
        self.t = CommandTracker(limit=1_000)
        self.now = 0.0
        self.next_seq = 1
        self.made: list[int] = []
        self.in_flight: list[int] = []  # commands on the route to the leader
        self.answers: list[int] = []  # the leader's applied reports on the way back
        self.applied_at_leader: list[int] = []

    def _send(self, commands: list[tuple[int, bytes]]) -> None:
        self.in_flight.extend(seq for seq, _ in commands)

    @rule()
    def make(self) -> None:
        seq = self.next_seq
        self.next_seq += 1
        self.made.append(seq)
        self.t.track(seq, seq.to_bytes(4, "big"), "relay", self.now)
        self.in_flight.append(seq)

    @precondition(lambda self: self.in_flight)
    @rule(n=st.integers(min_value=1, max_value=5))
    def leader_applies(self, n: int) -> None:
        for seq in self.in_flight[:n]:
            self.applied_at_leader.append(seq)
            self.answers.append(seq)
        del self.in_flight[:n]

    @precondition(lambda self: self.in_flight or self.answers)
    @rule()
    def route_dies(self) -> None:  # the relay (or the leader) dies with everything on its way
        self.in_flight.clear()
        self.answers.clear()
        self.t.route_lost("relay")
        self._send(self.t.resend_all(self.now))

    @precondition(lambda self: self.answers)
    @rule(n=st.integers(min_value=1, max_value=5))
    def answers_arrive(self, n: int) -> None:
        self.t.applied(self.answers[:n], leader="leader")
        del self.answers[:n]

    @rule(dt=st.floats(min_value=0.1, max_value=5.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._send(self.t.due(self.now, 3.0))

    @invariant()
    def tracked_are_made_and_unanswered(self) -> None:
        assert set(self.t.unapplied) <= set(self.made)
        assert list(self.t.unapplied) == sorted(self.t.unapplied)

    def teardown(self) -> None:
        # heal: the route stays up; answers and late commands flow until nothing is tracked
        for _ in range(len(self.made) + 2):
            self.now += 4.0
            self._send(self.t.due(self.now, 3.0))
            self.applied_at_leader.extend(self.in_flight)
            self.answers.extend(self.in_flight)
            self.in_flight.clear()
            self.t.applied(self.answers)
            self.answers.clear()
        assert not self.t.unapplied
        assert set(self.applied_at_leader) == set(self.made)  # nothing a route lost stays unapplied


LossyRoute.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_lossy_route = LossyRoute.TestCase
