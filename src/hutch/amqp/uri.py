"""AMQP URIs (RabbitMQ's URI spec): `amqp://user:pass@host:port/vhost?heartbeat=s&frame_max=n&
connection_timeout=ms`.

Owns: `AmqpUri` and `parse_uri`, shared by every client hutch ships (hutch-perf, the Spark connector).
Rules: `amqps` is refused (no TLS yet); the vhost is one path segment (`/` is written `%2F`); user and
password are percent-decoded; errors are `UriError` with a message that never shows the password.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

AMQP_PORT = 5672


class UriError(ValueError):
    """A malformed or unsupported AMQP URI; the text says what is wrong (password hidden)."""


@dataclass(frozen=True)
class AmqpUri:
    host: str = "127.0.0.1"
    port: int = AMQP_PORT
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    heartbeat_s: int = 0
    frame_max_bytes: int = 0  # 0: take the server's proposal
    connect_timeout_s: float = 10.0

    def display(self) -> str:
        """The URI with the password left out, for messages and logs."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        vhost = "%2F" if self.vhost == "/" else self.vhost
        return f"amqp://{self.username}@{host}:{self.port}/{vhost}"


def hide_password(text: str) -> str:
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        return text.replace(f":{parts.password}@", ":***@", 1)
    except ValueError:
        return text


def parse_uri(text: str, *, heartbeat_s: int = 0, require_host: bool = False) -> AmqpUri:
    """Parse an AMQP URI; `heartbeat_s` is the heartbeat when the URI does not give one. Without
    `require_host`, `amqp://` alone means 127.0.0.1 (as hutch-perf's default does)."""
    shown = hide_password(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UriError(f"bad URI {shown!r}: {exc}") from None
    if parts.scheme == "amqps":
        raise UriError("amqps:// (TLS) is not supported yet; use amqp://")
    if parts.scheme != "amqp":
        raise UriError(f"bad URI {shown!r}: it must start with amqp:// (unsupported scheme "
                       f"{parts.scheme!r}; e.g. amqp://guest:guest@localhost:5672/%2F)")
    if require_host and not parts.hostname:
        raise UriError(f"bad URI {shown!r}: no host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise UriError(f"bad URI {shown!r}: the virtual host must be one path segment "
                       "(write the default vhost / as %2F)")
    fields: dict[str, int | float] = {"heartbeat_s": heartbeat_s}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        value = values[-1]
        if key in ("heartbeat", "frame_max"):
            if not value.isdigit():
                raise UriError(f"bad URI {shown!r}: {key} must be a non-negative integer, got {value!r}")
            fields["heartbeat_s" if key == "heartbeat" else "frame_max_bytes"] = int(value)
        elif key == "connection_timeout":
            try:
                timeout_ms = float(value)
            except ValueError:
                timeout_ms = 0.0
            if timeout_ms <= 0:
                raise UriError(f"bad URI {shown!r}: connection_timeout must be a positive number of "
                               f"milliseconds, got {value!r}")
            fields["connect_timeout_s"] = timeout_ms / 1000.0
        else:
            raise UriError(f"bad URI {shown!r}: unsupported query parameter {key!r} "
                           "(allowed: heartbeat, connection_timeout, frame_max)")
    if 0 < int(fields.get("frame_max_bytes", 0)) < 4096:
        raise UriError(f"bad URI {shown!r}: frame_max must be 0 or at least 4096")
    if int(fields["heartbeat_s"]) > 65535:
        raise UriError(f"bad URI {shown!r}: heartbeat must be at most 65535 seconds")
    return AmqpUri(
        host=parts.hostname or "127.0.0.1",
        port=port if port is not None else AMQP_PORT,
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) if path else "/",
        **fields,  # type: ignore[arg-type]
    )
