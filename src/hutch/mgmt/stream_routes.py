"""The stream protocol's routes of the management API: create, show and delete a super stream over HTTP
(hutch extensions), as `hutch-streams` does over the stream protocol; and the stream connections,
publishers and consumers (RabbitMQ's rabbitmq_stream_management routes: all, per vhost, per stream, per
connection; monitors see all, others their own; DELETE closes a connection; stream_clients.py). Thin handlers over runtime/stream_session (super_streams.py; the node's `StreamHub`, `node.streams`,
set while the stream listener runs), registered in the route table like routes.py's (http.py imports
this module).

Body of a create: `{"partitions": N}` (partitions NAME-0 … NAME-(N-1), binding keys "0" … "N-1") or
`{"binding_keys": ["eu", "us"]}` (partitions NAME-eu, NAME-us), and optionally `"arguments"` with the
stream-protocol create arguments (`max-age`, `max-length-bytes`, `stream-max-segment-size-bytes`, …).
Permissions: configure on the exchange and on every partition, as the stream protocol's create asks.
"""

from __future__ import annotations

from typing import Any

from hutch.runtime.stream_session import super_streams
from hutch.runtime.stream_session.catalog import QueueCatalog
from hutch.streamproto.codes import Code

from . import stream_clients
from .access import require_amqp, vhost_for_read, vhost_for_write
from .calls import NO_CONTENT, Call, Status, route
from .errors import ApiError, bad_request, not_found

TAG = "streams"
MAX_PARTITIONS = super_streams.MAX_PARTITIONS


def _layout(name: str, body: Any) -> tuple[list[str], list[str], dict[str, str]]:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    count, keys = body.get("partitions"), body.get("binding_keys")
    if (count is None) == (keys is None):
        raise bad_request("give either \"partitions\" or \"binding_keys\"")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_PARTITIONS:
            raise bad_request(f"\"partitions\" must be a number from 1 to {MAX_PARTITIONS}")
        keys = [str(i) for i in range(count)]
    elif not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise bad_request("\"binding_keys\" must be a list of non-empty strings")
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        raise bad_request("\"arguments\" must be a JSON object")
    return [f"{name}-{k}" for k in keys], list(keys), {str(k): str(v) for k, v in arguments.items()}


@route("PUT", "/api/stream/super-streams/{vhost}/{name}", "Create a super stream: {\"partitions\": N} or "
       "{\"binding_keys\": [...]}, optional \"arguments\" (hutch-streams add_super_stream; hutch)", tag=TAG,
       body="Any", codes=(201, 400, 404))
async def _put_super_stream(c: Call) -> Any:
    vhost, name = c.params["vhost"], c.params["name"]
    v = vhost_for_write(c.node, c.principal, vhost)
    partitions, keys, arguments = _layout(name, c.body)
    require_amqp(c.node, c.principal, vhost, "configure", "exchange", name)
    for p in partitions:
        require_amqp(c.node, c.principal, vhost, "configure", "queue", p)
    try:
        await super_streams.create(c.node, QueueCatalog(c.node), v, name, partitions, keys, arguments)
    except super_streams.SuperStreamError as exc:
        raise bad_request(exc.text) from None
    return Status(201)


@route("GET", "/api/stream/super-streams/{vhost}/{name}", "A super stream's partitions in order (hutch)",
       tag=TAG, reply="Any", codes=(404,))
def _get_super_stream(c: Call) -> Any:
    vhost, name = c.params["vhost"], c.params["name"]
    v = vhost_for_read(c.node, c.principal, vhost)
    try:
        partitions = super_streams.partitions(v, name)
    except super_streams.SuperStreamError:
        raise not_found() from None
    return {"name": name, "vhost": vhost, "partitions": partitions}


@route("DELETE", "/api/stream/super-streams/{vhost}/{name}", "Delete a super stream and its partitions "
       "(hutch-streams delete_super_stream; hutch)", tag=TAG, codes=(204, 404))
async def _delete_super_stream(c: Call) -> Any:
    vhost, name = c.params["vhost"], c.params["name"]
    v = vhost_for_write(c.node, c.principal, vhost)
    if name not in v.exchanges:
        raise not_found()
    require_amqp(c.node, c.principal, vhost, "configure", "exchange", name)
    try:
        await super_streams.delete(c.node, QueueCatalog(c.node), v, name)
    except super_streams.SuperStreamError as exc:
        raise ApiError(404 if exc.code == Code.STREAM_DOES_NOT_EXIST else 400, "bad_request", exc.text) from None
    return NO_CONTENT


