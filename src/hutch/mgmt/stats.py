"""Message rates and sample histories: the management API's statistics collector.

Owns: `Collector`, which every `collect_statistics_interval` ms (5000 by default, as RabbitMQ) reads
the counters the broker already keeps (channels' and queues' `stat_*` attributes, connections' byte
counts, queue lengths, the node's churn and process figures) and keeps a short history per object;
`StatsView`, which formats those histories for one request as RabbitMQ does (`<field>_details` with
`rate`, and with RabbitMQ's range parameters `samples`, `avg_rate` and `avg`); and the parsing of
those parameters (`lengths_age`/`lengths_incr`, `msg_rates_*`, `data_rates_*`, `node_stats_*`).

Rules:
- Nothing here runs per message. A tick is one pass over the samples the node's management agent
  answers (`ManagementAgentPort.samples`: queues, channels with their publishes per exchange,
  connections, the closed channels' counters, churn); objects are known by name (a connection's and a
  channel's name, a queue's and an exchange's (vhost, name)), never by object, so the samples can come
  from several processes. Histories are sparse: a point is stored only
  when an object's counters changed since its last point, so idle objects cost one point each.
- Retention: RETENTION_S (600 s) per object (queue, channel, connection, exchange, vhost),
  GLOBAL_RETENTION_S (3600 s) for the node, at the sampling interval. Objects that are gone are
  forgotten at the next tick. RabbitMQ's "basic" and "global" retention policies, at one resolution.
- Derived counters: an exchange's publish_in/publish_out and a vhost's message_stats and bytes are
  channel (connection) deltas folded in at each tick, as RabbitMQ's collector does, so what a channel
  counted after the last tick and before it closed is lost (at most one interval). Node totals are
  exact: live channels plus `Node.closed_channel_stats`.
- A value shown is the live counter; `rate` is per second over the last sampling interval (0.0
  until an object has two points, or when it did not change). With a range, `samples` has one point
  every `incr` s over the last `age` s, newest first, and `rate` is over the last `incr`.
- Off the node's state: the collector only reads the samples. The agent drops a channel's per-exchange
  counts (`ServerChannel.x_counts`) for exchanges that no longer exist when it samples them, which
  bounds them. An exchange deleted and declared again under its name between two samples starts its
  totals again when its channel's counts go down.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hutch.core.counters import (
    CHANNEL_FIELDS,
    MSG_STATS,
    QUEUE_MSG_STATS,
    ZERO_CHANNEL,
    add,
)

from .errors import bad_request

RETENTION_S = 600
GLOBAL_RETENTION_S = 3600
MAX_RANGE_POINTS = 500  # RabbitMQ's ?MAX_RANGE: age / incr may not exceed it
RANGE_PREFIXES = ("lengths", "msg_rates", "data_rates", "node_stats")

# Field layouts of the stored tuples. A view names output fields as sums of tuple positions (a channel's:
# core/counters.py, which the management agent reports them by).
QUEUE_LENGTHS = (("messages", (0, 1)), ("messages_ready", (0,)), ("messages_unacknowledged", (1,)))
EXCHANGE_MSG_STATS = (("publish_in", (0,)), ("publish_out", (1,)))
BYTES = (("recv_oct", (0,)), ("send_oct", (1,)))
CHURN_KEYS = ("connections_opened", "connections_closed", "channels_opened", "channels_closed",
              "queues_declared", "queues_created", "queues_deleted")
CHURN = tuple((name, (i,)) for i, name in enumerate(
    ("connection_created", "connection_closed", "channel_created", "channel_closed", "queue_declared",
     "queue_created", "queue_deleted")))
NODE_FIELDS = ("mem_used", "fd_used", "sockets_used", "proc_used", "disk_free", "io_sync_count")
NODE_STATS = tuple((name, (i,)) for i, name in enumerate(NODE_FIELDS))

Fields = Sequence[tuple[str, tuple[int, ...]]]


# -- histories --------------------------------------------------------------------------------------


class History:
    """Sparse samples of one object: (wall ms, tuple of counters), a point only when they changed.

    Invariant: the value at any time t >= ts[0] is values[i] for the last i with ts[i] <= t; points are
    dropped from the front only while the next one is itself older than the retention horizon."""

    __slots__ = ("ts", "values")

    def __init__(self) -> None:
        self.ts: deque[float] = deque()
        self.values: deque[tuple[int, ...]] = deque()

    def record(self, now_ms: float, values: tuple[int, ...], horizon_ms: float) -> None:
        if self.values and self.values[-1] == values:
            return
        self.ts.append(now_ms)
        self.values.append(values)
        ts = self.ts
        while len(ts) >= 2 and ts[1] <= horizon_ms:
            ts.popleft()
            self.values.popleft()

    def last(self) -> tuple[int, ...] | None:
        return self.values[-1] if self.values else None

    def at(self, t_ms: float) -> tuple[int, ...] | None:
        i = bisect_right(self.ts, t_ms) - 1
        return self.values[i] if i >= 0 else None


def combined(histories: Iterable[History]) -> History:
    """One history summing several (a non-monitor's overview: the sum of its vhosts)."""
    hs = [h for h in histories if h.values]
    out = History()
    if not hs:
        return out
    width = len(hs[0].values[0])
    for t in sorted({t for h in hs for t in h.ts}):
        total = (0,) * width
        for h in hs:
            v = h.at(t)
            if v is not None:
                total = add(total, v)
        out.ts.append(t)
        out.values.append(total)
    return out


# -- the collector ----------------------------------------------------------------------------------


class Collector:
    """Samples the node every interval (driven by http.start_management's timer, or by tests)."""

    def __init__(self, interval_ms: int = 5000) -> None:
        self.interval_ms = interval_ms
        self.last_ms = 0.0
        self.prev_ms = 0.0
        self.queues: dict[tuple[str, str], History] = {}  # by (vhost, queue name)
        self.channels: dict[str, History] = {}  # by channel name ("<connection name> (<number>)")
        self.connections: dict[str, History] = {}  # by connection name
        self.exchanges: dict[tuple[str, str], History] = {}  # (vhost, exchange) -> (publish_in, publish_out)
        self.vhost_lengths: dict[str, History] = {}  # (ready, unacked)
        self.vhost_msgs: dict[str, History] = {}  # CHANNEL_FIELDS, folded from channel deltas
        self.vhost_bytes: dict[str, History] = {}  # (recv_oct, send_oct), folded from connection deltas
        self.node_msgs = History()  # CHANNEL_FIELDS: closed channels + live ones
        self.node_lengths = History()
        self.node_churn = History()
        self.node_figures = History()  # NODE_FIELDS
        self._x_totals: dict[tuple[str, str], list[int]] = {}
        self._ch_x: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}  # channel -> its last publishes
        self._vhost_msg_totals: dict[str, tuple[int, ...]] = {}
        self._vhost_byte_totals: dict[str, tuple[int, int]] = {}
        self.ticks = 0

    def tick(self, samples: Mapping[str, Any], vhosts: Collection[str], exchange_exists: Callable[[str, str], bool],
             now_ms: float, node_figures: Sequence[int] | None = None) -> None:
        """Take one sample of everything: `samples` as the node's management agent answers them
        (`ManagementAgentPort.samples`), `vhosts` the node's vhost names, `exchange_exists(vhost, name)`
        whether an exchange still exists. `node_figures` are NODE_FIELDS (process figures read by the
        caller, system.py, so this module does no IO)."""
        self.prev_ms, self.last_ms = self.last_ms, now_ms
        self.ticks += 1
        horizon = now_ms - RETENTION_S * 1000
        self._sample_queues(samples["queues"], vhosts, now_ms, horizon)
        live = self._sample_channels(samples["channels"], now_ms, horizon)
        self._sample_connections(samples["connections"], now_ms, horizon)
        self._sample_exchanges(exchange_exists, now_ms, horizon)
        for name, totals in self._vhost_msg_totals.items():
            self.vhost_msgs.setdefault(name, History()).record(now_ms, totals, horizon)
        for name, pair in self._vhost_byte_totals.items():
            self.vhost_bytes.setdefault(name, History()).record(now_ms, pair, horizon)
        for table in (self.vhost_msgs, self.vhost_bytes, self.vhost_lengths,
                      self._vhost_msg_totals, self._vhost_byte_totals):
            for name in [n for n in table if n not in vhosts]:
                del table[name]
        global_horizon = now_ms - GLOBAL_RETENTION_S * 1000
        self.node_msgs.record(now_ms, add(tuple(samples["closed"]), live), global_horizon)
        churn = samples["churn"]
        self.node_churn.record(now_ms, tuple(churn.get(k, 0) for k in CHURN_KEYS), global_horizon)
        if node_figures is not None:
            self.node_figures.record(now_ms, tuple(node_figures), global_horizon)

    def _sample_queues(self, rows: Sequence[Sequence[Any]], vhosts: Collection[str], now_ms: float,
                       horizon: float) -> None:
        old = self.queues
        new: dict[tuple[str, str], History] = {}
        lengths = {name: [0, 0] for name in vhosts}
        for row in rows:
            key = (row[0], row[1])
            values = tuple(row[2:])
            per_vhost = lengths.get(key[0])
            if per_vhost is not None:
                per_vhost[0] += values[0]
                per_vhost[1] += values[1]
            h = old.get(key)
            if h is None:
                h = History()
            h.record(now_ms, values, horizon)
            new[key] = h
        for name, (ready, unacked) in lengths.items():
            self.vhost_lengths.setdefault(name, History()).record(now_ms, (ready, unacked), horizon)
        self.queues = new
        ready_all = sum(r for r, _ in lengths.values())
        unacked_all = sum(u for _, u in lengths.values())
        self.node_lengths.record(now_ms, (ready_all, unacked_all), now_ms - GLOBAL_RETENTION_S * 1000)

    def _sample_channels(self, rows: Sequence[Sequence[Any]], now_ms: float, horizon: float) -> tuple[int, ...]:
        """Channel histories, vhost message totals and exchange counts; returns the live channels' sum."""
        old = self.channels
        old_x = self._ch_x
        new: dict[str, History] = {}
        new_x: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}
        live = ZERO_CHANNEL
        vtotals = self._vhost_msg_totals
        for key, vhost, counters, publishes in rows:
            values = tuple(counters)
            live = add(live, values)
            h = old.get(key)
            before = ZERO_CHANNEL
            if h is None:
                h = History()
            elif h.values:
                before = h.values[-1]
            if values != before and vhost is not None:
                vtotals[vhost] = add(vtotals.get(vhost, ZERO_CHANNEL), tuple(
                    a - b for a, b in zip(values, before, strict=True)))
            h.record(now_ms, values, horizon)
            new[key] = h
            new_x[key] = self._fold_exchanges(publishes, old_x.get(key, {}))
        self.channels = new
        self._ch_x = new_x
        return live

    def _fold_exchanges(self, publishes: Sequence[Sequence[Any]], before: Mapping[tuple[str, str], tuple[int, int]]
                        ) -> dict[tuple[str, str], tuple[int, int]]:
        """Credit each exchange with what one channel published to it since the last sample."""
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        totals = self._x_totals
        for vhost, name, p, r in publishes:
            key = (vhost, name)
            counts[key] = (p, r)
            bp, br = before.get(key, (0, 0))
            if p < bp or r < br:  # another exchange of the same name since the last sample
                bp = br = 0
            if p != bp or r != br:
                entry = totals.get(key)
                if entry is None:
                    entry = totals[key] = [0, 0]
                entry[0] += p - bp
                entry[1] += r - br
        return counts

    def _sample_connections(self, rows: Sequence[Sequence[Any]], now_ms: float, horizon: float) -> None:
        old = self.connections
        new: dict[str, History] = {}
        btotals = self._vhost_byte_totals
        for name, vhost, recv_oct, send_oct in rows:
            values = (recv_oct, send_oct)
            h = old.get(name)
            before: tuple[int, ...] = (0, 0)
            if h is None:
                h = History()
            elif h.values:
                before = h.values[-1]
            if values != before and vhost is not None:
                recv, send = btotals.get(vhost, (0, 0))
                btotals[vhost] = (recv + values[0] - before[0], send + values[1] - before[1])
            h.record(now_ms, values, horizon)
            new[name] = h
        self.connections = new

    def _sample_exchanges(self, exchange_exists: Callable[[str, str], bool], now_ms: float, horizon: float) -> None:
        old = self.exchanges
        new: dict[tuple[str, str], History] = {}
        totals = self._x_totals
        for key in list(totals):
            if not exchange_exists(*key):
                del totals[key]
                continue
            h = old.get(key)
            if h is None:
                h = History()
            h.record(now_ms, (totals[key][0], totals[key][1]), horizon)
            new[key] = h
        self.exchanges = new

    def exchange_totals(self, key: tuple[str, str]) -> tuple[int, int]:
        entry = self._x_totals.get(key)
        return (entry[0], entry[1]) if entry is not None else (0, 0)

    def vhost_msg_totals(self, name: str) -> tuple[int, ...]:
        return self._vhost_msg_totals.get(name, ZERO_CHANNEL)

    def vhost_byte_totals(self, name: str) -> tuple[int, int]:
        return self._vhost_byte_totals.get(name, (0, 0))


