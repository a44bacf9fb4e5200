"""hutch's own clients over amqps://: the Spark connector's AMQP client (a reader thread and a writer on
one TLS connection) and hutch-perf (asyncio, with --cacert), against a real node's TLS listener."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import requests
from tests.tls.conftest import TlsNode

from hutch.amqp.spec import BasicProperties
from hutch.amqp.uri import UriError, parse_uri
from hutch.spark.client import AmqpClient, ClientClosed
from hutch.spark.options import parse_uri as spark_uri

pytestmark = pytest.mark.timeout(90)


def amqps(node: TlsNode, **query: str) -> str:
    params = "&".join(f"{k}={v}" for k, v in {"cacertfile": str(node.pki.cacertfile), **query}.items())
    return f"amqps://guest:guest@localhost:{node.amqps_port}/%2F?{params}"


def test_amqps_uris() -> None:
    uri = parse_uri("amqps://u:p@broker/%2F?cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem"
                    "&server_name_indication=mq.example&verify=verify_peer")
    assert (uri.tls, uri.port, uri.cacertfile, uri.certfile, uri.keyfile, uri.tls_server_name, uri.verify) == \
        (True, 5671, "/ca.pem", "/c.pem", "/k.pem", "mq.example", True)
    assert uri.display() == "amqps://u@broker:5671/%2F"
    assert parse_uri("amqps://h?verify=verify_none").ssl_context().check_hostname is False  # type: ignore[union-attr]
    with pytest.raises(UriError, match="cannot load the TLS files"):
        parse_uri("amqps://h?cacertfile=/no/such/ca.pem").ssl_context()


def test_spark_client_over_amqps_reads_and_writes_at_once(tls_node: TlsNode) -> None:
    name = "spark-tls"
    assert requests.put(f"{tls_node.info.mgmt_url}/api/queues/%2F/{name}", json={"durable": False},
                        auth=("guest", "guest"), timeout=10).status_code in (201, 204)
    count = 3000
    with AmqpClient(spark_uri(amqps(tls_node))).connect() as c:
        c.consume(name, prefetch=500)
        c.confirm_select()
        prefix = c.publish_frame_prefix("", name, True)

        def publish() -> None:  # a writer thread while the reader thread takes deliveries
            for i in range(0, count, 100):
                frames = []
                for j in range(i, i + 100):
                    frames.append(prefix)
                    frames.extend(c.content(BasicProperties().encode(), f"m{j:05d}".encode() * 20))
                c.send_publishes(frames, 100)
            c.wait_confirms(0, 30)

        writer = threading.Thread(target=publish)
        writer.start()
        got = []
        while len(got) < count:
            batch = c.take(500, 10.0)
            assert batch, f"only {len(got)} of {count} delivered"
            got.extend(batch)
            c.ack(batch[-1].delivery_tag, multiple=True)
        writer.join(30)
        assert [d.body for d in got] == [f"m{j:05d}".encode() * 20 for j in range(count)]
        assert c.publish_outcome() == (0, [])


def test_spark_client_refuses_a_broker_it_does_not_trust(tls_node: TlsNode) -> None:
    uri = f"amqps://guest:guest@localhost:{tls_node.amqps_port}/%2F?cacertfile={tls_node.other.cacertfile}"
    with pytest.raises(ClientClosed, match="TLS handshake with amqps://guest@localhost:.* failed: .*CERTIFICATE_VERIFY"):
        AmqpClient(spark_uri(uri)).connect()


def test_hutch_perf_over_amqps(tls_node: TlsNode) -> None:
    base = [sys.executable, "-m", "hutch.cli.perf", "--uri",
            f"amqps://guest:guest@localhost:{tls_node.amqps_port}/%2F", "--json"]
    proc = subprocess.run([*base, "--cacert", str(tls_node.pki.cacertfile), "-x", "1", "-y", "1", "-s", "64",
                           "-c", "100", "-q", "100", "-C", "2000", "-D", "2000", "-z", "60", "--processes", "1"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["sent"] == summary["confirmed"] == summary["received"] == 2000
    assert summary["uri"].startswith("amqps://guest@localhost:")
    untrusted = subprocess.run([*base, "-x", "1", "-y", "0", "-C", "10", "-z", "10"], capture_output=True,
                               text=True, timeout=60)  # the system's CAs do not know the test CA
    assert untrusted.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr
