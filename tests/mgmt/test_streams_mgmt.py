"""Streams around the broker: the management API's view of a stream, policies (max-length-bytes,
max-age), definitions export and hutchctl list_queues, against a real node."""

from __future__ import annotations

import pika

from conftest import ServerInfo

from .helpers import Api, connect, run_ctl, unique, wait_for

STREAM = {"x-queue-type": "stream"}


def _publish(info: ServerInfo, name: str, count: int, size: int = 10, **arguments: object) -> None:
    conn = connect(info.amqp_port)
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", name, b"%04d" % i + b"x" * size, pika.BasicProperties())
    conn.close()


def test_a_stream_in_the_api_and_hutchctl(mgmt: ServerInfo, api: Api) -> None:
    name = unique("s")
    _publish(mgmt, name, 5)
    q = api.ok(f"/api/queues/%2F/{name}")
    assert q["type"] == "stream" and q["durable"] is True
    assert (q["messages"], q["first_offset"], q["last_offset"], q["committed_offset"]) == (5, 0, 4, 4)
    assert q["segments"] == 1 and q["leader"] == q["node"] and q["members"] == [q["node"]]
    defs = api.ok("/api/definitions")
    [exported] = [x for x in defs["queues"] if x["name"] == name]
    assert exported["arguments"]["x-queue-type"] == "stream" and exported["durable"] is True
    out = run_ctl(mgmt, "list_queues", "name", "type", "messages")
    assert out.returncode == 0, out.stderr
    assert any(line.split() == [name, "stream", "5"] for line in out.stdout.splitlines()), out.stdout
    out = run_ctl(mgmt, "list_queues", "name", "first_offset", "last_offset", "segments")
    assert any(line.split() == [name, "0", "4", "1"] for line in out.stdout.splitlines()), out.stdout
    assert api.delete(f"/api/queues/%2F/{name}").status == 204


def test_retention_policies(mgmt: ServerInfo, api: Api) -> None:
    name = unique("s")
    bad = api.put(f"/api/policies/%2F/{name}", {"pattern": f"^{name}$", "apply-to": "streams",
                                                   "definition": {"max-age": "soon"}})
    assert bad.status == 400
    _publish(mgmt, name, 40, size=100, **{"x-stream-max-segment-size-bytes": 1000})
    assert api.ok(f"/api/queues/%2F/{name}")["first_offset"] == 0
    ok = api.put(f"/api/policies/%2F/{name}", {"pattern": f"^{name}$", "apply-to": "streams",
                                                  "definition": {"max-length-bytes": 2000, "max-age": "7D"}})
    assert ok.status in (201, 204)
    assert wait_for(lambda: api.ok(f"/api/queues/%2F/{name}")["first_offset"] > 0)
    q = api.ok(f"/api/queues/%2F/{name}")
    assert q["effective_policy_definition"] == {"max-length-bytes": 2000, "max-age": "7D"}
    assert q["last_offset"] == 39 and q["message_bytes"] <= 2000 + 1000
    api.delete(f"/api/policies/%2F/{name}")
    api.delete(f"/api/queues/%2F/{name}")


def test_definitions_import_creates_a_stream(mgmt: ServerInfo, api: Api) -> None:
    name = unique("s")
    body = {"queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {"x-queue-type": "stream", "x-max-age": "1D"}}]}
    assert api.call("POST", "/api/definitions", body).status in (200, 201, 204)
    q = api.ok(f"/api/queues/%2F/{name}")
    assert q["type"] == "stream" and q["arguments"]["x-max-age"] == "1D"
    _publish(mgmt, name, 3)
    assert api.ok(f"/api/queues/%2F/{name}")["messages"] == 3
    api.delete(f"/api/queues/%2F/{name}")


def test_definitions_round_trip_a_stream_with_its_arguments_and_policy(clean_mgmt: ServerInfo,
                                                                        clean_api: Api) -> None:
    """Export a stream (every stream argument) and a streams policy, delete both, import the export: the
    same stream comes back, with its arguments, its policy applied, and it takes messages again."""
    api, name = clean_api, unique("s")
    arguments = {"x-queue-type": "stream", "x-max-age": "2D", "x-max-length-bytes": 5_000_000,
                 "x-stream-max-segment-size-bytes": 100_000, "x-stream-filter-size-bytes": 32,
                 "x-initial-cluster-size": 1, "x-queue-leader-locator": "client-local"}
    conn = connect(clean_mgmt.amqp_port)
    conn.channel().queue_declare(name, durable=True, arguments=arguments)
    conn.close()
    policy = {"pattern": f"^{name}$", "apply-to": "streams", "definition": {"stream-max-segment-size-bytes": 50_000}}
    assert api.put(f"/api/policies/%2F/p-{name}", policy).status in (201, 204)
    exported = api.ok("/api/definitions")
    [q] = [x for x in exported["queues"] if x["name"] == name]
    assert q["arguments"] == arguments and q["durable"] is True and q["auto_delete"] is False
    assert api.delete(f"/api/queues/%2F/{name}").status == 204
    assert api.delete(f"/api/policies/%2F/p-{name}").status == 204
    assert api.get(f"/api/queues/%2F/{name}").status == 404
    assert api.call("POST", "/api/definitions", exported).status in (200, 201, 204)
    back = api.ok(f"/api/queues/%2F/{name}")
    assert (back["type"], back["arguments"], back["policy"]) == ("stream", arguments, f"p-{name}")
    assert back["effective_policy_definition"] == {"stream-max-segment-size-bytes": 50_000}
    _publish(clean_mgmt, name, 3, **{k: v for k, v in arguments.items() if k != "x-queue-type"})
    assert wait_for(lambda: api.ok(f"/api/queues/%2F/{name}")["messages"] == 3)
    again = api.ok("/api/definitions")
    assert [x for x in again["queues"] if x["name"] == name] == [q]


def test_hutchctl_lists_a_streams_columns(mgmt: ServerInfo) -> None:
    name = unique("s")
    _publish(mgmt, name, 4)
    conn = connect(mgmt.amqp_port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    got: list[bytes] = []
    ch.basic_consume(name, lambda _c, _m, _p, body: got.append(body), arguments={"x-stream-offset": "first"},
                     consumer_tag="reader")
    assert wait_for(lambda: (conn.process_data_events(0), len(got))[1] == 2)  # it holds 2 unacked: reads at 2
    out = run_ctl(mgmt, "list_queues", "name", "type", "leader", "members", "first_offset",
                  "committed_offset", "last_offset", "segments", "consumer_offsets")
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith(name)]
    assert line.split() == [name, "stream", "test@localhost", "[test@localhost]", "0", "3", "3", "1",
                            '{"reader":2}'], line
    conn.channel().queue_delete(name)
    conn.close()
