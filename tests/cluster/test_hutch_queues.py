"""hutch-queues on a real 3-node cluster (issue 7, operations; docs/quorum-queues.md, "Operations"):
add_member / delete_member with the new member catching up, grow / shrink, rebalance, quorum_status,
mirroring policies refused, migrate_mirrored, and x-cancel-on-ha-failover when the leader is killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from tests.conftest import free_port

from hutch.core.policy import PolicyError, make_policy
from hutch.mgmt.quorum import plan_moves

from .nodes import Cluster, Node, eventually

QQ = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
MIRRORING_TEXT = "classic queue mirroring was removed; use quorum queues (x-queue-type: quorum)"


def hq(node: Node | int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run hutch-queues against a node's management port (or any port number)."""
    port = node if isinstance(node, int) else node.management_port
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--port", str(port), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def hq_json(node: Node, *args: str, code: int = 0) -> Any:
    out = hq(node, "--formatter", "json", *args)
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def refused(out: subprocess.CompletedProcess[str], text: str, code: int = 1) -> None:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert text in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def connect(node: Node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))


def queue_info(node: Node, name: str) -> dict[str, Any]:
    code, info = node.api("GET", f"/api/queues/%2F/{name}")
    assert code == 200, info
    return info


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path_factory.mktemp("hq"), 3)
    yield c
    c.stop()


# -- pure ---------------------------------------------------------------------------------------------


def test_plan_moves_evens_out_leaders() -> None:
    nodes = ["a", "b", "c"]
    leaders = {f"q{i}": "a" for i in range(6)} | {"solo": "a"}
    members = {f"q{i}": nodes for i in range(6)} | {"solo": ["a"]}
    moves = plan_moves(leaders, members, nodes)
    after = Counter({**leaders, **dict(moves)}.values())
    assert after == {"a": 3, "b": 2, "c": 2}  # 'solo' cannot move
    assert "solo" not in dict(moves) and len(moves) == 4
    assert plan_moves({"q": "a", "r": "b"}, {"q": nodes, "r": nodes}, nodes) == []


def test_mirroring_keys_refused_in_policies_and_operator_policies() -> None:
    for key, value in (("ha-mode", "all"), ("ha-params", 2), ("ha-sync-mode", "automatic"),
                       ("ha-promote-on-shutdown", "always")):
        for operator in (False, True):
            with pytest.raises(PolicyError) as info:
                make_policy("/", "p", ".*", {key: value, "max-length": 1}, operator=operator)
            assert MIRRORING_TEXT in str(info.value) and f'["{key}"]' in str(info.value)
            assert "hutch-queues migrate_mirrored" in str(info.value)


# -- membership -----------------------------------------------------------------------------------------


