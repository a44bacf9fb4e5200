"""Consumer timeout: a delivery left unacknowledged too long closes its channel with 406."""

from __future__ import annotations

import time
from pathlib import Path

import pika

from conftest import start_server  # tests/conftest.py


def test_unacked_delivery_times_out(tmp_path: Path) -> None:
    server = start_server(tmp_path, config_text="consumer_timeout = 1000\n")
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
        ch = conn.channel()
        ch.queue_declare("ct")
        ch.basic_publish("", "ct", b"x")
        method, _props, _body = next(ch.consume("ct", inactivity_timeout=5))
        assert method is not None
        closed: list[BaseException] = []
        ch._impl.add_on_close_callback(lambda _ch, reason: closed.append(reason))
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert closed, "channel was not closed by the consumer timeout"
        reason = closed[0]
        assert isinstance(reason, pika.exceptions.ChannelClosedByBroker)
        assert reason.reply_code == 406
        assert "delivery acknowledgement on channel 1 timed out" in reason.reply_text
        # the message was requeued and another channel can take it
        ch2 = conn.channel()
        method, _props, body = ch2.basic_get("ct", auto_ack=True)
        assert body == b"x" and method.redelivered
        conn.close()
    finally:
        server.stop()
