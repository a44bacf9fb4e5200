"""hutchctl as a subprocess against a real node: every command, table and JSON output, error exits,
and that what it sets up holds over AMQP (pika)."""

from __future__ import annotations

import json
import socket

import pika
import pika.exceptions
import pytest

from .helpers import Api, connect, run_ctl, unique


def ok(info, *args: str, **kwargs) -> str:
    proc = run_ctl(info, *args, **kwargs)
    assert proc.returncode == 0, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr == ""
    return proc.stdout


def fails(info, code: int, *args: str, **kwargs) -> str:
    proc = run_ctl(info, *args, **kwargs)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # exactly one line
    return proc.stderr.rstrip("\n")


def rows(table: str) -> list[list[str]]:
    return [line.split("\t") for line in table.splitlines()]  # an empty cell stays a column


def test_user_vhost_and_permission_commands(fresh_mgmt):
    s = fresh_mgmt
    assert ok(s, "add_user", "bob", "s3cret") == 'Adding user "bob" ...\n'
    assert fails(s, 1, "add_user", "bob", "x") == 'hutchctl: User "bob" already exists'
    ok(s, "set_user_tags", "bob", "management", "policymaker")
    assert ok(s, "list_users") == ("Listing users ...\n"
                                   "user\ttags\n"
                                   "bob\t[management, policymaker]\n"
                                   "guest\t[administrator]\n")  # tab-separated, as rabbitmqctl
    assert json.loads(ok(s, "--formatter", "json", "list_users")) == [
        {"user": "bob", "tags": ["management", "policymaker"]}, {"user": "guest", "tags": ["administrator"]}]
    # set_user_tags keeps the password, change_password keeps the tags
    bob = Api(s.mgmt_url, "bob", "s3cret")
    assert bob.get("/api/whoami").body == {"name": "bob", "tags": ["management", "policymaker"]}
    ok(s, "change_password", "bob", "n3w")
    assert Api(s.mgmt_url, "bob", "n3w").get("/api/whoami").body["tags"] == ["management", "policymaker"]
    assert bob.get("/api/whoami").status == 401

    assert ok(s, "-q", "add_vhost", "dev", "--description", "Development") == ""
    assert fails(s, 1, "add_vhost", "dev") == 'hutchctl: Virtual host "dev" already exists'
    assert ok(s, "list_vhosts", "name", "description") == ("Listing vhosts ...\n"
                                                           "name\tdescription\n"
                                                           "/\tDefault virtual host\n"
                                                           "dev\tDevelopment\n")
    # like rabbitmqctl, add_vhost grants nobody anything
    assert ok(s, "-q", "list_permissions", "-p", "dev") == "user\tconfigure\twrite\tread\n"

    assert ok(s, "set_permissions", "-p", "dev", "bob", "^bob-", ".*", "") == (
        'Setting permissions for user "bob" in vhost "dev" ...\n')
    assert rows(ok(s, "-q", "--no-table-headers", "list_permissions", "--vhost", "dev")) == [["bob", "^bob-", ".*", ""]]
    assert json.loads(ok(s, "--formatter", "json", "list_user_permissions", "bob")) == [
        {"vhost": "dev", "configure": "^bob-", "write": ".*", "read": ""}]
    assert fails(s, 1, "set_permissions", "-p", "nope", "bob", ".*", ".*", ".*") == (
        'hutchctl: Virtual host "nope" does not exist')
    assert fails(s, 1, "set_permissions", "ghost", ".*", ".*", ".*") == 'hutchctl: User "ghost" does not exist'
    assert "invalid configure permission regex" in fails(s, 1, "set_permissions", "bob", "(", "", "")
    ok(s, "clear_permissions", "-p", "dev", "bob")
    ok(s, "clear_permissions", "-p", "dev", "bob")  # nothing left to clear: still fine
    assert ok(s, "-q", "list_user_permissions", "bob") == "vhost\tconfigure\twrite\tread\n"

    assert ok(s, "delete_user", "bob") == 'Deleting user "bob" ...\n'
    assert fails(s, 1, "delete_user", "bob") == 'hutchctl: User "bob" does not exist'
    assert fails(s, 1, "change_password", "bob", "x") == 'hutchctl: User "bob" does not exist'
    assert fails(s, 1, "list_user_permissions", "bob") == 'hutchctl: User "bob" does not exist'
    ok(s, "delete_vhost", "dev")
    assert fails(s, 1, "delete_vhost", "dev") == 'hutchctl: Virtual host "dev" does not exist'
    assert fails(s, 1, "list_queues", "-p", "dev") == 'hutchctl: Virtual host "dev" does not exist'


def test_added_user_connects_and_permissions_are_enforced(fresh_mgmt):
    s = fresh_mgmt
    ok(s, "add_user", "app", "app-pw")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(s.amqp_port, "app", "app-pw")  # no permission entry on "/" yet: vhost access refused
    ok(s, "set_permissions", "app", "^app-", ".*", ".*")
    conn = connect(s.amqp_port, "app", "app-pw")
    ch = conn.channel()
    ch.queue_declare("app-jobs")
    ch.basic_publish("", "app-jobs", b"job")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("other")
    assert info.value.reply_code == 403
    assert "configure access to queue 'other' in vhost '/' refused for user 'app'" in info.value.reply_text

    # tightened permissions apply to the open connection's next operation
    ok(s, "set_permissions", "app", "", ".*", ".*")
    ch2 = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch2.queue_declare("app-more")
    assert info.value.reply_code == 403
    assert rows(ok(s, "-q", "list_queues", "name", "messages"))[1:] == [["app-jobs", "1"]]
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(s.amqp_port, "app", "wrong")


