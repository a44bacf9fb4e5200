"""Pure tests of vhost and user limits (hutch.core.limits) and of their place in a node's definitions
(the operations a snapshot carries, replay, pruning with their vhost or user). No sockets."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.config import Config
from hutch.core import limits
from hutch.core.definition_ops import from_stored, kind_of, to_stored
from hutch.runtime.app import build_node
from hutch.runtime.broker import limits as runtime_limits
from hutch.runtime.broker.node import Node


def test_validation_texts_are_rabbitmqs() -> None:
    assert limits.validate_vhost_limits({"max-queues": 3, "max-connections": -1}) == {
        "max-connections": -1, "max-queues": 3}
    assert limits.validate_user_limits([]) == {}
    cases = [
        ({"max-queues": "3"}, 'max-queues should be a number, actually was <<"3">>'),
        ({"max-queues": 1.5}, "max-queues should be a number, actually was 1.5"),
        ({"max-queues": True}, "max-queues should be a number, actually was true"),
        ({"max-channels": 1}, 'Unrecognised terms [{<<"max-channels">>,1}] in limits'),
        ("x", 'limits not a list <<"x">>'),
    ]
    for doc, text in cases:
        with pytest.raises(limits.LimitError) as info:
            limits.validate_vhost_limits(doc)
        assert str(info.value) == text
    with pytest.raises(limits.LimitError, match="64-bit"):
        limits.validate_user_limits({"max-channels": 2**64})


@given(st.integers(-5, 5), st.integers(0, 10))
def test_negative_is_unlimited_zero_forbids_n_allows_n(value: int, count: int) -> None:
    limit = limits.effective({"max-queues": value}, "max-queues")
    if value < 0:
        assert limit is None and not limits.reached(limit, count)
    else:
        assert limits.reached(limit, count) == (count >= value)


def test_store_never_keeps_an_empty_entry() -> None:
    store = limits.LimitStore()
    assert store.set_vhost("/", {"max-queues": 1})
    assert not store.set_vhost("/", {"max-queues": 1})  # unchanged
    assert store.set_vhost("/", {})
    assert store.vhosts == {}
    store.set_user("u", {"max-channels": 2})
    assert store.prune({"/"}, set()) and store.users == {}


def _node() -> Node:
    return build_node(Config(data_dir="", node_name="unit@localhost"), monitor_resources=False)


def test_limits_are_snapshot_operations_and_replay_the_same() -> None:
    node = _node()
    node.auth.add_user("app", "pw", [])
    node.permissions_changed()
    runtime_limits.set_vhost_limits(node, "/", {"max-connections": 4})
    runtime_limits.set_user_limits(node, "app", {"max-channels": 9})
    ops = node.state_ops()
    stored = [to_stored(op) for op in ops]
    assert {"op": "vhost_limits.set", "vhost": "/", "limits": {"max-connections": 4}} in stored
    assert {"op": "user_limits.set", "user": "app", "limits": {"max-channels": 9}} in stored
    other = _node()
    other.reset_to(ops)
    assert (other.limits.vhosts, other.limits.users) == (node.limits.vhosts, node.limits.users)
    other.reset_to([op for op in ops if not kind_of(op).endswith("limits.set")])  # a snapshot without limits
    assert (other.limits.vhosts, other.limits.users) == ({}, {})


def test_a_deleted_user_or_vhost_takes_its_limits_along() -> None:
    node = _node()
    node.add_vhost("v")
    node.auth.add_user("app", "pw", [])
    node.permissions_changed()
    runtime_limits.set_vhost_limits(node, "v", {"max-queues": 1})
    runtime_limits.set_user_limits(node, "app", {"max-connections": 1})
    node.delete_vhost("v")
    node.auth.delete_user("app")
    node.permissions_changed()
    assert (node.limits.vhosts, node.limits.users) == ({}, {})
    with pytest.raises(KeyError):
        node.apply_op(from_stored({"op": "vhost_limits.set", "vhost": "v", "limits": {"max-queues": 1}}))


# -- the other nodes' counts (cluster-wide limits, issue 21) --------------------------------------------

_ROW = st.tuples(st.sampled_from(limits.COUNT_KINDS), st.sampled_from(["a", "b", "c"]), st.integers(0, 5))


@given(st.lists(st.tuples(st.sampled_from(["n2", "n3"]), st.booleans(), st.lists(_ROW, max_size=6)), max_size=30))
def test_peer_counts_are_the_sum_of_each_nodes_last_report(steps: list[tuple[str, bool, list[tuple[int, str, int]]]]
                                                           ) -> None:
    counts = limits.PeerCounts()
    last: dict[str, dict[tuple[int, str], int]] = {}
    for peer, down, rows in steps:
        if down:
            counts.drop(peer)
            last.pop(peer, None)
            continue
        report = {(k, n): c for k, n, c in rows}  # a report names each key once
        counts.replace(peer, [[k, n, c] for (k, n), c in report.items()])
        last[peer] = report
        for kind in limits.COUNT_KINDS:
            for name in "abc":
                assert counts.total(kind, name) == sum(r.get((kind, name), 0) for r in last.values())
    assert 0 not in counts.totals.values()


def test_a_malformed_report_changes_nothing() -> None:
    counts = limits.PeerCounts()
    counts.replace("n2", [[limits.VHOST_CONNECTIONS, "v", 2]])
    for bad in ([[9, "v", 1]], [[0, "v", -1]], [[0, 1, 1]], "rows", [[0, "v"]]):
        with pytest.raises(ValueError):
            counts.replace("n2", bad)  # type: ignore[arg-type]
    assert counts.total(limits.VHOST_CONNECTIONS, "v") == 2


def test_local_counts_name_only_limited_vhosts_and_users() -> None:
    node = build_node(Config(data_dir=""), monitor_resources=False)
    assert runtime_limits.local_counts(node) == []  # no connection or channel limit: nothing to report


def test_limit_gossip_ticks_only_while_there_is_something_to_count_or_tell() -> None:
    """With no connection or channel limit anywhere and the peers told so, the gossip's timer stops (an
    idle worker's loop sleeps); a limit set, or a peer come up, starts it again; a limit cleared is told
    ([]) and then it stops again."""

    async def run() -> None:
        node = _node()
        sent: list[tuple[str, list[list[object]]]] = []
        gossip = runtime_limits.LimitGossip(node, lambda peer, rec: sent.append((peer, rec.rows)) or True,
                                            lambda: ["peer"])
        node.limit_hooks.append(gossip.wake)
        gossip.booted()
        assert gossip._timer is not None
        gossip._tick()
        assert sent == [("peer", [])] and gossip._timer is None  # told "nothing", then quiet
        runtime_limits.set_vhost_limits(node, "/", {"max-connections": 4})
        assert gossip._timer is not None  # the hook woke it
        gossip._timer.cancel()
        gossip._tick()
        assert gossip._timer is not None and sent == [("peer", [])]  # counting (no connection yet)
        runtime_limits.set_vhost_limits(node, "/", {})
        gossip._timer.cancel()
        gossip._tick()
        assert gossip._timer is None
        gossip.peer_changed("other", True)  # a newcomer is told everything: ticking again
        assert gossip._timer is not None
        gossip._timer.cancel()
        gossip._tick()
        assert sent[-1] == ("peer", []) and gossip._timer is None
        gossip.stop()
        runtime_limits.set_vhost_limits(node, "/", {"max-connections": 1})
        assert gossip._timer is None  # stopped stays stopped

    asyncio.run(run())