def test_add_member_catches_up_then_delete_member(cluster: Cluster) -> None:
    n1, n2, _n3 = cluster.nodes
    conn = connect(n1)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("grow-qq", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 2})
    members = queue_info(n1, "grow-qq")["members"]
    assert len(members) == 2
    third = next(n for n in cluster.nodes if n.full_name not in members)
    for i in range(20):
        ch.basic_publish("", "grow-qq", f"m{i}".encode(), PERSISTENT)

    out = hq(n2, "add_member", "grow-qq", third.name)  # a short node name names one member
    assert out.returncode == 0, out.stderr
    assert "Adding a replica for queue grow-qq" in out.stdout
    assert third.full_name in queue_info(n1, "grow-qq")["members"]

    def caught_up() -> dict[str, dict[str, Any]]:
        rows = {r["node"]: r for r in hq_json(third, "quorum_status", "grow-qq")}
        leader = next(r for r in rows.values() if r["role"] == "leader")
        new = rows[third.full_name]
        ok = (len(rows) == 3 and new["role"] == "follower" and new["membership"] == "voter"
              and new["caught_up"] and new["last_applied"] >= leader["commit_index"] > 20)
        return rows if ok else {}

    rows = eventually(caught_up, timeout=20)
    assert {r["online"] for r in rows.values()} == {True}
    table = hq(n1, "quorum_status", "grow-qq")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "Status of quorum queue grow-qq in vhost / ..."
    assert lines[1].split()[:4] == ["node", "role", "membership", "term"]
    assert len(lines) == 5 and sum(line.split()[1:2] == ["leader"] for line in lines) == 1

    # publishing and consuming go on, through the new member too
    c3 = connect(third)
    ch3 = c3.channel()
    ch3.confirm_delivery()
    ch3.basic_publish("", "grow-qq", b"after", PERSISTENT)
    bodies = []
    for method, _props, body in ch3.consume("grow-qq", inactivity_timeout=5):
        if method is None:
            break
        bodies.append(body)
        ch3.basic_ack(method.delivery_tag)
        if len(bodies) == 21:
            break
    ch3.cancel()
    assert bodies == [f"m{i}".encode() for i in range(20)] + [b"after"]
    c3.close()

    refused(hq(n1, "add_member", "grow-qq", third.full_name), "is already a member of queue 'grow-qq'")
    refused(hq(n1, "add_member", "grow-qq", "nope"), "node 'nope' is not a member of this cluster")
    refused(hq(n1, "add_member", "no-such-qq", third.name), "queue 'no-such-qq' in vhost '/' does not exist")
    ch.queue_declare("classic-q", durable=True)
    refused(hq(n1, "add_member", "classic-q", third.name), "is a classic queue, not a quorum queue")
    refused(hq(n1, "add_member", "grow-qq"), "the following arguments are required: NODE", code=2)
    refused(hq(free_port(), "quorum_status", "grow-qq"), "cannot reach node at http://127.0.0.1:", code=69)

    out = hq(n1, "delete_member", "grow-qq", third.full_name)
    assert out.returncode == 0, out.stderr
    assert sorted(queue_info(n2, "grow-qq")["members"]) == sorted(members)
    assert third.full_name not in {r["node"] for r in hq_json(n1, "quorum_status", "grow-qq")}
    refused(hq(n1, "delete_member", "grow-qq", third.name), "is not a member of queue 'grow-qq'")
    ch.basic_publish("", "grow-qq", b"still", PERSISTENT)
    conn.close()


def test_grow_and_shrink(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    conn = connect(n1)
    ch = conn.channel()
    for name in ("gs-1", "gs-2"):
        ch.queue_declare(name, durable=True, arguments={**QQ, "x-quorum-initial-group-size": 1})
        assert queue_info(n1, name)["members"] == [n1.full_name]
    conn.close()
    c3 = connect(n3)
    c3.channel().queue_declare("solo-3", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 1})
    c3.close()

    assert hq_json(n1, "grow", "n2", "even", "--queue-pattern", "^gs-") == []  # one member: odd
    rows = hq_json(n1, "grow", n2.full_name, "all", "--queue-pattern", "^gs-", "--vhost-pattern", "^/$")
    assert rows == [{"vhost": "/", "name": f"gs-{i}", "size": 2, "result": "ok"} for i in (1, 2)]
    out = hq(n2, "grow", "n3", "even", "--queue-pattern", "^gs-")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].split() == ["vhost", "name", "size", "result"]
    assert out.stdout.splitlines()[2].split() == ["/", "gs-1", "3", "ok"]
    for name in ("gs-1", "gs-2"):
        assert sorted(queue_info(n3, name)["members"]) == sorted(n.full_name for n in cluster.nodes)

    # shrink n3 everywhere: the queue it is the only member of is reported as failed (exit 1)
    rows = {r["name"]: r for r in hq_json(n2, "shrink", "n3", code=1)}
    assert rows["gs-1"]["result"] == rows["gs-2"]["result"] == "ok" and rows["gs-1"]["size"] == 2
    assert rows["solo-3"]["result"].startswith("error: cannot remove the last member of queue 'solo-3'")
    assert [r["name"] for r in hq_json(n2, "shrink", "n3", "--errors-only", code=1)] == ["solo-3"]
    for name in ("gs-1", "gs-2"):
        assert sorted(queue_info(n1, name)["members"]) == [n1.full_name, n2.full_name]


