"""The pure rules of nodes of workers in a multi-node cluster (runtime/workers/membership.py): which
members are one node, and a queue's members placed on distinct nodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.runtime.workers.membership import nodes_of, same_node, seed_answers, siblings, spread_over_nodes


def test_workers_of_one_node_are_one_node() -> None:
    assert same_node("n1@h#w0", "n1@h#w1") and same_node("n1@h", "n1@h")
    assert not same_node("n1@h#w0", "n2@h#w0") and not same_node("n1@h", "n2@h")
    assert siblings("n1@h#w0", ["n1@h#w1", "n2@h#w0", "n1@h#w0", "n1@h#w2"]) == ["n1@h#w1", "n1@h#w2"]
    assert siblings("n1@h", ["n2@h", "n3@h#w0"]) == []  # a one-process node has no other workers
    assert nodes_of(["n1@h#w0", "n2@h", "n1@h#w1"]) == {"n1@h": ["n1@h#w0", "n1@h#w1"], "n2@h": ["n2@h"]}


def test_a_seed_may_answer_as_one_of_its_workers() -> None:
    assert seed_answers("n1@h", "n1@h") and seed_answers("n1@h", "n1@h#w0")
    assert not seed_answers("n1@h", "n2@h#w0") and not seed_answers("n1@h#w0", "n1@h")
    assert not seed_answers("n1@h", "n1@h#wx")


def test_three_members_on_three_nodes_of_two_workers() -> None:
    members = spread_over_nodes(["n1@h#w1"], ["n1@h#w0", "n2@h#w0", "n2@h#w1", "n3@h#w1", "n3@h#w0"], 3)
    assert members == ["n1@h#w1", "n2@h#w0", "n3@h#w1"]


def test_the_declaring_worker_is_skipped_when_the_leader_is_on_its_node() -> None:
    assert spread_over_nodes(["n1@h#w1", "n1@h#w0"], ["n2@h#w0"], 2) == ["n1@h#w1", "n2@h#w0"]


def test_a_lone_node_of_workers_keeps_members_per_worker() -> None:
    assert spread_over_nodes(["n1@h#w0"], ["n1@h#w1", "n1@h#w2"], 3) == ["n1@h#w0", "n1@h#w1", "n1@h#w2"]


_names = st.builds(lambda n, w: f"n{n}@h" if w is None else f"n{n}@h#w{w}",
                   st.integers(0, 5), st.none() | st.integers(0, 3))


@given(st.lists(_names, min_size=1, max_size=4, unique=True), st.lists(_names, max_size=12, unique=True),
       st.integers(1, 7))
def test_distinct_nodes_while_nodes_last(first: list[str], candidates: list[str], size: int) -> None:
    chosen = spread_over_nodes(first, candidates, size)
    pool = list(dict.fromkeys([*first, *candidates]))
    assert len(chosen) == min(size, len(pool)) and len(set(chosen)) == len(chosen)
    assert set(chosen) <= set(pool) and chosen[0] == first[0]
    nodes = {name for name in nodes_of(pool)}
    chosen_nodes = [name for m in chosen for name in nodes_of([m])]
    distinct = min(size, len(nodes))
    assert len(set(chosen_nodes[:distinct])) == distinct  # the first ones cover as many nodes as there are
