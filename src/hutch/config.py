"""Node configuration: the one ``Config`` object, resolved once at start-up.

This module owns the settings a node starts with, their RabbitMQ defaults, the parser for
RabbitMQ-style ("new style", sysctl-like) configuration files, and the resolution order:

    command-line flag  >  HUTCH_* environment variable  >  config file  >  built-in default

Environment variables carry the same few settings as the flags (a flag given by the
environment), so they sit just under the flags. Every value from every source is validated
with the same rules; an error is a ``ConfigError`` whose one-line message names where the
value came from (``file:line``, the variable or the flag), the key and what is allowed.

Stdlib only. The only IO is reading the config file in ``load_config``; ``parse_config_text``
is pure. See docs/configuration.md for every key.
"""

from __future__ import annotations

import difflib
import ipaddress
import platform
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ENV_VARS",
    "FLAGS",
    "LOG_LEVELS",
    "Config",
    "ConfigError",
    "default_node_name",
    "load_config",
    "parse_config_text",
    "parse_information_unit",
]

MiB = 1024 * 1024
MAX_MESSAGE_SIZE_LIMIT = 512 * MiB  # RabbitMQ's hard cap
LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "none")


class ConfigError(Exception):
    """A configuration problem; ``str(exc)`` is one line fit to print as is."""


def default_node_name(hostname: str | None = None) -> str:
    """``hutch@<short hostname>``, like RabbitMQ's ``rabbit@<short hostname>``."""
    host = (hostname if hostname is not None else platform.node()).split(".", 1)[0]
    return f"hutch@{host or 'localhost'}"


TLS_VERIFY = ("verify_none", "verify_peer")
TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")
CERT_LOGIN_FROM = ("distinguished_name", "common_name", "subject_alternative_name", "subject_alt_name")
CERT_LOGIN_SAN_TYPES = ("dns", "ip", "email", "uri", "other_name")
AUTH_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")


@dataclass(frozen=True)
class TlsOptions:
    """One listener's TLS settings, RabbitMQ's ``ssl_options.*`` (also ``management.ssl.*`` and
    ``cluster.ssl.*``). ``versions`` and ``ciphers`` are empty for "the TLS library's defaults"
    (TLS 1.2 and 1.3). Invariant (from ``load_config``): a section that is used has a certfile and
    a keyfile, and ``verify_peer`` has a cacertfile."""

    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = field(default=None, repr=False)
    verify: str = "verify_none"
    fail_if_no_peer_cert: bool = False
    versions: tuple[str, ...] = ()
    ciphers: tuple[str, ...] = ()

    @property
    def configured(self) -> bool:
        return bool(self.certfile or self.keyfile or self.cacertfile)


