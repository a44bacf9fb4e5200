"""Issue 15, finding 6: policy, operator-policy, permission and topic-permission patterns are RE2.

A pattern that makes a backtracking engine run for seconds (`(.*.*)*(.*.*)*#`) must not stall the
node when a client declares a queue whose name it is matched against; a pattern RE2 cannot compile
(PCRE's lookahead) is refused when set (400 with the reason), and one that is already stored (a
definitions file loaded at boot) is logged and matches nothing instead of stopping the node.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, StallProbe, connect, unique, wait_mgmt

CATASTROPHIC = "(.*.*)*(.*.*)*#"  # Python's re: ~2 s on a 12-character name without '#', doubling per char
LOOKAHEAD = "^(?!amq\\.).*"  # valid PCRE (RabbitMQ's docs use it), refused by RE2


def test_catastrophic_policy_pattern_does_not_stall_other_clients(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    reply = clean_api.put("/api/policies/%2F/slow", {"pattern": CATASTROPHIC, "apply-to": "queues",
                                                     "definition": {"max-length": 10}})
    assert reply.status in (201, 204), reply.body
    with StallProbe(clean_mgmt.amqp_port, interval_s=0.01) as prober:
        time.sleep(0.2)
        conn = connect(clean_mgmt.amqp_port)
        started = time.monotonic()
        conn.channel().queue_declare("a" * 12)  # no '#': the backtracking engine tries every split
        declare_s = time.monotonic() - started
        conn.close()
        time.sleep(0.2)
    assert prober.rounds > 5
    assert declare_s < 1.0, declare_s
    assert prober.longest_s < 1.0, f"a second client waited {prober.longest_s:.2f} s for one round trip"
    # the policy still applies (RE2 matches the same language): a name with '#' gets it
    conn = connect(clean_mgmt.amqp_port)
    conn.channel().queue_declare("with#hash")
    conn.close()
    assert clean_api.ok("/api/queues/%2F/with%23hash")["policy"] == "slow"
    assert clean_api.ok("/api/queues/%2F/" + "a" * 12).get("policy") is None


@pytest.mark.parametrize("path", ["/api/policies/%2F/ahead", "/api/operator-policies/%2F/ahead"])
def test_policy_pattern_re2_refuses_is_400_with_the_reason(api: Api, path: str) -> None:
    reply = api.put(path, {"pattern": LOOKAHEAD, "definition": {"max-length": 5}})
    assert reply.status == 400
    assert "is not a valid regular expression" in reply.body["reason"]
    assert "(?!" in reply.body["reason"]
    assert api.get(path).status == 404


def test_permission_regex_re2_refuses_is_400(api: Api) -> None:
    user = unique("u")
    assert api.put(f"/api/users/{user}", {"password": "pw", "tags": ""}).status == 201
    try:
        reply = api.put(f"/api/permissions/%2F/{user}", {"configure": LOOKAHEAD, "write": ".*", "read": ".*"})
        assert reply.status == 400
        assert "invalid configure permission regex" in reply.body["reason"]
        reply = api.put(f"/api/topic-permissions/%2F/{user}", {"exchange": "amq.topic", "write": "(a)\\1",
                                                              "read": ".*"})
        assert reply.status == 400
        assert "invalid regular expression" in reply.body["reason"]
    finally:
        api.delete(f"/api/users/{user}")


def test_definitions_import_with_lookahead_is_400(api: Api) -> None:
    doc = {"policies": [{"vhost": "/", "name": unique("p"), "pattern": LOOKAHEAD, "apply-to": "queues",
                         "definition": {"max-length": 1}, "priority": 0}]}
    reply = api.call("POST", "/api/definitions", doc)
    assert reply.status == 400
    assert "is not a valid regular expression" in reply.body["reason"]


def test_topic_permission_is_matched_by_re2(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    user = "topic-user"
    assert clean_api.put(f"/api/users/{user}", {"password": "pw", "tags": ""}).status == 201
    assert clean_api.put(f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"}).status \
        in (201, 204)
    assert clean_api.put(f"/api/topic-permissions/%2F/{user}",
                         {"exchange": "amq.topic", "write": CATASTROPHIC, "read": ".*"}).status in (201, 204)
    conn = connect(clean_mgmt.amqp_port, user, "pw")
    ch = conn.channel()
    ch.confirm_delivery()
    started = time.monotonic()
    ch.basic_publish("amq.topic", "ok.#", b"x")  # matches
    other = conn.channel()
    other.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        other.basic_publish("amq.topic", "a" * 12, b"x")  # no '#': refused, at once
    assert refused.value.reply_code == 403
    assert time.monotonic() - started < 1.0
    conn.close()


def test_boot_definitions_with_lookahead_start_and_match_nothing(tmp_path: Path) -> None:
    defs = {"users": [{"name": "guest", "password": "guest", "tags": ["administrator"]}],
            "vhosts": [{"name": "/"}],
            "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
            "policies": [{"vhost": "/", "name": "ahead", "pattern": LOOKAHEAD, "apply-to": "queues",
                          "definition": {"max-length": 1}, "priority": 0}]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    info = start_server(tmp_path, config_text=f"load_definitions = {path}\n")
    try:
        wait_mgmt(info)
        api = Api(info.mgmt_url)
        assert api.ok("/api/policies/%2F/ahead")["pattern"] == LOOKAHEAD
        conn = connect(info.amqp_port)
        conn.channel().queue_declare("orders")
        conn.close()
        assert api.ok("/api/queues/%2F/orders").get("policy") is None
        log = info.log()
        assert "pattern of policy 'ahead' in vhost '/'" in log and "matches nothing" in log
    finally:
        info.stop()
