"""Options of the `hutch` Spark data source: parsing, defaults, bounds and the errors users see.

Owns: `AmqpUri` and `parse_uri`, `parse_hosts` and `host_uris` (the `hosts` option: more nodes to try
beside `uri`'s, in turn, when one does not answer), `ReadOptions` (streaming and batch reads of a queue), `StreamReadOptions`
and `Position` (reads of a stream by offset: Spark's Kafka source option names), `WriteOptions` (batch
and streaming writes), and `HutchOptionError`.

Rules:
- Everything is resolved once, on the driver, when the source or sink is created (`DataSource.schema`,
  `reader`, `writer`, ...), so a bad option fails the query at start with a message that names the
  option, the value and what is allowed. The resolved objects are plain, picklable dataclasses.
- Option names are case-insensitive (Spark lower-cases them); unknown names are an error, so that a
  typo (`maxMessagesPerTriger`) is not silently ignored.
- No pyspark import here: this module is usable (and tested) without Spark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hutch.amqp import uri as amqp_uri
from hutch.amqp.uri import AmqpUri

PREFETCH_MAX = 65535  # basic.qos prefetch-count is a 16-bit field


class HutchOptionError(ValueError):
    """A data source option is missing or invalid; the text says which and why."""


def parse_uri(text: str) -> AmqpUri:
    """Parse an AMQP URI as RabbitMQ clients do (heartbeat 60 s unless given). Raises HutchOptionError."""
    try:
        return amqp_uri.parse_uri(text, heartbeat_s=60, require_host=True)
    except amqp_uri.UriError as exc:
        raise HutchOptionError(f"option 'uri': {exc}") from None


# -- several hosts -----------------------------------------------------------------------------------

MAX_HOSTS = 64
Hosts = tuple[tuple[str, int], ...]  # (host, port); port 0: the port of the protocol spoken


def parse_hosts(raw: str) -> Hosts:
    """The `hosts` option: a comma list of `host[:port]` (`[v6 address]:port` for IPv6), as Kafka's
    `bootstrap.servers`. A port is the one of the protocol the read or write speaks (AMQP 0-9-1 for a
    queue or an exchange, the stream protocol for a stream); without one, `uri`'s port (AMQP) or
    `streamPort` (streams). Raises HutchOptionError."""
    out: list[tuple[str, int]] = []
    items = [item.strip() for item in str(raw).split(",")]
    if not any(items) or len(items) > MAX_HOSTS:
        raise HutchOptionError(f"option 'hosts' must list 1 to {MAX_HOSTS} hosts as host[:port],host[:port]..., "
                               f"got {raw!r}")
    for item in items:
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([^\s:/@\[\]]+)(?::(\d{1,5}))?", item)
        port = int(m.group(2) or m.group(4) or "0") if m else 0
        if m is None or not 0 <= port <= 65535 or (port == 0 and (m.group(2) or m.group(4))):
            raise HutchOptionError(f"option 'hosts': {item!r} is not host[:port] (a port is 1 to 65535; an IPv6 "
                                   "address is written [address]:port)")
        host = m.group(1) or m.group(3)
        if (host, port) not in out:
            out.append((host, port))
    return tuple(out)


def host_uris(uri: AmqpUri, hosts: Hosts, port: int) -> tuple[AmqpUri, ...]:
    """The addresses to try, in order: `uri`'s host on `port`, then each of `hosts` (on its own port, or
    `port`), with `uri`'s credentials, vhost and TLS settings."""
    out = [replace(uri, port=port)]
    for host, host_port in hosts:
        candidate = replace(uri, host=host, port=host_port or port)
        if candidate not in out:
            out.append(candidate)
    return tuple(out)


def _hosts(opts: dict[str, str]) -> Hosts:
    raw = opts.get("hosts")
    return () if raw is None else parse_hosts(raw)


# -- reading -----------------------------------------------------------------------------------------

ACK_MODES = ("afterPartition", "none")


@dataclass(frozen=True)
class ReadOptions:
    """Resolved options of `spark.read` / `spark.readStream` with `format("hutch")`."""

    uri: AmqpUri
    queue: str
    prefetch: int = 20_000
    max_messages_per_trigger: int = 10_000  # streaming: most messages in one micro-batch
    poll_timeout_ms: int = 100  # how long a read waits for messages to arrive
    include_headers: bool = True
    max_messages: int = 100_000  # batch: most messages one spark.read drains
    num_partitions: int = 0  # batch: 0 = ceil(messages / prefetch)
    ack_mode: str = "afterPartition"  # batch: when a read task acknowledges
    hosts: Hosts = ()  # more nodes to try when `uri`'s does not answer

    def uris(self) -> tuple[AmqpUri, ...]:
        """The AMQP addresses to try in turn: `uri`, then `hosts`."""
        return host_uris(self.uri, self.hosts, self.uri.port)


