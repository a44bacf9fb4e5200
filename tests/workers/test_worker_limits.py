"""Connection and channel limits on a node of 2 workers are the node's, exactly: connections pinned to
each worker (`workers.own_ports`) opened back to back, and at once, up to a vhost's `max-connections`, a
user's `max-connections` and `max-channels` (runtime/broker/limits.py, `WorkerLimits`). Every test has a
vhost or user of its own on one node. No polling: each check is the first open after the action.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pika
import pytest
from tests.conftest import ServerInfo
from tests.mgmt.helpers import Api, wait_mgmt
from tests.mgmt.helpers import connect as connect_port
from tests.workers.test_workers import start_node

from hutch import portfile


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = wait_mgmt(start_node(tmp_path_factory.mktemp("worker-limits")), timeout=60)
    yield info
    info.stop()


def port_of(info: ServerInfo, worker: int) -> int:
    ports = portfile.read(info.data_dir)
    assert ports is not None
    return int(ports["listeners"][f"amqp_w{worker}"])


def open_on(info: ServerInfo, worker: int, **kw: str) -> pika.BlockingConnection:
    return connect_port(port_of(info, worker), **kw)


def refused(info: ServerInfo, worker: int, **kw: str) -> str:
    with pytest.raises(pika.exceptions.AMQPConnectionError) as caught:
        open_on(info, worker, **kw).close()
    return str(caught.value)


def add_vhost(api: Api, vhost: str) -> None:
    assert api.put(f"/api/vhosts/{vhost}", {}).status in (201, 204)
    assert api.put(f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}).status \
        in (201, 204)


def limited_user(info: ServerInfo, user: str, limit: str, value: int) -> dict[str, str]:
    """A new user with permissions on / and one limit; its credentials for `open_on`."""
    api = Api(info.mgmt_url)
    assert api.put(f"/api/users/{user}", {"password": user, "tags": ""}).status in (201, 204)
    assert api.put(f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"}).status \
        in (201, 204)
    assert api.put(f"/api/user-limits/{user}/{limit}", {"value": value}).status == 204
    return {"user": user, "password": user}


def test_vhost_max_connections_counts_both_workers_back_to_back(node: ServerInfo) -> None:
    api = Api(node.mgmt_url)
    add_vhost(api, "lim-v")
    assert api.put("/api/vhost-limits/lim-v/max-connections", {"value": 3}).status == 204
    held = [open_on(node, 0, vhost="lim-v"), open_on(node, 1, vhost="lim-v"), open_on(node, 0, vhost="lim-v")]
    for worker in (1, 0):
        text = refused(node, worker, vhost="lim-v")
        assert "(530)" in text
        assert "access to vhost 'lim-v' refused for user 'guest': connection limit (3) is reached" in text
    held.pop(1).close()  # a place freed in worker 1 is free for worker 0 at once
    held.append(open_on(node, 0, vhost="lim-v"))
    assert "connection limit (3) is reached" in refused(node, 1, vhost="lim-v")
    held.pop(0).close()
    held.append(open_on(node, 1, vhost="lim-v"))
    for conn in held:
        conn.close()


def test_user_max_connections_counts_both_workers(node: ServerInfo) -> None:
    creds = limited_user(node, "lim-u", "max-connections", 2)
    held = [open_on(node, 1, **creds), open_on(node, 0, **creds)]
    for worker in (0, 1):
        assert "connection refused for user 'lim-u': user connection limit (2) is reached" \
            in refused(node, worker, **creds)
    open_on(node, 1).close()  # guest is not limited
    held[0].close()
    open_on(node, 0, **creds).close()
    held[1].close()


def test_user_max_channels_counts_the_channels_of_both_workers(node: ServerInfo) -> None:
    creds = limited_user(node, "lim-c", "max-channels", 3)
    in_w0, in_w1 = open_on(node, 0, **creds), open_on(node, 1, **creds)
    in_w0.channel()
    in_w1.channel()
    last = in_w0.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        in_w1.channel()
    assert (caught.value.reply_code, caught.value.reply_text) == (530, (
        "NOT_ALLOWED - number of channels opened for user 'lim-c' has reached the maximum allowed user limit of 3"))
    assert in_w0.is_open
    last.close()  # a channel closed in worker 0 frees its place for worker 1 (in_w1's went with it)
    again = open_on(node, 1, **creds)
    again.channel()
    again.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        in_w0.channel()
    again.close()


def test_connections_opened_at_once_on_both_workers_get_exactly_the_limit(node: ServerInfo) -> None:
    api = Api(node.mgmt_url)
    add_vhost(api, "lim-burst")
    assert api.put("/api/vhost-limits/lim-burst/max-connections", {"value": 4}).status == 204

    def attempt(worker: int) -> pika.BlockingConnection | None:
        try:
            return open_on(node, worker, vhost="lim-burst")
        except pika.exceptions.AMQPConnectionError:
            return None

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(attempt, [0, 1] * 5))
    opened = [c for c in results if c is not None]
    assert len(opened) == 4
    for conn in opened:
        conn.close()
