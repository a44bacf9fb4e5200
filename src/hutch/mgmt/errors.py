"""Errors of the management API, shaped like RabbitMQ's management plugin replies.

Owns: `ApiError` (an HTTP status plus RabbitMQ's `{"error": ..., "reason": ...}` body) and the
constructors the service layer raises, and `from_amqp`, which turns the `ChannelError` a topology
operation raises into the reply RabbitMQ's HTTP API gives for the same AMQP error.

Rules (RabbitMQ's, see docs/management.md):
- A path that names a missing object: 404 `{"error": "Object Not Found", "reason": "Not Found"}`.
- Failed login: 401 `not_authorized` / `Not_Authorized` and a `WWW-Authenticate` challenge.
- Logged in but not allowed: 401 `not_authorised` (British spelling) with a reason. RabbitMQ
  answers 401, not 403, for every authorisation failure of its HTTP API; so does hutch.
- A bad body or a refused operation: 400 `bad_request` with the reason.
"""

from __future__ import annotations

from hutch.amqp.errors import ACCESS_REFUSED, NOT_ALLOWED, NOT_FOUND, AMQPError

AUTH_REALM = 'Basic realm="RabbitMQ Management"'


class ApiError(Exception):
    """An HTTP error reply. `headers` are extra response headers (the auth challenge)."""

    def __init__(self, status: int, error: str, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"error": self.error, "reason": self.reason}


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def not_found_because(reason: str) -> ApiError:
    """404 for an AMQP NOT_FOUND, which RabbitMQ reports with the AMQP explanation."""
    return ApiError(404, "not_found", reason)


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_authorised(reason: str) -> ApiError:
    return ApiError(401, "not_authorised", reason)


def not_authenticated() -> ApiError:
    return ApiError(401, "not_authorized", "Not_Authorized", {"WWW-Authenticate": AUTH_REALM})


ACCESS_REFUSED_REASON = "Access refused."


def access_refused() -> ApiError:
    """A topology operation the user's AMQP permissions do not allow (RabbitMQ's wording)."""
    return not_authorised(ACCESS_REFUSED_REASON)


def from_amqp(exc: AMQPError) -> ApiError:
    """The reply RabbitMQ's `direct_request` gives for an AMQP error raised by an operation."""
    if exc.code in (ACCESS_REFUSED, NOT_ALLOWED):
        return access_refused()
    if exc.code == NOT_FOUND:
        return not_found_because(exc.text)
    return bad_request(exc.text)


__all__ = [
    "ACCESS_REFUSED_REASON",
    "AUTH_REALM",
    "ApiError",
    "access_refused",
    "bad_request",
    "from_amqp",
    "not_authenticated",
    "not_authorised",
    "not_found",
    "not_found_because",
]