_READ_KEYS = {
    "uri": "uri", "queue": "queue", "prefetch": "prefetch",
    "maxmessagespertrigger": "maxMessagesPerTrigger", "polltimeoutms": "pollTimeoutMs",
    "includeheaders": "includeHeaders", "maxmessages": "maxMessages", "numpartitions": "numPartitions",
    "ackmode": "ackMode", "hosts": "hosts",
}
_WRITE_KEYS = {
    "uri": "uri", "exchange": "exchange", "routing_key": "routing_key", "mandatory": "mandatory",
    "deliverymode": "deliveryMode", "maxunconfirmed": "maxUnconfirmed",
    "confirmtimeoutms": "confirmTimeoutMs", "writeid": "writeId", "stream": "stream",
    "superstream": "superStream", "streamport": "streamPort", "hosts": "hosts",
}
# Options of the AMQP 0-9-1 sink that mean nothing to a write to a stream (stream protocol).
_AMQP_ONLY_WRITE_KEYS = ("exchange", "routing_key", "mandatory", "deliverymode")
STREAM_PORT, STREAM_TLS_PORT = 5552, 5551
MAX_WRITE_ID_CHARS = 200
# Keys Spark itself may put in the options map; never ours to judge.
_SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation", "queryname"})


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


def _check_known(opts: dict[str, str], known: dict[str, str], what: str) -> None:
    unknown = sorted(k for k in opts if k not in known and k not in _SPARK_KEYS)
    if unknown:
        allowed = ", ".join(sorted(known.values(), key=str.lower))
        raise HutchOptionError(f"unknown option(s) for a hutch {what}: {', '.join(unknown)} "
                               f"(allowed: {allowed})")


