"""The message as the broker holds it.

Owns: `Message`, an immutable published message: the exchange and routing key it was published with,
its encoded content-header payload (kept exactly as the publisher sent it, so delivery never re-encodes
properties), its decoded properties (decoded once, on publish), and its body.

Properties are decoded lazily: a message whose header carries no property the broker must read on
publish (headers, expiration, user-id, reply-to) is never decoded at all.

Invariant: `header_payload` is the content-header frame payload that matches `properties` and `body`
(class id, weight, body size, property flags and list); `route_tail` is the encoded
exchange + routing-key suffix of basic.deliver/basic.get-ok/basic.return. Both are built once.
"""

from __future__ import annotations

import struct
from typing import Any

from hutch.amqp.spec import FLAG_DELIVERY_MODE, BasicProperties

_HEADER_PREFIX = struct.Struct(">HHQ")
_FLAGS_BEFORE_DELIVERY_MODE = 0xE000  # content-type, content-encoding, headers precede delivery-mode


def encode_shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


class Message:
    __slots__ = ("exchange", "routing_key", "_properties", "properties_raw", "body", "header_payload",
                 "route_tail", "size", "store_id", "foreign_deaths", "__weakref__")

    exchange: str
    routing_key: str
    body: bytes
    header_payload: bytes
    route_tail: bytes
    size: int
    store_id: int  # the id of this message in its vhost's message store, 0 when not stored there
    foreign_deaths: bool  # a client published it with an x-death header (ignored when dead-lettering)

    def __init__(self, exchange: str, routing_key: str, properties: BasicProperties | None, body: bytes,
                 properties_raw: bytes | None = None, route_tail: bytes | None = None,
                 header_payload: bytes | None = None) -> None:
        """`properties` may be None when `properties_raw` is given: they are decoded on first use.
        `header_payload`, when given, is the content-header payload as received (class 60, weight 0,
        `len(body)`, then exactly `properties_raw`): kept as it is instead of being packed again."""
        self.exchange = exchange
        self.routing_key = routing_key
        self._properties = properties
        self.body = body
        if properties_raw is None:
            assert properties is not None
            properties_raw = properties.encode()
        self.properties_raw = properties_raw
        self.header_payload = header_payload or _HEADER_PREFIX.pack(60, 0, len(body)) + properties_raw
        self.route_tail = route_tail or encode_shortstr(exchange) + encode_shortstr(routing_key)
        self.size = len(body)
        self.store_id = 0
        self.foreign_deaths = False

    @property
    def properties(self) -> BasicProperties:
        props = self._properties
        if props is None:
            props = self._properties = BasicProperties.decode(self.properties_raw, 0)
        return props

    @property
    def persistent(self) -> bool:
        raw = self.properties_raw
        flags = raw[0] << 8 | raw[1]
        if not flags & FLAG_DELIVERY_MODE:
            return False
        if not flags & _FLAGS_BEFORE_DELIVERY_MODE:
            return raw[2] == 2  # delivery-mode is the first property present: no decoding needed
        return self.properties.delivery_mode == 2

    def with_properties(self, properties: BasicProperties) -> Message:
        """A copy with other properties (re-encoded), e.g. with BCC removed or x-death added."""
        return Message(self.exchange, self.routing_key, properties, self.body)

    def with_header(self, name: str, value: Any) -> Message:
        """A copy with one header set (re-encoded), e.g. x-delivery-count on a redelivery."""
        props = self.properties.copy()
        headers = dict(props.headers or {})
        headers[name] = value
        props.headers = headers
        return self.with_properties(props)

    @property
    def expiration_ms(self) -> int | None:
        """The per-message TTL (the `expiration` property, validated at publish), or None."""
        raw = self.properties_raw
        if not raw[0] & 0x01:  # expiration is flag bit 8 (0x0100): the low bit of the first flag byte
            return None
        expiration = self.properties.expiration
        return int(expiration) if expiration is not None and expiration.isdigit() else None

    def with_route(self, exchange: str, routing_key: str) -> Message:
        return Message(exchange, routing_key, self._properties, self.body, self.properties_raw)

    @property
    def headers(self) -> dict[str, Any] | None:
        return self.properties.headers

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r}/{self.routing_key!r} {self.size}B>"