def test_rebalance_moves_leaders(cluster: Cluster) -> None:
    n1, n2, _n3 = cluster.nodes
    conn = connect(n1)
    ch = conn.channel()
    names = [f"rb-{i}" for i in range(6)]
    for name in names:
        ch.queue_declare(name, durable=True, arguments=QQ)  # client-local: n1 leads them all
    conn.close()

    def leaders() -> Counter[str]:
        return Counter(queue_info(n2, name)["leader"].split("@")[0] for name in names)

    assert eventually(lambda: leaders() == {"n1": 6}, timeout=10)
    doc = hq_json(n2, "rebalance", "quorum", "--queue-pattern", "^rb-")
    assert len(doc["moves"]) == 4 and {m["result"] for m in doc["moves"]} == {"ok"}
    assert {n["node"].split("@")[0]: (n["leaders_before"], n["leaders_after"]) for n in doc["nodes"]} == \
        {"n1": (6, 2), "n2": (0, 2), "n3": (0, 2)}
    assert eventually(lambda: leaders() == {"n1": 2, "n2": 2, "n3": 2}, timeout=10)
    out = hq(n1, "rebalance", "quorum", "--queue-pattern", "^rb-")
    assert out.returncode == 0, out.stderr
    assert "No leader needed to move" in out.stdout
    refused(hq(n1, "rebalance", "stream"), "invalid choice: 'stream'", code=2)


# -- mirroring is superseded --------------------------------------------------------------------------


def test_mirroring_policies_are_refused_everywhere(cluster: Cluster) -> None:
    n1, n2, _n3 = cluster.nodes
    refused(n1.ctl("set_policy", "ha-all", "^ha\\.", '{"ha-mode": "all"}'), MIRRORING_TEXT)
    code, doc = n2.api("PUT", "/api/policies/%2F/ha-two", {"pattern": ".*",
                                                           "definition": {"ha-mode": "exactly", "ha-params": 2}})
    assert code == 400 and MIRRORING_TEXT in doc["reason"] and "migrate_mirrored" in doc["reason"]
    code, doc = n2.api("PUT", "/api/operator-policies/%2F/ha-op", {"pattern": ".*",
                                                                   "definition": {"ha-promote-on-shutdown": "always"}})
    assert code == 400 and MIRRORING_TEXT in doc["reason"]
    code, doc = n1.api("POST", "/api/definitions", {"policies": [
        {"vhost": "/", "name": "ha-imp", "pattern": ".*", "definition": {"ha-sync-mode": "automatic"}}]})
    assert code == 400 and MIRRORING_TEXT in doc["reason"] and "ha-imp" in doc["reason"]
    assert n1.api("GET", "/api/policies/%2F")[1] == []
    assert n1.api("GET", "/api/operator-policies/%2F")[1] == []


def test_migrate_mirrored(cluster: Cluster) -> None:
    n1 = cluster[0]
    conn = connect(n1)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("mirr.empty", durable=True, arguments={"x-queue-mode": "lazy", "x-message-ttl": 60000})
    ch.queue_bind("mirr.empty", "amq.topic", "a.*")
    ch.queue_bind("mirr.empty", "amq.direct", "k")
    ch.queue_declare("mirr.full", durable=True)
    ch.basic_publish("", "mirr.full", b"keep me", PERSISTENT)
    ch.queue_declare("other.q", durable=True)

    def listed() -> list[list[Any]]:
        rows = hq_json(n1, "migrate_mirrored", "--pattern", "^mirr\\.")
        return [[r["name"], r["result"], r["detail"]] for r in rows]

    assert eventually(lambda: listed() == [["mirr.empty", "would migrate", "dropped x-queue-mode"],
                                           ["mirr.full", "skipped", "not empty (1 messages)"]], timeout=10)
    assert queue_info(n1, "mirr.empty")["type"] == "classic"  # a dry run changes nothing

    out = hq(n1, "migrate_mirrored", "--pattern", "^mirr\\.", "--apply")  # the home node: exact counts
    assert out.returncode == 0, out.stderr
    rows = [line.split()[:3] for line in out.stdout.splitlines()[2:]]
    assert rows == [["mirr.empty", "0", "0"], ["mirr.full", "1", "0"]]
    assert "migrated" in out.stdout and "2 bindings; dropped x-queue-mode" in out.stdout
    info = queue_info(n1, "mirr.empty")
    assert info["type"] == "quorum" and info["durable"] is True
    assert info["arguments"] == {"x-queue-type": "quorum", "x-message-ttl": 60000}
    code, bindings = n1.api("GET", "/api/queues/%2F/mirr.empty/bindings")
    assert {(b["source"], b["routing_key"]) for b in bindings} == {("", "mirr.empty"), ("amq.topic", "a.*"),
                                                                   ("amq.direct", "k")}
    ch.basic_publish("amq.topic", "a.b", b"routed", PERSISTENT, mandatory=True)
    got = eventually(lambda: ch.basic_get("mirr.empty", auto_ack=True)[2], timeout=10)
    assert got == b"routed"
    assert queue_info(n1, "mirr.full")["type"] == "classic"
    assert ch.queue_declare("mirr.full", passive=True).method.message_count == 1
    assert queue_info(n1, "other.q")["type"] == "classic"
    conn.close()