# -- ranges and formatting --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Range:
    """RabbitMQ's #range: sample times first, first + incr, ..., last (wall ms)."""

    first: int
    last: int
    incr: int


def parse_ranges(query: Mapping[str, str], now_ms: float) -> dict[str, Range]:
    """The `<prefix>_age` / `<prefix>_incr` pairs present in the query (seconds), as rabbit_mgmt_util."""
    out: dict[str, Range] = {}
    for prefix in RANGE_PREFIXES:
        age_text = query.get(prefix + "_age")
        incr_text = query.get(prefix + "_incr")
        if age_text is None or incr_text is None:
            continue
        try:
            age, incr = int(age_text), int(incr_text)
        except ValueError:
            age = incr = 0
        if age <= 0 or incr <= 0 or age // incr > MAX_RANGE_POINTS:
            raise bad_request(f"Invalid range parameters: age {age_text}, incr {incr_text}")
        incr_ms = incr * 1000
        last = int(now_ms) // incr_ms * incr_ms
        out[prefix] = Range(last - age * 1000, last, incr_ms)
    return out


def _value(values: Sequence[int], idx: tuple[int, ...]) -> int:
    if len(idx) == 1:
        return values[idx[0]]
    return sum(values[i] for i in idx)


class StatsView:
    """The statistics of one request: the collector's histories, formatted for its range parameters."""

    def __init__(self, collector: Collector, ranges: Mapping[str, Range] | None = None) -> None:
        self.collector = collector
        self.ranges = ranges or {}

    def fields(self, h: History | None, fields: Fields, current: Sequence[int] | None, prefix: str,
               out: dict[str, Any]) -> dict[str, Any]:
        """Add `name` and `name_details` for each field to `out` (values from `current`, else the last
        point). Returns `out`."""
        c = self.collector
        rng = self.ranges.get(prefix)
        last = h.last() if h is not None else None
        values = current if current is not None else (last or ())
        rates: Sequence[float] | None = None
        if h is not None and rng is None and len(h.ts) >= 2 and h.ts[-1] == c.last_ms and c.last_ms > c.prev_ms:
            before = h.values[-2]
            dt_s = (c.last_ms - c.prev_ms) / 1000
            rates = [(a - b) / dt_s for a, b in zip(h.values[-1], before, strict=True)]
        points = _range_points(h, rng) if rng is not None and h is not None else None
        for name, idx in fields:
            out[name] = _value(values, idx) if values else 0
            details: dict[str, Any] = {"rate": round(sum(rates[i] for i in idx), 2) if rates else 0.0}
            if rng is not None:
                _range_details(details, points or [], idx, rng)
            out[name + "_details"] = details
        return out

    # -- per object kind ---------------------------------------------------------------------------

    def queue(self, key: tuple[str, str], values: Sequence[int], out: dict[str, Any]) -> None:
        """A queue's lengths and message_stats with rates: `values` in core/counters.py's `queue_values`
        order, `key` its (vhost, name)."""
        h = self.collector.queues.get(key)
        self.fields(h, QUEUE_LENGTHS, values, "lengths", out)
        out["message_stats"] = self.fields(h, QUEUE_MSG_STATS, values, "msg_rates", {})

    def channel(self, name: str, values: Sequence[int]) -> dict[str, Any]:
        """A channel's message_stats with rates: its counters `values` in CHANNEL_FIELDS order."""
        return self.fields(self.collector.channels.get(name), MSG_STATS, values, "msg_rates", {})

    def connection(self, name: str, out: dict[str, Any]) -> None:
        """A connection's `recv_oct`/`send_oct` (as the agent reported them in `out`) with rates."""
        self.fields(self.collector.connections.get(name), BYTES, (out["recv_oct"], out["send_oct"]), "data_rates",
                    out)

    def exchange(self, key: tuple[str, str]) -> dict[str, Any]:
        """An exchange's message_stats with rates, by its (vhost, name)."""
        c = self.collector
        return self.fields(c.exchanges.get(key), EXCHANGE_MSG_STATS, c.exchange_totals(key), "msg_rates", {})

    def vhost(self, name: str, lengths: Sequence[int], out: dict[str, Any]) -> None:
        c = self.collector
        self.fields(c.vhost_lengths.get(name), QUEUE_LENGTHS, lengths, "lengths", out)
        self.fields(c.vhost_bytes.get(name), BYTES, c.vhost_byte_totals(name), "data_rates", out)
        out["message_stats"] = self.fields(c.vhost_msgs.get(name), MSG_STATS, c.vhost_msg_totals(name),
                                           "msg_rates", {})

    def overview(self, vhosts: Sequence[str] | None, node_totals: Sequence[int], lengths: Sequence[int],
                 churn: Sequence[int]) -> dict[str, Any]:
        """`message_stats`, `queue_totals` and `churn_rates` of /api/overview: node-wide (`vhosts` None)
        or summed over the caller's vhosts."""
        c = self.collector
        if vhosts is None:
            msgs_h, lengths_h = c.node_msgs, c.node_lengths
            msgs = node_totals
        else:
            msgs_h = combined(c.vhost_msgs[v] for v in vhosts if v in c.vhost_msgs)
            lengths_h = combined(c.vhost_lengths[v] for v in vhosts if v in c.vhost_lengths)
            msgs = ZERO_CHANNEL
            for v in vhosts:
                msgs = add(msgs, c.vhost_msg_totals(v))
        return {
            "message_stats": self.fields(msgs_h, MSG_STATS, msgs, "msg_rates", {}),
            "queue_totals": self.fields(lengths_h, QUEUE_LENGTHS, lengths, "lengths", {}),
            "churn_rates": self.fields(c.node_churn, CHURN, churn, "msg_rates", {}),
        }

    def node(self, figures: Sequence[int], out: dict[str, Any]) -> None:
        self.fields(self.collector.node_figures, NODE_STATS, figures, "node_stats", out)


