"""The hot path a running server uses (compiled or pure-Python) is stated once in its start log, and
matches the HUTCH_PURE setting the tests run with; a pika round trip with bodies on both sides of the
small-body limit and of frame_max goes through it intact."""

from __future__ import annotations

import os

from hutch.amqp import speedups

from .helpers import temp_queue


def test_start_log_states_the_hot_path_once(server):
    log = server.log()
    lines = [line for line in log.splitlines() if "hot path" in line]
    assert len(lines) == 1, lines
    if os.environ.get("HUTCH_PURE", "") not in ("", "0"):
        assert lines[0].endswith("pure-Python hot path (HUTCH_PURE is set)")
    else:  # the server's choice is this process's: the same tree, the same build
        assert lines[0].endswith(speedups.describe())


def test_bodies_round_trip_through_the_hot_path(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = temp_queue(ch)
    bodies = [b"", b"x", b"a" * 4096, b"b" * 4097, bytes(range(256)) * 1000, b"c" * 131072 * 2 + b"!"]
    for body in bodies:
        ch.basic_publish("", q, body)
    got = []
    for _ in bodies:
        method, _props, body = next(ch.consume(q, inactivity_timeout=10))
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    assert got == bodies
