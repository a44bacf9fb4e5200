"""Definition operations as records (hutch.core.definition_ops): the stored form round-trips for every
kind, the maps written before the records existed decode into the same records (existing data
directories load), bad maps raise `DefinitionOpError`s only, and the dispatch table covers every kind."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.table import encode_table
from hutch.cluster.metadata import MetadataMachine, decode_ops, encode_ops
from hutch.config import Config
from hutch.core import definition_ops as d
from hutch.core.auth import AuthStore
from hutch.runtime.app import build_node
from hutch.runtime.broker.definitions import DefinitionStore

_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=8)


def _strategy(annotation: Any, name: str) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return st.one_of(*(_strategy(a, name) for a in typing.get_args(annotation)))
    base = origin or annotation
    if base is list:
        inner = st.lists(st.text(max_size=8), min_size=5, max_size=5) if name == "table" else st.text(max_size=8)
        return st.lists(inner, max_size=4)
    if base is dict:
        return st.dictionaries(st.text(max_size=8), _json, max_size=4)
    return {int: st.integers(0, 2**63 - 1), str: st.text(max_size=20), bytes: st.binary(max_size=40),
            bool: st.booleans(), type(None): st.none()}[base]


def ops(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: _strategy(hints[f.name], f.name) for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", d.ALL_OPS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_kind_round_trips_through_its_stored_form(cls: type, data: st.DataObject) -> None:
    op = data.draw(ops(cls))
    stored = msgpack.unpackb(msgpack.packb(d.to_stored(op), use_bin_type=True), raw=False)
    assert d.from_stored(stored) == op


def test_kinds_are_distinct_and_every_record_is_listed() -> None:
    assert len({cls.KIND for cls in d.ALL_OPS}) == len(d.ALL_OPS)
    in_module = {v for v in vars(d).values() if dataclasses.is_dataclass(v) and hasattr(v, "KIND")}
    assert in_module == set(d.ALL_OPS)


# -- the maps the node wrote before the records (runtime/broker/node.py, policies.py, clustering) -------------

ARGS = encode_table({"x-max-length": 10})
POLICY = json.dumps({"vhost": "/", "name": "p", "pattern": "^q", "apply-to": "queues",
                     "definition": {"max-length": 5}, "priority": 0})
OLD_FORMS: list[tuple[dict[str, Any], Any]] = [
    ({"op": "auth", "auth": {"users": [], "vhosts": [], "permissions": []}},
     d.SetAuth({"users": [], "vhosts": [], "permissions": []})),
    ({"op": "auth.rehash", "user": "u", "previous_hash": "h0", "new_hash": "h1"}, d.RehashUser("u", "h0", "h1")),
    ({"op": "auth.patch", "changes": [["users", ["u"], None]]}, d.PatchAuth([["users", ["u"], None]])),
    ({"op": "topic_permissions.patch", "changes": [["/", "u", "x", "^a", ".*"], ["/", "u", "y"]]},
     d.PatchTopicPermissions([["/", "u", "x", "^a", ".*"], ["/", "u", "y"]])),
    ({"op": "cluster_name", "name": "c1"}, d.SetClusterName("c1")),
    ({"op": "topic_permissions", "table": [["/", "u", "amq.topic", "^a", ".*"]]},
     d.SetTopicPermissions([["/", "u", "amq.topic", "^a", ".*"]])),
    ({"op": "exchange.declare", "vhost": "/", "name": "x", "type": "topic", "auto_delete": False, "internal": False,
      "arguments": ARGS, "durable": True}, d.DeclareExchange("/", "x", "topic", False, False, ARGS, True)),
    ({"op": "exchange.declare", "vhost": "/", "name": "x", "type": "direct", "auto_delete": True, "internal": True,
      "arguments": ARGS}, d.DeclareExchange("/", "x", "direct", True, True, ARGS)),  # before "durable" was kept
    ({"op": "exchange.delete", "vhost": "/", "name": "x"}, d.DeleteExchange("/", "x")),
    ({"op": "queue.declare", "vhost": "/", "name": "q", "auto_delete": False, "arguments": ARGS, "node": "n1@h",
      "durable": True, "exclusive": False}, d.DeclareQueue("/", "q", False, ARGS, "n1@h", True, False)),
    ({"op": "queue.declare", "vhost": "/", "name": "q", "auto_delete": False, "arguments": ARGS},
     d.DeclareQueue("/", "q", False, ARGS)),  # the first single-node form
    ({"op": "queue.declare", "vhost": "v", "name": "qq", "auto_delete": False, "arguments": ARGS, "node": "n2@h",
      "durable": True, "exclusive": False, "type": "quorum", "gid": 2**61, "members": ["n2@h", "n1@h"]},
     d.DeclareQueue("v", "qq", False, ARGS, "n2@h", True, False, "quorum", 2**61, ["n2@h", "n1@h"])),
    ({"op": "queue.delete", "vhost": "/", "name": "q"}, d.DeleteQueue("/", "q")),
    ({"op": "queue.members", "vhost": "/", "name": "qq", "members": ["a", "b"]},
     d.SetQueueMembers("/", "qq", ["a", "b"])),
    ({"op": "bind", "vhost": "/", "source": "x", "dest_kind": "queue", "dest": "q", "routing_key": "k",
      "arguments": ARGS}, d.Bind("/", "x", "queue", "q", "k", ARGS)),
    ({"op": "unbind", "vhost": "/", "source": "x", "dest_kind": "exchange", "dest": "y", "routing_key": "",
      "arguments": ARGS}, d.Unbind("/", "x", "exchange", "y", "", ARGS)),
    ({"op": "policy.set", "vhost": "/", "name": "p", "policy": POLICY}, d.SetPolicy("/", "p", POLICY)),
    ({"op": "operator_policy.set", "vhost": "/", "name": "p", "policy": POLICY},
     d.SetPolicy("/", "p", POLICY, operator=True)),
    ({"op": "policy.clear", "vhost": "/", "name": "p"}, d.ClearPolicy("/", "p")),
    ({"op": "operator_policy.clear", "vhost": "/", "name": "p"}, d.ClearPolicy("/", "p", operator=True)),
    ({"op": "cluster.join", "name": "n1@h", "raft_id": 1, "host": "127.0.0.1", "port": 25672},
     d.ClusterJoin("n1@h", "127.0.0.1", 25672, 1)),
    ({"op": "cluster.join", "name": "n2@h", "host": "127.0.0.1", "port": 25682},
     d.ClusterJoin("n2@h", "127.0.0.1", 25682)),
    ({"op": "cluster.leave", "name": "n2@h"}, d.ClusterLeave("n2@h")),
    ({"op": "noop"}, d.Noop()),
    ({"op": "vhost_limits.set", "vhost": "/", "limits": {"max-queues": 3}}, d.SetVhostLimits("/", {"max-queues": 3})),
    ({"op": "user_limits.set", "user": "u", "limits": {"max-channels": 2}}, d.SetUserLimits("u", {"max-channels": 2})),
    ({"op": "parameter.set", "component": "shovel", "vhost": "/", "name": "s", "value": "{}", "user": "guest"},
     d.SetParameter("shovel", "/", "s", "{}", "guest")),
    ({"op": "parameter.set", "component": "shovel", "vhost": "/", "name": "s", "value": "{}"},
     d.SetParameter("shovel", "/", "s", "{}")),  # "user" may be absent (it defaults to "")
    ({"op": "parameter.clear", "component": "shovel", "vhost": "/", "name": "s"},
     d.ClearParameter("shovel", "/", "s")),
]


@pytest.mark.parametrize(("stored", "record"), OLD_FORMS, ids=lambda v: v["op"] if isinstance(v, dict) else "")
def test_the_maps_written_before_the_records_decode(stored: dict[str, Any], record: Any) -> None:
    packed = msgpack.unpackb(msgpack.packb(stored, use_bin_type=True), raw=False)
    assert d.from_stored(packed) == record
    # what this version writes reads back the same; a complete old map is written exactly as before
    assert d.from_stored(d.to_stored(record)) == record
    if set(stored) == set(d.to_stored(record)):
        assert d.to_stored(record) == stored


def test_every_kind_has_an_old_form_in_this_test() -> None:
    assert {type(r) for _s, r in OLD_FORMS} == set(d.ALL_OPS)


@pytest.mark.parametrize(("stored", "error", "text"), [
    ({"op": "vhost.limits", "vhost": "/"}, d.UnknownOp, "unknown definition operation 'vhost.limits'"),
    ({"name": "x"}, d.UnknownOp, "unknown definition operation None"),
    (["op", "noop"], d.MalformedOp, "must be a map"),
    ({"op": "queue.delete", "vhost": "/"}, d.MalformedOp, "'queue.delete' has no 'name'"),
    ({"op": "queue.delete", "vhost": "/", "name": 5}, d.MalformedOp, "'queue.delete': 'name' is int"),
    ({"op": "cluster.join", "name": "n", "host": "h", "port": True}, d.MalformedOp, "'port' is bool"),
    ({"op": "bind", "vhost": "/", "source": "x", "dest_kind": "queue", "dest": "q", "routing_key": "k",
      "arguments": "text"}, d.MalformedOp, "'arguments' is str"),
])
def test_bad_maps_raise_definition_op_errors(stored: Any, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        d.from_stored(stored)


@settings(max_examples=150, deadline=None)  # `make test`; the 300 of the long run below are in the slow set
@given(stored=st.dictionaries(st.sampled_from(["op", "vhost", "name", "arguments", "members", "port", "auth"]),
                              st.one_of(st.sampled_from([c.KIND for c in d.ALL_OPS]), _json, st.binary(max_size=4)),
                              max_size=7))
def test_from_stored_raises_only_definition_op_errors(stored: dict[str, Any]) -> None:
    try:
        d.from_stored(stored)
    except d.DefinitionOpError:
        pass


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@settings(max_examples=300, deadline=None)
@given(stored=st.dictionaries(st.sampled_from(["op", "vhost", "name", "arguments", "members", "port", "auth"]),
                              st.one_of(st.sampled_from([c.KIND for c in d.ALL_OPS]), _json, st.binary(max_size=4)),
                              max_size=7))
def test_from_stored_raises_only_definition_op_errors_long(stored: dict[str, Any]) -> None:
    test_from_stored_raises_only_definition_op_errors.hypothesis.inner_test(stored)


def test_the_dispatch_table_must_cover_every_node_operation() -> None:
    with pytest.raises(TypeError, match="no handler for definition operations SetClusterName"):
        d.Dispatch({cls: print for cls in d.NODE_OPS if cls is not d.SetClusterName})
    seen: list[Any] = []
    dispatch = d.Dispatch({cls: seen.append for cls in d.NODE_OPS})
    dispatch(d.DeleteQueue("/", "q"))
    assert seen == [d.DeleteQueue("/", "q")]
    with pytest.raises(d.UnknownOp, match="no handler for definition operation Noop"):
        dispatch(d.Noop())


# -- a data directory written before the records, loaded by this version ----------------------------------------


def test_a_definitions_directory_written_with_the_old_maps_loads(tmp_path: Path) -> None:
    old = DefinitionStore(str(tmp_path))
    store_of_users = AuthStore()
    store_of_users.bootstrap("guest", "guest", "/")
    auth = store_of_users.to_dict()
    written = [
        {"op": "auth", "auth": auth},
        {"op": "exchange.declare", "vhost": "/", "name": "x", "type": "topic", "auto_delete": False,
         "internal": False, "arguments": encode_table({})},
        {"op": "queue.declare", "vhost": "/", "name": "q", "auto_delete": False, "arguments": ARGS},
        {"op": "bind", "vhost": "/", "source": "x", "dest_kind": "queue", "dest": "q", "routing_key": "a.#",
         "arguments": encode_table({})},
        {"op": "policy.set", "vhost": "/", "name": "p", "policy": POLICY},
        {"op": "cluster_name", "name": "old-cluster"},
        {"op": "topic_permissions", "table": [["/", "guest", "x", "^a", ".*"]]},
        {"op": "some.future.op", "vhost": "/"},  # skipped with a warning, as before
    ]
    for op in written:
        old.log.append([msgpack.packb(op, use_bin_type=True)])
    old.log.sync()
    old.close()
    store = DefinitionStore(str(tmp_path))
    node = build_node(Config(data_dir=str(tmp_path)), store=store, monitor_resources=False)
    vhost = node.vhosts["/"]
    assert vhost.queues["q"].arguments == {"x-max-length": 10}
    assert vhost.exchanges["x"].type == "topic"
    assert [b.routing_key for b in vhost.exchanges["x"].router.bindings()] == ["a.#"]
    assert node.policies.get("/", "p") is not None and node.config.cluster_name == "old-cluster"
    assert node.topic_permissions == {("/", "guest"): {"x": ("^a", ".*")}}
    store.close()
    # compacted at start into a snapshot of this version's maps, which loads the same again
    again = build_node(Config(data_dir=str(tmp_path)), store=DefinitionStore(str(tmp_path)), monitor_resources=False)
    assert set(again.vhosts["/"].queues) == {"q"} and again.policies.get("/", "p") is not None


def test_a_metadata_entry_keeps_its_incarnation_and_skips_what_it_cannot_read() -> None:
    data = encode_ops([d.DeleteQueue("/", "q"), d.Noop()], "inc1")
    assert decode_ops(data) == [("inc1", d.DeleteQueue("/", "q")), ("inc1", d.Noop())]
    old_entry = msgpack.packb({"ops": [{"op": "queue.delete", "vhost": "/", "name": "q", "inc": "abc"},
                                       {"op": "from.the.future"},
                                       {"op": "cluster.join", "name": "n1", "raft_id": 1, "host": "h", "port": 1}]},
                              use_bin_type=True)
    assert decode_ops(old_entry) == [("abc", d.DeleteQueue("/", "q")), (None, d.ClusterJoin("n1", "h", 1, 1))]

    class Target:
        def __init__(self) -> None:
            self.applied: list[Any] = []
            self.changes = 0

        def apply_op(self, op: Any) -> None:
            self.applied.append(op)

        def state_ops(self) -> list[Any]:
            return [d.DeleteQueue("/", "q")]

        def reset_to(self, ops: list[Any]) -> None:
            self.applied = list(ops)

        def members_changed(self) -> None:
            self.changes += 1

    target = Target()
    machine = MetadataMachine(target, "abc")
    machine.apply(1, old_entry)  # its own incarnation's change is skipped; the member joins
    assert target.applied == [] and list(machine.members) == ["n1"] and target.changes == 1
    MetadataMachine(target, "other").apply(2, old_entry)
    assert target.applied == [d.DeleteQueue("/", "q")]
    restored = Target()
    MetadataMachine(restored, "x").restore(machine.snapshot())
    assert restored.applied == [d.DeleteQueue("/", "q")]