def test_list_commands_table_and_json(mgmt):
    s = mgmt
    q = unique("ctlq")
    x = unique("ctlx")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", s.amqp_port, client_properties={"connection_name": "ctl-test"}))
    ch = conn.channel()
    ch.exchange_declare(x, "fanout")
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, x, "rk")
    ch.basic_publish("", q, b"one")
    ch.basic_publish("", q, b"two")
    tag = ch.basic_consume(q, lambda *a: None)
    conn.process_data_events(time_limit=0.2)
    try:
        table = ok(s, "list_queues", "name", "messages", "consumers", "durable")
        assert table.splitlines()[:2] == ["Listing queues for vhost / ...",
                                          table.splitlines()[1]]
        assert rows(table)[1] == ["name", "messages", "consumers", "durable"]
        assert [q, "2", "1", "true"] in rows(table)
        assert rows(ok(s, "-q", "list_queues", "name,messages"))[0] == ["name", "messages"]
        as_json = json.loads(ok(s, "--formatter", "json", "list_queues", "name", "messages_unacknowledged"))
        assert {"name": q, "messages_unacknowledged": 2} in as_json
        paging = json.loads(ok(s, "--formatter", "json", "list_queues", "name", "messages_ram", "messages_paged_out"))
        assert {"name": q, "messages_ram": 0, "messages_paged_out": 0} in paging

        exchanges = rows(ok(s, "-q", "list_exchanges"))
        assert exchanges[0] == ["name", "type"] and [x, "fanout"] in exchanges and ["", "direct"] in exchanges
        assert {"name": x, "type": "fanout", "durable": False} in json.loads(
            ok(s, "--formatter", "json", "list_exchanges", "name", "type", "durable"))

        bindings = json.loads(ok(s, "--formatter", "json", "list_bindings"))
        assert {"source_name": x, "source_kind": "exchange", "destination_name": q, "destination_kind": "queue",
                "routing_key": "rk", "arguments": {}} in bindings
        assert {"source_name": "", "source_kind": "exchange", "destination_name": q, "destination_kind": "queue",
                "routing_key": q, "arguments": {}} in bindings

        connections = json.loads(ok(s, "--formatter", "json", "list_connections", "user", "state",
                                    "user_provided_name", "vhost"))
        assert {"user": "guest", "state": "running", "user_provided_name": "ctl-test", "vhost": "/"} in connections
        assert rows(ok(s, "-q", "list_connections"))[0] == ["user", "peer_host", "peer_port", "state"]

        channels = json.loads(ok(s, "--formatter", "json", "list_channels", "connection", "number",
                                 "consumer_count", "messages_unacknowledged"))
        mine = [c for c in channels if c["consumer_count"] == 1 and c["messages_unacknowledged"] == 2]
        assert mine and mine[0]["number"] == 1

        consumers = json.loads(ok(s, "--formatter", "json", "list_consumers"))
        mine = [c for c in consumers if c["queue_name"] == q]
        assert len(mine) == 1
        assert (mine[0]["consumer_tag"], mine[0]["ack_required"], mine[0]["active"]) == (tag, True, True)
        assert mine[0]["channel_pid"].endswith(" (1)")  # rabbitmqctl's column; the channel's name, not a pid
        assert rows(ok(s, "-q", "list_consumers"))[0] == [
            "queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"]
    finally:
        conn.close()
        Api(s.mgmt_url).delete(f"/api/queues/%2F/{q}")
        Api(s.mgmt_url).delete(f"/api/exchanges/%2F/{x}")


def test_status(mgmt):
    out = ok(mgmt, "status")
    assert out.startswith("Status of node test@localhost ...\nNode: test@localhost\n")
    for label in ("Uptime (seconds):", "Memory used:", "File descriptors:", "Connections:", "Listeners: amqp"):
        assert label in out
    doc = json.loads(ok(mgmt, "--formatter", "json", "status"))
    assert doc["overview"]["node"] == "test@localhost" and doc["node"]["running"] is True


def test_errors(mgmt):
    s = mgmt
    assert fails(s, 2) == "hutchctl: error: the following arguments are required: COMMAND"
    assert fails(s, 2, "frobnicate").startswith("hutchctl: error: argument COMMAND: invalid choice: 'frobnicate'")
    assert fails(s, 2, "add_user", "only-name") == "hutchctl: error: the following arguments are required: PASSWORD"
    assert fails(s, 2, "delete_user", "a", "b") == "hutchctl: error: unrecognized arguments: b"
    assert fails(s, 2, "list_queues", "bogus").startswith("hutchctl: error: invalid column 'bogus' for list_queues")
    assert fails(s, 2, "--formatter", "xml", "status").startswith("hutchctl: error: argument --formatter")
    assert fails(s, 2, "status", env={"HUTCH_MANAGEMENT_PORT": "http"}) == (
        "hutchctl: error: HUTCH_MANAGEMENT_PORT: expected a port number, got 'http'")
    assert fails(s, 1, "delete_user", "no-such-user") == 'hutchctl: User "no-such-user" does not exist'
    assert fails(s, 1, "--password", "wrong", "list_users") == "hutchctl: authentication failed for user 'guest'"
    assert fails(s, 1, "list_users", env={"HUTCH_PASSWORD": "wrong"}) == (
        "hutchctl: authentication failed for user 'guest'")

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]  # bound, not listening: connection refused
        message = fails(None, 69, "list_users", port=dead_port)
    assert message == f"hutchctl: cannot reach node at http://127.0.0.1:{dead_port}: Connection refused"
    assert fails(None, 69, "--port", str(dead_port), "status", port=1) == (
        f"hutchctl: cannot reach node at http://127.0.0.1:{dead_port}: Connection refused")

    proc = run_ctl(s, "--help")
    assert proc.returncode == 0 and "set_permissions" in proc.stdout