def _conns(c: Call, vhost: str | None = None) -> list[Any]:
    """The stream connections the caller may see (of one vhost, which must be visible: 404 if not)."""
    if vhost is not None:
        vhost_for_read(c.node, c.principal, vhost)
    return stream_clients.visible(c.node, c.principal, vhost)


@route("GET", "/api/stream/connections", "Stream-protocol connections (rabbitmq_stream_management)",
       tag=TAG, reply="Any[]")
def _list_stream_connections(c: Call) -> Any:
    return [conn.info() for conn in _conns(c)]


@route("GET", "/api/stream/connections/{vhost}", "A virtual host's stream-protocol connections", tag=TAG,
       reply="Any[]", codes=(404,))
def _list_vhost_stream_connections(c: Call) -> Any:
    return [conn.info() for conn in _conns(c, c.params["vhost"])]


@route("GET", "/api/stream/connections/{vhost}/{name}", "One stream-protocol connection", tag=TAG,
       reply="Any", codes=(404,))
def _stream_connection(c: Call) -> Any:
    return stream_clients.visible_one(c.node, c.principal, c.params["name"], c.params["vhost"]).info()


@route("DELETE", "/api/stream/connections/{vhost}/{name}", "Close a stream-protocol connection (reason in "
       "the X-Reason header)", tag=TAG, codes=(204, 404))
def _close_stream_connection(c: Call) -> Any:
    conn = stream_clients.find(c.node, c.params["name"], c.params["vhost"])
    if conn is None:
        raise not_found()
    stream_clients.close(c.node, c.principal, conn, c.headers.get("X-Reason"))
    return NO_CONTENT


@route("GET", "/api/stream/connections/{vhost}/{name}/publishers", "A stream connection's publishers",
       tag=TAG, reply="Any[]", codes=(404,))
def _stream_connection_publishers(c: Call) -> Any:
    conn = stream_clients.visible_one(c.node, c.principal, c.params["name"], c.params["vhost"])
    return stream_clients.publishers_list([conn])


@route("GET", "/api/stream/connections/{vhost}/{name}/consumers", "A stream connection's consumers",
       tag=TAG, reply="Any[]", codes=(404,))
def _stream_connection_consumers(c: Call) -> Any:
    conn = stream_clients.visible_one(c.node, c.principal, c.params["name"], c.params["vhost"])
    return stream_clients.consumers_list([conn])


@route("GET", "/api/stream/publishers", "Stream-protocol publishers (rabbitmq_stream_management)", tag=TAG,
       reply="Any[]")
def _list_stream_publishers(c: Call) -> Any:
    return stream_clients.publishers_list(_conns(c))


@route("GET", "/api/stream/publishers/{vhost}", "A virtual host's stream-protocol publishers", tag=TAG,
       reply="Any[]", codes=(404,))
def _list_vhost_stream_publishers(c: Call) -> Any:
    return stream_clients.publishers_list(_conns(c, c.params["vhost"]))


@route("GET", "/api/stream/publishers/{vhost}/{stream}", "A stream's publishers", tag=TAG, reply="Any[]",
       codes=(404,))
def _list_one_stream_publishers(c: Call) -> Any:
    return stream_clients.publishers_list(_conns(c, c.params["vhost"]), c.params["stream"])


@route("GET", "/api/stream/consumers", "Stream-protocol consumers with their offsets (rabbitmq_stream_management)",
       tag=TAG, reply="Any[]")
def _list_stream_consumers(c: Call) -> Any:
    return stream_clients.consumers_list(_conns(c))


@route("GET", "/api/stream/consumers/{vhost}", "A virtual host's stream-protocol consumers", tag=TAG,
       reply="Any[]", codes=(404,))
def _list_vhost_stream_consumers(c: Call) -> Any:
    return stream_clients.consumers_list(_conns(c, c.params["vhost"]))


@route("GET", "/api/stream/consumers/{vhost}/{stream}", "A stream's consumers", tag=TAG, reply="Any[]",
       codes=(404,))
def _list_one_stream_consumers(c: Call) -> Any:
    return stream_clients.consumers_list(_conns(c, c.params["vhost"]), c.params["stream"])
