"""Prometheus metrics: the text exposition format (0.0.4) with the rabbitmq_prometheus plugin's names.

Owns: `render` (the body of GET /metrics and /metrics/per-object), the catalogue of metric families
(name, type, HELP text: RabbitMQ's, from its plugin's collectors, for every family that keeps a
RabbitMQ name), label escaping, and `ScrapeStats` (the plugin's telemetry_scrape_* summaries). Pure:
reads the node and its management agent's answer (`metric_samples`, runtime/ports.py), never changes
them, does no IO of its own (node figures come from `system.own_node_info`, summed over a node's workers).

Rules:
- A family keeps its RabbitMQ name only when hutch has a source with the same meaning; counters
  hutch keeps with a different cut (per-queue deliveries not split by acknowledgement mode, queue
  counters without an exchange) get a `hutch_` name instead. RabbitMQ families with no hutch source are left
  out rather than reported as zero; docs/metrics.md lists them.
- Registry "default" (/metrics) is aggregated: every per-object family is one unlabelled sample, the
  sum over objects (0 when there are none), as the plugin does. Registry "per-object" gives one sample
  per queue (labels vhost, queue), channel (channel) or connection (channel: the plugin labels
  connection metrics with the connection process under the label name `channel`, and so does hutch,
  with the connection's name as value).
- rabbitmq_global_* counters never go down: they add the counters of closed channels
  (`Node.closed_channel_stats`). The aggregated channel_* and queue_* counters are sums over live
  objects and drop when one goes, as in RabbitMQ.
- A node of worker processes is one node here too (docs/scaling.md): the connection, channel and
  consumer families, the rabbitmq_global_* counters and the churn are every worker's, as the node's agent
  gathers them; the queue families are worker 0's queues, stand-ins carrying their homes' figures.
- Cost: one pass over queues, channels and connections; label text is built once per object. 10,000
  queues render in well under a second (benchmarks/prometheus_render.py).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.core.counters import CHANNEL_METRIC_FIELDS

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node

CONTENT_TYPE = "text/plain; version=0.0.4"
REGISTRIES = {"default": "aggregated", "per-object": "per-object"}  # registry -> rabbitmq_endpoint
GAUGE, COUNTER, UNTYPED, SUMMARY = "gauge", "counter", "untyped", "summary"
PROTOCOL = "amqp091"


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs) + "}"


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: str
    help: str

    @property
    def header(self) -> str:
        return f"# TYPE {self.name} {self.kind}\n# HELP {self.name} {_escape_help(self.help)}\n"


def _f(name: str, kind: str, help_: str) -> Family:
    return Family(name, kind, help_)


# -- the catalogue ----------------------------------------------------------------------------------
# RabbitMQ's HELP texts are copied verbatim from deps/rabbitmq_prometheus (core, global, alarm and
# process collectors, the HTTP handler) so a `# HELP` diff against a RabbitMQ node is empty.

NODE = (  # node_coarse_metrics, node_metrics, node_persister_metrics (the parts hutch has)
    _f("rabbitmq_process_open_fds", GAUGE, "Open file descriptors"),
    _f("rabbitmq_process_resident_memory_bytes", GAUGE, "Memory used in bytes"),
    _f("rabbitmq_disk_space_available_bytes", GAUGE, "Disk space available in bytes"),
    _f("rabbitmq_process_max_fds", GAUGE, "Open file descriptors limit"),
    _f("rabbitmq_resident_memory_limit_bytes", GAUGE, "Memory high watermark in bytes"),
    _f("rabbitmq_disk_space_available_limit_bytes", GAUGE, "Free disk space low watermark in bytes"),
    _f("rabbitmq_erlang_uptime_seconds", GAUGE, "Node uptime"),
    _f("rabbitmq_io_sync_ops_total", COUNTER, "Total number of I/O sync operations"),
)
QUEUE = (  # queue_coarse_metrics, queue_metrics; labels vhost, queue
    _f("rabbitmq_queue_messages_ready", GAUGE, "Messages ready to be delivered to consumers"),
    _f("rabbitmq_queue_messages_unacked", GAUGE, "Messages delivered to consumers but not yet acknowledged"),
    _f("rabbitmq_queue_messages", GAUGE, "Sum of ready and unacknowledged messages - total queue depth"),
    _f("rabbitmq_queue_consumers", GAUGE, "Consumers on a queue"),
    _f("rabbitmq_queue_messages_ram", GAUGE, "Ready and unacknowledged messages stored in memory"),
    _f("rabbitmq_queue_messages_ready_ram", GAUGE, "Ready messages stored in memory"),
    _f("rabbitmq_queue_messages_unacked_ram", GAUGE, "Unacknowledged messages stored in memory"),
    _f("rabbitmq_queue_messages_ready_bytes", GAUGE, "Size in bytes of ready messages"),
)
CHANNEL = (  # channel_metrics; label channel
    _f("rabbitmq_channel_consumers", GAUGE, "Consumers on a channel"),
    _f("rabbitmq_channel_messages_unacked", GAUGE, "Delivered but not yet acknowledged messages"),
    _f("rabbitmq_channel_messages_unconfirmed", GAUGE, "Published but not yet confirmed messages"),
    _f("rabbitmq_channel_messages_uncommitted", GAUGE,
       "Messages received in a transaction but not yet committed"),
    _f("rabbitmq_consumer_prefetch", GAUGE, "Limit of unacknowledged messages for each consumer"),
    _f("rabbitmq_channel_prefetch", GAUGE, "Deprecated and will be removed in a future version"),
)
CHANNEL_COUNTERS = (  # channel_exchange_metrics, channel_queue_metrics; labels channel, vhost
    _f("rabbitmq_channel_messages_published_total", COUNTER,
       "Total number of messages published into an exchange on a channel"),
    _f("rabbitmq_channel_messages_confirmed_total", COUNTER,
       "Total number of messages published into an exchange and confirmed on the channel"),
    _f("rabbitmq_channel_messages_redelivered_total", COUNTER, "Total number of messages redelivered to consumers"),
    _f("rabbitmq_channel_messages_acked_total", COUNTER, "Total number of messages acknowledged by consumers"),
)
CONNECTION = (  # connection_coarse_metrics, connection_metrics; label channel (sic, see the docstring)
    _f("rabbitmq_connection_incoming_bytes_total", COUNTER, "Total number of bytes received on a connection"),
    _f("rabbitmq_connection_outgoing_bytes_total", COUNTER, "Total number of bytes sent on a connection"),
    _f("rabbitmq_connection_channels", GAUGE, "Channels on a connection"),
)
QUEUE_DELIVERY = (  # queue_delivery_metrics; labels vhost, queue
    _f("rabbitmq_queue_messages_redelivered_total", COUNTER,
       "Total number of messages redelivered from a queue to consumers"),
    _f("rabbitmq_queue_messages_acked_total", COUNTER,
       "Total number of messages acknowledged by consumers on a queue"),
)
TOTALS = (
    _f("rabbitmq_connections", GAUGE, "Connections currently open"),
    _f("rabbitmq_channels", GAUGE, "Channels currently open"),
    _f("rabbitmq_consumers", GAUGE, "Consumers currently connected"),
    _f("rabbitmq_queues", GAUGE, "Queues available"),
)
CHURN = (  # connection_churn_metrics; Node.churn
    _f("rabbitmq_connections_opened_total", COUNTER, "Total number of connections opened"),
    _f("rabbitmq_connections_closed_total", COUNTER, "Total number of connections closed or terminated"),
    _f("rabbitmq_channels_opened_total", COUNTER, "Total number of channels opened"),
    _f("rabbitmq_channels_closed_total", COUNTER, "Total number of channels closed"),
    _f("rabbitmq_queues_declared_total", COUNTER, "Total number of queues declared"),
    _f("rabbitmq_queues_created_total", COUNTER, "Total number of queues created"),
    _f("rabbitmq_queues_deleted_total", COUNTER, "Total number of queues deleted"),
)
CHURN_KEYS = ("connections_opened", "connections_closed", "channels_opened", "channels_closed",
              "queues_declared", "queues_created", "queues_deleted")
QUEUE_INFO = _f("rabbitmq_queue_info", GAUGE, "A metric with a constant '1' value and labels that provide some queue details")
BUILD_INFO = _f("rabbitmq_build_info", UNTYPED, "RabbitMQ & Erlang/OTP version info")
IDENTITY_INFO = _f("rabbitmq_identity_info", UNTYPED, "RabbitMQ node & cluster identity info")
GLOBAL = (  # rabbit_global_counters; label protocol (and queue_type for the per-queue-type ones)
    _f("rabbitmq_global_messages_received_total", COUNTER, "Total number of messages received from publishers"),
    _f("rabbitmq_global_publishers", GAUGE, "Current number of publishers"),
    _f("rabbitmq_global_consumers", GAUGE, "Current number of consumers"),
    _f("rabbitmq_global_messages_delivered_total", COUNTER, "Total number of messages delivered to consumers"),
    _f("rabbitmq_global_messages_redelivered_total", COUNTER, "Total number of messages redelivered to consumers"),
    _f("rabbitmq_global_messages_acknowledged_total", COUNTER,
       "Total number of messages acknowledged by consumers"),
)
ALARMS = (
    _f("rabbitmq_alarms_free_disk_space_watermark", UNTYPED,
       "is 1 if free disk space watermark alarm is in effect"),
    _f("rabbitmq_alarms_memory_used_watermark", UNTYPED, "is 1 if VM memory watermark alarm is in effect"),
)
PROCESS_START = _f("process_start_time_seconds", GAUGE, "Start time of the process since unix epoch in seconds.")
SCRAPE = (
    _f("telemetry_scrape_duration_seconds", SUMMARY, "Scrape duration"),
    _f("telemetry_scrape_size_bytes", SUMMARY, "Scrape size, not encoded"),
)
HUTCH_NODE = (
    _f("hutch_storage_fdatasyncs_total", COUNTER, "Total number of fdatasync calls made by message storage"),
    _f("hutch_storage_sync_batches_total", COUNTER,
       "Total number of group commits of message storage that synced at least one file"),
    _f("hutch_memory_paging", GAUGE,
       "is 1 while memory use is over the paging threshold and queues page messages out to disk"),
)
HUTCH_SHOVEL = (  # the dynamic shovels this node runs (docs/shovel.md)
    _f("hutch_shovels", GAUGE, "Dynamic shovels on this node, by state (starting, running, terminated)"),
    _f("hutch_shovel_messages_forwarded_total", COUNTER,
       "Total number of messages dynamic shovels published to their destinations"),
    _f("hutch_shovel_messages_acknowledged_total", COUNTER,
       "Total number of messages dynamic shovels settled at their sources"),
)
SHOVEL_STATES = ("starting", "running", "terminated")
STREAM = (  # queue_metrics' stream_segments and stream_consumer_metrics (RabbitMQ 3.13+); labels vhost, queue
    _f("rabbitmq_stream_segments", COUNTER, "Total number of stream segment files"),
    _f("rabbitmq_stream_consumer_max_offset_lag", GAUGE, "Highest consumer offset lag"),
)
HUTCH_STREAM = (  # the stream protocol's publish errors (RabbitMQ counts errors by response code instead)
    _f("hutch_stream_messages_errored_total", COUNTER,
       "Total number of messages stream-protocol publishers sent that the node answered with a publish error"),
)
STREAM_PROTOCOL = "stream"
STREAM_QUEUE_TYPE = "rabbit_stream_queue"
HUTCH_QUEUE = (  # labels vhost, queue
    _f("hutch_queue_messages_paged_out", GAUGE, "Ready messages paged out to disk (bodies not in memory)"),
    _f("hutch_queue_messages_published_total", COUNTER, "Total number of messages enqueued into a queue"),
    _f("hutch_queue_messages_delivered_total", COUNTER,
       "Total number of messages delivered from a queue to consumers, in either acknowledgement mode"),
    _f("hutch_queue_get_total", COUNTER,
       "Total number of messages fetched from a queue with basic.get, in either acknowledgement mode"),
    _f("hutch_queue_messages_dead_lettered_total", COUNTER,
       "Total number of messages a queue dead-lettered (expired, maxlen, rejected, delivery limit)"),
    _f("hutch_queue_messages_dropped_total", COUNTER,
       "Total number of messages that left a queue for a dead-letter reason and were discarded "
       "because the queue has no dead-letter exchange"),
    _f("hutch_queue_messages_rejected_total", COUNTER,
       "Total number of publishes a full queue refused (overflow reject-publish or reject-publish-dlx)"),
)
HUTCH_CHANNEL = (  # labels channel, vhost
    _f("hutch_channel_messages_delivered_total", COUNTER,
       "Total number of messages delivered to consumers on a channel, in either acknowledgement mode"),
)
CHANNEL_MORE = (  # channel_exchange_metrics and channel_queue_metrics, without the exchange/queue label
    _f("rabbitmq_channel_messages_unroutable_returned_total", COUNTER,
       "Total number of messages published as mandatory into an exchange and returned to the publisher as "
       "unroutable"),
    _f("rabbitmq_channel_messages_unroutable_dropped_total", COUNTER,
       "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    _f("rabbitmq_channel_get_ack_total", COUNTER,
       "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    _f("rabbitmq_channel_get_total", COUNTER,
       "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    _f("rabbitmq_channel_messages_delivered_ack_total", COUNTER,
       "Total number of messages delivered to consumers in manual acknowledgement mode"),
    _f("rabbitmq_channel_messages_delivered_total", COUNTER,
       "Total number of messages delivered to consumers in automatic acknowledgement mode"),
    _f("rabbitmq_channel_get_empty_total", COUNTER, "Total number of times basic.get operations fetched no message"),
)
GLOBAL_MORE = (  # rabbit_global_counters; label protocol
    _f("rabbitmq_global_messages_received_confirm_total", COUNTER,
       "Total number of messages received from publishers expecting confirmations"),
    _f("rabbitmq_global_messages_routed_total", COUNTER, "Total number of messages routed to queues or streams"),
    _f("rabbitmq_global_messages_unroutable_dropped_total", COUNTER,
       "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    _f("rabbitmq_global_messages_unroutable_returned_total", COUNTER,
       "Total number of messages published as mandatory into an exchange and returned to the publisher as "
       "unroutable"),
    _f("rabbitmq_global_messages_confirmed_total", COUNTER, "Total number of messages confirmed to publishers"),
)
GLOBAL_BY_QUEUE_TYPE = (  # rabbit_global_counters; labels protocol, queue_type
    _f("rabbitmq_global_messages_delivered_consume_manual_ack_total", COUNTER,
       "Total number of messages delivered to consumers using basic.consume with manual acknowledgment"),
    _f("rabbitmq_global_messages_delivered_consume_auto_ack_total", COUNTER,
       "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment"),
    _f("rabbitmq_global_messages_delivered_get_manual_ack_total", COUNTER,
       "Total number of messages delivered to consumers using basic.get with manual acknowledgment"),
    _f("rabbitmq_global_messages_delivered_get_auto_ack_total", COUNTER,
       "Total number of messages delivered to consumers using basic.get with automatic acknowledgment"),
    _f("rabbitmq_global_messages_get_empty_total", COUNTER,
       "Total number of times basic.get operations fetched no message"),
)
# the channel attributes behind CHANNEL_MORE, and the global sums they feed
CHANNEL_MORE_STATS = ("stat_return_unroutable", "stat_drop_unroutable", "stat_get", "stat_get_no_ack",
                      "stat_deliver", "stat_deliver_no_ack", "stat_get_empty")


# column positions in the rows built by _queue_rows and _channel_rows (row layout = family order)
_Q_CONSUMERS = 3
_Q_HUTCH = len(QUEUE) + len(QUEUE_DELIVERY)
_CH_PUBLISH = len(CHANNEL)
_CH_REDELIVER = _CH_PUBLISH + 2
_CH_ACK = _CH_PUBLISH + 3
_CH_DELIVER = len(CHANNEL) + len(CHANNEL_COUNTERS)
_CH_MORE = _CH_DELIVER + len(HUTCH_CHANNEL)
_CH_PUBLISH_CONFIRM = _CH_MORE + len(CHANNEL_MORE)
_CH_ROUTED = _CH_PUBLISH_CONFIRM + 1
assert len(CHANNEL_METRIC_FIELDS) == _CH_ROUTED + 1, "a channel's row is core/counters.py's CHANNEL_METRIC_FIELDS"


def families() -> list[Family]:
    """Every family `render` can emit, in output order (docs and tests)."""
    return [*NODE, *QUEUE, *CHANNEL, *CHANNEL_COUNTERS, *CHANNEL_MORE, *CONNECTION, *QUEUE_DELIVERY, *TOTALS,
            *CHURN, QUEUE_INFO, BUILD_INFO, IDENTITY_INFO, *GLOBAL, *GLOBAL_MORE, *GLOBAL_BY_QUEUE_TYPE, *ALARMS,
            PROCESS_START, *SCRAPE, *HUTCH_NODE, *HUTCH_QUEUE, *HUTCH_CHANNEL, *HUTCH_SHOVEL, *STREAM, *HUTCH_STREAM]


# -- scrape telemetry -------------------------------------------------------------------------------


class ScrapeStats:
    """The plugin's telemetry_scrape_* summaries: count and sum per registry. A scrape is observed
    after its body is built, so a body reports the scrapes before it (as in RabbitMQ)."""

    def __init__(self) -> None:
        self.by_registry: dict[str, list[float]] = {}  # registry -> [count, seconds, bytes]

    def observe(self, registry: str, duration_s: float, size_bytes: int) -> None:
        entry = self.by_registry.setdefault(registry, [0, 0.0, 0])
        entry[0] += 1
        entry[1] += duration_s
        entry[2] += size_bytes


# -- rendering --------------------------------------------------------------------------------------


def _num(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


class _Text:
    """The body under construction: a list of strings joined once at the end."""

    def __init__(self, per_object: bool) -> None:
        self.per_object = per_object
        self.parts: list[str] = []
        self._sums: tuple[list[tuple[int, ...]], list[int]] | None = None  # (rows, their column sums)

    def one(self, family: Family, value: Any, labels: str = "") -> None:
        self.parts.append(f"{family.header}{family.name}{labels} {_num(value)}\n")

    def samples(self, family: Family, samples: Sequence[tuple[str, Any]]) -> None:
        """One family with several samples: (label text, value) each."""
        self.parts.append(family.header)
        self.parts.extend(f"{family.name}{labels} {_num(value)}\n" for labels, value in samples)

    def columns(self, fams: Sequence[Family], labels: list[str], rows: list[tuple[int, ...]],
                offset: int = 0) -> None:
        """Family i takes column offset+i of every row: one sample per object (labels[j] is the
        label text of row j, ending in a space), or their sum when aggregated."""
        parts = self.parts
        totals: list[int] = []
        if not self.per_object and rows:  # column sums of all rows in one transposition (in C), once per rows
            cached = self._sums
            if cached is None or cached[0] is not rows:
                cached = self._sums = (rows, [sum(column) for column in zip(*rows, strict=True)])
            totals = cached[1]
        for i, fam in enumerate(fams):
            col = offset + i
            parts.append(fam.header)
            name = fam.name
            if self.per_object:
                parts.extend([f"{name}{lbl}{row[col]}\n" for lbl, row in zip(labels, rows, strict=True)])
            else:
                parts.append(f"{name} {totals[col] if totals else 0}\n")


def _queue_rows(node: Node, per_object: bool) -> tuple[list[str], list[tuple[int, ...]], list[str]]:
    """One row per queue: the columns of QUEUE, QUEUE_DELIVERY and HUTCH_QUEUE in that order, with
    each queue's label text and its rabbitmq_queue_info sample."""
    labels: list[str] = []
    rows: list[tuple[int, ...]] = []
    infos: list[str] = []
    for vhost in node.vhosts.values():
        v = escape_label(vhost.name)
        for q in vhost.queues.values():
            ready = q.message_count
            unacked = q.unacked_count
            ram = q.messages_ram
            rows.append((
                ready, unacked, ready + unacked, q.consumer_count, ram + unacked, ram, unacked,
                q.message_bytes,
                q.stat_redelivered, q.stat_acked,
                q.messages_paged_out, q.stat_published, q.stat_delivered, q.stat_get,
                getattr(q, "stat_dead_lettered", 0), getattr(q, "stat_dropped", 0), getattr(q, "stat_rejected", 0),
            ))
            if per_object:
                lbl = f'{{vhost="{v}",queue="{escape_label(q.name)}"'
                labels.append(lbl + "} ")
                infos.append(f'{QUEUE_INFO.name}{lbl},queue_type="rabbit_{q.queue_type}_queue",'
                             f'membership="leader"}} 1\n')
    return labels, rows, infos


