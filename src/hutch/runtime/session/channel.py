"""An AMQP channel on the server side: method handlers, content assembly, deliveries and settlement.

Owns: one channel's consumers, its unacknowledged deliveries (delivery tag -> queue entry), prefetch
limits, publisher-confirm sequence, transaction buffer, and the assembly of basic.publish content.

Rules:
- Handlers raise `ChannelError` (the connection closes just this channel) or `ConnectionError_`.
- Deliveries are encoded straight into the connection's write buffer; nothing awaits.
- Confirms: every publish gets the next sequence number and a `Receipt`; each queue it is routed to
  answers SETTLED, PENDING or REJECTED (core/queue_type.py) and settles a pending receipt when the
  message is safe by its type's rule. The channel's ledger (session/confirms.py, core/confirms.py)
  answers in publish order, coalesced into one `multiple` ack per flush of the connection. A tx.commit
  numbers its publishes the same way and its commit-ok waits until they are all decided.
- Unacked deliveries are requeued (redelivered=true) when the channel closes.
"""

from __future__ import annotations

import secrets
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.amqp import spec
from hutch.amqp.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    ChannelError,
    ConnectionError_,
    FrameError,
)
from hutch.amqp.frames import append_body
from hutch.amqp.speedups import append_delivery, parse_ack, parse_content_header, parse_publish
from hutch.core import direct_reply
from hutch.core.auth import PermissionKind, resource_access_refused_text, topic_permission_allows
from hutch.core.confirms import Receipt, ReceiptRun
from hutch.core.credit_flow import consumer_settled
from hutch.core.message import Message, encode_shortstr
from hutch.core.queue_type import PENDING, SETTLED, Consumer, Queue, QueueEntry
from hutch.core.routing import DELAYED_MESSAGE, message_delay
from hutch.runtime.session.confirms import ChannelConfirms
from hutch.runtime.session.declarations import DeclarationsMixin

if TYPE_CHECKING:
    from hutch.runtime.ports import SessionConnection

_FRAME_HDR = struct.Struct(">BHI")
_TAG_REDELIVERED = struct.Struct(">QB")
_GET_OK_TAIL = struct.Struct(">I")
_FLAG_HEADERS_HI = spec.FLAG_HEADERS >> 8
_HEADER_CLASS_WEIGHT = b"\x00\x3c\x00\x00"  # a content header of class 60 (basic), weight 0
REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
_Lane = tuple[bytes, Any, Queue, tuple[Queue], str, str]
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."


