"""`hutch-streams` (cli/streams.py) against a real node's stream listener: a super stream created with
--partitions and with --binding-keys (RabbitMQ's layout, seen by an rstream client), listed, routed and
deleted; refusals and an unreachable listener with their exit codes."""

from __future__ import annotations

import subprocess
import sys

from conftest import free_port

from .conftest import StreamServer


def run(server: StreamServer | None, *args: str) -> subprocess.CompletedProcess[str]:
    port = str(server.port if server is not None else free_port())
    return subprocess.run([sys.executable, "-m", "hutch.cli.streams", "--port", port, *args],
                          capture_output=True, text=True, timeout=60)


def test_add_list_route_delete(stream_server: StreamServer) -> None:
    done = run(stream_server, "add_super_stream", "cli-orders", "--partitions", "3", "--max-age", "1h")
    assert done.returncode == 0, done.stderr
    assert "cli-orders-0, cli-orders-1, cli-orders-2" in done.stdout
    assert run(stream_server, "list_partitions", "cli-orders").stdout.split() == \
        ["cli-orders-0", "cli-orders-1", "cli-orders-2"]
    assert run(stream_server, "route", "cli-orders", "1").stdout.split() == ["cli-orders-1"]
    again = run(stream_server, "add_super_stream", "cli-orders", "--partitions", "3")
    assert again.returncode == 1 and "stream already exists" in again.stderr
    done = run(stream_server, "add_super_stream", "cli-regions", "--binding-keys", "eu,us")
    assert done.returncode == 0 and "cli-regions-eu, cli-regions-us" in done.stdout
    assert run(stream_server, "route", "cli-regions", "us").stdout.split() == ["cli-regions-us"]
    assert run(stream_server, "delete_super_stream", "cli-orders").returncode == 0
    gone = run(stream_server, "list_partitions", "cli-orders")
    assert gone.returncode == 1 and "stream does not exist" in gone.stderr


def test_usage_and_unreachable_exit_codes(stream_server: StreamServer) -> None:
    both = run(stream_server, "add_super_stream", "x", "--partitions", "2", "--binding-keys", "a")
    assert both.returncode == 2 and "either --partitions or --binding-keys" in both.stderr
    assert run(None, "list_partitions", "x").returncode == 69


def test_super_streams_over_the_http_api(stream_server: StreamServer) -> None:
    from mgmt.helpers import Api
    api = Api(stream_server.info.mgmt_url)
    path = "/api/stream/super-streams/%2F/http-orders"
    assert api.put(path, {"partitions": 2, "arguments": {"max-age": "1h"}}).status == 201
    assert api.get(path).body == {"name": "http-orders", "vhost": "/",
                                  "partitions": ["http-orders-0", "http-orders-1"]}
    assert run(stream_server, "route", "http-orders", "1").stdout.split() == ["http-orders-1"]
    queue = api.get("/api/queues/%2F/http-orders-0").body
    assert queue["type"] == "stream" and queue["arguments"]["x-max-age"] == "1h"
    again = api.put(path, {"partitions": 2})
    assert again.status == 400 and "already" in again.body["reason"]
    assert api.put("/api/stream/super-streams/%2F/bad", {"partitions": 0}).status == 400
    assert api.call("DELETE", path).status == 204
    assert api.get(path).status == 404
    assert api.get("/api/queues/%2F/http-orders-0").status == 404
