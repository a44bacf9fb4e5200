"""Dynamic shovel definitions: the `shovel` runtime parameter's value, validated as RabbitMQ validates it.

Owns: `ShovelDef` (one shovel's resolved settings with RabbitMQ's defaults), `parse_shovel(name, value)`
(the JSON object of `set_parameter shovel NAME ...`, `PUT /api/parameters/shovel/...` or a definitions
file, into a `ShovelDef`, or a `ShovelDefError` carrying every problem found), the forwarding headers a
shovel adds (`forward_headers`), `apply_publish_properties` and `delete_after_reached`.

Rules: pure. Keys are RabbitMQ 3.10's (and its deprecated spellings `add-forward-headers`,
`delete-after`, `prefetch-count`, `publish-properties`, `add-timestamp-header`, read as the `src-`/`dest-`
ones), plus hutch's `dest-queue-from-x-death` (the dead-letter redrive); errors are RabbitMQ's texts (rabbit_shovel_parameters), joined by newlines, with values shown as
JSON rather than Erlang terms. Only the AMQP 0-9-1 protocol (`amqp091`) is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hutch.amqp.uri import AmqpUri, UriError, parse_uri

COMPONENT = "shovel"
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY_S = 5.0
MAX_PREFETCH = 65535  # basic.qos's prefetch-count is a short
PUBLISH_PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                          "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                          "user_id", "app_id", "cluster_id")
_DEPRECATED = {"add-forward-headers": "dest-add-forward-headers", "delete-after": "src-delete-after",
               "prefetch-count": "src-prefetch-count", "publish-properties": "dest-publish-properties",
               "add-timestamp-header": "dest-add-timestamp-header"}
_KNOWN = ("src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count", "src-delete-after",
          "src-protocol", "src-queue-args", "src-consumer-args", "dest-uri", "dest-queue", "dest-exchange",
          "dest-exchange-key", "dest-add-forward-headers", "dest-add-timestamp-header", "dest-publish-properties",
          "dest-protocol", "dest-queue-args", "ack-mode", "reconnect-delay", "dest-queue-from-x-death", *_DEPRECATED)
REDRIVE_KEY = "dest-queue-from-x-death"  # hutch's extension: each message back to the queue it died in


class ShovelDefError(ValueError):
    """The value is not a valid shovel; `problems` are RabbitMQ's texts, one per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Endpoint:
    """One side of a shovel: its URIs (the first that connects is used) and where messages go or come from.
    A URI with no host (`amqp://`) is the local node (`local`)."""

    uris: tuple[str, ...]
    queue: str | None = None
    exchange: str | None = None
    exchange_key: str | None = None
    queue_args: Mapping[str, Any] | None = None

    @property
    def local(self) -> bool:
        return is_local_uri(self.uris[0])

    def describe(self) -> dict[str, str]:
        """RabbitMQ's status fields for this side, minus the prefix (`uri`, `queue`, `exchange`, ...)."""
        out = {"uri": shown_uri(self.uris[0]), "protocol": "amqp091"}
        if self.queue is not None:
            out["queue"] = self.queue
        if self.exchange is not None:
            out["exchange"] = self.exchange
        if self.exchange_key is not None:
            out["exchange_key"] = self.exchange_key
        return out


@dataclass(frozen=True)
class ShovelDef:
    name: str
    source: Endpoint
    dest: Endpoint
    prefetch_count: int = DEFAULT_PREFETCH
    delete_after: str | int = "never"  # "never", "queue-length" or a count of messages
    ack_mode: str = "on-confirm"
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: Mapping[str, Any] | None = None
    reconnect_delay_s: float = DEFAULT_RECONNECT_DELAY_S
    redrive: bool = False  # dest-queue-from-x-death: publish to the queue of the message's latest x-death


def is_local_uri(uri: str) -> bool:
    """`amqp://` with no host (and perhaps a vhost): the node the shovel runs on, as in RabbitMQ."""
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    return rest == "" or rest.startswith("/") or rest.startswith("?")


