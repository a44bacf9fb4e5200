"""The management HTTP API on aiohttp: authentication, JSON in and out, the app, the service plug-in.

Owns: `start_management` (the node service: listener up, statistics collector started, a stop
function returned), the aiohttp application (`build_app`), HTTP basic authentication against the
node's `AuthStore`, JSON bodies in and out, and the adapter that turns a `Route` of routes.py into an
aiohttp handler. Raw handlers here serve what is not a JSON `Route`: the definitions upload/download,
Prometheus /metrics, and /api/openapi.json.

Rules:
- Every /api route needs HTTP basic auth, from the `Authorization` header only (never the query
  string). The scrypt check (~40 ms on a cache miss) runs in the default executor so the event loop
  never stalls; successful checks are cached by the store.
- Browser rules, body and JSON limits (intake.py): a state-changing request with a foreign `Origin` is
  403, a Content-Type other than `application/json` 415 (multipart/form-data too for the definitions upload),
  a body over `management.http.max_body_size` 413, JSON nested too deep 400. The listener's
  connection cap and timeouts are listener.py's.
- The `loopback_users` rule applies as on AMQP: such a user may log in only from loopback.
- Replies are JSON with `cache-control: no-cache`. PUT answers 201 when it created the object and
  204 when it replaced one; DELETE answers 204. Errors are `{"error": ..., "reason": ...}`.
- Path segments are percent-decoded by aiohttp, so "/" as a vhost is written `%2F`. Every route also
  answers with a trailing "/" (`/api/consumers/%2F/`), as RabbitMQ's does.
- Adding an endpoint = one service function + one `@route` handler in routes.py.
- /metrics (Prometheus text, prometheus.py, aggregated) needs no authentication, as with RabbitMQ's
  rabbitmq_prometheus plugin. /metrics/per-object names every vhost, queue and connection: it needs
  the login of a `monitoring` or `administrator` user, unless `prometheus.return_per_object_metrics =
  true`, which makes /metrics per-object too and opens both (the operator chose to publish them).
- The statistics collector (stats.py) samples what the node's management agent answers
  (`ManagementAgentPort.samples`) every `collect_statistics_interval` ms on the event loop;
  a request's range parameters (`lengths_age`, ...) are parsed into the `StatsView` of its `Call`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError

from hutch.core.auth import is_loopback_address
from hutch.core.logsafe import LogThrottle, suppressed_note
from hutch.core.patterns import UserPattern
from hutch.runtime import listen
from hutch.runtime.tls import TlsConfigError

from . import (
    cluster,
    definitions,
    intake,
    limits_routes,
    listener,
    listing,
    openapi,
    parameters,
    prometheus,
    quorum_routes,
    routes,
    stats,
    stream_routes,
    system,
    ui,
)
from .access import Principal, require_monitor
from .calls import NO_CONTENT, ROUTES, Call, Handler, Reply, Route, Status, route
from .errors import ApiError, bad_request, not_authenticated, not_authorised

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import ManagementAgentPort

log = logging.getLogger("hutch.mgmt")
_DENIALS_LOG = LogThrottle()  # HTTP login refusals, one per process (core/logsafe.py)

SHUTDOWN_TIMEOUT_S = 2.0
NAME_FILTER_DEADLINE_S = 10.0  # a listing's regex name filter, matched off the loop (listing.NamesToMatch)
NODE_KEY: web.AppKey[Node] = web.AppKey("node")
LIMITS_KEY = web.AppKey("body_limits", intake.BodyLimits)
LARGE_BODIES_KEY = web.AppKey("large_bodies", intake.LargeBodies)
COLLECTOR_KEY = web.AppKey("collector", stats.Collector)
SCRAPES_KEY = web.AppKey("scrapes", prometheus.ScrapeStats)


# -- routes: cluster (cluster.py; hutch extensions) -------------------------------------------------


@route("GET", "/api/cluster-status", "Cluster members and their state (hutch)", tag="cluster", reply="Any",
       codes=(400, 503))
async def _cluster_status(c: Call) -> Any:
    return await cluster.status(c.node, c.principal)


@route("POST", "/api/cluster-join", "Join the cluster of a seed node: {\"node\": \"NODE@HOST:PORT\"} (hutch)",
       tag="cluster", body="Any", reply="Any", codes=(400, 503))
async def _cluster_join(c: Call) -> Any:
    return await cluster.join(c.node, c.principal, c.body)


@route("DELETE", "/api/cluster-nodes/{node}", "Remove a node from the cluster (hutch)", tag="cluster",
       codes=(204, 400, 404, 503))
async def _cluster_forget(c: Call) -> Any:
    await cluster.forget(c.node, c.principal, c.params["node"])
    return NO_CONTENT


@route("POST", "/api/cluster-faults", "Cut or restore inter-node links: {\"block\": [NODE], \"unblock\": "
       "[NODE]}; only with cluster.fault_injection = true (hutch, tests)", tag="cluster", body="Any",
       reply="Any", codes=(400, 404))
async def _cluster_faults(c: Call) -> Any:
    return await cluster.faults(c.node, c.principal, c.body)


# cluster operations must work without a majority: no read barrier before them
NO_BARRIER: set[Any] = {_cluster_join, _cluster_forget, _cluster_faults}


# -- routes: definitions ----------------------------------------------------------------------------
# Raw aiohttp handlers rather than `@route` ones: an upload may be multipart/form-data (an HTML form's
# `file` field), ?download= names the file, and plaintext passwords of an upload are hashed in the
# executor, off the event loop. RabbitMQ's ?auth= (credentials in the query string, for its UI's
# download link) is not accepted: a query string ends up in logs and browser history, and it let any
# web page post definitions as guest (issue 15).


async def _definitions(request: web.Request) -> web.StreamResponse:
    """GET (and HEAD) and POST /api/definitions and /api/definitions/{vhost} (definitions.py)."""
    node = request.app[NODE_KEY]
    vhost = request.match_info.get("vhost")
    try:
        principal = await _authenticate(request, node)
        if request.method == "POST":
            definitions.check_import(node, principal, vhost)
            limits = request.app[LIMITS_KEY].for_user(principal.is_admin)
            intake.check_length(request, limits)
            async with request.app[LARGE_BODIES_KEY].turn(request):  # one large body at a time
                payload = await _definitions_payload(request, limits)
                with intake.collector_paused(len(payload) > intake.LARGE_BODY_BYTES):
                    if node.cluster is None:
                        await _import_definitions(node, principal, payload, vhost)
                    else:  # committed and applied by every member (every worker) before the 204
                        await _replicated(node, lambda: _import_definitions(node, principal, payload, vhost))
            return web.Response(status=204, headers={"Cache-Control": "no-cache"})
        reply = definitions.export(node, principal, vhost)
    except definitions.NotJson:
        return _error_response(bad_request("failed_to_parse_json"))
    except ApiError as exc:
        return _close_if_unread(request, _error_response(exc))
    filename = "".join(ch for ch in request.query.get("download", "") if ch.isprintable())
    return _json_response(reply, headers={"Content-Disposition": f"attachment; filename={filename}"}
                          if filename else None)


async def _import_definitions(node: Node, principal: Principal, payload: bytes, vhost: str | None) -> None:
    """Parse and prepare an upload off the loop when it is large, then import it (its objects are freed
    when this returns, before the caller resumes the cycle collector)."""
    loop = asyncio.get_running_loop()
    doc = await loop.run_in_executor(None, definitions.parse_document, payload) \
        if len(payload) >= intake.OFF_LOOP_BYTES else definitions.parse_document(payload)
    prepared = await loop.run_in_executor(None, definitions.prepare, doc, vhost)
    definitions.import_definitions(node, principal, prepared, vhost)


async def _definitions_payload(request: web.Request, limits: intake.BodyLimits) -> bytes:
    """The uploaded document: the `file` field of a multipart/form-data body, else the whole body;
    both under the caller's body limits (intake.py)."""
    if request.content_type != intake.MULTIPART_TYPE:
        return await intake.read_body(request, limits)
    try:
        field = await intake.read_form_file(request, limits)
    except (ValueError, AssertionError) as exc:  # e.g. multipart/form-data without a boundary
        raise definitions.NotJson(f"not a multipart/form-data body: {exc}") from None
    if field is None:
        raise definitions.NotJson("no 'file' field in the form")
    return field


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


