"""Bounded memory with real clients: backlogs page to disk, come back in order, survive restarts; memory
pressure pages transient messages too; large messages are stored once; tx.commit-ok means durable."""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pika

from conftest import ServerInfo, start_server
from hutch.runtime.queue_types.classic.persistence import resource_dir

from .helpers import storage_barrier

PERSISTENT = pika.BasicProperties(delivery_mode=2)
RAM_LIMIT = 5000  # classic_queue_ram_limit in the tests' config (the default is 131072)
CONFIG = f"classic_queue_ram_limit = {RAM_LIMIT}\n"


def api(server: ServerInfo, path: str) -> Any:
    req = urllib.request.Request(server.mgmt_url + path)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def queue_info(server: ServerInfo, name: str) -> dict[str, Any]:
    return api(server, f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")


def connect(server: ServerInfo) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port, heartbeat=0))


def publish_many(server: ServerInfo, queue: str, n: int, durable: bool, props: pika.BasicProperties | None,
                 size: int = 0) -> None:
    conn = connect(server)
    ch = conn.channel()
    ch.queue_declare(queue, durable=durable)
    for i in range(n):
        body = str(i).encode()
        ch.basic_publish("", queue, body + b"." * max(0, size - len(body)), props)
    conn.close()
    storage_barrier(server.amqp_port)  # so a kill -9 may follow


def consume_all(server: ServerInfo, queue: str, n: int) -> list[int]:
    conn = connect(server)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got: list[int] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        got.append(int(body.rstrip(b".")))
        if len(got) % 100 == 0 or len(got) == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(got) == n:
            break
    ch.cancel()
    conn.close()
    return got


def test_a_durable_backlog_pages_to_disk_and_survives_kill9_in_order(tmp_path: Path) -> None:
    n = RAM_LIMIT + 4000
    server = start_server(tmp_path, config_text=CONFIG + "queue_index_segment_entries = 1024\n")
    try:
        publish_many(server, "backlog", n, True, PERSISTENT)
        info = queue_info(server, "backlog")
        assert info["messages"] == n
        assert info["messages_ram"] == RAM_LIMIT and info["messages_paged_out"] == n - RAM_LIMIT
        segments = list((tmp_path / "data" / "queues").rglob("*.qix"))
        assert len(segments) >= n // 1024
        server.stop(signal.SIGKILL)
        server = start_server(tmp_path, config_text=CONFIG + "queue_index_segment_entries = 1024\n")
        assert queue_info(server, "backlog")["messages"] == n
        assert consume_all(server, "backlog", n) == list(range(n))
        assert queue_info(server, "backlog")["messages"] == 0
    finally:
        server.stop()


def test_a_transient_backlog_pages_too_and_leaves_nothing_behind(tmp_path: Path) -> None:
    n = RAM_LIMIT + 3000
    server = start_server(tmp_path, config_text=CONFIG)
    try:
        publish_many(server, "transient-backlog", n, False, None)
        info = queue_info(server, "transient-backlog")
        assert info["messages_paged_out"] == n - RAM_LIMIT
        assert consume_all(server, "transient-backlog", n) == list(range(n))
        conn = connect(server)
        conn.channel().queue_delete("transient-backlog")
        conn.close()
        time.sleep(0.2)
        left = [p.name for p in (tmp_path / "data" / "queues").iterdir()]
        assert left == [resource_dir("/", "barrier")]  # the transient queue's paging directory is gone
    finally:
        server.stop()


def test_memory_pressure_pages_transient_messages_out(tmp_path: Path) -> None:
    # paging threshold = 4 GiB x 0.001 = about 4 MB: always over it
    server = start_server(tmp_path, config_text="vm_memory_high_watermark.absolute = 4GiB\n"
                                                "vm_memory_high_watermark_paging_ratio = 0.001\n")
    try:
        publish_many(server, "pressed", 3000, False, None, size=200)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            info = queue_info(server, "pressed")
            if info["messages_ram"] <= 256:
                break
            time.sleep(0.2)
        assert info["messages_ram"] <= 256 and info["messages_paged_out"] >= 3000 - 256
        assert api(server, "/api/nodes")[0]["mem_paging"] is True
        assert "memory paging started" in server.log()
        assert consume_all(server, "pressed", 3000) == list(range(3000))
    finally:
        server.stop()


def test_a_large_message_routed_to_two_queues_is_stored_once(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    big = b"x" * 200_000
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("fan", "fanout", durable=True)
        for name in ("a", "b"):
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, "fan")
        for i in range(5):
            ch.basic_publish("fan", "", big + bytes([i]), PERSISTENT)
        conn.close()
        stored = sum(f.stat().st_size for f in (tmp_path / "data" / "msg_stores").rglob("*.rdq"))
        assert 5 * len(big) <= stored < 6 * len(big)  # once, not twice
        index_bytes = sum(f.stat().st_size for f in (tmp_path / "data" / "queues").rglob("*.qix"))
        assert index_bytes < 10_000  # the index holds references only
        server.stop(signal.SIGKILL)
        server = start_server(tmp_path)
        conn = connect(server)
        ch = conn.channel()
        for name in ("a", "b"):
            for i in range(5):
                method, _p, body = ch.basic_get(name, auto_ack=True)
                assert body == big + bytes([i])
        conn.close()
    finally:
        server.stop()


def test_tx_commit_ok_means_the_messages_are_on_disk(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.queue_declare("txq", durable=True)
        ch.tx_select()
        for i in range(50):
            ch.basic_publish("", "txq", str(i).encode(), PERSISTENT)
        ch.tx_commit()
        server.stop(signal.SIGKILL)  # right after commit-ok
        server = start_server(tmp_path)
        assert consume_all(server, "txq", 50) == list(range(50))
    finally:
        server.stop()
