"""The management HTTP API against a real node: status codes, JSON fields, auth and tags, %2F vhosts.

Tests that change users, vhosts or permissions use `clean_api` (their own node); the rest share the
session node and use unique names.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pika
import pika.exceptions
import pytest
from tests.conftest import TEST_WORKERS_ENV

from .helpers import Api, connect, seg, unique, wait_for

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def add_user(api: Api, name: str, tags: str = "", vhost: str | None = None, perms: str = ".*") -> Api:
    assert api.put(f"/api/users/{seg(name)}", {"password": "pw-" + name, "tags": tags}).status == 201
    if vhost is not None:
        body = {"configure": perms, "write": perms, "read": perms}
        assert api.put(f"/api/permissions/{seg(vhost)}/{seg(name)}", body).status == 201
    return api.as_user(name, "pw-" + name)


# -- authentication and tags ------------------------------------------------------------------------


def test_authentication_and_tags(clean_api: Api):
    api = clean_api
    anonymous = api.get("/api/overview", auth=False)
    assert anonymous.status == 401
    assert anonymous.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert anonymous.body == {"error": "not_authorized", "reason": "Not_Authorized"}
    assert api.as_user("guest", "wrong").get("/api/overview").status == 401
    assert api.get("/api/overview", auth=False, headers={"Authorization": "Basic !!!"}).status == 401

    nobody = add_user(api, "nobody")
    reply = nobody.get("/api/whoami")
    assert (reply.status, reply.body) == (401, {"error": "not_authorised", "reason": "Not management user"})

    manager = add_user(api, "manager", "management")
    assert manager.ok("/api/whoami") == {"name": "manager", "tags": ["management"]}
    assert manager.get("/api/users").body == {"error": "not_authorised", "reason": "Not administrator user"}
    assert manager.get("/api/nodes").body == {"error": "not_authorised", "reason": "Not monitor user"}
    assert manager.get("/api/overview").status == 200

    monitor = add_user(api, "monitor", "monitoring")
    assert monitor.ok("/api/nodes")[0]["running"] is True
    assert monitor.get("/api/users").status == 401
    assert monitor.get("/api/permissions").status == 401

    # unknown paths are 404 before any authentication, like RabbitMQ
    assert api.get("/api/no-such-thing", auth=False).body == NOT_FOUND
    assert api.call("POST", "/api/overview").status == 405


def test_vhost_visibility_by_tag(clean_api: Api):
    api = clean_api
    assert api.put("/api/vhosts/team").status == 201
    assert api.put("/api/queues/team/tq").status == 201
    assert api.put("/api/queues/%2F/rootq").status == 201
    manager = add_user(api, "teamer", "management", vhost="team")
    monitor = add_user(api, "watcher", "monitoring")

    assert [v["name"] for v in manager.ok("/api/vhosts")] == ["team"]
    assert [q["name"] for q in manager.ok("/api/queues")] == ["tq"]
    refused = manager.get("/api/queues/%2F")
    assert (refused.status, refused.body["reason"]) == (401, "User not authorised to access virtual host")
    assert manager.get("/api/queues/%2F/rootq").status == 401
    assert manager.get("/api/queues/nowhere").status == 404
    assert manager.ok("/api/overview")["object_totals"]["queues"] == 1

    assert [v["name"] for v in monitor.ok("/api/vhosts")] == ["/", "team"]
    assert sorted(q["name"] for q in monitor.ok("/api/queues")) == ["rootq", "tq"]
    assert monitor.ok("/api/overview")["object_totals"]["queues"] == 2
    # monitoring reads but cannot change: it has no AMQP permissions on "team"
    assert monitor.put("/api/queues/team/other").body == {"error": "not_authorised",
                                                          "reason": "User not authorised to access virtual host"}


# -- users, vhosts, permissions ---------------------------------------------------------------------


def test_users(clean_mgmt, clean_api: Api):
    api = clean_api
    assert api.put("/api/users/alice", {"password": "a", "tags": "administrator,monitoring"}).status == 201
    user = api.ok("/api/users/alice")
    assert user["name"] == "alice" and user["tags"] == ["administrator", "monitoring"]
    assert user["password_hash"].startswith("scrypt$") and user["limits"] == {}
    assert api.put("/api/users/alice", {"password": "b", "tags": ["management"]}).status == 204
    assert api.ok("/api/users/alice")["tags"] == ["management"]
    assert api.as_user("alice", "b").get("/api/whoami").status == 200
    assert api.as_user("alice", "a").get("/api/whoami").status == 401

    # importing a hash: bob gets alice's password
    assert api.put("/api/users/bob", {"password_hash": api.ok("/api/users/alice")["password_hash"],
                                      "tags": "management"}).status == 201
    assert api.as_user("bob", "b").get("/api/whoami").status == 200
    # neither password nor hash: no password login any more (RabbitMQ's rule)
    assert api.put("/api/users/bob", {"tags": "management"}).status == 204
    assert api.ok("/api/users/bob")["password_hash"] == ""
    assert api.as_user("bob", "b").get("/api/whoami").status == 401

    both = api.put("/api/users/carol", {"password": "x", "password_hash": "y"})
    assert (both.status, both.body["error"]) == (400, "bad_request")
    assert api.put("/api/users/carol", {"password_hash": "not-a-hash"}).status == 400
    assert api.put("/api/users/carol", {"password": "x", "tags": 5}).status == 400
    bad_json = api.call("PUT", "/api/users/carol", raw=b"{nope")
    assert (bad_json.status, bad_json.body) == (400, {"error": "bad_request", "reason": "not_json"})
    assert [u["name"] for u in api.ok("/api/users")] == ["alice", "bob", "guest"]

    # deleting a user closes its connections
    api.put("/api/permissions/%2F/alice", {"configure": ".*", "write": ".*", "read": ".*"})
    conn = connect(clean_mgmt.amqp_port, "alice", "b")
    assert api.delete("/api/users/alice").status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(time_limit=5)
        conn.channel()
    assert info.value.reply_code == 320
    assert api.delete("/api/users/alice").body == NOT_FOUND
    assert api.get("/api/users/alice").status == 404
    assert api.ok("/api/permissions") == [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
                                          "read": ".*"}]


def test_vhosts_and_url_encoding(clean_mgmt, clean_api: Api):
    api = clean_api
    root = api.ok("/api/vhosts/%2F")
    assert root["name"] == "/" and root["description"] == "Default virtual host"
    assert root["cluster_state"] == {"test@localhost": "running"} and root["messages"] == 0
    assert api.ok("/api/vhosts/%2f")["name"] == "/"  # lower-case escape too

    assert api.put("/api/vhosts/a%2Fb", {"description": "slashy", "tags": "x,y"}).status == 201
    assert api.put("/api/vhosts/a%2Fb", {"description": "again", "tags": ["z"]}).status == 204
    v = api.ok("/api/vhosts/a%2Fb")
    assert (v["name"], v["description"], v["tags"], v["default_queue_type"]) == ("a/b", "again", ["z"], "classic")
    assert api.put("/api/vhosts/q", {"default_queue_type": "stream"}).status == 400
    quorum = api.put("/api/vhosts/q", {"default_queue_type": "quorum"})
    if os.environ.get(TEST_WORKERS_ENV):  # a node of workers is their cluster: its quorum members are workers
        assert quorum.status == 201 and api.delete("/api/vhosts/q").status == 204
    else:  # this node is not clustered
        assert quorum.status == 400 and "quorum queues need a clustered node" in quorum.body["reason"]
    assert [v["name"] for v in api.ok("/api/vhosts")] == ["/", "a/b"]

    # the creator of a vhost gets full permissions on it (RabbitMQ does the same); without a
    # permission entry even an administrator cannot declare a queue there over HTTP
    assert api.ok("/api/vhosts/a%2Fb/permissions") == [{"user": "guest", "vhost": "a/b", "configure": ".*",
                                                        "write": ".*", "read": ".*"}]
    assert api.delete("/api/permissions/a%2Fb/guest").status == 204
    assert api.put("/api/queues/a%2Fb/q1").body == {"error": "not_authorised", "reason": "Access refused."}
    assert api.put("/api/permissions/a%2Fb/guest", {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    assert api.put("/api/queues/a%2Fb/q1").status == 201
    assert api.ok("/api/queues/a%2Fb/q1")["vhost"] == "a/b"
    conn = connect(clean_mgmt.amqp_port, vhost="a/b")
    assert api.delete("/api/vhosts/a%2Fb").status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(time_limit=5)
    assert info.value.reply_code == 320
    assert api.get("/api/vhosts/a%2Fb").body == NOT_FOUND
    assert api.delete("/api/vhosts/a%2Fb").status == 404
    assert api.get("/api/queues/a%2Fb").status == 404


def test_permissions(clean_api: Api):
    api = clean_api
    api.put("/api/users/pat", {"password": "p", "tags": ""})
    body = {"configure": "^pat-", "write": ".*", "read": ""}
    assert api.put("/api/permissions/%2F/pat", body).status == 201
    assert api.put("/api/permissions/%2F/pat", body).status == 204
    assert api.ok("/api/permissions/%2F/pat") == {"user": "pat", "vhost": "/", **body}
    assert [p["user"] for p in api.ok("/api/vhosts/%2F/permissions")] == ["guest", "pat"]
    assert [p["vhost"] for p in api.ok("/api/users/pat/permissions")] == ["/"]

    assert api.put("/api/permissions/%2F/ghost", body).body == {"error": "bad_request",
                                                               "reason": "vhost_or_user_not_found"}
    assert api.put("/api/permissions/nowhere/pat", body).status == 400
    missing = api.put("/api/permissions/%2F/pat", {"configure": ".*"})
    assert missing.status == 400 and "key_missing,write" in missing.body["reason"]
    bad_regex = api.put("/api/permissions/%2F/pat", {"configure": "(", "write": "", "read": ""})
    assert bad_regex.status == 400 and "invalid configure permission regex" in bad_regex.body["reason"]

    assert api.delete("/api/permissions/%2F/pat").status == 204
    assert api.get("/api/permissions/%2F/pat").body == NOT_FOUND
    assert api.delete("/api/permissions/%2F/pat").status == 404


# -- queues, exchanges, bindings --------------------------------------------------------------------


def test_queue_lifecycle(mgmt, api: Api):
    name = unique("q")
    path = f"/api/queues/%2F/{seg(name)}"
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 201
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 204
    clash = api.put(path, {"durable": False})
    assert clash.status == 400
    assert clash.body["reason"] == f"inequivalent arg 'durable' for queue '{name}' in vhost '/': received 'false' but current is 'true'"
    q = api.ok(path)
    for key, value in {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
                       "arguments": {"x-max-length": 10}, "type": "classic", "messages": 0, "consumers": 0,
                       "state": "running", "node": "test@localhost"}.items():
        assert q[key] == value, key
    assert {"messages_ready", "messages_unacknowledged", "message_bytes", "message_stats"} <= set(q)

    conn = connect(mgmt.amqp_port)
    ch = conn.channel()
    for _ in range(3):
        ch.basic_publish("", name, b"hello")
    conn.close()
    q = api.ok(path)
    assert (q["messages"], q["messages_ready"], q["message_bytes"]) == (3, 3, 15)
    assert q["message_stats"]["publish"] == 3
    assert name in [x["name"] for x in api.ok("/api/queues/%2F")]

    not_empty = api.delete(path + "?if-empty=true")
    assert (not_empty.status, not_empty.body["reason"]) == (400, f"queue '{name}' in vhost '/' is not empty")
    assert api.delete(path + "/contents").status == 204
    assert api.ok(path)["messages"] == 0
    assert api.delete(path + "?if-empty=true&if-unused=true").status == 204
    assert api.get(path).body == NOT_FOUND
    assert api.delete(path).status == 404
    assert api.delete(path + "/contents").status == 404

    assert api.put("/api/queues/%2F/amq.reserved").body == {"error": "not_authorised", "reason": "Access refused."}
    assert api.put(path, {"durable": "maybe"}).status == 400
    assert api.put(path, {"arguments": [1]}).status == 400
    assert api.put(path, {"durable": False, "arguments": {"x-queue-type": "stream"}}).status == 400
    assert api.get("/api/queues/no-such-vhost").status == 404


def test_exchanges_and_bindings(mgmt, api: Api):
    x = unique("x")
    q = unique("q")
    xpath = f"/api/exchanges/%2F/{seg(x)}"
    assert api.put(xpath, {"type": "topic", "durable": True}).status == 201
    assert api.put(xpath, {"type": "topic", "durable": True}).status == 204
    assert api.put(xpath, {"type": "fanout", "durable": True}).status == 400
    assert api.put(f"/api/exchanges/%2F/{seg(unique('x'))}", {"type": "nope"}).status == 400
    got = api.ok(xpath)
    assert {k: got[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")} == {
        "name": x, "vhost": "/", "type": "topic", "durable": True, "auto_delete": False, "internal": False,
        "arguments": {}}
    assert api.ok("/api/exchanges/%2F/amq.default")["name"] == ""
    assert api.ok("/api/exchanges/%2F/amq.direct")["type"] == "direct"
    assert api.delete("/api/exchanges/%2F/amq.direct").status == 401
    assert api.put("/api/exchanges/%2F/amq.mine", {"type": "direct"}).status == 401

    assert api.put(f"/api/queues/%2F/{seg(q)}").status == 201
    conn = connect(mgmt.amqp_port)
    conn.channel().queue_bind(q, x, "a.#", arguments={"k": "v"})
    conn.close()
    mine = [b for b in api.ok("/api/bindings/%2F") if b["destination"] == q]
    assert mine == [
        {"source": "", "vhost": "/", "destination": q, "destination_type": "queue", "routing_key": q,
         "arguments": {}, "properties_key": q},
        {"source": x, "vhost": "/", "destination": q, "destination_type": "queue", "routing_key": "a.#",
         "arguments": {"k": "v"}, "properties_key": mine[1]["properties_key"]},
    ]
    assert mine[1]["properties_key"].startswith("a.%23~")
    assert len(api.ok(f"/api/queues/%2F/{seg(q)}/bindings")) == 2
    assert any(b["source"] == x for b in api.ok("/api/bindings"))

    in_use = api.delete(xpath + "?if-unused=true")
    assert in_use.status == 400 and "in use" in in_use.body["reason"]
    assert api.delete(xpath).status == 204
    assert api.get(xpath).status == 404
    assert api.delete(xpath).status == 404
    assert api.delete(f"/api/queues/%2F/{seg(q)}").status == 204


def test_pagination_sorting_columns(clean_api: Api):
    api = clean_api
    api.put("/api/vhosts/pages")
    api.put("/api/permissions/pages/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    for i in range(7):
        assert api.put(f"/api/queues/pages/item-{i}", {"durable": i % 2 == 0}).status == 201
    assert api.put("/api/queues/pages/other").status == 201
    page = api.ok("/api/queues/pages?page=2&page_size=3&columns=name,durable")
    assert {k: page[k] for k in ("page", "page_size", "page_count", "item_count", "filtered_count", "total_count")} == {
        "page": 2, "page_size": 3, "page_count": 3, "item_count": 3, "filtered_count": 8, "total_count": 8}
    assert page["items"] == [{"name": "item-3", "durable": False}, {"name": "item-4", "durable": True},
                             {"name": "item-5", "durable": False}]
    filtered = api.ok("/api/queues/pages?page=1&name=ITEM-")
    assert filtered["filtered_count"] == 7
    regex = api.ok("/api/queues/pages?page=1&name=%5Eitem-%5B12%5D%24&use_regex=true")
    assert [q["name"] for q in regex["items"]] == ["item-1", "item-2"]
    by_durable = api.ok("/api/queues/pages?sort=durable&sort_reverse=true&columns=name")
    assert [q["name"] for q in by_durable][:4] == ["item-6", "item-4", "item-2", "item-0"]
    assert api.get("/api/queues/pages?page=0").body["error"] == "invalid_pagination_parameters"
    assert api.get("/api/queues/pages?page=9&page_size=3").body["error"] == "page_out_of_range"
    assert api.ok("/api/overview?columns=node,object_totals.queues") == {
        "node": "test@localhost", "object_totals": {"queues": 8}}


# -- connections, channels, consumers ---------------------------------------------------------------


def test_connections_channels_consumers(mgmt, api: Api):
    q = unique("q")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", mgmt.amqp_port, client_properties={"connection_name": "mgmt-test"}))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_qos(prefetch_count=5)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_publish("", q, b"x")
    conn.process_data_events(time_limit=0.2)

    mine = [c for c in api.ok("/api/connections") if c["user_provided_name"] == "mgmt-test"]
    assert len(mine) == 1
    c = mine[0]
    assert (c["user"], c["vhost"], c["state"], c["channels"], c["protocol"]) == ("guest", "/", "running", 1,
                                                                                  "AMQP 0-9-1")
    assert c["client_properties"]["product"] == "Pika Python Client Library"
    assert c["port"] == mgmt.amqp_port and c["peer_host"] == "127.0.0.1"
    assert api.ok(f"/api/connections/{seg(c['name'])}")["name"] == c["name"]

    chans = [x for x in api.ok("/api/channels") if x["connection_details"]["name"] == c["name"]]
    assert [(x["number"], x["consumer_count"], x["prefetch_count"]) for x in chans] == [(1, 1, 5)]
    assert chans[0]["name"] == f"{c['name']} (1)" and chans[0]["message_stats"]["publish"] == 1
    consumers = [x for x in api.ok("/api/consumers/%2F") if x["queue"]["name"] == q]
    assert consumers == [{
        "consumer_tag": tag, "queue": {"name": q, "vhost": "/"}, "channel_details": consumers[0]["channel_details"],
        "ack_required": True, "exclusive": False, "prefetch_count": 5, "priority": 0, "arguments": {},
        "active": True, "activity_status": "up", "consumer_timeout": consumers[0]["consumer_timeout"]}]
    assert consumers[0]["channel_details"]["connection_name"] == c["name"]
    assert any(x["consumer_tag"] == tag for x in api.ok("/api/consumers"))

    closed = api.delete(f"/api/connections/{seg(c['name'])}", headers={"X-Reason": "go away"})
    assert closed.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(time_limit=5)
    assert (info.value.reply_code, info.value.reply_text) == (320, "CONNECTION_FORCED - go away")
    assert wait_for(lambda: api.get(f"/api/connections/{seg(c['name'])}").status == 404)
    assert api.delete(f"/api/connections/{seg(c['name'])}").status == 404
    api.delete(f"/api/queues/%2F/{seg(q)}")


def test_overview_nodes_aliveness(mgmt, api: Api):
    before = api.ok("/api/overview")
    for key in ("management_version", "product_version", "node", "cluster_name", "object_totals",
                "queue_totals", "message_stats", "listeners", "exchange_types"):
        assert key in before, key
    assert before["node"] == "test@localhost"
    assert set(before["object_totals"]) == {"connections", "channels", "exchanges", "queues", "consumers"}
    assert {"messages", "messages_ready", "messages_unacknowledged", "messages_details"} <= set(before["queue_totals"])
    assert {"publish", "deliver", "ack", "publish_details"} <= set(before["message_stats"])
    assert api.call("HEAD", "/api/overview").status == 200

    q = unique("q")
    conn = connect(mgmt.amqp_port)
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    conn.close()  # counters of closed channels still count
    after = api.ok("/api/overview")
    assert after["message_stats"]["publish"] >= before["message_stats"]["publish"] + 2

    nodes = api.ok("/api/nodes")
    assert [n["name"] for n in nodes] == ["test@localhost"]
    node = api.ok("/api/nodes/test@localhost")
    for key in ("running", "uptime", "mem_used", "mem_limit", "fd_used", "fd_total", "proc_used",
                "sockets_used", "disk_free", "processors"):
        assert key in node, key
    assert node["running"] is True and node["mem_used"] > 1_000_000 and node["uptime"] > 0
    assert api.get("/api/nodes/other@host").status == 404

    assert api.ok("/api/aliveness-test/%2F") == {"status": "ok"}
    assert api.get("/api/aliveness-test/nowhere").status == 404
    api.delete(f"/api/queues/%2F/{seg(q)}")


def test_management_port_in_use_is_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port",
             str(port), "--data-dir", str(tmp_path), "--log-level", "none", "--no-cluster", "--workers", "1"],
            capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr == f"hutch-server: cannot listen for management HTTP on port {port}: address already in use\n"
