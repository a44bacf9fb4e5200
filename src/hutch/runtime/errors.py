"""What a clustered node tells clients when the metadata store cannot answer.

Owns: `ClusterUnavailable`, the set of AMQP methods that change (or must see the newest) cluster
metadata, and RabbitMQ 4.x's error text for a metadata operation that timed out (541 INTERNAL_ERROR,
"failed to declare queue 'q' in vhost '/' because the operation timed out").
"""

from __future__ import annotations

from typing import Any

# (class id, method id): exchange.declare/delete/bind/unbind, queue.declare/bind/delete/unbind
CLUSTER_METHODS = frozenset({(40, 10), (40, 20), (40, 30), (40, 40), (50, 10), (50, 20), (50, 40), (50, 50)})

_VERBS = {
    (40, 10): ("declare", "exchange"), (40, 20): ("delete", "exchange"), (40, 30): ("bind", "exchange"),
    (40, 40): ("unbind", "exchange"), (50, 10): ("declare", "queue"), (50, 20): ("bind", "queue"),
    (50, 40): ("delete", "queue"), (50, 50): ("unbind", "queue"),
}


class ClusterUnavailable(Exception):
    """No majority (or no leader) answered in time: the metadata operation did not happen."""


def cluster_timeout_text(method: Any, channel: Any) -> str:
    verb, kind = _VERBS.get((method.CLASS_ID, method.METHOD_ID), ("change", "object"))
    name = getattr(method, "queue", None) if kind == "queue" else None
    if name is None:
        name = getattr(method, "exchange", None) or getattr(method, "destination", "")
    vhost = getattr(getattr(channel, "vhost", None), "name", "/")
    return f"failed to {verb} {kind} '{name}' in vhost '{vhost}' because the operation timed out"
