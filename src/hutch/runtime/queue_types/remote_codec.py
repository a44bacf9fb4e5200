"""What the queue link carries in a form of its own: a message packed as a quorum queue stores it, and a
consumer's stream arguments as they cross the hop.

Owns: `pack_message` / `decode_message` (a message as msgpack of `message_to_wire`, the quorum queue
type's stored payload too) and `portable_arguments` / `arguments_of` (the consume arguments a stream's
home reads: where to start, the filter). Pure functions, no IO; the records themselves are
cluster/messages.py's.
"""

from __future__ import annotations

import datetime
from typing import Any

import msgpack

from hutch.amqp.table import Timestamp
from hutch.cluster import messages as cm
from hutch.core.message import Message

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def pack_message(msg: Message) -> bytes:
    """`msgpack(message_to_wire(msg))`: a message as a quorum queue stores it (bytes-like fields packed as
    they are, no copies)."""
    return _pack((msg.exchange, msg.routing_key, msg.properties_raw, msg.body, msg.route_tail,
                  msg.foreign_deaths))


def decode_message(v: list[Any]) -> Message:
    """The message `pack_message` packed, once unpacked (a quorum queue's stored payload)."""
    return cm.message_from_wire(v)


STREAM_CONSUME_ARGUMENTS = ("x-stream-offset", "x-stream-filter", "x-stream-match-unfiltered")


def portable_arguments(arguments: dict[str, Any]) -> list[Any]:
    """The consume arguments a stream's home reads (where to start, the filter), as the link carries
    them: [key, value, is a timestamp] (a field table's timestamp or a datetime: seconds)."""
    out: list[Any] = []
    for key in STREAM_CONSUME_ARGUMENTS:
        if key not in arguments:
            continue
        value = arguments[key]
        if isinstance(value, datetime.datetime):
            when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
            out.append([key, int(when.timestamp()), True])
        elif isinstance(value, Timestamp):
            out.append([key, int(value), True])
        elif isinstance(value, str | bytes | int | list):  # (bool is an int)
            out.append([key, value, False])
    return out


def arguments_of(portable: list[Any]) -> dict[str, Any]:
    """`portable_arguments` read back (anything else in the list is ignored)."""
    out: dict[str, Any] = {}
    for item in portable:
        if type(item) is list and len(item) == 3 and item[0] in STREAM_CONSUME_ARGUMENTS:
            key, value, stamp = item
            out[key] = Timestamp(value) if stamp is True and type(value) is int else value
    return out
