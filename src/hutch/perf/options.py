"""Command-line options and AMQP URIs for hutch-perf.

Owns: `parse_args(argv) -> PerfOptions`, `parse_uri(text) -> AmqpUri` and `parse_queue_args`.
Rule: pure functions; every bad input raises `UsageError` with a one-line message (the CLI prints it and
exits 2). Options are resolved once here into a frozen object; nothing downstream re-reads argv.
The option letters are PerfTest's wherever PerfTest has one (`-x -y -s -c -A -a -q -f -u -e -t -k -z -r
-C -D`), so a PerfTest command line mostly works as is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hutch.amqp import uri as amqp_uri
from hutch.amqp.uri import AmqpUri

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/%2F"
PORT_ENV = "HUTCH_AMQP_PORT"  # hutch-server's variable: without --uri, hutch-perf goes to the same port
TIMESTAMP_BYTES = 8  # the send timestamp every message body starts with
FLAGS = ("persistent", "mandatory")
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
MAX_SHORTSTR = 255


class UsageError(Exception):
    """A bad command line or URI: one line of text, exit status 2."""


def parse_uri(text: str) -> AmqpUri:
    """Parse an AMQP URI (heartbeat 0 unless given). Raises UsageError."""
    try:
        return amqp_uri.parse_uri(text)
    except amqp_uri.UriError as exc:
        raise UsageError(str(exc)) from None


_INT = re.compile(r"-?\d+\Z")


def parse_queue_args(text: str) -> dict[str, Any]:
    """`k=v,k=v` -> dict. Integers become ints, true/false become booleans, the rest stays a string."""
    args: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        value = value.strip()
        if not sep or not key:
            raise UsageError(f"bad --queue-args item {item!r}: expected key=value")
        if _INT.match(value):
            args[key] = int(value)
        elif value.lower() in ("true", "false"):
            args[key] = value.lower() == "true"
        else:
            args[key] = value
    return args


@dataclass(frozen=True)
class PerfOptions:
    """Everything a run needs, validated. Invariant: `multi_ack_every <= qos` when both are set."""

    uri: AmqpUri = field(default_factory=AmqpUri)
    uri_text: str = DEFAULT_URI
    producers: int = 1
    consumers: int = 1
    size_bytes: int = 12
    confirm_window: int = 0
    multi_ack_every: int = 0
    autoack: bool = False
    qos: int = 0
    persistent: bool = False
    mandatory: bool = False
    priorities: int = 0
    queue_args: dict[str, Any] = field(default_factory=dict)
    quorum: bool = False
    queue: str | None = None  # None: a run-private queue hutch-perf-<pid>, deleted at the end
    exchange: str = ""
    exchange_type: str = "direct"
    routing_key: str | None = None
    time_s: float = 0.0  # 0: until Ctrl-C or -C is done
    rate: float = 0.0  # msg/s per producer, 0: unlimited
    pmessages: int = 0  # per producer, 0: unlimited
    cmessages: int = 0  # per consumer, 0: unlimited
    json: bool = False
    run_id: str | None = None
    processes: int = 0  # max OS processes per role, 0: number of CPUs
    queue_pattern: str | None = None  # e.g. "perf-%d": queues pattern % from .. pattern % to
    queue_pattern_from: int = 1
    queue_pattern_to: int = 0

    def queue_name(self, pid: int) -> str:
        if self.queue_pattern is not None:
            return self.queue_pattern % self.queue_pattern_from
        return self.queue if self.queue is not None else f"hutch-perf-{pid}"

    def pattern_queues(self) -> tuple[str, ...]:
        """Every queue of `--queue-pattern` (empty without one)."""
        if self.queue_pattern is None:
            return ()
        return tuple(self.queue_pattern % i for i in range(self.queue_pattern_from, self.queue_pattern_to + 1))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="hutch-perf",
        description="Load generator for AMQP 0-9-1 brokers (PerfTest-style). Producers and consumers "
        "run in separate OS processes; one line of rates and latencies is printed per second.",
    )
    a = p.add_argument
    a("--uri", default=None, help=f"AMQP URI, amqp:// or amqps:// (default: {DEFAULT_URI.replace('%', '%%')}, on the port "
      f"{PORT_ENV} names when it is set)")
    a("--cacert", default=None, metavar="FILE",
      help="amqps: CA certificate(s) to verify the broker with (the URI's cacertfile; default: the system's)")
    a("-x", "--producers", type=_nonneg_int, default=1, help="producer count (default 1)")
    a("-y", "--consumers", type=_nonneg_int, default=1, help="consumer count (default 1)")
    a("-s", "--size", type=_nonneg_int, default=12, help="message body size in bytes (default 12, min 8)")
    a("-c", "--confirm", type=_nonneg_int, default=0, metavar="N",
      help="publisher confirms with at most N unconfirmed messages per producer (0: no confirms)")
    a("-A", "--multi-ack-every", type=_nonneg_int, default=0, metavar="N",
      help="ack with multiple=true every N messages (0: ack each message)")
    a("-a", "--autoack", action="store_true", help="consume with no-ack")
    a("-q", "--qos", type=_nonneg_int, default=0, metavar="N", help="consumer prefetch count (0: unlimited)")
    a("-f", "--flag", action="append", default=[], metavar="FLAG",
      help="message flag, repeatable: persistent (delivery_mode 2), mandatory")
    a("--queue-args", default=None, metavar="K=V,...", help="queue arguments, e.g. x-max-length=1000")
    a("--priorities", type=_nonneg_int, default=0, metavar="N",
      help="publish with message priorities 0..N-1 in turn (for x-max-priority queues; 0: no priority)")
    a("--quorum-queue", action="store_true", help="declare a durable quorum queue")
    a("-u", "--queue", default=None,
      help="queue name (default: hutch-perf-<pid>, deleted at the end); a named queue is kept, and one that "
      "exists (e.g. declared durable beforehand) is used as it is unless --queue-args asks for properties")
    a("--queue-pattern", default=None, metavar="PATTERN",
      help="several queues, named PATTERN %% i (e.g. perf-%%d) for i in --queue-pattern-from..--queue-pattern-to; "
      "producer k publishes to queue k mod count, consumer k consumes it (PerfTest's option)")
    a("--queue-pattern-from", type=_nonneg_int, default=1, metavar="N", help="first index (default 1)")
    a("--queue-pattern-to", type=_nonneg_int, default=0, metavar="N", help="last index, inclusive")
    a("-e", "--exchange", default="", help="exchange to publish to (default: the default exchange)")
    a("-t", "--type", default="direct", dest="exchange_type", choices=EXCHANGE_TYPES,
      help="exchange type if the exchange must be declared (default direct)")
    a("-k", "--routing-key", default=None, help="routing key (default: the queue name)")
    a("-z", "--time", type=_nonneg_float, default=0.0, metavar="SECONDS", help="run time (default: until Ctrl-C)")
    a("-r", "--rate", type=_nonneg_float, default=0.0, metavar="N",
      help="publishing rate limit per producer in msg/s (0: unlimited)")
    a("-C", "--pmessages", type=_nonneg_int, default=0, metavar="N", help="messages per producer, then stop")
    a("-D", "--cmessages", type=_nonneg_int, default=0, metavar="N",
      help="messages per consumer, then stop; the run ends when all producers and consumers are done "
      "(a producer without -C is never done)")
    a("--json", action="store_true", help="print a JSON summary line on stdout (per-second lines go to stderr)")
    a("--id", default=None, dest="run_id", help="label printed on every line")
    a("--processes", type=_nonneg_int, default=0, metavar="N",
      help="max OS processes per role (default: number of CPUs)")
    return p


def default_uri(environ: dict[str, str]) -> str:
    """DEFAULT_URI on the port HUTCH_AMQP_PORT names, when it is set (the variable hutch-server reads)."""
    text = environ.get(PORT_ENV, "")
    if not text:
        return DEFAULT_URI
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{PORT_ENV}: expected a port number, got '{text}'")
    return DEFAULT_URI.replace(":5672/", f":{int(text)}/")


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> PerfOptions:
    """Parse and validate; raises UsageError (bad input) or SystemExit(0) for --help. Without --uri the
    broker is DEFAULT_URI, on `environ`'s HUTCH_AMQP_PORT when set."""
    ns = build_parser().parse_args(argv)
    if ns.uri is None:
        ns.uri = default_uri(environ or {})
    uri = parse_uri(ns.uri)
    if ns.cacert is not None:
        if not uri.tls:
            raise UsageError("--cacert needs an amqps:// URI")
        uri = dataclasses.replace(uri, cacertfile=ns.cacert)
    try:
        uri.ssl_context()  # a TLS file that cannot be loaded is a usage error now, not in every worker
    except amqp_uri.UriError as exc:
        raise UsageError(str(exc)) from None
    for flag in ns.flag:
        if flag not in FLAGS:
            raise UsageError(f"unknown flag -f {flag!r} (known: {', '.join(FLAGS)})")
    if ns.producers == 0 and ns.consumers == 0:
        raise UsageError("nothing to do: --producers and --consumers are both 0")
    if ns.size < TIMESTAMP_BYTES:
        raise UsageError(f"--size must be at least {TIMESTAMP_BYTES} bytes (the body carries a send timestamp)")
    if ns.qos > 65535:
        raise UsageError("--qos must be at most 65535")
    if ns.autoack and ns.multi_ack_every:
        raise UsageError("--multi-ack-every and --autoack exclude each other")
    if ns.qos and ns.multi_ack_every > ns.qos:
        raise UsageError(f"--multi-ack-every {ns.multi_ack_every} exceeds --qos {ns.qos}: consumers would stall")
    if ns.confirm > 2**31:
        raise UsageError("--confirm window is too large")
    queue_args = parse_queue_args(ns.queue_args) if ns.queue_args is not None else {}
    if ns.quorum_queue:
        if queue_args.get("x-queue-type", "quorum") != "quorum":
            raise UsageError("--quorum-queue contradicts x-queue-type in --queue-args")
        queue_args["x-queue-type"] = "quorum"
    for name, value in (("--queue", ns.queue), ("--exchange", ns.exchange), ("--routing-key", ns.routing_key)):
        if value is not None and len(value.encode("utf-8")) > MAX_SHORTSTR:
            raise UsageError(f"{name} is longer than {MAX_SHORTSTR} bytes")
    if ns.queue == "":
        raise UsageError("--queue must not be empty")
    _check_pattern(ns)
    return PerfOptions(
        uri=uri,
        uri_text=ns.uri,
        producers=ns.producers,
        consumers=ns.consumers,
        size_bytes=ns.size,
        confirm_window=ns.confirm,
        multi_ack_every=ns.multi_ack_every,
        autoack=ns.autoack,
        qos=ns.qos,
        persistent="persistent" in ns.flag,
        mandatory="mandatory" in ns.flag,
        priorities=ns.priorities,
        queue_args=queue_args,
        quorum=queue_args.get("x-queue-type") == "quorum",
        queue=ns.queue,
        exchange=ns.exchange,
        exchange_type=ns.exchange_type,
        routing_key=ns.routing_key,
        time_s=ns.time,
        rate=ns.rate,
        pmessages=ns.pmessages,
        cmessages=ns.cmessages,
        json=ns.json,
        run_id=ns.run_id,
        processes=ns.processes,
        queue_pattern=ns.queue_pattern,
        queue_pattern_from=ns.queue_pattern_from,
        queue_pattern_to=ns.queue_pattern_to,
    )


MAX_PATTERN_QUEUES = 100_000


def _check_pattern(ns: argparse.Namespace) -> None:
    """--queue-pattern: one %d, a range of at most MAX_PATTERN_QUEUES, no -u beside it."""
    if ns.queue_pattern is None:
        if ns.queue_pattern_to:
            raise UsageError("--queue-pattern-to needs --queue-pattern")
        return
    if ns.queue is not None:
        raise UsageError("--queue and --queue-pattern exclude each other")
    if ns.queue_pattern.count("%d") != 1 or ns.queue_pattern.replace("%d", "").count("%"):
        raise UsageError("--queue-pattern must contain %d exactly once (and no other %)")
    if ns.queue_pattern_to < ns.queue_pattern_from:
        raise UsageError("--queue-pattern-to must be at least --queue-pattern-from")
    if ns.queue_pattern_to - ns.queue_pattern_from + 1 > MAX_PATTERN_QUEUES:
        raise UsageError(f"--queue-pattern covers more than {MAX_PATTERN_QUEUES} queues")
    if len((ns.queue_pattern % ns.queue_pattern_to).encode("utf-8")) > MAX_SHORTSTR:
        raise UsageError(f"--queue-pattern names are longer than {MAX_SHORTSTR} bytes")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