@dataclass(frozen=True)
class Config:
    """Everything a node needs to start. Defaults are RabbitMQ's.

    Invariant (when built by ``load_config``): every field is validated; ``cluster_name`` is
    never empty (it defaults to ``node_name``). Built directly (tests), values are trusted,
    so e.g. port 0 (pick a free port) is allowed.
    """

    amqp_host: str = ""
    amqp_port: int = 5672
    management_host: str = ""
    management_port: int = 15672
    data_dir: str = "./var"
    node_name: str = field(default_factory=default_node_name)
    cluster_name: str = ""
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    max_message_size: int = 16 * MiB
    # bytes of unfinished message bodies (header received, last body frame not yet) one connection may
    # hold over all its channels (a hutch key); 0: 4 x max_message_size. Never below max_message_size.
    max_unfinished_body_bytes: int = 0
    # the same over every connection of the node (issue 21; a hutch key); 0: a quarter of the memory high
    # watermark. Never below max_message_size.
    max_unfinished_body_bytes_total: int = 0
    handshake_timeout_ms: int = 10_000
    # the TLS handshake of every TLS listener (AMQP over TLS, management HTTPS, the cluster's TLS port,
    # which is also bounded by its peer timeout), counted from the accept: RabbitMQ's ssl_handshake_timeout
    ssl_handshake_timeout_ms: int = 5_000
    consumer_timeout_ms: int = 1_800_000
    default_user: str = "guest"
    default_pass: str = field(default="guest", repr=False)
    default_vhost: str = "/"
    loopback_users: tuple[str, ...] = ("guest",)
    log_level: str = "info"
    # RabbitMQ's `log.console`: false turns the console (stderr) log off; hutch has no other log output
    log_console: bool = True
    # the window of the log throttle (core/logsafe.py): at most 20 lines of one kind (login refusals,
    # update-secret lines) per window, the next one saying how many were left out; a hutch key
    log_throttle_interval_ms: int = 10_000
    vm_memory_high_watermark: float = 0.4
    disk_free_limit_bytes: int = 50_000_000
    # RabbitMQ's alternatives: an absolute memory watermark (bytes) and a disk limit relative to RAM;
    # 0 means "not set", and when set they take the place of the relative/absolute default
    vm_memory_high_watermark_bytes: int = 0
    disk_free_limit_relative: float = 0.0
    vm_memory_high_watermark_paging_ratio: float = 0.5
    # classic queue storage (seed 002): messages below this serialized size live in the queue index,
    # larger ones in the vhost's message store; store files roll over at the limit; index segments
    # hold a fixed number of entries
    queue_index_embed_msgs_below: int = 4096
    msg_store_file_size_limit: int = 16 * MiB
    queue_index_segment_entries: int = 16384
    # ready messages a classic queue keeps in RAM before it pages to disk (a hutch key; RabbitMQ 3.10
    # keeps them all until memory pressure)
    classic_queue_ram_limit: int = 131072
    collect_statistics_interval_ms: int = 5000
    # the management listener (docs/security.md): the time a connection has to send a whole request head
    # (from its opening or the end of the previous response), the longest pause while a request body
    # arrives, the longest silence of any connection, the open connections at once (None: 1024, or a
    # quarter of the descriptor limit when that is lower), the largest request body, and whether
    # /metrics gives per-object metrics (and /metrics/per-object needs no login)
    management_request_timeout_ms: int = 5_000  # Cowboy's request_timeout (issue 21: 60 s let idle sockets hold the cap)
    management_idle_timeout_ms: int = 60_000
    management_inactivity_timeout_ms: int = 300_000
    management_max_connections: int | None = None
    # connections open at once from one source address (None: a quarter of management_max_connections)
    management_max_connections_per_source: int | None = None
    management_max_body_bytes: int = 20 * MiB
    # a request body of a user without the administrator tag (issue 21; a hutch key)
    management_non_admin_max_body_bytes: int = 1 * MiB
    prometheus_return_per_object_metrics: bool = False
    # a definitions file (RabbitMQ's JSON export) imported at boot, after recovery and before the
    # listeners accept clients; when set, a fresh node does not create the default user and vhost
    load_definitions: str | None = None
    # clustering (docs/clustering.md): a node is a cluster (of one, until others join) unless clustering is
    # turned off (`--no-cluster`, `cluster.enabled = false`), as a RabbitMQ node always is; the
    # inter-node port is RabbitMQ's 25672. `cluster_join` (NODE@HOST:PORT) is a seed node a new node
    # joins through on its first start.
    cluster_enabled: bool = True
    cluster_port: int = 25672
    cluster_host: str = ""
    cluster_advertise_host: str = ""  # the host other nodes dial; default 127.0.0.1
    cluster_join: str | None = None
    cluster_port_set: bool = False  # the inter-node port was given (flag, variable or file), not defaulted
    cluster_secret: str = field(default="", repr=False)
    cluster_secret_file: str | None = None
    cluster_metadata_timeout_ms: int = 30_000  # RabbitMQ's Khepri command timeout
    cluster_tick_ms: int = 100  # one Raft tick; elections after 10-20 ticks
    cluster_fault_injection: bool = False  # tests: POST /api/cluster-faults may cut this node off
    quorum_cluster_size: int = 3  # members of a new quorum queue (capped by the cluster's size)
    queue_leader_locator: str = "client-local"  # where a new quorum queue's leader goes: or "balanced"
    dead_letter_worker_consumer_prefetch: int = 32  # at-least-once dead-lettering of quorum queues
    raft_wal_max_size_bytes: int = 512 * MiB  # raft.wal_max_size_bytes: the shared WAL is flushed past it
    raft_segment_max_entries: int = 4096  # raft.segment_max_entries (at most 65535)
    quorum_commands_soft_limit: int = 32  # enqueue entries in flight to one quorum queue before flow
    # password checks (runtime/broker/logins.py, docs/security.md): threads that run scrypt (0: half the CPUs,
    # at least 1), and how many uncached logins may wait for one, in all and per source address
    auth_hash_threads: int = 0
    auth_max_pending_logins: int = 64
    auth_max_pending_logins_per_source: int = 8
    # a cluster secret file that group or others may read is refused unless this is set (then warned)
    cluster_secret_file_insecure_ok: bool = False
    # TLS (docs/security.md): the AMQP-over-TLS listener (`listeners.ssl.default`, off by default) and
    # `ssl_options.*`; HTTPS for the management API (`management.ssl.*`); TLS between cluster nodes
    # (`cluster.ssl.*`, both sides verify the other's certificate). `management_tcp` is False when only
    # an HTTPS management listener was asked for (as RabbitMQ: then there is no plain HTTP listener).
    amqps_host: str = ""
    amqps_port: int | None = None
    # The stream protocol (docs/streams.md): off unless a port is given (`stream.listeners.tcp.default`,
    # `--stream-port`; RabbitMQ's is 5552 with rabbitmq_stream enabled), over TLS with `ssl_options.*` on
    # `stream.listeners.ssl.default` (5551). Frames are bounded by `stream_initial_frame_max` until open,
    # then by `stream_frame_max`; metadata answers advertise `stream_advertised_host`/`_port` when set
    # (else the address the client connected to).
    stream_host: str = ""
    stream_port: int | None = None
    stream_tls_host: str = ""
    stream_tls_port: int | None = None
    stream_frame_max: int = 1_048_576
    stream_initial_frame_max: int = 8_192
    stream_heartbeat_s: int = 60
    stream_advertised_host: str = ""
    stream_advertised_port: int | None = None
    # Bytes a stream connection's subscriptions may keep for their properties and filter values
    # (`stream.max_subscription_properties_bytes`, per connection), and what all the connections of
    # one process may keep beyond the first MiB each (`..._bytes_total`): docs/security.md
    stream_max_subscription_properties_bytes: int = 16 << 20
    stream_max_subscription_properties_bytes_total: int = 256 << 20
    ssl_options: TlsOptions = field(default_factory=TlsOptions)
    management_ssl_host: str = ""
    management_ssl_port: int | None = None
    management_ssl: TlsOptions = field(default_factory=TlsOptions)
    management_tcp: bool = True
    cluster_ssl: TlsOptions = field(default_factory=TlsOptions)
    # SASL mechanisms offered to AMQP clients, in order (`auth_mechanisms.N`); EXTERNAL only on TLS
    # connections with a verified client certificate, whose user name comes from `ssl_cert_login_*`
    auth_mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    ssl_cert_login_from: str = "distinguished_name"
    ssl_cert_login_san_type: str = "dns"
    ssl_cert_login_san_index: int = 0
    # how often certificate and key files are checked for changes (0: only on SIGHUP); a hutch key
    ssl_cert_reload_interval_ms: int = 10_000
    quorum_snapshot_interval: int = 16_384  # commands (messages) between snapshots of a quorum queue, at least
    # worker processes (docs/scaling.md): `workers` processes serve the node (0: `auto`, the default: the
    # cores this process may run on, or 1 for a node set up for a multi-node cluster or holding a one-process
    # node's data; runtime/workers/auto.py); 1 is one process and no supervisor. `worker_own_ports`: each
    # worker also listens on a port of its own (reported as `amqp_w<N>` in ports.json), so a client can pick
    # its worker. `worker_index` is set only inside a worker process (never from a file, flag or variable).
    workers: int = 0
    worker_own_ports: bool = False
    worker_heartbeat_timeout_ms: int = 5_000
    # `workers.locality`: a connection whose first publish or consume uses a queue of another worker moves
    # there while quiet (runtime/workers/handover.py, docs/scaling.md "Connection locality")
    worker_locality: bool = True
    # `workers.compaction`: worker 0 moves islands (a queue and the connections that use only it) onto fewer
    # workers while the node is far below a core, and spreads them when a loop saturates (runtime/compaction.py,
    # docs/scaling.md "Compaction of load"; on by default since session 19: a move's wait for quiet ends
    # between messages in milliseconds and a loaded node's busy share is measured whole, so at full speed
    # nothing moves and a move that does holds its island ~0.3-0.5 s); off whenever `workers.locality` is
    # off (`compaction_on`)
    worker_compaction: bool = True
    worker_index: int | None = None
    config_file: str | None = None
    raw: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    """The config file's ``key = value`` pairs exactly as written (last one wins)."""

    def __post_init__(self) -> None:
        if not self.cluster_name:
            object.__setattr__(self, "cluster_name", self.node_name)

    @property
    def compaction_on(self) -> bool:
        """Compaction of load runs: a worker of a node of workers with `workers.compaction` and
        `workers.locality` both on (an island is a queue with its connections, which only locality gathers)."""
        return self.worker_index is not None and self.worker_compaction and self.worker_locality

    @property
    def console_log_level(self) -> str:
        """The level the console (stderr) log is written at: `log_level`, or `none` with `log.console = false`."""
        return self.log_level if self.log_console else "none"