def _channel_rows(clients: Mapping[str, Any], per_object: bool
                  ) -> tuple[list[str], list[str], list[tuple[int, ...]]]:
    """One row per live channel of every worker (the agent's `metric_samples`): the columns of CHANNEL,
    CHANNEL_COUNTERS, HUTCH_CHANNEL and CHANNEL_MORE, then publishes in confirm mode and routed enqueues
    (for the global counters): core/counters.py's CHANNEL_METRIC_FIELDS."""
    by_channel: list[str] = []
    by_channel_vhost: list[str] = []
    rows: list[tuple[int, ...]] = []
    for name, vhost, values in clients["channels"]:
        rows.append(tuple(values))
        if per_object:
            label = f'{{channel="{escape_label(name)}"'
            by_channel.append(label + "} ")
            by_channel_vhost.append(f'{label},vhost="{escape_label(vhost)}"}} ')
    return by_channel, by_channel_vhost, rows


def _global(out: _Text, closed: Mapping[str, int], channel_rows: list[tuple[int, ...]], consumers: int,
            stream: _StreamProtocol | None) -> None:
    """The rabbitmq_global_* families: AMQP 0-9-1's samples, and the stream protocol's beside them
    (protocol="stream") while its listener runs. `closed`: the closed channels' totals by attribute."""
    proto = f'{{protocol="{PROTOCOL}"}}'
    proto_type = f'{{protocol="{PROTOCOL}",queue_type="rabbit_classic_queue"}}'
    sp = f'{{protocol="{STREAM_PROTOCOL}"}}'
    sp_type = f'{{protocol="{STREAM_PROTOCOL}",queue_type="{STREAM_QUEUE_TYPE}"}}'
    received, publishers, consumers_now, delivered, redelivered, acked = GLOBAL

    def total(stat: str, col: int) -> int:
        return closed.get(stat, 0) + sum(r[col] for r in channel_rows)

    def both(family: Family, amqp: tuple[str, int], of_stream: tuple[str, int] | None) -> None:
        out.samples(family, [amqp] if stream is None or of_stream is None else [amqp, of_stream])

    s = stream or _StreamProtocol()
    more = _CH_MORE
    gets = total("stat_get", more + 2) + total("stat_get_no_ack", more + 3)
    both(received, (proto, total("stat_publish", _CH_PUBLISH)), (sp, s.received))
    both(publishers, (proto, sum(1 for r in channel_rows if r[_CH_PUBLISH])), (sp, s.publishers))  # channels that published
    both(consumers_now, (proto, consumers), (sp, s.consumers))
    # consumes and gets, as RabbitMQ; the stream protocol's deliveries are the records of the chunks it sent
    both(delivered, (proto_type, total("stat_deliver", _CH_DELIVER) + gets), (sp_type, s.delivered))
    out.one(redelivered, total("stat_redeliver", _CH_REDELIVER), proto_type)
    out.one(acked, total("stat_ack", _CH_ACK), proto_type)
    confirm_received, routed, dropped, returned, confirmed = GLOBAL_MORE
    # a stream-protocol publisher always has its messages confirmed
    both(confirm_received, (proto, total("stat_publish_confirm", _CH_PUBLISH_CONFIRM)), (sp, s.received))
    out.one(routed, total("stat_routed", _CH_ROUTED), proto)
    out.one(dropped, total("stat_drop_unroutable", more + 1), proto)
    out.one(returned, total("stat_return_unroutable", more), proto)
    both(confirmed, (proto, total("stat_confirm", _CH_PUBLISH + 1)), (sp, s.confirmed))
    manual, auto, get_manual, get_auto, get_empty = GLOBAL_BY_QUEUE_TYPE
    auto_acked = total("stat_deliver_no_ack", more + 5)
    out.one(manual, total("stat_deliver", _CH_DELIVER) - auto_acked, proto_type)
    out.one(auto, auto_acked, proto_type)
    out.one(get_manual, total("stat_get", more + 2), proto_type)
    out.one(get_auto, total("stat_get_no_ack", more + 3), proto_type)
    out.one(get_empty, total("stat_get_empty", more + 6), proto_type)