def test_cancel_on_ha_failover_for_a_consumer_on_a_node_that_is_not_a_member(cluster: Cluster) -> None:
    """The leader changes (here: the leader is removed from a queue of two members); a consumer with
    x-cancel-on-ha-failover on the third node, which has no replica to see that, is cancelled too."""
    n1 = cluster.nodes[0]
    c1 = connect(n1)
    c1.channel().queue_declare("outside-qq", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 2})
    members = queue_info(n1, "outside-qq")["members"]
    assert queue_info(n1, "outside-qq")["leader"] == n1.full_name
    outsider = next(n for n in cluster.nodes if n.full_name not in members)
    other = next(n for n in cluster.nodes if n.full_name in members and n is not n1)
    conn = connect(outsider)
    flagged_ch, plain_ch = conn.channel(), conn.channel()
    cancelled: list[str] = []
    got: list[bytes] = []
    flagged_ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    plain_ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    flagged = flagged_ch.basic_consume("outside-qq", lambda *a: None, arguments={"x-cancel-on-ha-failover": True})
    plain_ch.basic_consume("outside-qq", lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
    conn.process_data_events(0.5)
    out = hq(other, "delete_member", "outside-qq", "n1")
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 15
    while flagged not in cancelled and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert cancelled == [flagged]
    assert queue_info(other, "outside-qq")["leader"] == other.full_name
    ch1 = c1.channel()
    ch1.confirm_delivery()
    ch1.basic_publish("", "outside-qq", b"after the change", PERSISTENT)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert got == [b"after the change"] and cancelled == [flagged]
    conn.close()
    ch1.queue_delete("outside-qq")
    c1.close()


# -- failover (kills n1: keep last) -----------------------------------------------------------------


def test_cancel_on_ha_failover_and_membership_needs_a_quorum(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    c1 = connect(n1)
    ch1 = c1.channel()
    ch1.queue_declare("cancel-qq", durable=True, arguments=QQ)  # n1 leads
    ch1.queue_declare("pair-qq", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 2})
    pair = queue_info(n1, "pair-qq")["members"]
    outsider = next(n for n in cluster.nodes if n.full_name not in pair)
    c1.close()
    assert queue_info(n2, "cancel-qq")["leader"] == n1.full_name

    conn = connect(n2)  # n2 is a member of cancel-qq
    flagged_ch, plain_ch = conn.channel(), conn.channel()
    cancelled: list[str] = []
    got: list[bytes] = []
    flagged_ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    plain_ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    flagged = flagged_ch.basic_consume("cancel-qq", lambda *a: None, arguments={"x-cancel-on-ha-failover": True})
    plain = plain_ch.basic_consume("cancel-qq", lambda c, m, p, body: (got.append(body),
                                                                       c.basic_ack(m.delivery_tag)))
    conn.process_data_events(0.3)
    n1.kill()
    deadline = time.monotonic() + 15
    while flagged not in cancelled and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert cancelled == [flagged]  # the consumer without the argument stays

    c3 = connect(n3)
    ch3 = c3.channel()
    ch3.confirm_delivery()
    eventually(lambda: queue_info(n3, "cancel-qq")["leader"] not in (None, n1.full_name), timeout=15)
    ch3.basic_publish("", "cancel-qq", b"after failover", PERSISTENT)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert got == [b"after failover"] and cancelled == [flagged] and plain
    c3.close()
    conn.close()

    # pair-qq has lost one of its two members: no membership change without a quorum
    live = n2 if n2.full_name in pair else n3
    refused(hq(live, "add_member", "pair-qq", outsider.name), "a membership change needs a quorum (2)")
    refused(hq(live, "delete_member", "pair-qq", "n1"), "1 of 2 members running")