# --------------------------------------------------------------------------------------------
# Value parsers. Each takes the text and returns {field: value}, or raises _BadValue(expected).


class _BadValue(Exception):
    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


_Parser = Callable[[str], dict[str, Any]]


def _int_in(text: str, low: int, high: int, expected: str | None = None) -> int:
    expected = expected or f"an integer between {low} and {high}"
    if not re.fullmatch(r"[+-]?\d+", text):
        raise _BadValue(expected)
    value = int(text)
    if not low <= value <= high:
        raise _BadValue(expected)
    return value


def _float_in(text: str, low: float, high: float, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _BadValue(expected) from None
    if not low <= value <= high:
        raise _BadValue(expected)
    return value


def _int_field(name: str, low: int, high: int) -> _Parser:
    return lambda text: {name: _int_in(text, low, high)}


def _parse_frame_max(text: str) -> dict[str, Any]:
    expected = "0 (no limit) or an integer between 4096 and 2147483647"
    value = _int_in(text, 0, 2**31 - 1, expected)
    if 0 < value < 4096:
        raise _BadValue(expected)
    return {"frame_max": value}


def _host(text: str) -> str:
    """An IP address (brackets allowed around IPv6) or a host name; no spaces."""
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", host):
        return host
    raise _BadValue("an IP address or host name")


def _listener(host_field: str, port_field: str, example_port: int) -> _Parser:
    expected = (f"a port (0-65535; 0: any free port) or host:port, e.g. {example_port}, "
                f"127.0.0.1:{example_port} or [::1]:{example_port}")

    def parse(text: str) -> dict[str, Any]:
        if re.fullmatch(r"\d+", text):
            return {port_field: _int_in(text, 0, 65535, expected)}
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise _BadValue(expected)
        try:
            return {host_field: _host(host), port_field: _int_in(port, 0, 65535, expected)}
        except _BadValue:
            raise _BadValue(expected) from None

    return parse


_parse_listener = _listener("amqp_host", "amqp_port", 5672)


def _host_field(name: str) -> _Parser:
    return lambda text: {name: _host(text)}


def _choice_field(name: str, choices: tuple[str, ...]) -> _Parser:
    def parse(text: str) -> dict[str, Any]:
        if text not in choices:
            raise _BadValue("one of " + ", ".join(choices))
        return {name: text}

    return parse


def _nonempty_field(name: str) -> _Parser:
    def parse(text: str) -> dict[str, Any]:
        if not text:
            raise _BadValue("a non-empty string")
        return {name: text}

    return parse


MAX_WORKERS = 1024


def _parse_workers(text: str) -> dict[str, Any]:
    """`auto` (stored as 0: resolved by the supervisor from the CPU affinity and cgroup quota) or 1..1024."""
    if text == "auto":
        return {"workers": 0}
    return {"workers": _int_in(text, 1, MAX_WORKERS, f"auto or an integer between 1 and {MAX_WORKERS}")}


def _parse_node_name(text: str) -> dict[str, Any]:
    if not re.fullmatch(r"[^\s@]+(@[^\s@]+)?", text):
        raise _BadValue("a name like 'hutch' or 'hutch@host' (no spaces, at most one '@')")
    return {"node_name": text}


def _parse_join(text: str) -> dict[str, Any]:
    if not re.fullmatch(r"[^\s@]+(@[^\s@]+)?@\[?[A-Za-z0-9.:-]+\]?:\d{1,5}", text):
        raise _BadValue("a seed node as NODE@HOST:PORT, e.g. n1@127.0.0.1:25672 or n1@db1@10.0.0.5:25672")
    return {"cluster_join": text}


def _parse_log_level(text: str) -> dict[str, Any]:
    if text.lower() not in LOG_LEVELS:
        raise _BadValue("one of " + ", ".join(LOG_LEVELS))
    return {"log_level": text.lower()}


def _parse_watermark(text: str) -> dict[str, Any]:
    value = _float_in(text, 0.0, 1.0, "a fraction of RAM between 0.0 and 1.0, e.g. 0.4")
    return {"vm_memory_high_watermark": value, "vm_memory_high_watermark_bytes": 0}  # the last key wins


_UNIT_MULTIPLIERS = {
    "": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}  # fmt: skip


def parse_information_unit(text: str) -> int:
    """Bytes from RabbitMQ's information units: ``50000000``, ``500kB``, ``50MB``, ``1GB``
    (powers of 1000) or ``512k``, ``512KiB``, ``2M``, ``2GiB`` (powers of 1024).
    Case-insensitive. ValueError if malformed."""
    match = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text.strip())
    if not match or match.group(2).lower() not in _UNIT_MULTIPLIERS:
        raise ValueError(f"invalid information unit {text!r}")
    return int(match.group(1)) * _UNIT_MULTIPLIERS[match.group(2).lower()]


