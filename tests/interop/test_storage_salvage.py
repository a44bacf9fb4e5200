"""hutch-storage check/salvage on a real node's data directory after damage in the middle of the journal."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pika

from conftest import free_port, start_server


def storage_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hutch.cli.storage", *args], capture_output=True, text=True,
                          timeout=60)


def publish_persistent(port: int, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=port))
    ch = conn.channel()
    ch.queue_declare("kept", durable=True)
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", "kept", body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def test_salvage_lets_a_node_with_a_damaged_journal_start(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        # three separate publishing sessions: at least three journal batches (one fdatasync each)
        for part in range(3):
            publish_persistent(server.amqp_port, [f"{part}-{i}".encode() * 50 for i in range(20)])
    finally:
        server.stop(signal.SIGKILL)
    data = tmp_path / "data"
    assert storage_cli("check", str(data)).returncode == 0
    segments = sorted((data / "messages").rglob("*.seg"))
    assert segments
    raw = bytearray(segments[0].read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # damage in the middle of the journal, not a torn tail
    segments[0].write_bytes(bytes(raw))

    report = storage_cli("check", str(data))
    assert report.returncode == 1
    assert "DAMAGED" in report.stdout

    refused = subprocess.run([sys.executable, "-m", "hutch.cli.server", "--data-dir", str(data),
                              "--amqp-port", str(free_port()), "--management-port", str(free_port()),
                              "--log-level", "none"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert "corrupt record" in refused.stderr

    fixed = storage_cli("salvage", str(data))
    assert fixed.returncode == 0, fixed.stderr
    assert "rebuilt with" in fixed.stdout
    assert list((data / "messages").glob("*.damaged-*")), "the damaged files are kept aside"
    assert storage_cli("check", str(data)).returncode == 0

    again = start_server(tmp_path)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=again.amqp_port))
        ch = conn.channel()
        count = ch.queue_declare("kept", durable=True, passive=True).method.message_count
        assert 0 < count < 60  # the readable batches came back, the damaged one did not
        conn.close()
    finally:
        again.stop()


def test_bad_usage_is_one_line(tmp_path: Path) -> None:
    missing = storage_cli("check", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0
    wrong = storage_cli("frobnicate", str(tmp_path))
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("hutch-storage: error:") and wrong.stderr.strip().count("\n") == 0
