"""The in-process pipe between a shovel's client and the node (runtime/shovel/pipe.py): bytes arrive in
order on a later turn of the loop, flow control as a socket's, and close delivers what was written."""

from __future__ import annotations

import asyncio

from hutch.runtime.shovel.pipe import LocalPipe


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.got = bytearray()
        self.events: list[str] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # the pipe's end has the methods used here
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.got += data

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_bytes_in_order_on_a_later_turn_and_close_delivers_them() -> None:
    async def run() -> None:
        pipe = LocalPipe(asyncio.get_running_loop())
        a, b = Recorder(), Recorder()
        pipe.connect(a, b)
        assert a.events == b.events == ["made"]
        assert a.transport is not None and b.transport is not None
        a.transport.write(b"one ")
        a.transport.writelines([b"two ", b"three"])
        assert b.got == b""  # never inside the writer's call
        await _turns()
        assert b.got == b"one two three"
        b.transport.write(b"reply")
        a.transport.write(b" last")
        a.transport.close()
        a.transport.write(b" after close")
        await _turns()
        assert a.got == b"reply" and b.got == b"one two three last"
        assert a.events[-1] == b.events[-1] == "lost" and a.events.count("lost") == b.events.count("lost") == 1
        assert a.transport.is_closing()

    asyncio.run(run())


def test_flow_control_as_a_socket() -> None:
    async def run() -> None:
        pipe = LocalPipe(asyncio.get_running_loop())
        a, b = Recorder(), Recorder()
        pipe.connect(a, b)
        assert a.transport is not None and b.transport is not None
        a.transport.set_write_buffer_limits(high=100, low=10)
        b.transport.pause_reading()
        a.transport.write(b"x" * 60)
        assert "pause" not in a.events
        a.transport.write(b"x" * 60)
        assert a.events.count("pause") == 1 and a.transport.get_write_buffer_size() == 120
        await _turns()
        assert b.got == b""  # the reader paused: nothing delivered
        b.transport.resume_reading()
        await _turns()
        assert len(b.got) == 120 and a.events.count("resume") == 1

    asyncio.run(run())
