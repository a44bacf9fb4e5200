"""The second part of the management API against a real node: cluster name, bindings by source,
destination and properties key, publish and get, topic permissions, health checks, per-vhost and
per-connection client lists, one channel, users without permissions, bulk delete.

Each endpoint is checked for its JSON shape and status codes, 401 without credentials, 401 for tags
lacking the right (RabbitMQ's code for both), 404 for unknown objects and 400 with a reason for invalid
bodies. Tests that change users or permissions use `clean_api` (their own node); the rest share the
session node and use unique names.
"""

from __future__ import annotations

import base64
import time
import urllib.parse

import pika
import pika.exceptions
import pytest

from conftest import start_server  # tests/conftest.py

from .helpers import Api, connect, seg, unique, wait_for, wait_mgmt
from .test_mgmt_api import add_user

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def post(api: Api, path: str, body: object) -> object:
    return api.call("POST", path, body)


def declare(api: Api, queue: str | None = None, exchange: str | None = None, xtype: str = "direct") -> None:
    if queue is not None:
        assert api.put(f"/api/queues/%2F/{seg(queue)}", {"auto_delete": False}).status in (201, 204)
    if exchange is not None:
        assert api.put(f"/api/exchanges/%2F/{seg(exchange)}", {"type": xtype}).status in (201, 204)


# -- authentication on every new endpoint ------------------------------------------------------------

NEW_GETS = ["/api/cluster-name", "/api/topic-permissions", "/api/health/checks/alarms",
            "/api/health/checks/local-alarms", "/api/health/checks/virtual-hosts",
            "/api/health/checks/port-listener/1", "/api/health/checks/node-is-quorum-critical",
            "/api/health/checks/protocol-listener/amqp", "/api/health/checks/is-in-service",
            "/api/vhosts/%2F/connections", "/api/vhosts/%2F/channels", "/api/exchanges/%2F/amq.direct/bindings/source",
            "/api/exchanges/%2F/amq.direct/bindings/destination", "/api/users/without-permissions",
            "/api/openapi.json", "/api/extensions"]


@pytest.mark.parametrize("path", NEW_GETS)
def test_new_endpoints_need_credentials(api: Api, path: str):
    reply = api.get(path, auth=False)
    assert reply.status == 401, path
    assert reply.body == {"error": "not_authorized", "reason": "Not_Authorized"}
    assert reply.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_tags_and_rights(clean_api: Api):
    api = clean_api
    manager = add_user(api, "mgr", "management", vhost="/")
    monitor = add_user(api, "mon", "monitoring")
    nobody = add_user(api, "nob", "")
    for who, path in ((manager, "/api/topic-permissions"), (monitor, "/api/topic-permissions"),
                      (manager, "/api/users/without-permissions")):
        assert who.get(path).body == {"error": "not_authorised", "reason": "Not administrator user"}, path
    assert monitor.call("PUT", "/api/cluster-name", {"name": "x"}).body["reason"] == "Not administrator user"
    assert nobody.get("/api/health/checks/alarms").body["reason"] == "Not management user"
    assert manager.get("/api/health/checks/alarms").status == 200  # any management user
    assert manager.get("/api/cluster-name").status == 200


# -- cluster name -----------------------------------------------------------------------------------


def test_cluster_name(clean_api: Api, clean_mgmt):
    api = clean_api
    assert api.ok("/api/cluster-name") == {"name": "test@localhost"}
    assert api.call("PUT", "/api/cluster-name", {"name": "blue"}).status == 204
    assert api.ok("/api/cluster-name") == {"name": "blue"}
    assert api.ok("/api/overview")["cluster_name"] == "blue"
    conn = connect(clean_mgmt.amqp_port)
    try:
        assert conn._impl.server_properties["cluster_name"] == "blue"
    finally:
        conn.close()
    for body, reason in (({}, "[{key_missing,name}]"), ({"name": ""}, "name must be a non-empty string"),
                         ({"name": 5}, "name must be a non-empty string")):
        reply = api.call("PUT", "/api/cluster-name", body)
        assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": reason})
    assert api.call("PUT", "/api/cluster-name", raw=b"[1]").status == 400


