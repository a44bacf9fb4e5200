"""One AMQP client connection as a state machine: bytes in (`receive_data`), frames out (to a `Transport`).

Owns: the connection handshake (protocol header, start/start-ok with PLAIN, AMQPLAIN or, on a TLS
connection with a verified client certificate, EXTERNAL; tune/tune-ok negotiation, open), heartbeats
both ways, channel multiplexing, the close handshakes, and
the write buffer that every channel of this connection encodes into.

The socket, the asyncio loop and the cluster are ports (runtime/session/ports.py): the connection writes
to a `Transport`, takes time and timers from a `LoopClock`, and asks a `MethodGate` what a method must
wait for. `runtime/session/protocol.py` adapts it to an asyncio socket; tests drive it in memory
(tests/session/memory.py).

Rules (uvicorn/asyncpg style hot path):
- `receive_data` feeds the frame reader and dispatches every complete frame synchronously; no task or
  coroutine per frame. Output is collected in `out` and written once per batch (`flush`).
- A `ChannelError` closes only its channel; a `ConnectionError_` sends connection.close and then
  ignores everything but close/close-ok. Nothing a client sends can raise out of `receive_data`.
- The close handshake ends the way RabbitMQ's reader ends it: once close-ok is sent (the client
  closed) the connection reads and discards whatever still arrives until the client closes the socket,
  at most `closing_timeout_s()`; closing at once would fail the writes a client still has queued (an
  EPIPE instead of its close callback: issue 22). After the server's own connection.close it reads
  and discards until close-ok (then closes), a simultaneous close, the client's EOF or CLOSE_OK_TIMEOUT_S.
  Every read hold but the per-iteration budget is dropped then: a held socket would never see close-ok.
- Deliveries stop while the transport's write buffer is above its high-water mark (`write_paused`).
- A turn's time is the loop's, shared with every other connection (runtime/turns.py, `TurnScheduler`,
  one per loop): the frame loop looks at the loop's budget after every `STEP_FRAMES` frames (a publish
  with its content counts one, a publish lane's run its length) and after a content header larger than
  `TABLE_CHECK_BYTES` (its properties carry a table, decoded to validate it: ~10-40 ns a byte compiled,
  amqp/_ctable.pyx; ~0.25-0.5 µs in the pure path, which runs when the build is missing). When the
  turn's budget is spent, or another connection waits for its next step (`yield_now`), the rest of the
  input waits, reading held ("turn"), in the scheduler's queue, resumed round-robin in a later turn; a
  connection whose input arrives while others wait queues behind them before its first frame (not
  while the window is merely spent: a client whose header arrives in two reads then went to the back of
  the queue at each read, and 256 one-header senders took 29 s and stalled a probe 24 s, docs/security.md). Without
  it each connection had its own `TURN_S` (10 ms) a turn, looked at only after large headers: 64
  connections spent 64 x (10 ms + a header) in one turn, and 64 bursts of 5,000 small frames (each within
  the read budget) 7.3 s (docs/security.md). A connection alone with a small read pays a counter and
  a look at the queue's length, as it paid one look at the clock before.
- Connection locality (a node of workers, `Handover` port): the first basic.publish (the default
  exchange, or a direct, topic or fanout one) or basic.consume of a connection is judged once; when
  every queue it reaches lives in one other worker and the
  connection is quiet (session/handover.py), the connection moves there with the frames it has not
  handled, the triggering one first, and this worker forgets it without closing the TCP connection
  (`_hand_over`). The worker that takes it `adopt`s it as an open connection. A connection moves at
  most once: an adopted one is never judged again.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import ssl
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.amqp import spec
from hutch.amqp.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ChannelError,
    ConnectionError_,
    FrameError,
)
from hutch.amqp.frames import HEARTBEAT_FRAME, method_frame, method_frame_raw
from hutch.amqp.speedups import FrameReader
from hutch.core.auth import (
    is_loopback_address,
    parse_amqplain,
    parse_plain,
    vhost_access_refused_text,
)
from hutch.core.certs import CertLoginError, login_from_cert
from hutch.core.logsafe import LogThrottle, safe, suppressed_note
from hutch.runtime.errors import ClusterUnavailable, cluster_timeout_text
from hutch.runtime.session.channel import ServerChannel
from hutch.runtime.session.confirms import ChannelConfirms
from hutch.runtime.session.handover import HandoverState, channel_states, first_publish_queues, quiet_reason
from hutch.runtime.turns import scheduler_of
from hutch.runtime.workers.control import MAX_UNREAD_BYTES
from hutch.runtime.workers.relay import peer_hung_up

if TYPE_CHECKING:
    from hutch.config import Config
    from hutch.core.auth import LoginOutcome
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.ports import BrokerPort
    from hutch.runtime.session.ports import Handover, LoopClock, MethodGate, TimerHandle, Transport

log = logging.getLogger("hutch.connection")
# node-wide (one per process) throttles of the log lines any client can repeat at will (core/logsafe.py)
LOGIN_REFUSALS_LOG = LogThrottle()
UPDATE_SECRET_LOG = LogThrottle()

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}



def server_properties(config: Config) -> dict[str, Any]:
    """connection.start's server-properties."""
    return {
        "capabilities": dict(CAPABILITIES),
        "cluster_name": config.cluster_name,
        "copyright": "Copyright (c) the hutch authors",
        "information": "Licensed under the Apache License 2.0. Website: https://github.com/hutch-broker",
        "platform": f"Python {platform.python_version()}",
        "product": "hutch",
        "version": __version__,
    }


LOGIN_REFUSED = ("Login was refused using authentication mechanism {}. For details see the broker "
                 "logfile.")


# RabbitMQ's reader accepts frames up to 8 bytes longer than frame_max (rabbit_reader's
# FRAME_SIZE_FUDGE): several clients put frame_max payload bytes in a body frame
FRAME_SIZE_TOLERANCE = spec.FRAME_OVERHEAD
# unfinished bodies a connection may hold, in units of max_message_size, when not configured
UNFINISHED_BODIES_MESSAGES = 4
# while a connection is held by flow control, how often its queues are asked whether they still need to
FLOW_RECHECK_S = 0.1
# a connection reads "flow" (management, hutchctl) while a queue holds it and for this long after a hold
# began, as RabbitMQ's credit_flow:state/0 (STATE_CHANGE_INTERVAL, 1 s): a hold that lasts a few ms at a
# time under a steady load is still visible to an operator who samples the state every second
FLOW_STATE_S = 1.0
# reading held for these does not make a connection busy: the asyncio adapter's per-turn budget, and an
# island's move (runtime/compaction.py), which holds reading while it waits for the connection to be quiet
NOT_BUSY_HOLDS = frozenset({"budget", "island"})
# the longest a closed connection keeps its socket for the client to close it (rabbit_reader's
# CLOSING_TIMEOUT; shorter when the negotiated heartbeat timeout is)
CLOSING_TIMEOUT_S = 30.0
# the longest the node waits for close-ok after its own connection.close (a client that does not answer
# is gone from the connection list in that time, as the management API's users expect)
CLOSE_OK_TIMEOUT_S = 3.0
_PUBLISH_ID = b"\x00\x3c\x00\x28"
_ACK_ID = b"\x00\x3c\x00\x50"
_FAST_IDS = frozenset((_PUBLISH_ID, _ACK_ID))


