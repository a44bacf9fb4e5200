"""Vhost and user limits through real clients: pika connections, channels and declares refused past a
limit with RabbitMQ 4.x's codes and texts, the HTTP API (/api/vhost-limits, /api/user-limits and the
vhost-limits parameter), hutchctl's set/clear/list commands, definitions import and export, and a
restart (limits are durable definitions). The cluster case is in tests/cluster/test_limits_cluster.py.
"""

from __future__ import annotations

import json

import pika
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, connect, run_ctl, wait_mgmt

V = "%2F"


def _refused(port: int, **kw: str) -> str:
    with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
        connect(port, **kw).close()
    return str(info.value)


def _add_user(api: Api, name: str, vhost: str = V) -> None:
    assert api.put(f"/api/users/{name}", {"password": name, "tags": ""}).status in (201, 204)
    assert api.put(f"/api/permissions/{vhost}/{name}",
                   {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)


# -- vhost max-connections -------------------------------------------------------------------------


def test_vhost_max_connections_refuses_the_next_connection(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    assert clean_api.put(f"/api/vhost-limits/{V}/max-connections", {"value": 2}).status == 204
    first, second = connect(clean_mgmt.amqp_port), connect(clean_mgmt.amqp_port)
    text = _refused(clean_mgmt.amqp_port)
    assert "(530)" in text
    assert "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached" in text
    first.close()
    third = connect(clean_mgmt.amqp_port)  # a closed connection frees its place
    third.close()
    second.close()


def test_vhost_max_connections_zero_forbids_and_minus_one_lifts(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    clean_api.put(f"/api/vhost-limits/{V}/max-connections", {"value": 0})
    assert "connection limit (0) is reached" in _refused(clean_mgmt.amqp_port)
    clean_api.put(f"/api/vhost-limits/{V}/max-connections", {"value": -1})
    conns = [connect(clean_mgmt.amqp_port) for _ in range(3)]
    for c in conns:
        c.close()


# -- vhost max-queues ------------------------------------------------------------------------------


def test_vhost_max_queues_refuses_a_new_queue_with_406(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    conn = connect(clean_mgmt.amqp_port)
    ch = conn.channel()
    ch.queue_declare("lq-1")
    ch.queue_declare("lq-2", durable=True)
    assert clean_api.put(f"/api/vhost-limits/{V}/max-queues", {"value": 2}).status == 204
    ch.queue_declare("lq-1")  # redeclaring an existing queue is not a new one
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("lq-3")
    assert info.value.reply_code == 406
    assert info.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue 'lq-3': queue limit in vhost '/' "
                                     "(2) is reached")
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("", exclusive=True)  # server-named queues count too
    assert info.value.reply_code == 406
    ch = conn.channel()
    ch.queue_delete("lq-1")
    ch.queue_declare("lq-3")
    # the HTTP API's declare is refused the same way
    reply = clean_api.put(f"/api/queues/{V}/lq-4", {"durable": True})
    assert reply.status == 400
    assert reply.body["reason"] == "cannot declare queue 'lq-4': queue limit in vhost '/' (2) is reached"
    conn.close()


# -- user limits -----------------------------------------------------------------------------------


def test_user_max_connections(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    _add_user(clean_api, "lim")
    assert clean_api.put("/api/user-limits/lim/max-connections", {"value": 1}).status == 204
    held = connect(clean_mgmt.amqp_port, user="lim", password="lim")
    text = _refused(clean_mgmt.amqp_port, user="lim", password="lim")
    assert "(530)" in text
    assert "NOT_ALLOWED - connection refused for user 'lim': user connection limit (1) is reached" in text
    other = connect(clean_mgmt.amqp_port)  # guest is not limited
    other.close()
    held.close()


def test_user_max_channels_closes_the_connection_with_530(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    _add_user(clean_api, "chans")
    clean_api.put("/api/user-limits/chans/max-channels", {"value": 2})
    a = connect(clean_mgmt.amqp_port, user="chans", password="chans")
    b = connect(clean_mgmt.amqp_port, user="chans", password="chans")
    a.channel()
    b.channel()  # two channels over two connections: the user's limit is reached
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        b.channel()
    assert info.value.reply_code == 530
    assert info.value.reply_text == ("NOT_ALLOWED - number of channels opened for user 'chans' has reached the "
                                     "maximum allowed user limit of 2")
    assert a.is_open
    a.close()


def test_deleting_a_user_drops_its_limits(clean_api: Api) -> None:
    _add_user(clean_api, "gone")
    clean_api.put("/api/user-limits/gone/max-channels", {"value": 3})
    assert clean_api.delete("/api/users/gone").status == 204
    _add_user(clean_api, "gone")
    assert clean_api.ok("/api/user-limits/gone") == []


# -- the HTTP API ----------------------------------------------------------------------------------


def test_limits_api_shapes_and_errors(clean_api: Api) -> None:
    assert clean_api.ok("/api/vhost-limits") == []
    clean_api.put(f"/api/vhost-limits/{V}/max-queues", {"value": 10})
    clean_api.put(f"/api/vhost-limits/{V}/max-connections", {"value": 5})
    assert clean_api.ok("/api/vhost-limits") == [{"vhost": "/", "value": {"max-connections": 5, "max-queues": 10}}]
    assert clean_api.ok(f"/api/vhost-limits/{V}") == [{"vhost": "/", "value": {"max-connections": 5,
                                                                               "max-queues": 10}}]
    assert clean_api.ok(f"/api/parameters/vhost-limits/{V}/limits")["value"] == {"max-connections": 5,
                                                                                  "max-queues": 10}
    assert clean_api.delete(f"/api/vhost-limits/{V}/max-queues").status == 204
    assert clean_api.ok(f"/api/vhost-limits/{V}") == [{"vhost": "/", "value": {"max-connections": 5}}]

    bad = clean_api.put(f"/api/vhost-limits/{V}/max-queues", {"value": "many"})
    assert bad.status == 400
    assert bad.body["reason"] == 'Validation failed\n\nmax-queues should be a number, actually was <<"many">>\n'
    bad = clean_api.put(f"/api/vhost-limits/{V}/max-widgets", {"value": 1})
    assert bad.status == 400 and "Unrecognised terms [{<<\"max-widgets\">>,1}] in limits" in bad.body["reason"]
    assert clean_api.put(f"/api/vhost-limits/{V}/max-queues", {}).body["reason"] == "[{key_missing,value}]"
    missing = clean_api.put("/api/vhost-limits/nope/max-queues", {"value": 1})
    assert (missing.status, missing.body["reason"]) == (404, "vhost_not_found")
    assert clean_api.get("/api/vhost-limits/nope").status == 404

    _add_user(clean_api, "u1")
    assert clean_api.put("/api/user-limits/u1/max-channels", {"value": 7}).status == 204
    clean_api.put("/api/user-limits/u1/max-connections", {"value": 3})
    assert clean_api.ok("/api/user-limits") == [{"user": "u1", "value": {"max-channels": 7, "max-connections": 3}}]
    clean_api.put("/api/users/me", {"password": "me", "tags": "management"})
    me = clean_api.as_user("me", "me")
    assert (me.get("/api/user-limits/me").status, me.get("/api/user-limits/u1").status) == (200, 401)
    bad = clean_api.put("/api/user-limits/u1/max-queues", {"value": 1})
    assert (bad.status, bad.body["reason"]) == (400, 'Unrecognised terms [{<<"max-queues">>,1}] in user-limits')
    assert clean_api.put("/api/user-limits/nobody/max-channels", {"value": 1}).status == 404
    assert clean_api.delete("/api/user-limits/u1/all").status == 204
    assert clean_api.ok("/api/user-limits") == []


def test_only_administrators_change_limits(clean_api: Api) -> None:
    clean_api.put("/api/users/mon", {"password": "mon", "tags": "monitoring"})
    mon = clean_api.as_user("mon", "mon")
    reply = mon.put(f"/api/vhost-limits/{V}/max-queues", {"value": 1})
    assert (reply.status, reply.body["reason"]) == (401, "Not administrator user")
    assert mon.put("/api/user-limits/guest/max-channels", {"value": 1}).status == 401
    assert mon.get("/api/user-limits").status == 401
    assert mon.get("/api/user-limits/guest").status == 200  # monitors may read one user's


# -- hutchctl --------------------------------------------------------------------------------------


def test_hutchctl_limit_commands(clean_mgmt: ServerInfo, clean_api: Api) -> None:
    done = run_ctl(clean_mgmt, "set_vhost_limits", "-p", "/", '{"max-connections": 256, "max-queues": 9}')
    assert done.returncode == 0, done.stderr
    assert 'Setting vhost limits to "{"max-connections": 256, "max-queues": 9}" for vhost "/" ...' in done.stdout
    assert clean_api.ok(f"/api/vhost-limits/{V}")[0]["value"] == {"max-connections": 256, "max-queues": 9}
    # set_vhost_limits replaces the whole document, as rabbitmqctl's
    assert run_ctl(clean_mgmt, "set_vhost_limits", '{"max-queues": 4}').returncode == 0
    assert clean_api.ok(f"/api/vhost-limits/{V}")[0]["value"] == {"max-queues": 4}
    listed = run_ctl(clean_mgmt, "list_vhost_limits", "--formatter", "json")
    assert json.loads(listed.stdout) == [{"vhost": "/", "limits": {"max-queues": 4}}]
    bad = run_ctl(clean_mgmt, "set_vhost_limits", '{"max-queues": "x"}')
    assert (bad.returncode, bad.stderr.strip()) == (1, 'hutchctl: max-queues should be a number, actually was <<"x">>')
    bad = run_ctl(clean_mgmt, "set_vhost_limits", "-p", "nope", '{"max-queues": 1}')
    assert (bad.returncode, bad.stderr.strip()) == (1, 'hutchctl: Virtual host "nope" does not exist')
    assert run_ctl(clean_mgmt, "clear_vhost_limits", "-p", "/").returncode == 0
    assert clean_api.ok("/api/vhost-limits") == []

    _add_user(clean_api, "cu")
    assert run_ctl(clean_mgmt, "set_user_limits", "cu", '{"max-connections": 2}').returncode == 0
    assert run_ctl(clean_mgmt, "set_user_limits", "cu", '{"max-channels": 20}').returncode == 0  # merged
    assert clean_api.ok("/api/user-limits/cu")[0]["value"] == {"max-connections": 2, "max-channels": 20}
    listed = run_ctl(clean_mgmt, "list_user_limits", "--user", "cu", "--formatter", "json")
    assert json.loads(listed.stdout) == [{"user": "cu", "limits": {"max-channels": 20, "max-connections": 2}}]
    done = run_ctl(clean_mgmt, "clear_user_limits", "cu", "max-channels")
    assert done.returncode == 0 and 'Clearing "max-channels" limit for user "cu" ...' in done.stdout
    assert clean_api.ok("/api/user-limits/cu")[0]["value"] == {"max-connections": 2}
    assert run_ctl(clean_mgmt, "clear_user_limits", "cu", "all").returncode == 0
    assert clean_api.ok("/api/user-limits/cu") == []
    bad = run_ctl(clean_mgmt, "set_user_limits", "nobody", '{"max-channels": 1}')
    assert (bad.returncode, bad.stderr.strip()) == (1, 'hutchctl: User "nobody" does not exist')


# -- definitions and restarts ----------------------------------------------------------------------

RABBIT_DOC = {
    "rabbit_version": "4.0.5",
    "rabbitmq_version": "4.0.5",
    "users": [{"name": "app", "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
               "tags": [], "limits": {"max-connections": 1, "max-channels": 5}}],
    "vhosts": [{"name": "/", "limits": [], "metadata": {"description": "", "tags": []}},
               {"name": "shop", "limits": {"max-queues": 1},
                "metadata": {"description": "", "tags": [], "default_queue_type": "classic"}}],
    "permissions": [{"user": "app", "vhost": "shop", "configure": ".*", "write": ".*", "read": ".*"},
                    {"user": "guest", "vhost": "shop", "configure": ".*", "write": ".*", "read": ".*"}],
    "parameters": [{"value": {"max-queues": 1, "max-connections": 3}, "vhost": "shop",
                    "component": "vhost-limits", "name": "limits"}],
    "global_parameters": [], "policies": [], "exchanges": [], "bindings": [],
    "queues": [{"name": "orders", "vhost": "shop", "durable": True, "auto_delete": False, "arguments": {}}],
}


def test_rabbitmq_definitions_with_limits_import_and_export(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    reply = clean_api.call("POST", "/api/definitions", RABBIT_DOC)
    assert reply.status in (200, 204), reply.body
    assert clean_api.ok("/api/vhost-limits/shop") == [{"vhost": "shop", "value": {"max-connections": 3,
                                                                                   "max-queues": 1}}]
    assert clean_api.ok("/api/user-limits/app") == [{"user": "app", "value": {"max-channels": 5,
                                                                               "max-connections": 1}}]
    conn = connect(clean_mgmt.amqp_port, vhost="shop")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("second")
    assert "queue limit in vhost 'shop' (1) is reached" in info.value.reply_text
    conn.close()
    doc = clean_api.ok("/api/definitions")
    assert {"value": {"max-connections": 3, "max-queues": 1}, "vhost": "shop", "component": "vhost-limits",
            "name": "limits"} in doc["parameters"]
    assert [v["limits"] for v in doc["vhosts"] if v["name"] == "shop"] == [{"max-connections": 3, "max-queues": 1}]
    assert [u["limits"] for u in doc["users"] if u["name"] == "app"] == [{"max-channels": 5, "max-connections": 1}]
    per_vhost = clean_api.ok("/api/definitions/shop")
    assert [p["component"] for p in per_vhost["parameters"]] == ["vhost-limits"]


def test_import_past_max_queues_changes_nothing(clean_api: Api) -> None:
    doc = dict(RABBIT_DOC, queues=[{"name": f"q{i}", "vhost": "shop", "durable": True, "auto_delete": False,
                                    "arguments": {}} for i in range(2)])
    reply = clean_api.call("POST", "/api/definitions", doc)
    assert reply.status == 400
    assert reply.body["reason"] == ('Adding 2 queue(s) to virtual host "shop" would exceed the limit of 1 queue(s). '
                                    "This virtual host currently has 0 queue(s) defined. Import aborted!")
    assert clean_api.get("/api/vhosts/shop").status == 404
    bad = dict(RABBIT_DOC, parameters=[{"value": {"max-queues": "one"}, "vhost": "shop",
                                        "component": "vhost-limits", "name": "limits"}])
    reply = clean_api.call("POST", "/api/definitions", bad)
    assert reply.status == 400
    assert reply.body["reason"] == "limits of vhost 'shop': max-queues should be a number, actually was <<\"one\">>"


def test_limits_survive_a_restart(tmp_path) -> None:
    server = wait_mgmt(start_server(tmp_path))
    try:
        api = Api(server.mgmt_url)
        _add_user(api, "keep")
        api.put(f"/api/vhost-limits/{V}/max-connections", {"value": 1})
        api.put("/api/user-limits/keep/max-channels", {"value": 4})
    finally:
        server.stop()
    again = wait_mgmt(start_server(tmp_path))
    try:
        api = Api(again.mgmt_url)
        assert api.ok(f"/api/vhost-limits/{V}") == [{"vhost": "/", "value": {"max-connections": 1}}]
        assert api.ok("/api/user-limits/keep") == [{"user": "keep", "value": {"max-channels": 4}}]
        held = connect(again.amqp_port)
        assert "connection limit (1) is reached" in _refused(again.amqp_port)
        held.close()
    finally:
        again.stop()