# -- bindings ---------------------------------------------------------------------------------------


def test_exchange_bindings_source_and_destination(api: Api):
    x1, x2, q = unique("x1"), unique("x2"), unique("q")
    declare(api, queue=q, exchange=x1)
    declare(api, exchange=x2, xtype="fanout")
    assert post(api, f"/api/bindings/%2F/e/{x1}/q/{q}", {"routing_key": "k1"}).status == 201
    assert post(api, f"/api/bindings/%2F/e/{x1}/e/{x2}", {"routing_key": "k2"}).status == 201

    source = api.ok(f"/api/exchanges/%2F/{x1}/bindings/source")
    assert [(b["destination"], b["destination_type"], b["routing_key"]) for b in source] == [
        (x2, "exchange", "k2"), (q, "queue", "k1")]
    assert set(source[0]) == {"source", "vhost", "destination", "destination_type", "routing_key", "arguments",
                              "properties_key"}
    assert api.ok(f"/api/exchanges/%2F/{x1}/bindings/destination") == []
    dest = api.ok(f"/api/exchanges/%2F/{x2}/bindings/destination")
    assert [(b["source"], b["routing_key"]) for b in dest] == [(x1, "k2")]
    implicit = api.ok("/api/exchanges/%2F/amq.default/bindings/source")
    assert {"source": "", "vhost": "/", "destination": q, "destination_type": "queue", "routing_key": q,
            "arguments": {}, "properties_key": q} in implicit
    for path in (f"/api/exchanges/%2F/{unique('nope')}/bindings/source",
                 f"/api/exchanges/nowhere/{x1}/bindings/destination"):
        assert api.get(path).status == 404, path
    page = api.ok(f"/api/exchanges/%2F/{x1}/bindings/source?page=1&page_size=1&columns=destination")
    assert page["items"] == [{"destination": x2}] and page["total_count"] == 2 and page["page_count"] == 2
    assert [b["routing_key"] for b in api.ok(f"/api/exchanges/%2F/{x1}/bindings/source?sort=routing_key"
                                               "&sort_reverse=true")] == ["k2", "k1"]


