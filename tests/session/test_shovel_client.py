"""The shovel's AMQP client (runtime/shovel/client.py) fed a server's frames whole, one byte at a time,
and with garbage after them: the handshake, a delivery assembled from its frames, confirms, and a
protocol error that fails the link instead of raising."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hutch.amqp import spec
from hutch.amqp.frames import content_frames, method_frame
from hutch.runtime.shovel.client import AmqpLink, LinkClosed


class Wire:
    """A transport that keeps what the client writes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, parts: list[bytes]) -> None:
        self.out += b"".join(parts)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass


def server_frames() -> bytes:
    start = spec.Connection.Start(version_major=0, version_minor=9, server_properties={"cluster_name": "up"},
                                  mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US")
    parts = [method_frame(0, start), method_frame(0, spec.Connection.Tune(channel_max=2047, frame_max=4096, heartbeat=0)),
             method_frame(0, spec.Connection.OpenOk()), method_frame(1, spec.Channel.OpenOk())]
    deliver = spec.Basic.Deliver(consumer_tag="c", delivery_tag=7, redelivered=True, exchange="x", routing_key="k")
    parts.append(method_frame(1, deliver))
    props = spec.BasicProperties(delivery_mode=2, headers={"h": 1}).encode()
    parts += content_frames(1, 60, props, b"b" * 10_000, 4096)  # three body frames
    parts.append(method_frame(1, spec.Basic.Ack(delivery_tag=3, multiple=True)))
    parts.append(method_frame(1, spec.Basic.Nack(delivery_tag=4, multiple=False, requeue=True)))
    return b"".join(parts)


def drive(chunks: list[bytes]) -> tuple[AmqpLink, list[Any], list[Any]]:
    async def run() -> tuple[AmqpLink, list[Any], list[Any]]:
        link = AmqpLink("u", "p", "/v", "test", heartbeat_s=0)
        deliveries: list[Any] = []
        confirms: list[Any] = []
        link.on_delivery = lambda *args: deliveries.append(args)
        link.on_confirm = lambda *args: confirms.append(args)
        link.connection_made(Wire())  # type: ignore[arg-type]  # the transport methods the client uses
        for chunk in chunks:
            link.data_received(chunk)
        return link, deliveries, confirms

    return asyncio.run(run())


@pytest.mark.parametrize("how", ["whole", "byte at a time"])
def test_handshake_delivery_and_confirms(how: str) -> None:
    data = server_frames()
    link, deliveries, confirms = drive([data] if how == "whole" else [data[i:i + 1] for i in range(len(data))])
    assert link.ready.done() and not link.closed.done()
    assert link.server_properties["cluster_name"] == "up" and link.frame_max == 4096
    ((tag, redelivered, exchange, key, props, body),) = deliveries
    assert (tag, redelivered, exchange, key, body) == (7, True, "x", "k", b"b" * 10_000)
    decoded = spec.BasicProperties.decode(b"\0" * 12 + props, 12)
    assert decoded.delivery_mode == 2 and decoded.headers == {"h": 1}
    assert confirms == [(3, True, True), (4, False, False)]
    wire = link.transport
    assert isinstance(wire, Wire) and wire.out.startswith(spec.PROTOCOL_HEADER)
    assert b"\x00u\x00p" in wire.out  # PLAIN response


def test_garbage_after_the_frames_fails_the_link() -> None:
    link, deliveries, _ = drive([server_frames() + b"\x09garbage!"])
    assert len(deliveries) == 1 and link.closed.done()
    exc = link.closed.result()
    assert isinstance(exc, LinkClosed) and "protocol error" in str(exc)


def test_a_body_frame_without_a_delivery_fails_the_link() -> None:
    frames = server_frames()
    open_ok = method_frame(1, spec.Channel.OpenOk())
    link, _, _ = drive([frames[:frames.index(open_ok) + len(open_ok)], b"\x03\x00\x01\x00\x00\x00\x01x\xce"])
    assert link.closed.done() and "unexpected content body" in str(link.closed.result())
