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
