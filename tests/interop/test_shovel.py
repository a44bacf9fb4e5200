"""Dynamic shovels against real hutch processes, with pika as the applications' client.

Each node is a cluster of one (tests/cluster/nodes.py: restartable on the same ports and data), so the
shovel runs where the metadata leader is. The seeded kill test is the issue's done-criterion at a size
`make test` can afford; the 100,000-message run is marked `slow`.
"""

from __future__ import annotations

import base64
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from tests.cluster.nodes import Node, eventually
from tests.conftest import free_port

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def make_node(tmp: Path, name: str, extra_config: str = "") -> Node:
    """A cluster of one on ports it picks (0: reported at its first start), restartable on them
    (`extra_config`: more hutch.conf lines)."""
    n = Node(name, tmp / name, 0, 0, 0, None)
    n.config_text += extra_config
    return n


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = make_node(tmp_path, "a").start()
    yield n
    n.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    src, dest = make_node(tmp_path, "src").start(), make_node(tmp_path, "dst").start()
    yield src, dest
    src.stop()
    dest.stop()


def channel(n: Node) -> Any:
    conn = pika.BlockingConnection(pika.URLParameters(n.url + "?heartbeat=0"))
    ch = conn.channel()
    ch.confirm_delivery()
    return ch


def publish(n: Node, queue: str, count: int, size: int = 16) -> None:
    ch = channel(n)
    ch.queue_declare(queue, durable=True)
    pad = b"x" * max(0, size - 8)
    for i in range(count):
        ch.basic_publish("", queue, b"%08d" % i + pad, PERSISTENT)
    ch.connection.close()


def depth(n: Node, queue: str) -> int:
    ch = channel(n)
    try:
        return int(ch.queue_declare(queue, passive=True).method.message_count)
    finally:
        ch.connection.close()


def drain(n: Node, queue: str) -> list[bytes]:
    ch = channel(n)
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append(body)
    ch.connection.close()
    return out


def set_shovel(n: Node, name: str, value: dict[str, Any], vhost: str = "%2F") -> tuple[int, Any]:
    return n.api("PUT", f"/api/parameters/shovel/{vhost}/{name}", {"value": value})


def shovel_gone(n: Node, name: str) -> bool:
    code, _ = n.api("GET", f"/api/parameters/shovel/%2F/{name}")
    return code == 404


def status(n: Node, name: str) -> dict[str, Any] | None:
    _, doc = n.api("GET", "/api/shovels")
    return next((s for s in doc if s["name"] == name), None)


