"""`hutch-streams` (cli/streams.py) and the management API's stream routes against a real node: a super
stream created with --partitions, --binding-keys or over HTTP (RabbitMQ's layout), listed, routed and
deleted; refusals and an unreachable listener with their exit codes; stream connections, publishers and
consumers listed while rstream clients use them; the listing commands (list_stream_connections,
list_stream_consumers, list_stream_publishers, list_stream_consumer_groups, list_stream_group_consumers,
list_stream_tracking; hutchctl has all but the last, as rabbitmqctl) reading the management API while rstream clients publish, track offsets and share a
single-active-consumer group."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

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


@pytest.mark.asyncio
async def test_stream_connections_publishers_and_consumers_are_listed(stream_server: StreamServer) -> None:
    import asyncio

    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    from mgmt.helpers import Api
    api = Api(stream_server.info.mgmt_url)
    auth = {"username": "guest", "password": "guest"}
    got = asyncio.Event()
    async with Producer("127.0.0.1", port=stream_server.port, **auth) as p, \
            Consumer("127.0.0.1", port=stream_server.port, **auth) as c:
        await p.create_stream("listed", exists_ok=True)
        await p.send_wait("listed", AMQPMessage(body=b"x"), publisher_name="lister")
        await c.start()
        await c.subscribe("listed", lambda m, ctx: got.set(),
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(got.wait(), 30)
        conns = api.get("/api/stream/connections").body
        assert conns and all(conn["user"] == "guest" and conn["vhost"] == "/" for conn in conns)
        pubs = [x for x in api.get("/api/stream/publishers").body if x["stream"] == "listed"]
        assert pubs[0]["reference"] == "lister" and pubs[0]["messages_confirmed"] == 1
        subs = [x for x in api.get("/api/stream/consumers").body if x["stream"] == "listed"]
        assert subs[0]["messages_consumed"] == 1 and subs[0]["offset"] == 1 and subs[0]["active"]


@pytest.mark.asyncio
async def test_stream_connections_are_connections_and_can_be_closed(stream_server: StreamServer) -> None:
    """As RabbitMQ shows them: among /api/connections (protocol "stream") and /api/consumers
    (`stream.subid-N`), by vhost, stream and connection under /api/stream/..., and closed by DELETE on
    either path (what rabbitmq-stream-js-client's and rstream's own suites do)."""
    import asyncio
    import contextlib
    from urllib.parse import quote

    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    from mgmt.helpers import Api
    api = Api(stream_server.info.mgmt_url)
    auth = {"username": "guest", "password": "guest"}
    got = asyncio.Event()
    closed: list[str] = []

    async def on_close(info: object) -> None:
        closed.append("closed")

    async with Producer("127.0.0.1", port=stream_server.port, **auth) as p:
        await p.create_stream("closable", exists_ok=True)
        await p.send_wait("closable", AMQPMessage(body=b"x"), publisher_name="closer")
        by_stream = api.get("/api/stream/publishers/%2F/closable").body
        assert [x["reference"] for x in by_stream] == ["closer"]
        assert api.get("/api/stream/publishers/%2F/other").body == []
        assert api.get("/api/stream/publishers/no-such-vhost").status == 404
    for path in ("/api/connections/", "/api/stream/connections/%2F/"):
        c = Consumer("127.0.0.1", port=stream_server.port, connection_name="closable-consumer",
                     on_close_handler=on_close, **auth)
        await c.start()
        await c.subscribe("closable", lambda m, ctx: got.set(),
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(got.wait(), 30)
        mine = [x for x in api.get("/api/connections").body
                if x["client_properties"].get("connection_name") == "closable-consumer"]
        assert len(mine) == 1 and mine[0]["protocol"] == "stream" and mine[0]["user"] == "guest"
        name = mine[0]["name"]
        assert name == f"{mine[0]['peer_host']}:{mine[0]['peer_port']} -> 127.0.0.1:{stream_server.port}"
        assert api.get("/api/connections/" + quote(name, safe="")).body["protocol"] == "stream"
        consumers = [x for x in api.get("/api/consumers/%2F").body if x["queue"]["name"] == "closable"]
        assert [(x["consumer_tag"], x["channel_details"]["connection_name"]) for x in consumers] == \
            [("stream.subid-0", name)]
        assert api.get("/api/stream/connections/%2F/" + quote(name, safe="")).body["name"] == name
        subs = api.get(f"/api/stream/connections/%2F/{quote(name, safe='')}/consumers").body
        assert [x["stream"] for x in subs] == ["closable"]
        assert [x["stream"] for x in api.get("/api/stream/consumers/%2F/").body] == ["closable"]
        assert api.delete(path + quote(name, safe="")).status == 204
        for _ in range(100):
            if closed:
                break
            await asyncio.sleep(0.1)
        assert closed == ["closed"]
        assert api.get("/api/connections/" + quote(name, safe="")).status == 404
        closed.clear()
        got.clear()
        with contextlib.suppress(Exception):  # the client's own close, after the server's
            await c.close()
    assert api.delete("/api/stream/connections/%2F/no-such-connection").status == 404


@pytest.mark.asyncio
async def test_a_stream_deleted_over_http_drops_its_stream_protocol_users_at_once(stream_server: StreamServer) -> None:
    """RabbitMQ sends the metadata update as the stream goes, whatever deleted it; rabbitmq-stream-js-
    client's suite deletes streams over HTTP and expects its idle publishers and consumers closed."""
    import asyncio

    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    from mgmt.helpers import Api
    api = Api(stream_server.info.mgmt_url)
    auth = {"username": "guest", "password": "guest"}
    async with Producer("127.0.0.1", port=stream_server.port, **auth) as p, \
            Consumer("127.0.0.1", port=stream_server.port, **auth) as c:
        await p.create_stream("deleted-over-http", exists_ok=True)
        await c.start()
        await c.subscribe("deleted-over-http", lambda m, ctx: None,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        assert [x["stream"] for x in api.get("/api/stream/consumers/%2F/").body] == ["deleted-over-http"]
        assert api.delete("/api/queues/%2F/deleted-over-http").status == 204
        for _ in range(100):
            if not api.get("/api/stream/consumers/%2F/").body:
                break
            await asyncio.sleep(0.05)
        assert api.get("/api/stream/consumers/%2F/").body == []


def listing(server: StreamServer, *args: str) -> subprocess.CompletedProcess[str]:
    return run(server, "--management-port", str(server.info.management_port), *args)


def rows(server: StreamServer, *args: str) -> list[dict[str, object]]:
    done = listing(server, "--formatter", "json", *args)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.asyncio
async def test_listing_commands_show_connections_consumers_groups_and_tracking(stream_server: StreamServer) -> None:
    """rabbitmq-streams' listing commands, with its column names and defaults, against what two rstream
    consumers of one single-active-consumer group and a named publisher did."""
    import asyncio

    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        OffsetSpecification,
        OffsetType,
        Producer,
    )

    from mgmt.helpers import Api
    api = Api(stream_server.info.mgmt_url)
    auth = {"username": "guest", "password": "guest"}

    async def on_update(is_active: bool, ctx: object) -> OffsetSpecification:
        return OffsetSpecification(OffsetType.FIRST, 0)

    async with Producer("127.0.0.1", port=stream_server.port, **auth) as p, \
            Consumer("127.0.0.1", port=stream_server.port, connection_name="lister-1", **auth) as c1, \
            Consumer("127.0.0.1", port=stream_server.port, connection_name="lister-2", **auth) as c2:
        await p.create_stream("cli-listed", exists_ok=True)
        await p.send_wait("cli-listed", AMQPMessage(body=b"x"), publisher_name="tracker")
        for c in (c1, c2):
            await c.start()
            await c.subscribe("cli-listed", lambda m, ctx: None, consumer_update_listener=on_update,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                              properties={"single-active-consumer": "true", "name": "billing"})
        await c1.store_offset("cli-listed", "reader-1", 0)
        path = "/api/stream/tracking/%2F/cli-listed?type=offset"
        deadline = time.monotonic() + 30
        while not api.get(path).body:  # store_offset has no response: wait for its tracking chunk
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

        table = listing(stream_server, "list_stream_connections")
        assert table.returncode == 0 and table.stdout.splitlines()[:2] == ["Listing stream connections ...",
                                                                           "conn_name"]
        conns = rows(stream_server, "list_stream_connections", "conn_name", "user", "subscriptions",
                     "client_properties")
        subscribed = {r["client_properties"].get("connection_name"): r["subscriptions"]  # type: ignore[union-attr]
                      for r in conns if r["subscriptions"]}
        assert subscribed == {"lister-1": 1, "lister-2": 1} and {r["user"] for r in conns} == {"guest"}

        group = rows(stream_server, "list_stream_group_consumers", "--stream", "cli-listed", "--reference", "billing")
        assert [r["state"] for r in group] == ["active (connected)", "waiting (connected)"]
        names = {r["name"]: r["client_properties"].get("connection_name")  # type: ignore[union-attr]
                 for r in api.get("/api/stream/connections").body}
        assert [names[r["connection_name"]] for r in group] == ["lister-1", "lister-2"]
        ctl = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--port", str(stream_server.info.management_port),
                              "--formatter", "json", "list_stream_group_consumers", "--stream", "cli-listed",
                              "--reference", "billing"], capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0 and json.loads(ctl.stdout) == group  # rabbitmqctl has them too
        groups = [r for r in rows(stream_server, "list_stream_consumer_groups") if r["stream"] == "cli-listed"]
        assert groups == [{"stream": "cli-listed", "reference": "billing", "partition_index": -1, "consumers": 2}]

        consumers = [r for r in rows(stream_server, "list_stream_consumers") if r["stream"] == "cli-listed"]
        assert list(consumers[0]) == ["connection_pid", "subscription_id", "stream", "messages_consumed", "offset",
                                      "offset_lag", "credits", "active", "activity_status", "properties"]
        assert sorted(str(r["activity_status"]) for r in consumers) == ["single_active", "waiting"]
        pubs = [r for r in rows(stream_server, "list_stream_publishers", "-p", "/") if r["stream"] == "cli-listed"]
        assert [(r["reference"], r["messages_confirmed"]) for r in pubs] == [("tracker", 1)]

        tracking = rows(stream_server, "list_stream_tracking", "cli-listed")
        assert [(r["type"], r["name"]) for r in tracking] == [("writer", "tracker"), ("offset", "reader-1")]
        assert tracking[1]["tracking_value"] == 0
        assert [r["type"] for r in rows(stream_server, "list_stream_tracking", "cli-listed", "--writer")] == ["writer"]
        assert [r["type"] for r in rows(stream_server, "list_stream_tracking", "cli-listed", "--offset")] == ["offset"]
        # the routes behind them: tracking needs read access to the stream, groups show a monitor every one
        assert api.put("/api/users/cli-watcher", {"password": "w", "tags": "monitoring"}).status in (201, 204)
        watcher = api.as_user("cli-watcher", "w")
        assert watcher.get("/api/stream/tracking/%2F/cli-listed").status == 401
        assert [g["reference"] for g in watcher.get("/api/stream/consumer-groups/%2F").body] == ["billing"]
        assert api.get("/api/stream/tracking/%2F/cli-listed?type=bogus").status == 400


