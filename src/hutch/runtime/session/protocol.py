"""The asyncio adapter of an AMQP connection: socket callbacks in, `AMQPConnection` calls out.

Owns: what only a socket on an event loop has. The transport's write-buffer limits (a batch of
deliveries may sit in the buffer before deliveries to that consumer pause), the fairness rule between
connections (a per-iteration read budget), the measure of how busy the loop is with input (the node's
`LoopLoad`, which the flow rule reads: core/credit_flow.py), and the wiring of one connection to its ports: the
transport itself as the `Transport`, the event loop as the `LoopClock`, the node's `ClusterGate` as the
`MethodGate`, and, in a node of workers, the connection-locality port (`Handover`) and the adoption
of a connection another worker handed over (`adopted`: its state), and, on the plain listener, the slot
the connection holds in the listener's `HandshakeGate` from the accept until its login succeeds (or it
closes): past the gate's caps the socket is closed at the accept (runtime/listen.py). All the protocol logic is in `connection.py`, which never sees asyncio's Protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from hutch.runtime.listen import HeldSlot
from hutch.runtime.session.cluster_gate import ClusterGate
from hutch.runtime.session.connection import AMQPConnection

if TYPE_CHECKING:
    from hutch.runtime.listen import HandshakeGate
    from hutch.runtime.ports import BrokerPort
    from hutch.runtime.session.ports import Handover

WRITE_BUFFER_HIGH = 1024 * 1024
WRITE_BUFFER_LOW = 256 * 1024
READ_BUDGET = 256 * 1024  # bytes one connection may process per event-loop iteration


class AMQPProtocol(asyncio.Protocol):
    """One accepted socket. `conn` is the connection state machine the node and management see."""

    def __init__(self, node: BrokerPort, handover: Handover | None = None, adopted: bytes | None = None,
                 gate: HandshakeGate | None = None,
                 island: Callable[[AMQPConnection], None] | None = None) -> None:
        self.loop = asyncio.get_event_loop()
        self.conn = AMQPConnection(node, self.loop, ClusterGate(node), handover)
        self._adopted = adopted  # the state of a connection another worker handed over, adopted at connection_made
        # an island's connection (compaction of load): its consumers and deliveries restored, then its unread
        # bytes handled, right after the adoption (runtime/compaction.py)
        self._island = island
        self._slot = HeldSlot(gate) if gate is not None else None  # held from the accept until the login
        self._load = node.loop_load
        self._read_this_turn = 0
        self._turn_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (asyncio's or uvloop's, which is not an asyncio.Transport subclass)
        stream = cast(asyncio.Transport, transport)
        # deliveries are encoded in batches; let a batch sit in the buffer before pausing deliveries
        stream.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        if self._adopted is not None:
            adopted, self._adopted = self._adopted, None
            self._load.timed(self.conn.adopt, stream, adopted)
            if self._island is not None:
                island, self._island = self._island, None
                self._load.timed(island, self.conn)
            return
        if self._slot is not None:
            if not self._slot.take(stream):
                return  # closed at the accept (a cap of the gate): nothing started
            self.conn.on_login = self._slot.release
        peer = stream.get_extra_info("peername") or ("?", 0)
        sock = stream.get_extra_info("sockname") or ("?", 0)
        self.conn.connection_made(stream, peer, sock)

    def data_received(self, data: bytes) -> None:
        self._spend_read_budget(len(data))
        self._load.timed(self.conn.receive_data, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._slot is not None:
            if self._slot.refused:
                return
            self._slot.release()
        self.conn.connection_lost()

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    def _spend_read_budget(self, nbytes: int) -> None:
        """Fairness between connections: after READ_BUDGET bytes in one loop iteration a connection
        stops reading until the next iteration, so one fast publisher cannot starve the acks and
        deliveries of everyone else (libuv otherwise keeps reading a busy socket many times)."""
        self._read_this_turn += nbytes
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._next_turn)
        if self._read_this_turn >= READ_BUDGET:
            self.conn.hold_reading("budget")

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self._read_this_turn = 0
        self.conn.release_reading("budget")