def render(node: Node, registry: str, info: Mapping[str, Any], clients: Mapping[str, Any],
           scrapes: ScrapeStats | None = None) -> str:
    """The exposition text of `registry` ("default": aggregated, "per-object"). `info` is the node's
    `system.own_node_info` (its processes' memory, descriptors and fsyncs: every worker's, summed) and
    `clients` what the node's management agent answers to `metric_samples` (every worker's connections
    and channels, their closed channels' totals and churn, summed by the agent of a node of workers); the
    queue families are the node's own queues (a worker's stand-ins carry their homes' figures)."""
    endpoint = REGISTRIES[registry]
    per_object = endpoint == "per-object"
    out = _Text(per_object)
    fsyncs = info["io_sync_count"]
    for fam, value in zip(NODE, (info["fd_used"], info["mem_used"], info["disk_free"], info["fd_total"],
                                 info["mem_limit"], info["disk_free_limit"], info["uptime"] / 1000, fsyncs),
                          strict=True):
        out.one(fam, value)

    q_labels, q_rows, q_infos = _queue_rows(node, per_object)
    out.columns(QUEUE, q_labels, q_rows)
    ch_labels, chv_labels, ch_rows = _channel_rows(clients, per_object)
    out.columns(CHANNEL, ch_labels, ch_rows)
    out.columns(CHANNEL_COUNTERS, chv_labels, ch_rows, offset=_CH_PUBLISH)
    out.columns(CHANNEL_MORE, chv_labels, ch_rows, offset=_CH_MORE)
    conn_labels: list[str] = []
    conn_rows: list[tuple[int, ...]] = []
    for name, recv_oct, send_oct, channels in clients["connections"]:
        conn_rows.append((recv_oct, send_oct, channels))
        if per_object:
            conn_labels.append(f'{{channel="{escape_label(name)}"}} ')
    out.columns(CONNECTION, conn_labels, conn_rows)
    out.columns(QUEUE_DELIVERY, q_labels, q_rows, offset=len(QUEUE))

    consumers = sum(r[_Q_CONSUMERS] for r in q_rows)
    for fam, value in zip(TOTALS, (len(conn_rows), len(ch_rows), consumers, len(q_rows)), strict=True):
        out.one(fam, value)
    churn = clients["churn"]
    for fam, key in zip(CHURN, CHURN_KEYS, strict=True):
        out.one(fam, churn.get(key, 0))
    if per_object:
        out.parts.append(QUEUE_INFO.header)
        out.parts.extend(q_infos)
    out.one(BUILD_INFO, 1, _labels((
        ("product_name", "hutch"), ("product_version", __version__), ("rabbitmq_version", __version__),
        ("prometheus_plugin_version", __version__), ("prometheus_client_version", __version__),
        ("python_version", platform.python_version()))))
    out.one(IDENTITY_INFO, 1, _labels((
        ("rabbitmq_node", node.public_name), ("rabbitmq_cluster", node.config.cluster_name),
        ("rabbitmq_endpoint", endpoint))))

    _global(out, clients["closed"], ch_rows, consumers, _stream_protocol(clients))
    out.one(ALARMS[0], int("disk" in node.alarms))
    out.one(ALARMS[1], int("memory" in node.alarms))
    out.one(PROCESS_START, int(node.started_at))
    _scrape_telemetry(out, registry, scrapes)

    syncs = info["io_sync_batch_count"]
    for fam, value in zip(HUTCH_NODE, (fsyncs, syncs, int(node.memory_pressure)), strict=True):
        out.one(fam, value)
    out.columns(HUTCH_QUEUE, q_labels, q_rows, offset=_Q_HUTCH)
    out.columns(HUTCH_CHANNEL, chv_labels, ch_rows, offset=_CH_DELIVER)
    _shovels(out, node)
    _streams(out, clients)
    return "".join(out.parts)


