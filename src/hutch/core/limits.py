"""Virtual host and user limits (RabbitMQ's `rabbit_vhost_limit` and the user limits of
`rabbit_auth_backend_internal`), as pure data and checks.

Owns: the limit names each scope knows, the validation of a limits document (with RabbitMQ's texts),
the `LimitStore` (vhost -> limits, user -> limits), the decision whether one more connection, channel
or queue is over a limit, the other nodes' reported counts (`PeerCounts`: limits hold cluster-wide),
and the refusal texts a client sees. No IO; the runtime
(`hutch.runtime.broker.limits`) records changes and asks these checks at the right moments.

Rules (RabbitMQ 4.x):
- vhost limits: `max-connections`, `max-queues`; user limits: `max-connections`, `max-channels`.
  Values are integers; a negative value means "no limit", 0 forbids (no connection, no queue,
  no channel at all), N > 0 allows N.
- A new connection is refused when the vhost (or user) already has `limit` open connections;
  likewise channels of a user and queues of a vhost (`count >= limit`).
- A limits document is a JSON object of known names to integers; anything else is refused with
  RabbitMQ's rabbit_parameter_validation texts ("max-queues should be a number, actually was ...",
  "Unrecognised terms [...] in limits").
- An empty document means "no limits" (the entry is dropped). Invariant: no entry of the store is
  empty, so listing the store lists exactly the vhosts and users that carry a limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")
VHOST_SCOPE = "limits"  # RabbitMQ's name of the vhost-limits parameter (and of its validation)
USER_SCOPE = "user-limits"
MAX_VALUE = 2**63 - 1  # the definitions log stores 64-bit integers
MIN_VALUE = -(2**63)


class LimitError(ValueError):
    """A limits document that cannot be accepted; `str()` is RabbitMQ's one-line reason."""