class _Unacked:
    __slots__ = ("queue", "entry", "consumer")

    def __init__(self, queue: Queue | None, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.queue = queue
        self.entry = entry
        self.consumer = consumer


# the channel's message counters (management API and Prometheus read them by these names)
STAT_COUNTERS = ("stat_publish", "stat_deliver", "stat_ack", "stat_redeliver", "stat_publish_confirm",
                 "stat_confirm", "stat_routed", "stat_return_unroutable", "stat_drop_unroutable",
                 "stat_deliver_no_ack", "stat_get", "stat_get_no_ack", "stat_get_empty")


class ServerChannel(DeclarationsMixin):
    OPEN = 1
    CLOSING = 2

    def __init__(self, conn: SessionConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.node = conn.node
        vhost = conn.vhost_obj
        assert vhost is not None  # Invariant: channels open after connection.open chose the vhost
        self.vhost = vhost
        self.user = conn.user_name
        self.state = self.OPEN
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, _Unacked] = OrderedDict()
        self.next_tag = 1
        self.prefetch_count = 0
        self.global_prefetch = 0
        self.confirm = False
        self.publish_seq = 0  # publishes numbered so far (confirm mode; tx mode: at commit)
        self.confirms: ChannelConfirms | None = None  # set by confirm.select or tx.select
        self.tx = False
        self.tx_ops: list[tuple[str, Any]] = []
        self._held_by: list[Any] = []  # delayed exchanges a routing walk reached (emptied after each publish)
        self.last_queue_name: str | None = None
        # a Direct Reply-To token whose requester another node (or worker) said is alive (cluster_gate.py)
        self.prepared_reply_token: str | None = None
        self.reply_token: str | None = None
        self.reply_consumer: Consumer | None = None
        # content assembly of the publish in progress
        self._pub: tuple[str, str, int, bytes] | None = None  # exchange, routing key, mandatory, tail
        self._pub_props: spec.BasicProperties | None = None
        self._pub_props_raw: bytes | None = None
        self._pub_header: bytes | None = None  # the header payload as received, reused when it can be
        # the publish lane (_lane_publish): (route tail, exchange, queue, (queue,), exchange name, routing
        # key) of the last generic publish when the next ones like it may skip the generic path; None: none may
        self._lane: _Lane | None = None
        # the queues the last routed publish reached (compaction of load reads it once a second to tell
        # which queues a publisher uses: runtime/session/island.py; one store per publish)
        self.last_routed: list[Queue] | tuple[Queue, ...] = ()
        self._write_checked: Any = None  # exchange whose write permission was checked this epoch
        self._body: list[bytes] = []
        self._body_remaining = 0
        self._body_held = 0  # bytes in _body, counted in conn.unfinished_body_bytes
        # statistics
        self.stat_publish = 0
        self.stat_deliver = 0
        self.stat_ack = 0
        self.stat_redeliver = 0
        self.stat_publish_confirm = 0  # publishes received in confirm mode
        self.stat_confirm = 0  # publishes acked to the publisher (basic.ack)
        self.stat_routed = 0  # enqueues of routed publishes: a message routed to three queues counts 3
        self.stat_return_unroutable = 0
        self.stat_drop_unroutable = 0
        self.stat_deliver_no_ack = 0  # the part of stat_deliver that went to no-ack consumers
        self.stat_get = 0  # basic.get-ok with manual acknowledgement
        self.stat_get_no_ack = 0
        self.stat_get_empty = 0
        # publishes and enqueues per exchange (management), credited when the exchange changes: see
        # _switch_exchange. Invariant: x_base is (stat_publish, stat_routed) when x_current began.
        self.x_counts: dict[Any, list[int]] = {}
        self.x_current: Any = None
        self.x_base = (0, 0)
        self._oldest: tuple[int, float] | None = None
        self._perm_cache: dict[tuple[str, str, str], bool] = {}
        self._perm_epoch = self.node.perm_epoch

    # -- plumbing ------------------------------------------------------------------------------
    def send(self, method: spec.Method) -> None:
        self.conn.send_method(self.number, method)

    def handle_method(self, method: spec.Method) -> None:
        if self._pub is not None:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead",
                method.CLASS_ID, method.METHOD_ID)
        handler = _HANDLERS.get(method.INDEX)
        if handler is None:
            raise ConnectionError_(
                UNEXPECTED_FRAME if method.CLASS_ID in spec.CLASS_NAMES else NOT_IMPLEMENTED,
                f"unexpected method {method.NAME} on channel {self.number}",
                method.CLASS_ID, method.METHOD_ID)
        try:
            handler(self, method)
        except (ChannelError, ConnectionError_) as exc:
            if not exc.class_id:
                exc.class_id, exc.method_id = method.CLASS_ID, method.METHOD_ID
            raise

    def can_take(self) -> bool:
        if self.state != self.OPEN or self.conn.write_paused:
            return False
        return not self.global_prefetch or len(self.unacked) < self.global_prefetch

    def check_permission(self, kind: PermissionKind, resource_type: str, name: str) -> None:
        epoch = self.node.perm_epoch
        if epoch != self._perm_epoch:
            self._perm_cache.clear()
            self._perm_epoch = epoch
        key = (kind, resource_type, name)
        allowed = self._perm_cache.get(key)
        if allowed is None:
            allowed = self.node.auth.check(self.user, self.vhost.name, kind, name, resource_type)
            self._perm_cache[key] = allowed
        if not allowed:

            raise ChannelError(ACCESS_REFUSED, resource_access_refused_text(
                self.user, self.vhost.name, kind, resource_type, name))

    # -- channel class -------------------------------------------------------------------------
    def _channel_open(self, m: Any) -> None:
        raise ConnectionError_(CHANNEL_ERROR, f"second 'channel.open' seen on channel {self.number}")

    def _channel_close(self, m: Any) -> None:
        self.conn.channels.pop(self.number, None)
        self.close_internal()
        self.send(spec.Channel.CloseOk())

    def _channel_close_ok(self, m: Any) -> None:
        pass  # we never close an open channel without removing it first; nothing to do

    def _channel_flow(self, m: Any) -> None:
        if not m.active:
            raise ConnectionError_(NOT_IMPLEMENTED, "active=false")
        self.send(spec.Channel.FlowOk(active=True))

    # -- publishing ----------------------------------------------------------------------------
    def _basic_publish(self, m: Any) -> None:
        if m.immediate:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", 60, 40)
        tail = encode_shortstr(m.exchange) + encode_shortstr(m.routing_key)
        self._pub = (m.exchange, m.routing_key, m.mandatory, tail)

    def fast_publish(self, payload: bytes) -> bool:
        """basic.publish decoded in place (the hot path); False if the generic decoder must judge it.

        The exchange and routing-key short strings of a publish are laid out exactly as the tail of
        basic.deliver, so the slice is kept as the message's `route_tail`.
        """
        if self._pub is not None:
            return False
        parsed = parse_publish(payload)
        if parsed is None:
            return False
        exchange, routing_key, bits, route_tail = parsed
        if bits & 2:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", 60, 40)
        self._pub = (exchange, routing_key, bits & 1, route_tail)
        return True

    def handle_header(self, payload: bytes) -> None:
        if self._pub is None or self._pub_props_raw is not None:
            raise ConnectionError_(UNEXPECTED_FRAME, "unexpected content header frame")
        class_id, body_size, props_raw, fixed_only = parse_content_header(payload)
        if class_id != 60:
            raise ConnectionError_(UNEXPECTED_FRAME, f"content header for class {class_id} not allowed")
        # Decoding validates the property list. Lists made only of fixed-size properties (none,
        # delivery-mode, priority, timestamp: what most publishers send) are validated by their length
        # alone and decoded later, only if something asks for them.
        props = None if fixed_only else spec.BasicProperties.decode(props_raw, 0)
        max_size = self.node.config.max_message_size
        if body_size > max_size:
            self._pub = None
            raise ChannelError(PRECONDITION_FAILED,
                               f"message size {body_size} is larger than configured max size {max_size}",
                               60, 40)
        self._pub_props = props
        self._pub_props_raw = props_raw
        # the payload is the message's header as it will be delivered when its weight is 0 (as it
        # must be) and its properties are not rewritten (_complete_publish checks that)
        self._pub_header = payload if payload.startswith(_HEADER_CLASS_WEIGHT) else None
        conn = self.conn
        conn.has_published = True
        if self.node.alarms and not conn.alarm_blocked:
            # RabbitMQ blocks the reader on a content frame: a message whose body is still arriving is
            # held like a new one (what is already read is processed; the socket is not read again)
            conn.block_for_alarm()
        if body_size == 0:
            self._complete_publish(b"")
        else:
            self._body_remaining = body_size

    def handle_body(self, payload: bytes) -> None:
        if self._pub_props_raw is None:
            raise ConnectionError_(UNEXPECTED_FRAME, "unexpected content body frame")
        self._body_remaining -= len(payload)
        if self._body_remaining < 0:
            raise FrameError("content body larger than declared in its header")
        if self._body_remaining == 0:
            if self._body:
                self._body.append(payload)
                body = b"".join(self._body)
                self._drop_body()
            else:
                body = payload
            self._complete_publish(body)
        else:
            self._body.append(payload)
            self._body_held += len(payload)
            self.conn.hold_unfinished_body(len(payload))

    def handle_content(self, header: bytes, body: bytes) -> bool:
        """A publish's content header and its whole body in one frame, taken together by the reader
        (`FrameReader.take_content`): the same as `handle_header` then `handle_body`, or the publish lane
        (`_lane_publish`) when the publish is one the lane may take. True when the lane took it: the
        connection may then hand the publishes like it that follow to `lane_run`."""
        lane = self._lane
        if lane is not None and self._lane_publish(lane, header, body):
            return True
        self.handle_header(header)
        self.handle_body(body)
        return False

    def lane_run(self, contents: list[tuple[bytes, bytes]]) -> None:
        """The publishes that followed one the lane took, in the same loop turn, exactly like it (the same
        basic.publish payload; a class-60 header of fixed-size properties only, within the size limit, and
        its body in one frame: `FrameReader.take_publishes` checked all that): what held for that one
        holds for them (nothing ran in between), so they go to the queue as one run, numbered in order,
        their confirms recorded as one run."""
        lane = self._lane
        assert lane is not None and contents, "a run follows a publish the lane took"
        route_tail, _, q, refs, exchange, routing_key = lane
        n = len(contents)
        self.stat_publish += n
        self.stat_routed += n
        confirms = self.confirms
        if self.confirm and confirms is not None:
            first = self.publish_seq + 1
            self.publish_seq = last = self.publish_seq + n
            self.stat_publish_confirm += n
            results = q.publish_raw_run(exchange, routing_key, route_tail, contents, ReceiptRun(confirms, first, last))
            if results.count(PENDING) == n:
                confirms.insert_run(first, last, q)
            else:
                for seq, result in enumerate(results, first):
                    confirms.published(seq, refs if result is PENDING else None,
                                       result is not SETTLED and result is not PENDING)
        else:
            q.publish_raw_run(exchange, routing_key, route_tail, contents)
        if q.needs_flow_control():
            self.conn.flow_block(q)

    def _lane_publish(self, lane: _Lane, header: bytes, body: bytes) -> bool:
        """The publish lane: a publish like the one before it on this channel (the same exchange and
        routing key, the default exchange routing to one queue whose type takes `publish_raw`) and whose
        properties are fixed-size only (no header table: nothing to check, rewrite or route by) goes to
        that queue without a `Message` or the routing walk. True when it went; False (nothing done) when
        anything differs from the publish the lane was made from (the generic path then judges it): the
        routing key names another queue or none, the queue was deleted, permissions changed (the epoch),
        a resource alarm is raised, the channel is transactional, the header is not the plain class-60
        header, or the message is over the size limit (the generic path's error)."""
        pub = self._pub
        if pub is None or pub[3] != lane[0] or not header.startswith(_HEADER_CLASS_WEIGHT):
            return False
        _, body_size, props_raw, fixed_only = parse_content_header(header)
        q = lane[2]
        node = self.node
        if not fixed_only or self._write_checked is not lane[1] or self._perm_epoch != node.perm_epoch \
                or node.alarms or self.tx or q.deleted or self.vhost.queues.get(pub[1]) is not q \
                or body_size > node.config.max_message_size:
            return False
        self._pub = None
        conn = self.conn
        conn.has_published = True
        self.stat_publish += 1
        self.stat_routed += 1
        exchange, routing_key, _, route_tail = pub
        confirms = self.confirms
        if self.confirm and confirms is not None:
            self.publish_seq = seq = self.publish_seq + 1
            self.stat_publish_confirm += 1
            result = q.publish_raw(exchange, routing_key, props_raw, body, route_tail, header, Receipt(confirms, seq))
            confirms.published(seq, lane[3] if result is PENDING else None,
                               result is not SETTLED and result is not PENDING)
        else:
            q.publish_raw(exchange, routing_key, props_raw, body, route_tail, header)
        if q.needs_flow_control():
            conn.flow_block(q)
        return True

    def _open_lane(self, x: Any, routing_key: str, route_tail: bytes) -> None:
        """After a generic publish: the publish lane for the next ones like it, when it may take them
        (the default exchange, whose routing is the queue of that name; a queue type with `accepts_raw`;
        the write permission checked for this epoch; not transactional)."""
        q = self.vhost.queues.get(routing_key) if x.name == "" else None
        if q is not None and q.accepts_raw and not q.deleted and self._write_checked is x and not self.tx:
            self._lane = (route_tail, x, q, (q,), x.name, routing_key)
        else:
            self._lane = None

    def _drop_body(self) -> None:
        self._body = []
        self.conn.release_unfinished_body(self._body_held)
        self._body_held = 0

    def _complete_publish(self, body: bytes) -> None:
        pub = self._pub
        props = self._pub_props
        props_raw = self._pub_props_raw
        header = self._pub_header
        self._pub = None
        self._pub_props = None
        self._pub_props_raw = None
        self._pub_header = None
        assert pub is not None and props_raw is not None
        exchange, routing_key, mandatory, route_tail = pub
        if self.confirm:
            self.publish_seq += 1
            self.stat_publish_confirm += 1
        self.stat_publish += 1
        x = self.vhost.exchanges.get(exchange)
        if x is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{exchange}' in vhost '{self.vhost.name}'", 60, 40)
        if self._write_checked is not x or self._perm_epoch != self.node.perm_epoch:
            if x is not self.x_current:
                _switch_exchange(self, x)
            self.check_permission("write", "exchange", exchange)
            if x.internal:
                raise ChannelError(ACCESS_REFUSED,
                                   f"cannot publish to internal exchange '{exchange}' in vhost "
                                   f"'{self.vhost.name}'", 60, 40)
            if self._perm_epoch == self.node.perm_epoch:
                self._write_checked = x
        routing_keys = [routing_key]
        if props is not None:
            received_raw = props_raw
            if props.user_id is not None and props.user_id != self.user:
                raise ChannelError(PRECONDITION_FAILED,
                                   f"user_id property set to '{props.user_id}' but authenticated user was "
                                   f"'{self.user}'", 60, 40)
            if props.expiration is not None:
                _check_expiration(props.expiration)
            headers = props.headers
            if headers and ("CC" in headers or "BCC" in headers):
                routing_keys, props, props_raw = _sender_selected(routing_key, props, props_raw)
            if props.reply_to == REPLY_TO_QUEUE:
                props, props_raw = self._rewrite_reply_to(props)
            if props_raw is not received_raw:
                header = None  # rewritten: the header is packed again with the new properties
        if x.type == "topic" and self.node.topic_permissions:
            _check_topic_write(self, exchange, routing_keys)
        msg = Message(exchange, routing_key, props, body, props_raw, route_tail, header)
        if props is not None and props.headers and "x-death" in props.headers:
            msg.foreign_deaths = True  # RabbitMQ 4.x: a client's x-death is not death history
        if self.tx:
            # RabbitMQ routes a transactional publish now and enqueues at commit, so the queues do
            # not depend on exchanges or bindings changing in between; None: handled at commit (Direct
            # Reply-To, and a message a delayed exchange holds: held from the commit on)
            held_at_commit = x.type == DELAYED_MESSAGE and message_delay(msg.properties.headers) is not None
            queues = (None if exchange == "" and routing_key.startswith(REPLY_TO_PREFIX) or held_at_commit
                      else self.vhost.route(x, routing_keys, msg.properties.headers, msg, self._held_by))
            if self._held_by:  # a delayed exchange further on holds it: routed again at the commit
                self._held_by.clear()
                queues = None
            self.tx_ops.append(("publish", (x, routing_keys, msg, mandatory, queues)))
            return
        if not self.confirm:
            self._route_and_enqueue(x, routing_keys, msg, mandatory, None)
        else:
            assert self.confirms is not None, "confirm.select made the channel's ledger"
            self._route_and_enqueue(x, routing_keys, msg, mandatory, Receipt(self.confirms, self.publish_seq))
        if props is None and len(routing_keys) == 1:
            self._open_lane(x, routing_key, route_tail)

    def _route_and_enqueue(self, x: Any, routing_keys: list[str], msg: Message, mandatory: int,
                           receipt: Receipt | None) -> None:
        """Route and enqueue; with a receipt, record in the ledger what the queues answered."""
        if x.name == "" and routing_keys[0].startswith(REPLY_TO_PREFIX):
            queues: list[Queue] = []
            if self.node.deliver_direct_reply(routing_keys[0][len(REPLY_TO_PREFIX):], msg):
                if receipt is not None and self.confirms is not None:
                    self.confirms.published(receipt.seq, None, False)
                return
        else:
            raw = msg.properties_raw
            headers = msg.properties.headers if raw[0] & _FLAG_HEADERS_HI else None
            if x.type == DELAYED_MESSAGE and headers and self._held(x, msg, headers, receipt):
                return
            held_by = self._held_by if self.node.delayed is not None else None
            queues = self.vhost.route(x, routing_keys, headers, msg, held_by)
            if held_by:
                self._enqueue(queues, msg, mandatory, receipt, self._hold_in(held_by, msg, headers, receipt))
                return
        self._enqueue(queues, msg, mandatory, receipt)

    def _held(self, x: Any, msg: Message, headers: dict[str, Any], receipt: Receipt | None) -> bool:
        """An x-delayed-message exchange holds a message with a delay (docs/delayed-messages.md)."""
        delayed = self.node.delayed
        pending = delayed.hold(self.vhost, x, msg, headers, receipt) if delayed is not None else None
        if pending is None:
            return False
        self.stat_routed += 1
        if receipt is not None and self.confirms is not None:
            self.confirms.published(receipt.seq, pending or None, False)
        return True

    def _hold_in(self, held_by: list[Any], msg: Message, headers: dict[str, Any] | None,
                 receipt: Receipt | None) -> list[Any]:
        """Delayed exchanges reached through bindings hold the message: what its receipt waits for."""
        delayed = self.node.delayed
        assert delayed is not None, "a walk collects delayed exchanges only when the node holds messages"
        waits: list[Any] = []
        for hx in held_by:
            waits += delayed.hold(self.vhost, hx, msg, headers, receipt) or ()
        held_by.clear()
        return waits

    def _enqueue(self, queues: list[Queue], msg: Message, mandatory: int, receipt: Receipt | None,
                 held_waits: list[Any] | None = None) -> None:
        """`held_waits` (not None: delayed exchanges hold the message too, so it is routed) is what the
        receipt waits for from them."""
        pending: list[Any] | None = held_waits or None
        rejected = False
        if queues:
            self.stat_routed += len(queues)
            self.last_routed = queues
            for q in queues:
                result = q.publish(msg, receipt)
                if result is not SETTLED:
                    if result is PENDING:
                        if pending is None:
                            pending = [q]
                        else:
                            pending.append(q)
                    else:
                        rejected = True
                if q.needs_flow_control():
                    self.conn.flow_block(q)
        elif held_waits is not None:
            self.stat_routed += 1
        elif mandatory:
            self.stat_return_unroutable += 1
            self._send_return(NO_ROUTE, "NO_ROUTE", msg)
        else:
            self.stat_drop_unroutable += 1
        if receipt is not None and self.confirms is not None:
            self.confirms.published(receipt.seq, pending, rejected)

    def _send_return(self, code: int, text: str, msg: Message) -> None:
        method = spec.Basic.Return(reply_code=code, reply_text=text, exchange=msg.exchange,
                                   routing_key=msg.routing_key)
        self.conn.send_method(self.number, method)
        self._write_content(msg)

    def _write_content(self, msg: Message) -> None:
        out = self.conn.out
        ch = self.number
        hp = msg.header_payload
        out.append(_FRAME_HDR.pack(2, ch, len(hp)) + hp + b"\xce")
        append_body(out, ch, msg.body, self.conn.frame_max)
        self.conn.want_write()

    def _rewrite_reply_to(self, props: spec.BasicProperties) -> tuple[spec.BasicProperties, bytes]:
        if self.reply_consumer is None:
            raise ChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
        props = props.copy()
        props.reply_to = REPLY_TO_PREFIX + self._ensure_reply_token()
        return props, props.encode()

    def _ensure_reply_token(self) -> str:
        if self.reply_token is None:
            self.reply_token = direct_reply.new_token(self.node.name)
            self.node.reply_channels[self.reply_token] = self
        return self.reply_token

    def flush_confirms(self) -> None:
        """Send the acks/nacks (or commit-oks) decided since the last flush of the connection."""
        if self.confirms is not None:
            self.confirms.flush()

    def unconfirmed_count(self) -> int:
        """Confirm-mode publishes not answered yet (management)."""
        return self.confirms.unconfirmed if self.confirm and self.confirms is not None else 0

    # -- delivering ----------------------------------------------------------------------------
    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        if not consumer.no_ack:
            self.unacked[tag] = _Unacked(queue, entry, consumer)
        else:
            self.stat_deliver_no_ack += 1
        msg = entry.msg
        self.stat_deliver += 1
        redelivered = entry.redelivered
        if redelivered:
            self.stat_redeliver += 1
        conn = self.conn  # _write_delivery, inlined: one call fewer per delivery
        append_delivery(conn.out, self.number, consumer.frame_prefix, tag, redelivered, msg.route_tail,
                        msg.header_payload, msg.body, conn.frame_max)
        conn.want_write()

    def deliver_run(self, consumer: Consumer, queue: Queue, items: list[tuple[int, Message]], i: int, stop: int,
                    make: Callable[[int, Message, Any], QueueEntry], owner: Any) -> int:
        """`deliver` of `make(offset, msg, owner)` for each (offset, msg) of `items[i:stop]` that the channel
        takes (a stream consumer's run of a chunk: first deliveries, never redelivered), in one call: the
        channel's state, output and prefetch are read once, not per message (nothing here changes them
        but the unacked count, which the loop counts). Returns the index reached."""
        conn = self.conn
        if self.state != self.OPEN or conn.write_paused:
            return i
        unacked = self.unacked
        if self.global_prefetch:
            stop = min(stop, i + max(0, self.global_prefetch - len(unacked)))
        if i >= stop:
            return i
        out, number, prefix, frame_max = conn.out, self.number, consumer.frame_prefix, conn.frame_max
        no_ack = consumer.no_ack
        first = tag = self.next_tag
        while i < stop:
            offset, msg = items[i]
            i += 1
            entry = make(offset, msg, owner)
            if not no_ack:
                unacked[tag] = _Unacked(queue, entry, consumer)
            append_delivery(out, number, prefix, tag, False, msg.route_tail, msg.header_payload, msg.body,
                            frame_max)
            tag += 1
        self.next_tag = tag
        self.stat_deliver += tag - first
        if no_ack:
            self.stat_deliver_no_ack += tag - first
        conn.want_write()
        return i

    def _write_delivery(self, prefix: bytes, tag: int, redelivered: bool, msg: Message) -> None:
        conn = self.conn
        append_delivery(conn.out, self.number, prefix, tag, redelivered, msg.route_tail, msg.header_payload,
                        msg.body, conn.frame_max)
        conn.want_write()

    def deliver_direct_reply(self, msg: Message) -> bool:
        consumer = self.reply_consumer
        if consumer is None or self.state != self.OPEN:
            return False
        tag = self.next_tag
        self.next_tag = tag + 1
        self.stat_deliver += 1
        self.stat_deliver_no_ack += 1
        self._write_delivery(consumer.frame_prefix, tag, False, msg)
        return True

    def _basic_get(self, m: Any) -> None:
        q = self._queue_for(m.queue)
        self.check_permission("read", "queue", q.name)
        self.vhost.check_exclusive(q, self.conn)
        entry = q.get(self, m.no_ack)
        if entry is None:
            self.stat_get_empty += 1
            self.send(spec.Basic.GetEmpty())
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        if not m.no_ack:
            self.unacked[tag] = _Unacked(q, entry, None)
            self.stat_get += 1
        else:
            self.stat_get_no_ack += 1
        if entry.redelivered:
            self.stat_redeliver += 1
        msg = entry.msg
        payload = b"".join((b"\x00\x3c\x00\x47", _TAG_REDELIVERED.pack(tag, entry.redelivered),
                            msg.route_tail, _GET_OK_TAIL.pack(q.message_count)))
        self.conn.send_raw_method(self.number, payload)
        self._write_content(msg)

    # -- settlement ----------------------------------------------------------------------------
    def _collect(self, tag: int, multiple: bool) -> list[_Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                items = list(unacked.values())
                unacked.clear()
                return items
            if tag not in unacked:
                raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, 80)
            n = 0  # the tags are in delivery order: count the prefix up to `tag`, then pop it
            for t in unacked:
                if t > tag:
                    break
                n += 1
            popitem = unacked.popitem
            return [popitem(last=False)[1] for _ in range(n)]
        item = unacked.pop(tag, None)
        if item is None:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, 80)
        return [item]

    def fast_ack(self, payload: bytes) -> bool:
        """basic.ack decoded in place; False when the generic path must handle it (tx, odd length)."""
        if self.tx or self._pub is not None:
            return False
        parsed = parse_ack(payload)
        if parsed is None:
            return False
        self._settle(self._collect(*parsed), "ack")
        return True

    def _basic_ack(self, m: Any) -> None:
        if self.tx:
            self._collect_check(m.delivery_tag, m.multiple)
            self.tx_ops.append(("ack", (m.delivery_tag, m.multiple)))
            return
        self._settle(self._collect(m.delivery_tag, m.multiple), "ack")

    def _basic_reject(self, m: Any) -> None:
        if self.tx:
            self._collect_check(m.delivery_tag, False)
            self.tx_ops.append(("reject", (m.delivery_tag, False, m.requeue)))
            return
        self._settle(self._collect(m.delivery_tag, False), "requeue" if m.requeue else "discard")

    def _basic_nack(self, m: Any) -> None:
        if self.tx:
            self._collect_check(m.delivery_tag, m.multiple)
            self.tx_ops.append(("reject", (m.delivery_tag, m.multiple, m.requeue)))
            return
        self._settle(self._collect(m.delivery_tag, m.multiple), "requeue" if m.requeue else "discard")

    def _collect_check(self, tag: int, multiple: bool) -> None:
        if (tag or not multiple) and tag not in self.unacked:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, 80)

    def _settle(self, items: list[_Unacked], action: str) -> None:
        if not items:
            return
        self.stat_ack += len(items) if action == "ack" else 0
        by_queue: dict[int, tuple[Queue, list[QueueEntry]]] = {}
        last_q: Queue | None = None  # runs of one queue (the common case) skip the dict
        entries: list[QueueEntry] = []
        for item in items:
            consumer = item.consumer
            if consumer is not None:
                consumer.unacked -= 1
            q = item.queue
            if q is None:
                continue
            if q is last_q:
                entries.append(item.entry)
                continue
            group = by_queue.get(id(q))
            if group is None:
                group = by_queue[id(q)] = (q, [])
            last_q, entries = q, group[1]
            entries.append(item.entry)
        for q, entries in by_queue.values():
            if action == "ack":
                q.ack(entries)
            elif action == "requeue":
                q.requeue(entries)
            else:
                q.discard(entries)
        if self.consumers:
            self._judge_pace()
        self._resume_consumers()

    def _judge_pace(self) -> None:
        """Settlements came back: judge whether the consumers that filled their prefetch keep pace
        (core/credit_flow.py; the flow rule). O(consumers of this channel), once per settle call."""
        now_ms = 0
        for c in self.consumers.values():
            if c.pace_start_ms >= 0:
                now_ms = now_ms or int(self.node.wall_ms())
                q = c.queue
                consumer_settled(c, now_ms, q.stat_published, q.stat_acked)

    def _resume_consumers(self) -> None:
        if not self.consumers:
            return
        seen: set[int] = set()
        for c in list(self.consumers.values()):
            q = c.queue
            if id(q) not in seen:
                seen.add(id(q))
                q.deliver_pending()

    def _basic_recover_async(self, m: Any) -> None:
        if not m.requeue:
            raise ConnectionError_(NOT_IMPLEMENTED, "requeue=false")
        self._settle(self._collect(0, True), "requeue")

    def _basic_recover(self, m: Any) -> None:
        self._basic_recover_async(m)
        self.send(spec.Basic.RecoverOk())

    # -- qos, consumers --------------------------------------------------------------------------
    def _basic_qos(self, m: Any) -> None:
        if m.prefetch_size:
            raise ConnectionError_(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch_count = m.prefetch_count
        self.send(spec.Basic.QosOk())
        self._resume_consumers()

    def _basic_consume(self, m: Any) -> None:
        if m.queue == REPLY_TO_QUEUE:
            self._consume_reply_to(m)
            return
        q = self._queue_for(m.queue)
        self.check_permission("read", "queue", q.name)
        self.vhost.check_exclusive(q, self.conn)
        if self.global_prefetch and q.queue_type == "quorum":  # seed 000; a connection error, as RabbitMQ
            raise ConnectionError_(NOT_IMPLEMENTED, f"queue '{q.name}' in vhost '{self.vhost.name}' does not "
                                                    "support global qos", 60, 20)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers:
            raise ConnectionError_(530, f"attempt to reuse consumer tag '{tag}'")
        if q.refuses_consumer(bool(m.exclusive)):
            raise ChannelError(ACCESS_REFUSED,
                               f"queue '{q.name}' in vhost '{self.vhost.name}' in exclusive use")
        priority = _consumer_priority(m.arguments)
        consumer = Consumer(tag, self, q, m.no_ack, m.exclusive, self.prefetch_count, priority,
                            m.arguments)
        self.node.queue_type_of(q).check_consume(q, consumer)  # refusals come before consume-ok
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send(spec.Basic.ConsumeOk(consumer_tag=tag))
        q.add_consumer(consumer)

    def _consume_reply_to(self, m: Any) -> None:
        if not m.no_ack:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_consumer is not None:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer already set")
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        self.reply_consumer = Consumer(tag, self, _NO_QUEUE, True, False, 0)
        self._ensure_reply_token()
        if not m.nowait:
            self.send(spec.Basic.ConsumeOk(consumer_tag=tag))

    def _basic_cancel(self, m: Any) -> None:
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            self._detach_consumer(consumer)
        elif self.reply_consumer is not None and self.reply_consumer.tag == m.consumer_tag:
            self.reply_consumer = None
        if not m.nowait:
            self.send(spec.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def _detach_consumer(self, consumer: Consumer) -> None:
        q = consumer.queue
        q.remove_consumer(consumer)
        if q.auto_delete and not q.consumer_count and not q.deleted and not q.remote:  # home node decides
            self.node.delete_queue(self.vhost, q)

    def stats(self) -> dict[str, int]:
        """The `stat_*` counters, by name (folded into the node's totals when the channel closes)."""
        return {name: getattr(self, name) for name in STAT_COUNTERS}

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.state == self.OPEN and self.conn.capabilities.get("consumer_cancel_notify"):
            self.send(spec.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    # -- confirm and tx ------------------------------------------------------------------------
    def _confirm_select(self, m: Any) -> None:
        if self.tx:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if self.confirms is None:
            self.confirms = ChannelConfirms(self, tx=False)
        if not m.nowait:
            self.send(spec.Confirm.SelectOk())

    def _tx_select(self, m: Any) -> None:
        if self.confirm:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.tx = True
        if self.confirms is None:
            self.confirms = ChannelConfirms(self, tx=True)
        self.send(spec.Tx.SelectOk())

    def _tx_commit(self, m: Any) -> None:
        if not self.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        ops, self.tx_ops = self.tx_ops, []
        confirms = self.confirms
        assert confirms is not None, "tx.select made the channel's ledger"
        for kind, args in ops:
            if kind == "publish":
                x, routing_keys, msg, mandatory, queues = args
                self.publish_seq += 1
                receipt = Receipt(confirms, self.publish_seq)
                if queues is None:
                    self._route_and_enqueue(x, routing_keys, msg, mandatory, receipt)
                else:
                    self._enqueue([q for q in queues if not q.deleted], msg, mandatory, receipt)
            elif kind == "ack":
                tag, multiple = args
                self._settle(self._collect(tag, multiple), "ack")
            else:
                tag, multiple, requeue = args
                self._settle(self._collect(tag, multiple), "requeue" if requeue else "discard")
        # commit-ok means every publish of the commit is safe (on disk, on its home node, committed)
        if confirms.commit():
            self.send(spec.Tx.CommitOk())

    def _tx_rollback(self, m: Any) -> None:
        if not self.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        self.tx_ops = []
        self.send(spec.Tx.RollbackOk())

    # -- teardown ------------------------------------------------------------------------------
    def content_in_progress(self) -> bool:
        """A publish's content is being assembled (its header or body frames have not all arrived)."""
        return self._pub is not None or bool(self._body)

    def close_internal(self) -> None:
        """Release everything the channel holds: consumers first, then requeue unacked deliveries."""
        if self.state == self.OPEN:
            self.node.channel_closed(self)
        self.state = self.CLOSING
        self._pub = None
        self._pub_props = None
        self._pub_props_raw = None
        self._pub_header = None
        self._lane = None
        self._drop_body()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self._detach_consumer(consumer)
        self.reply_consumer = None
        if self.confirms is not None:
            self.confirms.closed = True
        if self.reply_token is not None:
            self.node.reply_channels.pop(self.reply_token, None)
        items = list(self.unacked.values())
        self.unacked.clear()
        by_queue: dict[int, tuple[Queue, list[QueueEntry]]] = {}
        for item in items:
            if item.queue is not None:
                by_queue.setdefault(id(item.queue), (item.queue, []))[1].append(item.entry)
        for q, entries in by_queue.values():
            q.requeue(entries)

    def consumer_timed_out(self, now: float, timeout_s: float) -> float:
        """The timeout (s) the oldest unacked delivery has exceeded, or 0.

        The node calls this on a coarse tick; the oldest delivery tag and the time it was first seen
        oldest are remembered, so deliveries cost nothing extra and the precision is one tick. The
        queue's own timeout (x-consumer-timeout) takes the place of the node's when set.
        """
        if not self.unacked:
            self._oldest = None
            return 0.0
        first = next(iter(self.unacked))
        if self._oldest is None or self._oldest[0] != first:
            self._oldest = (first, now)
            return 0.0
        q = self.unacked[first].queue
        own = q.settings.consumer_timeout if q is not None else None
        limit = own / 1000 if own is not None else timeout_s
        return limit if now - self._oldest[1] >= limit else 0.0

    def info(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "user": self.user,
            "vhost": self.vhost.name,
            "consumer_count": len(self.consumers),
            "messages_unacknowledged": len(self.unacked),
            "prefetch_count": self.prefetch_count,
            "global_prefetch_count": self.global_prefetch,
            "confirm": self.confirm,
            "transactional": self.tx,
            "state": "running" if self.state == self.OPEN else "closing",
        }


_HANDLERS: dict[int, Callable[[ServerChannel, Any], None]] = {
    spec.Channel.Open.INDEX: ServerChannel._channel_open,
    spec.Channel.Close.INDEX: ServerChannel._channel_close,
    spec.Channel.CloseOk.INDEX: ServerChannel._channel_close_ok,
    spec.Channel.Flow.INDEX: ServerChannel._channel_flow,
    spec.Exchange.Declare.INDEX: ServerChannel._exchange_declare,
    spec.Exchange.Delete.INDEX: ServerChannel._exchange_delete,
    spec.Exchange.Bind.INDEX: ServerChannel._exchange_bind,
    spec.Exchange.Unbind.INDEX: ServerChannel._exchange_unbind,
    spec.Queue.Declare.INDEX: ServerChannel._queue_declare,
    spec.Queue.Bind.INDEX: ServerChannel._queue_bind,
    spec.Queue.Unbind.INDEX: ServerChannel._queue_unbind,
    spec.Queue.Purge.INDEX: ServerChannel._queue_purge,
    spec.Queue.Delete.INDEX: ServerChannel._queue_delete,
    spec.Basic.Qos.INDEX: ServerChannel._basic_qos,
    spec.Basic.Consume.INDEX: ServerChannel._basic_consume,
    spec.Basic.Cancel.INDEX: ServerChannel._basic_cancel,
    spec.Basic.Publish.INDEX: ServerChannel._basic_publish,
    spec.Basic.Get.INDEX: ServerChannel._basic_get,
    spec.Basic.Ack.INDEX: ServerChannel._basic_ack,
    spec.Basic.Reject.INDEX: ServerChannel._basic_reject,
    spec.Basic.Nack.INDEX: ServerChannel._basic_nack,
    spec.Basic.RecoverAsync.INDEX: ServerChannel._basic_recover_async,
    spec.Basic.Recover.INDEX: ServerChannel._basic_recover,
    spec.Confirm.Select.INDEX: ServerChannel._confirm_select,
    spec.Tx.Select.INDEX: ServerChannel._tx_select,
    spec.Tx.Commit.INDEX: ServerChannel._tx_commit,
    spec.Tx.Rollback.INDEX: ServerChannel._tx_rollback,
}


class _NoQueue(Queue):
    """Stand-in queue of the Direct Reply-To pseudo-consumer."""

    def __init__(self) -> None:
        super().__init__("", REPLY_TO_QUEUE, False, None, False, {})


_NO_QUEUE = _NoQueue()


def _consumer_priority(arguments: dict[str, Any] | None) -> int:
    if not arguments or "x-priority" not in arguments:
        return 0
    value = arguments["x-priority"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChannelError(PRECONDITION_FAILED,
                           f"invalid arg 'x-priority' for consumer: {value!r} is not an integer")
    return value


def _switch_exchange(ch: ServerChannel, x: Any) -> None:
    """The channel publishes to another exchange than before: credit the publishes and enqueues since
    the last switch to the exchange they went to (management's per-exchange publish_in/publish_out).
    Runs on a change of exchange only, so the per-exchange counts cost nothing per message. The publish
    being handled is already in stat_publish and not yet routed: it belongs to `x`."""
    current = ch.x_current
    published = ch.stat_publish - 1
    if current is not None:
        base_published, base_routed = ch.x_base
        counts = ch.x_counts.get(current)
        if counts is None:
            counts = ch.x_counts[current] = [0, 0]
        counts[0] += published - base_published
        counts[1] += ch.stat_routed - base_routed
    ch.x_current = x
    ch.x_base = (published, ch.stat_routed)


def _check_topic_write(ch: ServerChannel, exchange: str, routing_keys: list[str]) -> None:
    """RabbitMQ's topic authorisation of a publish to a topic exchange: the user's topic permission for
    the exchange (if any) must match every routing key; {username} and {vhost} are expanded."""
    perms = ch.node.topic_permissions.get((ch.vhost.name, ch.user))
    entry = perms.get(exchange) if perms else None
    if entry is None:
        return
    vhost = ch.vhost.name
    for key in routing_keys:
        if not topic_permission_allows(entry[0], ch.user, vhost, key):
            raise ChannelError(ACCESS_REFUSED, f"write access to topic '{key}' in exchange '{exchange}' in vhost "
                                               f"'{vhost}' refused for user '{ch.user}'", 60, 40)


def _check_expiration(expiration: str) -> None:
    if not expiration.isdigit() or int(expiration) >= 2**32:
        raise ChannelError(PRECONDITION_FAILED, f"invalid expiration '{expiration}'", 60, 40)


def _sender_selected(routing_key: str, props: spec.BasicProperties,
                     props_raw: bytes) -> tuple[list[str], spec.BasicProperties, bytes]:
    """CC and BCC headers add routing keys; BCC is removed before the message is stored."""
    headers = props.headers or {}
    keys = [routing_key]
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if isinstance(value, list):
            keys.extend(k for k in value if isinstance(k, str))
        elif value is not None:
            raise ChannelError(PRECONDITION_FAILED, f"invalid {name} header: expected an array", 60, 40)
    if "BCC" in headers:
        props = props.copy()
        props.headers = {k: v for k, v in headers.items() if k != "BCC"}
        props_raw = spec.remove_header(props_raw, "BCC")
    return keys, props, props_raw
