"""Prometheus metrics (/metrics, /metrics/per-object) against a real node, read with prometheus_client's
parser as the oracle of the text format, and checked against the names, types, HELP texts and labels of
RabbitMQ's rabbitmq_prometheus plugin (the table below is copied from its collectors, not from hutch).
Tests on the shared node use unique names and assert on their own objects or on deltas only.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import time
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, connect, seg, unique, wait_for

# -- RabbitMQ's catalogue ---------------------------------------------------------------------------
# From rabbitmq-server deps/rabbitmq_prometheus/src/collectors/*.erl and rabbit_global_counters.erl:
# exposition name -> (type, HELP, label names of a per-object sample). Only the families hutch emits.
Q = ("vhost", "queue")
RABBITMQ: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rabbitmq_process_open_fds": ("gauge", "Open file descriptors", ()),
    "rabbitmq_process_resident_memory_bytes": ("gauge", "Memory used in bytes", ()),
    "rabbitmq_disk_space_available_bytes": ("gauge", "Disk space available in bytes", ()),
    "rabbitmq_process_max_fds": ("gauge", "Open file descriptors limit", ()),
    "rabbitmq_resident_memory_limit_bytes": ("gauge", "Memory high watermark in bytes", ()),
    "rabbitmq_disk_space_available_limit_bytes": ("gauge", "Free disk space low watermark in bytes", ()),
    "rabbitmq_erlang_uptime_seconds": ("gauge", "Node uptime", ()),
    "rabbitmq_io_sync_ops_total": ("counter", "Total number of I/O sync operations", ()),
    "rabbitmq_queue_messages_ready": ("gauge", "Messages ready to be delivered to consumers", Q),
    "rabbitmq_queue_messages_unacked": ("gauge", "Messages delivered to consumers but not yet acknowledged", Q),
    "rabbitmq_queue_messages": ("gauge", "Sum of ready and unacknowledged messages - total queue depth", Q),
    "rabbitmq_queue_consumers": ("gauge", "Consumers on a queue", Q),
    "rabbitmq_queue_messages_ram": ("gauge", "Ready and unacknowledged messages stored in memory", Q),
    "rabbitmq_queue_messages_ready_ram": ("gauge", "Ready messages stored in memory", Q),
    "rabbitmq_queue_messages_unacked_ram": ("gauge", "Unacknowledged messages stored in memory", Q),
    "rabbitmq_queue_messages_ready_bytes": ("gauge", "Size in bytes of ready messages", Q),
    "rabbitmq_channel_consumers": ("gauge", "Consumers on a channel", ("channel",)),
    "rabbitmq_channel_messages_unacked": ("gauge", "Delivered but not yet acknowledged messages", ("channel",)),
    "rabbitmq_channel_messages_unconfirmed": ("gauge", "Published but not yet confirmed messages", ("channel",)),
    "rabbitmq_channel_messages_uncommitted": (
        "gauge", "Messages received in a transaction but not yet committed", ("channel",)),
    "rabbitmq_consumer_prefetch": ("gauge", "Limit of unacknowledged messages for each consumer", ("channel",)),
    "rabbitmq_channel_prefetch": ("gauge", "Deprecated and will be removed in a future version", ("channel",)),
    "rabbitmq_channel_messages_published_total": (
        "counter", "Total number of messages published into an exchange on a channel",
        ("channel", "vhost", "exchange")),
    "rabbitmq_channel_messages_confirmed_total": (
        "counter", "Total number of messages published into an exchange and confirmed on the channel",
        ("channel", "vhost", "exchange")),
    "rabbitmq_channel_messages_redelivered_total": (
        "counter", "Total number of messages redelivered to consumers", ("channel", "vhost", "queue")),
    "rabbitmq_channel_messages_acked_total": (
        "counter", "Total number of messages acknowledged by consumers", ("channel", "vhost", "queue")),
    "rabbitmq_channel_messages_unroutable_returned_total": (
        "counter", "Total number of messages published as mandatory into an exchange and returned to the publisher "
        "as unroutable", ("channel", "vhost", "exchange")),
    "rabbitmq_channel_messages_unroutable_dropped_total": (
        "counter", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
        ("channel", "vhost", "exchange")),
    "rabbitmq_channel_get_ack_total": (
        "counter", "Total number of messages fetched with basic.get in manual acknowledgement mode",
        ("channel", "vhost", "queue")),
    "rabbitmq_channel_get_total": (
        "counter", "Total number of messages fetched with basic.get in automatic acknowledgement mode",
        ("channel", "vhost", "queue")),
    "rabbitmq_channel_messages_delivered_ack_total": (
        "counter", "Total number of messages delivered to consumers in manual acknowledgement mode",
        ("channel", "vhost", "queue")),
    "rabbitmq_channel_messages_delivered_total": (
        "counter", "Total number of messages delivered to consumers in automatic acknowledgement mode",
        ("channel", "vhost", "queue")),
    "rabbitmq_channel_get_empty_total": (
        "counter", "Total number of times basic.get operations fetched no message", ("channel", "vhost", "queue")),
    "rabbitmq_connection_incoming_bytes_total": (
        "counter", "Total number of bytes received on a connection", ("channel",)),
    "rabbitmq_connection_outgoing_bytes_total": ("counter", "Total number of bytes sent on a connection", ("channel",)),
    "rabbitmq_connection_channels": ("gauge", "Channels on a connection", ("channel",)),
    "rabbitmq_queue_messages_redelivered_total": (
        "counter", "Total number of messages redelivered from a queue to consumers", Q),
    "rabbitmq_queue_messages_acked_total": (
        "counter", "Total number of messages acknowledged by consumers on a queue", Q),
    "rabbitmq_connections": ("gauge", "Connections currently open", ()),
    "rabbitmq_channels": ("gauge", "Channels currently open", ()),
    "rabbitmq_consumers": ("gauge", "Consumers currently connected", ()),
    "rabbitmq_queues": ("gauge", "Queues available", ()),
    "rabbitmq_connections_opened_total": ("counter", "Total number of connections opened", ()),
    "rabbitmq_connections_closed_total": ("counter", "Total number of connections closed or terminated", ()),
    "rabbitmq_channels_opened_total": ("counter", "Total number of channels opened", ()),
    "rabbitmq_channels_closed_total": ("counter", "Total number of channels closed", ()),
    "rabbitmq_queues_declared_total": ("counter", "Total number of queues declared", ()),
    "rabbitmq_queues_created_total": ("counter", "Total number of queues created", ()),
    "rabbitmq_queues_deleted_total": ("counter", "Total number of queues deleted", ()),
    "rabbitmq_queue_info": ("gauge", "A metric with a constant '1' value and labels that provide some queue details",
                            ("vhost", "queue", "queue_type", "membership")),
    "rabbitmq_build_info": ("untyped", "RabbitMQ & Erlang/OTP version info",
                            ("product_name", "product_version", "rabbitmq_version", "prometheus_plugin_version",
                             "prometheus_client_version", "erlang_version")),
    "rabbitmq_identity_info": ("untyped", "RabbitMQ node & cluster identity info",
                               ("rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id",
                                "rabbitmq_endpoint")),
    "rabbitmq_global_messages_received_total": (
        "counter", "Total number of messages received from publishers", ("protocol",)),
    "rabbitmq_global_publishers": ("gauge", "Current number of publishers", ("protocol",)),
    "rabbitmq_global_consumers": ("gauge", "Current number of consumers", ("protocol",)),
    "rabbitmq_global_messages_delivered_total": (
        "counter", "Total number of messages delivered to consumers", ("protocol", "queue_type")),
    "rabbitmq_global_messages_redelivered_total": (
        "counter", "Total number of messages redelivered to consumers", ("protocol", "queue_type")),
    "rabbitmq_global_messages_acknowledged_total": (
        "counter", "Total number of messages acknowledged by consumers", ("protocol", "queue_type")),
    "rabbitmq_global_messages_received_confirm_total": (
        "counter", "Total number of messages received from publishers expecting confirmations", ("protocol",)),
    "rabbitmq_global_messages_routed_total": (
        "counter", "Total number of messages routed to queues or streams", ("protocol",)),
    "rabbitmq_global_messages_unroutable_dropped_total": (
        "counter", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
        ("protocol",)),
    "rabbitmq_global_messages_unroutable_returned_total": (
        "counter", "Total number of messages published as mandatory into an exchange and returned to the publisher "
        "as unroutable", ("protocol",)),
    "rabbitmq_global_messages_confirmed_total": (
        "counter", "Total number of messages confirmed to publishers", ("protocol",)),
    "rabbitmq_global_messages_delivered_consume_manual_ack_total": (
        "counter", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
        ("protocol", "queue_type")),
    "rabbitmq_global_messages_delivered_consume_auto_ack_total": (
        "counter", "Total number of messages delivered to consumers using basic.consume with automatic "
        "acknowledgment", ("protocol", "queue_type")),
    "rabbitmq_global_messages_delivered_get_manual_ack_total": (
        "counter", "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
        ("protocol", "queue_type")),
    "rabbitmq_global_messages_delivered_get_auto_ack_total": (
        "counter", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
        ("protocol", "queue_type")),
    "rabbitmq_global_messages_get_empty_total": (
        "counter", "Total number of times basic.get operations fetched no message", ("protocol", "queue_type")),
    "rabbitmq_alarms_free_disk_space_watermark": (
        "untyped", "is 1 if free disk space watermark alarm is in effect", ()),
    "rabbitmq_alarms_memory_used_watermark": ("untyped", "is 1 if VM memory watermark alarm is in effect", ()),
    "rabbitmq_stream_segments": ("counter", "Total number of stream segment files", Q),  # no _total: RabbitMQ's
    "rabbitmq_stream_consumer_max_offset_lag": ("gauge", "Highest consumer offset lag", Q),
    "process_start_time_seconds": ("gauge", "Start time of the process since unix epoch in seconds.", ()),
    "telemetry_scrape_duration_seconds": ("summary", "Scrape duration", ("registry", "content_type")),
    "telemetry_scrape_size_bytes": ("summary", "Scrape size, not encoded", ("registry", "content_type")),
}
# Where hutch's labels differ, on purpose (docs/metrics.md): family -> (labels left out, labels added).
LABEL_GAPS: dict[str, tuple[set[str], set[str]]] = {
    "rabbitmq_channel_messages_published_total": ({"exchange"}, set()),
    "rabbitmq_channel_messages_confirmed_total": ({"exchange"}, set()),
    "rabbitmq_channel_messages_redelivered_total": ({"queue"}, set()),
    "rabbitmq_channel_messages_acked_total": ({"queue"}, set()),
    "rabbitmq_channel_messages_unroutable_returned_total": ({"exchange"}, set()),
    "rabbitmq_channel_messages_unroutable_dropped_total": ({"exchange"}, set()),
    "rabbitmq_channel_get_ack_total": ({"queue"}, set()),
    "rabbitmq_channel_get_total": ({"queue"}, set()),
    "rabbitmq_channel_messages_delivered_ack_total": ({"queue"}, set()),
    "rabbitmq_channel_messages_delivered_total": ({"queue"}, set()),
    "rabbitmq_channel_get_empty_total": ({"queue"}, set()),
    "rabbitmq_build_info": ({"erlang_version"}, {"python_version"}),
    "rabbitmq_identity_info": ({"rabbitmq_cluster_permanent_id"}, set()),
}
ALWAYS_LABELLED = {"rabbitmq_queue_info", "rabbitmq_build_info", "rabbitmq_identity_info", "telemetry_scrape_duration_seconds",
                   "telemetry_scrape_size_bytes"} | {n for n in RABBITMQ if n.startswith("rabbitmq_global_")}
# What the RabbitMQ-Overview Grafana dashboard reads that hutch has a source for.
DASHBOARD = ["rabbitmq_identity_info", "rabbitmq_build_info", "rabbitmq_connections", "rabbitmq_channels",
             "rabbitmq_queues", "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
             "rabbitmq_process_resident_memory_bytes", "rabbitmq_resident_memory_limit_bytes",
             "rabbitmq_disk_space_available_bytes", "rabbitmq_disk_space_available_limit_bytes",
             "rabbitmq_process_open_fds", "rabbitmq_process_max_fds", "rabbitmq_erlang_uptime_seconds",
             "rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
             "rabbitmq_global_messages_acknowledged_total", "rabbitmq_global_messages_redelivered_total",
             "rabbitmq_global_publishers", "rabbitmq_global_consumers"]
TYPE_NAMES = {"unknown": "untyped"}  # prometheus_client's name for an untyped family
PLAIN_COUNTERS = {"rabbitmq_stream_segments"}  # RabbitMQ's counters named without _total


# -- helpers ----------------------------------------------------------------------------------------


GUEST_AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def fetch(info: ServerInfo, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    """GET `path` as Prometheus with basic_auth would: /metrics/per-object needs a monitoring login
    (docs/security.md); /metrics ignores the header."""
    req = urllib.request.Request(info.mgmt_url + path, headers={**GUEST_AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def parse(text: str) -> dict[str, Any]:
    """Families by exposition name (prometheus_client drops a counter's `_total` from its family name)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        plain = fam.name in PLAIN_COUNTERS
        name = fam.name + "_total" if fam.type == "counter" and not plain else fam.name
        assert name not in out, f"family {name} twice"
        out[name] = fam
    return out


def scrape(info: ServerInfo, per_object: bool = False) -> dict[str, Any]:
    status, _headers, body = fetch(info, "/metrics/per-object" if per_object else "/metrics")
    assert status == 200
    return parse(body.decode())


def value(fams: dict[str, Any], name: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of family `name` (sample name `sample`, e.g. a summary's `_count`) with `labels`."""
    found = [s.value for s in fams[name].samples
             if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, fams[name].samples[:5])
    return found[0]


def connection_name(api: Api, client_name: str) -> str:
    assert wait_for(lambda: any(c.get("user_provided_name") == client_name for c in api.ok("/api/connections")))
    return next(c["name"] for c in api.ok("/api/connections") if c.get("user_provided_name") == client_name)


def named_connection(info: ServerInfo, client_name: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", info.amqp_port, "/", pika.PlainCredentials("guest", "guest"), connection_attempts=1,
        socket_timeout=5, client_properties={"connection_name": client_name}))


# -- format, names, types, labels -------------------------------------------------------------------


def test_endpoints_speak_text_format(mgmt: ServerInfo):
    status, headers, body = fetch(mgmt, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4"
    assert body.startswith(b"# TYPE ")
    status, headers, zipped = fetch(mgmt, "/metrics/per-object", {"Accept-Encoding": "gzip"})
    assert (status, headers["Content-Encoding"]) == (200, "gzip")
    assert b"rabbitmq_identity_info" in gzip.decompress(zipped)
    assert "Content-Encoding" not in fetch(mgmt, "/metrics", {"Accept-Encoding": "deflate"})[1]  # as RabbitMQ
    assert fetch(mgmt, "/metrics/detailed")[0:3:2] == (404, b"Unknown Registry")
    assert fetch(mgmt, "/metrics/default")[0] == 200
    head = urllib.request.Request(mgmt.mgmt_url + "/metrics", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("per_object", [False, True], ids=["aggregated", "per-object"])
def test_names_types_help_and_labels_are_rabbitmqs(mgmt: ServerInfo, per_object: bool):
    with connect(mgmt.amqp_port) as conn:  # at least one queue, stream, channel and connection to label
        ch = conn.channel()
        q = unique("prom-labels")
        ch.queue_declare(q, auto_delete=True)
        stream = unique("prom-stream")
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        fams = scrape(mgmt, per_object)
        ch.queue_delete(stream)
    for name, fam in fams.items():
        if name.startswith("hutch_"):
            assert fam.type in ("gauge", "counter"), name
            continue
        assert name in RABBITMQ, f"{name} is not a rabbitmq_prometheus metric"
        kind, help_text, labels = RABBITMQ[name]
        assert (TYPE_NAMES.get(fam.type, fam.type), fam.documentation) == (kind, help_text), name
        missing, added = LABEL_GAPS.get(name, (set(), set()))
        want = (set(labels) - missing) | added if per_object or name in ALWAYS_LABELLED else set()
        assert fam.samples, name
        for sample in fam.samples:
            assert set(sample.labels) == want, (name, sample)
    for name in DASHBOARD:
        assert name in fams, name
    assert set(RABBITMQ) - set(fams) == (set() if per_object else {"rabbitmq_queue_info"})
    identity = fams["rabbitmq_identity_info"].samples[0].labels
    assert identity == {"rabbitmq_node": "test@localhost", "rabbitmq_cluster": "test@localhost",
                        "rabbitmq_endpoint": "per-object" if per_object else "aggregated"}


def test_aggregated_names_no_objects(mgmt: ServerInfo):
    q = unique("prom-hidden")
    with connect(mgmt.amqp_port) as conn:
        conn.channel().queue_declare(q, auto_delete=True)
        assert q.encode() not in fetch(mgmt, "/metrics")[2]
        assert q.encode() in fetch(mgmt, "/metrics/per-object")[2]


def test_label_values_are_escaped(mgmt: ServerInfo):
    name = unique('we"ird\\queue\nname')
    with connect(mgmt.amqp_port) as conn:
        ch = conn.channel()
        ch.queue_declare(name, auto_delete=True)
        ch.basic_publish("", name, b"x")
        assert wait_for(lambda: value(scrape(mgmt, True), "rabbitmq_queue_messages_ready", queue=name) == 1)
        text = fetch(mgmt, "/metrics/per-object")[2].decode()
    escaped = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    assert f'rabbitmq_queue_messages_ready{{vhost="/",queue="{escaped}"}} 1\n' in text
    info = value(parse(text), "rabbitmq_queue_info", queue=name)
    assert info == 1


def test_escaped_vhost_label(mgmt: ServerInfo):
    api = Api(mgmt.mgmt_url)
    vhost = unique('v"h\\')
    assert api.put(f"/api/vhosts/{seg(vhost)}").status == 201
    try:
        assert api.put(f"/api/queues/{seg(vhost)}/q", {"auto_delete": False}).status == 201
        fams = scrape(mgmt, True)
        assert value(fams, "rabbitmq_queue_messages", vhost=vhost, queue="q") == 0
        assert value(fams, "rabbitmq_queue_info", vhost=vhost, queue="q") == 1
    finally:
        api.delete(f"/api/vhosts/{seg(vhost)}")


# -- values follow the broker -----------------------------------------------------------------------


def settled(mgmt: ServerInfo, queue: str, *wanted: tuple[str, float]) -> dict[str, Any]:
    """A per-object scrape in which `queue`'s samples of the `wanted` families have those values (waited
    for: a queue homed in another worker shows its home's figures as pushed every second)."""
    fams: dict[str, Any] = {}

    def ready() -> bool:
        fams.clear()
        fams.update(scrape(mgmt, True))
        return all(value(fams, name, vhost="/", queue=queue) == want for name, want in wanted)

    assert wait_for(ready, timeout=15), {name: value(fams, name, vhost="/", queue=queue) for name, _w in wanted}
    return fams


def test_queue_channel_connection_and_global_values(mgmt: ServerInfo):
    api = Api(mgmt.mgmt_url)
    q = unique("prom-values")
    client = unique("prom-client")
    before = scrape(mgmt)
    conn = named_connection(mgmt, client)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q, auto_delete=False)
        for i in range(3):
            ch.basic_publish("", q, f"m{i}".encode())
        # a queue homed in another worker of a node of workers shows its home's figures, pushed every
        # second in one row (docs/scaling.md), as RabbitMQ's are emitted every interval: wait for the row
        fams = settled(mgmt, q, ("rabbitmq_queue_messages_ready", 3), ("hutch_queue_messages_published_total", 3))
        assert value(fams, "rabbitmq_queue_messages_ready", vhost="/", queue=q) == 3
        assert value(fams, "rabbitmq_queue_messages", vhost="/", queue=q) == 3
        assert value(fams, "rabbitmq_queue_messages_ready_bytes", vhost="/", queue=q) == 6
        assert value(fams, "hutch_queue_messages_published_total", vhost="/", queue=q) == 3
        chan = f"{connection_name(api, client)} (1)"
        assert value(fams, "rabbitmq_channel_messages_published_total", channel=chan, vhost="/") == 3
        assert value(fams, "rabbitmq_channel_messages_confirmed_total", channel=chan) == 3
        assert value(fams, "rabbitmq_channel_messages_unconfirmed", channel=chan) == 0
        assert value(fams, "rabbitmq_connection_channels", channel=connection_name(api, client)) == 1
        assert value(fams, "rabbitmq_connection_incoming_bytes_total", channel=connection_name(api, client)) > 0

        ch.basic_qos(prefetch_count=10)
        got: list[int] = []
        ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
        while len(got) < 3:
            conn.process_data_events(time_limit=0.1)
        fams = settled(mgmt, q, ("rabbitmq_queue_messages_unacked", 3), ("rabbitmq_queue_consumers", 1),
                       ("hutch_queue_messages_delivered_total", 3))
        assert value(fams, "rabbitmq_queue_messages_ready", vhost="/", queue=q) == 0
        assert value(fams, "rabbitmq_queue_messages_unacked", vhost="/", queue=q) == 3
        assert value(fams, "rabbitmq_queue_messages_unacked_ram", vhost="/", queue=q) == 3
        assert value(fams, "rabbitmq_queue_consumers", vhost="/", queue=q) == 1
        assert value(fams, "rabbitmq_channel_consumers", channel=chan) == 1
        assert value(fams, "rabbitmq_consumer_prefetch", channel=chan) == 10
        assert value(fams, "rabbitmq_channel_messages_unacked", channel=chan) == 3
        assert value(fams, "hutch_channel_messages_delivered_total", channel=chan) == 3
        assert value(fams, "hutch_queue_messages_delivered_total", vhost="/", queue=q) == 3

        ch.basic_nack(got[0], requeue=True)  # redelivered once
        for tag in got[1:]:
            ch.basic_ack(tag)
        conn.process_data_events(time_limit=0.3)
        while len(got) < 4:
            conn.process_data_events(time_limit=0.1)
        ch.basic_ack(got[3])
        fams = settled(mgmt, q, ("rabbitmq_queue_messages_acked_total", 3), ("rabbitmq_queue_messages", 0),
                       ("rabbitmq_queue_messages_redelivered_total", 1))
        assert value(fams, "rabbitmq_queue_messages", vhost="/", queue=q) == 0
        assert value(fams, "rabbitmq_queue_messages_redelivered_total", vhost="/", queue=q) == 1
        assert value(fams, "rabbitmq_channel_messages_acked_total", channel=chan) == 3
        assert value(fams, "rabbitmq_channel_messages_redelivered_total", channel=chan) == 1
    finally:
        conn.close()
    # the global counters keep what closed channels did; the totals went back
    after = scrape(mgmt)
    for name, delta in (("rabbitmq_global_messages_received_total", 3),
                        ("rabbitmq_global_messages_delivered_total", 4),
                        ("rabbitmq_global_messages_redelivered_total", 1),
                        ("rabbitmq_global_messages_acknowledged_total", 3)):
        assert value(after, name) - value(before, name) >= delta, name
    assert value(after, "rabbitmq_queues") >= 1
    Api(mgmt.mgmt_url).delete(f"/api/queues/%2F/{seg(q)}")


def test_dead_lettered_dropped_and_rejected(mgmt: ServerInfo):
    full, drop, dlx, target = (unique(p) for p in ("prom-full", "prom-drop", "prom-dlx", "prom-dlq"))
    with connect(mgmt.amqp_port) as conn:
        ch = conn.channel()
        ch.queue_declare(target, auto_delete=True)
        ch.queue_declare(full, auto_delete=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.queue_declare(drop, auto_delete=True, arguments={"x-max-length": 1})
        ch.queue_declare(dlx, auto_delete=True, arguments={
            "x-max-length": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target})
        for q in (full, drop, dlx):
            for body in (b"1", b"2"):
                ch.basic_publish("", q, body)
        settled(mgmt, target, ("rabbitmq_queue_messages_ready", 1))
        # each queue's own row (the three may live in three workers: each home pushes its own)
        settled(mgmt, full, ("hutch_queue_messages_rejected_total", 1))
        settled(mgmt, drop, ("hutch_queue_messages_dropped_total", 1))
        fams = settled(mgmt, dlx, ("hutch_queue_messages_dead_lettered_total", 1))
        assert value(fams, "hutch_queue_messages_rejected_total", vhost="/", queue=full) == 1
        assert value(fams, "hutch_queue_messages_dropped_total", vhost="/", queue=drop) == 1
        assert value(fams, "hutch_queue_messages_dead_lettered_total", vhost="/", queue=dlx) == 1
        assert value(fams, "hutch_queue_messages_dead_lettered_total", vhost="/", queue=drop) == 0


def test_storage_counters_follow_persistent_publishes(mgmt: ServerInfo):
    q = unique("prom-durable")
    before = scrape(mgmt)
    with connect(mgmt.amqp_port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q, durable=True)
        ch.basic_publish("", q, b"persistent", pika.BasicProperties(delivery_mode=2))
        after = scrape(mgmt)
        ch.queue_delete(q)
    assert value(after, "hutch_storage_fdatasyncs_total") > value(before, "hutch_storage_fdatasyncs_total")
    assert value(after, "hutch_storage_sync_batches_total") > value(before, "hutch_storage_sync_batches_total")
    assert value(after, "rabbitmq_io_sync_ops_total") == value(after, "hutch_storage_fdatasyncs_total")
    assert value(after, "hutch_memory_paging") == 0


def test_scrape_telemetry_counts_earlier_scrapes(mgmt: ServerInfo):
    name = "telemetry_scrape_size_bytes"
    first = scrape(mgmt, True)
    fams = scrape(mgmt, True)
    assert value(fams, name, name + "_count", registry="per-object") == value(
        first, name, name + "_count", registry="per-object") + 1
    assert value(fams, name, name + "_sum", registry="per-object") > value(
        first, name, name + "_sum", registry="per-object")
    assert value(fams, "telemetry_scrape_duration_seconds", "telemetry_scrape_duration_seconds_sum",
                 content_type="text/plain; version=0.0.4") > 0


# -- cost -------------------------------------------------------------------------------------------


@pytest.fixture
def queue_class_state() -> Any:
    """A Node sets ClassicQueue's class-wide clock and RAM limits; give them back afterwards."""
    from hutch.queues.classic.queue import ClassicQueue

    saved = {k: v for k, v in vars(ClassicQueue).items() if k in ("clock", "ram_limit", "ram_bytes_limit")}
    yield
    for key in ("clock", "ram_limit", "ram_bytes_limit"):
        if key in saved:
            setattr(ClassicQueue, key, saved[key])
        elif key in vars(ClassicQueue):
            delattr(ClassicQueue, key)


# `make test` renders 2,000 queues (the same checks); the 10,000 of the issue are in the slow set (in-process
# CPU: ~15 s of a worker's time on an idle 2-core machine)
@pytest.mark.parametrize("queues", [2_000, pytest.param(10_000, marks=pytest.mark.slow)])
def test_ten_thousand_queues_render_every_queue(queue_class_state: Any, queues: int):
    """The render of 10,000 queues is complete in both registries. How long it takes is measured by
    benchmarks/prometheus_render.py (docs/BENCHMARKS.md), not asserted here: a timing bound failed CI on a
    loaded machine (0.57 s against 0.5)."""
    from hutch.amqp.spec import BasicProperties
    from hutch.config import Config
    from hutch.core.message import Message
    from hutch.mgmt import prometheus, system
    from hutch.runtime.app import build_node

    node = build_node(Config(node_name="bench@localhost"), monitor_resources=False)
    vhost = node.vhosts["/"]
    for i in range(queues):
        q = node.declare_queue(vhost, f"q-{i}", False, False, False, {}, None)
        q.publish(Message("", q.name, BasicProperties(), b"x" * 10))
    assert node.agent is not None
    clients = asyncio.run(node.agent.metric_samples())
    info = asyncio.run(system.own_node_info(node.agent, node, node.wall_ms()))
    for registry in ("default", "per-object"):
        text = prometheus.render(node, registry, info, clients)
        fams = parse(text)
        assert value(fams, "rabbitmq_queues") == queues
        if registry == "per-object":
            assert len(fams["rabbitmq_queue_messages_ready"].samples) == queues
            assert value(fams, "rabbitmq_queue_messages_ready", queue=f"q-{queues - 1}") == 1
        else:
            assert value(fams, "rabbitmq_queue_messages_ready") == queues


def test_churn_counters_count_connections_channels_and_queues(mgmt: ServerInfo):
    before = scrape(mgmt)
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=mgmt.amqp_port))
    ch = conn.channel()
    ch.queue_declare("churn-q")
    ch.queue_declare("churn-q")  # a redeclare: declared, not created
    ch.queue_delete("churn-q")
    ch.close()
    conn.close()
    time.sleep(0.2)
    after = scrape(mgmt)

    def delta(name: str) -> float:
        return value(after, name) - value(before, name)

    assert delta("rabbitmq_connections_opened_total") >= 1
    assert delta("rabbitmq_connections_closed_total") >= 1
    assert delta("rabbitmq_channels_opened_total") >= 1 and delta("rabbitmq_channels_closed_total") >= 1
    assert delta("rabbitmq_queues_declared_total") >= 2
    assert delta("rabbitmq_queues_created_total") >= 1 and delta("rabbitmq_queues_deleted_total") >= 1


def test_confirm_route_unroutable_and_ack_mode_counters(mgmt: ServerInfo):
    """The global counters RabbitMQ splits by outcome and acknowledgement mode, and their per-channel
    families: confirms, routed enqueues, unroutable returned/dropped, consume and get by ack mode, empty gets."""
    api = Api(mgmt.mgmt_url)
    q, fan = unique("prom-ack"), unique("prom-fan")
    client = unique("prom-acks")
    before = scrape(mgmt)
    conn = named_connection(mgmt, client)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q, auto_delete=False)
        ch.exchange_declare(fan, "fanout", auto_delete=True)
        ch.queue_bind(q, fan)
        ch.basic_publish("", q, b"1")
        ch.basic_publish(fan, "", b"2")
        ch.basic_publish("amq.direct", unique("nowhere"), b"3")  # dropped
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.direct", unique("nowhere"), b"4", mandatory=True)  # returned
        m1 = ch.basic_get(q, auto_ack=True)
        m2 = ch.basic_get(q, auto_ack=False)
        assert m1[0] is not None and m2[0] is not None
        ch.basic_ack(m2[0].delivery_tag)
        assert ch.basic_get(q)[0] is None  # empty
        ch.basic_publish("", q, b"5")
        got: list[bytes] = []
        ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
        while not got:
            conn.process_data_events(time_limit=0.1)
        chan = connection_name(api, client) + " (1)"
        fams = scrape(mgmt, True)
        for name, expected in (("rabbitmq_channel_messages_published_total", 5),
                               ("rabbitmq_channel_messages_confirmed_total", 5),
                               ("rabbitmq_channel_messages_unroutable_dropped_total", 1),
                               ("rabbitmq_channel_messages_unroutable_returned_total", 1),
                               ("rabbitmq_channel_get_total", 1), ("rabbitmq_channel_get_ack_total", 1),
                               ("rabbitmq_channel_get_empty_total", 1),
                               ("rabbitmq_channel_messages_delivered_total", 1),
                               ("rabbitmq_channel_messages_delivered_ack_total", 0)):
            assert value(fams, name, channel=chan) == expected, name
    finally:
        conn.close()
    after = scrape(mgmt)
    for name, delta in (("rabbitmq_global_messages_received_total", 5),
                        ("rabbitmq_global_messages_received_confirm_total", 5),
                        ("rabbitmq_global_messages_confirmed_total", 5),
                        ("rabbitmq_global_messages_routed_total", 3),
                        ("rabbitmq_global_messages_unroutable_dropped_total", 1),
                        ("rabbitmq_global_messages_unroutable_returned_total", 1),
                        ("rabbitmq_global_messages_delivered_get_auto_ack_total", 1),
                        ("rabbitmq_global_messages_delivered_get_manual_ack_total", 1),
                        ("rabbitmq_global_messages_get_empty_total", 1),
                        ("rabbitmq_global_messages_delivered_consume_auto_ack_total", 1),
                        ("rabbitmq_global_messages_delivered_total", 3)):
        # the session node is shared: other tests may add to the totals, never take away
        assert value(after, name) - value(before, name) >= delta, name
    Api(mgmt.mgmt_url).delete(f"/api/queues/%2F/{seg(q)}")