def _range_points(h: History, rng: Range) -> list[tuple[int, tuple[int, ...]]]:
    """(time, values) at each range step the history covers, oldest first."""
    if not h.ts:
        return []
    first = h.ts[0]
    out = []
    for t in range(rng.first, rng.last + 1, rng.incr):
        if t >= first:
            v = h.at(t)
            if v is not None:
                out.append((t, v))
    return out


def _range_details(details: dict[str, Any], points: list[tuple[int, tuple[int, ...]]], idx: tuple[int, ...],
                   rng: Range) -> None:
    """rabbit_mgmt_stats:format_range for one field: rate over the last step, samples newest first,
    and avg_rate / avg when there are two samples or more."""
    series = [(t, _value(v, idx)) for t, v in points]
    if len(series) >= 2:
        (t0, v0), (t1, v1) = series[-2], series[-1]
        details["rate"] = round((v1 - v0) * 1000 / (t1 - t0), 2)
    details["samples"] = [{"sample": v, "timestamp": t} for t, v in reversed(series)]
    if len(series) > 1:
        (t_old, v_old), (t_new, v_new) = series[0], series[-1]
        details["avg_rate"] = round((v_new - v_old) * 1000 / (t_new - t_old), 2)
        details["avg"] = round(sum(v for _, v in series) / len(series), 2)


def sample_retention_policies() -> dict[str, list[int]]:
    """What /api/overview tells the web UI it can chart (seconds of history by policy)."""
    return {"global": [RETENTION_S, GLOBAL_RETENTION_S], "basic": [RETENTION_S], "detailed": [RETENTION_S]}


__all__ = [
    "CHANNEL_FIELDS",
    "Collector",
    "History",
    "Range",
    "StatsView",
    "parse_ranges",
    "sample_retention_policies",
]
