"""A shovel whose destination is an amqps:// URI (RabbitMQ's TLS query parameters), verified against the
node's CA; one whose URI names a CA the node's certificate does not chain to stays terminated."""

from __future__ import annotations

import time
from urllib.parse import quote

import pika
import pytest
import requests
from tests.tls.conftest import TlsNode

pytestmark = pytest.mark.timeout(90)


def api(node: TlsNode, method: str, path: str, body: object = None) -> requests.Response:
    return requests.request(method, node.info.mgmt_url + path, json=body, auth=("guest", "guest"), timeout=10)


def shovel_state(node: TlsNode, name: str) -> dict[str, str]:
    for _ in range(300):
        found = [s for s in api(node, "GET", "/api/shovels").json() if s["name"] == name]
        if found and found[0]["state"] != "starting":
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"shovel {name} did not leave 'starting'")


def test_a_shovel_publishes_over_tls(tls_node: TlsNode) -> None:
    ca = quote(str(tls_node.pki.cacertfile))
    dest = f"amqps://guest:guest@localhost:{tls_node.amqps_port}/%2F?cacertfile={ca}"
    value = {"src-uri": "amqp://", "src-queue": "tls-src", "dest-uri": dest, "dest-queue": "tls-dst",
             "src-delete-after": "queue-length"}
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_node.info.amqp_port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("tls-src", durable=True)
    for i in range(50):
        ch.basic_publish("", "tls-src", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert api(tls_node, "PUT", "/api/parameters/shovel/%2F/over-tls", {"value": value}).status_code == 201
    for _ in range(300):
        if api(tls_node, "GET", "/api/parameters/shovel/%2F/over-tls").status_code == 404:
            break
        time.sleep(0.1)
    assert ch.queue_declare("tls-dst", passive=True).method.message_count == 50
    conn.close()


def test_a_certificate_from_another_ca_is_refused(tls_node: TlsNode) -> None:
    ca = quote(str(tls_node.other.cacertfile))
    dest = f"amqps://guest:secret@localhost:{tls_node.amqps_port}/%2F?cacertfile={ca}"
    value = {"src-uri": "amqp://", "src-queue": "tls-src2", "dest-uri": dest, "dest-queue": "tls-dst2",
             "reconnect-delay": 30}
    assert api(tls_node, "PUT", "/api/parameters/shovel/%2F/bad-ca", {"value": value}).status_code == 201
    found = shovel_state(tls_node, "bad-ca")
    assert found["state"] == "terminated" and "CERTIFICATE_VERIFY_FAILED" in found["reason"]
    assert "secret" not in found["reason"]
    assert api(tls_node, "DELETE", "/api/parameters/shovel/%2F/bad-ca").status_code == 204