def test_binding_create_get_delete_by_properties_key(api: Api):
    x, q = unique("bx"), unique("bq")
    declare(api, queue=q, exchange=x)
    base = f"/api/bindings/%2F/e/{seg(x)}/q/{seg(q)}"

    plain = post(api, base, {})
    assert plain.status == 201 and plain.headers["Location"] == f"{seg(q)}/~"
    spaced = post(api, base, {"routing_key": "a b/c~d"})
    assert spaced.headers["Location"] == f"{seg(q)}/" + seg("a+b%2Fc%7Ed")
    with_args = post(api, base, {"routing_key": "k", "arguments": {"x-tag": "v", "n": 1}})
    assert with_args.status == 201
    key = urllib.parse.unquote(with_args.headers["Location"].split("/")[-1])
    assert key.startswith("k~") and len(key) == 8  # rk ~ 6-character base64url hash of the arguments

    listed = api.ok(base)
    assert sorted(b["properties_key"] for b in listed) == sorted(["~", "a+b%2Fc%7Ed", key])
    for b in listed:
        # the Location, resolved against the POST's URL, names the binding
        one = api.ok(base + "/" + seg(b["properties_key"]))
        assert one == b
    assert api.ok(base + "/" + seg(key))["arguments"] == {"x-tag": "v", "n": 1}
    assert api.delete(base + "/" + seg(key)).status == 204
    assert api.get(base + "/" + seg(key)).status == 404
    assert api.delete(base + "/" + seg(key)).status == 404
    assert api.delete(base + "/~").status == 204
    assert [b["routing_key"] for b in api.ok(base)] == ["a b/c~d"]
    assert api.get(base + "/k~AAAAAA").status == 404
    assert api.get(base + "/a~b~c").status == 400

    slashed = unique("a/b")
    declare(api, queue=slashed)
    located = post(api, f"/api/bindings/%2F/e/{seg(x)}/q/{seg(slashed)}", {"routing_key": "r/s"})
    assert located.headers["Location"] == f"{seg(slashed)}/" + seg("r%2Fs")
    assert api.ok(f"/api/bindings/%2F/e/{seg(x)}/q/{seg(slashed)}/{seg('r%2Fs')}")["destination"] == slashed

    x2 = unique("bx2")
    declare(api, exchange=x2)
    e2e = post(api, f"/api/bindings/%2F/e/{seg(x)}/e/{seg(x2)}", {"routing_key": "r"})
    assert e2e.status == 201 and e2e.headers["Location"] == f"{seg(x2)}/r"
    assert api.ok(f"/api/bindings/%2F/e/{seg(x)}/e/{seg(x2)}/r")["destination_type"] == "exchange"

    for path, body, status in (
            (f"/api/bindings/%2F/e/{seg(x)}/q/{unique('missing')}", {}, 404),
            (f"/api/bindings/%2F/e/{unique('missing')}/q/{seg(q)}", {}, 404),
            (f"/api/bindings/nowhere/e/{seg(x)}/q/{seg(q)}", {}, 404),
            (base, {"routing_key": 5}, 400),
            (base, {"arguments": "nope"}, 400),
            (base, [1, 2], 400)):
        reply = post(api, path, body)
        assert reply.status == status, (path, body, reply.body)
        if status == 400:
            assert reply.body["error"] == "bad_request" and reply.body["reason"]
    refused = post(api, f"/api/bindings/%2F/e/amq.default/q/{seg(q)}", {"routing_key": "x"})
    assert refused.status == 401 and refused.body["reason"] == "Access refused."
    bad_headers = post(api, f"/api/bindings/%2F/e/amq.headers/q/{seg(q)}", {"arguments": {"x-match": "some"}})
    assert bad_headers.status == 400


def test_binding_needs_amqp_permissions(clean_api: Api):
    api = clean_api
    declare(api, queue="q", exchange="x")
    reader = add_user(api, "reader", "management")
    body = {"configure": "", "write": "", "read": ".*"}
    assert api.put("/api/permissions/%2F/reader", body).status == 201
    refused = post(reader, "/api/bindings/%2F/e/x/q/q", {})
    assert (refused.status, refused.body["reason"]) == (401, "Access refused.")
    assert post(api, "/api/bindings/%2F/e/x/q/q", {}).status == 201
    assert reader.delete("/api/bindings/%2F/e/x/q/q/~").status == 401
    outsider = add_user(api, "outsider", "management")
    assert outsider.get("/api/bindings/%2F/e/x/q/q").body["reason"] == "User not authorised to access virtual host"


# -- publish and get --------------------------------------------------------------------------------