def _erlang(value: Any) -> str:
    """A JSON value as Erlang's ~tp prints its decoded term (what RabbitMQ's texts show)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, list):
        return "[" + ",".join(_erlang(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{_erlang(k)} => {_erlang(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def validate(doc: Any, names: tuple[str, ...], scope: str) -> dict[str, int]:
    """A checked copy of a limits document for one scope (`VHOST_LIMITS`/`VHOST_SCOPE` or
    `USER_LIMITS`/`USER_SCOPE`). An empty list counts as an empty object (RabbitMQ 3.x exports)."""
    if doc == []:
        return {}
    if not isinstance(doc, dict):
        raise LimitError(f"{scope} not a list {_erlang(doc)}")
    unknown = [(k, v) for k, v in doc.items() if k not in names]
    if unknown:
        terms = ",".join(f"{{{_erlang(k)},{_erlang(v)}}}" for k, v in unknown)
        raise LimitError(f"Unrecognised terms [{terms}] in {scope}")
    limits: dict[str, int] = {}
    for name in names:
        if name not in doc:
            continue
        value = doc[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise LimitError(f"{name} should be a number, actually was {_erlang(value)}")
        if not MIN_VALUE <= value <= MAX_VALUE:
            raise LimitError(f"{name} should be a 64-bit integer, actually was {value}")
        limits[name] = value
    return limits


def validate_vhost_limits(doc: Any) -> dict[str, int]:
    return validate(doc, VHOST_LIMITS, VHOST_SCOPE)


def validate_user_limits(doc: Any) -> dict[str, int]:
    return validate(doc, USER_LIMITS, USER_SCOPE)


def effective(limits: Mapping[str, int] | None, name: str) -> int | None:
    """The limit in force: None when there is none (absent or negative), else 0 or more."""
    if not limits:
        return None
    value = limits.get(name)
    if value is None or value < 0:
        return None
    return value


def reached(limit: int | None, count: int) -> bool:
    """Would one more object go past `limit`, with `count` there already? (`count >= limit`)"""
    assert count >= 0, count
    return limit is not None and count >= limit


class LimitStore:
    """The limits of every vhost and user that has one. Not thread-safe (the event loop's)."""

    def __init__(self) -> None:
        self.vhosts: dict[str, dict[str, int]] = {}
        self.users: dict[str, dict[str, int]] = {}

    # -- reading -----------------------------------------------------------------------------------
    def vhost(self, name: str) -> dict[str, int]:
        return dict(self.vhosts.get(name, {}))

    def user(self, name: str) -> dict[str, int]:
        return dict(self.users.get(name, {}))

    def vhost_limit(self, vhost: str, name: str) -> int | None:
        return effective(self.vhosts.get(vhost), name)

    def user_limit(self, user: str, name: str) -> int | None:
        return effective(self.users.get(user), name)

    def iter_vhosts(self) -> Iterator[tuple[str, dict[str, int]]]:
        for name in sorted(self.vhosts):
            yield name, dict(self.vhosts[name])

    def iter_users(self) -> Iterator[tuple[str, dict[str, int]]]:
        for name in sorted(self.users):
            yield name, dict(self.users[name])

    # -- changing: each returns whether anything changed ---------------------------------------------
    @staticmethod
    def _put(table: dict[str, dict[str, int]], key: str, limits: Mapping[str, int]) -> bool:
        old = table.get(key, {})
        new = dict(limits)
        if old == new:
            return False
        if new:
            table[key] = new
        else:
            del table[key]
        assert key not in table or table[key], "Invariant: no empty entry"
        return True

    def set_vhost(self, vhost: str, limits: Mapping[str, int]) -> bool:
        """Replace a vhost's limits (rabbitmqctl set_vhost_limits replaces the whole document)."""
        return self._put(self.vhosts, vhost, limits)

    def set_user(self, user: str, limits: Mapping[str, int]) -> bool:
        """Replace a user's limits."""
        return self._put(self.users, user, limits)

    def prune(self, vhosts: set[str], users: set[str]) -> bool:
        """Forget the limits of vhosts and users that no longer exist (they die with them)."""
        gone_v = [v for v in self.vhosts if v not in vhosts]
        gone_u = [u for u in self.users if u not in users]
        for v in gone_v:
            del self.vhosts[v]
        for u in gone_u:
            del self.users[u]
        return bool(gone_v or gone_u)


# -- counts of the other nodes of a cluster ---------------------------------------------------------

VHOST_CONNECTIONS, USER_CONNECTIONS, USER_CHANNELS = 0, 1, 2
"""The kinds of a count row [kind, name, count] (vhost connections, user connections, user channels)."""
COUNT_KINDS = (VHOST_CONNECTIONS, USER_CONNECTIONS, USER_CHANNELS)
MAX_COUNT_ROWS = 100_000
"""Rows one node's report may carry; a longer one is refused (a peer's input is bounded like any)."""

CountKey = tuple[int, str]


class PeerCounts:
    """What the other nodes of a cluster last reported of their open connections and channels, per
    limited vhost or user, and their sums. Each report replaces the sender's whole previous one; a node
    that goes down is dropped. Invariant: `totals` is the sum over `by_peer`, without zero entries."""

    def __init__(self) -> None:
        self.by_peer: dict[str, dict[CountKey, int]] = {}
        self.totals: dict[CountKey, int] = {}

    def total(self, kind: int, name: str) -> int:
        return self.totals.get((kind, name), 0)

    def replace(self, peer: str, rows: list[Any]) -> None:
        """`peer`'s report: rows [kind, name, count]. ValueError (nothing changed) for a malformed one."""
        if type(rows) is not list or len(rows) > MAX_COUNT_ROWS:
            raise ValueError("limit counts: not a list of at most MAX_COUNT_ROWS rows")
        fresh: dict[CountKey, int] = {}
        for row in rows:
            if type(row) is not list or len(row) != 3 or row[0] not in COUNT_KINDS or type(row[1]) is not str \
                    or type(row[2]) is not int or row[2] < 0:
                raise ValueError(f"limit counts: bad row {row!r:.80}")
            if row[2]:
                fresh[(row[0], row[1])] = row[2]
        self.drop(peer)
        if fresh:
            self.by_peer[peer] = fresh
            for key, n in fresh.items():
                self.totals[key] = self.totals.get(key, 0) + n

    def drop(self, peer: str) -> None:
        old = self.by_peer.pop(peer, None)
        if not old:
            return
        for key, n in old.items():
            left = self.totals[key] - n
            assert left >= 0, "Invariant: totals are the sum of the reports"
            if left:
                self.totals[key] = left
            else:
                del self.totals[key]


# -- refusals (the texts and codes RabbitMQ 4.x gives) ----------------------------------------------


def vhost_connections_refused(vhost: str, user: str, limit: int) -> str:
    """530 NOT_ALLOWED on connection.open (rabbit_reader:is_over_vhost_connection_limit)."""
    return f"access to vhost '{vhost}' refused for user '{user}': connection limit ({limit}) is reached"


def user_connections_refused(user: str, limit: int) -> str:
    """530 NOT_ALLOWED on connection.open (rabbit_reader:is_over_user_connection_limit)."""
    return f"connection refused for user '{user}': user connection limit ({limit}) is reached"


def user_channels_refused(user: str, limit: int) -> str:
    """530 NOT_ALLOWED on channel.open (rabbit_reader:is_over_limits)."""
    return f"number of channels opened for user '{user}' has reached the maximum allowed user limit of {limit}"


def queues_refused(queue: str, vhost: str, limit: int) -> str:
    """406 PRECONDITION_FAILED on queue.declare (rabbit_queue_type:check_vhost_queue_limit)."""
    return f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached"


def import_refused(vhost: str, adding: int, limit: int, existing: int) -> str:
    """A definitions import that would take a vhost past max-queues (rabbit_definitions)."""
    return (f'Adding {adding} queue(s) to virtual host "{vhost}" would exceed the limit of {limit} queue(s). '
            f"This virtual host currently has {existing} queue(s) defined. Import aborted!")


__all__ = [
    "COUNT_KINDS",
    "MAX_COUNT_ROWS",
    "MAX_VALUE",
    "USER_CHANNELS",
    "USER_CONNECTIONS",
    "VHOST_CONNECTIONS",
    "PeerCounts",
    "USER_LIMITS",
    "USER_SCOPE",
    "VHOST_LIMITS",
    "VHOST_SCOPE",
    "LimitError",
    "LimitStore",
    "effective",
    "import_refused",
    "queues_refused",
    "reached",
    "user_channels_refused",
    "user_connections_refused",
    "validate",
    "validate_user_limits",
    "validate_vhost_limits",
    "vhost_connections_refused",
]
