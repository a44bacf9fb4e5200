"""Fixtures of the management suite.

`mgmt` wraps the session-wide `hutch_server` (tests on it use unique names and never assert totals);
`fresh_mgmt` wraps `fresh_server` for tests that change users, vhosts or permissions. Both wait for
the management listener (the shared fixtures only wait for AMQP). `api`/`fresh_api` are HTTP
clients logged in as guest.
"""

from __future__ import annotations

import pytest

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)

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