def _parse_watermark_absolute(text: str) -> dict[str, Any]:
    try:
        value = parse_information_unit(text)
    except ValueError:
        raise _BadValue("a memory size in bytes, optionally with a unit: kB, MB, GB (x1000) or "
                        "k, KiB, MiB, GiB (x1024)") from None
    if value <= 0:
        raise _BadValue("a memory size greater than 0")
    return {"vm_memory_high_watermark_bytes": value}  # takes the place of .relative


def _parse_paging_ratio(text: str) -> dict[str, Any]:
    value = _float_in(text, 0.0, 1.0, "a fraction of the memory high watermark between 0.0 and 1.0, e.g. 0.5")
    return {"vm_memory_high_watermark_paging_ratio": value}


def _parse_store_file_size(text: str) -> dict[str, Any]:
    expected = "a size between 64kB and 2GiB, optionally with a unit: kB, MB (x1000) or KiB, MiB (x1024)"
    try:
        value = parse_information_unit(text)
    except ValueError:
        raise _BadValue(expected) from None
    if not 65536 <= value <= 2 * 1024**3:
        raise _BadValue(expected)
    return {"msg_store_file_size_limit": value}


def _parse_disk_free_relative(text: str) -> dict[str, Any]:
    value = _float_in(text, 0.0, 100.0, "a ratio of total RAM between 0.0 and 100.0, e.g. 1.5")
    return {"disk_free_limit_relative": value}


def _parse_disk_free_limit(text: str) -> dict[str, Any]:
    try:
        return {"disk_free_limit_bytes": parse_information_unit(text), "disk_free_limit_relative": 0.0}
    except ValueError:
        raise _BadValue(
            "a size in bytes, optionally with a unit: kB, MB, GB (x1000) or k, KiB, MiB, GiB (x1024)"
        ) from None


def _parse_bool(text: str) -> bool:
    if text.lower() == "true":
        return True
    if text.lower() == "false":
        return False
    raise _BadValue("true or false")


def _no_effect(check: Callable[[str], object]) -> _Parser:
    """A RabbitMQ key with no equivalent in hutch: its value is checked as RabbitMQ checks it (so a typo
    is still an error) and the key changes nothing (docs/configuration.md, "RabbitMQ keys without an
    effect")."""

    def parse(text: str) -> dict[str, Any]:
        check(text)
        return {}

    return parse


def _parse_reverse_dns(text: str) -> dict[str, Any]:
    if _parse_bool(text):
        raise _BadValue("false (hutch shows a connection's peer address, never a looked-up host name)")
    return {}


def _parse_cluster_enabled(text: str) -> dict[str, Any]:
    return {"cluster_enabled": _parse_bool(text)}
# TLS sections: `<prefix>.<option>` -> the TlsOptions field of the Config field named here.
_TLS_SECTIONS = {"ssl_options.": "ssl_options", "management.ssl.": "management_ssl", "cluster.ssl.": "cluster_ssl"}
# options every section takes, and the numbered lists (`versions.1 = tlsv1.3`)
_TLS_OPTIONS = ("cacertfile", "certfile", "keyfile", "password", "verify", "fail_if_no_peer_cert")
_TLS_LISTS = ("versions", "ciphers")
# the cluster always verifies both sides: these do not apply to it
_CLUSTER_FIXED = ("verify", "fail_if_no_peer_cert")
# numbered list keys outside the TLS sections: prefix -> Config field
_LIST_KEYS = {"auth_mechanisms": "auth_mechanisms"}


