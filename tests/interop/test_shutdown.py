"""Graceful shutdown: on SIGTERM every client gets connection.close 320 CONNECTION_FORCED and the
process exits 0; on restart clients can connect again."""

from __future__ import annotations

import signal
import time

import pika.exceptions
import pytest

from hutch.amqp import spec

from .helpers import connect, raw_session


def test_sigterm_closes_clients_with_320_and_exits_0(fresh_server):
    raw = raw_session(fresh_server.amqp_port)
    conn = connect(fresh_server.amqp_port)
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)
    try:
        fresh_server.proc.send_signal(signal.SIGTERM)
        close = raw.expect(spec.Connection.Close, 0, timeout=10)
        assert close.reply_code == 320
        assert close.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        raw.send_method(0, spec.Connection.CloseOk())
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320
        assert "CONNECTION_FORCED" in info.value.reply_text
        assert fresh_server.proc.wait(10) == 0
    finally:
        raw.close()
    assert "stopped" in fresh_server.log()


def test_sigint_also_stops_cleanly(fresh_server):
    conn = connect(fresh_server.amqp_port)
    fresh_server.proc.send_signal(signal.SIGINT)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert fresh_server.proc.wait(10) == 0
