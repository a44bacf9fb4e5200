"""The message as the broker holds it.

Owns: `Message`, an immutable published message: the exchange and routing key it was published with,
its encoded content-header payload (kept exactly as the publisher sent it, so delivery never re-encodes
properties), its decoded properties (decoded once, on publish), and its body.

Invariant: `header_payload` is the content-header frame payload that matches `properties` and `body`
(class id, weight, body size, property flags and list); `route_tail` is the encoded
exchange + routing-key suffix of basic.deliver/basic.get-ok/basic.return. Both are built once.
"""

from __future__ import annotations

import struct
from typing import Any

from hutch.amqp.spec import BasicProperties

_HEADER_PREFIX = struct.Struct(">HHQ")


def encode_shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


class Message:
    __slots__ = ("exchange", "routing_key", "properties", "body", "header_payload", "route_tail",
                 "persistent", "size", "__weakref__")

    exchange: str
    routing_key: str
    properties: BasicProperties
    body: bytes
    header_payload: bytes
    route_tail: bytes
    persistent: bool
    size: int

    def __init__(self, exchange: str, routing_key: str, properties: BasicProperties, body: bytes,
                 properties_raw: bytes | None = None) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        if properties_raw is None:
            properties_raw = properties.encode()
        self.header_payload = _HEADER_PREFIX.pack(60, 0, len(body)) + properties_raw
        self.route_tail = encode_shortstr(exchange) + encode_shortstr(routing_key)
        self.persistent = properties.delivery_mode == 2
        self.size = len(body)

    def with_properties(self, properties: BasicProperties) -> Message:
        """A copy with other properties (re-encoded), e.g. with BCC removed or x-death added."""
        return Message(self.exchange, self.routing_key, properties, self.body)

    def with_route(self, exchange: str, routing_key: str) -> Message:
        msg = Message.__new__(Message)
        msg.exchange = exchange
        msg.routing_key = routing_key
        msg.properties = self.properties
        msg.body = self.body
        msg.header_payload = self.header_payload
        msg.route_tail = encode_shortstr(exchange) + encode_shortstr(routing_key)
        msg.persistent = self.persistent
        msg.size = self.size
        return msg

    @property
    def headers(self) -> dict[str, Any] | None:
        return self.properties.headers

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r}/{self.routing_key!r} {self.size}B>"