def test_listing_commands_refuse_with_rabbitmq_texts(stream_server: StreamServer) -> None:
    no_group = listing(stream_server, "list_stream_group_consumers", "--stream", "nope", "--reference", "nope")
    assert no_group.returncode == 1 and no_group.stderr.strip() == "hutch-streams: The group does not exist"
    no_stream = listing(stream_server, "list_stream_tracking", "no-such-stream")
    assert no_stream.returncode == 1 and no_stream.stderr.strip() == "hutch-streams: The stream does not exist."
    no_vhost = listing(stream_server, "list_stream_consumers", "--vhost", "no-such-vhost")
    assert no_vhost.returncode == 1 and 'Virtual host "no-such-vhost" does not exist' in no_vhost.stderr
    for bad in (("list_stream_tracking", "s", "--all", "--writer"), ("list_stream_group_consumers", "--stream", "s"),
                ("list_stream_connections", "no_such_column")):
        done = listing(stream_server, *bad)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    unreachable = run(stream_server, "--management-port", str(free_port()), "list_stream_connections")
    assert unreachable.returncode == 69 and "cannot reach the management API" in unreachable.stderr


def test_map_cells_print_as_rabbitmq_streams_prints_them(stream_server: StreamServer) -> None:
    """`properties` and `client_properties` in table output, through hutch-streams and hutchctl against a
    real node: as RabbitMQ 3.10's rabbitmq_stream commands print them (PrettyTable: `~p` of the term;
    before, hutch printed JSON): an Erlang map of binaries and an AMQP table of binaries, keys in byte
    order, a binary whose bytes are not all printable latin-1 as its bytes; `--formatter json` keeps
    JSON objects."""
    from .hostile import RawStream

    client = RawStream(stream_server.port)  # (its peer properties: {"product": "hostile"})
    client.create("cli-terms")
    client.subscribe(7, "cli-terms", 1, {"name": "app", "filter.0": "eu", "quote": 'a"b\\c', "euro": "€", "tab": "a\tb"})
    try:
        expected = ('#{<<"euro">> => <<226,130,172>>,<<"filter.0">> => <<"eu">>,<<"name">> => <<"app">>,'
                    '<<"quote">> => <<"a\\"b\\\\c">>,<<"tab">> => <<"a\\tb">>}')
        ctl = [sys.executable, "-m", "hutch.cli.ctl", "--port", str(stream_server.info.management_port), "-q"]
        for done in (listing(stream_server, "-q", "list_stream_consumers", "stream", "subscription_id", "properties"),
                     subprocess.run([*ctl, "list_stream_consumers", "stream", "subscription_id", "properties"],
                                    capture_output=True, text=True, timeout=60)):
            assert done.returncode == 0, done.stderr
            assert "cli-terms\t7\t" + expected in done.stdout.splitlines(), done.stdout
        for done in (listing(stream_server, "-q", "--no-table-headers", "list_stream_connections", "client_properties"),
                     subprocess.run([*ctl, "--no-table-headers", "list_stream_connections", "client_properties"],
                                    capture_output=True, text=True, timeout=60)):
            assert done.returncode == 0, done.stderr
            assert '[{<<"product">>,longstr,<<"hostile">>}]' in done.stdout.splitlines(), done.stdout
        (mine,) = [r for r in rows(stream_server, "list_stream_consumers") if r["stream"] == "cli-terms"]
        assert mine["properties"] == {"name": "app", "filter.0": "eu", "quote": 'a"b\\c', "euro": "€", "tab": "a\tb"}
    finally:
        client.close()
