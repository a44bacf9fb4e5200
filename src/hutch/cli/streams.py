"""``hutch-streams``: super streams and stream queries over the stream protocol, rabbitmq-streams-style.

This module owns the command line of hutch-streams (rabbitmq-streams' command names and options:
``add_super_stream NAME --partitions N | --binding-keys a,b`` with ``--max-age``, ``--max-length-bytes``,
``--stream-max-segment-size-bytes``, ``--leader-locator``, ``--initial-cluster-size``;
``delete_super_stream NAME``; and ``list_partitions NAME`` / ``route NAME KEY``, the queries a client
asks) and the small blocking stream-protocol client they speak through (``StreamClient``: the
handshake, then requests matched to their responses by correlation id), built on hutch.streamproto.
rabbitmq-streams talks to the node over Erlang distribution; hutch-streams talks to the node's stream
listener, so it needs ``stream.listeners.tcp.default`` (or ``--stream-port``) on the node.

The listing commands (rabbitmq-streams' ``list_stream_connections``, ``list_stream_consumers``,
``list_stream_publishers``, ``list_stream_consumer_groups``, ``list_stream_group_consumers --stream S
--reference R`` and ``list_stream_tracking S [--all|--offset|--writer]``, with its column names and
defaults) read the node's management HTTP API instead (``--management-port``), through hutchctl's
client, tables and output formats (``--formatter``, ``-q``, ``--no-table-headers``).

Error contract (as hutchctl's, cli/ctl.py): bad usage one line and exit 2; the node cannot be reached
exit 69; the node refused (e.g. the super stream exists) one line ``hutch-streams: <reason>`` and exit 1;
a reply that is not the stream protocol exit 70.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hutch import __version__
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code
from hutch.streamproto.errors import StreamProtocolError
from hutch.streamproto.framer import FrameReader

from .ctl import (
    EX_OK,
    EX_REFUSED,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    EX_USAGE,
    STREAM_LISTS,
    ApiFailure,
    BadReply,
    Client,
    ListSpec,
    Refused,
    Unreachable,
    UsageError,
    _fields,
    emit,
    run_spec,
    seg,
)

PROG = "hutch-streams"
DEFAULT_PORT = 5552
DEFAULT_MANAGEMENT_PORT = 15672
DEFAULT_TIMEOUT_S = 30.0
RESPONSE_TEXT = {code: code.name.lower().replace("_", " ") for code in Code}


class StreamClient:
    """A blocking stream-protocol client for one command line: connect, authenticate, open, ask."""

    def __init__(self, host: str, port: int, timeout_s: float, ssl_context: ssl.SSLContext | None) -> None:
        self.where = f"{host}:{port}"
        try:
            raw = socket.create_connection((host, port), timeout=timeout_s)
            self.sock: socket.socket = ssl_context.wrap_socket(raw, server_hostname=host) if ssl_context else raw
        except OSError as exc:
            raise Unreachable(str(exc)) from None
        self.reader = FrameReader(0)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    def send(self, cmd: c.Command) -> None:
        try:
            self.sock.sendall(c.encode(cmd))
        except OSError as exc:
            raise Unreachable(str(exc)) from None

    def receive(self) -> c.Command:
        """The next command from the node, heartbeats skipped."""
        while True:
            for frame in self.reader.frames():
                try:
                    cmd = c.decode(frame)
                except StreamProtocolError as exc:
                    raise BadReply(f"not a stream-protocol reply: {exc}") from None
                if not isinstance(cmd, c.Heartbeat):
                    return cmd
            try:
                data = self.sock.recv(65536)
            except OSError as exc:
                raise Unreachable(str(exc)) from None
            if not data:
                raise Unreachable("the node closed the connection")
            self.reader.feed(data)

    def request(self, cmd: Any) -> Any:
        self.send(cmd)
        while True:
            reply = self.receive()
            if getattr(reply, "correlation_id", None) == cmd.correlation_id:
                return reply

    def open(self, username: str, password: str, vhost: str) -> None:
        self.request(c.PeerProperties(self.next_correlation(), {"product": PROG, "version": __version__}))
        self.request(c.SaslHandshake(self.next_correlation()))
        auth = self.request(c.SaslAuthenticate(self.next_correlation(), "PLAIN",
                                               f"\0{username}\0{password}".encode()))
        check(auth.code, "login refused")
        tune = self.receive()
        if not isinstance(tune, c.Tune):
            raise BadReply(f"expected tune, got {type(tune).__name__}")
        self.send(c.TuneResponse(tune.frame_max, 0))
        opened = self.request(c.Open(self.next_correlation(), vhost))
        check(opened.code, f"cannot open vhost '{vhost}'")


def check(code: int, what: str) -> None:
    if code != Code.OK:
        try:
            text = RESPONSE_TEXT[Code(code)]
        except ValueError:
            text = f"response code {code}"
        raise Refused(f"{what}: {text}")


# -- commands ------------------------------------------------------------------------------------------
def _stream_arguments(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    for option, key in (("max_age", "max-age"), ("max_length_bytes", "max-length-bytes"),
                        ("stream_max_segment_size_bytes", "stream-max-segment-size-bytes"),
                        ("leader_locator", "queue-leader-locator"),
                        ("initial_cluster_size", "initial-cluster-size")):
        value = getattr(args, option)
        if value is not None:
            out[key] = str(value)
    return out


def add_super_stream(client: StreamClient, args: argparse.Namespace) -> str:
    if (args.partitions is None) == (args.binding_keys is None):
        raise UsageError("give either --partitions or --binding-keys")
    if args.partitions is not None:
        if args.partitions < 1:
            raise UsageError("--partitions must be at least 1")
        keys = [str(i) for i in range(args.partitions)]
    else:
        keys = [k.strip() for k in args.binding_keys.split(",") if k.strip()]
        if not keys:
            raise UsageError("--binding-keys needs at least one key")
    partitions = [f"{args.name}-{k}" for k in keys]
    reply = client.request(c.CreateSuperStream(client.next_correlation(), args.name, partitions, keys,
                                               _stream_arguments(args)))
    check(reply.code, f"cannot create super stream '{args.name}'")
    return f"Super stream {args.name} was created ({len(partitions)} partitions: {', '.join(partitions)})"


def delete_super_stream(client: StreamClient, args: argparse.Namespace) -> str:
    reply = client.request(c.DeleteSuperStream(client.next_correlation(), args.name))
    check(reply.code, f"cannot delete super stream '{args.name}'")
    return f"Super stream {args.name} was deleted"


def list_partitions(client: StreamClient, args: argparse.Namespace) -> str:
    reply = client.request(c.Partitions(client.next_correlation(), args.name))
    check(reply.code, f"super stream '{args.name}'")
    return "\n".join(reply.streams)


def route(client: StreamClient, args: argparse.Namespace) -> str:
    reply = client.request(c.Route(client.next_correlation(), args.key, args.name))
    check(reply.code, f"super stream '{args.name}'")
    return "\n".join(reply.streams)


COMMANDS: dict[str, Callable[[StreamClient, argparse.Namespace], str]] = {
    "add_super_stream": add_super_stream,
    "delete_super_stream": delete_super_stream,
    "list_partitions": list_partitions,
    "route": route,
}


# -- listing commands: read the management HTTP API, as hutchctl does ------------------------------------
# list_stream_tracking is rabbitmq-streams' only; the others are hutchctl's too (rabbitmqctl has them)
LISTS: dict[str, ListSpec] = {
    **STREAM_LISTS,
    "list_stream_tracking": ListSpec(
        path=lambda a: f"/api/stream/tracking/{seg(a.vhost)}/{seg(a.stream)}?type={a.tracking}",
        columns=_fields("type", "name", "tracking_value"),
        default=("type", "name", "tracking_value"),
        banner=lambda a: f"Listing tracking information for stream {a.stream} ...",
        takes_columns=False,
        not_found=lambda a: "The stream does not exist.",
    ),
}


def run_listing(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """A listing command against the node's management API (exit codes as hutchctl's)."""
    port = args.management_port
    if port is None:
        text = environ.get("HUTCH_MANAGEMENT_PORT", "")
        if text and not text.isdigit():
            raise UsageError(f"HUTCH_MANAGEMENT_PORT: expected a port number, got '{text}'")
        port = int(text) if text else DEFAULT_MANAGEMENT_PORT
    context = ssl.create_default_context(cafile=args.cacert) if args.ssl else None
    client = Client(args.host, port, args.username, args.password, args.timeout, context)
    try:
        out = run_spec(args.command, LISTS[args.command], client, args)
    except Unreachable as exc:
        print(f"{PROG}: cannot reach the management API at {client.base_url}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except ApiFailure as exc:
        reason = "authentication failed" if exc.status == 401 and exc.error == "not_authorized" else exc.reason
        print(f"{PROG}: {reason}", file=sys.stderr)
        return EX_REFUSED
    emit(out, args)
    return EX_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(" ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Super streams over a hutch node's stream protocol listener "
                     "(rabbitmq-streams' commands). See docs/streams.md.")
    parser.add_argument("--host", default="127.0.0.1", help="node host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the node's stream protocol port (default {DEFAULT_PORT})")
    parser.add_argument("--vhost", "-p", default="/", help="virtual host (default /)")
    parser.add_argument("--username", "-u", default=os.environ.get("HUTCH_STREAMS_USER", "guest"),
                        help="user (env HUTCH_STREAMS_USER; default guest)")
    parser.add_argument("--password", default=os.environ.get("HUTCH_STREAMS_PASSWORD", "guest"),
                        help="password (env HUTCH_STREAMS_PASSWORD; default guest)")
    parser.add_argument("--ssl", action="store_true", help="TLS (the node's stream.listeners.ssl.default)")
    parser.add_argument("--cacert", help="CA file that verifies the node's certificate (with --ssl)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default 30)")
    parser.add_argument("--management-port", type=int, default=None,
                        help="the node's management HTTP port, for the list_* commands "
                             f"(env HUTCH_MANAGEMENT_PORT; default {DEFAULT_MANAGEMENT_PORT})")
    parser.add_argument("--formatter", choices=("table", "json"), default="table",
                        help="output of the list_* commands (default table)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no banner line before a listing")
    parser.add_argument("--no-table-headers", action="store_true", help="a table without its header row")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add = sub.add_parser("add_super_stream", help="create a super stream (an exchange and its partitions)")
    add.add_argument("name")
    add.add_argument("--partitions", type=int, help="number of partitions (NAME-0 … NAME-(N-1))")
    add.add_argument("--binding-keys", help="comma-separated routing keys, one partition each (NAME-KEY)")
    add.add_argument("--max-age", help="retention by age, e.g. 7D, 12h")
    add.add_argument("--max-length-bytes", type=int, help="retention by size")
    add.add_argument("--stream-max-segment-size-bytes", type=int, help="segment file size")
    add.add_argument("--leader-locator", choices=("client-local", "balanced"), help="where leaders go")
    add.add_argument("--initial-cluster-size", type=int, help="members of each partition")
    delete = sub.add_parser("delete_super_stream", help="delete a super stream and its partitions")
    delete.add_argument("name")
    parts = sub.add_parser("list_partitions", help="the partitions of a super stream, in order")
    parts.add_argument("name")
    rt = sub.add_parser("route", help="the partitions a routing key goes to")
    rt.add_argument("name")
    rt.add_argument("key")
    _add_listing_commands(sub)
    return parser


def _add_listing_commands(sub: Any) -> None:
    helps = {
        "list_stream_connections": "stream connections (every vhost)",
        "list_stream_consumers": "stream consumers of a vhost (--vhost)",
        "list_stream_publishers": "stream publishers of a vhost (--vhost)",
        "list_stream_consumer_groups": "single-active-consumer groups of a vhost (--vhost)",
        "list_stream_group_consumers": "the consumers of one group (--stream S --reference R)",
        "list_stream_tracking": "a stream's writer and offset tracking",
    }
    for name, help_text in helps.items():
        cmd = sub.add_parser(name, help=help_text + " (reads the management API: --management-port)")
        spec = LISTS[name]
        if spec.takes_columns:
            cmd.add_argument("columns", nargs="*", metavar="COLUMN",
                             help=f"columns (default {' '.join(spec.default)}): {', '.join(sorted(spec.columns))}")
        cmd.add_argument("--vhost", "-p", default=argparse.SUPPRESS, help="virtual host (default /)")
        if name == "list_stream_group_consumers":
            cmd.add_argument("--stream", required=True, help="the stream of the group")
            cmd.add_argument("--reference", required=True, help="the group's name (the consumer name)")
        if name == "list_stream_tracking":
            cmd.add_argument("stream")
            kinds = cmd.add_mutually_exclusive_group()
            for kind, what in (("all", "writers and offsets (default)"), ("offset", "stored consumer offsets"),
                               ("writer", "publishers' last publishing ids (deduplication)")):
                kinds.add_argument(f"--{kind}", dest="tracking", action="store_const", const=kind, help=what)
            cmd.set_defaults(tracking="all")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EX_USAGE
    except SystemExit as exc:  # --help / --version printed their output
        return exc.code if isinstance(exc.code, int) else EX_OK
    if args.command in LISTS:
        try:
            return run_listing(args, dict(os.environ))
        except UsageError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EX_USAGE
        except (Refused, BadReply) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return EX_SOFTWARE if isinstance(exc, BadReply) else EX_REFUSED
    context = None
    if args.ssl:
        context = ssl.create_default_context(cafile=args.cacert)
    client: StreamClient | None = None
    try:
        client = StreamClient(args.host, args.port, args.timeout, context)
        client.open(args.username, args.password, args.vhost)
        print(COMMANDS[args.command](client, args))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EX_USAGE
    except Unreachable as exc:
        print(f"{PROG}: cannot reach the stream listener at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except Refused as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EX_REFUSED
    except BadReply as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EX_SOFTWARE
    finally:
        if client is not None:
            client.close()
    return EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