def shown_uri(uri: str) -> str:
    """A URI as given, without its user and password (status, logs, headers), as RabbitMQ shows it:
    `amqp://user:pass@host:5672/v?heartbeat=5` -> `amqp://host:5672/v?heartbeat=5`."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return "(invalid URI)"
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, authority_end)
    return f"{scheme}://{rest[at + 1:]}" if at >= 0 else uri


def local_vhost(uri: str, default: str) -> str:
    """The vhost of a host-less URI (`amqp:///other`), else `default` (the shovel's own vhost)."""
    rest = uri.split("://", 1)[1] if "://" in uri else ""
    path = rest.split("?", 1)[0].lstrip("/")
    return parse_uri("amqp://127.0.0.1/" + path).vhost if path else default


def endpoint_uri(uri: str) -> AmqpUri:
    """The parsed form of a remote URI (raises UriError)."""
    return parse_uri(uri, heartbeat_s=60)


def _show(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _uris(key: str, value: Any, problems: list[str]) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        problems.append(f"{key} should be list, actually was {_show(value)}")
        return ()
    for item in items:
        if not isinstance(item, str):
            problems.append(f"{key} should be list of binaries, actually was {_show(value)}")
            return ()
        if is_local_uri(item) and item.startswith("amqp://"):
            continue
        try:
            parse_uri(item, require_host=True)
        except UriError as exc:
            problems.append(f"{_show(item)} not a valid URI: {exc}")
    return tuple(items)


def _string(doc: Mapping[str, Any], key: str, problems: list[str]) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append(f"{key} should be binary, actually was {_show(value)}")
        return None
    if len(value.encode()) > 255:  # an AMQP short string: a queue, exchange or routing key name
        problems.append(f"{key} should be at most 255 bytes long, actually was {len(value.encode())}")
        return None
    return value


def _bool(doc: Mapping[str, Any], key: str, problems: list[str]) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        problems.append(f"{key} should be boolean, actually was {_show(value)}")
        return False
    return value


def _table(doc: Mapping[str, Any], key: str, problems: list[str]) -> Mapping[str, Any] | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(f"{key} not a list {_show(value)}")
        return None
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_shovel(name: str, value: Any) -> ShovelDef:
    """Validate a shovel parameter's value; raises ShovelDefError with every problem found."""
    if not isinstance(value, dict):
        raise ShovelDefError([f"Shovel {name!r} must be a JSON object, actually was {_show(value)}"])
    doc: dict[str, Any] = {_DEPRECATED.get(str(k), str(k)): v for k, v in value.items()}
    problems: list[str] = []
    unknown = [k for k in value if k not in _KNOWN]
    if unknown:
        problems.append(f"Unrecognised terms [{', '.join(_show(k) for k in unknown)}] in {name}")
    for side in ("src", "dest"):
        proto = doc.get(f"{side}-protocol", "amqp091")
        if proto != "amqp091":
            problems.append(f"{side}-protocol should be one of [\"amqp091\"] (AMQP 1.0 shovels are not "
                            f"supported by hutch), actually was {_show(proto)}")
    if "src-queue" in doc and "src-exchange" in doc:
        problems.append("Cannot specify 'src-exchange' and 'src-queue'")
    elif "src-queue" not in doc and "src-exchange" not in doc:
        problems.append("Must specify 'src-exchange' or 'src-queue'")
    if "dest-queue" in doc and "dest-exchange" in doc:
        problems.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    redrive = _bool(doc, REDRIVE_KEY, problems)
    if redrive and ("dest-queue" in doc or "dest-exchange" in doc):
        problems.append(f"Cannot specify '{REDRIVE_KEY}' with 'dest-queue' or 'dest-exchange'")
    if redrive and "src-queue" not in doc:
        problems.append(f"'{REDRIVE_KEY}' needs a src-queue (the dead-letter queue)")
    for key in ("dest-uri", "src-uri"):
        if key not in doc:
            problems.append(f"Key \"{key}\" not found in {name}")
    src_uris = _uris("src-uri", doc["src-uri"], problems) if "src-uri" in doc else ()
    dest_uris = _uris("dest-uri", doc["dest-uri"], problems) if "dest-uri" in doc else ()
    prefetch = doc.get("src-prefetch-count", DEFAULT_PREFETCH)
    if not isinstance(prefetch, int) or isinstance(prefetch, bool):
        problems.append(f"src-prefetch-count should be a number, actually was {_show(prefetch)}")
        prefetch = DEFAULT_PREFETCH
    elif not 0 <= prefetch <= MAX_PREFETCH:
        problems.append(f"src-prefetch-count should be between 0 and {MAX_PREFETCH}, actually was {prefetch}")
    delete_after = doc.get("src-delete-after", "never")
    if not (delete_after in ("never", "queue-length") or
            (isinstance(delete_after, int) and not isinstance(delete_after, bool) and delete_after >= 0)):
        problems.append("src-delete-after should be a number greater than or equal to 0, \"never\" or "
                        f"\"queue-length\", actually was {_show(delete_after)}")
    ack_mode = doc.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        problems.append(f"ack-mode should be one of [{', '.join(_show(m) for m in ACK_MODES)}], "
                        f"actually was {_show(ack_mode)}")
    delay = doc.get("reconnect-delay", DEFAULT_RECONNECT_DELAY_S)
    if not _number(delay):
        problems.append(f"reconnect-delay should be a number, actually was {_show(delay)}")
    strings = {k: _string(doc, k, problems) for k in ("src-queue", "src-exchange", "src-exchange-key",
                                                      "dest-queue", "dest-exchange", "dest-exchange-key")}
    forward = _bool(doc, "dest-add-forward-headers", problems)
    timestamp = _bool(doc, "dest-add-timestamp-header", problems)
    props = _table(doc, "dest-publish-properties", problems)
    if props is not None:
        bad = [k for k in props if k not in PUBLISH_PROPERTY_NAMES]
        if bad:
            problems.append(f"dest-publish-properties: unknown properties {_show(bad)} (allowed: "
                            f"{', '.join(PUBLISH_PROPERTY_NAMES)})")
    src_args = _table(doc, "src-queue-args", problems)
    dest_args = _table(doc, "dest-queue-args", problems)
    _table(doc, "src-consumer-args", problems)
    if delete_after == "queue-length" and "src-exchange" in doc:
        problems.append("src-delete-after \"queue-length\" needs a src-queue")
    if problems:
        raise ShovelDefError(problems)
    src_key = strings["src-exchange-key"]
    source = Endpoint(src_uris, strings["src-queue"], strings["src-exchange"],
                      (src_key if src_key is not None else "#") if strings["src-exchange"] is not None else None,
                      src_args)
    dest = Endpoint(dest_uris, strings["dest-queue"], strings["dest-exchange"], strings["dest-exchange-key"],
                    dest_args)
    return ShovelDef(name, source, dest, prefetch, delete_after, ack_mode, forward, timestamp, props,
                     max(0.0, float(delay)), redrive)


def x_death_queue(headers: Mapping[str, Any] | None) -> str | None:
    """The queue a dead-lettered message died in last: the first `x-death` entry's `queue` (RabbitMQ
    keeps the most recent entry first). None when there is none."""
    deaths = (headers or {}).get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        return None
    queue = deaths[0].get("queue")
    if isinstance(queue, bytes):
        queue = queue.decode(errors="replace")
    return queue if isinstance(queue, str) else None


def forward_headers(d: ShovelDef, vhost: str, node: str) -> dict[str, Any]:
    """The `x-shovelled` entry RabbitMQ adds with `dest-add-forward-headers` (a table in an array)."""
    entry: dict[str, Any] = {"shovelled-by": node, "shovel-type": "dynamic", "shovel-name": d.name,
                             "shovel-vhost": vhost, "src-uri": shown_uri(d.source.uris[0]),
                             "dest-uri": shown_uri(d.dest.uris[0])}
    for prefix, ep in (("src", d.source), ("dest", d.dest)):
        if ep.queue is not None:
            entry[f"{prefix}-queue"] = ep.queue
        if ep.exchange is not None:
            entry[f"{prefix}-exchange"] = ep.exchange
        if ep.exchange_key is not None:
            entry[f"{prefix}-exchange-key"] = ep.exchange_key
    return entry


def apply_publish_properties(props: Any, overrides: Mapping[str, Any] | None,
                             set_attr: Callable[[Any, str, Any], None] = setattr) -> None:
    """`dest-publish-properties`: each named property replaced on the outgoing message."""
    for key, value in (overrides or {}).items():
        set_attr(props, key, value)


def delete_after_reached(d: ShovelDef, moved: int, initial_length: int | None) -> bool:
    """Has the shovel moved (acknowledged at the source) all it was told to move?"""
    if d.delete_after == "never":
        return False
    limit = initial_length if d.delete_after == "queue-length" else d.delete_after
    return limit is not None and moved >= int(limit)


__all__ = ["ACK_MODES", "COMPONENT", "Endpoint", "ShovelDef", "ShovelDefError", "apply_publish_properties",
           "delete_after_reached", "endpoint_uri", "forward_headers", "is_local_uri", "local_vhost",
           "parse_shovel", "shown_uri", "x_death_queue"]