def _tls_option(option: str, text: str) -> Any:
    """The value of one TLS option (not a list), validated."""
    if option in ("cacertfile", "certfile", "keyfile", "password"):
        if not text:
            raise _BadValue("a non-empty string" if option == "password" else "a file path")
        return text
    if option == "verify":
        if text not in TLS_VERIFY:
            raise _BadValue("one of " + ", ".join(TLS_VERIFY))
        return text
    assert option == "fail_if_no_peer_cert", option
    return _parse_bool(text)


def _list_item(name: str, text: str) -> str:
    if name == "versions":
        if text.lower() not in TLS_VERSIONS:
            raise _BadValue("one of " + ", ".join(TLS_VERSIONS) + " (older TLS versions are not offered)")
        return text.lower()
    if name == "auth_mechanisms":
        if text not in AUTH_MECHANISMS:
            raise _BadValue("one of " + ", ".join(AUTH_MECHANISMS))
        return text
    if not re.fullmatch(r"[A-Za-z0-9_+\-.:@=]+", text):  # an OpenSSL cipher (suite) name
        raise _BadValue("an OpenSSL cipher suite name, e.g. ECDHE-RSA-AES256-GCM-SHA384")
    return text


class _Sections:
    """Accumulates TLS sections and numbered lists while a file is parsed (the last line of a key wins;
    list items are ordered by their number)."""

    def __init__(self) -> None:
        self.tls: dict[str, dict[str, Any]] = {}
        self.lists: dict[tuple[str, str], dict[int, str]] = {}

    def take(self, key: str, value: str) -> bool:
        """Handle `key` if it belongs to a TLS section or a numbered list; False if it does not."""
        for prefix, target in _TLS_SECTIONS.items():
            if key.startswith(prefix) and key[len(prefix):] not in ("port", "ip"):
                self._tls_key(target, key[len(prefix):], value)
                return True
        name, _, number = key.rpartition(".")
        if name in _LIST_KEYS and number.isdigit():
            self.lists.setdefault(("", name), {})[int(number)] = _list_item(name, value)
            return True
        return False

    def _tls_key(self, target: str, option: str, value: str) -> None:
        fields = self.tls.setdefault(target, {})
        name, _, number = option.partition(".")
        if target == "cluster_ssl" and name in _CLUSTER_FIXED:
            raise _UnknownKey("(the cluster always verifies both peers' certificates against cluster.ssl.cacertfile)")
        if name in _TLS_LISTS and number.isdigit():
            self.lists.setdefault((target, name), {})[int(number)] = _list_item(name, value)
        elif option in _TLS_OPTIONS:
            fields[option] = _tls_option(option, value)
        else:
            raise _UnknownKey(f"(a TLS section takes {', '.join(_TLS_OPTIONS)}, versions.N and ciphers.N)")

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (target, name), items in self.lists.items():
            values = tuple(items[n] for n in sorted(items))
            if target:
                self.tls.setdefault(target, {})[name] = values
            else:
                out[_LIST_KEYS[name]] = values
        for target, fields in self.tls.items():
            out[target] = TlsOptions(**fields)
        return out


class _UnknownKey(Exception):
    def __init__(self, hint: str) -> None:
        super().__init__(hint)
        self.hint = hint


