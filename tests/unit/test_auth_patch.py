"""Users, vhosts, permissions and topic permissions replicated as changes (`PatchAuth`,
`PatchTopicPermissions`), not whole snapshots (`SetAuth`, `SetTopicPermissions`).

Before: every change recorded the node's whole auth store, and a member skips its own entries when they
commit, so two members changing different users at once ended with different stores (each applied the
other's snapshot, which lacked its own change). Now a change is recorded as the entries it added, changed
or removed, and a member applies its own `PatchAuth` again in the log's order: every member ends with
both changes, and with the later one where both changed the same entry.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster.metadata import MetadataMachine, encode_ops
from hutch.config import Config
from hutch.core.auth import AuthStore, auth_diff, auth_patch, hash_password
from hutch.core.definition_ops import PatchAuth, PatchTopicPermissions, SetAuth, from_stored, to_stored
from hutch.runtime.app import build_node
from hutch.runtime.broker.node import Node

NAMES = st.sampled_from(["a", "b", "c", "d"])
HASH = hash_password("pw", n=2**4)


@st.composite
def stores(draw: st.DrawFn) -> dict[str, Any]:
    store = AuthStore(scrypt_n=2**4)
    vhosts = draw(st.sets(NAMES, max_size=4))
    users = draw(st.sets(NAMES, max_size=4))
    for v in sorted(vhosts):
        store.add_vhost(v, description=draw(st.sampled_from(["", "x"])))
    for u in sorted(users):
        store.add_user(u, None, tags=draw(st.lists(st.sampled_from(["administrator", "monitoring"]), max_size=1)),
                       password_hash=HASH)
    for u in sorted(users):
        for v in sorted(vhosts):
            if draw(st.booleans()):
                store.set_permissions(u, v, draw(st.sampled_from([".*", "^a"])), ".*", ".*")
    return store.to_dict()


@settings(max_examples=200, deadline=None)
@given(stores(), stores())
def test_a_diff_applied_to_its_first_snapshot_gives_the_second(before: dict[str, Any], after: dict[str, Any]) -> None:
    changes = auth_diff(before, after)
    patched = auth_patch(before, changes)
    assert AuthStore.from_dict(patched).to_dict() == after
    assert auth_diff(after, after) == []
    # the stored form (the definitions log, the metadata group) gives the same record back
    assert from_stored(to_stored(PatchAuth(changes))) == PatchAuth(changes)


@settings(max_examples=100, deadline=None)  # `make test`; the 200 of the long run below are in the slow set
@given(stores(), stores(), stores())
def test_changes_made_on_two_members_from_one_store_both_survive_in_either_order(
        base: dict[str, Any], mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Two members start from `base`; one moves to `mine`, the other to `theirs`. Applied in either order,
    an entry only one of them changed has that change, and every result is a valid store."""
    a, b = auth_diff(base, mine), auth_diff(base, theirs)
    for first, second in ((a, b), (b, a)):
        result = AuthStore.from_dict(auth_patch(auth_patch(base, first), second)).to_dict()
        keys_b = {(c[0], tuple(c[1])) for c in second}
        for section, key, entry in first:
            if (section, tuple(key)) in keys_b:
                continue  # both changed it: the later one wins
            listed = [e for e in result[section]
                      if (tuple((e["user"], e["vhost"])) if section == "permissions" else (e["name"],)) == tuple(key)]
            if entry is None:
                assert listed == []
            elif section != "permissions" or (key[0] in {u["name"] for u in result["users"]}
                                              and key[1] in {v["name"] for v in result["vhosts"]}):
                assert listed == [entry]  # (a permission stays only while its user and vhost do)


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 200 examples
@settings(max_examples=200, deadline=None)
@given(stores(), stores(), stores())
def test_changes_made_on_two_members_from_one_store_both_survive_in_either_order_long(
        base: dict[str, Any], mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    test_changes_made_on_two_members_from_one_store_both_survive_in_either_order.hypothesis.inner_test(base, mine, theirs)


def test_a_permission_of_a_user_deleted_meanwhile_is_left_out() -> None:
    store = AuthStore(scrypt_n=2**4)
    store.add_vhost("v")
    store.add_user("u", None, password_hash=HASH)
    base = store.to_dict()
    granted = auth_diff(base, {**base, "permissions": [{"user": "u", "vhost": "v", "configure": ".*", "write": ".*",
                                                         "read": ".*"}]})
    deleted = auth_diff(base, {**base, "users": []})
    result = auth_patch(auth_patch(base, deleted), granted)
    assert result["users"] == [] and result["permissions"] == []
    assert AuthStore.from_dict(result).to_dict() == result


@pytest.mark.parametrize("change", [["users", ["u"]], ["roles", ["u"], None], ["users", "u", None],
                                    ["users", ["u"], {"name": "other"}], ["users", ["u"], "x"], "x"])
def test_a_malformed_change_is_refused(change: Any) -> None:
    with pytest.raises(ValueError, match="malformed auth change"):
        auth_patch({"users": [], "vhosts": [], "permissions": []}, [change])


def _node(name: str) -> Node:
    return build_node(Config(data_dir="", node_name=f"{name}@localhost"), monitor_resources=False)


def _recorded(node: Node) -> list[Any]:
    recorded: list[Any] = []
    node._record = recorded.append  # type: ignore[method-assign]  # what the node would replicate
    return recorded


def test_two_members_adding_different_users_at_once_both_keep_both() -> None:
    a, b = _node("a"), _node("b")
    b.apply_op(SetAuth(a.auth.to_dict()))  # one cluster: b joined a (the snapshot)
    rec_a, rec_b = _recorded(a), _recorded(b)
    a.auth.add_user("alice", "pw-a")
    a.permissions_changed()
    b.auth.add_user("bob", "pw-b")
    b.auth.set_permissions("bob", "/", ".*", ".*", ".*")
    b.permissions_changed()
    assert [type(op) for op in rec_a + rec_b] == [PatchAuth, PatchAuth]
    log = [rec_a[0], rec_b[0]]  # the order the metadata group committed them in
    for node in (a, b):
        for op in log:
            node.apply_op(op)
    for node in (a, b):
        assert {u.name for u in node.auth.list_users()} == {"guest", "alice", "bob"}
        assert node.auth.get_permissions("bob", "/") is not None
    assert a.auth.to_dict() == b.auth.to_dict()


def test_two_members_changing_one_user_at_once_end_with_the_later_change_on_both() -> None:
    """Each member re-applies its own PatchAuth in the log's order (MetadataMachine), so a user both
    changed ends with the same tags on both: the entry committed last."""
    a, b = _node("a"), _node("b")
    rec_a, rec_b = _recorded(a), _recorded(b)
    a.auth.set_user_tags("guest", ["monitoring"])
    a.permissions_changed()
    b.auth.set_user_tags("guest", ["management"])
    b.permissions_changed()
    entry = encode_ops([rec_a[0], rec_b[0]], "a-incarnation")
    machines = [MetadataMachine(a, "a-incarnation"), MetadataMachine(b, "b-incarnation")]
    for machine in machines:
        machine.apply(1, entry)
    assert a.auth.get_user("guest").tags == b.auth.get_user("guest").tags == ["management"]


def test_a_whole_snapshot_is_still_applied_and_is_the_base_of_the_next_change() -> None:
    a = _node("a")
    rec = _recorded(a)
    other = AuthStore(scrypt_n=2**4)
    other.add_vhost("/")
    other.add_user("imported", None, password_hash=HASH)
    a.apply_op(SetAuth(other.to_dict()))  # a snapshot (metadata group, older logs)
    assert [u.name for u in a.auth.list_users()] == ["imported"]
    a.auth.add_user("later", "pw")
    a.permissions_changed()
    assert rec == [PatchAuth([["users", ["later"], a.auth.to_dict()["users"][1]]])]


def test_topic_permissions_set_on_two_members_at_once_both_survive() -> None:
    """Topic permissions are recorded as the rows a change set or removed (PatchTopicPermissions), so a
    row set on each of two members at once is on both afterwards, and a removal removes only its row."""
    a, b = _node("a"), _node("b")
    rec_a, rec_b = _recorded(a), _recorded(b)
    for node in (a, b):
        node.topic_permissions[("/", "guest")] = {"amq.topic": ("^old", ".*")}
        node._topic_doc = node._topic_rows()  # both start from one committed table
    a.topic_permissions[("/", "guest")]["x.a"] = ("^a", ".*")
    a.topic_permissions_changed()
    del b.topic_permissions[("/", "guest")]["amq.topic"]
    b.topic_permissions[("/", "guest")]["x.b"] = ("^b", "^b")
    b.topic_permissions_changed()
    assert rec_a == [PatchTopicPermissions([["/", "guest", "x.a", "^a", ".*"]])]
    assert rec_b == [PatchTopicPermissions([["/", "guest", "x.b", "^b", "^b"], ["/", "guest", "amq.topic"]])]
    entry = encode_ops([rec_a[0], rec_b[0]], "a-incarnation")
    for machine in (MetadataMachine(a, "a-incarnation"), MetadataMachine(b, "b-incarnation")):
        machine.apply(1, entry)
    for node in (a, b):
        assert node.topic_permissions == {("/", "guest"): {"x.a": ("^a", ".*"), "x.b": ("^b", "^b")}}


@pytest.mark.parametrize("change", [["/", "guest"], ["/", "guest", "x", "^a"], ["/", "guest", "x", 1, "."], "x"])
def test_a_malformed_topic_permission_change_is_refused(change: Any) -> None:
    with pytest.raises(ValueError, match="malformed topic permission change"):
        _node("a").apply_op(PatchTopicPermissions([change]))