async def _decode_body(raw: bytes) -> Any:
    """RabbitMQ's rules: empty or null is {}; anything but a JSON object is a 400 (so is JSON nested
    deeper than intake.MAX_JSON_DEPTH)."""
    text = raw.strip()
    if text in (b"", b"null", b"undefined"):
        return {}
    try:
        value = await intake.decode_json(text)
    except intake.JsonTooDeep as exc:
        raise bad_request(str(exc)) from None
    except (ValueError, UnicodeDecodeError):
        raise bad_request("not_json") from None
    if isinstance(value, str):
        raise bad_request("invalid payload: the request body JSON-decoded to a string. "
                          "Is the input doubly-JSON-encoded?")
    if not isinstance(value, dict):
        raise bad_request("not_json")
    return value


def _shown(user_name: str) -> str:
    """A user name as a log shows it: quoted and escaped (no newline can forge a line), at most 64
    characters."""
    text = user_name if len(user_name) <= 64 else user_name[:64] + "..."
    return repr(text)


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
    # off the loop and bounded; a cached login is answered without the hashing pool (runtime/broker/logins.py)
    outcome = await node.logins.check(user_name, password, request.remote or "")
    user = outcome.user
    if user is None:
        left_out = _DENIALS_LOG.admit(asyncio.get_running_loop().time())
        if left_out is not None:  # throttled: any client can repeat a bad login at will
            log.warning("HTTP access denied: user %s - %s%s", _shown(user_name), outcome.reason,
                        suppressed_note(left_out))
        raise not_authenticated()
    if user.name in node.config.loopback_users and not is_loopback_address(request.remote or ""):
        raise not_authorised("User can only log in via localhost")
    principal = Principal(user.name, tuple(user.tags))
    if not principal.is_management:
        raise not_authorised("Not management user")
    return principal


