"""The routes of super streams (hutch extensions of the management API): create, show and delete a super
stream over HTTP, as `hutch-streams` does over the stream protocol; thin handlers over
runtime/stream_session/super_streams.py, registered in the route table like routes.py's (http.py imports
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
