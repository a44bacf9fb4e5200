"""Service layer: messages through the management API (publish to an exchange, get from a queue).

Owns: POST /api/exchanges/{vhost}/{name}/publish and POST /api/queues/{vhost}/{name}/get, with RabbitMQ's
bodies, checks and replies (rabbit_mgmt_wm_exchange_publish, rabbit_mgmt_wm_queue_get). They act as the
caller would over AMQP: write on the exchange to publish, read on the queue to get, the validated
user-id, the topic permission of a topic exchange. Returns JSON-able data, raises `ApiError`. No IO.

Rules:
- Publish: `routing_key`, `properties`, `payload` and `payload_encoding` ("string" or "base64") are all
  required, as in RabbitMQ (`[{key_missing,payload}]`). The message is published as mandatory, so the
  reply says whether any queue took it: `{"routed": true|false}`. A queue that refuses it (overflow
  reject-publish) is a 400, as RabbitMQ's nack is. The reply comes once the message is enqueued (for a
  persistent message on a durable queue, before the next group commit has synced it: RabbitMQ waits for
  the publisher confirm).
- Get: `count`, `ackmode` and `encoding` ("auto" or "base64") are required, `truncate` optional. The
  messages are taken first and settled after (so `count` 5 gets five different messages even when
  they are requeued): `ack_requeue_true` and `reject_requeue_true` put them back (redelivered),
  `reject_requeue_false` rejects them (dead-lettered when the queue has a dead-letter exchange),
  `ack_requeue_false` acknowledges them.
- These messages do not pass through a channel, so the node's and channels' message counters do not
  count them (the queue's own counters do).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from hutch.amqp.errors import AMQPError
from hutch.amqp.spec import BasicProperties
from hutch.core.auth import topic_permission_allows
from hutch.core.confirms import Receipt
from hutch.core.message import Message
from hutch.core.queue_type import PENDING, REJECTED

from . import formats
from .access import Principal, require_amqp, vhost_for_write
from .errors import ApiError, access_refused, bad_request, from_amqp
from .topology import exchange_name

if TYPE_CHECKING:
    from hutch.core.queue_type import QueueEntry
    from hutch.runtime.broker.node import Node

REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                     "message_id", "type", "user_id", "app_id", "cluster_id")
INT_PROPERTIES = {"delivery_mode": 255, "priority": 255, "timestamp": 2**64 - 1}


def _not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", what)


def _required(body: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("not_json")
    missing = [k for k in keys if body.get(k) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    return body


def to_basic_properties(props: Any) -> BasicProperties:
    """rabbit_mgmt_format:to_basic_properties: JSON properties to AMQP ones (unknown keys ignored)."""
    if props in ("", []):
        props = {}
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    values: dict[str, Any] = {}
    for key in STRING_PROPERTIES:
        value = props.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise bad_request(f"{{not_string,{key}}}")
            values[key] = value
    for key, top in INT_PROPERTIES.items():
        value = props.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise bad_request(f"{{not_int,{key}}}")
            values[key] = value
    headers = props.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            raise bad_request("headers must be a JSON object")
        values["headers"] = headers
    return BasicProperties(**values)


def _routing_keys(routing_key: str, props: BasicProperties) -> tuple[list[str], BasicProperties]:
    """Sender-selected distribution: CC and BCC headers add routing keys; BCC is removed."""
    headers = props.headers or {}
    keys = [routing_key]
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            raise bad_request(f"invalid {name} header: expected an array")
        keys.extend(k for k in value if isinstance(k, str))
    if "BCC" in headers:
        props = props.copy()
        props.headers = {k: v for k, v in headers.items() if k != "BCC"}
    return keys, props


def _check_topic(node: Node, p: Principal, vhost: str, exchange: str, keys: list[str]) -> None:
    entry = node.topic_permissions.get((vhost, p.name), {}).get(exchange)
    if entry is None:
        return
    if not all(topic_permission_allows(entry[0], p.name, vhost, key) for key in keys):
        raise access_refused()


PUBLISH_CONFIRM_TIMEOUT_S = 30.0  # a queue without its majority (quorum) or its home worker: 503 then

class _Confirms:
    """The publish's receipts (core/confirms.py's ConfirmOwner): done once every queue that answered
    PENDING settled or refused it, as RabbitMQ's management publish waits for its channel's confirms."""

    def __init__(self) -> None:
        self.waiting = 0
        self.refused = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(self, seq: int, queue: Hashable) -> None:
        self._one()

    def reject(self, seq: int, queue: Hashable, error: str | None) -> None:
        self.refused = True
        self._one()

    def queue_deleted(self, queue: Hashable) -> None:
        self._one()  # a deleted queue settles what waited for it (core/confirms.py)

    def _one(self) -> None:
        self.waiting -= 1
        if self.waiting <= 0 and not self.done.done():
            self.done.set_result(None)


async def publish(node: Node, p: Principal, vhost: str, url_name: str, body: Any) -> dict[str, bool]:
    """POST /api/exchanges/{vhost}/{name}/publish: answered once the queues it was routed to have it
    (their confirms: a queue in another worker answers after its home stored it), at most
    `PUBLISH_CONFIRM_TIMEOUT_S` (then 503)."""
    v = vhost_for_write(node, p, vhost)
    name = exchange_name(url_name)
    x = v.exchanges.get(name)
    if x is None:
        raise _not_found("exchange_not_found")
    body = _required(body, ("routing_key", "properties", "payload", "payload_encoding"))
    routing_key, payload, encoding = body["routing_key"], body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    if encoding == "string":
        data = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("not_base64") from None
    else:
        raise bad_request(f"{{unsupported_encoding,{encoding}}}")
    props = to_basic_properties(body["properties"])
    require_amqp(node, p, vhost, "write", "exchange", name)
    if x.internal:
        raise access_refused()
    if props.user_id is not None and props.user_id != p.name:
        raise bad_request(f"user_id property set to '{props.user_id}' but authenticated user was '{p.name}'")
    if props.expiration is not None and (not props.expiration.isdigit() or int(props.expiration) >= 2**32):
        raise bad_request(f"invalid expiration '{props.expiration}'")
    keys, props = _routing_keys(routing_key, props)
    if x.type == "topic":
        _check_topic(node, p, vhost, name, keys)
    try:
        msg = Message(name, routing_key, props, data)
    except (ValueError, OverflowError) as exc:
        raise bad_request(f"invalid properties: {exc}") from None
    if name == "" and routing_key.startswith(REPLY_TO_PREFIX):
        return {"routed": node.deliver_direct_reply(routing_key[len(REPLY_TO_PREFIX):], msg)}
    queues = v.route(x, keys, props.headers, msg)
    confirms = _Confirms()
    for seq, q in enumerate(queues):
        answer = q.publish(msg, Receipt(confirms, seq))
        if answer is REJECTED:
            confirms.refused = True
        elif answer is PENDING:
            confirms.waiting += 1
    if confirms.waiting:
        try:
            await asyncio.wait_for(asyncio.shield(confirms.done), PUBLISH_CONFIRM_TIMEOUT_S)
        except TimeoutError:
            raise ApiError(503, "service_unavailable", "the message was not confirmed by its queues in "
                           f"{PUBLISH_CONFIRM_TIMEOUT_S:g} s") from None
    if confirms.refused:
        raise bad_request("rejected Unable to publish message. Check queue limits.")
    return {"routed": bool(queues)}


def _payload(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    data = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return data.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise bad_request(f"{key} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise bad_request(f"{key} must be an integer")


async def get_messages(node: Node, p: Principal, vhost: str, name: str, body: Any) -> list[dict[str, Any]]:
    """POST /api/queues/{vhost}/{name}/get. A queue in another worker (or node) is asked for each message
    in turn (`fetch_for_get`), as a basic.get there would be."""
    v = vhost_for_write(node, p, vhost)
    q = v.queues.get(name)
    if q is None:
        raise _not_found("queue_not_found")
    body = _required(body, ("count", "ackmode", "encoding"))
    count = _int(body["count"], "count")
    ackmode, encoding = body["ackmode"], body["encoding"]
    if ackmode not in ACKMODES:
        raise bad_request(f"Invalid ackmode value: {ackmode}. Valid values are: {', '.join(ACKMODES)}")
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = body.get("truncate")
    limit = _int(truncate, "truncate") if truncate is not None else None
    if limit is not None and limit < 0:
        raise bad_request("truncate must not be negative")
    require_amqp(node, p, vhost, "read", "queue", name)
    try:
        v.check_exclusive(q, None)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    taken: list[QueueEntry] = []
    out: list[dict[str, Any]] = []
    for _ in range(max(count, 0)):
        try:
            await q.fetch_for_get(False)
        except AMQPError as exc:
            if taken:
                break  # the home went away meanwhile: what was taken is settled below
            raise from_amqp(exc) from None
        entry = q.get(None, False)  # no channel: settled below
        if entry is None:
            break
        taken.append(entry)
        msg = entry.msg
        payload, payload_encoding = _payload(msg.body, encoding, limit)
        out.append({
            "payload_bytes": len(msg.body),
            "redelivered": entry.redelivered,
            "exchange": msg.exchange,
            "routing_key": msg.routing_key,
            "message_count": q.message_count,
            "properties": formats.jsonable(msg.properties.to_dict()),
            "payload": payload,
            "payload_encoding": payload_encoding,
        })
    if taken:
        if ackmode == "ack_requeue_false":
            q.ack(taken)
        elif ackmode == "reject_requeue_false":
            q.discard(taken)
        else:
            q.requeue(taken)
    return out


__all__ = ["ACKMODES", "get_messages", "publish", "to_basic_properties"]
