"""Fixtures of the interop suite.

`server` is the session-wide `hutch_server` (one real `hutch-server` process); tests use unique queue
and exchange names so they never see each other's topology. `limited_server` is a second session-wide
node started with a config file that lowers limits (max_message_size, handshake timeout), for the tests
about those limits. `conn`/`ch` are a pika BlockingConnection and a channel on `server`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest

from conftest import ServerInfo, SharedNodes  # tests/conftest.py (tests/ is on sys.path)

from .helpers import connect

LIMITED_CONFIG = """\
max_message_size = 1024
handshake_timeout = 1000
"""


@pytest.fixture
def server(hutch_server: ServerInfo) -> ServerInfo:
    return hutch_server


@pytest.fixture
def limited_server(shared_nodes: SharedNodes) -> ServerInfo:
    return shared_nodes.get("hutch-limited", config_text=LIMITED_CONFIG)


@pytest.fixture
def conn(server: ServerInfo) -> Iterator[pika.BlockingConnection]:
    connection = connect(server.amqp_port)
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def ch(conn: pika.BlockingConnection) -> pika.adapters.blocking_connection.BlockingChannel:
    return conn.channel()