@dataclass(frozen=True, slots=True)
class _StreamProtocol:
    """The stream protocol's side of the rabbitmq_global_* families (protocol="stream")."""

    received: int = 0
    confirmed: int = 0
    errored: int = 0
    delivered: int = 0
    publishers: int = 0
    consumers: int = 0


def _stream_protocol(clients: Mapping[str, Any]) -> _StreamProtocol | None:
    """The node's stream protocol counters (every worker's, summed by the agent); None without a listener."""
    counted = clients["stream_protocol"]
    return _StreamProtocol(*counted) if counted else None


def _streams(out: _Text, clients: Mapping[str, Any]) -> None:
    """rabbitmq_stream_segments and rabbitmq_stream_consumer_max_offset_lag: per stream (labels vhost,
    queue) on the per-object registry, else their sum and their maximum (as the plugin aggregates them);
    the lag counts AMQP 0-9-1 consumers and stream-protocol subscriptions alike. hutch_stream_messages_
    errored_total: the stream protocol's publish errors. Both from the agent's `metric_samples` (every
    worker's streams and counters; a stream every worker holds a member of is one row)."""
    segments, lag = STREAM
    rows = clients["streams"]
    if out.per_object:
        out.samples(segments, [(_labels((("vhost", v), ("queue", n))), count) for v, n, count, _lag in rows])
        out.samples(lag, [(_labels((("vhost", v), ("queue", n))), behind) for v, n, _count, behind in rows])
    else:
        out.one(segments, sum(r[2] for r in rows))
        out.one(lag, max((r[3] for r in rows), default=0))
    counted = _stream_protocol(clients)
    out.one(HUTCH_STREAM[0], counted.errored if counted is not None else 0, _labels((("protocol", STREAM_PROTOCOL),)))


