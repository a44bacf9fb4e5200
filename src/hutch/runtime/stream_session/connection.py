"""A stream-protocol connection as a state machine: bytes in through `receive_data`, frames out through a
`StreamTransport` port (stream_session/ports.py), time and timers from a `LoopClock` port
(runtime/session/ports.py). No socket, no asyncio Protocol: protocol.py adapts a socket to it, and tests/streams/ drive it in memory.

Owns: the handshake (peer properties, SASL with PLAIN or AMQPLAIN through the node's login gate, or
EXTERNAL with a client certificate TLS verified,
tune, open with the vhost access check), the table of which command each phase accepts, the frame
limit (`stream_initial_frame_max` until open, then the negotiated frame_max), heartbeats, closing in
both directions, moving to its stream's home worker (a node of workers: `_hand_over`, `adopt`; the
rules in handover.py), the commands about streams (create, delete, stream stats, resolve offset spec, exchange
command versions; metadata in metadata.py), super streams (super_streams.py), and the output buffer (written once
per batch of input, or on the next loop turn for output made by callbacks). Publishing and consuming
are its two halves (publishing.py, consuming.py).

Errors: a refused request is a `CommandError` answered with its response code, and the connection
stays; a frame that is too large or unknown (`FrameError`) makes the server send Close with that code
and close the socket when the client answers (or after `CLOSE_GRACE_S`). A refused login or vhost is
answered, then the socket closes after `CLOSE_GRACE_S`; anything else unexpected before open closes the
socket at once, as RabbitMQ does.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from hutch import __version__
from hutch.amqp.errors import AMQPError
from hutch.core.auth import PermissionKind, is_loopback_address, parse_amqplain, parse_plain
from hutch.core.certs import CertLoginError, login_from_cert
from hutch.core.logsafe import safe
from hutch.core.vhost import VirtualHost
from hutch.runtime.broker.logins import LoginOutcome
from hutch.runtime.queue_types.stream.handle import StreamHandle
from hutch.runtime.session.ports import LoopClock, TimerHandle
from hutch.runtime.stream_session import metadata as where
from hutch.runtime.stream_session import super_streams
from hutch.runtime.stream_session.consuming import Consuming
from hutch.runtime.stream_session.handover import MAX_UNREAD_BYTES, StreamHandoverState, quiet_reason
from hutch.runtime.stream_session.home_link import resolve_in, stats_of
from hutch.runtime.stream_session.hub import StreamHub
from hutch.runtime.stream_session.ports import StreamExists, StreamRefused, StreamTransport
from hutch.runtime.stream_session.publishing import Publishing, confirm_ids_per_frame
from hutch.runtime.turns import scheduler_of
from hutch.streamproto import commands as c
from hutch.streamproto import wire
from hutch.streamproto.codes import SERVER_VERSIONS, Code, Key, OffsetType
from hutch.streamproto.errors import CommandError, FrameError, StreamProtocolError
from hutch.streamproto.framer import FrameReader

log = logging.getLogger("hutch.stream")

T = TypeVar("T")

CLOSE_GRACE_S = 1.0
# Work one read may do in a loop turn: a simple publish frame counts 1, any other command COMMAND_WORK;
# past TURN_WORK, or past TURN_S of the loop's time (looked at every TIME_CHECK_WORK), the rest waits,
# read-held, for the next turn. One read (uvloop hands up to 256 KiB at once) of 11-byte credit frames
# is ~23,000 commands, each answered: ~0.3 s on the loop; and commands differ in cost (a partitions
# query of a 128-partition super stream costs ten credits), hence the clock too.
TURN_WORK = 8192
COMMAND_WORK = 8
TURN_S = 0.01
TIME_CHECK_WORK = 64
# A command frame larger than STEP_BYTES (a map or array of thousands of entries: RabbitMQ reads any
# count a frame holds) is decoded in steps (`commands.decode_steps`, wire.STEP_ENTRIES entries each),
# with a look at the clock between them. The steps of every connection of the loop share one budget a
# turn (runtime/turns.py, `TurnScheduler`): past it, or while another connection waits for its next
# step, the rest of the decoding and the input after it wait, read held, in the scheduler's round-robin
# queue. A 1 MiB subscribe of 45,000 properties is ~50 ms of decoding, ~30 ms more of its preparation.
STEP_BYTES = 16 * 1024
HANDSHAKE_TIMEOUT_S = 10.0


class Phase(enum.IntEnum):
    PEER_PROPERTIES = 0
    SASL_HANDSHAKE = 1
    AUTHENTICATE = 2
    AUTHENTICATING = 3
    TUNE = 4
    OPEN = 5
    OPENED = 6
    CLOSING = 7
    CLOSED = 8


# what each phase before OPENED accepts (heartbeat and close are accepted in every phase)
PRE_OPEN: dict[Phase, tuple[type[c.Command], ...]] = {
    Phase.PEER_PROPERTIES: (c.PeerProperties,),
    Phase.SASL_HANDSHAKE: (c.SaslHandshake,),
    Phase.AUTHENTICATE: (c.SaslHandshake, c.SaslAuthenticate),
    Phase.TUNE: (c.Tune, c.TuneResponse),
    Phase.OPEN: (c.Open,),
}


COALESCE_MAX_BYTES = 16 * 1024  # parts of output up to this size are joined before the write


def coalesce(parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """`parts` with each run of small ones (below COALESCE_MAX_BYTES) joined into one: the large ones
    (deliveries' chunk data) stay as they are, and a writev gets a few parts, not one per confirm."""
    merged: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for part in parts:
        if len(part) < COALESCE_MAX_BYTES:
            run.append(part)
            continue
        if run:
            merged.append(b"".join(run) if len(run) > 1 else run[0])
            run = []
        merged.append(part)
    if run:
        merged.append(b"".join(run) if len(run) > 1 else run[0])
    return merged


class StreamConnection:
    def __init__(self, hub: StreamHub, clock: LoopClock, tls: bool = False) -> None:
        self.hub = hub
        self.broker = hub.broker
        self.catalog = hub.catalog
        self.clock = clock
        self.tls = tls
        cfg = hub.broker.config
        self.reader = FrameReader(cfg.stream_initial_frame_max)
        self.phase = Phase.PEER_PROPERTIES
        self.transport: StreamTransport | None = None
        self.peer: tuple[str, int] = ("?", 0)
        self.sock: tuple[str, int] = ("?", 0)
        self.out: list[bytes | memoryview] = []  # joined by flush (a delivery adds a view of its chunk)
        self.client_properties: dict[str, str] = {}
        self.user_name = ""
        self.auth_mechanism = ""
        self.on_login: Callable[[], None] | None = None  # told once the login succeeds (the listener's gate)
        self.vhost: VirtualHost = VirtualHost("")
        self.frame_max = cfg.stream_frame_max
        self.heartbeat_s = 0
        self.publishing = Publishing(self)
        self.publishing.confirm_ids_per_frame = confirm_ids_per_frame(self.frame_max)
        self.consuming = Consuming(self)
        self._holds: set[str] = set()
        self._decoding: tuple[wire.Steps, bytes] | None = None  # a large command's decoding, under way
        self.turns = scheduler_of(clock)  # the loop's budget for steps, shared by all its connections
        self._writing_paused = False
        self._flush_scheduled = False
        self._correlation = 0
        self._timer: TimerHandle | None = None
        self._last_recv = 0.0
        self._last_sent = 0.0
        self.name = ""
        self.connected_at_ms = 0
        self.handover = hub.handover
        self.locality_armed = self.handover is not None  # judged once (handover.py)
        self.handed_over = False  # moved to another worker: this one forgot it
        self._advertised: tuple[str, int] | None = None  # as told before a move, by the worker that accepted it
        self.peer_cert: bytes | None = None  # DER of a client certificate the TLS handshake verified
        # a TLS connection's (version, cipher): its own session's, or the relaying worker's (moved here)
        self.tls_info: tuple[str, str] | None = None
        self._dispatch: dict[type[c.Command], Callable[[Any], None]] = {
            c.DeclarePublisher: self.publishing.declare,
            c.Publish: self.publishing.publish,
            c.QueryPublisherSequence: lambda cmd: where.query_elsewhere(self, cmd, self.publishing.query_sequence),
            c.DeletePublisher: self.publishing.delete,
            c.Subscribe: self.consuming.subscribe,
            c.Credit: self.consuming.credit,
            c.StoreOffset: self.consuming.store_offset,
            c.QueryOffset: lambda cmd: where.query_elsewhere(self, cmd, self.consuming.query_offset),
            c.Unsubscribe: self.consuming.unsubscribe,
            c.ConsumerUpdateResponse: self.consuming.consumer_update_answered,
            c.Create: self._create,
            c.Delete: self._delete,
            c.Metadata: lambda cmd: where.metadata(self, cmd),
            c.Route: self._route,
            c.Partitions: self._partitions,
            c.ExchangeCommandVersions: self._command_versions,
            c.StreamStats: self._stream_stats,
            c.CreateSuperStream: self._create_super_stream,
            c.DeleteSuperStream: self._delete_super_stream,
            c.ResolveOffsetSpec: self._resolve_offset_spec,
            c.PeerProperties: self._unexpected,
            c.SaslHandshake: self._unexpected,
            c.SaslAuthenticate: self._unexpected,
            c.Open: self._unexpected,
            c.Tune: self._unexpected,
            c.TuneResponse: self._unexpected,
        }

    # -- the transport's side ----------------------------------------------------------------------
    def connection_made(self, transport: StreamTransport, peer: tuple[str, int], sock: tuple[str, int]) -> None:
        self.transport = transport
        self.peer, self.sock = peer, sock
        self.name = f"{peer[0]}:{peer[1]} -> {sock[0]}:{sock[1]}"
        self.connected_at_ms = int(self.broker.wall_ms())
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.tls_info = (str(ssl_object.version()), (ssl_object.cipher() or ("",))[0])
        if ssl_object is not None and ssl_object.context.verify_mode != ssl.CERT_NONE:
            self.peer_cert = ssl_object.getpeercert(binary_form=True)  # None: the client sent none
        self._last_recv = self._last_sent = self.clock.time()
        self._timer = self.clock.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)
        self.hub.connections.add(self)

    def receive_data(self, data: bytes) -> None:
        if self.phase == Phase.CLOSED:
            return
        self._last_recv = self.clock.time()
        self.reader.feed(data)
        self._drain()
        self.flush()

    def _drain(self) -> None:
        try:
            publishing = self.publishing
            consuming = self.consuming
            work = 0
            check_at = TIME_CHECK_WORK
            deadline = self.clock.time() + TURN_S
            try:
                if self._decoding is not None:  # a large command whose decoding a turn left unfinished
                    steps, whole = self._decoding
                    self._decoding = None
                    cmd = self._decode_stepped(steps, whole, resumed=True)
                    if cmd is None or self._handle_decoded(cmd, memoryview(whole)):
                        return
                    check_at = work  # (0: the clock is looked at before the next frame)
                # views of the input buffer: the publish path copies what it keeps, once (into its
                # batch's data); any other command is decoded from a copy of its own
                for frame in self.reader.frame_views():
                    if self.phase >= Phase.CLOSED or self.phase == Phase.AUTHENTICATING:
                        return
                    if work >= check_at:
                        check_at = work + TIME_CHECK_WORK
                        if self.clock.time() >= deadline:
                            work = TURN_WORK
                    if work >= TURN_WORK:  # the rest of what was read waits for the next loop turn
                        self.reader.push_back(frame)
                        self.hold_reading("turn")
                        self.clock.call_soon(self._next_turn)
                        return
                    if self.phase == Phase.OPENED and publishing.publish_frame(frame):
                        work += 1
                        continue  # the hot path: a publish of simple entries, batched per stream
                    work += COMMAND_WORK
                    publishing.write_batched()  # what was published before this command is written first
                    publishing.send_confirms()  # and what was confirmed goes out before its answer
                    if len(frame) > STEP_BYTES:
                        whole = bytes(frame)
                        cmd = self._decode_stepped(self._command_steps(whole), whole, resumed=False)
                        check_at = work  # the clock is looked at again before the next frame
                        if cmd is None:
                            return  # its decoding goes on next turn (`_decoding`)
                    else:
                        cmd = c.decode(bytes(frame))
                    if self._handle_decoded(cmd, frame):
                        return
            finally:
                publishing.write_batched(hold=True)
                consuming.coalesce_offsets()
        except FrameError as exc:
            self._fatal(exc)
        except Exception as exc:  # a bug must cost this connection only, never the node (as AMQP's 541)
            log.exception("stream connection %s: internal error", self.name)
            self._fatal(StreamProtocolError(f"internal error: {type(exc).__name__}", Code.INTERNAL_ERROR))

    def _command_steps(self, frame: bytes) -> wire.Steps:
        """A large command's decoding and, for a subscribe, the work in proportion to its properties
        (`Consuming.decode_subscribe`, `Consuming.prepare`), in steps."""
        if self.phase != Phase.OPENED or int.from_bytes(frame[:2], "big") != Key.SUBSCRIBE:
            return (yield from c.decode_steps(frame))
        cmd = yield from self.consuming.decode_subscribe(frame)  # (its properties counted as they are read)
        yield from self.consuming.prepare(cmd)
        return cmd

    def _decode_stepped(self, steps: wire.Steps, frame: bytes, resumed: bool) -> c.Command | None:
        """Decode a large command (`steps`, of `frame`) while the loop's step budget allows
        (runtime/turns.py); then None: the rest waits, read-held, in the scheduler's queue, and what was
        read after it too. A new frame (not `resumed`) takes no step while another connection waits or
        the budget is spent; a resumed one takes one, and goes on only while nobody else waits."""
        done, cmd = self.turns.run_steps(steps, resumed)
        if not done:
            self._decoding = (steps, frame)
            self.hold_reading("turn")
            self.turns.wait(self._next_turn)
            return None
        return cast(c.Command, cmd)

    def _handle_decoded(self, cmd: c.Command, frame: memoryview) -> bool:
        """Dispatch one decoded command of `_drain`; True when the rest of the input must wait (the
        connection moved to another worker, or a request awaits its answer)."""
        if self.consuming.pending_offsets and not isinstance(cmd, c.StoreOffset):
            self.consuming.coalesce_offsets()  # what was stored before this command is written first
        if self.locality_armed and isinstance(cmd, c.DeclarePublisher | c.Subscribe) \
                and self._hand_over(cmd, frame):
            return True  # another worker has it now, with this frame and what follows
        self._handle(cmd)
        return "request" in self._holds  # a request that awaits (_async, metadata.py): what came after
        # it is taken once it is answered (release_reading), in order

    def connection_lost(self) -> None:
        if self.phase == Phase.CLOSED:
            return
        self.phase = Phase.CLOSED
        if self._timer is not None:
            self._timer.cancel()
        self.consuming.close_all()
        self.publishing.publishers.clear()
        self.hub.connections.discard(self)

    def pause_writing(self) -> None:
        """The client does not read fast enough: no deliveries, and no input (whose answers would grow
        the write buffer without bound) until the buffer drains."""
        self._writing_paused = True
        self.hold_reading("output")

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.release_reading("output")
        self.consuming.pump_all()
        self.flush()

    # -- output ------------------------------------------------------------------------------------
    def send(self, cmd: c.Command) -> None:
        self.out.append(c.encode(cmd))

    def respond(self, cmd: Any, code: Code) -> None:
        self.out.append(c.encode(c.Response(c.request_key(cmd), cmd.correlation_id, code)))

    def flush(self) -> None:
        """Write what `out` holds: the small frames joined, a delivery's chunk data (a view of the chunk
        read) handed to the transport as it is (`coalesce`; uvloop writes the parts with one writev), so
        a delivered byte is not copied in user space between the file's read and the socket. The
        confirms waiting since the last write go first (publishing.py, `send_confirms`)."""
        self.publishing.send_confirms()
        out = self.out
        if out and self.transport is not None and not self.transport.is_closing():
            if len(out) == 1 and type(out[0]) is bytes:
                self.transport.write(out[0])
            else:
                self.transport.writelines(coalesce(out))
            out.clear()
            self._last_sent = self.clock.time()
        else:
            out.clear()

    def want_flush(self) -> None:
        """Output made outside a read (a settled append, a SAC change): written on the next loop turn."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.clock.call_soon(self._deferred_flush)

    def _deferred_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def can_deliver(self) -> bool:
        return not self._writing_paused and self.phase == Phase.OPENED

    def hold_reading(self, reason: str) -> None:
        if not self._holds and self.transport is not None:
            self.transport.pause_reading()
        self._holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason in self._holds:
            self._holds.discard(reason)
            if (reason == "request" and self.phase == Phase.OPENED) \
                    or (reason == "turn" and self.phase < Phase.CLOSED and "request" not in self._holds):
                self._drain()  # the commands read with the request, after it (its answer is already out),
                self.flush()  # or those a turn's work left for the next turn
            if not self._holds and self.transport is not None and self.phase != Phase.CLOSED:
                self.transport.resume_reading()

    def bound_append(self, settled: asyncio.Future[None]) -> None:
        self.publishing.bound(settled)

    def _next_turn(self) -> None:
        self.release_reading("turn")

    def next_correlation_id(self) -> int:
        self._correlation = (self._correlation + 1) & 0xFFFFFFFF
        return self._correlation

    # -- connection locality (a node of workers: handover.py) ---------------------------------------
    def is_open(self) -> bool:
        return self.phase == Phase.OPENED

    def held(self) -> bool:
        return bool(self._holds)

    def in_use(self) -> bool:
        return bool(self.publishing.publishers or self.consuming.subscriptions)

    def _hand_over(self, cmd: c.DeclarePublisher | c.Subscribe, frame: memoryview) -> bool:
        """The first declare publisher or subscribe: move to its stream's home worker when that is another
        and this connection is quiet. True when it moved (this worker has forgotten it)."""
        self.locality_armed = False
        handover, transport = self.handover, self.transport
        assert handover is not None and transport is not None
        home = self.hub.reader_link.home(self.vhost.name, cmd.stream)
        to = None if home is None else handover.worker_of(home)
        if to is None:
            return False
        self.flush()  # what the commands before this one produced goes out from here
        reason = quiet_reason(self)
        buffered = getattr(transport, "get_write_buffer_size", None)
        if reason is None and (buffered is None or buffered()):
            reason = "output not written yet"
        sock = transport.get_extra_info("socket")
        unread = len(frame).to_bytes(4, "big") + bytes(frame) + self.reader.unread()
        if reason is None and (sock is None or len(unread) > MAX_UNREAD_BYTES):
            reason = "no socket, or too much unread"
        relayed = transport.get_extra_info("ssl_object") is not None  # TLS: relayed (runtime/workers/relay.py)
        if reason is not None:
            log.debug("stream connection %s stays in this worker (stream %s in worker %d): %s", self.name,
                      cmd.stream, to, reason)
            return False
        state = StreamHandoverState(self.user_name, self.vhost.name, self.frame_max, self.heartbeat_s,
                                    dict(self.client_properties), self.auth_mechanism, self.peer, self.name,
                                    self.connected_at_ms, self.consuming.deliver_version, self._correlation,
                                    self.advertised(), unread, self.sock, self.tls_info, self.peer_cert)
        if not (handover.relay(transport, state.encode(), to) if relayed else handover.move(sock, state.encode(), to)):
            return False
        log.debug("stream connection %s moved to worker %d (stream %s)%s", self.name, to, cmd.stream,
                  " (TLS, relayed)" if relayed else "")
        self._forget_moved(keep_transport=relayed)
        return True

    def _forget_moved(self, keep_transport: bool = False) -> None:
        """This worker lets go of a connection another worker now holds: no close frame, the socket closed
        here only (the other worker holds its duplicate), or, relayed (`keep_transport`), the transport
        left to the relay that now owns it."""
        self.handed_over = True
        self.phase = Phase.CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.hub.connections.discard(self)
        self.consuming.close_all()  # (none yet but the subscribe it moves with: what it counted is given back)
        self.out.clear()
        transport, self.transport = self.transport, None
        if transport is not None and not keep_transport:
            transport.pause_reading()
            transport.close()

    def adopt(self, transport: StreamTransport, sock: tuple[str, int], data: bytes) -> None:
        """Take over a stream connection another worker of this node handed over (`_hand_over` there):
        open, then handle the bytes it had not (the triggering command first). A state that cannot be
        adopted (malformed, its vhost or user gone meanwhile) closes the connection."""
        self.transport = transport
        self.sock = sock
        self.locality_armed = False
        self._last_recv = self._last_sent = self.clock.time()
        self.hub.connections.add(self)
        self.phase = Phase.OPENED
        try:
            st = StreamHandoverState.decode(data)
        except ValueError as exc:
            self._fatal(StreamProtocolError(f"the connection could not be moved between workers: {exc}",
                                            Code.INTERNAL_ERROR))
            return
        self.peer, self.name, self.connected_at_ms, self.sock = st.peer, st.name, st.connected_at_ms, st.sockname
        self.tls, self.tls_info, self.peer_cert = st.tls is not None, st.tls, st.peer_cert
        vhost = self.broker.vhosts.get(st.vhost)
        if vhost is None or self.broker.auth.get_user(st.user) is None:
            self._fatal(StreamProtocolError("vhost or user deleted", Code.VIRTUAL_HOST_ACCESS_FAILURE))
            return
        self.user_name, self.vhost, self.auth_mechanism = st.user, vhost, st.auth_mechanism
        self.client_properties = st.client_properties
        self.frame_max = self.reader.frame_max = st.frame_max
        self.publishing.confirm_ids_per_frame = confirm_ids_per_frame(self.frame_max)
        self.heartbeat_s = st.heartbeat_s
        self.consuming.deliver_version = st.deliver_version
        self._correlation = st.correlation
        self._advertised = st.advertised
        if self.heartbeat_s:
            self._timer = self.clock.call_later(self.heartbeat_s, self._heartbeat_tick)
        self.receive_data(st.unread)

    # -- dispatch ----------------------------------------------------------------------------------
    def _handle(self, cmd: c.Command) -> None:
        if isinstance(cmd, c.Heartbeat):
            return
        if isinstance(cmd, c.Close):
            self.send(c.Response(Key.CLOSE, cmd.correlation_id, Code.OK))
            self.flush()
            self._abort()
            return
        if isinstance(cmd, c.Response) and cmd.key == Key.CLOSE:
            self._abort()  # the client answered our close
            return
        if self.phase == Phase.CLOSING:
            return
        if self.phase < Phase.OPENED:
            self._handshake(cmd)
            return
        handler = self._dispatch.get(type(cmd))
        if handler is None:
            raise FrameError(f"unexpected command {type(cmd).__name__}")
        try:
            handler(cmd)
        except CommandError as exc:
            correlation_id = getattr(cmd, "correlation_id", None)
            if correlation_id is None:
                log.info("stream connection %s: %s refused: %s", self.name, type(cmd).__name__, exc.text)
                return
            self._refuse(cmd, exc)

    def _refuse(self, cmd: c.Command, exc: CommandError) -> None:
        code = exc.code
        if isinstance(cmd, c.QueryOffset):
            self.send(c.QueryOffsetResponse(cmd.correlation_id, code, 0))
        elif isinstance(cmd, c.QueryPublisherSequence):
            self.send(c.QueryPublisherSequenceResponse(cmd.correlation_id, code, 0))
        elif isinstance(cmd, c.Route | c.Partitions):
            response = c.RouteResponse if isinstance(cmd, c.Route) else c.PartitionsResponse
            self.send(response(cmd.correlation_id, code, []))
        elif isinstance(cmd, c.StreamStats):
            self.send(c.StreamStatsResponse(cmd.correlation_id, code, {}))
        elif isinstance(cmd, c.ResolveOffsetSpec):
            self.send(c.ResolveOffsetSpecResponse(cmd.correlation_id, code, OffsetType.OFFSET, 0))
        else:
            self.respond(cmd, code)

    def _unexpected(self, cmd: c.Command) -> None:
        raise FrameError(f"unexpected {type(cmd).__name__} on an open connection")

    # -- handshake ---------------------------------------------------------------------------------
    def _handshake(self, cmd: c.Command) -> None:
        if not isinstance(cmd, PRE_OPEN.get(self.phase, ())):
            log.warning("stream connection %s: unexpected %s before open", self.name, type(cmd).__name__)
            self._abort()
            return
        if isinstance(cmd, c.PeerProperties):
            self.client_properties = cmd.properties
            self.send(c.PeerPropertiesResponse(cmd.correlation_id, Code.OK, self._server_properties()))
            self.phase = Phase.SASL_HANDSHAKE
        elif isinstance(cmd, c.SaslHandshake):
            self.send(c.SaslHandshakeResponse(cmd.correlation_id, Code.OK, self._mechanisms()))
            self.phase = Phase.AUTHENTICATE
        elif isinstance(cmd, c.SaslAuthenticate):
            self._authenticate(cmd)
        elif isinstance(cmd, c.Tune | c.TuneResponse):
            self._tuned(cmd.frame_max, cmd.heartbeat_s)
        elif isinstance(cmd, c.Open):
            self._open(cmd)

    def _server_properties(self) -> dict[str, str]:
        return {"product": "hutch", "version": __version__, "platform": "Python",
                "cluster_name": self.broker.config.cluster_name or self.broker.name,
                "copyright": "the hutch authors", "information": "https://www.rabbitmq.com/ compatible"}

    def _mechanisms(self) -> list[str]:
        """The configured mechanisms; EXTERNAL only with a client certificate TLS verified (as AMQP's)."""
        return [m for m in self.broker.config.auth_mechanisms
                if m in ("PLAIN", "AMQPLAIN") or (m == "EXTERNAL" and self.peer_cert)]

    def _authenticate(self, cmd: c.SaslAuthenticate) -> None:
        if cmd.mechanism not in self._mechanisms():
            self.send(c.SaslAuthenticateResponse(cmd.correlation_id, Code.SASL_MECHANISM_NOT_SUPPORTED))
            return
        if cmd.mechanism == "EXTERNAL":
            self._external_login(cmd.correlation_id)
            return
        try:
            user, password = (parse_plain if cmd.mechanism == "PLAIN" else parse_amqplain)(cmd.data)
        except ValueError:
            self.send(c.SaslAuthenticateResponse(cmd.correlation_id, Code.SASL_ERROR))
            return
        if user in self.broker.config.loopback_users and not is_loopback_address(self.peer[0]):
            log.warning("stream connection %s: user '%s' can only connect via localhost", self.name, safe(user))
            self._refuse_login(cmd.correlation_id, Code.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
            return
        self.auth_mechanism = cmd.mechanism
        self.phase = Phase.AUTHENTICATING
        self.hold_reading("auth")
        fut = asyncio.ensure_future(self.broker.logins.check(user, password, self.peer[0]))
        fut.add_done_callback(lambda f: self._auth_done(f, cmd.correlation_id, user))

    def _auth_done(self, fut: asyncio.Future[LoginOutcome], correlation_id: int, user: str) -> None:
        if self.phase != Phase.AUTHENTICATING:
            return
        self.release_reading("auth")
        outcome = None if fut.cancelled() or fut.exception() is not None else fut.result()
        if outcome is None or outcome.user is None:
            reason = outcome.reason if outcome is not None else "internal error"
            log.warning("stream connection %s: login refused: user '%s' - %s", self.name, safe(user), reason)
            self._refuse_login(correlation_id, Code.AUTHENTICATION_FAILURE)
            return
        self._logged_in(correlation_id, user)
        self._drain()
        self.flush()

    def _logged_in(self, correlation_id: int, user: str) -> None:
        self.user_name = user
        self.phase = Phase.TUNE
        if self.on_login is not None:
            self.on_login()
        cfg = self.broker.config
        self.send(c.SaslAuthenticateResponse(correlation_id, Code.OK))
        self.send(c.Tune(cfg.stream_frame_max, cfg.stream_heartbeat_s))

    def _external_login(self, correlation_id: int) -> None:
        """EXTERNAL: the user the verified client certificate names (`ssl_cert_login_*`), which must
        exist; no password. The loopback rule applies as to any login."""
        assert self.peer_cert is not None
        cfg = self.broker.config
        self.auth_mechanism = "EXTERNAL"
        try:
            user = login_from_cert(self.peer_cert, cfg.ssl_cert_login_from, cfg.ssl_cert_login_san_type,
                                   cfg.ssl_cert_login_san_index)
        except CertLoginError as exc:
            log.warning("stream connection %s: login refused: %s", self.name, exc)
            self._refuse_login(correlation_id, Code.AUTHENTICATION_FAILURE)
            return
        if user in cfg.loopback_users and not is_loopback_address(self.peer[0]):
            self._refuse_login(correlation_id, Code.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
        elif self.broker.auth.get_user(user) is None:
            log.warning("stream connection %s: login refused: user '%s' (from the client certificate) does "
                        "not exist", self.name, safe(user))
            self._refuse_login(correlation_id, Code.AUTHENTICATION_FAILURE)
        else:
            self._logged_in(correlation_id, user)

    def _refuse_login(self, correlation_id: int, code: Code) -> None:
        self.send(c.SaslAuthenticateResponse(correlation_id, code))
        self._close_after_refusal()

    def _close_after_refusal(self) -> None:
        """The refusal is written; the socket goes when the client closes it or after CLOSE_GRACE_S
        (closing at once can lose the refusal on the client's side of a TLS connection)."""
        self.flush()
        self.phase = Phase.CLOSING
        self.hold_reading("closing")
        self.clock.call_later(CLOSE_GRACE_S, self._abort)

    def _tuned(self, frame_max: int, heartbeat_s: int) -> None:
        cfg = self.broker.config
        self.frame_max = min(frame_max or cfg.stream_frame_max, cfg.stream_frame_max)
        self.publishing.confirm_ids_per_frame = confirm_ids_per_frame(self.frame_max)
        self.heartbeat_s = heartbeat_s
        self.phase = Phase.OPEN

    def _open(self, cmd: c.Open) -> None:
        vhost = self.broker.vhosts.get(cmd.virtual_host)
        refused = vhost is None or not self.broker.auth.can_access_vhost(self.user_name, cmd.virtual_host)
        if not refused:
            try:
                self.broker.check_connection_limits(cmd.virtual_host, self.user_name)
            except AMQPError as exc:
                log.warning("stream connection %s: %s", self.name, exc)
                refused = True
        if refused or vhost is None:
            self.send(c.OpenResponse(cmd.correlation_id, Code.VIRTUAL_HOST_ACCESS_FAILURE))
            self._close_after_refusal()
            return
        self.vhost = vhost
        self.phase = Phase.OPENED
        self.reader.frame_max = self.frame_max
        host, port = self.advertised()
        self.send(c.OpenResponse(cmd.correlation_id, Code.OK, {"advertised_host": host,
                                                               "advertised_port": str(port)}))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat_s:
            self._timer = self.clock.call_later(self.heartbeat_s, self._heartbeat_tick)

    def advertised(self) -> tuple[str, int]:
        """The host and port this node is known by: the configured ones, else the listener's. A connection
        on a worker's own port (`workers.own_ports`) is told that port, so a client that follows the
        metadata stays with the worker it chose."""
        if self._advertised is not None:
            return self._advertised
        cfg = self.broker.config
        host = cfg.stream_advertised_host or self.sock[0]
        own_port = self.hub.own_tls_port if self.tls else self.hub.own_port
        own = own_port if own_port == self.sock[1] else 0
        port = cfg.stream_advertised_port or own or (self.hub.tls_port if self.tls else self.hub.port) or self.sock[1]
        return host, port

    # -- timers and closing ------------------------------------------------------------------------
    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.phase < Phase.OPENED:
            log.warning("stream connection %s: handshake timeout", self.name)
            self._abort()

    def _heartbeat_tick(self) -> None:
        if self.phase != Phase.OPENED:
            return
        now = self.clock.time()
        if now - self._last_recv > self.heartbeat_s * 2:
            log.warning("stream connection %s: missed heartbeats from client, timeout: %ss", self.name,
                        self.heartbeat_s)
            self._abort()
            return
        if now - self._last_sent >= self.heartbeat_s * 0.9:
            self.send(c.Heartbeat())
            self.flush()
        self._timer = self.clock.call_later(self.heartbeat_s / 2, self._heartbeat_tick)

    def _fatal(self, exc: StreamProtocolError) -> None:
        """Close with `exc`'s code: the client answers, or the socket goes after CLOSE_GRACE_S."""
        log.warning("stream connection %s: %s", self.name, exc.text)
        if self.phase < Phase.OPENED:
            self._abort()
            return
        self.phase = Phase.CLOSING
        self.send(c.Close(self.next_correlation_id(), exc.code, exc.text))
        self.flush()
        self.hold_reading("closing")
        self.clock.call_later(CLOSE_GRACE_S, self._abort)

    def close_forced(self, reason: str) -> None:
        self._fatal(StreamProtocolError(reason, Code.OK))

    def drop(self, reason: str) -> None:
        """Close the socket without a close frame, as RabbitMQ closes a stream connection from
        management (rabbitmq-stream-js-client cannot read a close the server starts)."""
        log.info("stream connection %s: closed: %s", self.name, reason)
        self._abort()

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.connection_lost()

    def stream_gone(self, vhost: str, stream: str) -> None:
        if self.phase != Phase.OPENED or vhost != self.vhost.name:
            return
        if self.publishing.stream_gone(stream) | self.consuming.stream_gone(stream):
            self.send(c.MetadataUpdate(Code.STREAM_NOT_AVAILABLE, stream))
            self.want_flush()

    def info(self) -> dict[str, Any]:
        """What management shows of this connection (RabbitMQ's stream connection fields)."""
        return {"name": self.name, "vhost": self.vhost.name, "user": self.user_name, "node": self.broker.name,
                "host": self.sock[0], "port": self.sock[1], "peer_host": self.peer[0], "peer_port": self.peer[1],
                "ssl": self.tls, "frame_max": self.frame_max, "heartbeat": self.heartbeat_s,
                "auth_mechanism": self.auth_mechanism, "connected_at": self.connected_at_ms,
                "client_properties": dict(self.client_properties), "state": self.phase.name.lower(),
                "publishers": len(self.publishing.publishers),
                "subscriptions": len(self.consuming.subscriptions)}

    # -- access ------------------------------------------------------------------------------------
    def permitted(self, kind: PermissionKind, stream: str) -> bool:
        return self.broker.auth.check(self.user_name, self.vhost.name, kind, stream, "queue")

    def check_permission(self, kind: PermissionKind, stream: str) -> None:
        if not self.permitted(kind, stream):
            raise CommandError(f"{kind} access to stream {stream} refused for user {self.user_name}",
                               Code.ACCESS_REFUSED)

    def stream_handle(self, stream: str) -> StreamHandle:
        handle = self.catalog.lookup(self.vhost.name, stream)
        if handle is None:
            raise CommandError(f"stream {stream} does not exist", Code.STREAM_DOES_NOT_EXIST)
        if handle.closed or handle.failed is not None:
            raise CommandError(f"stream {stream} is not available", Code.STREAM_NOT_AVAILABLE)
        self.hub.watch(self.vhost.name, stream, handle)
        return handle

    # -- streams -----------------------------------------------------------------------------------
    def _async(self, cmd: Any, work: Any) -> None:
        """Run a request that awaits (creating or deleting a stream's files) with the input held, so
        later commands see its result; the response (or the refusal) is sent when it is done."""
        self.hold_reading("request")

        async def run() -> None:
            try:
                await work
            except CommandError as exc:
                self._refuse(cmd, exc)
            except super_streams.SuperStreamError as exc:
                self._refuse(cmd, CommandError(exc.text, exc.code))
            except (AMQPError, OSError) as exc:
                self._refuse(cmd, CommandError(str(exc), Code.INTERNAL_ERROR))
            else:
                self.respond(cmd, Code.OK)
            self.release_reading("request")
            self.flush()

        asyncio.ensure_future(run())

    def _create(self, cmd: c.Create) -> None:
        try:
            name = super_streams.check_name(cmd.stream)
        except super_streams.SuperStreamError as exc:
            raise CommandError(exc.text, exc.code) from None
        self.check_permission("configure", name)
        self._async(cmd, self._create_stream(name, cmd.arguments))

    async def _create_stream(self, name: str, arguments: dict[str, str]) -> None:
        try:
            await self.catalog.create(self.vhost.name, name, arguments)
        except StreamExists:
            raise CommandError(f"stream {name} exists", Code.STREAM_ALREADY_EXISTS) from None
        except StreamRefused as exc:
            raise CommandError(exc.text, exc.code) from None

    def _delete(self, cmd: c.Delete) -> None:
        self.check_permission("configure", cmd.stream)
        if not self.catalog.is_stream(self.vhost.name, cmd.stream):
            raise CommandError(f"stream {cmd.stream} does not exist", Code.STREAM_DOES_NOT_EXIST)
        self._async(cmd, self._delete_stream(cmd.stream))

    async def _delete_stream(self, name: str) -> None:
        if not await self.catalog.delete(self.vhost.name, name):
            raise CommandError(f"stream {name} does not exist", Code.STREAM_DOES_NOT_EXIST)
        self.hub.stream_deleted(self.vhost.name, name)

    def _stream_stats(self, cmd: c.StreamStats) -> None:
        home = self.hub.reader_link.home(self.vhost.name, cmd.stream)
        if home is None:
            handle = self.stream_handle(cmd.stream)
            self.check_permission("read", cmd.stream)
            self.send(c.StreamStatsResponse(cmd.correlation_id, Code.OK, stats_of(handle)))
            return
        self.check_permission("read", cmd.stream)

        def answer(stats: dict[str, int] | None) -> None:
            code = Code.OK if stats is not None else Code.STREAM_NOT_AVAILABLE
            self.send(c.StreamStatsResponse(cmd.correlation_id, code, stats or {}))
        self._ask_home(self.hub.reader_link.stats(home, self.vhost.name, cmd.stream), answer)

    def _resolve_offset_spec(self, cmd: c.ResolveOffsetSpec) -> None:
        home = self.hub.reader_link.home(self.vhost.name, cmd.stream)
        if home is None:
            handle = self.stream_handle(cmd.stream)
            self.check_permission("read", cmd.stream)
            offset = resolve_in(handle, cmd.offset)
            self.send(c.ResolveOffsetSpecResponse(cmd.correlation_id, Code.OK, OffsetType.OFFSET, offset))
            return
        self.check_permission("read", cmd.stream)

        def answer(offset: int | None) -> None:
            code = Code.OK if offset is not None else Code.STREAM_NOT_AVAILABLE
            self.send(c.ResolveOffsetSpecResponse(cmd.correlation_id, code, OffsetType.OFFSET, offset or 0))
        self._ask_home(self.hub.reader_link.resolve(home, self.vhost.name, cmd.stream, cmd.offset), answer)

    def _ask_home(self, question: Coroutine[Any, Any, T], answer: Callable[[T], None]) -> None:
        """A question about a stream whose copy is another worker's (home_link.py): the input is held until
        its answer is sent, so the answers keep the order of the requests."""
        self.hold_reading("request")

        async def run() -> None:
            try:
                answer(await question)
            finally:
                self.release_reading("request")
                self.flush()

        asyncio.ensure_future(run())

    def _command_versions(self, cmd: c.ExchangeCommandVersions) -> None:
        for key, _low, high in cmd.versions:
            if key == Key.DELIVER and high >= 2:
                self.consuming.deliver_version = 2
        table = [(int(k), low, high) for k, (low, high) in SERVER_VERSIONS.items()]
        self.send(c.ExchangeCommandVersionsResponse(cmd.correlation_id, Code.OK, table))

    # -- super streams -----------------------------------------------------------------------------
    def _route(self, cmd: c.Route) -> None:
        if not self.broker.auth.check(self.user_name, self.vhost.name, "write", cmd.super_stream, "exchange"):
            raise CommandError("write access refused", Code.ACCESS_REFUSED)
        try:
            streams = super_streams.route(self.vhost, cmd.super_stream, cmd.routing_key)
        except super_streams.SuperStreamError as exc:
            raise CommandError(exc.text, exc.code) from None
        self.send(c.RouteResponse(cmd.correlation_id, Code.OK, streams))

    def _partitions(self, cmd: c.Partitions) -> None:
        try:
            streams = super_streams.partitions(self.vhost, cmd.super_stream)
        except super_streams.SuperStreamError as exc:
            raise CommandError(exc.text, exc.code) from None
        self.send(c.PartitionsResponse(cmd.correlation_id, Code.OK, streams))

    def _create_super_stream(self, cmd: c.CreateSuperStream) -> None:
        for name in (cmd.name, *cmd.partitions):
            self.check_permission("configure", name)
        self._async(cmd, super_streams.create(self.broker, self.catalog, self.vhost, cmd.name, cmd.partitions,
                                              cmd.binding_keys, cmd.arguments))

    def _delete_super_stream(self, cmd: c.DeleteSuperStream) -> None:
        self.check_permission("configure", cmd.name)
        if cmd.name not in self.vhost.exchanges:
            raise CommandError(f"super stream {cmd.name} does not exist", Code.STREAM_DOES_NOT_EXIST)
        streams = super_streams.partitions(self.vhost, cmd.name)
        self._async(cmd, self._delete_super(cmd.name, streams))

    async def _delete_super(self, name: str, streams: list[str]) -> None:
        await super_streams.delete(self.broker, self.catalog, self.vhost, name)
        for stream in streams:
            self.hub.stream_deleted(self.vhost.name, stream)
