"""``hutchctl``: manage a running node through its management HTTP API, rabbitmqctl-style.

This module owns the command-line surface of hutchctl (rabbitmqctl's command names and argument
orders), the HTTP client it uses (stdlib ``urllib``: no event loop, fast start), the table and
JSON output formats, and the error contract:

* a bad flag, a missing argument or an unknown column: one line ``hutchctl: error: …``, exit 2;
* the node cannot be reached: one line ``hutchctl: cannot reach node at URL: <reason>``, exit 69
  (EX_UNAVAILABLE, as rabbitmqctl);
* the node refused the request: one line ``hutchctl: <reason>``, exit 1 (e.g. ``User "x" does
  not exist``, with rabbitmqctl's wording);
* the reply was not what a hutch node sends: one line, exit 70 (EX_SOFTWARE).

Each command is a function ``(client, args) -> Output``; listing commands are declared as
``ListSpec`` tables (API path, column extractors, default columns). See docs/hutchctl.md.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import quote

from hutch import __version__

PROG = "hutchctl"
EX_OK = 0
EX_REFUSED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 15672
DEFAULT_TIMEOUT_S = 60.0


# -- errors -----------------------------------------------------------------------------------------


class UsageError(Exception):
    """Bad command line: one line, exit 2."""


class Unreachable(Exception):
    """No HTTP exchange with the node was possible: exit 69."""


class Refused(Exception):
    """The node answered with an error (or a command's precondition failed): exit 1."""


class BadReply(Exception):
    """The node's reply could not be understood: exit 70."""


class ApiFailure(Exception):
    """An HTTP error status from the node, with RabbitMQ's error body."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(" ".join(message.split()))


# -- the HTTP client --------------------------------------------------------------------------------


def seg(value: str) -> str:
    """One percent-encoded path segment ("/" becomes %2F)."""
    return quote(value, safe="")


class Client:
    """A tiny synchronous client of the management API."""

    def __init__(self, host: str, port: int, username: str, password: str, timeout_s: float,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.base_url = f"{'https' if ssl_context is not None else 'http'}://{host}:{port}"
        self.ssl_context = ssl_context
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self._auth = f"Basic {token}"
        self.timeout_s = timeout_s
        self.username = username

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """Send one request; return the decoded JSON reply (None when empty). Raises ApiFailure
        for an HTTP error status, Unreachable when the node cannot be reached."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers or {})
        req.add_header("Authorization", self._auth)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.ssl_context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._failure(exc) from None
        except urllib.error.URLError as exc:
            raise Unreachable(_reason_text(exc.reason)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(_reason_text(exc)) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise BadReply(f"the node at {self.base_url} sent a reply that is not JSON") from None

    def _failure(self, exc: urllib.error.HTTPError) -> ApiFailure:
        try:
            body = json.loads(exc.read() or b"{}")
        except (ValueError, OSError):
            body = {}
        if not isinstance(body, dict):
            body = {}
        return ApiFailure(exc.code, str(body.get("error", exc.reason)), str(body.get("reason", exc.reason)))

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiFailure as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _reason_text(reason: object) -> str:
    if isinstance(reason, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


# -- output -----------------------------------------------------------------------------------------


@dataclass
class Table:
    """Rows of a listing command, with the columns asked for."""

    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Output:
    banner: str | None = None
    table: Table | None = None
    document: Any = None  # printed as JSON in json mode, as "key: value" lines in table mode
    lines: list[str] = field(default_factory=list)


class FieldTable(dict[str, Any]):
    """An AMQP field table column (`arguments`, `client_properties`): JSON in `--formatter json` (a dict),
    rabbitmqctl's Erlang terms in table output (`term`, `erlang_term`)."""

    def term(self) -> str:
        return erlang_term(self)


class StreamMap(FieldTable):
    """A stream-protocol map column (a stream consumer's `properties`): in table output the Erlang map
    of binaries rabbitmq-streams prints (`#{<<"k">> => <<"v">>,...}`, keys in byte order)."""

    def term(self) -> str:
        return erlang_term(self, binaries=True)


class StreamTable(FieldTable):
    """A stream connection's `client_properties`: in table output the AMQP table of binaries
    rabbitmq-streams prints (RabbitMQ converts the peer properties with `rabbit_misc:to_amqp_table`):
    `[{<<"k">>,longstr,<<"v">>},...]`, keys in byte order."""

    def term(self) -> str:
        return erlang_term([(k, Atom(_amqp_type(v)), v) for k, v in sorted(self.items(), key=_key_bytes)],
                           binaries=True)


class Atom(str):
    """An Erlang atom in `erlang_term` (printed as it is)."""


def _key_bytes(item: tuple[str, Any]) -> bytes:
    return item[0].encode()


def _amqp_type(value: Any) -> str:
    """The type RabbitMQ's `to_amqp_table` gives a value (rabbit_misc:type_val)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "longstr"


# the bytes Erlang's `~p` prints inside <<"...">> (io_lib's printable latin-1 list), with their escapes
_ERLANG_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f",
                   13: "\\r", 27: "\\e"}
_ERLANG_PRINTABLE = frozenset([*range(32, 127), *range(160, 256), *_ERLANG_ESCAPES])


def erlang_binary(text: str) -> str:
    """A string as Erlang's `~p` prints it as a binary (UTF-8): `<<"text">>` when every byte is printable
    latin-1 (each byte one character, as `~p` without `t` shows it), else its bytes `<<226,130,172>>`."""
    raw = text.encode()
    if not raw:
        return "<<>>"
    if not all(b in _ERLANG_PRINTABLE for b in raw):
        return "<<" + ",".join(map(str, raw)) + ">>"
    return '<<"' + "".join(_ERLANG_ESCAPES.get(b, chr(b)) for b in raw) + '">>'


def erlang_term(value: Any, binaries: bool = False) -> str:
    """A field table's value as rabbitmqctl 3.10.8's table formatter prints it: a table
    `[{"k",v},...]` (`[]` when empty), an array `[v,...]`, a string `"..."` (quotes and backslashes
    escaped), `true`/`false`, a void `undefined`, numbers as they are. (The API's JSON has lost what
    a byte array or a decimal was: they print as a string and a number.) With `binaries`, a
    stream-protocol value as rabbitmq-streams' pretty table prints the term (`~p`, on one line): strings
    are binaries (`erlang_binary`), a dict an Erlang map `#{k => v,...}` (keys in byte order, as Erlang
    orders a small map's), a tuple `{a,b}`, an `Atom` as it is."""
    if isinstance(value, dict):
        if binaries:
            return "#{" + ",".join(f"{erlang_term(str(k), True)} => {erlang_term(v, True)}"
                                   for k, v in sorted(value.items(), key=_key_bytes)) + "}"
        return "[" + ",".join(f"{{{erlang_term(str(k))},{erlang_term(v)}}}" for k, v in value.items()) + "]"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v, binaries) for v in value) + "]"
    if isinstance(value, tuple):
        return "{" + ",".join(erlang_term(v, binaries) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, Atom):
        return str(value)
    if isinstance(value, str):
        return erlang_binary(value) if binaries else json.dumps(value, ensure_ascii=False)
    return str(value)


def _table_field(name: str, sort: bool = False, kind: type[FieldTable] = FieldTable) -> Callable[[dict[str, Any]], Any]:
    """A field table column; `sort`: by key, as RabbitMQ stores a binding's arguments; `kind`: how table
    output prints it."""
    def get(item: dict[str, Any]) -> Any:
        value = item.get(name)
        if not isinstance(value, dict):
            return value
        return kind(sorted(value.items()) if sort else value)

    return get


def _cell(value: Any) -> str:
    if isinstance(value, FieldTable):
        return value.term()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def render_table(table: Table, headers: bool = True) -> str:
    """rabbitmqctl's `table` output: one line per row, cells separated by a tab (an empty cell stays a
    column: `cut -f` and `IFS=$'\\t' read` see every column, names with spaces included); a tab or a
    newline inside a cell is written as `\\t` / `\\n`, so a row stays one line."""
    rows = [[_cell(v).replace("\t", "\\t").replace("\n", "\\n") for v in row] for row in table.rows]
    if headers:
        rows.insert(0, list(table.columns))
    if not rows:
        return ""
    return "\n".join("\t".join(row) for row in rows) + "\n"


def emit(out: Output, args: argparse.Namespace) -> None:
    as_json = args.formatter == "json"
    if out.banner and not args.quiet and not as_json:
        print(out.banner)
    if out.table is not None:
        if as_json:
            items = [dict(zip(out.table.columns, row, strict=True)) for row in out.table.rows]
            print(json.dumps(items, indent=2, ensure_ascii=False))
        else:
            sys.stdout.write(render_table(out.table, headers=not args.no_table_headers))
    elif out.document is not None:
        if as_json:
            print(json.dumps(out.document, indent=2, ensure_ascii=False))
        else:
            for line in out.lines:
                print(line)
    elif out.lines and not as_json:  # what a changing command says it did (nothing in JSON mode)
        for line in out.lines:
            print(line)
    sys.stdout.flush()


# -- listing commands -------------------------------------------------------------------------------


def _field(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda item: item.get(name)


def _nested(*path: str) -> Callable[[dict[str, Any]], Any]:
    def get(item: dict[str, Any]) -> Any:
        value: Any = item
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return get


def _fields(*names: str) -> dict[str, Callable[[dict[str, Any]], Any]]:
    return {name: _field(name) for name in names}


@dataclass(frozen=True)
class ListSpec:
    path: Callable[[argparse.Namespace], str]
    columns: dict[str, Callable[[dict[str, Any]], Any]]
    default: tuple[str, ...]
    banner: Callable[[argparse.Namespace], str]
    takes_columns: bool = True
    not_found: Callable[[argparse.Namespace], str] | None = None


POLICY_COLUMNS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
# rabbitmqctl list_connections' TLS columns, in its spelling (tlsv1.3, ecdhe_rsa, aes_256_gcm, aead), empty
# for a connection without TLS or (peer_cert_*) without a client certificate
TLS_COLUMNS = ("ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer",
               "peer_cert_validity")

LISTS: dict[str, ListSpec] = {
    "list_users": ListSpec(
        path=lambda a: "/api/users",
        columns=_fields("name", "tags") | {"user": _field("name")},
        default=("user", "tags"),
        banner=lambda a: "Listing users ...",
        takes_columns=False,
    ),
    "list_vhosts": ListSpec(
        path=lambda a: "/api/vhosts",
        columns=_fields("name", "description", "tags", "default_queue_type", "tracing", "messages",
                        "messages_ready", "messages_unacknowledged", "recv_oct", "send_oct"),
        default=("name",),
        banner=lambda a: "Listing vhosts ...",
    ),
    "list_permissions": ListSpec(
        path=lambda a: f"/api/vhosts/{seg(a.vhost)}/permissions",
        columns=_fields("user", "vhost", "configure", "write", "read"),
        default=("user", "configure", "write", "read"),
        banner=lambda a: f'Listing permissions for vhost "{a.vhost}" ...',
        takes_columns=False,
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_user_permissions": ListSpec(
        path=lambda a: f"/api/users/{seg(a.user)}/permissions",
        columns=_fields("vhost", "user", "configure", "write", "read"),
        default=("vhost", "configure", "write", "read"),
        banner=lambda a: f'Listing permissions for user "{a.user}" ...',
        takes_columns=False,
        not_found=lambda a: f'User "{a.user}" does not exist',
    ),
    "list_queues": ListSpec(
        path=lambda a: f"/api/queues/{seg(a.vhost)}",
        columns=_fields("name", "messages", "messages_ready", "messages_unacknowledged", "consumers",
                        "durable", "auto_delete", "exclusive", "type", "message_bytes", "vhost",
                        "state", "consumer_utilisation", "messages_ram", "messages_paged_out", "policy",
                        "operator_policy", "effective_policy_definition", "node", "leader", "members",
                        "online", "first_offset", "last_offset", "committed_offset", "segments", "consumer_offsets",
                        "consumer_capacity", "exclusive_consumer_tag", "message_bytes_ready")
        | {"arguments": _table_field("arguments")},
        default=("name", "messages"),
        banner=lambda a: f"Listing queues for vhost {a.vhost} ...",
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_policies": ListSpec(
        path=lambda a: f"/api/policies/{seg(a.vhost)}",
        columns=_fields(*POLICY_COLUMNS),
        default=POLICY_COLUMNS,
        banner=lambda a: f'Listing policies for vhost "{a.vhost}" ...',
        takes_columns=False,
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_operator_policies": ListSpec(
        path=lambda a: f"/api/operator-policies/{seg(a.vhost)}",
        columns=_fields(*POLICY_COLUMNS),
        default=POLICY_COLUMNS,
        banner=lambda a: f'Listing operator policy overrides for vhost "{a.vhost}" ...',
        takes_columns=False,
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_exchanges": ListSpec(
        path=lambda a: f"/api/exchanges/{seg(a.vhost)}",
        columns=_fields("name", "type", "durable", "auto_delete", "internal", "vhost", "policy")
        | {"arguments": _table_field("arguments")},
        default=("name", "type"),
        banner=lambda a: f"Listing exchanges for vhost {a.vhost} ...",
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_bindings": ListSpec(
        path=lambda a: f"/api/bindings/{seg(a.vhost)}",
        columns={
            "source_name": _field("source"),
            "source_kind": lambda item: "exchange",
            "destination_name": _field("destination"),
            "destination_kind": _field("destination_type"),
            "routing_key": _field("routing_key"),
            "arguments": _table_field("arguments", sort=True),
            "vhost": _field("vhost"),
            "properties_key": _field("properties_key"),
        },
        default=("source_name", "source_kind", "destination_name", "destination_kind", "routing_key",
                 "arguments"),
        banner=lambda a: f"Listing bindings for vhost {a.vhost}...",
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
    "list_connections": ListSpec(
        path=lambda a: "/api/connections",
        columns=_fields("name", "user", "vhost", "peer_host", "peer_port", "host", "port", "state",
                        "channels", "protocol", "auth_mechanism", "frame_max", "channel_max", "timeout",
                        "recv_oct", "send_oct", "connected_at", "ssl", "type",
                        "user_provided_name", "node", *TLS_COLUMNS)
        | {"pid": _field("name"), "client_properties": _table_field("client_properties")},
        default=("user", "peer_host", "peer_port", "state"),
        banner=lambda a: "Listing connections ...",
    ),
    "list_channels": ListSpec(
        path=lambda a: "/api/channels",
        columns=_fields("name", "number", "user", "vhost", "consumer_count", "messages_unacknowledged",
                        "messages_unconfirmed", "messages_uncommitted", "acks_uncommitted", "prefetch_count",
                        "global_prefetch_count",
                        "confirm", "transactional", "state", "node")
        | {"connection": _nested("connection_details", "name"), "pid": _field("name")},
        default=("pid", "user", "consumer_count", "messages_unacknowledged"),
        banner=lambda a: "Listing channels ...",
    ),
    "list_consumers": ListSpec(
        path=lambda a: f"/api/consumers/{seg(a.vhost)}",
        columns={
            "queue_name": _nested("queue", "name"),
            "channel_pid": _nested("channel_details", "name"),
            "channel_name": _nested("channel_details", "name"),
            "connection_name": _nested("channel_details", "connection_name"),
            "consumer_tag": _field("consumer_tag"),
            "ack_required": _field("ack_required"),
            "prefetch_count": _field("prefetch_count"),
            "active": _field("active"),
            "activity_status": _field("activity_status"),
            "exclusive": _field("exclusive"),
            "priority": _field("priority"),
            "arguments": _table_field("arguments"),
            "user": _nested("channel_details", "user"),
        },
        default=("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active",
                 "arguments"),
        banner=lambda a: f"Listing consumers in vhost {a.vhost} ...",
        not_found=lambda a: f'Virtual host "{a.vhost}" does not exist',
    ),
}


def _connection_name(item: dict[str, Any]) -> Any:
    details = item.get("connection_details")
    return details.get("name") if isinstance(details, dict) else None


CONSUMER_COLUMNS = ("connection_pid", "subscription_id", "stream", "messages_consumed", "offset", "offset_lag",
                    "credits", "active", "activity_status", "properties")
PUBLISHER_COLUMNS = ("connection_pid", "publisher_id", "stream", "reference", "messages_published",
                     "messages_confirmed", "messages_errored")
GROUP_COLUMNS = ("stream", "reference", "partition_index", "consumers")
GROUP_CONSUMER_COLUMNS = ("subscription_id", "connection_name", "state")


def _vhost_missing(a: argparse.Namespace) -> str:
    return f'Virtual host "{a.vhost}" does not exist'


def _stream_clients(what: str, columns: tuple[str, ...]) -> ListSpec:
    """The stream consumers or publishers of a vhost: `connection_pid` first, all columns by default."""
    fields = _fields(*columns[1:]) | {"connection_pid": _connection_name}
    if "properties" in fields:
        fields["properties"] = _table_field("properties", kind=StreamMap)
    return ListSpec(path=lambda a: f"/api/stream/{what}/{seg(a.vhost)}", columns=fields, default=columns,
                    banner=lambda a: f"Listing stream {what} ...", not_found=_vhost_missing)


# rabbitmqctl's (and rabbitmq-streams') stream-protocol lists, with their column names and defaults; where
# they show an Erlang pid (connection_pid) hutch shows the connection's name, as for list_consumers. Their
# map cells print as RabbitMQ 3.10's rabbitmq_stream commands print them (its PrettyTable formatter: `~p`
# of the term): `properties` a map of binaries, `client_properties` an AMQP table of binaries
STREAM_LISTS: dict[str, ListSpec] = {
    "list_stream_connections": ListSpec(
        path=lambda a: "/api/stream/connections",
        columns=_fields("port", "peer_port", "host", "peer_host", "user", "vhost", "subscriptions", "publishers",
                        "auth_mechanism", "heartbeat", "frame_max", "connected_at", "ssl",
                        "node") | {"conn_name": lambda i: i.get("name"), "connection_state": lambda i: i.get("state"),
                                   "client_properties": _table_field("client_properties", kind=StreamTable)},
        default=("conn_name",),
        banner=lambda a: "Listing stream connections ...",
    ),
    "list_stream_consumers": _stream_clients("consumers", CONSUMER_COLUMNS),
    "list_stream_publishers": _stream_clients("publishers", PUBLISHER_COLUMNS),
    "list_stream_consumer_groups": ListSpec(
        path=lambda a: f"/api/stream/consumer-groups/{seg(a.vhost)}",
        columns=_fields(*GROUP_COLUMNS),
        default=GROUP_COLUMNS,
        banner=lambda a: "Listing stream consumer groups ...",
        not_found=_vhost_missing,
    ),
    "list_stream_group_consumers": ListSpec(
        path=lambda a: f"/api/stream/consumer-groups/{seg(a.vhost)}/{seg(a.stream)}/{seg(a.reference)}",
        columns=_fields(*GROUP_CONSUMER_COLUMNS),
        default=GROUP_CONSUMER_COLUMNS,
        banner=lambda a: "Listing group consumers ...",
        not_found=lambda a: "The group does not exist",
    ),
}
LISTS.update(STREAM_LISTS)


def _columns(command: str, spec: ListSpec, requested: Sequence[str]) -> list[str]:
    columns = [c for item in requested for c in item.split(",") if c]
    if not columns:
        return list(spec.default)
    unknown = [c for c in columns if c not in spec.columns]
    if unknown:
        raise UsageError(f"invalid column '{unknown[0]}' for {command}; valid columns: "
                         f"{', '.join(spec.columns)}")
    return columns


def run_list(command: str, client: Client, args: argparse.Namespace) -> Output:
    return run_spec(command, LISTS[command], client, args)


def run_spec(command: str, spec: ListSpec, client: Client, args: argparse.Namespace) -> Output:
    """One listing command: GET the spec's path, keep the asked columns (hutch-streams' lists too)."""
    columns = _columns(command, spec, getattr(args, "columns", []) or [])
    try:
        items = client.get(spec.path(args))
    except ApiFailure as exc:
        if exc.status == 404 and spec.not_found is not None:
            raise Refused(spec.not_found(args)) from None
        raise
    if not isinstance(items, list):
        raise BadReply(f"unexpected reply to GET {spec.path(args)}")
    rows = [[spec.columns[c](item) for c in columns] for item in items]
    return Output(banner=spec.banner(args), table=Table(columns, rows))


# -- changing commands ------------------------------------------------------------------------------


def _user(client: Client, name: str) -> dict[str, Any]:
    try:
        return client.get(f"/api/users/{seg(name)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'User "{name}" does not exist') from None
        raise


def _require_vhost(client: Client, name: str) -> None:
    if not client.exists(f"/api/vhosts/{seg(name)}"):
        raise Refused(f'Virtual host "{name}" does not exist')


def cmd_add_user(client: Client, args: argparse.Namespace) -> Output:
    if client.exists(f"/api/users/{seg(args.user)}"):
        raise Refused(f'User "{args.user}" already exists')
    client.request("PUT", f"/api/users/{seg(args.user)}", {"password": args.new_password, "tags": ""})
    return Output(banner=f'Adding user "{args.user}" ...')


def cmd_delete_user(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/users/{seg(args.user)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'User "{args.user}" does not exist') from None
        raise
    return Output(banner=f'Deleting user "{args.user}" ...')


def cmd_change_password(client: Client, args: argparse.Namespace) -> Output:
    user = _user(client, args.user)
    client.request("PUT", f"/api/users/{seg(args.user)}", {"password": args.new_password, "tags": user.get("tags", [])})
    return Output(banner=f'Changing password for user "{args.user}" ...')


def cmd_set_user_tags(client: Client, args: argparse.Namespace) -> Output:
    user = _user(client, args.user)
    tags = [t for item in args.tags for t in item.split(",") if t]
    client.request("PUT", f"/api/users/{seg(args.user)}",
                   {"password_hash": user.get("password_hash", ""), "tags": tags})
    return Output(banner=f'Setting tags for user "{args.user}" to [{", ".join(tags)}] ...')


def cmd_add_vhost(client: Client, args: argparse.Namespace) -> Output:
    if client.exists(f"/api/vhosts/{seg(args.name)}"):
        raise Refused(f'Virtual host "{args.name}" already exists')
    body: dict[str, Any] = {"description": args.description or "", "tags": args.tags or ""}
    if args.default_queue_type:
        body["default_queue_type"] = args.default_queue_type
    client.request("PUT", f"/api/vhosts/{seg(args.name)}", body)
    # The HTTP API grants the creator full permissions on a new vhost; rabbitmqctl add_vhost does not.
    try:
        client.request("DELETE", f"/api/permissions/{seg(args.name)}/{seg(client.username)}")
    except ApiFailure as exc:
        if exc.status != 404:
            raise
    return Output(banner=f'Adding vhost "{args.name}" ...')


def cmd_delete_vhost(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/vhosts/{seg(args.name)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.name}" does not exist') from None
        raise
    return Output(banner=f'Deleting vhost "{args.name}" ...')


def cmd_set_permissions(client: Client, args: argparse.Namespace) -> Output:
    path = f"/api/permissions/{seg(args.vhost)}/{seg(args.user)}"
    try:
        client.request("PUT", path, {"configure": args.conf, "write": args.write, "read": args.read})
    except ApiFailure as exc:
        if exc.status == 400 and exc.reason == "vhost_or_user_not_found":
            _user(client, args.user)
            _require_vhost(client, args.vhost)
        raise
    return Output(banner=f'Setting permissions for user "{args.user}" in vhost "{args.vhost}" ...')


def cmd_clear_permissions(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/permissions/{seg(args.vhost)}/{seg(args.user)}")
    except ApiFailure as exc:
        if exc.status != 404:
            raise
        _user(client, args.user)
        _require_vhost(client, args.vhost)  # both exist: there was nothing to clear, which is fine
    return Output(banner=f'Clearing permissions for user "{args.user}" in vhost "{args.vhost}" ...')


def _policy_path(args: argparse.Namespace, operator: bool) -> str:
    return f"/api/{'operator-policies' if operator else 'policies'}/{seg(args.vhost)}/{seg(args.name)}"


def _set_policy(client: Client, args: argparse.Namespace, operator: bool) -> Output:
    try:
        definition = json.loads(args.definition)
    except ValueError as exc:
        raise Refused(f"Could not parse JSON document: {exc}") from None
    body = {"pattern": args.pattern, "definition": definition, "priority": args.priority,
            "apply-to": args.apply_to}
    try:
        client.request("PUT", _policy_path(args, operator), body)
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.vhost}" does not exist') from None
        raise
    what = "operator policy override" if operator else "policy"
    return Output(banner=f'Setting {what} "{args.name}" for pattern "{args.pattern}" to "{args.definition}" '
                         f'with priority "{args.priority}" for vhost "{args.vhost}" ...')


def _clear_policy(client: Client, args: argparse.Namespace, operator: bool) -> Output:
    try:
        client.request("DELETE", _policy_path(args, operator))
    except ApiFailure as exc:
        if exc.status != 404:
            raise
        _require_vhost(client, args.vhost)
        raise Refused("Parameter does not exist") from None  # rabbitmqctl's wording
    what = "operator policy" if operator else "policy"
    return Output(banner=f'Clearing {what} "{args.name}" on vhost "{args.vhost}" ...')


def _limits_document(text: str, user: bool) -> dict[str, int]:
    """The JSON document of set_vhost_limits/set_user_limits, checked as the node checks it."""
    from hutch.core import limits  # stdlib-only; imported here to keep hutchctl's start fast

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise Refused(f"Could not parse JSON document: {exc}") from None
    try:
        return limits.validate_user_limits(doc) if user else limits.validate_vhost_limits(doc)
    except limits.LimitError as exc:
        raise Refused(str(exc)) from None


def _vhost_limits_path(vhost: str) -> str:
    return f"/api/parameters/vhost-limits/{seg(vhost)}/limits"


def cmd_set_vhost_limits(client: Client, args: argparse.Namespace) -> Output:
    """Replace the vhost's limits with the document (rabbitmqctl's set_vhost_limits)."""
    doc = _limits_document(args.definition, user=False)
    try:
        client.request("PUT", _vhost_limits_path(args.vhost), {"value": doc})
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.vhost}" does not exist') from None
        raise
    return Output(banner=f'Setting vhost limits to "{args.definition}" for vhost "{args.vhost}" ...')


def cmd_clear_vhost_limits(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", _vhost_limits_path(args.vhost))
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.vhost}" does not exist') from None
        raise
    return Output(banner=f'Clearing vhost "{args.vhost}" limits ...')


def cmd_set_user_limits(client: Client, args: argparse.Namespace) -> Output:
    """Merge the document into the user's limits (rabbitmqctl's set_user_limits): one PUT per limit,
    after the whole document has been checked."""
    doc = _limits_document(args.definition, user=True)
    _user(client, args.user)
    for name, value in doc.items():
        client.request("PUT", f"/api/user-limits/{seg(args.user)}/{seg(name)}", {"value": value})
    return Output(banner=f'Setting user limits to "{args.definition}" for user "{args.user}" ...')


def cmd_clear_user_limits(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/user-limits/{seg(args.user)}/{seg(args.limit)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'User "{args.user}" does not exist') from None
        raise
    what = "all limits" if args.limit == "all" else f'"{args.limit}" limit'
    return Output(banner=f'Clearing {what} for user "{args.user}" ...')


def _limits_listing(client: Client, path: str, key: str, banner: str, missing: str) -> Output:
    try:
        items = client.get(path)
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(missing) from None
        raise
    if not isinstance(items, list):
        raise BadReply(f"unexpected reply to GET {path}")
    rows = [[item.get(key), item.get("value")] for item in items]
    return Output(banner=banner, table=Table([key, "limits"], rows))


def cmd_list_vhost_limits(client: Client, args: argparse.Namespace) -> Output:
    if args.glob:
        return _limits_listing(client, "/api/vhost-limits", "vhost", "Listing limits for all vhosts ...", "")
    return _limits_listing(client, f"/api/vhost-limits/{seg(args.vhost)}", "vhost",
                           f'Listing limits for vhost "{args.vhost}" ...',
                           f'Virtual host "{args.vhost}" does not exist')


def cmd_list_user_limits(client: Client, args: argparse.Namespace) -> Output:
    if args.glob or not args.user:
        return _limits_listing(client, "/api/user-limits", "user", "Listing limits for all users ...", "")
    return _limits_listing(client, f"/api/user-limits/{seg(args.user)}", "user",
                           f'Listing limits for user "{args.user}" ...', f'User "{args.user}" does not exist')


def _mib(value: Any) -> str:
    return f"{value / 1048576:.1f} MiB" if isinstance(value, (int, float)) else "?"


def cmd_status(client: Client, args: argparse.Namespace) -> Output:
    overview = client.get("/api/overview")
    if not isinstance(overview, dict):
        raise BadReply("unexpected reply to GET /api/overview")
    node = client.get(f"/api/nodes/{seg(str(overview.get('node', '')))}")
    if not isinstance(node, dict):
        raise BadReply("unexpected reply to GET /api/nodes")
    totals = overview.get("object_totals", {})
    queued = overview.get("queue_totals", {})
    alarms = [name for name, on in (("memory", node.get("mem_alarm")), ("disk", node.get("disk_free_alarm"))) if on]
    listeners = ", ".join(f"{item.get('protocol')} {item.get('ip_address')}:{item.get('port')}"
                          for item in overview.get("listeners", []))
    lines = [
        f"Node: {overview.get('node')}",
        f"Cluster name: {overview.get('cluster_name')}",
        f"Product: {overview.get('product_name')} {overview.get('product_version')}",
        f"Uptime (seconds): {int(node.get('uptime', 0)) // 1000}",
        f"Memory used: {_mib(node.get('mem_used'))} (high watermark {_mib(node.get('mem_limit'))})"
        + (", paging queues to disk" if node.get("mem_paging") else ""),
        f"File descriptors: {node.get('fd_used')} of {node.get('fd_total')}",
        f"Connections: {totals.get('connections')}, channels: {totals.get('channels')}, "
        f"queues: {totals.get('queues')}, consumers: {totals.get('consumers')}",
        f"Messages: {queued.get('messages')} (ready {queued.get('messages_ready')}, "
        f"unacknowledged {queued.get('messages_unacknowledged')})",
        f"Alarms: {', '.join(alarms) if alarms else '(none)'}",
        f"Listeners: {listeners}",
    ]
    return Output(banner=f"Status of node {overview.get('node')} ...",
                  document={"overview": overview, "node": node}, lines=lines)


def cmd_environment(client: Client, args: argparse.Namespace) -> Output:
    """rabbitmqctl environment: the node's effective settings (GET /api/environment; secrets left out by
    the node), one `name<TAB>value` line each in table mode, the object in JSON mode."""
    doc = client.get("/api/environment")
    if not isinstance(doc, dict):
        raise BadReply("unexpected reply to GET /api/environment")
    rows = [[name, value] for name, value in doc.items()]
    return Output(banner=f"Application environment of node {doc.get('node_name')} ...", document=doc,
                  lines=render_table(Table(["name", "value"], rows), headers=False).splitlines())


def cmd_cluster_status(client: Client, args: argparse.Namespace) -> Output:
    doc = client.get("/api/cluster-status")
    if not isinstance(doc, dict):
        raise BadReply("unexpected reply to GET /api/cluster-status")
    meta = doc.get("metadata", {})
    # which node and which product answered: a hutchctl pointed at the wrong port says so (issue 22)
    overview = client.get("/api/overview")
    node = overview.get("node") if isinstance(overview, dict) else None
    product = (f"{overview.get('product_name')} {overview.get('product_version')}" if isinstance(overview, dict)
               else "?")
    lines = [f"Node: {node}", f"Product: {product}", f"Cluster name: {doc.get('cluster_name')}", "", "Members"]
    for m in doc.get("members", []):
        state = "running" if m.get("running") else "not running"
        role = "voter" if m.get("voter") else "joining"
        lines.append(f"  {m.get('name')}  {m.get('address')}  raft id {m.get('raft_id')}  {state}, {role}")
    lines += ["", "Running nodes", *[f"  {n}" for n in doc.get("running_nodes", [])], "", "Network partitions"]
    parts = doc.get("partitions", [])
    lines += [f"  {p.get('node')} cannot reach {', '.join(p.get('unreachable', []))}" for p in parts] or ["  (none)"]
    lines += ["", "Alarms"]
    alarms = [f"  {a.get('node')}: {', '.join(a.get('alarms'))}" for a in doc.get("alarms", []) if a.get("alarms")]
    lines += alarms or ["  (none)"]
    lines += ["", f"Metadata: leader {meta.get('leader')}, term {meta.get('term')}, "
                  f"commit index {meta.get('commit')}, applied here {meta.get('applied')}"]
    return Output(banner=f"Cluster status of node {node} ...", document=doc, lines=lines)


JOIN_RESTART_TIMEOUT_S = 120.0  # a node of workers restarting them to join: until the status shows it


def cmd_join_cluster(client: Client, args: argparse.Namespace) -> Output:
    reply = client.request("POST", "/api/cluster-join", {"node": args.node})
    if isinstance(reply, dict) and reply.get("restarting"):  # a node of workers: they restart, joining
        _wait_joined(client, str(reply.get("node")), str(reply.get("joining")), JOIN_RESTART_TIMEOUT_S)
    return Output(banner=f"Clustering node with {args.node} ...")


def _wait_joined(client: Client, node: str, seed_node: str, timeout_s: float) -> None:
    """Until this node's cluster status lists `seed_node` running (its workers restarted and joined)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            doc = client.request("GET", "/api/cluster-status")
        except (Unreachable, ApiFailure, BadReply):  # the workers are restarting
            doc = None
        if isinstance(doc, dict) and seed_node in doc.get("running_nodes", []):
            return
        time.sleep(0.5)
    raise Refused(f"node {node} did not show {seed_node} in its cluster within {timeout_s:.0f} s of restarting "
                  "its workers to join it; see hutchctl cluster_status and the node's log")


def cmd_forget_cluster_node(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/cluster-nodes/{seg(args.node)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f"Node {args.node} is not a member of this cluster") from None
        raise
    return Output(banner=f"Removing node {args.node} from the cluster")


def _parameter_path(args: argparse.Namespace) -> str:
    return f"/api/parameters/{seg(args.component)}/{seg(args.vhost)}/{seg(args.name)}"


def cmd_set_parameter(client: Client, args: argparse.Namespace) -> Output:
    """A runtime parameter (rabbitmqctl set_parameter COMPONENT NAME VALUE): a shovel's definition."""
    try:
        value = json.loads(args.value)
    except ValueError as exc:
        raise Refused(f"Could not parse JSON document: {exc}") from None
    try:
        client.request("PUT", _parameter_path(args), {"value": value})
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.vhost}" does not exist') from None
        raise Refused(exc.reason.replace("Validation failed\n\n", "Validation failed\n").rstrip()) from None
    return Output(banner=f'Setting runtime parameter "{args.name}" for component "{args.component}" to '
                         f'"{args.value}" in vhost "{args.vhost}" ...')


def cmd_clear_parameter(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", _parameter_path(args))
    except ApiFailure as exc:
        if exc.status != 404:
            raise
        _require_vhost(client, args.vhost)
        raise Refused("Parameter does not exist") from None
    return Output(banner=f'Clearing runtime parameter "{args.name}" for component "{args.component}" on vhost '
                         f'"{args.vhost}" ...')


def cmd_list_parameters(client: Client, args: argparse.Namespace) -> Output:
    items = []
    for component in ("shovel", "federation-upstream", "federation-upstream-set"):
        found = client.get(f"/api/parameters/{component}/{seg(args.vhost)}")
        if not isinstance(found, list):
            raise BadReply("unexpected reply to GET /api/parameters")
        items += found
    rows = [[i.get("component"), i.get("name"), json.dumps(i.get("value"), separators=(",", ":"))] for i in items]
    return Output(banner=f'Listing runtime parameters for vhost "{args.vhost}" ...',
                  table=Table(["component", "name", "value"], rows))


SHOVEL_COLUMNS = ["name", "vhost", "type", "state", "source", "destination", "termination_reason", "node",
                  "last_changed"]


def cmd_shovel_status(client: Client, args: argparse.Namespace) -> Output:
    """The dynamic shovels and their state (rabbitmqctl shovel_status)."""
    items = client.get("/api/shovels")
    if not isinstance(items, list):
        raise BadReply("unexpected reply to GET /api/shovels")
    rows = [[i.get("name"), i.get("vhost"), i.get("type"), i.get("state"),
             i.get("src_queue") or i.get("src_exchange") or "", i.get("dest_queue") or i.get("dest_exchange") or "",
             i.get("reason", ""), i.get("node"), i.get("timestamp")] for i in items]
    return Output(banner="Shovel status ...", table=Table(SHOVEL_COLUMNS, rows))


FEDERATION_COLUMNS = ["type", "name", "vhost", "upstream", "upstream_name", "status", "error", "uri", "last_changed"]


def cmd_federation_status(client: Client, args: argparse.Namespace) -> Output:
    """The federation links and their status (rabbitmqctl federation_status)."""
    items = client.get("/api/federation-links")
    if not isinstance(items, list):
        raise BadReply("unexpected reply to GET /api/federation-links")
    rows = [[i.get("type"), i.get("exchange") or i.get("queue"), i.get("vhost"), i.get("upstream"),
             i.get("upstream_exchange") or i.get("upstream_queue"), i.get("status"), i.get("error", ""), i.get("uri"),
             i.get("timestamp")] for i in items]
    return Output(banner="Listing federation links ...", table=Table(FEDERATION_COLUMNS, rows))


Command = Callable[[Client, argparse.Namespace], Output]
def _queue_refusal(client: Client, args: argparse.Namespace, exc: ApiFailure) -> Exception:
    """A queue command's 404 in rabbitmqctl's words: the vhost, or else the queue, is missing."""
    if exc.status != 404:
        return exc
    if not client.exists(f"/api/vhosts/{seg(args.vhost)}"):
        return Refused(f'Virtual host "{args.vhost}" does not exist')
    return Refused(f"no queue '{args.queue}' in vhost '{args.vhost}'")  # (AMQP's NOT_FOUND text)


def cmd_purge_queue(client: Client, args: argparse.Namespace) -> Output:
    try:
        client.request("DELETE", f"/api/queues/{seg(args.vhost)}/{seg(args.queue)}/contents")
    except ApiFailure as exc:
        raise _queue_refusal(client, args, exc) from None
    return Output(banner=f"Purging queue '{args.queue}' in vhost '{args.vhost}' ...")


def cmd_delete_queue(client: Client, args: argparse.Namespace) -> Output:
    """rabbitmqctl delete_queue [--if-empty] [--if-unused]: says how many messages went with the queue (its
    count just before the delete)."""
    path = f"/api/queues/{seg(args.vhost)}/{seg(args.queue)}"
    query = "&".join(f"{flag}=true" for flag, on in (("if-empty", args.if_empty), ("if-unused", args.if_unused))
                     if on)
    try:
        doc = client.get(path)
        client.request("DELETE", path + (f"?{query}" if query else ""))
    except ApiFailure as exc:
        raise _queue_refusal(client, args, exc) from None
    messages = doc.get("messages", 0) if isinstance(doc, dict) else 0
    line = f"Queue was successfully deleted with {messages} message{'' if messages == 1 else 's'}"
    return Output(banner=f"Deleting queue '{args.queue}' on vhost '{args.vhost}' ...", lines=[line])


def cmd_close_connection(client: Client, args: argparse.Namespace) -> Output:
    """rabbitmqctl close_connection CONNECTION EXPLANATION: the connection by its name (list_connections'
    `name`, where rabbitmqctl takes an Erlang pid); the client gets 320 CONNECTION_FORCED with the text."""
    try:
        client.request("DELETE", f"/api/connections/{seg(args.connection)}", headers={"X-Reason": args.explanation})
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f"no connection named '{args.connection}' (see hutchctl list_connections name)") from None
        raise
    return Output(banner=f"Closing connection {args.connection}, reason: {args.explanation}...")


AWAIT_POLL_S = 0.5


def cmd_await_startup(client: Client, args: argparse.Namespace) -> Output:
    """rabbitmqctl await_startup: until the node answers its API (GET /api/overview), at most -t seconds;
    then exit 69 as for an unreachable node. A refusal (bad credentials) ends the wait at once."""
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            client.get("/api/overview")
            return Output(banner="Waiting for the node to start ...")
        except Unreachable as exc:
            last: Exception = exc
        except ApiFailure as exc:
            if exc.status != 503:  # (a node of workers starting answers 503 until its workers are up)
                raise
            last = Unreachable(exc.reason)
        if time.monotonic() + AWAIT_POLL_S > deadline:
            raise Unreachable(f"{last} (waited {args.timeout:g} s for the node to start)")
        time.sleep(AWAIT_POLL_S)


COMMANDS: dict[str, Command] = {
    "purge_queue": cmd_purge_queue,
    "delete_queue": cmd_delete_queue,
    "close_connection": cmd_close_connection,
    "await_startup": cmd_await_startup,
    "add_user": cmd_add_user,
    "delete_user": cmd_delete_user,
    "change_password": cmd_change_password,
    "set_user_tags": cmd_set_user_tags,
    "add_vhost": cmd_add_vhost,
    "delete_vhost": cmd_delete_vhost,
    "set_permissions": cmd_set_permissions,
    "clear_permissions": cmd_clear_permissions,
    "set_policy": lambda client, args: _set_policy(client, args, operator=False),
    "clear_policy": lambda client, args: _clear_policy(client, args, operator=False),
    "set_operator_policy": lambda client, args: _set_policy(client, args, operator=True),
    "clear_operator_policy": lambda client, args: _clear_policy(client, args, operator=True),
    "set_vhost_limits": cmd_set_vhost_limits,
    "clear_vhost_limits": cmd_clear_vhost_limits,
    "list_vhost_limits": cmd_list_vhost_limits,
    "set_user_limits": cmd_set_user_limits,
    "clear_user_limits": cmd_clear_user_limits,
    "list_user_limits": cmd_list_user_limits,
    "set_parameter": cmd_set_parameter,
    "clear_parameter": cmd_clear_parameter,
    "list_parameters": cmd_list_parameters,
    "shovel_status": cmd_shovel_status,
    "federation_status": cmd_federation_status,
    "status": cmd_status,
    "environment": cmd_environment,
    "cluster_status": cmd_cluster_status,
    "join_cluster": cmd_join_cluster,
    "forget_cluster_node": cmd_forget_cluster_node,
}
for _name in LISTS:
    COMMANDS[_name] = functools.partial(run_list, _name)


# -- the command line -------------------------------------------------------------------------------


def _add_global_options(parser: argparse.ArgumentParser, in_subcommand: bool) -> None:
    """The options every command takes. In sub-parsers their default is SUPPRESS, so that an option
    given before the command is not reset by the sub-parser (rabbitmqctl takes them anywhere)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if in_subcommand else value

    group = parser.add_argument_group("connection and output options")
    group.add_argument("--host", default=default(DEFAULT_HOST), help="node host (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=default(None),
                       help="management HTTP port (env HUTCH_MANAGEMENT_PORT; default 15672)")
    group.add_argument("--username", default=default(None), help="user name (env HUTCH_USER; default guest)")
    group.add_argument("--password", default=default(None),
                       help="password (env HUTCH_PASSWORD; default guest)")
    group.add_argument("-p", "--vhost", default=default("/"), help="virtual host (default /)")
    group.add_argument("--formatter", choices=("table", "json"), default=default("table"),
                       help="output format (default table)")
    group.add_argument("-q", "--quiet", action="store_true", default=default(False),
                       help="no informational banner lines")
    group.add_argument("--no-table-headers", action="store_true", default=default(False),
                       help="table output without the header row")
    group.add_argument("-t", "--timeout", type=float, default=default(DEFAULT_TIMEOUT_S), metavar="SECONDS",
                       help="request timeout (default 60)")
    tls = parser.add_argument_group("HTTPS options (as rabbitmqadmin's)")
    tls.add_argument("--ssl", action="store_true", default=default(False),
                     help="talk HTTPS to the management port (management.ssl.port)")
    tls.add_argument("--cacert", "--ssl-ca-cert-file", dest="cacert", default=default(None), metavar="FILE",
                     help="CA certificate(s) to verify the node with (implies --ssl; default: the system's)")
    tls.add_argument("--ssl-cert-file", default=default(None), metavar="FILE", help="client certificate (PEM)")
    tls.add_argument("--ssl-key-file", default=default(None), metavar="FILE", help="client certificate key (PEM)")
    tls.add_argument("--ssl-disable-hostname-verification", action="store_true", default=default(False),
                     help="do not check that the node's certificate names --host")


def ssl_context_from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The HTTPS context the options ask for (None: plain HTTP). Raises UsageError for a file that
    cannot be loaded."""
    if not (args.ssl or args.cacert or args.ssl_cert_file):
        return None
    try:
        ctx = ssl.create_default_context(cafile=args.cacert)
        if args.ssl_cert_file:
            ctx.load_cert_chain(args.ssl_cert_file, args.ssl_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load the TLS files: {exc}") from None
    if args.ssl_disable_hostname_verification:
        ctx.check_hostname = False
    return ctx


_POLICY_ARGS: list[tuple[str, dict[str, Any]]] = [
    ("name", {"metavar": "NAME"}), ("pattern", {"metavar": "PATTERN"}),
    ("definition", {"metavar": "DEFINITION", "help": "JSON object, e.g. '{\"max-length\": 1000}'"}),
]

_COMMAND_ARGS: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {
    "add_user": ("create a user", [("user", {"metavar": "NAME"}), ("new_password", {"metavar": "PASSWORD"})]),
    "delete_user": ("delete a user and close its connections", [("user", {"metavar": "NAME"})]),
    "change_password": ("change a user's password",
                        [("user", {"metavar": "NAME"}), ("new_password", {"metavar": "PASSWORD"})]),
    "set_user_tags": ("replace a user's tags",
                      [("user", {"metavar": "NAME"}), ("tags", {"metavar": "TAG", "nargs": "*"})]),
    "list_users": ("list users and their tags", []),
    "add_vhost": ("create a virtual host", [("name", {"metavar": "NAME"})]),
    "delete_vhost": ("delete a virtual host and everything in it", [("name", {"metavar": "NAME"})]),
    "list_vhosts": ("list virtual hosts", [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "set_permissions": ("set a user's permissions in a vhost (-p)",
                        [("user", {"metavar": "USER"}), ("conf", {"metavar": "CONF"}),
                         ("write", {"metavar": "WRITE"}), ("read", {"metavar": "READ"})]),
    "clear_permissions": ("remove a user's permissions in a vhost (-p)", [("user", {"metavar": "USER"})]),
    "list_permissions": ("list the permissions in a vhost (-p)", []),
    "list_user_permissions": ("list a user's permissions in every vhost", [("user", {"metavar": "USER"})]),
    "set_policy": ("set a policy in a vhost (-p)", _POLICY_ARGS),
    "clear_policy": ("remove a policy from a vhost (-p)", [("name", {"metavar": "NAME"})]),
    "list_policies": ("list the policies of a vhost (-p)", []),
    "set_operator_policy": ("set an operator policy in a vhost (-p)", _POLICY_ARGS),
    "clear_operator_policy": ("remove an operator policy from a vhost (-p)", [("name", {"metavar": "NAME"})]),
    "list_operator_policies": ("list the operator policies of a vhost (-p)", []),
    "set_vhost_limits": ("replace the limits of a vhost (-p): max-connections, max-queues",
                         [("definition", {"metavar": "DEFINITION", "help": "JSON, e.g. '{\"max-connections\": 256}'"})]),
    "clear_vhost_limits": ("remove every limit of a vhost (-p)", []),
    "list_vhost_limits": ("list the limits of a vhost (-p), or of all with --global", []),
    "set_user_limits": ("set limits of a user: max-connections, max-channels",
                        [("user", {"metavar": "USER"}),
                         ("definition", {"metavar": "DEFINITION", "help": "JSON, e.g. '{\"max-channels\": 64}'"})]),
    "clear_user_limits": ("remove one limit of a user, or all",
                          [("user", {"metavar": "USER"}), ("limit", {"metavar": "LIMIT|all"})]),
    "list_user_limits": ("list the limits of a user (--user), or of all users", []),
    "list_queues": ("list the queues of a vhost (-p)", [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_exchanges": ("list the exchanges of a vhost (-p)",
                       [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_bindings": ("list the bindings of a vhost (-p)", [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_connections": ("list AMQP connections", [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_channels": ("list AMQP channels", [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_consumers": ("list the consumers of a vhost (-p)",
                       [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_stream_connections": ("list stream-protocol connections",
                                [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_stream_consumers": ("list the stream-protocol consumers of a vhost (-p)",
                              [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_stream_publishers": ("list the stream-protocol publishers of a vhost (-p)",
                               [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_stream_consumer_groups": ("list the single-active-consumer groups of a vhost (-p)",
                                    [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "list_stream_group_consumers": ("list the consumers of one group (--stream S --reference R) in a vhost (-p)",
                                    [("columns", {"metavar": "COLUMN", "nargs": "*"})]),
    "set_parameter": ("set a runtime parameter in a vhost (-p): a shovel or a federation upstream (set)",
                      [("component", {"metavar": "COMPONENT",
                                      "help": "shovel, federation-upstream or federation-upstream-set"}), ("name", {"metavar": "NAME"}),
                       ("value", {"metavar": "VALUE", "help": "JSON, e.g. '{\"src-uri\": \"amqp://\", ...}'"})]),
    "clear_parameter": ("clear a runtime parameter in a vhost (-p)",
                        [("component", {"metavar": "COMPONENT"}), ("name", {"metavar": "NAME"})]),
    "list_parameters": ("list the (shovel) runtime parameters of a vhost (-p)", []),
    "shovel_status": ("show the dynamic shovels and their state", []),
    "federation_status": ("show the federation links and their status", []),
    "status": ("show the node's status", []),
    "environment": ("show the node's effective configuration (secrets left out)", []),
    "cluster_status": ("show the cluster's members, running nodes, partitions and alarms", []),
    "join_cluster": ("make this (lone) node join the cluster of NODE@HOST:PORT; drops its own definitions",
                     [("node", {"metavar": "NODE@HOST:PORT"})]),
    "forget_cluster_node": ("remove a stopped node from the cluster", [("node", {"metavar": "NODE"})]),
    "purge_queue": ("remove every message of a queue in a vhost (-p)", [("queue", {"metavar": "QUEUE"})]),
    "delete_queue": ("delete a queue of a vhost (-p)", [("queue", {"metavar": "QUEUE"})]),
    "close_connection": ("close a connection (by its list_connections name) with a reason",
                         [("connection", {"metavar": "CONNECTION"}), ("explanation", {"metavar": "EXPLANATION"})]),
    "await_startup": ("wait (at most -t seconds) until the node answers", []),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Manage a running hutch node through its management HTTP API (rabbitmqctl's commands).",
        epilog="Exit codes: 0 ok, 1 the node refused, 2 bad usage, 69 node unreachable, 70 bad reply. "
        "See docs/hutchctl.md.",
    )
    _add_global_options(parser, in_subcommand=False)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (help_text, positionals) in _COMMAND_ARGS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        for dest, kwargs in positionals:
            cmd.add_argument(dest, **kwargs)
        if name == "add_vhost":
            cmd.add_argument("--description", default="", help="description of the vhost")
            cmd.add_argument("--tags", default="", help="comma-separated vhost tags")
            cmd.add_argument("--default-queue-type", default=None, help="default queue type: classic (default) or quorum")
        if name in ("list_vhost_limits", "list_user_limits"):
            cmd.add_argument("--global", dest="glob", action="store_true", help="every vhost or user")
        if name == "list_user_limits":
            cmd.add_argument("--user", default=None, help="the user whose limits to list")
        if name == "delete_queue":
            cmd.add_argument("-e", "--if-empty", action="store_true", help="only if it has no ready messages")
            cmd.add_argument("-u", "--if-unused", action="store_true", help="only if it has no consumers")
        if name == "list_stream_group_consumers":
            cmd.add_argument("--stream", required=True, help="the stream of the group")
            cmd.add_argument("--reference", required=True, help="the group's name (the consumer name)")
        if name in ("set_policy", "set_operator_policy"):
            cmd.add_argument("--priority", type=int, default=0, help="priority (default 0; highest wins)")
            cmd.add_argument("--apply-to", default="all",
                             help="queues, classic_queues, quorum_queues, streams, exchanges or all (default all)")
        _add_global_options(cmd, in_subcommand=True)
    return parser


def resolve_args(argv: Sequence[str] | None, environ: dict[str, str]) -> argparse.Namespace:
    """Parse the command line and fill credentials and port from the environment."""
    args = build_parser().parse_args(argv)
    if args.port is None:
        text = environ.get("HUTCH_MANAGEMENT_PORT", "")
        if text:
            if not text.isdigit():
                raise UsageError(f"HUTCH_MANAGEMENT_PORT: expected a port number, got '{text}'")
            args.port = int(text)
        else:
            args.port = DEFAULT_PORT
    if not 1 <= args.port <= 65535:
        raise UsageError(f"argument --port: expected a port between 1 and 65535, got {args.port}")
    if args.timeout <= 0:
        raise UsageError("argument -t/--timeout: expected a positive number of seconds")
    if args.username is None:
        args.username = environ.get("HUTCH_USER") or "guest"
    if args.password is None:
        args.password = environ.get("HUTCH_PASSWORD") or "guest"
    args.ssl_context = ssl_context_from_args(args)
    return args


def _refusal_text(exc: ApiFailure, client: Client) -> str:
    if exc.status == 401 and exc.error == "not_authorized":
        return f"authentication failed for user '{client.username}'"
    if exc.status == 401:
        return f"access refused for user '{client.username}': {exc.reason}"
    if exc.status == 404:
        return "not found"
    return exc.reason


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = resolve_args(argv, dict(os.environ))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EX_USAGE
    except SystemExit as exc:  # --help / --version printed their output
        return exc.code if isinstance(exc.code, int) else EX_OK
    client = Client(args.host, args.port, args.username, args.password, args.timeout, args.ssl_context)
    try:
        out = COMMANDS[args.command](client, args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EX_USAGE
    except Unreachable as exc:
        print(f"{PROG}: cannot reach node at {client.base_url}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except Refused as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EX_REFUSED
    except ApiFailure as exc:
        print(f"{PROG}: {_refusal_text(exc, client)}", file=sys.stderr)
        return EX_REFUSED
    except BadReply as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EX_SOFTWARE
    emit(out, args)
    return EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
