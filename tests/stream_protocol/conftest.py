"""Fixtures of the stream-protocol suite: a real `hutch-server` with its stream listener on port 0 (the
port it bound is read from its ports file, tests/conftest.py).

`stream_server` is one node for the module (tests use unique stream names); `fresh_stream_server` is a
node of the test's own, for the tests that kill and restart it (`restart` starts it again on the same
ports and data directory).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)


@dataclass
class StreamServer:
    tmp: Path
    port: int
    info: ServerInfo

    def kill(self) -> None:
        self.info.stop(signal.SIGKILL)

    def stop(self) -> None:
        self.info.stop()

    def restart(self) -> None:
        self.info = start_server(self.tmp, "--stream-port", str(self.port))


def start_stream_server(tmp: Path) -> StreamServer:
    info = start_server(tmp, "--stream-port", "0")
    return StreamServer(tmp, info.ports["stream"], info)


@pytest.fixture(scope="module")
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamServer]:
    server = start_stream_server(tmp_path_factory.mktemp("streams"))
    yield server
    server.stop()


@pytest.fixture
def fresh_stream_server(tmp_path: Path) -> Iterator[StreamServer]:
    server = start_stream_server(tmp_path)
    yield server
    server.stop()