def scrape(n: Node, path: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{n.management_port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=20) as resp:
        return str(resp.read().decode())


def test_local_shovel_moves_a_queue_and_removes_itself(node: Node) -> None:
    publish(node, "local-src", 500)
    code, _ = set_shovel(node, "mv", {"src-uri": "amqp://", "src-queue": "local-src", "dest-uri": "amqp://",
                                      "dest-queue": "local-dst", "src-delete-after": "queue-length",
                                      "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
                                      "dest-publish-properties": {"app_id": "moved"}})
    assert code == 201
    eventually(lambda: shovel_gone(node, "mv"), timeout=30)
    assert depth(node, "local-src") == 0
    ch = channel(node)
    method, props, body = ch.basic_get("local-dst", auto_ack=True)
    assert body == b"00000000" + b"x" * 8 and props.delivery_mode == 2 and props.app_id == "moved"
    (entry,) = props.headers["x-shovelled"]
    assert entry["shovel-name"] == "mv" and entry["src-queue"] == "local-src" and entry["dest-queue"] == "local-dst"
    assert entry["shovelled-by"] == node.full_name and isinstance(props.headers["x-shovelled-timestamp"], int)
    ch.connection.close()
    assert len(drain(node, "local-dst")) == 499
    assert status(node, "mv") is None


def test_status_restart_and_a_destination_that_cannot_be_reached(node: Node) -> None:
    dead = free_port()
    code, _ = set_shovel(node, "nowhere", {"src-uri": "amqp://", "src-queue": "st-src",
                                           "dest-uri": f"amqp://guest:secret@127.0.0.1:{dead}", "dest-queue": "d",
                                           "reconnect-delay": 1})
    assert code == 201
    found = eventually(lambda: (s := status(node, "nowhere")) and s["state"] == "terminated" and s, timeout=20)
    assert found["vhost"] == "/" and found["type"] == "dynamic" and found["node"] == node.full_name
    assert str(dead) in found["reason"] and "secret" not in found["reason"]
    code, _ = set_shovel(node, "ok", {"src-uri": "amqp://", "src-exchange": "amq.topic", "src-exchange-key": "a.#",
                                      "dest-uri": "amqp://", "dest-queue": "st-dst"})
    assert code == 201
    running = eventually(lambda: (s := status(node, "ok")) and s["state"] == "running" and s, timeout=20)
    assert running["src_exchange"] == "amq.topic" and running["dest_queue"] == "st-dst"
    assert running["src_uri"] == running["dest_uri"] == "amqp://"
    ch = channel(node)
    ch.basic_publish("amq.topic", "a.b", b"routed", PERSISTENT)
    ch.basic_publish("amq.topic", "b.b", b"not routed", PERSISTENT)
    ch.connection.close()
    eventually(lambda: depth(node, "st-dst") == 1)
    # the source is acknowledged after the destination confirmed, so the message can be seen there first
    acked = 'hutch_shovel_messages_acknowledged_total{vhost="/",shovel="ok"} 1'
    metrics = eventually(lambda: (m := scrape(node, "/metrics/per-object")) and acked in m and m, timeout=10)
    assert 'hutch_shovels{state="running"} 1' in metrics and 'hutch_shovels{state="terminated"} 1' in metrics
    assert 'hutch_shovel_messages_forwarded_total{vhost="/",shovel="ok"} 1' in metrics
    assert 'hutch_shovel_messages_acknowledged_total{vhost="/",shovel="ok"} 1' in metrics
    assert node.api("DELETE", "/api/shovels/vhost/%2F/ok/restart")[0] == 204
    assert node.api("DELETE", "/api/shovels/vhost/%2F/none/restart")[0] == 404
    eventually(lambda: (s := status(node, "ok")) and s["state"] == "running", timeout=20)
    assert node.api("DELETE", "/api/parameters/shovel/%2F/ok")[0] == 204
    eventually(lambda: status(node, "ok") is None)
    out = node.ctl("shovel_status")
    assert out.returncode == 0 and "nowhere" in out.stdout and "terminated" in out.stdout


def test_validation_errors_and_hutchctl(node: Node) -> None:
    code, doc = set_shovel(node, "bad", {"src-uri": "amqp://", "ack-mode": "never"})
    assert code == 400
    assert doc["reason"].startswith("Validation failed\n\n")
    assert 'Key "dest-uri" not found in bad' in doc["reason"]
    assert 'ack-mode should be one of ["no-ack", "on-publish", "on-confirm"], actually was "never"' in doc["reason"]
    assert node.api("PUT", "/api/parameters/nope/%2F/x", {"value": {}})[0] == 400
    assert node.api("PUT", "/api/parameters/shovel/%2F/x", {"other": 1})[0] == 400
    assert node.api("PUT", "/api/parameters/shovel/missing-vhost/x", {"value": {}})[0] == 404
    out = node.ctl("set_parameter", "shovel", "c1", '{"src-uri": "amqp://", "src-queue": "ctl-src"}')
    assert out.returncode == 1 and 'Key "dest-uri" not found in c1' in out.stderr
    value = '{"src-uri": "amqp://", "src-queue": "ctl-src", "dest-uri": "amqp://", "dest-queue": "ctl-dst"}'
    out = node.ctl("set_parameter", "shovel", "c1", value)
    assert out.returncode == 0, out.stderr
    listed = node.ctl("list_parameters")
    assert "shovel" in listed.stdout and "c1" in listed.stdout
    code, doc = node.api("GET", "/api/definitions")
    assert {"component": "shovel", "vhost": "/", "name": "c1", "value": {
        "src-uri": "amqp://", "src-queue": "ctl-src", "dest-uri": "amqp://", "dest-queue": "ctl-dst"}} \
        in doc["parameters"]
    assert node.ctl("clear_parameter", "shovel", "c1").returncode == 0
    out = node.ctl("clear_parameter", "shovel", "c1")
    assert out.returncode == 1 and "Parameter does not exist" in out.stderr


def test_a_shovel_survives_a_restart_of_its_node(node: Node) -> None:
    assert set_shovel(node, "keep", {"src-uri": "amqp://", "src-queue": "r-src", "dest-uri": "amqp://",
                                     "dest-queue": "r-dst"})[0] == 201
    eventually(lambda: (s := status(node, "keep")) and s["state"] == "running", timeout=20)
    node.kill()
    node.start()
    eventually(lambda: (s := status(node, "keep")) and s["state"] == "running", timeout=30)
    publish(node, "r-src", 10)
    eventually(lambda: depth(node, "r-dst") == 10)


def move_while_killing(pair: tuple[Node, Node], count: int, seed: int, size: int = 16) -> None:
    """The issue's done-criterion: `count` persistent messages from one node to another with an
    on-confirm shovel, the destination killed (-9) and restarted twice during the move; every message
    arrives at least once and the shovel (src-delete-after: queue-length) removes itself."""
    src, dest = pair
    rng = random.Random(seed)
    publish(src, "big-src", count, size)
    channel(dest).queue_declare("big-dst", durable=True)
    code, _ = set_shovel(src, "big", {"src-uri": "amqp://", "src-queue": "big-src",
                                      "dest-uri": f"amqp://guest:guest@127.0.0.1:{dest.amqp_port}",
                                      "dest-queue": "big-dst", "src-delete-after": "queue-length",
                                      "reconnect-delay": 0.5, "src-prefetch-count": rng.choice([50, 500, 1000])})
    assert code == 201
    for kill_at in sorted(rng.sample(range(count // 10, count * 7 // 10), 2)):
        eventually(lambda at=kill_at: depth(src, "big-src") <= count - at, timeout=300, interval=0.05)
        dest.kill()
        time.sleep(rng.uniform(0.1, 1.0))
        dest.start()
    eventually(lambda: shovel_gone(src, "big"), timeout=600, interval=0.5)
    assert depth(src, "big-src") == 0
    got = drain(dest, "big-dst")
    ids = {int(body[:8]) for body in got}
    assert ids == set(range(count)), f"missing {sorted(set(range(count)) - ids)[:10]}"
    assert len(got) >= count


def test_move_to_another_node_while_the_destination_is_killed_twice(pair: tuple[Node, Node]) -> None:
    move_while_killing(pair, 5_000, seed=25)


@pytest.mark.slow
def test_move_100k_persistent_messages_while_the_destination_is_killed_twice(pair: tuple[Node, Node]) -> None:
    move_while_killing(pair, 100_000, seed=2025)


def test_hutchctl_is_on_path() -> None:
    out = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "shovel_status", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "dynamic shovels" in out.stdout


def queues_cli(n: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--port", str(n.management_port), *args],
                          capture_output=True, text=True, timeout=30)


def test_redrive_sends_dead_letters_back_to_the_queues_they_died_in(node: Node) -> None:
    ch = channel(node)
    ch.queue_declare("dlq", durable=True)
    for q in ("work-a", "work-b"):
        ch.queue_declare(q, durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    for i in range(30):
        ch.basic_publish("", "work-a" if i % 3 else "work-b", b"m%d" % i, PERSISTENT)
    for q in ("work-a", "work-b"):  # every message rejected: all of them dead-lettered into dlq
        while (got := ch.basic_get(q))[0] is not None:
            ch.basic_reject(got[0].delivery_tag, requeue=False)
    ch.basic_publish("", "dlq", b"never died", PERSISTENT)  # no x-death: back to the end of dlq
    eventually(lambda: depth(node, "dlq") == 31)
    ch.connection.close()
    out = queues_cli(node, "redrive", "dlq")
    assert out.returncode == 0, out.stderr
    assert "redrive-dlq" in out.stdout
    eventually(lambda: shovel_gone(node, "redrive-dlq"), timeout=30)
    assert sorted(drain(node, "work-a")) == sorted(b"m%d" % i for i in range(30) if i % 3)
    assert sorted(drain(node, "work-b")) == sorted(b"m%d" % i for i in range(30) if not i % 3)
    assert drain(node, "dlq") == [b"never died"]
    out = queues_cli(node, "redrive", "no-such-queue")
    assert out.returncode == 1 and "not found" in out.stderr


def test_who_may_set_a_shovel_and_whom_its_local_connection_acts_as(node: Node) -> None:
    for user, tags in (("mgr", "management"), ("pm", "policymaker")):
        assert node.api("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})[0] in (201, 204)
        assert node.api("PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})[0] \
            in (201, 204)
    value = {"src-uri": "amqp://", "src-queue": "perm-src", "dest-uri": "amqp://", "dest-queue": "perm-dst"}
    code, doc = node.api("PUT", "/api/parameters/shovel/%2F/by-mgr", {"value": value}, user="mgr", password="pw")
    assert code == 401 and doc["reason"] == "User not authorised to access object"
    assert node.api("GET", "/api/parameters/shovel", user="mgr", password="pw") == (200, [])
    assert node.api("PUT", "/api/parameters/shovel/%2F/by-pm", {"value": value}, user="pm", password="pw")[0] == 201
    eventually(lambda: (s := status(node, "by-pm")) and s["state"] == "running", timeout=20)
    _, conns = node.api("GET", "/api/connections")
    mine = [c for c in conns if (c.get("client_properties") or {}).get("connection_name") == "Shovel by-pm"]
    assert mine and {c["user"] for c in mine} == {"pm"} and {c["auth_mechanism"] for c in mine} == {"internal"}
    # the setter's permissions apply: without read on the source queue the shovel cannot start
    assert node.api("PUT", "/api/permissions/%2F/pm", {"configure": ".*", "write": ".*", "read": "^$"})[0] == 204
    assert node.api("DELETE", "/api/shovels/vhost/%2F/by-pm/restart", user="pm", password="pw")[0] == 204
    found = eventually(lambda: (s := status(node, "by-pm")) and s["state"] == "terminated" and s, timeout=20)
    assert "403" in found["reason"] or "ACCESS_REFUSED" in found["reason"]


def test_a_silent_destination_is_dropped_by_heartbeats_and_reconnected(pair: tuple[Node, Node]) -> None:
    src, dest = pair
    code, _ = set_shovel(src, "hb", {"src-uri": "amqp://", "src-queue": "hb-src", "dest-queue": "hb-dst",
                                     "dest-uri": f"amqp://guest:guest@127.0.0.1:{dest.amqp_port}?heartbeat=1",
                                     "reconnect-delay": 1})
    assert code == 201
    eventually(lambda: (s := status(src, "hb")) and s["state"] == "running", timeout=30)
    dest.pause()  # the socket stays open: only the missing heartbeats tell
    try:
        found = eventually(lambda: (s := status(src, "hb")) and s["state"] != "running" and s, timeout=30)
        assert found["state"] in ("terminated", "starting")
    finally:
        dest.resume()
    eventually(lambda: (s := status(src, "hb")) and s["state"] == "running", timeout=60)
    publish(src, "hb-src", 5)
    eventually(lambda: depth(dest, "hb-dst") == 5, timeout=30)


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_each_ack_mode_moves_to_an_exchange_and_a_count_ends_the_shovel(node: Node, ack_mode: str) -> None:
    src, dst = f"am-src-{ack_mode}", f"am-dst-{ack_mode}"
    publish(node, src, 300)
    ch = channel(node)
    ch.queue_declare(dst, durable=True)
    ch.queue_bind(dst, "amq.direct", "to-dst")
    ch.connection.close()
    code, _ = set_shovel(node, f"am-{ack_mode}", {
        "src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-exchange": "amq.direct",
        "dest-exchange-key": "to-dst", "ack-mode": ack_mode, "src-delete-after": 120, "src-prefetch-count": 50})
    assert code == 201
    eventually(lambda: shovel_gone(node, f"am-{ack_mode}"), timeout=30)
    moved = drain(node, dst)
    left = drain(node, src)
    # no-ack with a count acks each message once published (docs/shovel.md): none past the count is lost
    assert len(moved) == 120 and len(left) == 180
    assert sorted(int(b[:8]) for b in moved + left) == list(range(300))