def _int(opts: dict[str, str], key: str, name: str, default: int, low: int, high: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise HutchOptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise HutchOptionError(f"option '{name}' must be between {low} and {high}, got {value}")
    return value


def _bool(opts: dict[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise HutchOptionError(f"option '{name}' must be true or false, got {raw!r}")


def _uri(opts: dict[str, str]) -> AmqpUri:
    raw = opts.get("uri")
    if raw is None or not str(raw).strip():
        raise HutchOptionError("option 'uri' is required, e.g. .option('uri', "
                               "'amqp://guest:guest@localhost:5672/%2F')")
    return parse_uri(str(raw).strip())


def reads_stream(options: Mapping[str, str]) -> bool:
    """Whether a read names a stream or a super stream (`stream`/`superStream`) rather than a queue."""
    opts = _lower(options)
    return "stream" in opts or "superstream" in opts


def read_options(options: Mapping[str, str]) -> ReadOptions:
    """Resolve and check the options of a read (batch or streaming). Raises HutchOptionError."""
    opts = _lower(options)
    if ("stream" in opts or "superstream" in opts) and "queue" in opts:
        raise HutchOptionError("options 'queue' and 'stream' (or 'superStream') exclude each other: 'queue' "
                               "consumes a queue (at-least-once), 'stream' reads a stream by offset "
                               "(exactly-once)")
    _check_known(opts, _READ_KEYS, "source")
    uri = _uri(opts)
    queue = opts.get("queue")
    if queue is None or not str(queue):
        raise HutchOptionError("option 'queue' is required: the name of the queue to consume from")
    if len(str(queue).encode()) > 255:
        raise HutchOptionError("option 'queue': a queue name is at most 255 bytes")
    prefetch = _int(opts, "prefetch", "prefetch", ReadOptions.prefetch, 1, PREFETCH_MAX)
    max_per_trigger = _int(opts, "maxmessagespertrigger", "maxMessagesPerTrigger",
                           min(ReadOptions.max_messages_per_trigger, prefetch), 1, PREFETCH_MAX)
    if max_per_trigger > prefetch:
        raise HutchOptionError(
            f"option 'maxMessagesPerTrigger' ({max_per_trigger}) must not exceed 'prefetch' ({prefetch}): "
            "a micro-batch's messages stay unacknowledged until Spark commits it, and the broker sends at "
            "most 'prefetch' unacknowledged messages")
    ack_mode = opts.get("ackmode", ReadOptions.ack_mode)
    by_lower = {m.lower(): m for m in ACK_MODES}
    if str(ack_mode).lower() not in by_lower:
        raise HutchOptionError(f"option 'ackMode' must be one of {', '.join(ACK_MODES)}, got {ack_mode!r}")
    return ReadOptions(
        uri=uri,
        queue=str(queue),
        prefetch=prefetch,
        max_messages_per_trigger=max_per_trigger,
        poll_timeout_ms=_int(opts, "polltimeoutms", "pollTimeoutMs", ReadOptions.poll_timeout_ms, 1, 600_000),
        include_headers=_bool(opts, "includeheaders", "includeHeaders", ReadOptions.include_headers),
        max_messages=_int(opts, "maxmessages", "maxMessages", ReadOptions.max_messages, 0, 2**31 - 1),
        num_partitions=_int(opts, "numpartitions", "numPartitions", ReadOptions.num_partitions, 0, 10_000),
        ack_mode=by_lower[str(ack_mode).lower()],
        hosts=_hosts(opts),
    )


# -- reading a stream by offset -----------------------------------------------------------------------

EARLIEST, LATEST, OFFSET, TIMESTAMP = "earliest", "latest", "offset", "timestamp"


@dataclass(frozen=True)
class Position:
    """Where a stream read starts or ends: `earliest`, `latest`, an offset, or a timestamp (ms)."""

    kind: str
    value: int = 0


@dataclass(frozen=True)
class StreamReadOptions:
    """Resolved options of a read of a stream (`stream` option), named after Spark's Kafka source."""

    uri: AmqpUri
    stream: str
    starting: Position  # streaming default: latest; batch default: earliest
    ending: Position  # batch only: latest unless endingOffsets/endingTimestamp
    max_offsets_per_trigger: int = 0  # 0: no limit
    min_offsets_per_trigger: int = 0  # 0: no minimum
    max_trigger_delay_ms: int = 15 * 60_000  # a batch below the minimum runs anyway after this long
    min_partitions: int = 1
    fail_on_data_loss: bool = True
    prefetch: int = 20_000  # a read task's consumer credit
    poll_timeout_ms: int = 100  # how long the driver's probes wait for a first delivery
    read_timeout_ms: int = 60_000  # how long a read task waits for the next delivery of its range
    include_headers: bool = True
    # The stream protocol port the driver asks for a stream's exact end and a super stream's partitions.
    stream_port: int = 5552
    # A super stream read: its name (then `stream` is "" here and set per partition by the reader) and
    # positions given per partition index (a JSON map; the partitions it leaves out take `starting` /
    # `ending`).
    super_stream: str | None = None
    starting_by_partition: tuple[tuple[int, Position], ...] = ()
    ending_by_partition: tuple[tuple[int, Position], ...] = ()
    hosts: Hosts = ()  # more nodes to try when `uri`'s does not answer (their stream ports)

    def name(self) -> str:
        """The stream or super stream read (for messages)."""
        return self.super_stream or self.stream

    def stream_uris(self) -> tuple[AmqpUri, ...]:
        """The stream protocol's addresses to try in turn: `uri`'s host on `streamPort`, then `hosts`."""
        return host_uris(self.uri, self.hosts, self.stream_port)

    def uris(self) -> tuple[AmqpUri, ...]:
        """The AMQP addresses (`uri`, then `hosts`' hosts on `uri`'s port: their ports are stream ports)."""
        return host_uris(self.uri, tuple((host, 0) for host, _ in self.hosts), self.uri.port)


_STREAM_KEYS = {
    "uri": "uri", "stream": "stream", "startingoffsets": "startingOffsets",
    "startingtimestamp": "startingTimestamp", "endingoffsets": "endingOffsets",
    "endingtimestamp": "endingTimestamp", "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "minoffsetspertrigger": "minOffsetsPerTrigger", "maxtriggerdelay": "maxTriggerDelay",
    "minpartitions": "minPartitions", "failondataloss": "failOnDataLoss", "prefetch": "prefetch",
    "polltimeoutms": "pollTimeoutMs", "readtimeoutms": "readTimeoutMs", "includeheaders": "includeHeaders",
    "superstream": "superStream", "streamport": "streamPort", "hosts": "hosts",
}
_OFFSET_MAX = 2**63 - 1


def _offsets_json(text: str, name: str) -> Any:
    """Kafka's JSON offsets, `{"<name>": {...}}` or the inner map alone; None if it is not JSON."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if isinstance(doc, dict) and name in doc and isinstance(doc[name], dict):
        return doc[name]
    return doc


def _position(raw: str, name: str, stream: str) -> Position:
    """`earliest`, `latest`, or Kafka's JSON form `{"<stream>": {"0": n}}` (also `{"0": n}`), where n is
    an offset, -2 (earliest) or -1 (latest)."""
    text = str(raw).strip()
    if text.lower() in (EARLIEST, LATEST):
        return Position(text.lower())
    doc = _offsets_json(text, stream)
    if isinstance(doc, dict) and set(doc) == {"0"} and isinstance(doc["0"], int) and \
            not isinstance(doc["0"], bool) and -2 <= doc["0"] <= _OFFSET_MAX:
        n = doc["0"]
        return Position(EARLIEST) if n == -2 else Position(LATEST) if n == -1 else Position(OFFSET, n)
    raise HutchOptionError(
        f"option '{name}' must be 'earliest', 'latest' or a JSON map of partition to offset such as "
        f'{{"{stream}": {{"0": 42}}}} (a stream has one partition, "0"; -2 = earliest, -1 = latest), '
        f"got {raw!r}")


def _partition_positions(raw: str, name: str, super_stream: str) -> tuple[Position | None,
                                                                          tuple[tuple[int, Position], ...]]:
    """A super stream's `earliest`/`latest` (for every partition), or Kafka's JSON map of partition index to
    offset, `{"<super stream>": {"0": 42, "3": -2}}` (also `{"0": 42}`)."""
    text = str(raw).strip()
    if text.lower() in (EARLIEST, LATEST):
        return Position(text.lower()), ()
    doc = _offsets_json(text, super_stream)
    out: list[tuple[int, Position]] = []
    if isinstance(doc, dict) and doc:
        for key, n in doc.items():
            if not (str(key).isdigit() and isinstance(n, int) and not isinstance(n, bool) and -2 <= n <= _OFFSET_MAX):
                break
            pos = Position(EARLIEST) if n == -2 else Position(LATEST) if n == -1 else Position(OFFSET, n)
            out.append((int(key), pos))
        else:
            return None, tuple(sorted(out))
    raise HutchOptionError(
        f"option '{name}' must be 'earliest', 'latest' or a JSON map of partition index to offset such as "
        f'{{"{super_stream}": {{"0": 42, "1": 7}}}} (-2 = earliest, -1 = latest), got {raw!r}')


def _timestamp(opts: dict[str, str], key: str, name: str) -> Position | None:
    raw = opts.get(key)
    if raw is None:
        return None
    return Position(TIMESTAMP, _int(opts, key, name, 0, 0, 2**53))


_DURATION_UNITS_MS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(raw: str, name: str) -> int:
    """A duration as Spark writes them: `15m`, `30s`, `500ms`, `2h`, or a bare number of milliseconds."""
    m = re.fullmatch(r"\s*(\d{1,12})\s*([a-z]*)\s*", str(raw).lower())
    if m is None or m.group(2) not in _DURATION_UNITS_MS:
        raise HutchOptionError(f"option '{name}' must be a duration such as 15m, 30s, 500ms or 2h, got {raw!r}")
    return int(m.group(1)) * _DURATION_UNITS_MS[m.group(2)]


def stream_read_options(options: Mapping[str, str], streaming: bool) -> StreamReadOptions:
    """Resolve and check the options of a read of a stream. Raises HutchOptionError."""
    opts = _lower(options)
    _check_known(opts, _STREAM_KEYS, "stream source")
    uri = _uri(opts)
    if "stream" in opts and "superstream" in opts:
        raise HutchOptionError("options 'stream' and 'superStream' exclude each other")
    super_stream = opts.get("superstream")
    if super_stream is not None:
        return _super_stream_read_options(opts, str(super_stream), streaming)
    stream = str(opts.get("stream") or "")
    if not stream:
        raise HutchOptionError("option 'stream' is required: the name of the stream to read")
    if len(stream.encode()) > 255:
        raise HutchOptionError("option 'stream': a stream name is at most 255 bytes")
    for a, b in (("startingoffsets", "startingtimestamp"), ("endingoffsets", "endingtimestamp")):
        if a in opts and b in opts:
            raise HutchOptionError(f"options '{_STREAM_KEYS[a]}' and '{_STREAM_KEYS[b]}' exclude each other")
    starting = _timestamp(opts, "startingtimestamp", "startingTimestamp") or \
        _position(opts.get("startingoffsets", LATEST if streaming else EARLIEST), "startingOffsets", stream)
    ending = _timestamp(opts, "endingtimestamp", "endingTimestamp") or \
        _position(opts.get("endingoffsets", LATEST), "endingOffsets", stream)
    if streaming and ("endingoffsets" in opts or "endingtimestamp" in opts):
        raise HutchOptionError("options 'endingOffsets' and 'endingTimestamp' are for batch reads "
                               "(spark.read); a streaming query reads on")
    if not streaming and ending.kind == EARLIEST:
        raise HutchOptionError("option 'endingOffsets' cannot be 'earliest'")
    for key in ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay"):
        if not streaming and key in opts:
            raise HutchOptionError(f"option '{_STREAM_KEYS[key]}' is for streaming reads (spark.readStream)")
    delay = opts.get("maxtriggerdelay")
    return StreamReadOptions(
        uri=uri,
        stream=stream,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", 0, 1, _OFFSET_MAX),
        min_offsets_per_trigger=_int(opts, "minoffsetspertrigger", "minOffsetsPerTrigger", 0, 1, _OFFSET_MAX),
        max_trigger_delay_ms=StreamReadOptions.max_trigger_delay_ms if delay is None
        else duration_ms(delay, "maxTriggerDelay"),
        min_partitions=_int(opts, "minpartitions", "minPartitions", 1, 1, 10_000),
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        prefetch=_int(opts, "prefetch", "prefetch", StreamReadOptions.prefetch, 1, PREFETCH_MAX),
        poll_timeout_ms=_int(opts, "polltimeoutms", "pollTimeoutMs", StreamReadOptions.poll_timeout_ms,
                             1, 600_000),
        read_timeout_ms=_int(opts, "readtimeoutms", "readTimeoutMs", StreamReadOptions.read_timeout_ms,
                             1, 3_600_000),
        include_headers=_bool(opts, "includeheaders", "includeHeaders", StreamReadOptions.include_headers),
        stream_port=_int(opts, "streamport", "streamPort", STREAM_TLS_PORT if uri.tls else STREAM_PORT, 1, 65535),
        hosts=_hosts(opts),
    )


def _super_stream_read_options(opts: dict[str, str], super_stream: str, streaming: bool) -> StreamReadOptions:
    """A super stream read: the single-stream options with positions per partition."""
    if not 0 < len(super_stream.encode()) <= 255:
        raise HutchOptionError("option 'superStream' must be a super stream name of 1 to 255 bytes")
    plain = {k: v for k, v in opts.items() if k not in ("superstream", "streamport", "startingoffsets",
                                                        "endingoffsets")}
    base = stream_read_options({**plain, "stream": super_stream}, streaming)
    starting, starting_map = base.starting, ()  # type: tuple[Position, tuple[tuple[int, Position], ...]]
    if "startingoffsets" in opts:
        default, starting_map = _partition_positions(opts["startingoffsets"], "startingOffsets", super_stream)
        starting = default or (Position(LATEST) if streaming else Position(EARLIEST))
    ending, ending_map = base.ending, ()  # type: tuple[Position, tuple[tuple[int, Position], ...]]
    if "endingoffsets" in opts:
        if streaming:
            raise HutchOptionError("options 'endingOffsets' and 'endingTimestamp' are for batch reads "
                                   "(spark.read); a streaming query reads on")
        default, ending_map = _partition_positions(opts["endingoffsets"], "endingOffsets", super_stream)
        ending = default or Position(LATEST)
        if ending.kind == EARLIEST or any(p.kind == EARLIEST for _, p in ending_map):
            raise HutchOptionError("option 'endingOffsets' cannot be 'earliest'")
    port = _int(opts, "streamport", "streamPort", STREAM_TLS_PORT if base.uri.tls else STREAM_PORT, 1, 65535)
    return replace(base, stream="", super_stream=super_stream, stream_port=port, starting=starting,
                   ending=ending, starting_by_partition=starting_map, ending_by_partition=ending_map)


# -- writing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """Resolved options of `df.write` / `df.writeStream` with `format("hutch")`."""

    uri: AmqpUri
    exchange: str | None = None  # overrides the `exchange` column
    routing_key: str | None = None  # overrides the `routing_key` column
    mandatory: bool = True  # an unroutable message fails the task
    delivery_mode: int = 2  # 2 = persistent (kept across restarts once hutch persists messages)
    max_unconfirmed: int = 10_000  # bound on published-but-unconfirmed messages per task
    confirm_timeout_ms: int = 60_000  # how long a task waits for its confirms
    write_id: str | None = None  # batch writes: the "query" part of message ids (default: random)
    stream: str | None = None  # write to this stream over the stream protocol (idempotent)
    super_stream: str | None = None  # write to this super stream's partitions, routed by the key column
    stream_port: int = STREAM_PORT  # the broker's stream protocol port (host, user, vhost: from `uri`)
    hosts: Hosts = ()  # more nodes to try when `uri`'s does not answer

    @property
    def to_stream(self) -> bool:
        return self.stream is not None or self.super_stream is not None

    @property
    def target(self) -> str:
        """The stream or super stream written to (for messages)."""
        return self.stream or self.super_stream or ""

    def stream_uri(self) -> AmqpUri:
        """`uri` with the stream protocol's port: the stream sink's first address."""
        return replace(self.uri, port=self.stream_port)

    def stream_uris(self) -> tuple[AmqpUri, ...]:
        """The stream sink's addresses to try in turn: `uri`'s host on `streamPort`, then `hosts`."""
        return host_uris(self.uri, self.hosts, self.stream_port)

    def uris(self) -> tuple[AmqpUri, ...]:
        """The AMQP sink's addresses to try in turn: `uri`, then `hosts`."""
        return host_uris(self.uri, self.hosts, self.uri.port)


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Resolve and check the options of a write (batch or streaming). Raises HutchOptionError."""
    opts = _lower(options)
    _check_known(opts, _WRITE_KEYS, "sink")
    uri = _uri(opts)
    exchange = opts.get("exchange")
    routing_key = opts.get("routing_key")
    for name, value in (("exchange", exchange), ("routing_key", routing_key)):
        if value is not None and len(str(value).encode()) > 255:
            raise HutchOptionError(f"option '{name}' is at most 255 bytes")
    stream, super_stream = opts.get("stream"), opts.get("superstream")
    if stream is not None and super_stream is not None:
        raise HutchOptionError("options 'stream' and 'superStream' exclude each other")
    for name, value in (("stream", stream), ("superStream", super_stream)):
        if value is not None and not 0 < len(str(value).encode()) <= 255:
            raise HutchOptionError(f"option '{name}' must be a stream name of 1 to 255 bytes")
    to_stream = stream is not None or super_stream is not None
    if to_stream:
        clash = [_WRITE_KEYS[k] for k in _AMQP_ONLY_WRITE_KEYS if k in opts]
        if clash:
            raise HutchOptionError(
                f"option(s) {', '.join(clash)} are for writes to an exchange (AMQP 0-9-1); a write to a "
                "'stream' or 'superStream' goes over the stream protocol (a super stream routes by the "
                "'key' column)")
    elif "streamport" in opts:
        raise HutchOptionError("option 'streamPort' is for writes to a 'stream' or 'superStream'")
    write_id = opts.get("writeid")
    if write_id is not None and (not str(write_id) or ":" in str(write_id)):
        raise HutchOptionError("option 'writeId' must be a non-empty string without ':'")
    if write_id is not None and to_stream and len(str(write_id)) > MAX_WRITE_ID_CHARS:
        raise HutchOptionError(f"option 'writeId' is at most {MAX_WRITE_ID_CHARS} characters for a write to a "
                               "stream (it is part of the publisher reference, at most 256)")
    return WriteOptions(
        uri=uri,
        exchange=None if exchange is None else str(exchange),
        routing_key=None if routing_key is None else str(routing_key),
        mandatory=_bool(opts, "mandatory", "mandatory", WriteOptions.mandatory),
        delivery_mode=_int(opts, "deliverymode", "deliveryMode", WriteOptions.delivery_mode, 1, 2),
        max_unconfirmed=_int(opts, "maxunconfirmed", "maxUnconfirmed", WriteOptions.max_unconfirmed,
                             1, 1_000_000),
        confirm_timeout_ms=_int(opts, "confirmtimeoutms", "confirmTimeoutMs",
                                WriteOptions.confirm_timeout_ms, 1, 3_600_000),
        write_id=None if write_id is None else str(write_id),
        stream=None if stream is None else str(stream),
        super_stream=None if super_stream is None else str(super_stream),
        stream_port=_int(opts, "streamport", "streamPort", STREAM_TLS_PORT if uri.tls else STREAM_PORT,
                         1, 65535),
        hosts=_hosts(opts),
    )
