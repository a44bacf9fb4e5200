"""Nodes of workers as members of a multi-node cluster: which members are one node, and placement by node.

Owns the pure rules (docs/scaling.md, "A node of workers in a multi-node cluster"): every worker of every
node is a member `<node>#w<N>` of the cluster's metadata group and transport mesh; everything shown
outside names nodes, never workers, and a quorum queue's members go to distinct *nodes*.

- `same_node(a, b)`: two members are workers of one node (or the same one-process node).
- `siblings(me, peers)`: the peers that are other workers of `me`'s node (reached over the worker link).
- `nodes_of(members)`: the members grouped by node, in first-seen order.
- `spread_over_nodes(first, candidates, size)`: a queue's members, at most one per node while nodes last.
- `seed_answers(expected, found)`: whether a node dialled as `expected` (a `--join` seed) may answer as
  `found` (the seed's worker 0, `<expected>#w0`, or any of its workers).

No IO, no clock: the cluster service, the transport, the quorum placement and the management API call
these with names they hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hutch.runtime.workers.spec import node_of_worker


def same_node(a: str, b: str) -> bool:
    return node_of_worker(a) == node_of_worker(b)


def siblings(me: str, peers: Iterable[str]) -> list[str]:
    """The other workers of `me`'s node among `peers` (none for a one-process node)."""
    mine = node_of_worker(me)
    return [p for p in peers if p != me and node_of_worker(p) == mine]


def nodes_of(members: Iterable[str]) -> dict[str, list[str]]:
    """node name -> its members (workers), both in first-seen order."""
    out: dict[str, list[str]] = {}
    for m in members:
        out.setdefault(node_of_worker(m), []).append(m)
    return out


def spread_over_nodes(first: Sequence[str], candidates: Sequence[str], size: int) -> list[str]:
    """`size` members (or fewer, when there are not enough): `first` in order (the leader locator's choice,
    then the declaring member), skipping one whose node is already taken; then the `candidates` in their
    order (the caller puts running ones first), one per node not yet taken; then, only when there are fewer
    nodes than `size`, the remaining candidates (workers of nodes already taken) in order. Never repeats a
    member. Invariant: while nodes last, no two members share a node."""
    assert size >= 1
    chosen: list[str] = []
    taken: set[str] = set()
    for m in [*first, *candidates]:
        node = node_of_worker(m)
        if len(chosen) < size and m not in chosen and node not in taken:
            chosen.append(m)
            taken.add(node)
    for m in [*first, *candidates]:
        if len(chosen) < size and m not in chosen:
            chosen.append(m)
    assert len(set(chosen)) == len(chosen)
    return chosen


def seed_answers(expected: str, found: str) -> bool:
    """A `--join` seed names a node (`n1@host`); a node of workers answers on that port as its worker 0
    (`n1@host#w0`). Any worker of the named node is the node named."""
    return found == expected or (found != expected and node_of_worker(found) == expected)


__all__ = ["nodes_of", "same_node", "seed_answers", "siblings", "spread_over_nodes"]
