"""What the management API accepts of a request before a handler sees it: browser rules, bodies, JSON.

Owns: the checks that keep a web page from driving the API (`check_browser_rules`: a state-changing
request with a cross-origin `Origin` is 403, one whose body is not JSON is 415), the bounded body reader
(`read_body`: `management.http.max_body_size` answered 413 before the body is read when its length is
announced, and as soon as the limit is passed otherwise; a body that stalls longer than
`management.tcp.idle_timeout` is 408), the multipart upload of the definitions page (`read_form_file`,
under the same bounds), and `decode_json` (jsontext.py's bounded decoding, off the event loop for
large bodies).

Rules (docs/security.md, "Management listener"):
- Credentials come only from the `Authorization` header (http.py); a query string never carries them.
- POST, PUT, PATCH and DELETE: an `Origin` header, when sent, must name this listener (its host and
  port as the client addressed it, i.e. the `Host` header), else 403. A body, or any `Content-Type`,
  must be `application/json`, except `multipart/form-data` where a route allows it (the definitions
  upload), else 415. A request with neither body nor `Content-Type` (curl -X DELETE) passes. HTML forms
  can send only urlencoded, multipart and text/plain bodies, and always send `Origin` cross-site.
- GET and HEAD change nothing and are not checked (a cross-site page cannot read their replies).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import BodyPartReader, web

from .errors import ApiError
from .jsontext import MAX_JSON_DEPTH, JsonTooDeep, loads_bounded

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPE = "application/json"
MULTIPART_TYPE = "multipart/form-data"
OFF_LOOP_BYTES = 256 * 1024  # bodies at least this large are decoded in an executor thread
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class BodyLimits:
    """The bounds of a request body. Invariant: both are positive."""

    max_bytes: int
    idle_timeout_s: float


# -- browser rules ----------------------------------------------------------------------------------


def forbidden(reason: str) -> ApiError:
    return ApiError(403, "forbidden", reason)


def unsupported_media_type(reason: str) -> ApiError:
    return ApiError(415, "unsupported_media_type", reason)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "bad_request", f"Exceeded HTTP request body size limit ({limit} bytes; "
                    "management.http.max_body_size)")


def _host_port(netloc: str, scheme: str) -> tuple[str, int | None]:
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return "", None
    return (parts.hostname or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)


def same_origin(origin: str, host_header: str, scheme: str) -> bool:
    """Whether `Origin` names the listener the client addressed (`Host`). A `Host` without a port (a
    reverse proxy in front, perhaps terminating TLS) matches an origin of that host on its scheme's
    default port, http or https."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port if parts.port is not None else _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    origin_host = (parts.hostname or "").lower()
    if not origin_host or parts.scheme not in _DEFAULT_PORTS or parts.path not in ("", "/"):
        return False
    host, port = _host_port(host_header, scheme)
    if host != origin_host:
        return False
    if ":" not in host_header.rsplit("]", 1)[-1]:  # no port: a proxy in front, or the scheme's default
        return origin_port == _DEFAULT_PORTS[parts.scheme]
    return port == origin_port


def check_browser_rules(request: web.BaseRequest, allow_multipart: bool = False) -> None:
    """403 for a cross-origin state-changing request, 415 for a body that is not JSON (see the rules)."""
    if request.method not in STATE_CHANGING:
        return
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(origin, request.headers.get("Host", ""), request.scheme):
        raise forbidden(f"cross-origin request refused: Origin {origin[:200]!r} is not this listener")
    has_type = "Content-Type" in request.headers
    has_body = request.body_exists
    if not has_type and not has_body:
        return
    content_type = request.content_type
    if content_type == JSON_TYPE or (allow_multipart and content_type == MULTIPART_TYPE):
        return
    wanted = JSON_TYPE + (f" or {MULTIPART_TYPE}" if allow_multipart else "")
    raise unsupported_media_type(f"Content-Type {content_type!r} is not accepted: send {wanted}")


# -- bodies -----------------------------------------------------------------------------------------


def _check_length(request: web.BaseRequest, limits: BodyLimits) -> None:
    length = request.content_length
    if length is not None and length > limits.max_bytes:
        raise too_large(limits.max_bytes)


def request_timeout() -> ApiError:
    return ApiError(408, "request_timeout", "the request body stopped arriving "
                    "(management.tcp.idle_timeout)")


async def read_body(request: web.BaseRequest, limits: BodyLimits) -> bytes:
    """The whole body, at most `limits.max_bytes` (413 past it, before reading when the length is
    announced); 408 when no byte arrives for `limits.idle_timeout_s`."""
    _check_length(request, limits)
    buf = bytearray()
    content = request.content
    while True:
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                chunk = await content.readany()
        except TimeoutError:
            raise request_timeout() from None
        if not chunk:
            return bytes(buf)
        if len(buf) + len(chunk) > limits.max_bytes:
            raise too_large(limits.max_bytes)
        buf += chunk


async def read_form_file(request: web.BaseRequest, limits: BodyLimits, field: str = "file") -> bytes | None:
    """The `field` part of a multipart/form-data body (None if there is none), under the body limits;
    the other parts are read and dropped. ValueError for a body that is not multipart."""
    _check_length(request, limits)
    reader = await request.multipart()
    total = 0
    found: bytes | None = None
    while True:
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                part = await reader.next()
        except TimeoutError:
            raise request_timeout() from None
        if part is None:
            return found
        if not isinstance(part, BodyPartReader):  # a nested multipart: not a form field
            raise ValueError("nested multipart bodies are not accepted")
        data = bytearray()
        while True:
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    chunk = await part.read_chunk()
            except TimeoutError:
                raise request_timeout() from None
            if not chunk:
                break
            total += len(chunk)
            if total > limits.max_bytes:
                raise too_large(limits.max_bytes)
            if part.name == field and found is None:
                data += chunk
        if part.name == field and found is None:
            found = bytes(data)


# -- JSON -------------------------------------------------------------------------------------------


async def decode_json(raw: bytes) -> Any:
    """`loads_bounded(raw)`, in an executor thread when the body is large (no stall of the loop)."""
    if len(raw) < OFF_LOOP_BYTES:
        return loads_bounded(raw)
    return await asyncio.get_running_loop().run_in_executor(None, loads_bounded, raw)


__all__ = [
    "MAX_JSON_DEPTH",
    "BodyLimits",
    "JsonTooDeep",
    "check_browser_rules",
    "decode_json",
    "forbidden",
    "loads_bounded",
    "read_body",
    "read_form_file",
    "same_origin",
    "too_large",
    "unsupported_media_type",
]
