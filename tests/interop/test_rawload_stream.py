"""benchmarks/rawload.py's `--stream` mode against a real node: it declares a stream, publishes with
confirms, consumes with a prefetch and an `x-stream-offset`, and deletes the stream at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pika

from conftest import ServerInfo

ROOT = Path(__file__).resolve().parents[2]


def test_rawload_publishes_to_and_consumes_from_a_stream(server: ServerInfo) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rawload.py"), "--port", str(server.amqp_port), "--stream", "first",
         "-x", "1", "-y", "1", "-s", "16", "-c", "100", "-q", "100", "-A", "50", "-r", "300", "-z", "1",
         "--warmup", "0.5"], capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["errors"] == [] and result["nacked"] == 0
    assert result["confirmed"] > 0 and result["received"] > 0
    assert result["config"]["stream"] == "first"
    assert [q for q in _queue_names(server) if q.startswith("rawload-")] == []  # deleted at the end


def _queue_names(server: ServerInfo) -> list[str]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.management_port}/api/queues")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return [q["name"] for q in json.loads(resp.read())]



def test_stream_attach_reads_a_stream_from_first_and_deletes_it(server: ServerInfo) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.amqp_port))
    ch = conn.channel()
    ch.queue_declare("attach-bench", durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", "attach-bench", b"m%d" % i)
    conn.close()
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "stream_attach.py"), "--port", str(server.amqp_port),
         "--pid", str(server.proc.pid), "--queue", "attach-bench", "--messages", "300", "--prefetch", "100",
         "--delete"], capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["messages"] == 300 and result["first_message_ms"] >= 0 and result["rss_peak_mib"] > 0
    assert "attach-bench" not in _queue_names(server)
