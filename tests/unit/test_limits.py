"""Pure tests of vhost and user limits (hutch.core.limits) and of their place in a node's definitions
(the operations a snapshot carries, replay, pruning with their vhost or user). No sockets."""

from __future__ import annotations

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
