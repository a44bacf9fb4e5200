"""`MarkerWait` (core/move_order.py): the new home's wait for the other workers' markers across a move.

Pure transition tests, then a Hypothesis property over any interleaving of publishes, markers, the install,
links going down and the bound: every held publish is released exactly once, in its origin's order, never
before the install, and an origin's publishes only once its marker came (or its wait was ended for it).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.core.move_order import MarkerWait


def test_direct_publishes_wait_for_the_marker_and_the_install() -> None:
    wait: MarkerWait[int] = MarkerWait("A", ["A", "C", "D"])
    assert set(wait.held) == {"C", "D"}  # the old home is never waited for: its link is ordered
    assert wait.holds("A") is None and wait.holds("X") is None
    held = wait.holds("C")
    assert held is not None
    held += [1, 2]
    assert wait.marker("C") == []  # before the install: remembered
    assert wait.install() == [("C", [1, 2])]
    assert not wait.done and set(wait.held) == {"D"}
    assert wait.marker("D") == [("D", [])]
    assert wait.done
    assert wait.marker("D") == [] and wait.marker("C") == []  # a second marker releases nothing


def test_a_marker_after_the_install_releases_its_origin_at_once() -> None:
    wait: MarkerWait[int] = MarkerWait("A", ["C"])
    assert wait.install() == []
    held = wait.holds("C")
    assert held is not None
    held.append(7)
    assert wait.marker("Z") == []  # an origin not expected (a stale marker)
    assert wait.marker("C") == [("C", [7])]
    assert wait.done


def test_the_old_home_going_down_lets_every_origin_go() -> None:
    wait: MarkerWait[int] = MarkerWait("A", ["C", "D"])
    held = wait.holds("D")
    assert held is not None
    held.append(1)
    assert wait.peer_down("A") == []  # before the install: kept as markers
    assert wait.install() == [("C", []), ("D", [1])]
    assert wait.done


def test_an_origin_going_down_is_let_go_only_with_nothing_held() -> None:
    wait: MarkerWait[int] = MarkerWait("A", ["C", "D"])
    wait.install()
    held = wait.holds("D")
    assert held is not None
    held.append(1)
    assert wait.peer_down("C") == [("C", [])]
    assert wait.peer_down("D") == []  # its marker is on its way through A: sent before its first direct publish
    assert wait.expire() == [("D", [1])]  # the bound
    assert wait.done


def test_abandon_gives_everything_back() -> None:
    wait: MarkerWait[int] = MarkerWait("A", ["C"])
    held = wait.holds("C")
    assert held is not None
    held.append(3)
    wait.marker("C")
    assert wait.abandon() == [("C", [3])]
    assert wait.done and not wait.marked


ORIGINS = ["C", "D", "E"]
events = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.sampled_from(ORIGINS)),
    st.tuples(st.just("marker"), st.sampled_from([*ORIGINS, "Z"])),
    st.tuples(st.just("down"), st.sampled_from([*ORIGINS, "A"])),
    st.tuples(st.just("install"), st.just("")),
    st.tuples(st.just("expire"), st.just("")),
), max_size=40)


@given(events)
def test_every_publish_is_released_once_in_order_and_never_early(steps: list[tuple[str, str]]) -> None:
    wait: MarkerWait[tuple[str, int]] = MarkerWait("A", ["A", *ORIGINS])
    sent = {o: 0 for o in ORIGINS}
    taken: dict[str, list[int]] = {o: [] for o in ORIGINS}  # what reached the queue, per origin
    marker_came: set[str] = set()
    ended: set[str] = set()  # origins whose wait ended another way (the old home down, the bound)

    def take(released: list[tuple[str, list[tuple[str, int]]]], why: str) -> None:
        for origin, items in released:
            assert wait.installed, "released before the queue was installed"
            assert origin in marker_came | ended or why == "expire", (origin, why)
            assert all(o == origin for o, _n in items)
            taken[origin].extend(n for _o, n in items)

    for kind, who in steps:
        if kind == "publish":
            n = sent[who]
            sent[who] += 1
            held = wait.holds(who)
            if held is None:  # not (or no longer) waited for: straight to the queue
                if not wait.installed:
                    continue  # (the runtime holds it in the queue's incoming hold; not this machine's)
                taken[who].append(n)
            else:
                held.append((who, n))
        elif kind == "marker":
            marker_came.add(who)
            take(wait.marker(who), kind)
        elif kind == "down":
            ended.update(ORIGINS if who == "A" else [who])
            take(wait.peer_down(who), kind)
        elif kind == "install":
            if not wait.installed:
                take(wait.install(), kind)
        else:
            if wait.installed:
                take(wait.expire(), kind)
    if not wait.installed:
        take(wait.install(), "install")
    take(wait.expire(), "expire")
    assert wait.done
    for o in ORIGINS:
        assert taken[o] == sorted(taken[o]) and len(set(taken[o])) == len(taken[o]), (o, taken[o])
