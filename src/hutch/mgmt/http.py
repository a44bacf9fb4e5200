"""The management HTTP API on aiohttp: route table, authentication, thin handlers, the service plug-in.

Owns: `start_management` (the node service: listener up, rate sampler started, a stop function
returned), the aiohttp application, HTTP basic authentication against the node's `AuthStore`,
JSON bodies in and out, and the table of routes. Every route is a thin handler: it picks path
parameters, query and body out of a `Call` and hands them to a service function
(users/topology/clients/system/policies), then shapes the reply with `listing`.

Rules:
- Every /api route needs HTTP basic auth. The scrypt check (~40 ms on a cache miss) runs in the
  default executor so the event loop never stalls; successful checks are cached by the store.
- The `loopback_users` rule applies as on AMQP: such a user may log in only from loopback.
- Replies are JSON with `cache-control: no-cache`. PUT answers 201 when it created the object and
  204 when it replaced one; DELETE answers 204. Errors are `{"error": ..., "reason": ...}`.
- Path segments are percent-decoded by aiohttp, so "/" as a vhost is written `%2F`.
- Adding an endpoint = one service function + one `@route` handler here.
- /metrics and /metrics/per-object (Prometheus text, prometheus.py) need no authentication, as
  with RabbitMQ's rabbitmq_prometheus plugin.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from hutch.core.auth import is_loopback_address

from . import clients, definitions, listing, policies, prometheus, system, topology, ui, users
from .access import Principal
from .errors import ApiError, bad_request, not_authenticated, not_authorised

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hutch.runtime.node import Node

log = logging.getLogger("hutch.mgmt")

MAX_BODY_BYTES = 20_000_000  # RabbitMQ's default max HTTP body size (management.http.max_body_size)
SHUTDOWN_TIMEOUT_S = 2.0
NODE_KEY = web.AppKey("node", object)
SAMPLER_KEY = web.AppKey("sampler", system.RateSampler)
SCRAPES_KEY = web.AppKey("scrapes", prometheus.ScrapeStats)


# -- calls and replies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """What a handler gets: the node, the authenticated caller and the request's parts."""

    node: Node
    principal: Principal
    params: Mapping[str, str]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any
    sampler: system.RateSampler | None
    now_ms: float

    def flag(self, name: str) -> bool:
        return self.query.get(name) == "true"


class Status:
    """A reply with no body (201 Created, 204 No Content)."""

    def __init__(self, code: int) -> None:
        self.code = code


NO_CONTENT = Status(204)


def created(was_created: bool) -> Status:
    return Status(201) if was_created else NO_CONTENT


Handler = Callable[[Call], Any]
BINDING_SORT = ("vhost", "source", "destination_type", "destination", "routing_key")
CONSUMER_SORT = ("queue.vhost", "queue.name", "consumer_tag")
POLICY_SORT = ("priority", "vhost", "name")  # RabbitMQ sorts policy lists by priority
ROUTES: list[tuple[str, str, Handler]] = []