# Config-file keys. loopback_users.<name> and loopback_users are handled in parse_config_text.
_FILE_KEYS: dict[str, _Parser] = {
    "listeners.tcp.default": _parse_listener,
    "management.tcp.port": _int_field("management_port", 0, 65535),
    "management.tcp.ip": _host_field("management_host"),
    "management.tcp.request_timeout": _int_field("management_request_timeout_ms", 100, 2**31 - 1),
    "management.tcp.idle_timeout": _int_field("management_idle_timeout_ms", 100, 2**31 - 1),
    "management.tcp.inactivity_timeout": _int_field("management_inactivity_timeout_ms", 100, 2**31 - 1),
    "management.tcp.max_connections": _int_field("management_max_connections", 1, 1_000_000),
    "management.tcp.max_connections_per_source": _int_field("management_max_connections_per_source", 1, 1_000_000),
    "management.http.max_body_size": _int_field("management_max_body_bytes", 1, 2**31 - 1),
    "management.http.non_admin_max_body_size": _int_field("management_non_admin_max_body_bytes", 1, 2**31 - 1),
    "prometheus.return_per_object_metrics":
        lambda text: {"prometheus_return_per_object_metrics": _parse_bool(text)},
    "listeners.ssl.default": _listener("amqps_host", "amqps_port", 5671),
    "stream.listeners.tcp.default": _listener("stream_host", "stream_port", 5552),
    "stream.listeners.ssl.default": _listener("stream_tls_host", "stream_tls_port", 5551),
    "stream.frame_max": _int_field("stream_frame_max", 8192, 2**31 - 1),
    "stream.initial_frame_max": _int_field("stream_initial_frame_max", 4096, 2**31 - 1),
    "stream.heartbeat": _int_field("stream_heartbeat_s", 0, 65535),
    "stream.advertised_host": _nonempty_field("stream_advertised_host"),
    "stream.advertised_port": _int_field("stream_advertised_port", 1, 65535),
    "stream.max_subscription_properties_bytes": _int_field("stream_max_subscription_properties_bytes",
                                                           64 << 10, 2**40),
    "stream.max_subscription_properties_bytes_total": _int_field("stream_max_subscription_properties_bytes_total",
                                                                 0, 2**40),
    "management.ssl.port": _int_field("management_ssl_port", 0, 65535),
    "management.ssl.ip": _host_field("management_ssl_host"),
    "ssl_cert_login_from": _choice_field("ssl_cert_login_from", CERT_LOGIN_FROM),
    "ssl_cert_login_san_type": _choice_field("ssl_cert_login_san_type", CERT_LOGIN_SAN_TYPES),
    "ssl_cert_login_san_index": _int_field("ssl_cert_login_san_index", 0, 1000),
    "ssl_cert_reload_interval": _int_field("ssl_cert_reload_interval_ms", 0, 2**31 - 1),
    "frame_max": _parse_frame_max,
    "channel_max": _int_field("channel_max", 0, 65535),
    "heartbeat": _int_field("heartbeat_s", 0, 65535),
    "max_message_size": _int_field("max_message_size", 1, MAX_MESSAGE_SIZE_LIMIT),
    "max_unfinished_body_bytes": _int_field("max_unfinished_body_bytes", 0, 2**40),
    "max_unfinished_body_bytes_total": _int_field("max_unfinished_body_bytes_total", 0, 2**40),
    "handshake_timeout": _int_field("handshake_timeout_ms", 1, 2**31 - 1),
    "ssl_handshake_timeout": _int_field("ssl_handshake_timeout_ms", 1, 2**31 - 1),
    "consumer_timeout": _int_field("consumer_timeout_ms", 1, 2**53),
    "default_user": _nonempty_field("default_user"),
    "default_pass": _nonempty_field("default_pass"),
    "default_vhost": _nonempty_field("default_vhost"),
    "log.console.level": _parse_log_level,
    "log.console": lambda text: {"log_console": _parse_bool(text)},
    # RabbitMQ keys without an effect here (docs/configuration.md): Erlang's acceptor processes (each
    # worker accepts on its own event loop), the metrics collector (hutch counts on demand), how the
    # Erlang VM's memory is measured (hutch reads its processes' resident set), reverse DNS (off, as
    # RabbitMQ's default; `true` is refused)
    "num_acceptors.tcp": _no_effect(lambda text: _int_in(text, 1, 2**31 - 1)),
    "num_acceptors.ssl": _no_effect(lambda text: _int_in(text, 1, 2**31 - 1)),
    "management_agent.disable_metrics_collector": _no_effect(_parse_bool),
    "vm_memory_calculation_strategy":
        _no_effect(_choice_field("vm_memory_calculation_strategy", ("rss", "allocated", "legacy", "erlang"))),
    "reverse_dns_lookups": _parse_reverse_dns,
    "log.throttle_interval": _int_field("log_throttle_interval_ms", 1, 2**31 - 1),
    "vm_memory_high_watermark.relative": _parse_watermark,
    "disk_free_limit.absolute": _parse_disk_free_limit,
    "vm_memory_high_watermark.absolute": _parse_watermark_absolute,
    "disk_free_limit.relative": _parse_disk_free_relative,
    "vm_memory_high_watermark_paging_ratio": _parse_paging_ratio,
    "queue_index_embed_msgs_below": _int_field("queue_index_embed_msgs_below", 0, MAX_MESSAGE_SIZE_LIMIT),
    "msg_store_file_size_limit": _parse_store_file_size,
    "queue_index_segment_entries": _int_field("queue_index_segment_entries", 16, 1_048_576),
    "classic_queue_ram_limit": _int_field("classic_queue_ram_limit", 1, 2**31 - 1),
    "collect_statistics_interval": _int_field("collect_statistics_interval_ms", 1, 2**31 - 1),
    "cluster_name": _nonempty_field("cluster_name"),
    "node_name": _parse_node_name,
    "data_dir": _nonempty_field("data_dir"),
    "load_definitions": _nonempty_field("load_definitions"),
    "management.load_definitions": _nonempty_field("load_definitions"),  # RabbitMQ's older key
    "cluster.enabled": _parse_cluster_enabled,
    "cluster.listener.port": _int_field("cluster_port", 0, 65535),
    "cluster.listener.ip": _host_field("cluster_host"),
    "cluster.advertise_host": _host_field("cluster_advertise_host"),
    "cluster.join": _parse_join,
    "cluster.secret_file": _nonempty_field("cluster_secret_file"),
    "cluster.metadata_timeout": _int_field("cluster_metadata_timeout_ms", 100, 2**31 - 1),
    "cluster.tick_interval": _int_field("cluster_tick_ms", 5, 10_000),
    "cluster.fault_injection": lambda text: {"cluster_fault_injection": _parse_bool(text)},
    "quorum_cluster_size": _int_field("quorum_cluster_size", 1, 1000),
    "queue_leader_locator": _choice_field("queue_leader_locator", ("client-local", "balanced")),
    "dead_letter_worker_consumer_prefetch": _int_field("dead_letter_worker_consumer_prefetch", 1, 65535),
    "raft.wal_max_size_bytes": _int_field("raft_wal_max_size_bytes", 65536, 2**40),
    "raft.segment_max_entries": _int_field("raft_segment_max_entries", 1, 65535),
    "quorum_commands_soft_limit": _int_field("quorum_commands_soft_limit", 1, 2**31 - 1),
    "auth.hash_threads": _int_field("auth_hash_threads", 0, 64),
    "auth.max_pending_logins": _int_field("auth_max_pending_logins", 1, 1_000_000),
    "auth.max_pending_logins_per_source": _int_field("auth_max_pending_logins_per_source", 1, 1_000_000),
    "cluster.secret_file_insecure_ok": lambda text: {"cluster_secret_file_insecure_ok": _parse_bool(text)},
    "quorum_snapshot_interval": _int_field("quorum_snapshot_interval", 64, 2**31 - 1),
    "workers": _parse_workers,
    "workers.own_ports": lambda text: {"worker_own_ports": _parse_bool(text)},
    "workers.locality": lambda text: {"worker_locality": _parse_bool(text)},
    "workers.compaction": lambda text: {"worker_compaction": _parse_bool(text)},
    "workers.heartbeat_timeout": _int_field("worker_heartbeat_timeout_ms", 100, 2**31 - 1),
}

