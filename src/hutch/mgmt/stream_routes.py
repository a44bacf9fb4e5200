"""The stream protocol's routes of the management API: create, show and delete a super stream over HTTP
(hutch extensions), as `hutch-streams` does over the stream protocol; the stream connections, publishers
and consumers (RabbitMQ's rabbitmq_stream_management routes: the lists, per vhost, one connection with its
publishers and consumers, and closing it with DELETE; monitors see all, others their own; administrators
close any, others their own); and the streams with their stream-protocol publishers and consumers (a
hutch extension the web UI's streams page reads); the single-active-consumer groups of a vhost and one
group's members, and a stream's tracking (its publishers' last publishing ids and its consumers' stored
offsets), which `hutch-streams list_stream_consumer_groups`, `list_stream_group_consumers` and
`list_stream_tracking` read (hutch extensions: RabbitMQ's CLI asks the node over Erlang distribution). Thin handlers over runtime/stream_session
(super_streams.py; the stream connections and groups as the node's management agent answers them,
every worker's: every read of a stream connection goes through `_stream_connections`), registered in the route table like
routes.py's (http.py imports this module). Lists take the listing parameters (sort, page, columns).

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

from . import formats, listing, stream_clients
from .access import (
    may_close_user_object,
    may_see_user_object,
    require_amqp,
    vhost_for_read,
    vhost_for_write,
    visible_vhosts,
)
from .calls import NO_CONTENT, Call, Status, route
from .errors import ApiError, bad_request, not_authorised, not_found

TAG = "streams"
MAX_PARTITIONS = super_streams.MAX_PARTITIONS
CLOSE_REASON = "Closed via management plugin"  # RabbitMQ's, without an X-Reason header
PUBLISHER_SORT = ("connection_details.name", "publisher_id")
CONSUMER_SORT = ("connection_details.name", "subscription_id")


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


# -- streams (hutch), stream connections, publishers and consumers (rabbitmq_stream_management) -----------


async def _stream_connections(c: Call, vhost: str | None = None) -> list[dict[str, Any]]:
    """The stream-protocol connections the caller may see (all for monitors, else its own), of `vhost`
    if given (404 if it does not exist, 401 if the caller may not read it): every worker's, as the
    node's agent answers them (stream_clients.py)."""
    if vhost is not None:
        vhost_for_read(c.node, c.principal, vhost)
    p = c.principal
    return [conn for conn in await stream_clients.opened(c.agent)
            if (p.is_monitor or conn["user"] == p.name) and (vhost is None or conn["vhost"] == vhost)]


async def _stream_connection(c: Call) -> dict[str, Any]:
    """The connection `{vhost}/{name}`: 404 if there is none, 401 if the caller may not see it."""
    vhost, name = c.params["vhost"], c.params["name"]
    vhost_for_read(c.node, c.principal, vhost)
    found = stream_clients.find(await stream_clients.opened(c.agent), name, vhost)
    if found is None:
        raise not_found()
    if not may_see_user_object(c.principal, found["user"]):
        raise not_authorised("User not authorised to access object")
    return found


def _owner(conn: dict[str, Any]) -> dict[str, Any]:
    return {"name": conn["name"], "user": conn["user"], "vhost": conn["vhost"], "node": conn["node"]}


def _publishers(conns: list[dict[str, Any]], stream: str | None = None) -> list[dict[str, Any]]:
    return [{**row, "connection_details": _owner(conn), "queue": {"name": row["stream"], "vhost": conn["vhost"]}}
            for conn in conns for row in conn["publisher_rows"] if stream is None or row["stream"] == stream]


def _consumers(conns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "connection_details": _owner(conn), "queue": {"name": row["stream"], "vhost": conn["vhost"]}}
            for conn in conns for row in conn["consumer_rows"]]


@route("GET", "/api/stream/connections", "Stream-protocol connections (rabbitmq_stream_management)",
       tag=TAG, reply="Any[]", listing=True)
async def _list_stream_connections(c: Call) -> Any:
    return listing.list_reply([stream_clients.info(conn) for conn in await _stream_connections(c)], c.query)


