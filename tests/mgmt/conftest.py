"""Fixtures of the management suite.

`mgmt` wraps the session-wide `hutch_server` (tests on it use unique names and never assert totals);
`fresh_mgmt` wraps `fresh_server` (a node of the test's own) for tests that need a node's first state
beyond its definitions (its log, statistics from zero, a restart); `clean_mgmt` is the module's node put
back in a fresh node's state before each test (tests/mgmt/clean_node.py) for tests that change users,
vhosts, permissions, policies or limits. All wait for the management listener (the shared fixtures only
wait for AMQP). `api`/`fresh_api`/`clean_api` are HTTP clients logged in as guest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)

from .clean_node import CleanNode
from .helpers import Api, wait_mgmt


@pytest.fixture
def mgmt(hutch_server: ServerInfo) -> ServerInfo:
    return wait_mgmt(hutch_server)


@pytest.fixture
def fresh_mgmt(fresh_server: ServerInfo) -> ServerInfo:
    return wait_mgmt(fresh_server)


@pytest.fixture
def api(mgmt: ServerInfo) -> Api:
    return Api(mgmt.mgmt_url)


@pytest.fixture
def fresh_api(fresh_mgmt: ServerInfo) -> Api:
    return Api(fresh_mgmt.mgmt_url)


@pytest.fixture(scope="module")
def module_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CleanNode]:
    with CleanNode(tmp_path_factory.mktemp("clean")) as node:  # stopped when the module is done
        yield node


@pytest.fixture
def clean_mgmt(module_node: CleanNode) -> ServerInfo:
    return module_node.clean()


@pytest.fixture
def clean_api(clean_mgmt: ServerInfo) -> Api:
    return Api(clean_mgmt.mgmt_url)
