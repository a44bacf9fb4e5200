"""Issue 22: `hutch-server` takes port 0 on every listener and reports the ports it bound, in its log
and in `<data dir>/ports.json`, which the test fixtures read (tests/conftest.py) instead of picking a
number beforehand."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from conftest import start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import connect


def test_every_listener_on_port_0_is_reported(tmp_path: Path) -> None:
    server = start_server(tmp_path, cluster=True)  # AMQP, management and the inter-node port, all on 0
    try:
        doc = json.loads((server.data_dir / "ports.json").read_text())
        assert doc["pid"] == server.proc.pid and doc["node"] == "test@localhost"
        ports = doc["listeners"]
        assert set(ports) == {"amqp", "management", "cluster"} and all(p > 0 for p in ports.values())
        assert server.ports == ports
        for port in ports.values():
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        connect(ports["amqp"]).close()
        line = next(ln for ln in server.log().splitlines() if "listening: " in ln)
        for name, port in ports.items():
            assert re.search(rf"listening: .*\b{name} {port}\b", line), line
        assert str(server.data_dir / "ports.json") in line
    finally:
        server.stop()
    assert not (server.data_dir / "ports.json").exists()  # removed at a clean stop