def test_publish_and_get(api: Api):
    q = unique("pq")
    declare(api, queue=q)
    publish = "/api/exchanges/%2F/amq.default/publish"
    props = {"content_type": "text/plain", "delivery_mode": 2, "headers": {"h": "v", "n": 3, "list": [1, "a"]},
             "message_id": "m-1", "priority": 1}
    assert post(api, publish, {"routing_key": q, "payload": "hello", "payload_encoding": "string",
                               "properties": props}).body == {"routed": True}
    raw = bytes(range(250, 256)) + b"\x00"
    assert post(api, publish, {"routing_key": q, "payload": base64.b64encode(raw).decode(),
                               "payload_encoding": "base64", "properties": {}}).body == {"routed": True}
    assert post(api, publish, {"routing_key": unique("nowhere"), "payload": "", "payload_encoding": "string",
                               "properties": {}}).body == {"routed": False}
    assert api.ok(f"/api/queues/%2F/{q}")["messages"] == 2

    get = f"/api/queues/%2F/{q}/get"
    first = post(api, get, {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert first.status == 200
    msgs = first.body
    assert len(msgs) == 2
    assert msgs[0] == {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": q,
                       "message_count": 1, "properties": props, "payload": "hello", "payload_encoding": "string"}
    assert msgs[1]["payload"] == base64.b64encode(raw).decode() and msgs[1]["payload_encoding"] == "base64"
    assert msgs[1]["message_count"] == 0 and msgs[1]["payload_bytes"] == 7
    assert api.ok(f"/api/queues/%2F/{q}")["messages"] == 2  # requeued

    again = post(api, get, {"count": "1", "ackmode": "reject_requeue_true", "encoding": "base64", "truncate": 2})
    assert again.body[0]["redelivered"] is True
    assert again.body[0]["payload"] == base64.b64encode(b"he").decode()
    assert again.body[0]["payload_encoding"] == "base64" and again.body[0]["payload_bytes"] == 5
    taken = post(api, get, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}).body
    assert [m["payload"] for m in taken] == ["hello"]
    rejected = post(api, get, {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"}).body
    assert len(rejected) == 1
    assert post(api, get, {"count": 3, "ackmode": "ack_requeue_false", "encoding": "auto"}).body == []
    assert api.ok(f"/api/queues/%2F/{q}")["messages"] == 0


def test_publish_and_get_errors(api: Api):
    q, x = unique("eq"), unique("ex")
    declare(api, queue=q)
    assert api.put(f"/api/exchanges/%2F/{x}", {"type": "direct", "internal": True}).status == 201
    publish = "/api/exchanges/%2F/amq.default/publish"
    good = {"routing_key": q, "payload": "p", "payload_encoding": "string", "properties": {}}
    cases = [
        (publish, {k: v for k, v in good.items() if k != "payload_encoding"}, 400,
         "[{key_missing,payload_encoding}]"),
        (publish, {"routing_key": q}, 400, "[{key_missing,properties},{key_missing,payload},"
                                           "{key_missing,payload_encoding}]"),
        (publish, {**good, "payload_encoding": "hex"}, 400, "{unsupported_encoding,hex}"),
        (publish, {**good, "payload_encoding": "base64", "payload": "!!"}, 400, "not_base64"),
        (publish, {**good, "payload": 5}, 400, "payload_not_string"),
        (publish, {**good, "properties": {"delivery_mode": "2"}}, 400, "{not_int,delivery_mode}"),
        (publish, {**good, "properties": {"user_id": "mallory"}}, 400,
         "user_id property set to 'mallory' but authenticated user was 'guest'"),
        (publish, {**good, "properties": {"expiration": "soon"}}, 400, "invalid expiration 'soon'"),
        (f"/api/exchanges/%2F/{unique('nope')}/publish", good, 404, "exchange_not_found"),
        (f"/api/exchanges/%2F/{x}/publish", good, 401, "Access refused."),
        (f"/api/queues/%2F/{unique('nope')}/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
         404, "queue_not_found"),
        (f"/api/queues/%2F/{q}/get", {"count": 1, "ackmode": "ack_requeue_true"}, 400, "[{key_missing,encoding}]"),
        (f"/api/queues/%2F/{q}/get", {"count": 1, "ackmode": "keep", "encoding": "auto"}, 400,
         "Invalid ackmode value: keep. Valid values are: ack_requeue_true, ack_requeue_false, "
         "reject_requeue_true, reject_requeue_false"),
        (f"/api/queues/%2F/{q}/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "utf8"}, 400,
         "Unsupported encoding. Please use auto or base64."),
        (f"/api/queues/%2F/{q}/get", {"count": "many", "ackmode": "ack_requeue_true", "encoding": "auto"}, 400,
         "count must be an integer"),
    ]
    for path, body, status, reason in cases:
        reply = post(api, path, body)
        assert reply.status == status, (path, body, reply.body)
        assert reply.body["reason"] == reason, (path, body, reply.body)
    assert api.call("POST", publish, raw=b"not json").body == {"error": "bad_request", "reason": "not_json"}
    assert post(api, "/api/exchanges/nowhere/amq.default/publish", good).status == 404


def test_publish_reject_publish_overflow_and_dead_letter_on_reject(api: Api):
    full, dlq = unique("full"), unique("dlq")
    assert api.put(f"/api/queues/%2F/{full}", {"arguments": {"x-max-length": 1, "x-overflow": "reject-publish",
                                                             "x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": dlq}}).status == 201
    declare(api, queue=dlq)
    publish = "/api/exchanges/%2F/amq.default/publish"
    body = {"routing_key": full, "payload": "1", "payload_encoding": "string", "properties": {}}
    assert post(api, publish, body).body == {"routed": True}
    refused = post(api, publish, body)
    assert (refused.status, refused.body["reason"]) == (400, "rejected Unable to publish message. Check queue limits.")
    post(api, f"/api/queues/%2F/{full}/get", {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"})
    assert wait_for(lambda: api.ok(f"/api/queues/%2F/{dlq}")["messages"] == 1)


def test_publish_and_get_need_permissions(clean_api: Api):
    api = clean_api
    declare(api, queue="q")
    writer = add_user(api, "writer", "management")
    assert api.put("/api/permissions/%2F/writer", {"configure": "", "write": ".*", "read": ""}).status == 201
    body = {"routing_key": "q", "payload": "x", "payload_encoding": "string", "properties": {}}
    assert post(writer, "/api/exchanges/%2F/amq.default/publish", body).body == {"routed": True}
    refused = post(writer, "/api/queues/%2F/q/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert (refused.status, refused.body["reason"]) == (401, "Access refused.")
    assert api.put("/api/vhosts/other").status == 201
    elsewhere = post(writer, "/api/exchanges/other/amq.default/publish", body)
    assert (elsewhere.status, elsewhere.body["reason"]) == (401, "User not authorised to access virtual host")


# -- topic permissions ------------------------------------------------------------------------------


def test_topic_permissions(clean_api: Api, clean_mgmt):
    api = clean_api
    add_user(api, "tp", "management", vhost="/")
    path = "/api/topic-permissions/%2F/tp"
    assert api.get(path).status == 404
    assert api.put(path, {"exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}).status == 201
    assert api.put(path, {"exchange": "other", "write": "", "read": ""}).status == 204
    entry = {"user": "tp", "vhost": "/", "exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}
    assert api.ok(path) == [entry, {"user": "tp", "vhost": "/", "exchange": "other", "write": "", "read": ""}]
    assert api.ok(path + "/amq.topic") == [entry]
    assert entry in api.ok("/api/topic-permissions")
    assert api.ok("/api/users/tp/topic-permissions")[0] == entry
    assert entry in api.ok("/api/vhosts/%2F/topic-permissions")
    assert api.ok("/api/topic-permissions?page=1&page_size=1&columns=exchange")["items"] == [{"exchange": "amq.topic"}]

    # enforced on publishes to topic exchanges
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", clean_mgmt.amqp_port, "/", pika.PlainCredentials("tp", "pw-tp")))
    try:
        ch = conn.channel()
        ch.queue_declare("tq")
        ch.queue_bind("tq", "amq.topic", "#")
        ch.basic_publish("amq.topic", "tp.allowed", b"1")
        assert wait_for(lambda: api.ok("/api/queues/%2F/tq")["messages"] == 1)
        ch.basic_publish("amq.topic", "someone.else", b"2")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("tq", passive=True)  # the next synchronous call sees the channel closed
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == ("ACCESS_REFUSED - write access to topic 'someone.else' in exchange "
                                            "'amq.topic' in vhost '/' refused for user 'tp'")
    finally:
        conn.close()
    refused_http = post(api.as_user("tp", "pw-tp"), "/api/exchanges/%2F/amq.topic/publish",
                        {"routing_key": "x.y", "payload": "", "payload_encoding": "string", "properties": {}})
    assert refused_http.status == 401

    for body, reason in (({"exchange": "amq.topic"}, "[{key_missing,write},{key_missing,read}]"),
                         ({"exchange": "x", "write": "(", "read": ""}, None)):
        reply = api.put(path, body)
        assert reply.status == 400
        assert reason is None or reply.body["reason"] == reason
    assert api.put("/api/topic-permissions/%2F/nobody", {"exchange": "x", "write": "", "read": ""}).body == {
        "error": "bad_request", "reason": "vhost_or_user_not_found"}
    assert api.delete(path + "/other").status == 204
    assert api.delete(path + "/other").status == 404
    assert api.ok(path) == [entry]
    assert api.delete(path).status == 204
    assert api.get(path).status == 404 and api.delete(path).status == 404
    assert api.put(path, {"exchange": "amq.topic", "write": ".*", "read": ".*"}).status == 201
    assert api.delete("/api/users/tp").status == 204
    assert api.ok("/api/topic-permissions") == []
    assert api.get("/api/users/tp/topic-permissions").status == 404
    assert api.get("/api/vhosts/nowhere/topic-permissions").status == 404


# -- health checks ----------------------------------------------------------------------------------


def test_health_checks(api: Api, mgmt):
    ok = {"status": "ok"}
    for path in ("alarms", "local-alarms", "virtual-hosts", "is-in-service"):
        assert api.ok(f"/api/health/checks/{path}") == ok, path
    assert api.ok("/api/healthchecks/node") == ok
    assert api.ok("/api/health/checks/node-is-quorum-critical") == {"status": "ok", "reason": "single node cluster"}
    assert api.ok(f"/api/health/checks/port-listener/{mgmt.amqp_port}") == {"status": "ok", "port": mgmt.amqp_port}
    assert api.ok(f"/api/health/checks/port-listener/{mgmt.management_port}")["status"] == "ok"
    missing = api.get("/api/health/checks/port-listener/1")
    assert missing.status == 503
    assert missing.body == {"status": "failed", "reason": "No active listener", "missing": 1,
                            "ports": [mgmt.amqp_port, mgmt.management_port]}
    assert api.get("/api/health/checks/port-listener/http").body == {"error": "bad_request", "reason": "Invalid port"}
    assert api.ok("/api/health/checks/protocol-listener/amqp091,http") == {"status": "ok",
                                                                            "protocols": ["amqp", "http"]}
    mqtt = api.get("/api/health/checks/protocol-listener/mqtt")
    assert mqtt.status == 503 and mqtt.body["missing"] == ["mqtt"]


def test_alarm_health_check_fails_during_an_alarm(tmp_path):
    info = wait_mgmt(start_server(tmp_path, config_text="disk_free_limit.absolute = 1000TB\n"))
    try:
        api = Api(info.mgmt_url)
        assert wait_for(lambda: api.get("/api/health/checks/alarms").status == 503, timeout=10)
        reply = api.get("/api/health/checks/alarms")
        assert reply.body == {"status": "failed", "reason": "There are alarms in effect in the cluster",
                              "alarms": [{"node": "test@localhost", "resource": "disk"}]}
        local = api.get("/api/health/checks/local-alarms")
        assert (local.status, local.body["reason"]) == (503, "There are alarms in effect on the node")
    finally:
        info.stop()


# -- connections and channels -----------------------------------------------------------------------


def test_vhost_and_connection_client_lists(clean_api: Api, clean_mgmt):
    api = clean_api
    assert api.put("/api/vhosts/side").status == 201
    owner = add_user(api, "owner", "management", vhost="side")
    root = connect(clean_mgmt.amqp_port)
    side = connect(clean_mgmt.amqp_port, "owner", "pw-owner", vhost="side")
    try:
        root.channel()
        side_ch = side.channel()
        side_ch.queue_declare("sq")
        side_ch.basic_consume("sq", lambda *a: None, consumer_tag="ctag-1")
        side_ch.basic_publish("amq.direct", "nowhere", b"x")
        side_ch.basic_publish("", "sq", b"y")
        side.process_data_events(time_limit=0.2)
        assert wait_for(lambda: len(api.ok("/api/connections")) == 2)

        side_conns = api.ok("/api/vhosts/side/connections")
        assert [(c["vhost"], c["user"]) for c in side_conns] == [("side", "owner")]
        assert [c["vhost"] for c in api.ok("/api/vhosts/%2F/connections")] == ["/"]
        assert [c["vhost"] for c in api.ok("/api/vhosts/side/channels")] == ["side"]
        assert api.get("/api/vhosts/nowhere/connections").status == 404
        assert api.get("/api/vhosts/nowhere/channels").status == 404
        assert owner.get("/api/vhosts/%2F/connections").status == 401  # not its vhost
        assert len(owner.ok("/api/vhosts/side/channels")) == 1

        name = side_conns[0]["name"]
        chans = api.ok(f"/api/connections/{seg(name)}/channels")
        assert [c["number"] for c in chans] == [1]
        assert api.get(f"/api/connections/{seg('no such')}/channels").status == 404
        assert owner.ok(f"/api/connections/{seg(name)}/channels")[0]["user"] == "owner"
        root_name = api.ok("/api/vhosts/%2F/connections")[0]["name"]
        assert owner.get(f"/api/connections/{seg(root_name)}/channels").status == 401

        channel = api.ok(f"/api/channels/{seg(chans[0]['name'])}")
        assert channel["name"] == f"{name} (1)"
        assert [c["consumer_tag"] for c in channel["consumer_details"]] == ["ctag-1"]
        assert {(p["exchange"]["name"], p["stats"]["publish"]) for p in channel["publishes"]} == {
            ("amq.direct", 1), ("", 1)}
        stats = channel["message_stats"]
        assert stats["publish"] == 2 and stats["drop_unroutable"] == 1 and stats["deliver_no_ack"] == 0
        assert stats["deliver"] + stats["deliver_no_ack"] + stats["get"] + stats["get_no_ack"] == stats["deliver_get"]
        assert api.get(f"/api/channels/{seg(name + ' (9)')}").status == 404
        assert owner.get(f"/api/channels/{seg(root_name + ' (1)')}").status == 401

        by_user = api.ok("/api/connections/username/owner")
        assert [c["name"] for c in by_user] == [name]
        assert owner.ok("/api/connections/username/owner")[0]["name"] == name
        assert owner.get("/api/connections/username/guest").status == 401
        assert api.ok("/api/vhosts/side/connections?page=1&page_size=1&columns=user")["items"] == [{"user": "owner"}]
        assert api.delete("/api/connections/username/owner", headers={"X-Reason": "bye"}).status == 204
        assert wait_for(lambda: api.ok("/api/connections/username/owner") == [])
    finally:
        for conn in (root, side):
            try:
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                pass


# -- users ------------------------------------------------------------------------------------------


def test_users_without_permissions_and_bulk_delete(clean_api: Api):
    api = clean_api
    add_user(api, "lonely", "")
    add_user(api, "lonely2", "")
    add_user(api, "granted", "", vhost="/")
    assert [u["name"] for u in api.ok("/api/users/without-permissions")] == ["lonely", "lonely2"]
    assert api.call("POST", "/api/users/bulk-delete", {"users": ["lonely", "granted", "ghost"]}).status == 204
    assert [u["name"] for u in api.ok("/api/users")] == ["guest", "lonely2"]
    for body in ({}, {"users": "lonely2"}, {"users": [1]}):
        assert api.call("POST", "/api/users/bulk-delete", body).status == 400, body


def test_extensions_and_openapi_are_served(api: Api):
    assert api.ok("/api/extensions") == []
    doc = api.ok("/api/openapi.json")
    assert doc["openapi"].startswith("3.")
    assert "/api/bindings/{vhost}/e/{source}/q/{destination}/{props}" in doc["paths"]


def test_collector_survives_churn(api: Api, mgmt):
    """Objects that come and go between samples do not break listing (the collector forgets them)."""
    for _ in range(3):
        conn = connect(mgmt.amqp_port)
        ch = conn.channel()
        q = unique("churn")
        ch.queue_declare(q, auto_delete=True)
        conn.close()
        time.sleep(0.05)
    assert api.get("/api/channels").status == 200
    assert api.get("/api/queues?msg_rates_age=60&msg_rates_incr=5").status == 200


# -- every list endpoint sorts, filters, paginates and selects columns -----------------------------

def _list_routes() -> list[str]:
    from hutch.mgmt.calls import ROUTES

    fill = {"vhost": "%2F", "user": "guest", "username": "guest", "name": "amq.direct"}
    paths = []
    for r in ROUTES:
        if r.method != "GET" or not r.listing:
            continue
        path = r.path
        for key, value in fill.items():
            if key == "name" and not path.startswith("/api/exchanges/"):
                continue
            path = path.replace("{" + key + "}", value)
        if "{" not in path:
            paths.append(path)
    return paths


@pytest.mark.parametrize("path", _list_routes())
def test_every_list_endpoint_takes_the_listing_parameters(api: Api, path: str):
    assert isinstance(api.ok(path), list), path
    page = api.ok(path + "?page=1&page_size=2&sort=name&sort_reverse=true&columns=name,vhost")
    assert set(page) == {"items", "item_count", "filtered_count", "total_count", "page", "page_size", "page_count"}
    assert page["page"] == 1 and page["page_size"] == 2 and page["item_count"] <= 2
    assert all(set(item) <= {"name", "vhost"} for item in page["items"])
    regex = api.ok(path + "?page=1&name=%5Ezzz-no-such&use_regex=true")
    assert regex["filtered_count"] == 0 and regex["items"] == []
    assert api.get(path + "?page=0").body["error"] == "invalid_pagination_parameters"
    assert api.get(path + "?page=1&page_size=501").status == 400


def test_topic_permissions_and_the_cluster_name_survive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json as _json
    import urllib.request
    from base64 import b64encode

    from tests.conftest import start_server

    def call(info, method, path, body=None):  # type: ignore[no-untyped-def]
        req = urllib.request.Request(info.mgmt_url + path, method=method,
                                     data=None if body is None else _json.dumps(body).encode())
        req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, _json.loads(raw) if raw else None

    info = start_server(tmp_path)
    try:
        assert call(info, "PUT", "/api/topic-permissions/%2F/guest",
                    {"exchange": "amq.topic", "write": "^a", "read": ".*"})[0] in (201, 204)
        assert call(info, "PUT", "/api/cluster-name", {"name": "renamed"})[0] == 204
    finally:
        info.stop()
    info = start_server(tmp_path)
    try:
        code, doc = call(info, "GET", "/api/topic-permissions/%2F/guest")
        assert code == 200 and doc[0]["exchange"] == "amq.topic" and doc[0]["write"] == "^a"
        assert call(info, "GET", "/api/cluster-name")[1] == {"name": "renamed"}
    finally:
        info.stop()


def test_channel_counts_unconfirmed_and_uncommitted_publishes(api: Api, mgmt) -> None:  # type: ignore[no-untyped-def]
    """RabbitMQ's `messages_unconfirmed` and `messages_uncommitted` on a channel (the web UI's channel
    page): publishes of an open transaction count until the commit; a confirm-mode channel whose
    publishes were all confirmed has none unconfirmed."""
    q = unique("q")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", mgmt.amqp_port, client_properties={"connection_name": q}))
    try:
        tx = conn.channel()
        tx.queue_declare(q, auto_delete=True)
        tx.tx_select()
        tx.basic_publish("", q, b"a")
        tx.basic_publish("", q, b"b")
        confirmed = conn.channel()
        confirmed.confirm_delivery()
        confirmed.basic_publish("", q, b"c")  # returns once confirmed

        name = next(c["name"] for c in api.ok("/api/connections") if c["user_provided_name"] == q)
        mine = {c["number"]: c for c in api.ok(f"/api/connections/{seg(name)}/channels")}
        assert (mine[1]["messages_uncommitted"], mine[1]["messages_unconfirmed"]) == (2, 0)
        assert (mine[2]["messages_uncommitted"], mine[2]["messages_unconfirmed"]) == (0, 0)
        tx.tx_commit()
        committed = api.ok(f"/api/channels/{seg(mine[1]['name'])}")
        assert committed["messages_uncommitted"] == 0
    finally:
        conn.close()