def _shovels(out: _Text, node: Node) -> None:
    """hutch_shovels by state; the message counters per shovel (labels vhost, shovel) or summed."""
    found = node.shovels.status() if node.shovels is not None else []
    gauge, forwarded, acked = HUTCH_SHOVEL
    out.parts.append(gauge.header)
    out.parts.extend(f'{gauge.name}{{state="{state}"}} {sum(s["state"] == state for s in found)}\n'
                     for state in SHOVEL_STATES)
    labels = [_labels((("vhost", s["vhost"]), ("shovel", s["name"]))) + " " for s in found]
    rows: list[tuple[int, ...]] = [(int(s["messages_forwarded"]), int(s["messages_acknowledged"])) for s in found]
    out.columns((forwarded, acked), labels, rows)


def _scrape_telemetry(out: _Text, registry: str, scrapes: ScrapeStats | None) -> None:
    count, seconds, size = (scrapes.by_registry.get(registry) if scrapes is not None else None) or (0, 0.0, 0)
    labels = _labels((("registry", registry), ("content_type", CONTENT_TYPE)))
    duration, size_bytes = SCRAPE
    out.parts.append(f"{duration.header}{duration.name}_count{labels} {int(count)}\n"
                     f"{duration.name}_sum{labels} {float(seconds)!r}\n")
    out.parts.append(f"{size_bytes.header}{size_bytes.name}_count{labels} {int(count)}\n"
                     f"{size_bytes.name}_sum{labels} {int(size)}\n")


__all__ = ["CONTENT_TYPE", "REGISTRIES", "Family", "ScrapeStats", "escape_label", "families", "render"]
