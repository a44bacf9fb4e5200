"""The end of the close handshake on the AMQP listener (issue 22), with a raw client that keeps writing.

RabbitMQ's reader, once it has sent connection.close-ok, reads and discards what still arrives until the
client closes the socket (or a timeout); so does hutch. A client that queued more publishes than its
socket took (amqplib's "find high watermark" test) otherwise sees its remaining writes fail and never
gets its close callback. The TLS listener's case is in tests/tls/test_amqps.py."""

from __future__ import annotations

import pytest

from hutch.amqp import spec

from .helpers import raw_session, server_alive, write_after_close

pytestmark = pytest.mark.timeout(120)


def test_writes_after_the_clients_close_are_read_and_discarded(server):
    with raw_session(server.amqp_port) as raw:
        write_after_close(raw)
    assert server_alive(server.amqp_port)


def test_writes_after_the_nodes_close_are_read_and_discarded(server):
    with raw_session(server.amqp_port) as raw:
        raw.send_method(1, spec.Channel.Open())  # a second channel.open: connection error 504
        close = raw.expect(spec.Connection.Close, 0)
        assert close.reply_code == 504
        write_after_close(raw, server_closes_first=True)
    assert server_alive(server.amqp_port)


def test_a_client_that_never_closes_is_closed_after_the_heartbeat_timeout(server):
    """The wait after close-ok is bounded: the heartbeat timeout (1 s here), at most 30 s."""
    with raw_session(server.amqp_port, heartbeat=1) as raw:
        raw.send_method(0, spec.Connection.Close(reply_code=200, reply_text="bye"))
        raw.expect(spec.Connection.CloseOk, 0)
        assert raw.wait_closed(timeout=20)
