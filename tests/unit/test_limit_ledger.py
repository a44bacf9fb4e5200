"""Pure tests of worker 0's count of a node's limited connections (runtime/broker/limits.py's
`CountLedger`): a model of workers that ask, are judged, read their answers and close connections in any
interleaving, checked for the two halves of "exact": the limit is never passed, and a request is refused
only when the limit is really reached (open connections plus grants not yet read). No sockets, no loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.errors import ConnectionError_
from hutch.cluster.messages import LimitReport
from hutch.core.limits import USER_CHANNELS, VHOST_CONNECTIONS, PeerCounts
from hutch.runtime.broker.limits import CountLedger, WorkerLimits

KEY = (VHOST_CONNECTIONS, "/")


@dataclass
class Worker:
    name: str
    incarnation: int = 1
    open: int = 0
    next_id: int = 0
    sent: list[int] = field(default_factory=list)  # asked, not judged yet
    answers: dict[int, bool] = field(default_factory=dict)  # judged, answer not read yet: granted?

    def report(self) -> LimitReport:
        pending = sorted([*self.sent, *self.answers])
        return LimitReport(self.incarnation, [[KEY[0], KEY[1], self.open]], pending, self.next_id)


def test_a_grant_counts_until_a_report_shows_it_read() -> None:
    ledger, a, b = CountLedger(), Worker("w0"), Worker("w1")
    b.sent.append(0)
    b.next_id = 1
    assert ledger.judge("w1", 0, [(*KEY, 1)], {"w0": a.report(), "w1": b.report()}) is None
    a.sent.append(0)
    a.next_id = 1
    # w1 has not read its grant: w0's request finds the place taken
    assert ledger.judge("w0", 0, [(*KEY, 1)], {"w0": a.report(), "w1": b.report()}) == (*KEY, 1)
    assert ledger.grants("w1") == 1
    b.open = 1  # w1 read its grant and opened
    a.sent = [1]
    a.next_id = 2
    assert ledger.judge("w0", 1, [(*KEY, 1)], {"w0": a.report(), "w1": LimitReport(1, [[*KEY, 1]], [], 1)}) == (*KEY, 1)
    assert ledger.grants("w1") == 0  # settled: it is in w1's count now
    b.open = 0  # closed: the place is free at once
    assert ledger.judge("w0", 2, [(*KEY, 1)], {"w0": LimitReport(1, [[*KEY, 0]], [2], 3),
                                                 "w1": LimitReport(1, [[*KEY, 0]], [], 1)}) is None


def test_a_restarted_or_forgotten_worker_takes_its_grants_with_it() -> None:
    ledger = CountLedger()
    assert ledger.judge("w1", 0, [(USER_CHANNELS, "u", 5)], {"w1": LimitReport(7, [], [0], 1)}) is None
    assert ledger.grants("w1") == 1
    ledger.judge("w1", 0, [(USER_CHANNELS, "u", 5)], {"w1": LimitReport(8, [], [0], 1)})  # a new incarnation
    assert ledger.grants("w1") == 1  # only the new one's grant
    ledger.forget("w1")
    assert ledger.grants("w1") == 0 and ledger.incarnation_of("w1") == -1


def test_the_first_limit_reached_is_the_one_refused() -> None:
    ledger = CountLedger()
    wanted = [(VHOST_CONNECTIONS, "/", 5), (1, "guest", 0)]
    assert ledger.judge("w0", 0, wanted, {"w0": LimitReport(1, [[0, "/", 5], [1, "guest", 0]], [0], 1)}) == wanted[0]
    assert ledger.judge("w0", 1, wanted, {"w0": LimitReport(1, [[0, "/", 4], [1, "guest", 0]], [1], 2)}) == wanted[1]


STEP = st.tuples(st.sampled_from(["ask", "judge", "read", "close"]), st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(0, 3), steps=st.lists(STEP, max_size=60))
def test_the_limit_is_never_passed_and_nothing_is_refused_below_it(limit: int, steps: list[tuple[str, int]]) -> None:
    ledger = CountLedger()
    workers = [Worker(f"w{i}") for i in range(3)]
    for action, i in steps:
        w = workers[i]
        if action == "ask":
            w.sent.append(w.next_id)
            w.next_id += 1
        elif action == "judge" and w.sent:  # worker 0 judges w's oldest request, every report fresh
            request = w.sent.pop(0)
            taken = sum(x.open + sum(x.answers.values()) for x in workers)
            refused = ledger.judge(w.name, request, [(*KEY, limit)], {x.name: x.report() for x in workers})
            assert (refused is not None) == (taken >= limit), (taken, limit)
            w.answers[request] = refused is None
        elif action == "read" and w.answers:
            request = min(w.answers)
            if w.answers.pop(request):
                w.open += 1
        elif action == "close" and w.open:
            w.open -= 1
        assert sum(x.open for x in workers) <= limit


class FakeNode:
    """What `WorkerLimits` reads of a node: its connections (none here) and the gossiped counts."""

    def __init__(self) -> None:
        self.connections: set[object] = set()
        self.peer_counts = PeerCounts()


class Gone(Exception):
    """What the link raises for a worker that is gone or silent."""


async def unreachable(_peer: str, _request: object, _timeout: float) -> object:
    raise Gone()


def test_without_worker_0_a_worker_judges_as_between_nodes() -> None:
    fallback: list[str] = []
    exact = WorkerLimits(FakeNode(), "n#w1", "n#w0", unreachable, lambda: ["n#w0"], (Gone,))  # type: ignore[arg-type]
    asyncio.run(exact.acquire([(*KEY, 1)], "/", "guest", lambda: fallback.append("judged here")))
    assert fallback == ["judged here"] and exact.pending == set() and exact.next_id == 1


def test_worker_0_counts_a_silent_worker_as_it_last_gossiped() -> None:
    node = FakeNode()
    node.peer_counts.replace("n#w1", [[KEY[0], KEY[1], 2]])
    exact = WorkerLimits(node, "n#w0", "n#w0", unreachable, lambda: ["n#w1"], (Gone,))  # type: ignore[arg-type]
    with pytest.raises(ConnectionError_) as caught:
        asyncio.run(exact.acquire([(*KEY, 2)], "/", "guest", lambda: None))
    assert caught.value.code == 530 and "connection limit (2) is reached" in caught.value.text
    assert asyncio.run(exact.judge("n#w0", 5, [(*KEY, 3)])) is None  # room for one more
    assert exact.pending == set()
