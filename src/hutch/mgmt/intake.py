"""What the management API accepts of a request before a handler sees it: browser rules, bodies, JSON.

Owns: the checks that keep a web page from driving the API (`check_browser_rules`: a state-changing
request with a cross-origin `Origin` is 403, one whose Content-Type is not JSON is 415), the bounded body reader
(`read_body`: `management.http.max_body_size` answered 413 before the body is read when its length is
announced, and as soon as the limit is passed otherwise; a body that stalls longer than
`management.tcp.idle_timeout` is 408), the multipart upload of the definitions page (`read_form_file`,
under the same bounds), `decode_json` (jsontext.py's bounded decoding, off the event loop for
large bodies), and `LargeBodies`, the turn of a large body.

Large bodies (issue 21: one 19.9 MB PUT stalled the loop 1.4 s and took RSS from 96 to 657 MB; four in
parallel 2.4 s and 1.72 GB): a user without the administrator tag may send at most
`management.http.non_admin_max_body_size` (1 MiB; 413 past it), and a body over `LARGE_BODY_BYTES` (or
of unannounced length) is read, decoded and handled only while it holds the node's one large-body turn;
others wait for it, at most `LARGE_BODY_WAIT_S` (then 503).

Rules (docs/security.md, "Management listener"):
- Credentials come only from the `Authorization` header (http.py); a query string never carries them.
- POST, PUT, PATCH and DELETE: an `Origin` header, when sent, must name this listener (its host and
  port as the client addressed it, i.e. the `Host` header), else 403. A `Content-Type`, when sent,
  must be `application/json`, except `multipart/form-data` where a route allows it (the definitions
  upload), else 415; a body without one is read as JSON (as RabbitMQ does; `curl -X DELETE` sends
  neither). HTML forms can send only urlencoded, multipart and text/plain bodies, always with their
  type, and always send `Origin` cross-site, as every script's cross-site POST, PUT or DELETE does.
- GET and HEAD change nothing and are not checked (a cross-site page cannot read their replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
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
LARGE_BODY_BYTES = 1024 * 1024  # bodies over this (or of unannounced length) take turns (LargeBodies)
LARGE_BODY_WAIT_S = 60.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class BodyLimits:
    """The bounds of a request body. Invariant: all are positive, `non_admin_max_bytes` at most
    `max_bytes` (an administrator's bound)."""

    max_bytes: int
    idle_timeout_s: float
    non_admin_max_bytes: int = 1024 * 1024
    setting: str = "management.http.max_body_size"  # what a 413 names as the limit

    def for_user(self, admin: bool) -> BodyLimits:
        """The bounds of one caller's body: a non-administrator's are `non_admin_max_bytes`."""
        if admin or self.non_admin_max_bytes >= self.max_bytes:
            return self
        return BodyLimits(self.non_admin_max_bytes, self.idle_timeout_s, self.non_admin_max_bytes,
                          "management.http.non_admin_max_body_size, for a user without the administrator tag")


class LargeBodies:
    """The node's one turn for a large request body (see the module's rules). Invariant: at most one
    request holds it."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def turn(self, request: web.BaseRequest) -> AsyncIterator[None]:
        """Hold the turn while the body of `request` is read and handled, if it is large."""
        length = request.content_length
        if not request.body_exists or (length is not None and length <= LARGE_BODY_BYTES):
            yield
            return
        try:
            async with asyncio.timeout(LARGE_BODY_WAIT_S):
                await self._turn.acquire()
        except TimeoutError:
            raise ApiError(503, "service_unavailable", "another large request body is being handled; "
                           "retry later") from None
        try:
            yield
        finally:
            self._turn.release()


# -- browser rules ----------------------------------------------------------------------------------


def forbidden(reason: str) -> ApiError:
    return ApiError(403, "forbidden", reason)


def unsupported_media_type(reason: str) -> ApiError:
    return ApiError(415, "unsupported_media_type", reason)


def too_large(limit: int, setting: str = "management.http.max_body_size") -> ApiError:
    return ApiError(413, "bad_request", f"Exceeded HTTP request body size limit ({limit} bytes; {setting})")


def _too_large(limits: BodyLimits) -> ApiError:
    return too_large(limits.max_bytes, limits.setting)


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
    """403 for a cross-origin state-changing request, 415 for a Content-Type that is not JSON (see the rules)."""
    if request.method not in STATE_CHANGING:
        return
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(origin, request.headers.get("Host", ""), request.scheme):
        raise forbidden(f"cross-origin request refused: Origin {origin[:200]!r} is not this listener")
    if "Content-Type" not in request.headers:
        # No form sends a body without a type, and a script's cross-site request carries Origin (above);
        # RabbitMQ's clients (got, as rabbitmq-stream-js-client's suite uses it) send JSON without one.
        return
    content_type = request.content_type
    if content_type == JSON_TYPE or (allow_multipart and content_type == MULTIPART_TYPE):
        return
    wanted = JSON_TYPE + (f" or {MULTIPART_TYPE}" if allow_multipart else "")
    raise unsupported_media_type(f"Content-Type {content_type!r} is not accepted: send {wanted}")


# -- bodies -----------------------------------------------------------------------------------------


def check_length(request: web.BaseRequest, limits: BodyLimits) -> None:
    length = request.content_length
    if length is not None and length > limits.max_bytes:
        raise _too_large(limits)


def request_timeout() -> ApiError:
    return ApiError(408, "request_timeout", "the request body stopped arriving "
                    "(management.tcp.idle_timeout)")


async def read_body(request: web.BaseRequest, limits: BodyLimits) -> bytes:
    """The whole body, at most `limits.max_bytes` (413 past it, before reading when the length is
    announced); 408 when no byte arrives for `limits.idle_timeout_s`."""
    check_length(request, limits)
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
            raise _too_large(limits)
        buf += chunk


async def read_form_file(request: web.BaseRequest, limits: BodyLimits, field: str = "file") -> bytes | None:
    """The `field` part of a multipart/form-data body (None if there is none), under the body limits;
    the other parts are read and dropped. ValueError for a body that is not multipart."""
    check_length(request, limits)
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
                raise _too_large(limits)
            if part.name == field and found is None:
                data += chunk
        if part.name == field and found is None:
            found = bytes(data)


# -- JSON -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def collector_paused(pause: bool) -> Iterator[None]:
    """Pause the cycle collector while a large body's objects live (decoded, handled, freed): otherwise
    its next pass walks every one of them, ~0.1-0.2 s on the loop for a 20 MB body. JSON makes no
    cycles; the objects are freed by reference counting when the request ends. Nested pauses keep it
    off until the outermost ends."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()



async def decode_json(raw: bytes) -> Any:
    """`loads_bounded(raw)`, in an executor thread when the body is large (no stall of the loop)."""
    if len(raw) < OFF_LOOP_BYTES:
        return loads_bounded(raw)
    return await asyncio.get_running_loop().run_in_executor(None, loads_bounded, raw)


__all__ = [
    "MAX_JSON_DEPTH",
    "LARGE_BODY_BYTES",
    "BodyLimits",
    "LargeBodies",
    "JsonTooDeep",
    "check_browser_rules",
    "check_length",
    "collector_paused",
    "decode_json",
    "forbidden",
    "loads_bounded",
    "read_body",
    "read_form_file",
    "same_origin",
    "too_large",
    "unsupported_media_type",
]
