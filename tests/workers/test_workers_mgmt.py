"""One node's management view over every worker of a node of 2 (`hutch-server --workers 2`): the HTTP
API and hutchctl list the connections, channels and consumers of both workers as one node's, and close a
connection that lives in the other worker than the management listener's (worker 0).

Connections are pinned to a worker through `workers.own_ports` (tests/workers/test_workers.py's
`connect`). Waits poll with generous deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker
from tests.conftest import ServerInfo
from tests.mgmt.helpers import Api, run_ctl

from hutch import portfile

from .test_hop_semantics import declare_in
from .test_workers import start_node, until, worker_pid

NODE = "test@localhost"  # tests/conftest.py's node name: the one name the API shows, never `#w<N>`


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_node(tmp_path_factory.mktemp("workers_mgmt"))
    yield info
    info.stop()


def pinned(info: ServerInfo, worker: int, name: str) -> pika.BlockingConnection:
    ports = portfile.read(info.data_dir)
    assert ports is not None
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["listeners"][f"amqp_w{worker}"], client_properties={"connection_name": name}))


def by_name(rows: list[dict[str, Any]], wanted: set[str]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("user_provided_name") in wanted]


def test_connections_channels_consumers_of_both_workers_in_the_api_and_hutchctl(node: ServerInfo) -> None:
    api = Api(node.mgmt_url)
    conns = {w: pinned(node, w, f"gather-w{w}") for w in (0, 1)}
    try:
        for w, conn in conns.items():
            ch = conn.channel()
            queue = ch.queue_declare(f"gather-q{w}", exclusive=True).method.queue
            ch.basic_consume(queue, lambda *_: None, consumer_tag=f"gather-c{w}")
        names = {"gather-w0", "gather-w1"}

        listed = until(lambda: len(by_name(api.get("/api/connections").body, names)) == 2
                       and by_name(api.get("/api/connections").body, names), what="both workers' connections")
        assert {r["node"] for r in listed} == {NODE}
        conn_names = {r["name"] for r in listed}

        channels = [c for c in api.get("/api/channels").body if c["connection_details"]["name"] in conn_names]
        assert len(channels) == 2 and {c["node"] for c in channels} == {NODE}
        one = api.get(f"/api/channels/{quote(channels[1]['name'], safe='')}")
        assert one.status == 200 and one.body["name"] == channels[1]["name"]
        assert len(one.body["consumer_details"]) == 1

        consumers = [c for c in api.get("/api/consumers").body if c["consumer_tag"].startswith("gather-c")]
        assert sorted(c["consumer_tag"] for c in consumers) == ["gather-c0", "gather-c1"]
        assert {c["channel_details"]["node"] for c in consumers} == {NODE}

        totals = api.get("/api/overview").body["object_totals"]
        assert totals["connections"] >= 2 and totals["channels"] >= 2
        # a queue's consumers are counted where it is listed: worker 0's stand-in of a queue in worker 1
        # has its home's figures, pushed every second
        until(lambda: api.get("/api/overview").body["object_totals"]["consumers"] >= 2, what="both consumers")

        proc = run_ctl(node, "--formatter", "json", "list_connections", "name", "node")
        assert proc.returncode == 0, proc.stderr
        rows = [r for r in json.loads(proc.stdout) if r["name"] in conn_names]
        assert len(rows) == 2 and {r["node"] for r in rows} == {NODE}
        proc = run_ctl(node, "--formatter", "json", "list_consumers")
        assert proc.returncode == 0, proc.stderr
        tags = {r["consumer_tag"] for r in json.loads(proc.stdout)}
        assert {"gather-c0", "gather-c1"} <= tags
    finally:
        for conn in conns.values():
            if conn.is_open:
                conn.close()


def test_closing_a_connection_of_the_other_worker_from_the_api(node: ServerInfo) -> None:
    api = Api(node.mgmt_url)
    conn = pinned(node, 1, "gather-close-w1")
    try:
        row = until(lambda: by_name(api.get("/api/connections").body, {"gather-close-w1"}),
                    what="the connection in worker 1")[0]
        reply = api.call("DELETE", f"/api/connections/{quote(row['name'], safe='')}",
                         headers={"X-Reason": "closed by the test"})
        assert reply.status == 204
        with pytest.raises(ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
            conn.channel()
        assert closed.value.reply_code == 320
        assert "closed by the test" in closed.value.reply_text
        until(lambda: not by_name(api.get("/api/connections").body, {"gather-close-w1"}),
              what="the closed connection gone from the list")
    finally:
        if conn.is_open:
            conn.close()


def test_a_missing_connection_is_404_on_every_worker(node: ServerInfo) -> None:
    reply = Api(node.mgmt_url).call("DELETE", "/api/connections/" + quote("127.0.0.1:1 -> 127.0.0.1:2", safe=""))
    assert reply.status == 404


def test_deleting_a_user_closes_its_connection_in_the_other_worker(node: ServerInfo) -> None:
    api = Api(node.mgmt_url)
    assert api.put("/api/users/gather-bob", {"password": "pw", "tags": ""}).status in (201, 204)
    assert api.put("/api/permissions/%2F/gather-bob", {"configure": ".*", "write": ".*", "read": ".*"}).status \
        in (201, 204)
    ports = portfile.read(node.data_dir)
    assert ports is not None
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["listeners"]["amqp_w1"], credentials=pika.PlainCredentials("gather-bob", "pw")))
    try:
        assert api.call("DELETE", "/api/users/gather-bob").status == 204
        with pytest.raises(ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
            conn.channel()
        assert closed.value.reply_code == 320 and "gather-bob" in closed.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def metrics(info: ServerInfo, path: str = "/metrics") -> str:
    """A Prometheus body (with guest's login: /metrics/per-object needs a monitoring user)."""
    login = base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(info.mgmt_url + path, headers={"Authorization": f"Basic {login}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        text: str = reply.read().decode()
        return text


def test_one_node_name_to_everyone_outside(node: ServerInfo) -> None:
    """The overview, its listeners and contexts, /api/nodes, a vhost's cluster_state, hutchctl status,
    /metrics and the AMQP server properties of either worker name the node, never `<node>#w<N>`."""
    api = Api(node.mgmt_url)
    overview = api.ok("/api/overview")
    assert overview["node"] == NODE and overview["cluster_name"] == NODE
    assert {entry["node"] for entry in overview["listeners"] + overview["contexts"]} == {NODE}
    assert [n["name"] for n in api.ok("/api/nodes")] == [NODE]  # the workers are not nodes
    assert api.ok(f"/api/nodes/{quote(NODE, safe='')}")["running"] is True
    assert api.get(f"/api/nodes/{quote(NODE + '#w1', safe='')}").status == 404
    assert api.ok("/api/vhosts/%2F")["cluster_state"] == {NODE: "running"}
    proc = run_ctl(node, "status")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Status of node {NODE} ...\nNode: {NODE}\n")
    assert f'rabbitmq_node="{NODE}"' in metrics(node)
    for w in (0, 1):
        conn = pinned(node, w, f"name-w{w}")
        try:
            assert conn._impl.server_properties["cluster_name"] == NODE
        finally:
            conn.close()


def sample(text: str, family: str) -> float:
    """The value of an unlabelled sample of `family` in a Prometheus text body."""
    for line in text.splitlines():
        if line.startswith(family + " "):
            return float(line.split()[1])
    raise AssertionError(f"no sample of {family}")


def test_metrics_count_the_connections_and_channels_of_both_workers(node: ServerInfo) -> None:
    """/metrics is the node's: the connection, channel and consumer families and the global counters
    sum every worker's (the management agent's `metric_samples`), not worker 0's alone."""
    conns = {w: pinned(node, w, f"metrics-w{w}") for w in (0, 1)}
    try:
        for w, conn in conns.items():
            ch = conn.channel()
            queue = ch.queue_declare(f"metrics-q{w}", exclusive=True).method.queue
            ch.basic_publish("", queue, b"counted")
            ch.basic_consume(queue, lambda *_: None, consumer_tag=f"metrics-c{w}")

        def both_consumers() -> str | None:
            text = metrics(node)
            return text if sample(text, "rabbitmq_channel_consumers") >= 2 else None

        text = until(both_consumers, what="both workers' consumers in /metrics")
        assert sample(text, "rabbitmq_connections") >= 2 and sample(text, "rabbitmq_channels") >= 2
        assert sample(text, "rabbitmq_connection_channels") >= 2
        assert sample(text, "rabbitmq_channel_messages_published_total") >= 2
        # per object: each connection of either worker is a sample of its own (label `channel`, sic)
        rows = by_name(Api(node.mgmt_url).get("/api/connections").body, {"metrics-w0", "metrics-w1"})
        assert len(rows) == 2
        per_object = metrics(node, "/metrics/per-object")
        for row in rows:
            assert f'rabbitmq_connection_incoming_bytes_total{{channel="{row["name"]}"}}' in per_object
    finally:
        for conn in conns.values():
            if conn.is_open:
                conn.close()


def test_deleting_a_vhost_closes_its_connection_in_the_other_worker(node: ServerInfo) -> None:
    """The vhost is deleted through worker 0's API; worker 1 applies the replicated deletion and closes
    its connection to the vhost with 320, as RabbitMQ closes them on every node."""
    api = Api(node.mgmt_url)
    assert api.put("/api/vhosts/gather-vh").status == 201
    ports = portfile.read(node.data_dir)
    assert ports is not None
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["listeners"]["amqp_w1"], virtual_host="gather-vh"))
    try:
        assert api.call("DELETE", "/api/vhosts/gather-vh").status == 204
        with pytest.raises(ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
            conn.channel()
        assert closed.value.reply_code == 320
    finally:
        if conn.is_open:
            conn.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_nodes_figures_are_the_nodes_summed_over_the_workers(node: ServerInfo) -> None:
    """/api/nodes' process figures are the node's (every worker's, summed by the management agent's
    `process_figures`), not worker 0's: three connections pinned to worker 1 are the node's sockets, and
    its memory is at least both workers' resident memory (less a margin for what a worker frees)."""
    conns = [pinned(node, 1, f"figures-w1-{i}") for i in range(3)]
    try:
        api = Api(node.mgmt_url)
        info = until(lambda: (n := api.ok(f"/api/nodes/{quote(NODE, safe='')}"))["sockets_used"] >= 3 and n,
                     what="worker 1's sockets in /api/nodes")
        pids = [until(lambda w=w: worker_pid(node, w), what=f"worker {w}'s pid") for w in (0, 1)]
        both = 0.8 * sum(rss_bytes(pid) for pid in pids)
        assert info["mem_used"] >= both
        assert info["proc_used"] >= 2  # each worker's threads
        # the node's process is the supervisor (which outlives a restarted worker), not worker 0
        assert info["os_pid"] == str(node.proc.pid) and info["uptime"] > 0
        listed = api.ok("/api/nodes")
        assert len(listed) == 1 and listed[0]["sockets_used"] >= 3
        assert sample(metrics(node), "rabbitmq_process_resident_memory_bytes") >= both
    finally:
        for conn in conns:
            conn.close()


def test_a_node_of_workers_refuses_a_join_it_cannot_make_before_restarting_anything(node: ServerInfo) -> None:
    """`hutchctl join_cluster` (POST /api/cluster-join) on a node of workers restarts its workers joining
    (tests/cluster/test_workers_cluster.py); what cannot work is refused first, in one line, and the
    workers stay up: a malformed seed, and the node's own name."""
    api = Api(node.mgmt_url)
    reply = api.call("POST", "/api/cluster-join", {"node": "no-port"})
    assert reply.status == 400 and "expected NODE@HOST:PORT" in reply.body["reason"]
    own = api.call("GET", "/api/overview").body["node"]
    reply = api.call("POST", "/api/cluster-join", {"node": f"{own}@127.0.0.1:1"})
    assert reply.status == 400 and "this node's own name" in reply.body["reason"]
    assert api.call("GET", "/api/overview").status == 200


def test_an_import_is_in_every_worker_when_it_is_answered(node: ServerInfo) -> None:
    """POST /api/definitions (through worker 0's API) answers once every worker applied the import: a
    user it created logs in through worker 1 at once (it answered before worker 1 had it, once)."""
    api = Api(node.mgmt_url)
    doc = {"users": [{"name": "imported-w1", "password": "pw-w1", "tags": ""}],
           "permissions": [{"user": "imported-w1", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
    assert api.call("POST", "/api/definitions", doc).status == 204
    ports = portfile.read(node.data_dir)
    assert ports is not None
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["listeners"]["amqp_w1"], credentials=pika.PlainCredentials("imported-w1", "pw-w1")))
    conn.close()
    assert api.delete("/api/users/imported-w1").status == 204


def test_a_queue_of_the_other_worker_through_the_api_publish_and_details(node: ServerInfo) -> None:
    """A queue homed in worker 1 (exclusive to a connection there): a message published through worker 0's
    API is in it when the API answers (the publish waits for the home's confirm), and the queue's details
    are its home's figures at once, not the stand-in's as last pushed."""
    conn = pinned(node, 1, "details-w1")
    try:
        queue = conn.channel().queue_declare("details-q", exclusive=True).method.queue
        api = Api(node.mgmt_url)
        for _ in range(3):
            reply = api.call("POST", "/api/exchanges/%2F/amq.default/publish",
                             {"routing_key": queue, "payload": "m", "payload_encoding": "string", "properties": {}})
            assert reply.status == 200 and reply.body == {"routed": True}
        details = api.ok(f"/api/queues/%2F/{queue}")
        assert (details["messages"], details["worker"], details["node"]) == (3, 1, NODE)
    finally:
        conn.close()


@pytest.mark.parametrize("home", [0, 1])
def test_api_get_of_a_queue_in_either_worker_takes_and_settles_its_messages(node: ServerInfo, home: int) -> None:
    """POST /api/queues/.../get answered by worker 0 for a queue in worker 0 or 1: the messages come back in
    order, and reject_requeue_false dead-letters them at the queue's home (the CI run that found it: the
    get of a queue in the other worker answered [] and nothing was dead-lettered)."""
    api = Api(node.mgmt_url)
    with pinned(node, 0, f"api-get-{home}") as conn:
        ch = conn.channel()
        dead = ch.queue_declare(f"api-get-dead-{home}").method.queue
        q = declare_in(node, ch, f"api-get-{home}", home,
                       arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        for i in range(3):
            ch.basic_publish("", q, b"m%d" % i)
        until(lambda: api.get(f"/api/queues/%2F/{q}").body.get("messages") == 3, what="3 messages in the queue")
        got = api.call("POST", f"/api/queues/%2F/{q}/get",
                       {"count": 2, "ackmode": "reject_requeue_false", "encoding": "auto"})
        assert got.status == 200, got.body
        assert [m["payload"] for m in got.body] == ["m0", "m1"]
        until(lambda: api.get(f"/api/queues/%2F/{dead}").body.get("messages") == 2, what="2 dead letters")
        until(lambda: api.get(f"/api/queues/%2F/{q}").body.get("messages") == 1, what="1 message left")
        ch.queue_delete(q)
        ch.queue_delete(dead)


@pytest.mark.parametrize("home", [0, 1])
def test_api_delete_if_empty_and_if_unused_judge_the_homes_counts_now(node: ServerInfo, home: int) -> None:
    """DELETE /api/queues/...?if-empty=true (and ?if-unused=true) right after a publish (or a consume) to a
    queue in either worker: refused on the home's counts at that moment, not on the ones last pushed to
    worker 0 (the CI run that found it: a queue in worker 1 with 3 messages deleted as empty)."""
    api = Api(node.mgmt_url)
    with pinned(node, 0, f"api-del-{home}") as conn:
        ch = conn.channel()
        q = declare_in(node, ch, f"api-del-{home}", home)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"x")
        not_empty = api.call("DELETE", f"/api/queues/%2F/{q}?if-empty=true")
        assert (not_empty.status, not_empty.body["reason"]) == (400, f"queue '{q}' in vhost '/' is not empty")
        ch.basic_consume(q, lambda *a: None)
        in_use = api.call("DELETE", f"/api/queues/%2F/{q}?if-unused=true")
        assert (in_use.status, in_use.body["reason"]) == (400, f"queue '{q}' in vhost '/' in use")
        ch.queue_delete(q)


@pytest.mark.parametrize("home", [0, 1])
def test_api_purge_of_a_queue_in_either_worker_empties_it_at_its_home(node: ServerInfo, home: int) -> None:
    """DELETE /api/queues/.../contents answered by worker 0 for a queue in worker 0 or 1 empties the queue
    at its home (the CI run that found it: test_queue_lifecycle purged a queue in worker 1 and it kept its 3
    messages: worker 0's stand-in was asked and nothing reached the home)."""
    api = Api(node.mgmt_url)
    with pinned(node, 0, f"api-purge-{home}") as conn:
        ch = conn.channel()
        q = declare_in(node, ch, f"api-purge-{home}", home)
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", q, b"x")
        assert api.call("DELETE", f"/api/queues/%2F/{q}/contents").status == 204
        assert api.ok(f"/api/queues/%2F/{q}")["messages"] == 0
        assert ch.basic_get(q, auto_ack=True) == (None, None, None)
        ch.queue_delete(q)


@pytest.mark.parametrize("durable", [False, True])
def test_messages_delayed_counts_what_every_worker_holds_once(node: ServerInfo, durable: bool) -> None:
    """GET /api/exchanges (worker 0) of an x-delayed-message exchange counts the messages held in the
    worker that took each publish (a transient exchange: in that worker's own heap) or in the exchange's
    replica (a durable one: a quorum queue with a member in every worker, counted once, not per worker)."""
    api = Api(node.mgmt_url)
    x = f"delayed-{'d' if durable else 't'}"
    with pinned(node, 0, f"{x}-w0") as c0, pinned(node, 1, f"{x}-w1") as c1:
        ch0, ch1 = c0.channel(), c1.channel()
        ch0.exchange_declare(x, "x-delayed-message", durable=durable, arguments={"x-delayed-type": "direct"})
        q = ch0.queue_declare(f"{x}-q").method.queue
        ch0.queue_bind(q, x, "k")
        for ch, n in ((ch0, 2), (ch1, 3)):
            ch.confirm_delivery()
            for _ in range(n):
                ch.basic_publish(x, "k", b"later", pika.BasicProperties(headers={"x-delay": 600_000}))
        path = f"/api/exchanges/%2F/{x}"
        until(lambda: api.ok(path)["messages_delayed"] == 5, what="5 messages delayed")
        assert [e["messages_delayed"] for e in api.ok("/api/exchanges/%2F") if e["name"] == x] == [5]
        ch0.exchange_delete(x)
        ch0.queue_delete(q)