def route(method: str, path: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        ROUTES.append((method, path, fn))
        return fn

    return register


# -- routes: system ---------------------------------------------------------------------------------


@route("GET", "/api/overview")
def _overview(c: Call) -> Any:
    return listing.one_reply(system.overview(c.node, c.principal, c.sampler), c.query)


@route("GET", "/api/whoami")
def _whoami(c: Call) -> Any:
    return users.whoami(c.principal)


@route("GET", "/api/nodes")
def _nodes(c: Call) -> Any:
    return listing.list_reply(system.list_nodes(c.node, c.principal, c.now_ms), c.query, ("name",))


@route("GET", "/api/nodes/{node}")
def _node(c: Call) -> Any:
    return listing.one_reply(system.get_node(c.node, c.principal, c.params["node"], c.now_ms), c.query)


@route("GET", "/api/aliveness-test/{vhost}")
def _aliveness(c: Call) -> Any:
    return system.aliveness_test(c.node, c.principal, c.params["vhost"])


# -- routes: users, vhosts, permissions -------------------------------------------------------------


@route("GET", "/api/users")
def _users(c: Call) -> Any:
    return listing.list_reply(users.list_users(c.node, c.principal), c.query, ("name",))


@route("GET", "/api/users/{user}")
def _user(c: Call) -> Any:
    return listing.one_reply(users.get_user(c.node, c.principal, c.params["user"]), c.query)


@route("PUT", "/api/users/{user}")
def _put_user(c: Call) -> Any:
    return created(users.put_user(c.node, c.principal, c.params["user"], c.body))


@route("DELETE", "/api/users/{user}")
def _delete_user(c: Call) -> Any:
    users.delete_user(c.node, c.principal, c.params["user"])
    return NO_CONTENT


@route("GET", "/api/users/{user}/permissions")
def _user_permissions(c: Call) -> Any:
    return listing.list_reply(users.user_permissions(c.node, c.principal, c.params["user"]), c.query,
                              ("vhost", "user"))


@route("GET", "/api/vhosts")
def _vhosts(c: Call) -> Any:
    return listing.list_reply(users.list_vhosts(c.node, c.principal), c.query, ("name",))


@route("GET", "/api/vhosts/{vhost}")
def _vhost(c: Call) -> Any:
    return listing.one_reply(users.get_vhost(c.node, c.principal, c.params["vhost"]), c.query)


@route("PUT", "/api/vhosts/{vhost}")
def _put_vhost(c: Call) -> Any:
    return created(users.put_vhost(c.node, c.principal, c.params["vhost"], c.body))


@route("DELETE", "/api/vhosts/{vhost}")
def _delete_vhost(c: Call) -> Any:
    users.delete_vhost(c.node, c.principal, c.params["vhost"])
    return NO_CONTENT


@route("GET", "/api/vhosts/{vhost}/permissions")
def _vhost_permissions(c: Call) -> Any:
    return listing.list_reply(users.vhost_permissions(c.node, c.principal, c.params["vhost"]), c.query,
                              ("vhost", "user"))


@route("GET", "/api/permissions")
def _permissions(c: Call) -> Any:
    return listing.list_reply(users.list_permissions(c.node, c.principal), c.query, ("vhost", "user"))


@route("GET", "/api/permissions/{vhost}/{user}")
def _permission(c: Call) -> Any:
    return users.get_permission(c.node, c.principal, c.params["vhost"], c.params["user"])


@route("PUT", "/api/permissions/{vhost}/{user}")
def _put_permission(c: Call) -> Any:
    return created(users.put_permission(c.node, c.principal, c.params["vhost"], c.params["user"], c.body))


@route("DELETE", "/api/permissions/{vhost}/{user}")
def _delete_permission(c: Call) -> Any:
    users.delete_permission(c.node, c.principal, c.params["vhost"], c.params["user"])
    return NO_CONTENT


# -- routes: queues, exchanges, bindings ------------------------------------------------------------


@route("GET", "/api/queues")
def _queues(c: Call) -> Any:
    return listing.list_reply(topology.list_queues(c.node, c.principal), c.query)


@route("GET", "/api/queues/{vhost}")
def _vhost_queues(c: Call) -> Any:
    return listing.list_reply(topology.list_queues(c.node, c.principal, c.params["vhost"]), c.query)


@route("GET", "/api/queues/{vhost}/{name}")
def _queue(c: Call) -> Any:
    q = topology.get_queue(c.node, c.principal, c.params["vhost"], c.params["name"])
    return listing.one_reply(q, c.query)


@route("PUT", "/api/queues/{vhost}/{name}")
def _put_queue(c: Call) -> Any:
    return created(topology.put_queue(c.node, c.principal, c.params["vhost"], c.params["name"], c.body))


@route("DELETE", "/api/queues/{vhost}/{name}")
def _delete_queue(c: Call) -> Any:
    topology.delete_queue(c.node, c.principal, c.params["vhost"], c.params["name"],
                          if_unused=c.flag("if-unused"), if_empty=c.flag("if-empty"))
    return NO_CONTENT


@route("DELETE", "/api/queues/{vhost}/{name}/contents")
def _purge_queue(c: Call) -> Any:
    topology.purge_queue(c.node, c.principal, c.params["vhost"], c.params["name"])
    return NO_CONTENT


@route("GET", "/api/queues/{vhost}/{name}/bindings")
def _queue_bindings(c: Call) -> Any:
    found = topology.queue_bindings(c.node, c.principal, c.params["vhost"], c.params["name"])
    return listing.list_reply(found, c.query, BINDING_SORT)


@route("GET", "/api/exchanges")
def _exchanges(c: Call) -> Any:
    return listing.list_reply(topology.list_exchanges(c.node, c.principal), c.query)


@route("GET", "/api/exchanges/{vhost}")
def _vhost_exchanges(c: Call) -> Any:
    return listing.list_reply(topology.list_exchanges(c.node, c.principal, c.params["vhost"]), c.query)


@route("GET", "/api/exchanges/{vhost}/{name}")
def _exchange(c: Call) -> Any:
    x = topology.get_exchange(c.node, c.principal, c.params["vhost"], c.params["name"])
    return listing.one_reply(x, c.query)


@route("PUT", "/api/exchanges/{vhost}/{name}")
def _put_exchange(c: Call) -> Any:
    return created(topology.put_exchange(c.node, c.principal, c.params["vhost"], c.params["name"], c.body))


@route("DELETE", "/api/exchanges/{vhost}/{name}")
def _delete_exchange(c: Call) -> Any:
    topology.delete_exchange(c.node, c.principal, c.params["vhost"], c.params["name"],
                             if_unused=c.flag("if-unused"))
    return NO_CONTENT


@route("GET", "/api/bindings")
def _bindings(c: Call) -> Any:
    return listing.list_reply(topology.list_bindings(c.node, c.principal), c.query, BINDING_SORT)


@route("GET", "/api/bindings/{vhost}")
def _vhost_bindings(c: Call) -> Any:
    return listing.list_reply(topology.list_bindings(c.node, c.principal, c.params["vhost"]), c.query,
                              BINDING_SORT)


# -- routes: policies and operator policies ---------------------------------------------------------


def _policy_routes(prefix: str, operator: bool) -> None:
    """GET list (all, one vhost) and GET/PUT/DELETE one, under /api/policies or /api/operator-policies."""

    def list_all(c: Call) -> Any:
        return listing.list_reply(policies.list_policies(c.node, c.principal, None, operator), c.query,
                                  POLICY_SORT)

    def list_vhost(c: Call) -> Any:
        found = policies.list_policies(c.node, c.principal, c.params["vhost"], operator)
        return listing.list_reply(found, c.query, POLICY_SORT)

    def get_one(c: Call) -> Any:
        found = policies.get_policy(c.node, c.principal, c.params["vhost"], c.params["name"], operator)
        return listing.one_reply(found, c.query)

    def put_one(c: Call) -> Any:
        return created(policies.put_policy(c.node, c.principal, c.params["vhost"], c.params["name"], c.body,
                                           operator))

    def delete_one(c: Call) -> Any:
        policies.delete_policy(c.node, c.principal, c.params["vhost"], c.params["name"], operator)
        return NO_CONTENT

    kind = "operator_policy" if operator else "policy"
    for method, path, fn in (("GET", prefix, list_all), ("GET", prefix + "/{vhost}", list_vhost),
                             ("GET", prefix + "/{vhost}/{name}", get_one),
                             ("PUT", prefix + "/{vhost}/{name}", put_one),
                             ("DELETE", prefix + "/{vhost}/{name}", delete_one)):
        fn.__name__ = f"_{method.lower()}_{kind}_{fn.__name__}"
        route(method, path)(fn)


_policy_routes("/api/policies", operator=False)
_policy_routes("/api/operator-policies", operator=True)


# -- routes: connections, channels, consumers -------------------------------------------------------


@route("GET", "/api/connections")
def _connections(c: Call) -> Any:
    return listing.list_reply(clients.list_connections(c.node, c.principal), c.query)


@route("GET", "/api/connections/{name}")
def _connection(c: Call) -> Any:
    return listing.one_reply(clients.get_connection(c.node, c.principal, c.params["name"]), c.query)


@route("DELETE", "/api/connections/{name}")
def _close_connection(c: Call) -> Any:
    clients.close_connection(c.node, c.principal, c.params["name"], c.headers.get("X-Reason"))
    return NO_CONTENT


@route("GET", "/api/channels")
def _channels(c: Call) -> Any:
    return listing.list_reply(clients.list_channels(c.node, c.principal), c.query)


@route("GET", "/api/consumers")
def _consumers(c: Call) -> Any:
    return listing.list_reply(clients.list_consumers(c.node, c.principal), c.query, CONSUMER_SORT)


@route("GET", "/api/consumers/{vhost}")
def _vhost_consumers(c: Call) -> Any:
    return listing.list_reply(clients.list_consumers(c.node, c.principal, c.params["vhost"]), c.query,
                              CONSUMER_SORT)


# -- routes: definitions ----------------------------------------------------------------------------
# Raw aiohttp handlers rather than `@route` ones: an upload may be multipart/form-data (the management
# UI's `file` field), the UI's download link passes its credentials as ?auth=, ?download= names the
# file, and plaintext passwords of an upload are hashed in the executor, off the event loop.


async def _definitions(request: web.Request) -> web.StreamResponse:
    """GET (and HEAD) and POST /api/definitions and /api/definitions/{vhost} (definitions.py)."""
    node: Node = request.app[NODE_KEY]  # type: ignore[assignment]
    vhost = request.match_info.get("vhost")
    auth = request.query.get("auth")
    if auth and "Authorization" not in request.headers:  # RabbitMQ's is_authorized_qs
        request = request.clone(headers={**request.headers, "Authorization": "Basic " + auth})
    try:
        principal = await _authenticate(request, node)
        if request.method == "POST":
            definitions.check_import(node, principal, vhost)
            doc = definitions.parse_document(await _definitions_payload(request))
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(None, definitions.prepare, doc, vhost)
            definitions.import_definitions(node, principal, prepared, vhost)
            return web.Response(status=204, headers={"Cache-Control": "no-cache"})
        reply = definitions.export(node, principal, vhost)
    except definitions.NotJson:
        return _error_response(bad_request("failed_to_parse_json"))
    except ApiError as exc:
        return _error_response(exc)
    filename = "".join(ch for ch in request.query.get("download", "") if ch.isprintable())
    return _json_response(reply, headers={"Content-Disposition": f"attachment; filename={filename}"}
                          if filename else None)


async def _definitions_payload(request: web.Request) -> bytes | str:
    """The uploaded document: the `file` field of a multipart/form-data body, else the whole body."""
    if request.content_type != "multipart/form-data":
        return await request.read()
    field = (await request.post()).get("file")
    if isinstance(field, web.FileField):
        return field.file.read()
    if isinstance(field, str):
        return field
    raise definitions.NotJson("no 'file' field in the form")


# -- plumbing ---------------------------------------------------------------------------------------


def _json_response(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    text = json.dumps(value, default=str, ensure_ascii=False)
    response = web.Response(text=text, status=status, content_type="application/json")
    response.headers["Cache-Control"] = "no-cache"
    if headers:
        response.headers.update(headers)
    return response


def _error_response(exc: ApiError) -> web.Response:
    return _json_response(exc.body(), exc.status, exc.headers)


def _decode_body(raw: bytes) -> Any:
    """RabbitMQ's rules: empty or null is {}; anything but a JSON object is a 400."""
    text = raw.strip()
    if text in (b"", b"null", b"undefined"):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("not_json") from None
    if isinstance(value, str):
        raise bad_request("invalid payload: the request body JSON-decoded to a string. "
                          "Is the input doubly-JSON-encoded?")
    if not isinstance(value, dict):
        raise bad_request("not_json")
    return value


def _credentials(header: str) -> tuple[str, str]:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        raise not_authenticated()
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise not_authenticated() from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise not_authenticated()
    return user, password


async def _authenticate(request: web.Request, node: Node) -> Principal:
    user_name, password = _credentials(request.headers.get("Authorization", ""))
    loop = asyncio.get_running_loop()
    user = await loop.run_in_executor(None, node.auth.authenticate, user_name, password)
    if user is None:
        log.warning("HTTP access denied: user '%s' - invalid credentials", user_name)
        raise not_authenticated()
    if user.name in node.config.loopback_users and not is_loopback_address(request.remote or ""):
        raise not_authorised("User can only log in via localhost")
    principal = Principal(user.name, tuple(user.tags))
    if not principal.is_management:
        raise not_authorised("Not management user")
    return principal


def _adapt(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        node: Node = request.app[NODE_KEY]  # type: ignore[assignment]
        try:
            principal = await _authenticate(request, node)
            body = _decode_body(await request.read()) if request.method in ("PUT", "POST") else None
            call = Call(node, principal, dict(request.match_info), request.query, request.headers, body,
                        request.app.get(SAMPLER_KEY), node.wall_ms())
            result = fn(call)
        except ApiError as exc:
            return _error_response(exc)
        if isinstance(result, Status):
            return web.Response(status=result.code, headers={"Cache-Control": "no-cache"})
        return _json_response(result)

    handle.__name__ = fn.__name__
    return handle


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Unknown paths and methods, oversized bodies and bugs, as JSON errors."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return _json_response({"error": "method_not_allowed", "reason": "Method Not Allowed"}, 405)
    except web.HTTPNotFound:
        return _json_response({"error": "Object Not Found", "reason": "Not Found"}, 404)
    except web.HTTPRequestEntityTooLarge:
        return _json_response({"error": "bad_request", "reason": "Exceeded HTTP request body size limit"},
                              413)
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug must answer 500, not drop the connection
        log.exception("management API: internal error on %s %s", request.method, request.path)
        return _json_response({"error": "internal_server_error", "reason": str(exc)}, 500)


async def _metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus: /metrics (aggregated) and /metrics/per-object. No authentication, as RabbitMQ's
    plugin by default; built on the loop (it reads the node), compressed off it by aiohttp."""
    registry = request.match_info.get("registry", "default")
    if registry not in prometheus.REGISTRIES:
        return web.Response(status=404, text="Unknown Registry")
    node: Node = request.app[NODE_KEY]  # type: ignore[assignment]
    scrapes = request.app[SCRAPES_KEY]
    loop = asyncio.get_running_loop()
    started = loop.time()
    body = prometheus.render(node, registry, node.wall_ms(), scrapes).encode()
    scrapes.observe(registry, loop.time() - started, len(body))
    response = web.Response(body=body, headers={"Content-Type": prometheus.CONTENT_TYPE})
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        response.enable_compression(web.ContentCoding.gzip)
    return response


def build_app(node: Node, sampler: system.RateSampler | None = None) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[NODE_KEY] = node
    if sampler is not None:
        app[SAMPLER_KEY] = sampler
    app[SCRAPES_KEY] = prometheus.ScrapeStats()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/{registry}", _metrics)
    for method, path, fn in ROUTES:
        if method == "GET":
            app.router.add_get(path, _adapt(fn))  # and HEAD
        else:
            app.router.add_route(method, path, _adapt(fn))
    for path in ("/api/definitions", "/api/definitions/{vhost}"):
        app.router.add_get(path, _definitions)  # and HEAD
        app.router.add_post(path, _definitions)
    ui.add_routes(app)  # the web UI: / and /ui/{file} (ui.py)
    return app


# -- the service plug-in ----------------------------------------------------------------------------


async def start_management(node: Node) -> Callable[[], Awaitable[None]]:
    """Start the management listener on `management_host:management_port`; set
    `node.management_port` to the bound port. Raises OSError (e.g. port in use), which
    `hutch.runtime.node.serve` reports in one line."""
    cfg = node.config
    loop = asyncio.get_running_loop()
    sampler = system.RateSampler()
    runner = web.AppRunner(build_app(node, sampler), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, cfg.management_host or None, cfg.management_port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        exc.hutch_listener = f"management HTTP on port {cfg.management_port}"  # type: ignore[attr-defined]
        raise
    addresses = runner.addresses
    node.management_port = int(addresses[0][1]) if addresses else cfg.management_port
    log.info("management HTTP API started on %s:%d", cfg.management_host or "0.0.0.0", node.management_port)

    interval_s = max(cfg.collect_statistics_interval_ms, 100) / 1000
    timer: list[asyncio.TimerHandle] = []

    def tick() -> None:
        sampler.sample(loop.time(), system.message_totals(node))
        timer[:] = [loop.call_later(interval_s, tick)]

    tick()

    async def stop() -> None:
        for handle in timer:
            handle.cancel()
        await runner.cleanup()
        log.info("management HTTP API stopped")

    return stop


__all__ = ["ROUTES", "Call", "Status", "build_app", "route", "start_management"]
