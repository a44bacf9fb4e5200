"""Issue 22: `hutch-server` takes port 0 on every listener and reports the ports it bound, in its log
and in `<data dir>/ports.json`, which the test fixtures read (tests/conftest.py) instead of picking a
number beforehand."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from conftest import start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch import portfile
from hutch.spark.bench import start_node
from hutch.spark.client import AmqpClient
from hutch.spark.options import parse_uri

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


def test_the_spark_benchmarks_node_takes_free_ports_for_every_listener(tmp_path: Path) -> None:
    """`python -m hutch.spark.bench` and examples/spark_orders/run_demo.py start their node with this: the
    inter-node port too is a free one (a fixed 25672 collided with `make run`'s node)."""
    proc, uri = start_node(tmp_path)
    try:
        ports = portfile.wait_for_ports(tmp_path / "data", proc)
        assert uri == f"amqp://guest:guest@127.0.0.1:{ports['amqp']}/%2F"
        assert set(ports) == {"amqp", "management", "cluster"} and 25672 not in ports.values()
        with AmqpClient(parse_uri(uri)).connect() as client:
            client.declare_queue("spark-bench-probe")
    finally:
        proc.terminate()
        proc.wait(30)
