"""hutch-perf end to end against a real hutch node: the numbers it prints add up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ServerInfo


def run_perf(server: ServerInfo, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "hutch.cli.perf", "--uri", server.url, "--json", *args],
        capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_confirmed_publish_and_consume(hutch_server: ServerInfo) -> None:
    summary = run_perf(hutch_server, "-x", "1", "-y", "1", "-s", "64", "-c", "100", "-q", "100", "-A", "10",
                       "-C", "5000", "-z", "30")
    assert summary["sent"] == 5000
    assert summary["confirmed"] == 5000
    assert summary["nacked"] == 0
    assert summary["received"] == 5000
    assert summary["latency_us"]["samples"] == 5000


def test_mandatory_unroutable_is_returned(hutch_server: ServerInfo) -> None:
    summary = run_perf(hutch_server, "-x", "1", "-y", "0", "-c", "50", "-k", "no-such-queue",
                       "-f", "mandatory", "-C", "200", "-z", "30")
    assert summary["sent"] == 200
    assert summary["returned"] == 200
    assert summary["confirmed"] == 200


def test_queue_pattern_two_queues_and_fanout(hutch_server: ServerInfo) -> None:
    import pika

    summary = run_perf(hutch_server, "-x", "2", "-y", "2", "-c", "100", "-q", "100", "-A", "10",
                       "--queue-pattern", "pat-%d", "--queue-pattern-to", "2", "-C", "1000", "-z", "30")
    assert (summary["sent"], summary["confirmed"], summary["received"]) == (2000, 2000, 2000)
    assert summary["queues"] == 2
    # a fanout exchange bound to 3 pattern queues: every message reaches each of the 3 consumers
    summary = run_perf(hutch_server, "-x", "1", "-y", "3", "-c", "100", "-q", "100", "-A", "10", "-e", "pat-fx",
                       "-t", "fanout", "--queue-pattern", "fan-%d", "--queue-pattern-to", "3", "-C", "500", "-z", "30")
    assert (summary["sent"], summary["confirmed"], summary["received"]) == (500, 500, 1500)
    # the queues and the exchange the runs declared are gone
    conn = pika.BlockingConnection(pika.URLParameters(hutch_server.url))
    try:
        for name in ("pat-1", "pat-2", "fan-1", "fan-3"):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                ch.queue_declare(name, passive=True)
            assert err.value.reply_code == 404
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.exchange_declare("pat-fx", passive=True)
    finally:
        conn.close()