# Settings that can also come from a flag or an environment variable (setting -> flag, setting
# -> variable, setting -> parser). "config" names the file itself.
FLAGS: dict[str, str] = {
    "config": "--config",
    "data_dir": "--data-dir",
    "amqp_port": "--amqp-port",
    "amqps_port": "--amqps-port",
    "stream_port": "--stream-port",
    "stream_tls_port": "--stream-tls-port",
    "management_port": "--management-port",
    "node_name": "--node-name",
    "log_level": "--log-level",
    "cluster_port": "--cluster-port",
    "cluster_join": "--join",
    "cluster_secret_file": "--cluster-secret-file",
    "cluster_enabled": "--no-cluster",  # the flag's value is "false"
    "cluster_secret_file_insecure_ok": "--allow-insecure-secret-file",
    "workers": "--workers",
}
ENV_VARS: dict[str, str] = {
    "config": "HUTCH_CONFIG",
    "data_dir": "HUTCH_DATA_DIR",
    "amqp_port": "HUTCH_AMQP_PORT",
    "amqps_port": "HUTCH_AMQPS_PORT",
    "stream_port": "HUTCH_STREAM_PORT",
    "stream_tls_port": "HUTCH_STREAM_TLS_PORT",
    "management_port": "HUTCH_MANAGEMENT_PORT",
    "node_name": "HUTCH_NODE_NAME",
    "log_level": "HUTCH_LOG_LEVEL",
    "cluster_port": "HUTCH_CLUSTER_PORT",
    "cluster_join": "HUTCH_CLUSTER_JOIN",
    "cluster_secret_file": "HUTCH_CLUSTER_SECRET_FILE",
    "cluster_secret": "HUTCH_CLUSTER_SECRET",
    "cluster_enabled": "HUTCH_CLUSTER_ENABLED",
    "cluster_secret_file_insecure_ok": "HUTCH_ALLOW_INSECURE_SECRET_FILE",
    "workers": "HUTCH_WORKERS",
}
_OVERRIDE_PARSERS: dict[str, _Parser] = {
    "config": _nonempty_field("config_file"),
    "data_dir": _nonempty_field("data_dir"),
    "amqp_port": _int_field("amqp_port", 0, 65535),
    "amqps_port": _int_field("amqps_port", 0, 65535),
    "stream_port": _int_field("stream_port", 0, 65535),  # 0: any free port (reported)
    "stream_tls_port": _int_field("stream_tls_port", 0, 65535),
    "management_port": _int_field("management_port", 0, 65535),
    "node_name": _parse_node_name,
    "log_level": _parse_log_level,
    "cluster_port": _int_field("cluster_port", 0, 65535),
    "cluster_join": _parse_join,
    "cluster_secret_file": _nonempty_field("cluster_secret_file"),
    "cluster_secret": _nonempty_field("cluster_secret"),
    "cluster_enabled": _parse_cluster_enabled,
    "cluster_secret_file_insecure_ok": lambda text: {"cluster_secret_file_insecure_ok": _parse_bool(text)},
    "workers": _parse_workers,
}

_LOOPBACK_PREFIX = "loopback_users."


# --------------------------------------------------------------------------------------------
# The file


def _known_keys_hint(key: str) -> str:
    tls_keys = [prefix + option for prefix in _TLS_SECTIONS for option in (*_TLS_OPTIONS, "versions.1", "ciphers.1")]
    close = difflib.get_close_matches(
        key, [*_FILE_KEYS, *tls_keys, "auth_mechanisms.1", "loopback_users", _LOOPBACK_PREFIX + "<user>"], n=1)
    if close:
        return f"; did you mean '{close[0]}'?"
    return "; see docs/configuration.md for the known keys"