class State:
    HEADER = 0
    START = 1
    AUTHENTICATING = 2
    TUNE = 3
    OPEN_WAIT = 4
    OPEN = 5
    CLOSING = 6  # connection.close sent, waiting for close-ok (input read and discarded meanwhile)
    DISCARDING = 7  # the handshake is over: input is discarded until the client closes the socket
    CLOSED = 8


# frames handled between two looks at the loop's budget (runtime/turns.py): one step of a connection's input;
# the costliest small method (a queue.declare that creates) takes ~0.1 ms, so a step stays ~1-3 ms
STEP_FRAMES = 32
TABLE_CHECK_BYTES = 1024  # a content header larger than this is followed by a look at the loop's budget

_OPEN, _CLOSING, _DISCARDING = State.OPEN, State.CLOSING, State.DISCARDING  # the frame loop's constants
_FRAME_METHOD, _FRAME_BODY = spec.FRAME_METHOD, spec.FRAME_BODY
_CONTENT_FRAMES = (spec.FRAME_BODY, spec.FRAME_HEADER)
LANE_RUN = 256  # publishes a channel's publish lane takes from the read buffer in one step (ServerChannel.lane_run)


class AMQPConnection:
    """The server side of one AMQP 0-9-1 connection, without IO of its own.

    Driven by: `connection_made(transport, peer, sockname)`, `receive_data(bytes)`, `pause_writing()` /
    `resume_writing()` (the transport's write buffer), `connection_lost()`, and the callbacks it
    registers on its `LoopClock`. Output goes to `transport.write` in batches (`flush`)."""

    def __init__(self, node: BrokerPort, clock: LoopClock, gate: MethodGate | None = None,
                 handover: Handover | None = None) -> None:
        self.node = node
        self.clock = clock
        # the loop's budget for input work, shared by all its connections (its served turns counted as the
        # node's loop work: runtime/turns.py)
        self.turns = scheduler_of(clock, node.loop_load.timed)
        self.gate = gate
        self.handover = handover
        # the first publish or consume is still to be judged for a move to its queue's worker
        self.locality_armed = handover is not None
        self.handed_over = False  # moved to another worker: this one forgot it (the socket lives on there)
        cfg = node.config
        self.state = State.HEADER
        self.transport: Transport | None = None
        self.reader = FrameReader(max(cfg.frame_max, spec.FRAME_MIN_SIZE) if cfg.frame_max else 0,
                                  tolerance=FRAME_SIZE_TOLERANCE)
        self._header_buf = b""
        self.out: list[bytes] = []
        self.channels: dict[int, ServerChannel] = {}
        self.closing_channels: set[int] = set()
        self.channel_max = cfg.channel_max or 65535
        self.frame_max = cfg.frame_max
        self.heartbeat_s = cfg.heartbeat_s
        self.user_name = ""
        self.vhost_obj: VirtualHost | None = None
        self.counts_for_limits = False  # open (past connection.open) and not closed: the limits count it
        self.capabilities: dict[str, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self.peer = ("", 0)
        self.name = ""
        self.write_paused = False
        self.flow_blocked = False
        self._flow_blocked_at: float | None = None  # when the last hold by a queue began (FLOW_STATE_S)
        self.has_published = False
        self.alarm_blocked = False
        self._flow_queues: set[Any] = set()
        self._flow_timer: TimerHandle | None = None
        self._read_holds: set[str] = set()
        self._suspended = False
        # an island's move waits for this connection to be quiet (`hold_island`): no publish is begun whose
        # content is not wholly buffered, reading is held between messages, and deliveries are held
        self.island_held = False
        self._transport_write_paused = False  # the transport's own pause_writing (write_paused also holds for an island)
        self._waits_turn = False  # in the loop scheduler's queue, reading held ("turn")
        self._cluster_task: asyncio.Task[None] | None = None
        self._in_receive = False
        self._flush_scheduled = False
        self._confirm_channels: set[ServerChannel] = set()
        self._loop = asyncio.get_event_loop()  # the login check's executor and the gated methods' tasks
        self._last_recv = 0.0
        self._last_sent = 0.0
        self._timer: TimerHandle | None = None
        self._close_timer: TimerHandle | None = None
        self.connected_at_ms = 0
        self.recv_oct = 0
        self.send_oct = 0
        self.auth_mechanism = ""
        self.on_login: Callable[[], None] | None = None  # told once the login succeeds (the listener's gate)
        # bytes of message bodies whose last frame has not arrived yet, over all channels, and the cap
        self.unfinished_body_bytes = 0
        self.unfinished_body_limit = max(
            cfg.max_unfinished_body_bytes or UNFINISHED_BODIES_MESSAGES * cfg.max_message_size,
            cfg.max_message_size)
        self.ssl_object: ssl.SSLObject | None = None  # set on a TLS connection (in the worker that holds its session)
        # a TLS connection's (version, cipher): its own, or one relayed from the worker that accepted it
        self.tls: tuple[str, str] | None = None
        self.sockname = ("", 0)  # the node's address the client reached
        self.peer_cert: bytes | None = None  # DER of a client certificate the TLS handshake verified
        # set only by code in this process, never from the wire: an in-process connection (a shovel's,
        # runtime/shovel/pipe.py) that logs in as this existing user without a password
        self.trusted_user: str | None = None

    # -- driven by the transport's owner -----------------------------------------------------------
    def connection_made(self, transport: Transport, peer: tuple[str, int], sockname: tuple[str, int]) -> None:
        self.transport = transport
        self.peer = (str(peer[0]), int(peer[1]))
        self.sockname = (str(sockname[0]), int(sockname[1]))
        self.ssl_object = transport.get_extra_info("ssl_object")
        if self.ssl_object is not None:
            self.tls = (str(self.ssl_object.version()), (self.ssl_object.cipher() or ("",))[0])
            if self.ssl_object.context.verify_mode != ssl.CERT_NONE:
                self.peer_cert = self.ssl_object.getpeercert(binary_form=True)  # None: the client sent none
        self.name = f"{self.peer[0]}:{self.peer[1]} -> {sockname[0]}:{sockname[1]}"
        now = self.clock.time()
        self._last_recv = self._last_sent = now
        self.connected_at_ms = int(self.node.wall_ms())
        self.node.connections.add(self)
        self.node.churn["connections_opened"] += 1
        timeout_s = self.node.config.handshake_timeout_ms / 1000
        self._timer = self.clock.call_later(timeout_s, self._handshake_timeout)

    def connection_lost(self) -> None:
        self.state = State.CLOSED
        if self._timer is not None:
            self._timer.cancel()
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._release_all()
        if self in self.node.connections:
            self.node.connections.discard(self)
            self.node.churn["connections_closed"] += 1

    def pause_writing(self) -> None:
        self._transport_write_paused = self.write_paused = True

    def resume_writing(self) -> None:
        self._transport_write_paused = False
        self._resume_deliveries()

    def _resume_deliveries(self) -> None:
        """Deliveries go on once neither the transport nor an island's move holds them (`write_paused` is
        kept as the two together, for the delivery path's one attribute look)."""
        if self._transport_write_paused or self.island_held:
            return
        self.write_paused = False
        for ch in list(self.channels.values()):
            ch._resume_consumers()

    # -- an island's move (runtime/compaction.py) --------------------------------------------------
    def hold_island(self) -> None:
        """Hold this connection for an island's move, between messages: deliveries stop (what is on the
        wire is unacked and moves), the frame loop never begins a publish whose content is not wholly
        buffered (`_process_island`), and reading is held, except while a publish begun before is still
        arriving: reading goes on until its content is whole, then is held (`_island_reading`)."""
        self.island_held = True
        self.write_paused = True
        self._island_reading()

    def release_island(self) -> None:
        """The move is over without this connection (given up): deliveries and reading go on, and the
        frames held back are handled in a later turn. A no-op on a connection handed over."""
        if not self.island_held:
            return
        self.island_held = False
        if self.transport is None:
            return
        self._resume_deliveries()
        self.release_reading("island")
        if self.reader.buffered and not self._suspended and self.state < _DISCARDING:
            self._wait_turn()

    def _island_reading(self) -> None:
        """Under an island hold: reading on while a publish's content is still arriving, else held (the
        transport paused even if a pause asked inside `connection_made` was not honoured)."""
        if not self.island_held:
            return
        if any(ch.content_in_progress() for ch in self.channels.values()):
            self.release_reading("island")
        else:
            self.hold_reading("island")
            self._sync_reading()

    def _sync_reading(self) -> None:
        """The transport paused while a hold is on. uvloop starts reading right after `connection_made`
        returns whatever it was told, so a hold taken there (an adopted connection's unread frames that
        wait their turn) would otherwise leave it reading for as long as holds overlap."""
        t = self.transport
        is_reading = getattr(t, "is_reading", None)
        if t is not None and self._read_holds and is_reading is not None and not t.is_closing() and is_reading():
            t.pause_reading()

    # -- flow control ----------------------------------------------------------------------------
    def hold_reading(self, reason: str) -> None:
        """Stop reading input until every reason given is released (flow, alarm, login, cluster, and
        the asyncio adapter's per-iteration read budget). Once the connection is closing only the
        budget holds: the rest of the input is read to find close-ok or to be discarded."""
        if self.state >= _CLOSING and reason != "budget":
            return
        if not self._read_holds and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._read_holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason in self._read_holds:
            self._read_holds.discard(reason)
            if not self._read_holds and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def flow_block(self, queue: Any) -> None:
        """A queue this connection publishes to is backed up behind consumers the node is not serving
        fast enough: stop reading this socket (after the current batch) until the queue says it has
        drained, or until a recheck (every FLOW_RECHECK_S) finds it no longer needs to hold us."""
        queue.flow_waiters.add(self)
        self._flow_queues.add(queue)
        if not self.flow_blocked:
            self._flow_blocked_at = self.clock.time()
        self.flow_blocked = True
        self.hold_reading("flow")
        if self._flow_timer is None:
            self._flow_timer = self.clock.call_later(FLOW_RECHECK_S, self._flow_recheck)

    def flow_unblock(self, queue: Any) -> None:
        self._flow_queues.discard(queue)
        if self.flow_blocked and not self._flow_queues:
            self.flow_blocked = False
            self.release_reading("flow")
            if self._flow_timer is not None:
                self._flow_timer.cancel()
                self._flow_timer = None

    def _flow_recheck(self) -> None:
        """The bound on a flow block: a queue whose consumers stopped keeping pace, or whose node has
        time to spare again, lets this connection go even though nothing was delivered."""
        self._flow_timer = None
        for queue in list(self._flow_queues):
            if not queue.flow_still_needed():
                queue.flow_waiters.discard(self)
                self.flow_unblock(queue)
        if self._flow_queues and self.state != State.CLOSED:
            self._flow_timer = self.clock.call_later(FLOW_RECHECK_S, self._flow_recheck)

    def receive_data(self, data: bytes) -> None:
        """Bytes from the client: every complete frame is handled before this returns (unless the
        connection is suspended: a login or a gated method pending), and the output is flushed."""
        self._last_recv = self.clock.time()
        self.recv_oct += len(data)
        if self.state >= _DISCARDING:  # close-ok is sent: what the client still had queued is dropped
            return
        if self.state == State.HEADER:
            data = self._protocol_header(data)
            if not data:
                return
        self.reader.feed(data)
        if self._suspended:  # waiting for the cluster or an authentication check: frames stay queued
            if self.state == State.AUTHENTICATING and self.reader.buffered > self._pre_auth_limit():
                log.warning("connection %s: %d bytes sent while the login was pending, closing",
                            self.name, self.reader.buffered)
                self._abort()
            return
        self._drain_frames()

    # -- frame processing ------------------------------------------------------------------------
    def _drain_frames(self, resumed: bool = False) -> None:
        """Handle every complete frame the reader holds (as the loop's budget allows: `_turn_spent`), then
        write what they produced once."""
        self._in_receive = True
        try:
            if self.island_held:
                self._process_island(resumed)
            else:
                self._process_frames(resumed)
        finally:
            self._in_receive = False
        self.flush()

    def _process_island(self, resumed: bool) -> None:
        """The frame loop under an island hold: the frames up to the first publish whose content is not
        wholly buffered (`FrameReader.cut_unfinished_publish`); that publish and what follows stay buffered
        (moved as the connection's unread bytes, or handled after the hold)."""
        tail = self.reader.cut_unfinished_publish()
        try:
            self._process_frames(resumed)
        finally:
            if tail:
                self.reader.feed(tail)
        self._island_reading()

    def _process_frames(self, resumed: bool) -> None:
        # the hot loop of the node (three frames per message): constants and the channel map are
        # locals, and content frames, two of a publish's three, are tested for first. `left`: frames
        # until the next look at the loop's budget (a step); a new input waits behind those waiting
        channels = self.channels
        if not resumed and self.turns.waiting():
            self._wait_turn()
            return
        left = STEP_FRAMES
        try:
            for ftype, channel, payload in self.reader.frames():
                if self.state == _CLOSING:
                    self._frame_while_closing(ftype, channel, payload)
                elif ftype in _CONTENT_FRAMES:
                    ch = channels.get(channel)
                    if ch is None:
                        if channel not in self.closing_channels:
                            raise ConnectionError_(UNEXPECTED_FRAME,
                                                   f"content frame on channel {channel} which is not open")
                        continue
                    try:
                        if ftype == _FRAME_BODY:
                            ch.handle_body(payload)
                        else:
                            ch.handle_header(payload)
                            if len(payload) > TABLE_CHECK_BYTES and self._turn_spent():
                                return
                    except ChannelError as exc:
                        self._channel_error(channel, exc)
                elif ftype == _FRAME_METHOD:
                    prefix = payload[:4]
                    if prefix in _FAST_IDS and self.state == _OPEN:
                        ch = channels.get(channel)
                        if ch is not None:
                            try:
                                if prefix != _PUBLISH_ID:
                                    if ch.fast_ack(payload):
                                        left -= 1
                                        if not left:
                                            if self._turn_spent():
                                                return
                                            left = STEP_FRAMES
                                        continue
                                elif self.locality_armed:
                                    pass  # the first publish: `_method_frame` judges a move
                                elif ch.fast_publish(payload):
                                    # its header and body, when both are in and well formed, without two
                                    # more turns of this loop (not under an alarm: a header then holds
                                    # the input before its body, handle_header)
                                    content = None if self.node.alarms else self.reader.take_content(channel)
                                    if content is None:
                                        continue
                                    if ch.handle_content(content[0], content[1]):  # the publish lane took it
                                        run = self.reader.take_publishes(channel, payload,
                                                                         self.node.config.max_message_size, LANE_RUN)
                                        if run:
                                            ch.lane_run(run)
                                            left -= len(run)
                                    if self._suspended or self.state >= _DISCARDING:
                                        return
                                    left -= 1
                                    if left <= 0 or len(content[0]) > TABLE_CHECK_BYTES:
                                        if self._turn_spent():
                                            return
                                        left = STEP_FRAMES
                                    continue
                            except ChannelError as exc:
                                self._channel_error(channel, exc)
                                continue
                    self._method_frame(channel, payload)
                elif channel != 0:
                    raise FrameError("heartbeat frame on a non-zero channel")
                if self._suspended or self.state >= _DISCARDING:
                    return
                left -= 1
                if not left:
                    if self._turn_spent():
                        return
                    left = STEP_FRAMES
        except ConnectionError_ as exc:
            self.close_with_error(exc)
        except Exception as exc:  # a bug must not take the node down
            log.exception("internal error on connection %s", self.name)
            self.close_with_error(ConnectionError_(INTERNAL_ERROR, f"internal error: {exc}"))

    def _turn_spent(self) -> bool:
        """After a step: when the loop's budget for this turn is spent or another connection waits for
        its next step, the frames still buffered wait their turn (`_wait_turn`), and True."""
        if not self.turns.yield_now() or not self.reader.buffered:  # (nothing left: nothing to wait for)
            return False
        self._wait_turn()
        return True

    def _wait_turn(self) -> None:
        """Suspended, reading held, in the loop scheduler's queue until `_next_turn`."""
        self._suspended = True
        self._waits_turn = True
        self.hold_reading("turn")
        self.turns.wait(self._next_turn)

    def _next_turn(self) -> None:
        """The scheduler's call in a later turn: one step at least, and on until the budget is spent or
        another waits. Reading stays held while it waits again (no resume and pause of the socket a
        turn); a connection closed meanwhile does nothing."""
        self._suspended = False
        self._waits_turn = False
        if self.state < _DISCARDING:  # (closing: the frames are read for close-ok)
            self._drain_frames(resumed=True)
        if not self._waits_turn:
            self.release_reading("turn")

    def _method_frame(self, channel: int, payload: bytes) -> None:
        method = spec.decode_method(payload)
        if channel == 0:
            self._connection_method(method)
            return
        if self.state != State.OPEN:
            raise ConnectionError_(UNEXPECTED_FRAME, f"method {method.NAME} before connection.open",
                                   method.CLASS_ID, method.METHOD_ID)
        ch = self.channels.get(channel)
        if ch is None:
            self._no_such_channel(channel, method)
            return
        if self.locality_armed and isinstance(method, (spec.Basic.Publish, spec.Basic.Consume)) \
                and self._hand_over(ch, channel, method, payload):
            return
        if self.gate is not None and self.gate.wants(ch, method):
            self._suspend_for_gate(ch, channel, method)
            return
        try:
            ch.handle_method(method)
        except ChannelError as exc:
            self._channel_error(channel, exc)

    # -- connection locality (a node of workers) ------------------------------------------------------
    def state_is_busy(self) -> bool:
        """Not at rest: not open, a method or login waiting, or reading held for anything but the
        per-turn budget (or an island's move, which holds it to judge this). The loop scheduler's "turn"
        hold counts only while the connection waits for its turn: in the turn (`_next_turn` drains the
        frames before it lets go of the hold) its unread frames are what a hand-over carries. Without
        that, under load every connection whose first publish came in a later turn stayed in the worker
        that accepted it, and each of its messages crossed the worker hop."""
        if self.state != State.OPEN or self._suspended or self._cluster_task is not None:
            return True
        holds = self._read_holds - NOT_BUSY_HOLDS
        if holds and not self._waits_turn:
            holds = holds - {"turn"}
        return bool(holds)

    def _hand_over(self, ch: ServerChannel, channel: int, method: spec.Method, payload: bytes) -> bool:
        """The first publish or consume: move to its queue's worker when that is another and this
        connection is quiet. True when it moved (this worker has forgotten it; stop handling frames)."""
        self.locality_armed = False
        handover, vhost, transport = self.handover, self.vhost_obj, self.transport
        assert handover is not None and vhost is not None and transport is not None
        if isinstance(method, spec.Basic.Publish):
            queues = first_publish_queues(vhost, method.exchange, method.routing_key)
        else:
            assert isinstance(method, spec.Basic.Consume)
            queue = vhost.queues.get(method.queue or ch.last_queue_name or "")
            queues = [queue] if queue is not None else []
        homes = {handover.home_of(q) for q in queues}
        to = homes.pop() if len(homes) == 1 else None  # every queue in one other worker (None: one is here)
        if to is None:
            return False
        reason = quiet_reason(self)
        if reason is None:
            self.flush()  # what the frames before this one produced goes out from here
            buffered = getattr(transport, "get_write_buffer_size", None)
            if buffered is None or buffered():
                reason = "output not written yet"
        if reason is not None:
            log.debug("connection %s stays in this worker (queue in worker %d): %s", self.name, to, reason)
            return False
        sock = transport.get_extra_info("socket")
        reader = self.reader
        unread = method_frame_raw(channel, payload) + bytes(memoryview(reader._buf)[reader._pos:])
        if sock is None or len(unread) > MAX_UNREAD_BYTES:
            return False
        state = self.handover_state(unread)
        relayed = self.ssl_object is not None  # its TLS session stays here, relayed (runtime/workers/relay.py)
        if not (handover.relay(transport, state.encode(), to) if relayed else handover.move(sock, state.encode(), to)):
            return False
        log.debug("connection %s moved to worker %d%s", self.name, to, " (TLS, relayed)" if relayed else "")
        self._forget_moved(keep_transport=relayed)
        return True

    def handover_state(self, unread: bytes) -> HandoverState:
        """What moves of this open connection to another worker, with `unread` (the bytes it has read
        and not handled, to be handled there; not counted as received here)."""
        vhost = self.vhost_obj
        assert vhost is not None and self.state == State.OPEN
        return HandoverState(self.user_name, vhost.name, self.frame_max, self.channel_max, self.heartbeat_s,
                             dict(self.client_properties), self.auth_mechanism, self.peer, self.name,
                             self.connected_at_ms, self.recv_oct - len(unread), self.send_oct, self.has_published,
                             channel_states(self.channels), unread, self.sockname, self.tls, self.peer_cert)

    def _forget_moved(self, keep_transport: bool = False) -> None:
        """This worker lets go of a connection another worker now holds: no close frame, no close
        counted, the socket closed here only (the other worker holds its duplicate), or, relayed
        (`keep_transport`), the transport left to the relay that now owns it."""
        self.handed_over = True
        if self in self.node.connections:
            self.node.connections.discard(self)
        self._release_all()
        self.state = State.CLOSED
        for timer in (self._timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._close_timer = None
        self.out.clear()
        transport, self.transport = self.transport, None
        if transport is not None and not keep_transport:
            transport.pause_reading()
            transport.close()

    def adopt(self, transport: Transport, data: bytes) -> None:
        """Take over a connection another worker of this node handed over (`_hand_over` there): open,
        with its channels as they were, then handle the frames it had not (the triggering one first).
        A state that cannot be adopted (malformed, its vhost or user gone meanwhile) closes the
        connection with 320 CONNECTION_FORCED, as a client expects of a node that drops it."""
        self.transport = transport
        self.locality_armed = False
        self._last_recv = self._last_sent = self.clock.time()
        try:
            st = HandoverState.decode(data)
        except ValueError as exc:
            log.warning("a connection handed over by another worker could not be adopted: %s", exc)
            self.state = State.OPEN_WAIT
            self.close_forced("the connection could not be moved between workers")
            return
        self.peer, self.name, self.sockname = st.peer, st.name, st.sockname
        self.tls, self.peer_cert = st.tls, st.peer_cert
        self.connected_at_ms = st.connected_at_ms
        self.node.connections.add(self)  # counted opened once, by the worker that accepted it
        vhost = self.node.vhosts.get(st.vhost)
        self.state = State.OPEN_WAIT
        if vhost is None or self.node.auth.get_user(st.user) is None:
            self.close_forced("vhost or user deleted")
            return
        self.user_name, self.vhost_obj = st.user, vhost
        self.frame_max = self.reader.frame_max = st.frame_max
        self.channel_max, self.heartbeat_s = st.channel_max, st.heartbeat_s
        self.client_properties = st.client_properties
        caps = st.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        self.auth_mechanism = st.auth_mechanism
        self.recv_oct, self.send_oct, self.has_published = st.recv_oct, st.send_oct, st.has_published
        self.counts_for_limits = True
        self.state = State.OPEN
        for c in st.channels:
            ch = ServerChannel(self, c.number)
            ch.prefetch_count, ch.global_prefetch = c.prefetch_count, c.global_prefetch
            ch.publish_seq, ch.next_tag = c.publish_seq, c.next_tag
            if c.confirm:
                ch.confirm = True
                ch.confirms = ChannelConfirms(ch, tx=False)
                ch.confirms.continue_after(c.publish_seq)
            self.channels[c.number] = ch
        if self.heartbeat_s:
            self._timer = self.clock.call_later(self.heartbeat_s / 2, self._heartbeat_tick)
        if self.node.alarms:
            self.alarm_raised()  # blocked here as it would have been there
        self.receive_data(st.unread)
        self.clock.call_soon(self._sync_reading)  # (called inside connection_made: see `_sync_reading`)

    # -- methods that wait for the cluster (the MethodGate port) -------------------------------------
    def _suspend_for_gate(self, ch: ServerChannel, channel: int, method: spec.Method) -> None:
        """A method the gate wants (a topology method on a clustered node, a queue on another node):
        stop reading this connection, let the gate bring the node up to date, run the method, and
        send its reply once the gate says the change is committed."""
        self._suspended = True
        self.hold_reading("cluster")
        task = self._loop.create_task(self._gated_method(ch, channel, method))
        self._cluster_task = task

    async def _gated_method(self, ch: ServerChannel, channel: int, method: spec.Method) -> None:
        gate = self.gate
        assert gate is not None
        try:
            try:
                await gate.barrier(method)
                if self.state != State.OPEN or self.channels.get(channel) is not ch:
                    return
                try:
                    await gate.prepare(ch, method)
                except ChannelError as exc:
                    self._channel_error(channel, exc)
                    return
                if self.state != State.OPEN or self.channels.get(channel) is not ch:
                    return
                mark = len(self.out)
                try:
                    ch.handle_method(method)
                except ChannelError as exc:
                    self._channel_error(channel, exc)
                if gate.holds_replies():
                    held = self.out[mark:]  # the reply waits for the commit
                    del self.out[mark:]
                    await gate.after()
                    if self.state == State.OPEN:
                        self.out.extend(held)
            except ClusterUnavailable:
                self.close_with_error(ConnectionError_(INTERNAL_ERROR, cluster_timeout_text(method, ch),
                                                       method.CLASS_ID, method.METHOD_ID))
        except ConnectionError_ as exc:
            self.close_with_error(exc)
        except Exception as exc:  # a bug must not take the node down
            log.exception("internal error on connection %s", self.name)
            self.close_with_error(ConnectionError_(INTERNAL_ERROR, f"internal error: {exc}"))
        finally:
            self._cluster_task = None
            self._suspended = False
            self.release_reading("cluster")
            if self.state == State.OPEN:
                self._drain_frames()
            else:
                self.flush()

    def _no_such_channel(self, channel: int, method: spec.Method) -> None:
        if channel in self.closing_channels:
            if isinstance(method, spec.Channel.CloseOk):
                self.closing_channels.discard(channel)
            elif isinstance(method, spec.Channel.Close):
                self.send_method(channel, spec.Channel.CloseOk())
            return
        if isinstance(method, spec.Channel.Open):
            # RabbitMQ limits the count of open channels (a channel closed by the server counts until
            # its close-ok), not their numbers: any number up to 65535 is fine
            opened = len(self.channels) + len(self.closing_channels)
            if self.channel_max and opened >= self.channel_max:
                raise ConnectionError_(NOT_ALLOWED, f"number of channels opened ({opened}) has reached "
                                       f"the negotiated channel_max ({self.channel_max})")
            waiting = self.node.open_channel_limit(self)
            if waiting is not None:  # a worker asks the node's count (runtime/broker/limits.py)
                self._wait_for_limits(waiting, lambda: self._channel_opened(channel), method)
                return
            self._channel_opened(channel)
            return
        raise ConnectionError_(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}",
                               method.CLASS_ID, method.METHOD_ID)

    def _channel_opened(self, channel: int) -> None:
        if self.state != State.OPEN or channel in self.channels:
            return  # closed while its limit was judged (the grant is settled all the same)
        self.channels[channel] = ServerChannel(self, channel)
        self.node.churn["channels_opened"] += 1
        self.send_method(channel, spec.Channel.OpenOk())

    # -- limits that wait for the node's count (a worker of several) ------------------------------------
    def _wait_for_limits(self, waiting: Coroutine[Any, Any, None], then: Callable[[], None],
                         method: spec.Method) -> None:
        """Stop reading until the node's count answers: `then()` runs in the step the wait ends in (the
        grant is counted there), or the wait's 530 closes the connection."""
        self._suspended = True
        self.hold_reading("limits")
        self._cluster_task = self._loop.create_task(self._limits_then(waiting, then, method))

    async def _limits_then(self, waiting: Coroutine[Any, Any, None], then: Callable[[], None],
                           method: spec.Method) -> None:
        try:
            await waiting
            then()
        except ConnectionError_ as exc:
            self.close_with_error(exc)
        except Exception as exc:  # a bug must not take the node down
            log.exception("internal error on connection %s", self.name)
            self.close_with_error(ConnectionError_(INTERNAL_ERROR, f"internal error: {exc}",
                                                   method.CLASS_ID, method.METHOD_ID))
        finally:
            self._cluster_task = None
            self._suspended = False
            self.release_reading("limits")
            if self.state in (State.OPEN, State.OPEN_WAIT):
                self._drain_frames()
            else:
                self.flush()

    def _channel_error(self, channel: int, exc: AMQPError) -> None:
        ch = self.channels.pop(channel, None)
        if ch is None:
            return
        ch.close_internal()
        self.closing_channels.add(channel)
        self.send_method(channel, spec.Channel.Close(reply_code=exc.code, reply_text=exc.reply_text,
                                                     class_id=exc.class_id, method_id=exc.method_id))

    def _frame_while_closing(self, ftype: int, channel: int, payload: bytes) -> None:
        if ftype != spec.FRAME_METHOD or channel != 0:
            return
        try:
            method = spec.decode_method(payload)
        except AMQPError:
            return
        if isinstance(method, spec.Connection.CloseOk):
            self._abort()
        elif isinstance(method, spec.Connection.Close):  # both sides closed at once
            self._send_close_ok()

    # -- handshake -------------------------------------------------------------------------------
    def _protocol_header(self, data: bytes) -> bytes:
        buf = self._header_buf + data
        if len(buf) < 8 and spec.PROTOCOL_HEADER.startswith(buf):
            self._header_buf = buf
            return b""
        if buf[:8] != spec.PROTOCOL_HEADER:
            assert self.transport is not None  # Invariant: bytes arrive only over a transport
            self.transport.write(spec.PROTOCOL_HEADER)
            self._abort()
            return b""
        self._header_buf = b""
        self.state = State.START
        self.send_method(0, spec.Connection.Start(
            version_major=0, version_minor=9,
            server_properties=server_properties(self.node.config),
            mechanisms=" ".join(self._mechanisms()).encode(), locales=b"en_US"))
        self.flush()
        return buf[8:]

    def _connection_method(self, m: spec.Method) -> None:
        state = self.state
        if isinstance(m, spec.Connection.StartOk) and state == State.START:
            self._start_ok(m)
        elif isinstance(m, spec.Connection.TuneOk) and state == State.TUNE:
            self._tune_ok(m)
        elif isinstance(m, spec.Connection.Open) and state == State.OPEN_WAIT:
            self._open(m)
        elif isinstance(m, spec.Connection.Close):
            self._send_close_ok()
        elif isinstance(m, spec.Connection.CloseOk):
            self._abort()
        elif isinstance(m, spec.Connection.UpdateSecret) and state == State.OPEN:
            self._update_secret(m)
        elif isinstance(m, (spec.Connection.Blocked, spec.Connection.Unblocked)):
            pass  # clients may send these; they mean nothing to a server
        else:
            raise ConnectionError_(COMMAND_INVALID if state == State.OPEN else UNEXPECTED_FRAME,
                                   f"unexpected method {m.NAME} on channel 0", m.CLASS_ID, m.METHOD_ID)

    def _start_ok(self, m: Any) -> None:
        self.client_properties = m.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = m.mechanism
        if self.trusted_user is not None:
            self.auth_mechanism = "internal"
            if self.node.auth.get_user(self.trusted_user) is None:
                self._refuse_login(mechanism, f"user '{safe(self.trusted_user)}' (the shovel's) does not exist")
            else:
                self._logged_in(self.trusted_user)
            return
        if mechanism == "EXTERNAL" and mechanism in self._mechanisms():
            self._external_login()
            return
        try:
            if mechanism not in self._mechanisms():
                raise ConnectionError_(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'",
                                       10, 11)
            if mechanism == "PLAIN":
                user, password = parse_plain(m.response)
            elif mechanism == "AMQPLAIN":
                user, password = parse_amqplain(m.response)
            else:
                raise ConnectionError_(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'",
                                       10, 11)
        except ValueError:
            self._refuse_login(mechanism, "malformed response")
            return
        self.auth_mechanism = mechanism
        cfg = self.node.config
        if user in cfg.loopback_users and not is_loopback_address(self.peer[0]):
            # like RabbitMQ: the reason goes to the log, the client gets the generic refusal
            self._refuse_login(mechanism, f"user '{safe(user)}' can only connect via localhost")
            return
        self.state = State.AUTHENTICATING
        self._suspended = True
        self.hold_reading("auth")  # nothing past start-ok is read before the login completes
        # off the loop and bounded; a cached login is answered without the hashing pool (runtime/broker/logins.py)
        fut = asyncio.ensure_future(self.node.logins.check(user, password, self.peer[0]))
        fut.add_done_callback(lambda f: self._auth_done(f, user, mechanism))

    def _auth_done(self, fut: asyncio.Future[LoginOutcome], user: str, mechanism: str) -> None:
        if self.state != State.AUTHENTICATING:
            return
        self._suspended = False
        self.release_reading("auth")
        outcome = None if fut.cancelled() or fut.exception() is not None else fut.result()
        if outcome is None or outcome.user is None:
            reason = outcome.reason if outcome is not None else "internal error"
            self._refuse_login(mechanism, f"user '{safe(user)}' - {reason}")
            return
        self._logged_in(user)
        self._drain_frames()

    def _pre_auth_limit(self) -> int:
        """Bytes a client may have sent past its start-ok while the login is pending: one frame."""
        return (self.reader.frame_max or spec.FRAME_MIN_SIZE) + FRAME_SIZE_TOLERANCE

    def _logged_in(self, user: str) -> None:
        self.user_name = user
        self.state = State.TUNE
        if self.on_login is not None:
            self.on_login()
        cfg = self.node.config
        self.send_method(0, spec.Connection.Tune(channel_max=cfg.channel_max, frame_max=cfg.frame_max,
                                                 heartbeat=cfg.heartbeat_s))

    def _mechanisms(self) -> list[str]:
        """The configured mechanisms; EXTERNAL only with a client certificate TLS verified."""
        return [m for m in self.node.config.auth_mechanisms if m != "EXTERNAL" or self.peer_cert]

    def _external_login(self) -> None:
        """EXTERNAL (rabbitmq_auth_mechanism_ssl): the user named by the verified client certificate,
        which must exist; no password is checked. The loopback rule applies as to any login."""
        assert self.peer_cert is not None
        cfg = self.node.config
        self.auth_mechanism = "EXTERNAL"
        try:
            user = login_from_cert(self.peer_cert, cfg.ssl_cert_login_from, cfg.ssl_cert_login_san_type,
                                   cfg.ssl_cert_login_san_index)
        except CertLoginError as exc:
            self._refuse_login("EXTERNAL", str(exc))
            return
        if user in cfg.loopback_users and not is_loopback_address(self.peer[0]):
            self._refuse_login("EXTERNAL", f"user '{user}' can only connect via localhost")
        elif self.node.auth.get_user(user) is None:
            self._refuse_login("EXTERNAL", f"user '{user}' (from the client certificate) does not exist")
        else:
            self._logged_in(user)

    def _refuse_login(self, mechanism: str, detail: str) -> None:
        left_out = LOGIN_REFUSALS_LOG.admit(self.clock.time())
        if left_out is not None:  # throttled node-wide: any client can repeat a refused login at will
            log.warning("connection %s: login refused: %s%s", self.name, detail, suppressed_note(left_out))
        self._refuse(ACCESS_REFUSED, LOGIN_REFUSED.format(mechanism))

    def _refuse(self, code: int, text: str) -> None:
        if self.capabilities.get("authentication_failure_close"):
            self.close_with_error(ConnectionError_(code, text, 10, 11))
        else:
            self._abort()

    def _tune_ok(self, m: Any) -> None:
        cfg = self.node.config
        for field, minimum, server_value, client_value in (
            ("frame_max", spec.FRAME_MIN_SIZE, cfg.frame_max, m.frame_max),
            ("channel_max", 1, cfg.channel_max, m.channel_max),
        ):
            if client_value and client_value < minimum:
                raise ConnectionError_(NOT_ALLOWED, f"negotiated {field} = {client_value} is lower than "
                                       f"the minimum allowed value ({minimum})", 10, 31)
            if server_value and (client_value == 0 or client_value > server_value):
                raise ConnectionError_(NOT_ALLOWED, f"negotiated {field} = {client_value} is higher than "
                                       f"the maximum allowed value ({server_value})", 10, 31)
        self.frame_max = m.frame_max
        self.reader.frame_max = m.frame_max
        self.channel_max = m.channel_max or 65535
        self.heartbeat_s = m.heartbeat
        self.state = State.OPEN_WAIT

    def _open(self, m: Any) -> None:
        vhost_name = m.virtual_host
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {vhost_name} not found", 10, 40)
        waiting = self.node.open_connection_limits(vhost_name, self.user_name)  # before access, as rabbit_reader
        if waiting is not None:  # a worker asks the node's count (runtime/broker/limits.py)
            self._wait_for_limits(waiting, lambda: self._opened(vhost), m)
            return
        self._opened(vhost)

    def _opened(self, vhost: VirtualHost) -> None:
        """connection.open past its limits: the vhost's access, then open-ok; from here the connection
        counts for the limits until its close handshake (`_release_all`)."""
        if self.state != State.OPEN_WAIT:
            return  # closed while its limits were judged
        if not self.node.auth.can_access_vhost(self.user_name, vhost.name):
            raise ConnectionError_(NOT_ALLOWED, vhost_access_refused_text(self.user_name, vhost.name),
                                   10, 40)
        self.vhost_obj = vhost
        self.counts_for_limits = True
        self.state = State.OPEN
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat_s:
            self._timer = self.clock.call_later(self.heartbeat_s / 2, self._heartbeat_tick)
        self.send_method(0, spec.Connection.OpenOk())

    def _update_secret(self, m: Any) -> None:
        """RabbitMQ 4.x with its internal backend: the backend's state cannot expire, so the new secret
        is not checked and the user stays as it is (rabbit_access_control:update_state); vhost access is
        checked again (530 if it was revoked), then update-secret-ok. No scrypt, nothing on the loop."""
        vhost = self.vhost_obj.name if self.vhost_obj is not None else ""
        if not self.node.auth.can_access_vhost(self.user_name, vhost):
            raise ConnectionError_(NOT_ALLOWED, vhost_access_refused_text(self.user_name, vhost), 10, 70)
        self.send_method(0, spec.Connection.UpdateSecretOk())
        left_out = UPDATE_SECRET_LOG.admit(self.clock.time())
        if left_out is not None:  # throttled node-wide, as login refusals
            log.info("connection %s: user '%s' updated secret, reason: %s%s", self.name, safe(self.user_name),
                     safe(m.reason), suppressed_note(left_out))

    # -- timers ----------------------------------------------------------------------------------
    def check_consumer_timeouts(self, now: float, timeout_ms: int) -> None:
        for number, ch in list(self.channels.items()):
            used = ch.consumer_timed_out(now, timeout_ms / 1000)
            if used:
                self._channel_error(number, ChannelError(
                    PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {number} timed out. Timeout value used: "
                    f"{round(used * 1000)} ms. This timeout value can be configured, see consumers doc guide to "
                    "learn more"))
                self.flush()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state < State.OPEN:
            log.warning("connection %s: handshake timeout", self.name)
            self._abort()

    def _heartbeat_tick(self) -> None:
        if self.state != State.OPEN:
            return
        now = self.clock.time()
        interval = self.heartbeat_s / 2
        if now - self._last_recv > self.heartbeat_s * 2:
            log.warning("connection %s: missed heartbeats from client, timeout: %ss", self.name,
                        self.heartbeat_s)
            self._abort()
            return
        if now - self._last_sent >= interval * 0.9:
            self.out.append(HEARTBEAT_FRAME)
            self.flush()
        self._timer = self.clock.call_later(interval, self._heartbeat_tick)

    # -- output ----------------------------------------------------------------------------------
    def send_method(self, channel: int, method: spec.Method) -> None:
        self.out.append(method_frame(channel, method))
        self.want_write()

    def send_raw_method(self, channel: int, payload: bytes) -> None:
        self.out.append(method_frame_raw(channel, payload))
        self.want_write()

    def want_write(self) -> None:
        if not self._flush_scheduled and not self._in_receive:
            self._flush_scheduled = True
            self.clock.call_soon(self.flush)

    def want_flush(self, channel: ServerChannel) -> None:
        self._confirm_channels.add(channel)
        self.want_write()

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._confirm_channels:
            # swapped first: answering may close the connection (a failed commit), which flushes again
            channels, self._confirm_channels = self._confirm_channels, set()
            for ch in channels:
                ch.flush_confirms()
        out = self.out
        if not out or self.transport is None or self.state == State.CLOSED:
            out.clear()
            return
        data = b"".join(out) if len(out) > 1 else out[0]
        out.clear()
        self.send_oct += len(data)
        self._last_sent = self.clock.time()
        self.transport.write(data)

    # -- closing ---------------------------------------------------------------------------------
    def closing_timeout_s(self) -> float:
        """How long a closing connection waits for close-ok or for the client to close the socket:
        CLOSING_TIMEOUT_S, or the heartbeat timeout when that is shorter (rabbit_reader's rule)."""
        return min(self.heartbeat_s, CLOSING_TIMEOUT_S) if self.heartbeat_s > 0 else CLOSING_TIMEOUT_S

    def _send_close_ok(self) -> None:
        """The client closed: release everything, answer close-ok, then discard its remaining input
        until it closes the socket (bounded by `closing_timeout_s`)."""
        self._release_all()
        self.send_method(0, spec.Connection.CloseOk())
        self.flush()
        self.state = State.DISCARDING
        self._read_to_the_end(self.closing_timeout_s())

    def _read_to_the_end(self, timeout_s: float) -> None:
        """Closing: drop every read hold but the budget, stop the heartbeat and handshake timer, and
        close the socket after `timeout_s` at the latest."""
        held = bool(self._read_holds)
        self._read_holds &= {"budget"}
        if held and not self._read_holds and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.clock.call_later(timeout_s, self._abort)

    def close_with_error(self, exc: AMQPError) -> None:
        if self.state >= _CLOSING:
            return
        log.info("closing connection %s: %s %s", self.name, exc.code, safe(exc.text))
        self._release_all()
        self.out.clear()
        self.state = State.OPEN  # let send_method write
        self.send_method(0, spec.Connection.Close(reply_code=exc.code, reply_text=exc.reply_text,
                                                  class_id=exc.class_id, method_id=exc.method_id))
        self.flush()
        self.state = State.CLOSING
        self._read_to_the_end(CLOSE_OK_TIMEOUT_S)

    def close_forced(self, reason: str = "shutdown") -> None:
        self.close_with_error(ConnectionError_(
            CONNECTION_FORCED, f"broker forced connection closure with reason '{reason}'"))

    # -- resource alarms -------------------------------------------------------------------------
    def alarm_raised(self) -> None:
        """An alarm went off: a connection that has published is blocked now; one that has not is
        'blocking' and gets blocked by its first publish (RabbitMQ's rule: consumers keep going)."""
        if self.has_published:
            self.block_for_alarm()

    def block_for_alarm(self) -> None:
        if self.alarm_blocked or self.state != State.OPEN:
            return
        self.alarm_blocked = True
        self.hold_reading("alarm")
        if self.capabilities.get("connection.blocked"):
            reason = " & ".join(f"low on {a}" for a in sorted(self.node.alarms))
            self.send_method(0, spec.Connection.Blocked(reason=reason))

    def hold_unfinished_body(self, nbytes: int) -> None:
        """A channel keeps `nbytes` more of a body whose last frame has not arrived: refuse past the cap
        (issue 15: partial bodies on many channels must not grow the node without bound)."""
        self.unfinished_body_bytes += nbytes
        node = self.node
        node.unfinished_body_bytes += nbytes
        if self.unfinished_body_bytes > self.unfinished_body_limit:
            raise ConnectionError_(RESOURCE_ERROR, (
                f"unfinished message bodies on this connection hold {self.unfinished_body_bytes} bytes, "
                f"more than the limit of {self.unfinished_body_limit} (max_unfinished_body_bytes)"))
        if node.unfinished_body_bytes > node.unfinished_body_limit:  # issue 21: many connections at once
            raise ConnectionError_(RESOURCE_ERROR, (
                f"unfinished message bodies on this node hold {node.unfinished_body_bytes} bytes, more than "
                f"the limit of {node.unfinished_body_limit} (max_unfinished_body_bytes_total)"))

    def release_unfinished_body(self, nbytes: int) -> None:
        """A channel dropped `nbytes` of unfinished body (completed, or the channel closed)."""
        self.unfinished_body_bytes -= nbytes
        self.node.unfinished_body_bytes -= nbytes
        assert self.unfinished_body_bytes >= 0 and self.node.unfinished_body_bytes >= 0

    def alarm_cleared(self) -> None:
        if not self.alarm_blocked:
            return
        self.alarm_blocked = False
        self.release_reading("alarm")
        if self.state == State.OPEN and self.capabilities.get("connection.blocked"):
            self.send_method(0, spec.Connection.Unblocked())

    def peer_closed(self) -> bool:
        """Has the client closed its end while reading is held (an alarm), a FIN or reset not read yet?
        On Linux poll's POLLRDHUP tells, even with unread bytes before the end (`peer_hung_up`); elsewhere
        False. AMQP has no half-close, so a FIN means the client is gone (issue 21: blocked connections
        holding unfinished bodies kept them, and so the memory alarm, after their clients had closed). The
        same serves a TCP socket and a relayed TLS connection's end of its socket pair
        (runtime/workers/relay.py), where the relay closing it is the client gone."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        return sock is not None and peer_hung_up(sock.fileno())

    def abort(self) -> None:
        """Close the socket now (the node's shutdown, after its grace period)."""
        self._abort()

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._release_all()

    def _release_all(self) -> None:
        for queue in self._flow_queues:
            queue.flow_waiters.discard(self)
        self._flow_queues.clear()
        if self._flow_timer is not None:
            self._flow_timer.cancel()
            self._flow_timer = None
        self.counts_for_limits = False  # a closed connection frees its place at once
        channels = list(self.channels.values())
        self.channels.clear()
        for ch in channels:
            ch.close_internal()
        self.node.release_exclusive(self)

    def _state_name(self) -> str:
        if self.state != State.OPEN:
            return "closing" if self.state >= State.CLOSING else "starting"
        if self.alarm_blocked:
            return "blocked"
        if self.node.alarms:
            return "blocking"
        if self.flow_blocked:
            return "flow"
        since = self._flow_blocked_at
        return "flow" if since is not None and self.clock.time() - since < FLOW_STATE_S else "running"

    def info(self) -> dict[str, Any]:
        props = self.client_properties
        return {
            "name": self.name,
            "user": self.user_name,
            "vhost": self.vhost_obj.name if self.vhost_obj else "",
            "peer_host": self.peer[0],
            "peer_port": self.peer[1],
            "channels": len(self.channels),
            "frame_max": self.frame_max,
            "channel_max": self.channel_max,
            "timeout": self.heartbeat_s,
            "state": self._state_name(),
            "protocol": "AMQP 0-9-1",
            "auth_mechanism": self.auth_mechanism,
            "client_properties": {k: v for k, v in props.items() if isinstance(v, (str, int, dict))},
            "recv_oct": self.recv_oct,
            "send_oct": self.send_oct,
            "connected_at": self.connected_at_ms,
        }


__all__ = ["AMQPConnection", "CAPABILITIES", "platform", "__version__"]