@route("GET", "/api/stream/connections/{vhost}", "Stream-protocol connections of a virtual host", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_vhost_stream_connections(c: Call) -> Any:
    conns = await _stream_connections(c, c.params["vhost"])
    return listing.list_reply([stream_clients.info(conn) for conn in conns], c.query)


@route("GET", "/api/stream/connections/{vhost}/{name}", "One stream-protocol connection", tag=TAG, reply="Any",
       codes=(404,))
async def _get_stream_connection(c: Call) -> Any:
    return listing.one_reply(stream_clients.info(await _stream_connection(c)), c.query)


@route("DELETE", "/api/stream/connections/{vhost}/{name}", "Close a stream-protocol connection (reason in the "
       "X-Reason header; administrators, or the connection's own user)", tag=TAG, codes=(204, 404))
async def _close_stream_connection(c: Call) -> Any:
    conn = await _stream_connection(c)
    if not may_close_user_object(c.principal, conn["user"]):
        raise not_authorised("User not authorised to access object")
    # the socket, no Close: as RabbitMQ (in whichever worker the connection lives)
    await c.agent.close_stream_connection(conn["vhost"], conn["name"], c.headers.get("X-Reason") or CLOSE_REASON)
    return NO_CONTENT


@route("GET", "/api/stream/connections/{vhost}/{name}/publishers", "A stream-protocol connection's publishers",
       tag=TAG, reply="Any[]", listing=True, codes=(404,))
async def _stream_connection_publishers(c: Call) -> Any:
    return listing.list_reply(_publishers([await _stream_connection(c)]), c.query, PUBLISHER_SORT)


@route("GET", "/api/stream/connections/{vhost}/{name}/consumers", "A stream-protocol connection's consumers",
       tag=TAG, reply="Any[]", listing=True, codes=(404,))
async def _stream_connection_consumers(c: Call) -> Any:
    return listing.list_reply(_consumers([await _stream_connection(c)]), c.query, CONSUMER_SORT)


@route("GET", "/api/stream/publishers", "Stream-protocol publishers (rabbitmq_stream_management)", tag=TAG,
       reply="Any[]", listing=True)
async def _list_stream_publishers(c: Call) -> Any:
    return listing.list_reply(_publishers(await _stream_connections(c)), c.query, PUBLISHER_SORT)


@route("GET", "/api/stream/publishers/{vhost}", "Stream-protocol publishers of a virtual host", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_vhost_stream_publishers(c: Call) -> Any:
    return listing.list_reply(_publishers(await _stream_connections(c, c.params["vhost"])), c.query, PUBLISHER_SORT)


@route("GET", "/api/stream/publishers/{vhost}/{stream}", "Stream-protocol publishers of one stream", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_stream_publishers_of(c: Call) -> Any:
    conns = await _stream_connections(c, c.params["vhost"])
    return listing.list_reply(_publishers(conns, c.params["stream"]), c.query, PUBLISHER_SORT)


@route("GET", "/api/stream/consumers", "Stream-protocol consumers with their offsets (rabbitmq_stream_management)",
       tag=TAG, reply="Any[]", listing=True)
async def _list_stream_consumers(c: Call) -> Any:
    return listing.list_reply(_consumers(await _stream_connections(c)), c.query, CONSUMER_SORT)


@route("GET", "/api/stream/consumers/{vhost}", "Stream-protocol consumers of a virtual host", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_vhost_stream_consumers(c: Call) -> Any:
    return listing.list_reply(_consumers(await _stream_connections(c, c.params["vhost"])), c.query, CONSUMER_SORT)


def is_stream(q: Any) -> bool:  # Any: a queue of any type
    """A stream, or the stand-in of one whose copy is another worker's or node's (its type is its home's)."""
    return q.queue_type == "stream" or getattr(q, "stream_group", None) is not None


async def _stream_rows(c: Call, vhost: str | None) -> list[dict[str, Any]]:
    """Each stream the caller may see, as the queue API shows it (asked of the node's agent), with the
    number of stream-protocol publishers and consumers on it (from the connections the caller may see)."""
    names = [vhost] if vhost is not None else visible_vhosts(c.node, c.principal)
    if vhost is not None:
        vhost_for_read(c.node, c.principal, vhost)
    conns = await _stream_connections(c)
    publishers: dict[tuple[str, str], int] = {}
    consumers: dict[tuple[str, str], int] = {}
    for conn in conns:
        for row in conn["publisher_rows"]:
            key = (conn["vhost"], str(row["stream"]))
            publishers[key] = publishers.get(key, 0) + 1
        for row in conn["consumer_rows"]:
            key = (conn["vhost"], str(row["stream"]))
            consumers[key] = consumers.get(key, 0) + 1
    keys = [(name, q.name) for name in names if (v := c.node.vhosts.get(name)) is not None
            for q in list(v.queues.values()) if is_stream(q)]
    rows = []
    for row in await c.agent.queue_details(keys):
        row = formats.queue_rates(row, c.stats)
        key = (str(row["vhost"]), str(row["name"]))
        row["stream_publishers"] = publishers.get(key, 0)
        row["stream_consumers"] = consumers.get(key, 0)
        rows.append(row)
    return rows


@route("GET", "/api/stream/streams", "Streams with their offsets, segments and stream-protocol publishers and "
       "consumers (hutch)", tag=TAG, reply="Any[]", listing=True)
async def _list_streams(c: Call) -> Any:
    return listing.list_reply(await _stream_rows(c, None), c.query)


@route("GET", "/api/stream/streams/{vhost}", "Streams of a virtual host (hutch)", tag=TAG, reply="Any[]",
       listing=True, codes=(404,))
async def _list_vhost_streams(c: Call) -> Any:
    return listing.list_reply(await _stream_rows(c, c.params["vhost"]), c.query)


# -- single-active-consumer groups and tracking (hutch-streams' listing commands; hutch) -------------------


async def _sac_groups(c: Call, vhost: str) -> tuple[list[dict[str, Any]], set[str]]:
    """The single-active-consumer groups of `vhost` (every worker's: a group lives with its stream's writer)
    with their members, and the names of the connections whose groups the caller may see (every one for
    monitors), after checking that `vhost` exists and the caller may read it."""
    vhost_for_read(c.node, c.principal, vhost)
    visible = {conn["name"] for conn in await _stream_connections(c, vhost)}
    return await c.agent.stream_groups(vhost), visible


@route("GET", "/api/stream/consumer-groups/{vhost}", "Single-active-consumer groups of a virtual host: stream, "
       "reference, partition_index, consumers (hutch-streams list_stream_consumer_groups; hutch)", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_consumer_groups(c: Call) -> Any:
    groups, visible = await _sac_groups(c, c.params["vhost"])
    rows = [{k: v for k, v in group.items() if k != "members"} for group in groups
            if c.principal.is_monitor or any(m["connection_name"] in visible for m in group["members"])]
    return listing.list_reply(rows, c.query, ("stream", "reference"))


@route("GET", "/api/stream/consumer-groups/{vhost}/{stream}/{reference}", "The members of one single-active-"
       "consumer group: subscription_id, connection_name, state (hutch-streams list_stream_group_consumers; "
       "hutch)", tag=TAG, reply="Any[]", listing=True, codes=(404,))
async def _list_group_consumers(c: Call) -> Any:
    groups, visible = await _sac_groups(c, c.params["vhost"])
    found = [g for g in groups if g["stream"] == c.params["stream"] and g["reference"] == c.params["reference"]]
    if not found:
        raise not_found()
    rows = found[0]["members"]
    if not c.principal.is_monitor:
        rows = [row for row in rows if row["connection_name"] in visible]
    return listing.list_reply(rows, c.query, ())  # arrival order: who is next in line


@route("GET", "/api/stream/tracking/{vhost}/{stream}", "A stream's tracking: each publisher reference's last "
       "publishing id (type writer) and each consumer's stored offset (type offset), as rows of type, name, "
       "tracking_value; ?type=offset or writer keeps one kind (hutch-streams list_stream_tracking; needs read access to the stream; hutch)", tag=TAG,
       reply="Any[]", listing=True, codes=(404,))
async def _list_stream_tracking(c: Call) -> Any:
    vhost, stream = c.params["vhost"], c.params["stream"]
    vhost_for_read(c.node, c.principal, vhost)
    if stream not in c.node.vhosts[vhost].queues:  # (a stand-in in a worker without the copy: its home answers)
        raise not_found()
    require_amqp(c.node, c.principal, vhost, "read", "queue", stream)
    kind = c.query.get("type", "all")
    if kind not in ("all", "offset", "writer"):
        raise bad_request("\"type\" must be all, offset or writer")
    # (the copy's worker answers: in a node of workers a stream's one copy may be another worker's)
    found = await c.agent.stream_tracking(vhost, stream)
    if found is None:
        raise not_found()
    rows = [{"type": t, "name": name, "tracking_value": value} for t, name, value in found]
    rows = [row for row in rows if kind in ("all", row["type"])]
    return listing.list_reply(rows, c.query, ())  # writers, then offsets (as RabbitMQ lists them)