def _show(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_config_text(text: str, source: str = "<config>") -> tuple[dict[str, Any], dict[str, str]]:
    """Parse a RabbitMQ-style config file.

    Returns ``(settings, raw)``: ``settings`` maps Config field names to validated values;
    ``raw`` maps each key to its text as written. Lines are ``key = value``; blank lines and
    lines starting with ``#`` are ignored; a value runs to the end of the line (no inline
    comments, so passwords may contain ``#``); the last occurrence of a key wins.
    ``loopback_users.<user> = true|false`` adds or removes a user from the loopback-only
    list, applied in file order to the default ``guest``; ``loopback_users = none`` empties
    it. Raises ConfigError naming ``source:line``.
    """
    settings: dict[str, Any] = {}
    raw: dict[str, str] = {}
    loopback = list(Config.loopback_users)
    loopback_touched = False
    sections = _Sections()
    for line_no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{line_no}"
        key, sep, value = stripped.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ConfigError(f"{where}: expected 'key = value', got {_show(stripped)}")
        raw[key] = value
        try:
            if key == "loopback_users":
                if value.lower() != "none":
                    raise _BadValue("none (or use loopback_users.<user> = true|false)")
                loopback, loopback_touched = [], True
            elif key.startswith(_LOOPBACK_PREFIX) and len(key) > len(_LOOPBACK_PREFIX):
                user = key[len(_LOOPBACK_PREFIX) :]
                loopback = [u for u in loopback if u != user]
                if _parse_bool(value):
                    loopback.append(user)
                loopback_touched = True
            elif key in _FILE_KEYS:
                settings.update(_FILE_KEYS[key](value))
            elif not sections.take(key, value):
                raise ConfigError(f"{where}: unknown key {_show(key)}{_known_keys_hint(key)}")
        except _UnknownKey as unknown:
            raise ConfigError(f"{where}: unknown key {_show(key)} {unknown.hint}") from None
        except _BadValue as bad:
            hint = " (inline comments are not supported)" if "#" in value else ""
            raise ConfigError(
                f"{where}: invalid value {_show(value)} for {_show(key)}: expected {bad.expected}{hint}"
            ) from None
    if loopback_touched:
        settings["loopback_users"] = tuple(loopback)
    settings.update(sections.settings())
    return settings, raw


def _read_config_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {_show(path)}: not UTF-8 ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {_show(path)}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------------------------
# Resolution


def _override(setting: str, value: object, origin: str) -> dict[str, Any]:
    text = str(value).strip()
    try:
        return _OVERRIDE_PARSERS[setting](text)
    except _BadValue as bad:
        raise ConfigError(f"{origin}: invalid value {_show(text)}: expected {bad.expected}") from None


def load_config(
    argv_values: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    hostname: str | None = None,
) -> Config:
    """Resolve the node's Config: flag > environment variable > config file > default.

    ``argv_values`` maps setting names (keys of ``FLAGS``: config, data_dir, amqp_port,
    management_port, node_name, log_level) to flag values; None means "not given".
    ``environ`` is the process environment (pass ``os.environ``); an empty variable counts
    as unset. The file comes from ``--config`` or ``HUTCH_CONFIG``; without either no file
    is read. ``hostname`` replaces the machine's name in the default node name (tests).
    Raises ConfigError with a one-line message.
    """
    argv_values = argv_values or {}
    environ = environ if environ is not None else {}
    unknown = set(argv_values) - set(FLAGS)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(sorted(unknown))}: expected one of {', '.join(FLAGS)}"
        )

    env_layer: dict[str, Any] = {}
    flag_layer: dict[str, Any] = {}
    for setting, variable in ENV_VARS.items():  # a superset of FLAGS (the secret has no flag)
        env_value = environ.get(variable)
        if env_value is not None and env_value.strip():
            env_layer.update(_override(setting, env_value, variable))
    for setting in FLAGS:
        flag_value = argv_values.get(setting)
        if flag_value is not None:
            flag_layer.update(_override(setting, flag_value, FLAGS[setting]))

    config_file = flag_layer.get("config_file", env_layer.get("config_file"))
    file_layer: dict[str, Any] = {}
    raw: dict[str, str] = {}
    if config_file is not None:
        file_layer, raw = parse_config_text(_read_config_file(config_file), source=config_file)

    merged: dict[str, Any] = {**file_layer, **env_layer, **flag_layer}
    merged["config_file"] = config_file
    merged["raw"] = raw
    node_name = merged.get("node_name") or default_node_name(hostname)
    if "@" not in node_name:
        node_name = f"{node_name}@{default_node_name(hostname).split('@', 1)[1]}"
    merged["node_name"] = node_name
    merged["cluster_port_set"] = "cluster_port" in merged
    if merged.get("cluster_join") and merged.get("cluster_enabled") is False:
        raise ConfigError("--join (cluster.join) asks to join a cluster, but clustering is turned off "
                          "(--no-cluster, HUTCH_CLUSTER_ENABLED or cluster.enabled = false)")
    _check_tls(merged)
    return Config(**merged)


def _check_tls(merged: dict[str, Any]) -> None:
    """Cross-key rules of the TLS settings (each key alone was validated where it was read).
    As RabbitMQ, asking for an HTTPS management listener and no plain one turns the plain one off."""
    where = merged.get("config_file") or "the configuration"
    listeners = (("amqps_port", "ssl_options", "listeners.ssl.default"),
                 ("stream_tls_port", "ssl_options", "stream.listeners.ssl.default"),
                 ("management_ssl_port", "management_ssl", "management.ssl.port"))
    for port_field, section, key in listeners:
        opts: TlsOptions = merged.get(section, TlsOptions())
        prefix = "ssl_options." if section == "ssl_options" else "management.ssl."
        if merged.get(port_field) is not None and not (opts.certfile and opts.keyfile):
            raise ConfigError(f"{where}: {key} needs {prefix}certfile and {prefix}keyfile")
        if opts.verify == "verify_peer" and not opts.cacertfile:
            raise ConfigError(f"{where}: {prefix}verify = verify_peer needs {prefix}cacertfile")
        if opts.fail_if_no_peer_cert and opts.verify != "verify_peer":
            raise ConfigError(f"{where}: {prefix}fail_if_no_peer_cert = true needs {prefix}verify = verify_peer")
    cluster: TlsOptions = merged.get("cluster_ssl", TlsOptions())
    if cluster.configured and not (cluster.cacertfile and cluster.certfile and cluster.keyfile):
        raise ConfigError(f"{where}: TLS between nodes needs cluster.ssl.cacertfile, cluster.ssl.certfile "
                          "and cluster.ssl.keyfile")
    if merged.get("management_ssl_port") is not None and "management_port" not in merged:
        merged["management_tcp"] = False
