"""The OpenAPI 3 description of the management API, generated from the route table.

Owns: `document(routes)`, the OpenAPI 3.0 document GET /api/openapi.json serves, and the JSON schemas
of the API's objects and request bodies (`SCHEMAS`). Built from `calls.ROUTES` at request time, so it
cannot drift from what the app serves; the raw aiohttp routes of http.py (definitions, /metrics) are
described here by hand (`EXTRA_PATHS`), and tests/mgmt/test_openapi.py checks that every route the app
serves under /api and /metrics is in the document, and runs schemathesis against a node with it.

Rules:
- Object schemas type their fields but require none: `?columns=` may select any subset, and fields
  RabbitMQ derives from Erlang internals are absent. Objects stay open (`additionalProperties`).
- Every operation documents 401 (no or wrong credentials, or not allowed: RabbitMQ answers 401 for
  both) and the statuses its route lists; list endpoints document the listing parameters (page,
  page_size, name, use_regex, sort, sort_reverse, columns) and the paginated reply, and GET endpoints
  RabbitMQ's range parameters (lengths_age, msg_rates_age, ... with _incr).
- Path parameters are single segments; `/` in a vhost name is written %2F.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hutch import __version__

if TYPE_CHECKING:
    from .calls import Route

OPENAPI_VERSION = "3.0.3"

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ: dict[str, Any] = {"type": "object"}
_STR_OR_NULL = {"type": "string", "nullable": True}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(props: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


DETAILS = _object({
    "rate": _NUM,
    "samples": {"type": "array", "items": _object({"sample": _NUM, "timestamp": _INT})},
    "avg_rate": _NUM,
    "avg": _NUM,
})
MESSAGE_STATS = {"type": "object", "additionalProperties": {"oneOf": [_INT, _ref("Details")]}}
QUEUE_LENGTH_FIELDS = {"messages": _INT, "messages_ready": _INT, "messages_unacknowledged": _INT,
                       "messages_details": _ref("Details"), "messages_ready_details": _ref("Details"),
                       "messages_unacknowledged_details": _ref("Details")}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Any": {},
    "Error": _object({"error": _STR, "reason": _STR}),
    "Details": DETAILS,
    "MessageStats": MESSAGE_STATS,
    "Page": _object({"items": {"type": "array", "items": {}}, "item_count": _INT, "filtered_count": _INT,
                     "total_count": _INT, "page": _INT, "page_size": _INT, "page_count": _INT}),
    "Overview": _object({
        "management_version": _STR, "product_name": _STR, "product_version": _STR, "rates_mode": _STR,
        "node": _STR, "cluster_name": _STR, "exchange_types": {"type": "array", "items": _OBJ},
        "listeners": {"type": "array", "items": _object({"node": _STR, "protocol": _STR, "ip_address": _STR,
                                                         "port": _INT})},
        "object_totals": _object({k: _INT for k in ("connections", "channels", "exchanges", "queues",
                                                     "consumers")}),
        "queue_totals": _object(QUEUE_LENGTH_FIELDS),
        "message_stats": _ref("MessageStats"),
        "churn_rates": _ref("MessageStats"),
        "sample_retention_policies": {"type": "object",
                                      "additionalProperties": {"type": "array", "items": _INT}},
    }),
    "ClusterName": _object({"name": {"type": "string", "minLength": 1}}, ["name"]),
    "Whoami": _object({"name": _STR, "tags": {"type": "array", "items": _STR}}),
    "HealthStatus": _object({"status": {"type": "string", "enum": ["ok", "failed"]}, "reason": _STR}),
    "Node": _object({"name": _STR, "running": _BOOL, "uptime": _INT, "mem_used": _INT, "mem_limit": _INT,
                     "mem_alarm": _BOOL, "disk_free": _INT, "disk_free_limit": _INT, "disk_free_alarm": _BOOL,
                     "fd_used": _INT, "fd_total": _INT, "sockets_used": _INT, "proc_used": _INT,
                     "mem_used_details": _ref("Details")}),
    "User": _object({"name": _STR, "password_hash": _STR, "hashing_algorithm": _STR,
                     "tags": {"type": "array", "items": _STR}, "limits": _OBJ}),
    "UserBody": _object({"password": _STR, "password_hash": _STR,
                         "tags": {"oneOf": [_STR, {"type": "array", "items": _STR}]}}),
    "BulkDelete": _object({"users": {"type": "array", "items": _STR}}, ["users"]),
    "Vhost": _object({"name": _STR, "description": _STR, "tags": {"type": "array", "items": _STR},
                      "default_queue_type": _STR, "message_stats": _ref("MessageStats"), "recv_oct": _INT,
                      "send_oct": _INT, **QUEUE_LENGTH_FIELDS}),
    "VhostBody": _object({"description": _STR, "tags": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
                          "default_queue_type": _STR}),
    "Permission": _object({"user": _STR, "vhost": _STR, "configure": _STR, "write": _STR, "read": _STR}),
    "PermissionBody": _object({"configure": _STR, "write": _STR, "read": _STR}, ["configure", "write", "read"]),
    "TopicPermission": _object({"user": _STR, "vhost": _STR, "exchange": _STR, "write": _STR, "read": _STR}),
    "TopicPermissionBody": _object({"exchange": _STR, "write": _STR, "read": _STR}, ["exchange", "write", "read"]),
    "Queue": _object({"name": _STR, "vhost": _STR, "durable": _BOOL, "auto_delete": _BOOL, "exclusive": _BOOL,
                      "arguments": _OBJ, "type": _STR, "state": _STR, "consumers": _INT, "message_bytes": _INT,
                      "policy": _STR_OR_NULL, "message_stats": _ref("MessageStats"),
                      "consumer_details": {"type": "array", "items": _ref("Consumer")}, **QUEUE_LENGTH_FIELDS}),
    "QueueBody": _object({"durable": _BOOL, "auto_delete": _BOOL, "arguments": _OBJ}),
    "Exchange": _object({"name": _STR, "vhost": _STR, "type": _STR, "durable": _BOOL, "auto_delete": _BOOL,
                         "internal": _BOOL, "arguments": _OBJ, "policy": _STR_OR_NULL,
                         "messages_delayed": _INT, "message_stats": _ref("MessageStats")}),
    "ExchangeBody": _object({"type": _STR, "durable": _BOOL, "auto_delete": _BOOL, "internal": _BOOL,
                             "arguments": _OBJ}),
    "Binding": _object({"source": _STR, "vhost": _STR, "destination": _STR,
                        "destination_type": {"type": "string", "enum": ["queue", "exchange"]},
                        "routing_key": _STR, "arguments": _OBJ, "properties_key": _STR}),
    "BindingBody": _object({"routing_key": _STR, "arguments": _OBJ}),
    "PublishBody": _object({"routing_key": _STR, "properties": _OBJ, "payload": _STR,
                            "payload_encoding": {"type": "string", "enum": ["string", "base64"]}},
                           ["routing_key", "properties", "payload", "payload_encoding"]),
    "Routed": _object({"routed": _BOOL}, ["routed"]),
    "GetBody": _object({"count": {"type": "integer", "minimum": 0, "maximum": 100},
                        "ackmode": {"type": "string", "enum": ["ack_requeue_true", "ack_requeue_false",
                                                               "reject_requeue_true", "reject_requeue_false"]},
                        "encoding": {"type": "string", "enum": ["auto", "base64"]},
                        "truncate": {"type": "integer", "minimum": 0}},
                       ["count", "ackmode", "encoding"]),
    "Message": _object({"payload": _STR, "payload_bytes": _INT,
                        "payload_encoding": {"type": "string", "enum": ["string", "base64"]},
                        "redelivered": _BOOL, "exchange": _STR, "routing_key": _STR, "message_count": _INT,
                        "properties": _OBJ}),
    "Connection": _object({"name": _STR, "user": _STR, "vhost": _STR, "node": _STR, "peer_host": _STR,
                           "peer_port": _INT, "channels": _INT, "state": _STR, "recv_oct": _INT, "send_oct": _INT,
                           "recv_oct_details": _ref("Details"), "send_oct_details": _ref("Details"),
                           "client_properties": _OBJ}),
    "Channel": _object({"name": _STR, "number": _INT, "user": _STR, "vhost": _STR, "node": _STR,
                        "consumer_count": _INT, "messages_unacknowledged": _INT, "messages_unconfirmed": _INT,
                        "messages_uncommitted": _INT, "confirm": _BOOL,
                        "transactional": _BOOL, "connection_details": _OBJ, "message_stats": _ref("MessageStats"),
                        "publishes": {"type": "array", "items": _OBJ}}),
    "Consumer": _object({"consumer_tag": _STR, "queue": _object({"name": _STR, "vhost": _STR}),
                         "channel_details": _OBJ, "ack_required": _BOOL, "exclusive": _BOOL,
                         "prefetch_count": _INT, "arguments": _OBJ}),
    "Policy": _object({"vhost": _STR, "name": _STR, "pattern": _STR, "apply-to": _STR, "definition": _OBJ,
                       "priority": _INT}),
    "PolicyBody": _object({"pattern": _STR, "definition": _OBJ, "priority": _INT, "apply-to": _STR},
                          ["pattern", "definition"]),
    "Definitions": _object({"rabbit_version": _STR, "users": {"type": "array", "items": _OBJ},
                            "vhosts": {"type": "array", "items": _OBJ}, "queues": {"type": "array", "items": _OBJ},
                            "exchanges": {"type": "array", "items": _OBJ},
                            "bindings": {"type": "array", "items": _OBJ}}),
}

LIST_PARAMETERS: list[tuple[str, dict[str, Any], str]] = [
    ("page", {"type": "integer", "minimum": 1}, "Page number: turns pagination on"),
    ("page_size", {"type": "integer", "minimum": 1, "maximum": 500}, "Items per page (default 100)"),
    ("name", _STR, "With page: keep items whose name contains this (case-insensitive)"),
    ("use_regex", {"type": "string", "enum": ["true", "false"]}, "With name: a regular expression"),
    ("sort", _STR, "Field to sort by (dotted for nested fields)"),
    ("sort_reverse", {"type": "string", "enum": ["true", "false"]}, "Reverse the order"),
    ("columns", _STR, "Comma-separated fields to keep (dotted for nested fields)"),
]
RANGE_PARAMETERS = [(f"{prefix}_{part}", {"type": "integer", "minimum": 1},
                     f"Range of {prefix} samples: {'seconds back' if part == 'age' else 'seconds between samples'}")
                    for prefix in ("lengths", "msg_rates", "data_rates", "node_stats") for part in ("age", "incr")]
STATS_TAGS = {"system", "vhosts", "queues", "exchanges", "connections"}

_PARAM = re.compile(r"{(\w+)}")
_ERROR_CONTENT = {"application/json": {"schema": _ref("Error")}}
_DESCRIPTIONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad request", 401: "Not authorised",
                 404: "Not found", 405: "Method not allowed", 503: "Check failed or service unavailable"}


def _schema(name: str) -> dict[str, Any]:
    if name.endswith("[]"):
        return {"type": "array", "items": _ref(name[:-2])}
    return _ref(name)


def _path_parameters(path: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in _PARAM.findall(path)]


def _query(params: Sequence[tuple[str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    return [{"name": name, "in": "query", "required": False, "schema": schema, "description": text}
            for name, schema, text in params]


def _operation(r: Route) -> dict[str, Any]:
    params = _path_parameters(r.path)
    if r.listing:
        params += _query(LIST_PARAMETERS)
    if r.method == "GET" and r.tag in STATS_TAGS:
        params += _query(RANGE_PARAMETERS)
    if r.method == "DELETE" and r.path in ("/api/queues/{vhost}/{name}", "/api/exchanges/{vhost}/{name}"):
        params += _query([("if-unused", {"type": "string", "enum": ["true", "false"]}, "Only if unused")])
        if "queues" in r.path:
            params += _query([("if-empty", {"type": "string", "enum": ["true", "false"]}, "Only if empty")])
    responses: dict[str, Any] = {}
    codes = set(r.codes)
    if r.reply is not None and not codes & {201, 204}:
        reply = _schema(r.reply)
        if r.listing:
            reply = {"oneOf": [reply, _ref("Page")]}
        responses["200"] = {"description": "OK", "content": {"application/json": {"schema": reply}}}
    if r.listing:
        codes.add(400)  # invalid pagination or range parameters, invalid regular expression
    if r.method == "GET" and r.tag in STATS_TAGS:
        codes.add(400)
    if r.body is not None or r.method in ("PUT", "POST"):
        codes.add(400)  # a body that is not a JSON object
    codes.add(401)
    for code in sorted(codes):
        entry: dict[str, Any] = {"description": _DESCRIPTIONS.get(code, str(code))}
        if code == 503 and r.reply == "HealthStatus":
            entry["content"] = {"application/json": {"schema": _ref("HealthStatus")}}
        elif code >= 400:
            entry["content"] = _ERROR_CONTENT
        responses[str(code)] = entry
    op: dict[str, Any] = {
        "operationId": r.fn.__name__.strip("_") or f"{r.method.lower()}{r.path}",
        "summary": r.summary,
        "tags": [r.tag],
        "parameters": params,
        "responses": responses,
    }
    if r.body is not None:
        op["requestBody"] = {"required": r.body not in ("Any",),
                             "content": {"application/json": {"schema": _schema(r.body)}}}
    return op


def _raw_paths() -> dict[str, dict[str, Any]]:
    """What http.py serves with raw handlers: definitions and Prometheus metrics."""
    text = {"text/plain": {"schema": _STR}}
    vhost = _path_parameters("{vhost}")
    defs_get: dict[str, Any] = {"summary": "Export definitions (administrators); ?download=NAME names the file",
                "tags": ["definitions"],
                "parameters": _query([("download", _STR, "File name for Content-Disposition")]),
                "responses": {"200": {"description": "OK",
                                      "content": {"application/json": {"schema": _ref("Definitions")}}},
                              "400": {"description": "Bad request", "content": _ERROR_CONTENT},
                              "401": {"description": "Not authorised", "content": _ERROR_CONTENT}}}
    defs_post: dict[str, Any] = {"summary": "Import definitions (administrators): all or nothing", "tags": ["definitions"],
                 "requestBody": {"content": {"application/json": {"schema": _ref("Definitions")}}},
                 "responses": {"204": {"description": "No Content"},
                               "400": {"description": "Bad request", "content": _ERROR_CONTENT},
                               "401": {"description": "Not authorised", "content": _ERROR_CONTENT}}}
    metrics = {"summary": "Prometheus metrics, aggregated (no authentication)", "tags": ["metrics"],
               "security": [], "responses": {"200": {"description": "OK", "content": text}}}
    per_object = {"summary": "Prometheus metrics of a registry: per-object (no authentication)",
                  "tags": ["metrics"], "security": [],
                  "parameters": [{"name": "registry", "in": "path", "required": True,
                                  "schema": {"type": "string", "enum": ["per-object", "default"]}}],
                  "responses": {"200": {"description": "OK", "content": text},
                                "404": {"description": "Unknown registry", "content": text}}}
    openapi = {"summary": "This document", "tags": ["system"],
               "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": _OBJ}}},
                             "401": {"description": "Not authorised", "content": _ERROR_CONTENT}}}
    return {
        "/api/definitions": {"get": {**defs_get, "operationId": "get_definitions"},
                             "post": {**defs_post, "operationId": "post_definitions"}},
        "/api/definitions/{vhost}": {"get": {**defs_get, "operationId": "get_vhost_definitions",
                                             "parameters": vhost + defs_get["parameters"]},
                                     "post": {**defs_post, "operationId": "post_vhost_definitions",
                                              "parameters": vhost,
                                              "responses": {**defs_post["responses"],
                                                            "404": {"description": "Not found",
                                                                    "content": _ERROR_CONTENT}}}},
        "/metrics": {"get": {**metrics, "operationId": "metrics"}},
        "/metrics/{registry}": {"get": {**per_object, "operationId": "metrics_registry"}},
        "/api/openapi.json": {"get": {**openapi, "operationId": "openapi"}},
    }


EXTRA_PATHS = ("/api/definitions", "/api/definitions/{vhost}", "/metrics", "/metrics/{registry}",
               "/api/openapi.json")


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI 3.0 document of `routes` plus the raw routes of http.py."""
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    for path, ops in _raw_paths().items():
        paths.setdefault(path, {}).update(ops)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "hutch management HTTP API",
            "version": __version__,
            "description": "RabbitMQ-compatible management API of hutch (docs/management.md). Paths, verbs, "
                           "JSON field names and status codes follow RabbitMQ's management plugin; "
                           "authorisation failures are 401, as in RabbitMQ.",
        },
        "servers": [{"url": "/"}],
        "security": [{"basicAuth": []}],
        "tags": sorted(({"name": t} for t in {r.tag for r in routes} | {"definitions", "metrics"}),
                       key=lambda t: t["name"]),
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"basicAuth": {"type": "http", "scheme": "basic"}},
            "schemas": SCHEMAS,
        },
    }


__all__ = ["EXTRA_PATHS", "SCHEMAS", "document"]
