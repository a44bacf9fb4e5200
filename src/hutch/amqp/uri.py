"""AMQP URIs (RabbitMQ's URI spec): `amqp://user:pass@host:port/vhost?heartbeat=s&frame_max=n&
connection_timeout=ms`, and `amqps://` (TLS, default port 5671) with RabbitMQ's TLS query parameters
`cacertfile`, `certfile`, `keyfile`, `verify` (`verify_peer`, the default, or `verify_none`) and
`server_name_indication` (the host name the certificate must name; default the URI's host).

Owns: `AmqpUri`, `parse_uri` and `AmqpUri.ssl_context()`, shared by every client hutch ships
(hutch-perf, the Spark connector). Rules: the vhost is one path segment (`/` is written `%2F`); user
and password are percent-decoded; TLS parameters on an `amqp://` URI are an error (they would be
silently ignored); errors are `UriError` with a message that never shows the password. Stdlib only.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

AMQP_PORT = 5672
AMQPS_PORT = 5671
_TLS_FILE_KEYS = ("cacertfile", "certfile", "keyfile")


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
    tls: bool = False  # amqps://
    cacertfile: str = ""  # CA file to verify the broker with ("": the system's CAs)
    certfile: str = ""  # client certificate (for EXTERNAL) and its key
    keyfile: str = ""
    verify: bool = True  # verify_peer (certificate and host name) or verify_none
    server_name: str = ""  # server_name_indication: the name the certificate must carry (default: host)

    def display(self) -> str:
        """The URI with the password left out, for messages and logs."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        vhost = "%2F" if self.vhost == "/" else self.vhost
        return f"{'amqps' if self.tls else 'amqp'}://{self.username}@{host}:{self.port}/{vhost}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context of an amqps URI (None for amqp). Raises UriError when a file named by
        the URI cannot be loaded."""
        if not self.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.cacertfile or None)
            if self.certfile:
                ctx.load_cert_chain(self.certfile, self.keyfile or None)
        except (OSError, ssl.SSLError) as exc:
            raise UriError(f"cannot load the TLS files of {self.display()}: {exc}") from None
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    @property
    def tls_server_name(self) -> str:
        return self.server_name or self.host


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
    if parts.scheme not in ("amqp", "amqps"):
        raise UriError(f"bad URI {shown!r}: it must start with amqp:// or amqps:// (unsupported scheme "
                       f"{parts.scheme!r}; e.g. amqp://guest:guest@localhost:5672/%2F)")
    if require_host and not parts.hostname:
        raise UriError(f"bad URI {shown!r}: no host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise UriError(f"bad URI {shown!r}: the virtual host must be one path segment "
                       "(write the default vhost / as %2F)")
    tls = parts.scheme == "amqps"
    fields: dict[str, int | float | str | bool] = {"heartbeat_s": heartbeat_s, "tls": tls}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        value = values[-1]
        if key in (*_TLS_FILE_KEYS, "verify", "server_name_indication"):
            fields.update(_tls_parameter(shown, tls, key, value))
        elif key in ("heartbeat", "frame_max"):
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
                           "(allowed: heartbeat, connection_timeout, frame_max; with amqps also cacertfile, "
                           "certfile, keyfile, verify, server_name_indication)")
    if 0 < int(fields.get("frame_max_bytes", 0)) < 4096:
        raise UriError(f"bad URI {shown!r}: frame_max must be 0 or at least 4096")
    if int(fields["heartbeat_s"]) > 65535:
        raise UriError(f"bad URI {shown!r}: heartbeat must be at most 65535 seconds")
    return AmqpUri(
        host=parts.hostname or "127.0.0.1",
        port=port if port is not None else (AMQPS_PORT if tls else AMQP_PORT),
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) if path else "/",
        **fields,  # type: ignore[arg-type]  # only AmqpUri's own optional fields, each of its type
    )


def _tls_parameter(shown: str, tls: bool, key: str, value: str) -> dict[str, str | bool]:
    """One of RabbitMQ's TLS query parameters, as AmqpUri fields."""
    if not tls:
        raise UriError(f"bad URI {shown!r}: {key} is a TLS parameter: use amqps://")
    if key == "verify":
        if value not in ("verify_peer", "verify_none"):
            raise UriError(f"bad URI {shown!r}: verify must be verify_peer or verify_none, got {value!r}")
        return {"verify": value == "verify_peer"}
    if not value:
        raise UriError(f"bad URI {shown!r}: {key} must not be empty")
    return {"server_name" if key == "server_name_indication" else key: value}
