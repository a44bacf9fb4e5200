"""Federation definitions and rules: upstreams, upstream sets, which upstreams a policy names, and the
`x-received-from` header that carries a message's hops (max-hops, loop detection).

Owns: `Upstream` and `parse_upstream` (the `federation-upstream` runtime parameter, RabbitMQ's keys and
defaults), `parse_upstream_set` (`federation-upstream-set`: a list of `{"upstream": NAME}`),
`upstreams_for` (a policy's `federation-upstream` / `federation-upstream-set`, `all` meaning every
upstream of the vhost), `received_from`, `may_forward` and `stamp` (the header rules), and the names of
the upstream queues a link declares (`exchange_queue_name`).

Rules: pure. A message is forwarded by an exchange link only if it has hopped fewer than `max-hops` times
(the entries of its `x-received-from`) and none of those entries names the downstream's own cluster (it
would come back where it started). Each forward prepends one entry (`uri` without its password,
`exchange`, `redelivered`, `cluster-name` of the upstream), as RabbitMQ does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hutch.amqp.uri import UriError, parse_uri
from hutch.core.shovel import ACK_MODES, DEFAULT_PREFETCH, DEFAULT_RECONNECT_DELAY_S, is_local_uri, shown_uri

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
POLICY_KEYS = (UPSTREAM, UPSTREAM_SET)
RECEIVED_FROM = "x-received-from"
_KNOWN = ("uri", "prefetch-count", "reconnect-delay", "ack-mode", "trust-user-id", "exchange", "queue", "max-hops",
          "expires", "message-ttl", "consumer-tag", "ha-policy", "bind-nowait", "queue-type",
          "resource-cleanup-mode", "channel-use-mode")


class FederationDefError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Upstream:
    name: str
    uris: tuple[str, ...]
    exchange: str | None = None  # the upstream exchange (default: the federated exchange's name)
    queue: str | None = None  # the upstream queue (default: the federated queue's name)
    max_hops: int = 1
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay_s: float = DEFAULT_RECONNECT_DELAY_S
    ack_mode: str = "on-confirm"
    expires_ms: int | None = None  # of the upstream queue of an exchange link
    message_ttl_ms: int | None = None


def _show(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _int(doc: Mapping[str, Any], key: str, minimum: int, problems: list[str]) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        problems.append(f"{key} should be a number greater than or equal to {minimum}, actually was {_show(value)}")
        return None
    return value


def parse_upstream(name: str, value: Any) -> Upstream:
    """Validate a `federation-upstream` parameter's value; raises FederationDefError with every problem."""
    if not isinstance(value, dict):
        raise FederationDefError([f"Upstream {name!r} must be a JSON object, actually was {_show(value)}"])
    problems: list[str] = []
    unknown = [k for k in value if k not in _KNOWN]
    if unknown:
        problems.append(f"Unrecognised terms [{', '.join(_show(k) for k in unknown)}] in {name}")
    uris: tuple[str, ...] = ()
    raw = value.get("uri")
    if raw is None:
        problems.append(f'Key "uri" not found in {name}')
    else:
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items or not all(isinstance(u, str) for u in items):
            problems.append(f"uri should be list, actually was {_show(raw)}")
        else:
            for item in items:
                if is_local_uri(item):
                    continue
                try:
                    parse_uri(item, require_host=True)
                except UriError as exc:
                    problems.append(f"{_show(item)} not a valid URI: {exc}")
            uris = tuple(items)
    for key in ("exchange", "queue"):
        if key in value and not isinstance(value[key], str):
            problems.append(f"{key} should be binary, actually was {_show(value[key])}")
        elif key in value and len(value[key].encode()) > 255:
            problems.append(f"{key} should be at most 255 bytes long, actually was {len(value[key].encode())}")
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        problems.append(f"ack-mode should be one of [{', '.join(_show(m) for m in ACK_MODES)}], "
                        f"actually was {_show(ack_mode)}")
    delay = value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY_S)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        problems.append(f"reconnect-delay should be a number greater than or equal to 0, actually was {_show(delay)}")
        delay = DEFAULT_RECONNECT_DELAY_S
    max_hops = _int(value, "max-hops", 1, problems)
    prefetch = _int(value, "prefetch-count", 0, problems)
    expires = _int(value, "expires", 1, problems)
    ttl = _int(value, "message-ttl", 0, problems)
    if problems:
        raise FederationDefError(problems)
    return Upstream(name, uris, value.get("exchange"), value.get("queue"), max_hops or 1,
                    DEFAULT_PREFETCH if prefetch is None else prefetch, float(delay), ack_mode, expires, ttl)


def parse_upstream_set(name: str, value: Any) -> list[str]:
    """A `federation-upstream-set`: the upstream names it lists, in order."""
    if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
        raise FederationDefError([f"Upstream set {name!r} must be a list of objects, actually was {_show(value)}"])
    problems = [f"Key \"upstream\" not found in an element of {name}" for i in value
                if not isinstance(i.get("upstream"), str)]
    if problems:
        raise FederationDefError(problems)
    return [str(i["upstream"]) for i in value]


def upstreams_for(definition: Mapping[str, Any], upstreams: Mapping[str, Upstream],
                  sets: Mapping[str, Sequence[str]]) -> list[Upstream]:
    """The upstreams a policy definition federates from: `federation-upstream` NAME, or
    `federation-upstream-set` NAME (`all`: every upstream of the vhost). Unknown names are skipped."""
    name = definition.get(UPSTREAM)
    if isinstance(name, str):
        return [upstreams[name]] if name in upstreams else []
    set_name = definition.get(UPSTREAM_SET)
    if set_name == "all":
        return [upstreams[n] for n in sorted(upstreams)]
    if isinstance(set_name, str):
        return [upstreams[n] for n in sets.get(set_name, ()) if n in upstreams]
    return []


def received_from(headers: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    found = (headers or {}).get(RECEIVED_FROM)
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def may_forward(headers: Mapping[str, Any] | None, local_cluster: str, max_hops: int) -> bool:
    """Forward this message downstream? Not past max-hops, and not back to a cluster it came from."""
    hops = received_from(headers)
    if len(hops) >= max_hops:
        return False
    return all(_text(e.get("cluster-name")) != local_cluster for e in hops)


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def stamp(headers: Mapping[str, Any] | None, uri: str, exchange: str, redelivered: bool,
          upstream_cluster: str) -> dict[str, Any]:
    """The headers with this hop's entry prepended to `x-received-from`."""
    out = dict(headers or {})
    entry = {"uri": shown_uri(uri), "exchange": exchange, "redelivered": redelivered, "cluster-name": upstream_cluster}
    out[RECEIVED_FROM] = [entry, *received_from(headers)]
    return out


def exchange_queue_name(exchange: str, local: str) -> str:
    """The upstream queue an exchange link consumes (RabbitMQ's `federation: X -> node` form)."""
    return f"federation: {exchange} -> {local}"


__all__ = ["POLICY_KEYS", "RECEIVED_FROM", "UPSTREAM", "UPSTREAM_SET", "FederationDefError", "Upstream",
           "exchange_queue_name", "may_forward", "parse_upstream", "parse_upstream_set", "received_from", "stamp",
           "upstreams_for"]