def _adapt(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        node = request.app[NODE_KEY]
        try:
            principal = await _authenticate(request, node)
            if request.method in ("PUT", "POST"):  # a non-administrator's oversized body: 413 before its turn
                intake.check_length(request, request.app[LIMITS_KEY].for_user(principal.is_admin))
            async with request.app[LARGE_BODIES_KEY].turn(request):  # one large body at a time
                return await _handle(request, node, principal, fn)
        except ApiError as exc:
            return _close_if_unread(request, _error_response(exc))

    handle.__name__ = fn.__name__
    return handle


async def _handle(request: web.Request, node: Node, principal: Principal, fn: Handler) -> web.StreamResponse:
    """Decode the body (under the caller's limits), run the handler, shape its reply."""
    try:
        if request.method not in ("PUT", "POST"):
            return await _call(request, node, principal, fn, None)
        raw = await intake.read_body(request, request.app[LIMITS_KEY].for_user(principal.is_admin))
        with intake.collector_paused(len(raw) > intake.LARGE_BODY_BYTES):
            return await _call(request, node, principal, fn, await _decode_body(raw))
    except ApiError as exc:
        return _close_if_unread(request, _error_response(exc))


async def _call(request: web.Request, node: Node, principal: Principal, fn: Handler, body: Any
                ) -> web.StreamResponse:
    try:
        now_ms = node.wall_ms()
        collector = request.app.get(COLLECTOR_KEY)
        view = stats.StatsView(collector, stats.parse_ranges(request.query, now_ms)) \
            if collector is not None else None
        call = Call(node, principal, dict(request.match_info), request.query, request.headers, body,
                    view, now_ms, request.path)
        try:
            result = await _run(node, request.method, fn, call)
        except listing.NamesToMatch as need:  # a regex name filter too costly for the loop
            checked, found = await _match_off_loop(need.pattern, need.names)
            query = listing.MatchedQuery(request.query, checked, found)
            result = await _run(node, request.method, fn, dataclasses.replace(call, query=query))
    except ApiError as exc:
        return _close_if_unread(request, _error_response(exc))
    if isinstance(result, Status):
        return web.Response(status=result.code, headers={"Cache-Control": "no-cache", **result.headers})
    if isinstance(result, Reply):
        return _json_response(result.body, result.code)
    return _json_response(result)


async def _run(node: Node, method: str, fn: Handler, call: Call) -> Any:
    if node.cluster is None:
        result = fn(call)
    else:
        result = await _clustered(node, method, fn, call)
    if inspect.isawaitable(result):
        result = await result
    return result


def _match_names(pattern: UserPattern, names: list[str], deadline_s: float) -> list[str] | None:
    """The names `pattern` matches (in a worker thread: RE2 releases the GIL), None past the deadline."""
    found = []
    for i, name in enumerate(names):
        if pattern.search_uncached(name):
            found.append(name)
        if i % 64 == 63 and time.monotonic() > deadline_s:
            return None
    return found


async def _match_off_loop(pattern: UserPattern, names: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(checked, found) of a listing's regex filter, matched off the event loop within
    `NAME_FILTER_DEADLINE_S` (else 400: the pattern is too costly for this many names)."""
    deadline = time.monotonic() + NAME_FILTER_DEADLINE_S
    found = await asyncio.get_running_loop().run_in_executor(None, _match_names, pattern, names, deadline)
    if found is None:
        raise bad_request(f"the name filter did not finish in {NAME_FILTER_DEADLINE_S:g} s over {len(names)} "
                          "names: use a simpler pattern")
    return frozenset(names), frozenset(found)


async def _clustered(node: Node, method: str, fn: Handler, call: Call) -> Any:
    """On a clustered node a change first waits for a read barrier (the newest definitions), and its
    reply for the commit of what it changed (503 when the metadata store has no majority)."""
    async def run() -> Any:
        result = fn(call)
        return await result if inspect.isawaitable(result) else result

    # cluster operations must work without a majority: no barrier before them
    return await _replicated(node, run, barrier=method != "GET" and fn not in NO_BARRIER)


async def _replicated(node: Node, change: Callable[[], Awaitable[Any]], barrier: bool = True) -> Any:
    """`change` on a clustered node (a node of workers is one): after a read barrier, and answered once
    what it changed is committed and applied by the connected members (every worker), so a client's
    next connection, to whichever worker or member, sees it."""
    from hutch.runtime.errors import ClusterUnavailable
    cluster = node.cluster
    assert cluster is not None
    try:
        if barrier:
            await cluster.barrier()
        result = await change()
        if cluster.has_unreplicated:
            await cluster.wait_replicated()
            await cluster.sync_peers()
    except ClusterUnavailable as exc:
        raise ApiError(503, "service_unavailable",
                       f"the cluster's metadata store did not answer in time: {exc}") from None
    return result


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Unknown paths and methods, refused requests, oversized or broken bodies and bugs, as JSON errors.
    Only a bug (a 500) logs a traceback: a client's broken request is one DEBUG line."""
    try:
        if request.match_info.http_exception is None:  # a route matched: the browser rules (intake.py)
            intake.check_browser_rules(request, allow_multipart=request.path.startswith("/api/definitions"))
        return await handler(request)
    except ApiError as exc:
        return _close_if_unread(request, _error_response(exc))
    except (web_protocol.RequestPayloadError, HttpProcessingError) as exc:  # e.g. a bad chunk
        log.debug("management API: malformed request body on %s %s: %s", request.method, request.path,
                  type(exc).__name__)
        return _close_if_unread(request, _json_response(
            {"error": "bad_request", "reason": "malformed request body"}, 400))
    except web.HTTPMethodNotAllowed:
        return _json_response({"error": "method_not_allowed", "reason": "Method Not Allowed"}, 405)
    except web.HTTPNotFound:
        return _json_response({"error": "Object Not Found", "reason": "Not Found"}, 404)
    except web.HTTPRequestEntityTooLarge:
        return _close_if_unread(request, _json_response(
            {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"}, 413))
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug must answer 500, not drop the connection
        log.exception("management API: internal error on %s %s", request.method, request.path)
        return _json_response({"error": "internal_server_error", "reason": str(exc)}, 500)


def _close_if_unread(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """A reply sent before the body was read (413, 415, 403...) closes the connection: the rest of the
    body is not waited for."""
    if request.body_exists and not request.content.is_eof():
        response.force_close()
    return response


async def _metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus: /metrics (aggregated, no authentication, as RabbitMQ's plugin) and /metrics/per-object
    (a monitoring user's login, unless prometheus.return_per_object_metrics); built on the loop from
    the node's queues and its management agent's `metric_samples` (every worker's connections and
    channels), compressed off it by aiohttp."""
    registry = request.match_info.get("registry", "default")
    if registry not in prometheus.REGISTRIES:
        return web.Response(status=404, text="Unknown Registry")
    node = request.app[NODE_KEY]
    rendered = registry
    if node.config.prometheus_return_per_object_metrics:
        rendered = "per-object"  # /metrics too, as RabbitMQ with return_per_object_metrics
    elif registry == "per-object":
        try:
            require_monitor(await _authenticate(request, node))
        except ApiError as exc:
            return _error_response(exc)
    scrapes = request.app[SCRAPES_KEY]
    agent = node.agent
    assert agent is not None  # runtime/app.py's build_node sets it
    loop = asyncio.get_running_loop()
    started = loop.time()
    clients = await agent.metric_samples()  # every worker's connections and channels (runtime/ports.py)
    info = await system.own_node_info(agent, node, node.wall_ms())  # every worker's memory, descriptors
    body = prometheus.render(node, rendered, info, clients, scrapes).encode()
    scrapes.observe(registry, loop.time() - started, len(body))
    response = web.Response(body=body, headers={"Content-Type": prometheus.CONTENT_TYPE})
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        response.enable_compression(web.ContentCoding.gzip)
    return response


async def _openapi(request: web.Request) -> web.StreamResponse:
    """GET /api/openapi.json: the OpenAPI 3 description of this API, built from the route table."""
    node = request.app[NODE_KEY]
    try:
        await _authenticate(request, node)
    except ApiError as exc:
        return _error_response(exc)
    return _json_response(openapi.document(ROUTES))


def build_app(node: Node, collector: stats.Collector | None = None) -> web.Application:
    cfg = node.config
    limits = intake.BodyLimits(cfg.management_max_body_bytes, cfg.management_idle_timeout_ms / 1000,
                               min(cfg.management_non_admin_max_body_bytes, cfg.management_max_body_bytes))
    app = web.Application(middlewares=[_errors], client_max_size=limits.max_bytes)
    app[NODE_KEY] = node
    app[LIMITS_KEY] = limits
    app[LARGE_BODIES_KEY] = intake.LargeBodies()
    if collector is not None:
        app[COLLECTOR_KEY] = collector
    app[SCRAPES_KEY] = prometheus.ScrapeStats()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/{registry}", _metrics)
    app.router.add_get("/api/openapi.json", _openapi)
    declared = {(r.method, r.path) for r in ROUTES}
    for r in ROUTES:
        handler = _adapt(r.fn)
        # RabbitMQ answers "/api/queues/%2F/" as "/api/queues/%2F" (unless a route says otherwise)
        slashed = () if r.path.endswith("/") or (r.method, r.path + "/") in declared else (r.path + "/",)
        for path in (r.path, *slashed):
            if r.method == "GET":
                app.router.add_get(path, handler)  # and HEAD
            else:
                app.router.add_route(r.method, path, handler)
    for path in ("/api/definitions", "/api/definitions/{vhost}"):
        app.router.add_get(path, _definitions)  # and HEAD
        app.router.add_post(path, _definitions)
    ui.add_routes(app)  # the web UI: / and /ui/{file} (ui.py)
    return app


# -- the service plug-in ----------------------------------------------------------------------------


async def _start_site(runner: web.AppRunner, site: web.BaseSite, what: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        exc.hutch_listener = what  # type: ignore[attr-defined]  # names the listener for app.py's message
        raise


def _bound_port(runner: web.AppRunner, before: int, default: int) -> int:
    """The port of the site started after `before` addresses were bound (port 0: the one picked)."""
    addresses = runner.addresses[before:]
    return int(addresses[0][1]) if addresses else default


async def _start_https(node: Node, runner: web.AppRunner, limits: listener.ListenerLimits) -> None:
    """The HTTPS listener (`management.ssl.*`): the same application and limits behind TLS; each accept
    takes the node's live context (runtime/tls.py), so certificate reloads apply to it."""
    cfg = node.config
    port = cfg.management_ssl_port
    assert port is not None  # started only when management.ssl.port is set
    what = f"management HTTPS on port {port}"
    try:
        ctx = node.tls.server_context("management_ssl")
    except TlsConfigError as exc:
        await runner.cleanup()
        error = OSError(str(exc))
        error.hutch_listener = what  # type: ignore[attr-defined]  # names the listener for app.py's message
        raise error from None
    before = len(runner.addresses)
    assert ctx is not None  # started only with management.ssl.certfile
    site = listener.GuardedSite(runner, cfg.management_ssl_host or None, port, limits,
                                ssl_context=lambda: node.tls.current("management_ssl"))
    await _start_site(runner, site, what)
    node.management_ssl_port = node.listener_ports["management_ssl"] = _bound_port(runner, before, port or 0)
    log.info("management HTTPS API started on %s:%d", listen.display_host(cfg.management_ssl_host),
             node.management_ssl_port)


def _serve_peers(node: Node, agent: ManagementAgentPort) -> None:
    """What the management API of another node (or of worker 0, in a node of workers) asks this one:
    its node figures, its federation links, a quorum queue member's view (hutch-queues)."""
    system.serve_node_info(node, agent)
    parameters.serve_link_status(node)
    quorum_routes.serve(node)


async def serve_management_peers(node: Node) -> Callable[[], Awaitable[None]]:
    """The service of a worker other than worker 0 (hutch-server --workers N): no listener, but the
    answers worker 0's management API asks of it over the worker link (`_serve_peers`), so a quorum
    queue's status names its members in every worker."""
    agent = node.agent
    assert agent is not None  # runtime/app.py's build_node sets it
    if node.cluster is not None:
        _serve_peers(node, agent)

    async def stop() -> None:
        return None

    return stop


async def start_management(node: Node) -> Callable[[], Awaitable[None]]:
    """Start the management listener on `management_host:management_port`; set
    `node.management_port` to the bound port. Raises OSError (e.g. port in use), which
    `hutch.runtime.app.serve` reports in one line."""
    cfg = node.config
    loop = asyncio.get_running_loop()
    interval_ms = max(cfg.collect_statistics_interval_ms, 100)
    collector = stats.Collector(interval_ms)
    agent = node.agent
    assert agent is not None  # runtime/app.py's build_node sets it
    _serve_peers(node, agent)
    limits = listener.ListenerLimits.from_config(cfg)
    runner = web.AppRunner(build_app(node, collector), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                           **listener.handler_args(limits))
    await runner.setup()
    if cfg.management_tcp:
        site = listener.GuardedSite(runner, cfg.management_host or None, cfg.management_port, limits)
        await _start_site(runner, site, f"management HTTP on port {cfg.management_port}")
        node.management_port = node.listener_ports["management"] = _bound_port(runner, 0, cfg.management_port)
        log.info("management HTTP API started on %s:%d (at most %d connections, %d from one address)",
                 listen.display_host(cfg.management_host), node.management_port, limits.max_connections,
                 limits.max_connections_per_source)
    if cfg.management_ssl_port is not None:
        await _start_https(node, runner, limits)

    interval_s = interval_ms / 1000
    timer: list[asyncio.TimerHandle] = []
    sampling: set[asyncio.Task[None]] = set()

    def exchange_exists(vhost: str, name: str) -> bool:
        v = node.vhosts.get(vhost)
        return v is not None and name in v.exchanges

    async def sample() -> None:
        """One sample of what the node's agent holds; then the next one is due in an interval."""
        try:
            samples = await agent.samples()
            figures = await system.node_figures(agent, node)
            collector.tick(samples, node.vhosts.keys(), exchange_exists, node.wall_ms(), figures)
        except Exception:  # a bug in sampling must not stop the sampling timer
            log.exception("management statistics: sampling failed")
        timer[:] = [loop.call_later(interval_s, tick)]

    def tick() -> None:
        task = loop.create_task(sample())
        sampling.add(task)
        task.add_done_callback(sampling.discard)

    await sample()

    async def stop() -> None:
        for handle in timer:
            handle.cancel()
        for task in list(sampling):
            task.cancel()
        await runner.cleanup()
        log.info("management HTTP API stopped")

    return stop


__all__ = ["NO_CONTENT", "ROUTES", "Call", "Route", "Status", "build_app", "limits_routes", "parameters", "route", "routes",
           "start_management", "stream_routes"]
