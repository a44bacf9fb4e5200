"""Policies and operator policies against a real node: the HTTP API (shapes, status codes, validation,
tags), their effect on queues (`policy`, `operator_policy`, `effective_policy_definition` in
/api/queues) and on exchanges (an alternate exchange from a policy, checked with pika), hutchctl's
commands, and persistence across restarts (graceful and kill -9)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pika
import pika.exceptions
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, connect, run_ctl, seg, wait_mgmt

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def add_user(api: Api, name: str, tags: str = "", vhost: str | None = None) -> Api:
    assert api.put(f"/api/users/{seg(name)}", {"password": "pw-" + name, "tags": tags}).status == 201
    if vhost is not None:
        body = {"configure": ".*", "write": ".*", "read": ".*"}
        assert api.put(f"/api/permissions/{seg(vhost)}/{seg(name)}", body).status == 201
    return api.as_user(name, "pw-" + name)


def queue(api: Api, name: str, vhost: str = "/") -> dict:
    return api.ok(f"/api/queues/{seg(vhost)}/{seg(name)}")


def policy_fields(api: Api, name: str, vhost: str = "/") -> tuple:
    q = queue(api, name, vhost)
    return q["policy"], q["operator_policy"], q["effective_policy_definition"]


# -- the API -------------------------------------------------------------------------------------------


def test_policy_crud_and_shapes(clean_api: Api):
    api = clean_api
    body = {"pattern": "^orders\\.", "definition": {"max-length": 100, "message-ttl": 60000},
            "priority": 3, "apply-to": "queues"}
    assert api.put("/api/policies/%2F/limits", body).status == 201
    expected = {"vhost": "/", "name": "limits", "pattern": "^orders\\.", "apply-to": "queues",
                "definition": {"max-length": 100, "message-ttl": 60000}, "priority": 3}
    assert api.ok("/api/policies/%2F/limits") == expected
    assert api.put("/api/policies/%2F/limits", body).status == 204  # unchanged
    assert api.put("/api/policies/%2F/limits", {**body, "priority": 4}).status == 204  # replaced
    assert api.ok("/api/policies/%2F/limits")["priority"] == 4
    # priority and apply-to are optional: 0 and "all"
    assert api.put("/api/policies/%2F/blanket", {"pattern": ".*", "definition": {"expires": 1000}}).status == 201
    assert api.put("/api/vhosts/dev", {}).status == 201
    assert api.put("/api/policies/dev/dev-pol", {"pattern": "", "definition": {"max-length": 1},
                                                 "priority": 1}).status == 201
    # lists are sorted by priority (as RabbitMQ's), then vhost and name
    assert [(p["vhost"], p["name"], p["priority"], p["apply-to"]) for p in api.ok("/api/policies")] == [
        ("/", "blanket", 0, "all"), ("dev", "dev-pol", 1, "all"), ("/", "limits", 4, "queues")]
    assert [p["name"] for p in api.ok("/api/policies/%2F")] == ["blanket", "limits"]
    assert api.ok("/api/policies/dev?columns=name,definition") == [{"name": "dev-pol", "definition": {"max-length": 1}}]
    assert api.ok("/api/operator-policies") == []

    assert api.delete("/api/policies/%2F/limits").status == 204
    assert api.delete("/api/policies/%2F/limits").body == NOT_FOUND
    assert api.get("/api/policies/%2F/limits").body == NOT_FOUND
    assert api.get("/api/policies/nope").body == NOT_FOUND
    assert api.put("/api/policies/nope/p", body).status == 404
    assert api.call("POST", "/api/policies/%2F/p", body).status == 405


@pytest.mark.parametrize(("body", "reason"), [
    ({"definition": {"max-length": 1}}, "[{key_missing,pattern}]"),
    ({}, "[{key_missing,pattern},{key_missing,definition}]"),
    ({"pattern": "(", "definition": {"max-length": 1}}, 'Validation failed: "(" is not a valid regular expression'),
    ({"pattern": ".*", "definition": {"max-lenght": 1}}, 'Validation failed: ["max-lenght"] are not recognised policy settings'),
    ({"pattern": ".*", "definition": {"max-length": -1}}, "Validation failed: -1 is not a valid maximum length"),
    ({"pattern": ".*", "definition": {"message-ttl": "1000"}}, 'Validation failed: "1000" is not a valid message TTL'),
    ({"pattern": ".*", "definition": {"expires": 0}}, "Validation failed: 0 is not a valid queue expiry"),
    ({"pattern": ".*", "definition": {"overflow": "drop-tail"}}, '"drop-tail" is not a valid overflow value'),
    ({"pattern": ".*", "definition": {"queue-leader-locator": "x"}}, '"x" is not a valid queue leader locator'),
    ({"pattern": ".*", "definition": {}}, "Validation failed: no policy provided"),
    ({"pattern": ".*", "definition": "max-length=1"}, "definition must be a dictionary"),
    ({"pattern": ".*", "definition": {"max-length": 1}, "priority": "high"}, "priority should be a number"),
    ({"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "topics"}, "apply-to 'topics' unrecognised"),
])
def test_invalid_policies_are_400s(api: Api, body, reason):
    reply = api.put("/api/policies/%2F/invalid", body)
    assert reply.status == 400, reply.body
    assert reply.body["error"] == "bad_request"
    assert reply.body["reason"].startswith(reason) if reason.startswith(("[", "Validation")) else \
        reason in reply.body["reason"]
    assert api.get("/api/policies/%2F/invalid").status == 404


def test_operator_policy_keys_and_shapes(clean_api: Api):
    api = clean_api
    body = {"pattern": "^amq\\.", "definition": {"expires": 1800000, "max-length": 10,
                                                 "overflow": "reject-publish", "delivery-limit": 5,
                                                 "message-ttl": 1, "max-length-bytes": 2},
            "priority": 1, "apply-to": "queues"}
    assert api.put("/api/operator-policies/%2F/guard", body).status == 201
    assert api.ok("/api/operator-policies/%2F/guard") == {"vhost": "/", "name": "guard", **body}
    assert [p["name"] for p in api.ok("/api/operator-policies")] == ["guard"]
    assert [p["name"] for p in api.ok("/api/operator-policies/%2F")] == ["guard"]
    assert api.ok("/api/policies") == []  # the two kinds are separate
    reply = api.put("/api/operator-policies/%2F/bad", {"pattern": ".*", "definition": {"dead-letter-exchange": "x"}})
    assert (reply.status, reply.body["reason"]) == (
        400, 'Validation failed: ["dead-letter-exchange"] are not recognised operator policy settings')
    assert api.delete("/api/operator-policies/%2F/guard").status == 204
    assert api.get("/api/operator-policies/%2F/guard").body == NOT_FOUND


def test_tags_and_vhost_access(clean_api: Api):
    api = clean_api
    assert api.put("/api/vhosts/other", {}).status == 201
    body = {"pattern": ".*", "definition": {"max-length": 5}}
    assert api.put("/api/policies/other/theirs", body).status == 201
    assert api.put("/api/policies/%2F/ours", body).status == 201
    denied_object = {"error": "not_authorised", "reason": "User not authorised to access object"}
    not_admin = {"error": "not_authorised", "reason": "Not administrator user"}

    manager = add_user(api, "manager", "management", vhost="/")
    assert manager.put("/api/policies/%2F/p", body).body == denied_object
    assert manager.get("/api/policies/%2F/ours").body == denied_object
    assert manager.delete("/api/policies/%2F/ours").body == denied_object
    assert [p["name"] for p in manager.ok("/api/policies")] == ["ours"]  # its login vhosts only
    assert [p["name"] for p in manager.ok("/api/policies/%2F")] == ["ours"]
    assert manager.get("/api/policies/other").body == {
        "error": "not_authorised", "reason": "User not authorised to access virtual host"}
    assert manager.get("/api/operator-policies").body == not_admin

    maker = add_user(api, "maker", "policymaker", vhost="/")
    assert maker.put("/api/policies/%2F/made", body).status == 201
    assert maker.ok("/api/policies/%2F/made")["definition"] == {"max-length": 5}
    assert maker.put("/api/policies/other/made", body).body == denied_object  # not a login vhost
    assert maker.delete("/api/policies/other/theirs").body == denied_object
    assert maker.delete("/api/policies/%2F/made").status == 204
    assert maker.put("/api/operator-policies/%2F/op", body).body == not_admin
    assert maker.get("/api/operator-policies/%2F").body == not_admin

    monitor = add_user(api, "monitor", "monitoring")  # no permission entries: sees no policies
    assert monitor.ok("/api/policies") == []
    assert api.get("/api/policies", auth=False).status == 401


# -- effects -------------------------------------------------------------------------------------------


def test_policies_apply_to_queues_at_once(clean_mgmt: ServerInfo):
    api = Api(clean_mgmt.mgmt_url)
    for name in ("orders.eu", "orders.us", "other"):
        assert api.put(f"/api/queues/%2F/{name}", {"durable": True}).status == 201
    assert api.put("/api/queues/%2F/orders.capped", {"arguments": {"x-max-length": 500}}).status == 201
    assert policy_fields(api, "orders.eu") == (None, None, {})

    low = {"pattern": "^orders\\.", "definition": {"max-length": 1000, "dead-letter-exchange": "dlx"},
           "priority": 0, "apply-to": "queues"}
    assert api.put("/api/policies/%2F/orders-low", low).status == 201
    assert policy_fields(api, "orders.eu") == ("orders-low", None, low["definition"])
    assert policy_fields(api, "other") == (None, None, {})
    # a higher priority policy replaces it (definitions are not merged)
    high = {"pattern": "\\.eu$", "definition": {"message-ttl": 5000}, "priority": 10}
    assert api.put("/api/policies/%2F/eu-high", high).status == 201
    assert policy_fields(api, "orders.eu") == ("eu-high", None, {"message-ttl": 5000})
    assert policy_fields(api, "orders.us")[0] == "orders-low"
    # a policy for exchanges only does not touch queues
    assert api.put("/api/policies/%2F/x-only", {"pattern": ".*", "definition": {"alternate-exchange": "ae"},
                                                "priority": 99, "apply-to": "exchanges"}).status == 201
    assert policy_fields(api, "orders.us")[0] == "orders-low"

    # an operator policy: numeric keys merge to the smaller value, the rest to the operator's
    guard = {"pattern": ".*", "definition": {"max-length": 200, "message-ttl": 60000}, "apply-to": "queues"}
    assert api.put("/api/operator-policies/%2F/guard", guard).status == 201
    assert policy_fields(api, "orders.us") == ("orders-low", "guard", {
        "max-length": 200, "dead-letter-exchange": "dlx", "message-ttl": 60000})
    assert policy_fields(api, "orders.eu") == ("eu-high", "guard", {"max-length": 200, "message-ttl": 5000})
    assert policy_fields(api, "other") == (None, "guard", guard["definition"])
    assert queue(api, "orders.capped")["arguments"] == {"x-max-length": 500}  # arguments stay as declared

    # a queue declared later gets its policies at declare time, exclusive ones included
    conn = connect(clean_mgmt.amqp_port)
    ch = conn.channel()
    ch.queue_declare("orders.new.eu", exclusive=True)
    assert policy_fields(api, "orders.new.eu") == ("eu-high", "guard", {"max-length": 200, "message-ttl": 5000})
    conn.close()

    # clearing takes effect at once too
    assert api.delete("/api/policies/%2F/eu-high").status == 204
    assert policy_fields(api, "orders.eu")[0] == "orders-low"
    assert api.delete("/api/operator-policies/%2F/guard").status == 204
    assert api.delete("/api/policies/%2F/orders-low").status == 204
    assert policy_fields(api, "orders.eu") == (None, None, {})

    # hutchctl list_queues shows the policy column
    assert api.put("/api/policies/%2F/orders-low", low).status == 201
    out = run_ctl(clean_mgmt, "-q", "list_queues", "name", "policy")
    assert out.returncode == 0, out.stderr
    assert [line.split() for line in out.stdout.splitlines()] == [
        ["name", "policy"], ["orders.capped", "orders-low"], ["orders.eu", "orders-low"],
        ["orders.us", "orders-low"], ["other"]]


def test_a_policy_limit_takes_effect_on_messages(clean_mgmt: ServerInfo):
    """max-length from a policy, enforced by the classic queue (drop-head) as soon as it is set, and
    capped further by an operator policy below the client's x-max-length."""
    api = Api(clean_mgmt.mgmt_url)
    conn = connect(clean_mgmt.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("capped")
    ch.queue_declare("client-capped", arguments={"x-max-length": 4})
    for i in range(5):
        ch.basic_publish("", "capped", str(i).encode())
        ch.basic_publish("", "client-capped", str(i).encode())
    assert api.put("/api/policies/%2F/cap", {"pattern": "capped$", "definition": {"max-length": 2}}).status == 201
    assert queue(api, "capped")["messages"] == 2  # the oldest went at once
    assert queue(api, "client-capped")["messages"] == 4  # the x-argument beats the policy
    assert api.put("/api/operator-policies/%2F/guard", {"pattern": "^client", "definition": {"max-length": 1},
                                                        "apply-to": "queues"}).status == 201
    assert queue(api, "client-capped")["messages"] == 1  # the operator policy caps the x-argument
    assert [ch.basic_get(q, auto_ack=True)[2] for q in ("capped", "capped", "client-capped")] == [b"3", b"4", b"4"]
    conn.close()


def _publish_and_get(ch, exchange: str, routing_key: str, queue_name: str) -> bytes | None:
    ch.basic_publish(exchange, routing_key, b"unroutable")
    method, _props, body = ch.basic_get(queue_name, auto_ack=True)
    return body if method is not None else None


def test_alternate_exchange_from_a_policy(clean_mgmt: ServerInfo):
    api = Api(clean_mgmt.mgmt_url)
    conn = connect(clean_mgmt.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("ae", "fanout")
    ch.queue_declare("caught")
    ch.queue_bind("caught", "ae")
    ch.exchange_declare("arg-ae", "fanout")
    ch.queue_declare("caught-by-arg")
    ch.queue_bind("caught-by-arg", "arg-ae")
    ch.exchange_declare("src", "direct")
    ch.exchange_declare("src.own", "direct", arguments={"alternate-exchange": "arg-ae"})
    assert _publish_and_get(ch, "src", "nowhere", "caught") is None

    body = {"pattern": "^src", "definition": {"alternate-exchange": "ae"}, "apply-to": "exchanges"}
    assert api.put("/api/policies/%2F/ae-pol", body).status == 201
    assert api.ok("/api/exchanges/%2F/src")["policy"] == "ae-pol"
    assert api.ok("/api/exchanges/%2F/ae")["policy"] is None
    assert _publish_and_get(ch, "src", "nowhere", "caught") == b"unroutable"
    # an alternate-exchange argument beats the policy
    assert _publish_and_get(ch, "src.own", "nowhere", "caught-by-arg") == b"unroutable"
    assert _publish_and_get(ch, "src.own", "nowhere", "caught") is None
    # an exchange declared after the policy gets it too
    ch.exchange_declare("src.later", "topic")
    assert _publish_and_get(ch, "src.later", "a.b", "caught") == b"unroutable"
    # a policy that applies to queues only does not give exchanges an alternate exchange
    assert api.put("/api/policies/%2F/ae-pol", {**body, "apply-to": "queues"}).status == 204
    assert api.ok("/api/exchanges/%2F/src")["policy"] is None
    assert _publish_and_get(ch, "src", "nowhere", "caught") is None
    assert api.put("/api/policies/%2F/ae-pol", body).status == 204
    assert _publish_and_get(ch, "src", "nowhere", "caught") == b"unroutable"
    # cleared: unroutable again (mandatory publishes come back)
    assert api.delete("/api/policies/%2F/ae-pol").status == 204
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("src", "nowhere", b"x", mandatory=True)
    assert _publish_and_get(ch, "src.own", "nowhere", "caught-by-arg") == b"unroutable"
    conn.close()


# -- hutchctl ------------------------------------------------------------------------------------------


def ok(info, *args: str) -> str:
    proc = run_ctl(info, *args)
    assert proc.returncode == 0, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr == ""
    return proc.stdout


def fails(info, code: int, *args: str) -> str:
    proc = run_ctl(info, *args)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # exactly one line
    return proc.stderr.rstrip("\n")


def test_hutchctl_policy_commands(clean_mgmt: ServerInfo):
    s = clean_mgmt
    assert ok(s, "set_policy", "--priority", "2", "--apply-to", "queues", "limits", "^orders\\.",
              '{"max-length": 100}') == (
        'Setting policy "limits" for pattern "^orders\\." to "{"max-length": 100}" with priority "2" '
        'for vhost "/" ...\n')
    ok(s, "-q", "set_policy", "ttl", ".*", '{"message-ttl":60000}')
    out = ok(s, "list_policies").splitlines()
    assert out[0] == 'Listing policies for vhost "/" ...'
    assert [line.split("\t") for line in out[1:]] == [
        ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
        ["/", "ttl", ".*", "all", '{"message-ttl":60000}', "0"],
        ["/", "limits", "^orders\\.", "queues", '{"max-length":100}', "2"]]
    assert json.loads(ok(s, "--formatter", "json", "list_policies")) == [
        {"vhost": "/", "name": "ttl", "pattern": ".*", "apply-to": "all", "definition": {"message-ttl": 60000},
         "priority": 0},
        {"vhost": "/", "name": "limits", "pattern": "^orders\\.", "apply-to": "queues",
         "definition": {"max-length": 100}, "priority": 2}]

    assert fails(s, 1, "set_policy", "bad", ".*", '{"max-length": -1}') == (
        "hutchctl: Validation failed: -1 is not a valid maximum length")
    assert fails(s, 1, "set_policy", "bad", ".*", '{"max_length": 1}') == (
        'hutchctl: Validation failed: ["max_length"] are not recognised policy settings')
    assert fails(s, 1, "set_policy", "bad", ".*", "{max-length: 1}").startswith(
        "hutchctl: Could not parse JSON document: ")
    assert fails(s, 1, "set_policy", "bad", "(", '{"max-length": 1}').startswith(
        'hutchctl: Validation failed: "(" is not a valid regular expression')
    assert fails(s, 1, "set_policy", "-p", "nope", "p", ".*", '{"max-length": 1}') == (
        'hutchctl: Virtual host "nope" does not exist')
    assert fails(s, 2, "set_policy", "p", ".*").startswith("hutchctl: error: ")
    assert fails(s, 2, "set_policy", "--priority", "high", "p", ".*", "{}").startswith("hutchctl: error: ")
    assert fails(s, 1, "list_policies", "-p", "nope") == 'hutchctl: Virtual host "nope" does not exist'

    api = Api(s.mgmt_url)
    assert api.put("/api/queues/%2F/orders.eu", {}).status == 201
    assert policy_fields(api, "orders.eu")[0] == "limits"

    assert ok(s, "clear_policy", "limits") == 'Clearing policy "limits" on vhost "/" ...\n'
    assert policy_fields(api, "orders.eu")[0] == "ttl"
    assert fails(s, 1, "clear_policy", "limits") == "hutchctl: Parameter does not exist"
    assert fails(s, 1, "clear_policy", "-p", "nope", "limits") == 'hutchctl: Virtual host "nope" does not exist'

    # operator policies
    assert ok(s, "set_operator_policy", "--apply-to", "queues", "guard", ".*", '{"max-length": 10}') == (
        'Setting operator policy override "guard" for pattern ".*" to "{"max-length": 10}" with priority "0" '
        'for vhost "/" ...\n')
    assert ok(s, "-q", "--no-table-headers", "list_operator_policies") == (
        '/\tguard\t.*\tqueues\t{"max-length":10}\t0\n')
    assert ok(s, "list_operator_policies").startswith('Listing operator policy overrides for vhost "/" ...\n')
    assert policy_fields(api, "orders.eu") == ("ttl", "guard", {"message-ttl": 60000, "max-length": 10})
    assert json.loads(ok(s, "--formatter", "json", "list_queues", "name", "policy", "operator_policy",
                         "effective_policy_definition")) == [
        {"name": "orders.eu", "policy": "ttl", "operator_policy": "guard",
         "effective_policy_definition": {"message-ttl": 60000, "max-length": 10}}]
    assert fails(s, 1, "set_operator_policy", "bad", ".*", '{"dead-letter-exchange": "x"}') == (
        'hutchctl: Validation failed: ["dead-letter-exchange"] are not recognised operator policy settings')
    assert ok(s, "clear_operator_policy", "guard") == 'Clearing operator policy "guard" on vhost "/" ...\n'
    assert fails(s, 1, "clear_operator_policy", "guard") == "hutchctl: Parameter does not exist"
    assert ok(s, "-q", "list_operator_policies") == "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"

    # only administrators may change operator policies; policymakers may change policies
    api.put("/api/users/maker", {"password": "pw", "tags": "policymaker"})
    api.put("/api/permissions/%2F/maker", {"configure": ".*", "write": ".*", "read": ".*"})
    as_maker = ("--username", "maker", "--password", "pw")
    ok(s, *as_maker, "set_policy", "made", "^m", '{"expires": 1000}')
    assert fails(s, 1, *as_maker, "set_operator_policy", "op", ".*", '{"expires": 1000}') == (
        "hutchctl: access refused for user 'maker': Not administrator user")


# -- vhosts and persistence ----------------------------------------------------------------------------


def test_deleting_a_vhost_deletes_its_policies(clean_api: Api):
    api = clean_api
    assert api.put("/api/vhosts/tmp", {}).status == 201
    assert api.put("/api/policies/tmp/p", {"pattern": ".*", "definition": {"max-length": 1}}).status == 201
    assert api.put("/api/operator-policies/tmp/o", {"pattern": ".*", "definition": {"max-length": 1}}).status == 201
    assert api.delete("/api/vhosts/tmp").status == 204
    assert api.ok("/api/policies") == [] and api.ok("/api/operator-policies") == []
    assert api.put("/api/vhosts/tmp", {}).status == 201
    assert api.ok("/api/policies/tmp") == []


def _make(server: ServerInfo) -> None:
    api = Api(wait_mgmt(server).mgmt_url)
    assert api.put("/api/vhosts/tenant", {}).status == 201
    assert api.put("/api/queues/%2F/orders.eu", {"durable": True, "arguments": {"x-max-length": 5}}).status == 201
    assert api.put("/api/queues/tenant/work", {"durable": True}).status == 201
    assert api.put("/api/policies/%2F/orders", {"pattern": "^orders\\.", "priority": 7, "apply-to": "queues",
                                                "definition": {"max-length": 100, "max-length-bytes": 2**63 - 1}}).status == 201
    assert api.put("/api/policies/%2F/gone", {"pattern": ".*", "priority": 99,
                                              "definition": {"expires": 1000}}).status == 201
    assert api.delete("/api/policies/%2F/gone").status == 204
    assert api.put("/api/operator-policies/%2F/guard", {"pattern": ".*", "definition": {"max-length": 50},
                                                        "apply-to": "queues"}).status == 201
    assert api.put("/api/policies/tenant/t", {"pattern": "", "definition": {"expires": 9000}}).status == 201
    assert api.put("/api/policies/%2F/ae", {"pattern": "^src$", "apply-to": "exchanges",
                                            "definition": {"alternate-exchange": "ae"}}).status == 201
    # a vhost deleted and re-created keeps none of its old policies, after a restart too
    assert api.put("/api/vhosts/again", {}).status == 201
    assert api.put("/api/policies/again/old", {"pattern": ".*", "definition": {"expires": 5}}).status == 201
    assert api.delete("/api/vhosts/again").status == 204
    assert api.put("/api/vhosts/again", {}).status == 201
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.exchange_declare("ae", "fanout", durable=True)
    ch.queue_declare("caught", durable=True)
    ch.queue_bind("caught", "ae")
    ch.exchange_declare("src", "direct", durable=True)
    conn.close()


def _check(server: ServerInfo) -> None:
    api = Api(wait_mgmt(server).mgmt_url)
    assert [(p["vhost"], p["name"], p["priority"]) for p in api.ok("/api/policies")] == [
        ("/", "ae", 0), ("tenant", "t", 0), ("/", "orders", 7)]
    assert api.ok("/api/policies/%2F/orders")["definition"] == {"max-length": 100, "max-length-bytes": 2**63 - 1}
    assert api.ok("/api/operator-policies/%2F/guard")["apply-to"] == "queues"
    assert api.ok("/api/policies/again") == []
    assert policy_fields(api, "orders.eu") == ("orders", "guard", {"max-length": 50, "max-length-bytes": 2**63 - 1})
    assert policy_fields(api, "work", "tenant") == ("t", None, {"expires": 9000})
    assert api.ok("/api/exchanges/%2F/src")["policy"] == "ae"
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.confirm_delivery()
    assert _publish_and_get(ch, "src", "nowhere", "caught") == b"unroutable"
    conn.close()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_policies_survive_restart(tmp_path: Path, how: int):
    server = start_server(tmp_path)
    try:
        _make(server)
    finally:
        server.stop(how)
    for _ in range(2):  # the second start replays the compacted snapshot
        again = start_server(tmp_path)
        try:
            _check(again)
        finally:
            again.stop()
