"""Aggregation of worker reports into per-second lines and the end-of-run summary.

Owns: `Collector` (folds the workers' tick/progress/final messages; pure: no clock, no IO) and the text
and JSON formats. An interval line is printed once every worker still reporting has sent that tick, so
a line always covers all producers and consumers of the same second.

Line format (PerfTest's, with confirmed and returned always shown):
    time: 1.000s, sent: 34012 msg/s, confirmed: 33990 msg/s, returned: 0 msg/s, received: 33800 msg/s,
    min/median/75th/95th/99th consumer latency: 41/310/402/690/910 µs
Latencies are integer microseconds; a second without deliveries shows 0/0/0/0/0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from .histogram import LatencyHistogram, WireHistogram

LINE_PERCENTILES = (0.0, 50.0, 75.0, 95.0, 99.0)
NS = 1_000_000_000


class Totals(NamedTuple):
    """A worker's counters since "go" (cumulative); last_activity_ns is a CLOCK_MONOTONIC instant.
    producers_done and consumers_done count clients that reached their -C / -D limit (ever: a consumer
    may reach it on a backlog before "go")."""

    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    returned: int = 0
    received: int = 0
    producers_done: int = 0
    consumers_done: int = 0
    last_activity_ns: int = 0

    def minus(self, base: Totals) -> Totals:
        """The message counters since `base`; the done counts and last_activity_ns as they are."""
        return Totals._make([*(a - b for a, b in zip(self[:5], base[:5], strict=True)), *self[5:]])


def _us(ns: int) -> int:
    return ns // 1000


def latency_us(histogram: LatencyHistogram, points: tuple[float, ...] = LINE_PERCENTILES) -> list[int]:
    return [_us(v) for v in histogram.percentiles(*points)]


def _prefix(run_id: str | None) -> str:
    return f"id: {run_id}, " if run_id else ""


def interval_line(run_id: str | None, t_s: float, rates: dict[str, float], latencies_us: list[int]) -> str:
    lat = "/".join(str(v) for v in latencies_us)
    return (f"{_prefix(run_id)}time: {t_s:.3f}s, sent: {rates['sent']:.0f} msg/s, "
            f"confirmed: {rates['confirmed']:.0f} msg/s, returned: {rates['returned']:.0f} msg/s, "
            f"received: {rates['received']:.0f} msg/s, "
            f"min/median/75th/95th/99th consumer latency: {lat} µs")


@dataclass(frozen=True)
class Summary:
    run_id: str | None
    duration_s: float
    totals: Totals
    latency_us: dict[str, int]
    confirms: bool
    config: dict[str, Any]

    def rate(self, count: int) -> float:
        return count / self.duration_s if self.duration_s > 0 else 0.0

    def lines(self) -> list[str]:
        t = self.totals
        p = _prefix(self.run_id)
        lat = self.latency_us
        out = [
            f"{p}summary: {self.duration_s:.3f}s, sent: {t.sent} msg, confirmed: {t.confirmed} msg, "
            f"nacked: {t.nacked} msg, returned: {t.returned} msg, received: {t.received} msg",
            f"{p}sending rate avg: {self.rate(t.sent):.0f} msg/s",
        ]
        if self.confirms:
            out.append(f"{p}confirm rate avg: {self.rate(t.confirmed):.0f} msg/s")
        out.append(f"{p}receiving rate avg: {self.rate(t.received):.0f} msg/s")
        out.append(f"{p}consumer latency min/median/75th/95th/99th/max: "
                   f"{lat['min']}/{lat['p50']}/{lat['p75']}/{lat['p95']}/{lat['p99']}/{lat['max']} µs "
                   f"({lat['samples']} samples)")
        return out

    def to_json(self) -> str:
        t = self.totals
        doc = {
            "id": self.run_id,
            **self.config,
            "duration_s": round(self.duration_s, 3),
            "sent": t.sent, "confirmed": t.confirmed, "nacked": t.nacked, "returned": t.returned,
            "received": t.received,
            "send_rate": round(self.rate(t.sent)),
            "confirm_rate": round(self.rate(t.confirmed)),
            "receive_rate": round(self.rate(t.received)),
            "latency_us": self.latency_us,
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


class Collector:
    """Folds worker messages. Invariant: intervals are emitted in order, each exactly once."""

    def __init__(self, workers: list[int], run_id: str | None = None) -> None:
        self.run_id = run_id
        self.latest = {w: Totals() for w in workers}
        self.reporting = set(workers)
        self.overall = LatencyHistogram()
        self.next_tick = 1
        self.muted = False  # set when the run is stopping: incomplete seconds are not printed
        self._pending: dict[int, dict[int, tuple[int, Totals, WireHistogram]]] = {}
        self._prev: dict[int, Totals] = {w: Totals() for w in workers}
        self._prev_t_ns = 0

    @property
    def totals(self) -> Totals:
        if not self.latest:
            return Totals()
        fields = list(zip(*self.latest.values(), strict=True))
        return Totals._make([*(sum(f) for f in fields[:7]), max(fields[7], default=0)])

    def on_tick(self, worker: int, tick: int, t_ns: int, totals: Totals, wire: WireHistogram) -> list[str]:
        self.latest[worker] = totals
        self.overall.merge_wire(wire)
        self._pending.setdefault(tick, {})[worker] = (t_ns, totals, wire)
        return self._flush()

    def on_progress(self, worker: int, totals: Totals) -> None:
        self.latest[worker] = totals

    def on_final(self, worker: int, totals: Totals, wire: WireHistogram) -> list[str]:
        self.latest[worker] = totals
        self.overall.merge_wire(wire)
        return self.on_gone(worker)

    def on_gone(self, worker: int) -> list[str]:
        """The worker sends no more ticks (it stopped, finished or died)."""
        self.reporting.discard(worker)
        return self._flush()

    def _flush(self) -> list[str]:
        lines: list[str] = []
        while not self.muted and self.reporting:
            reports = self._pending.get(self.next_tick)
            if reports is None or not self.reporting <= reports.keys():
                break
            del self._pending[self.next_tick]
            lines.append(self._interval(reports))
            self.next_tick += 1
        return lines

    def _interval(self, reports: dict[int, tuple[int, Totals, WireHistogram]]) -> str:
        t_ns = max(r[0] for r in reports.values())
        length_s = (t_ns - self._prev_t_ns) / NS or 1.0
        self._prev_t_ns = t_ns
        histogram = LatencyHistogram()
        deltas = {"sent": 0, "confirmed": 0, "returned": 0, "received": 0}
        for worker, (_, totals, wire) in reports.items():
            prev = self._prev[worker]
            self._prev[worker] = totals
            deltas["sent"] += totals.sent - prev.sent
            deltas["confirmed"] += totals.confirmed - prev.confirmed
            deltas["returned"] += totals.returned - prev.returned
            deltas["received"] += totals.received - prev.received
            histogram.merge_wire(wire)
        rates = {k: v / length_s for k, v in deltas.items()}
        return interval_line(self.run_id, t_ns / NS, rates, latency_us(histogram))

    def summary(self, duration_s: float, confirms: bool, config: dict[str, Any]) -> Summary:
        h = self.overall
        mn, p50, p75, p95, p99, mx = (_us(v) for v in h.percentiles(0, 50, 75, 95, 99, 100))
        latency = {"min": mn, "p50": p50, "p75": p75, "p95": p95, "p99": p99, "max": mx, "samples": h.total}
        return Summary(self.run_id, duration_s, self.totals, latency, confirms, config)
