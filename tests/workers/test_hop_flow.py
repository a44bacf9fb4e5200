"""Credit flow across the worker (or node) hop, the link's half: a `RemoteQueue` holds its publishers
while the link to its home is over its write high-water mark, and lets them go once it drains
(runtime/queue_types/remote.py, `needs_flow_control` / `flow_still_needed`). Pure: a stand-in link."""

from __future__ import annotations

from typing import Any

from hutch.runtime.queue_types.remote import RemoteQueue


class Transport:
    def __init__(self) -> None:
        self.paused: set[str] = set()

    def writable(self, name: str) -> bool:
        return name not in self.paused


class Link:
    def __init__(self) -> None:
        self.transport = Transport()
        self.connected = {"n#w1"}

    def up(self, peer: str) -> bool:
        return peer in self.connected


class Conn:
    def __init__(self) -> None:
        self.unblocked: list[Any] = []

    def flow_unblock(self, queue: Any) -> None:
        self.unblocked.append(queue)


def test_a_backed_up_link_holds_publishers_until_it_drains() -> None:
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    assert not q.needs_flow_control()
    link.transport.paused.add("n#w1")  # the home reads slower than we write
    assert q.needs_flow_control() and q.flow_still_needed()
    conn = Conn()
    q.flow_waiters.add(conn)  # type: ignore[arg-type]
    q.release_flow_if_done()
    assert conn.unblocked == []  # still backed up: held
    link.transport.paused.clear()
    q.release_flow_if_done()
    assert conn.unblocked == [q] and not q.flow_waiters


def test_a_home_that_is_down_does_not_hold_publishers() -> None:
    link = Link()
    q = RemoteQueue(link, "n#w1", "/", "q", False, False, False, {})  # type: ignore[arg-type]
    link.transport.paused.add("n#w1")
    link.connected.clear()  # the publishes are refused (404 / nack), not held forever
    assert not q.needs_flow_control()
