"""``hutch-queues``: quorum queue (and replicated stream) operations through the management HTTP API,
rabbitmq-queues-style.

This module owns the command line of hutch-queues (rabbitmq-queues' command names and argument
orders: add_member, delete_member, grow, shrink, rebalance, quorum_status), migrate_mirrored, which
turns the empty classic queues an old mirroring policy matched into quorum queues, and redrive, which
sends a dead-letter queue's messages back where they died (a temporary shovel: docs/shovel.md). It is a client of the
node's API like hutchctl and shares hutchctl's HTTP client, options, output formats and error contract
(cli/ctl.py):

* bad usage: one line ``hutch-queues: error: …``, exit 2;
* the node cannot be reached: one line, exit 69;
* the node refused: one line ``hutch-queues: <reason>``, exit 1 (e.g. no quorum of the queue's members);
* a reply that is not what a hutch node sends: exit 70.

Commands that act on many queues (grow, shrink, rebalance, migrate_mirrored --apply) report every queue
and exit 1 when any of them failed. See docs/quorum-queues.md, "Operations".
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hutch import __version__

from .ctl import (
    DEFAULT_PORT,
    EX_OK,
    EX_REFUSED,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    EX_USAGE,
    ApiFailure,
    BadReply,
    Client,
    Output,
    Refused,
    Table,
    Unreachable,
    UsageError,
    _add_global_options,
    _Parser,
    emit,
    render_table,
    seg,
    ssl_context_from_args,
)

PROG = "hutch-queues"


@dataclass
class Report(Output):
    """An Output whose rows may record failures: the command exits 1 when `failed` is not zero."""

    failed: int = 0


# -- helpers ------------------------------------------------------------------------------------------


def _queue_request(client: Client, args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """A request about the queue args.queue: a bare 404 means that queue (or its vhost) does not exist."""
    try:
        return client.request(method, path, body)
    except ApiFailure as exc:
        if exc.status == 404 and exc.error == "Object Not Found":
            raise Refused(f"queue '{args.queue}' in vhost '{args.vhost}' does not exist") from None
        raise


def _queue_path(args: argparse.Namespace) -> str:
    return f"/api/queues/{seg(args.vhost)}/{seg(args.queue)}"


def _rows(reply: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(reply, list) or not all(isinstance(r, dict) for r in reply):
        raise BadReply(f"unexpected reply to {what}")
    return reply


def _result(row: dict[str, Any]) -> str:
    return "ok" if row.get("result") == "ok" else f"error: {row.get('reason', '?')}"


def _per_queue(rows: list[dict[str, Any]], banner: str) -> Report:
    table = Table(["vhost", "name", "size", "result"],
                  [[r.get("vhost"), r.get("name"), r.get("size"), _result(r)] for r in rows])
    return Report(banner=banner, table=table, failed=sum(r.get("result") != "ok" for r in rows))


# -- membership ---------------------------------------------------------------------------------------


def cmd_add_member(client: Client, args: argparse.Namespace) -> Output:
    _queue_request(client, args, "POST", _queue_path(args) + "/members", {"node": args.node})
    return Output(banner=f"Adding a replica for queue {args.queue} in vhost {args.vhost} on node {args.node}...")


def cmd_delete_member(client: Client, args: argparse.Namespace) -> Output:
    _queue_request(client, args, "DELETE", f"{_queue_path(args)}/members/{seg(args.node)}")
    return Output(banner=f"Removing a replica for queue {args.queue} in vhost {args.vhost} on node "
                         f"{args.node}...")


def cmd_grow(client: Client, args: argparse.Namespace) -> Output:
    body = {"node": args.node, "strategy": args.strategy, "vhost_pattern": args.vhost_pattern,
            "queue_pattern": args.queue_pattern}
    rows = _rows(client.request("POST", "/api/quorum-queues/grow", body), "POST /api/quorum-queues/grow")
    return _per_queue(rows, f"Growing {args.strategy} quorum queues matching '{args.vhost_pattern}' / "
                            f"'{args.queue_pattern}' to {args.node}...")


def cmd_shrink(client: Client, args: argparse.Namespace) -> Output:
    body = {"node": args.node, "errors_only": args.errors_only}
    rows = _rows(client.request("POST", "/api/quorum-queues/shrink", body), "POST /api/quorum-queues/shrink")
    return _per_queue(rows, f"Shrinking quorum queues on {args.node}...")


# -- leaders and status -------------------------------------------------------------------------------


def cmd_rebalance(client: Client, args: argparse.Namespace) -> Output:
    body = {"vhost_pattern": args.vhost_pattern, "queue_pattern": args.queue_pattern}
    doc = client.request("POST", "/api/quorum-queues/rebalance", body)
    if not isinstance(doc, dict) or not isinstance(doc.get("moves"), list) or not isinstance(doc.get("nodes"), list):
        raise BadReply("unexpected reply to POST /api/quorum-queues/rebalance")
    lines = []
    for m in doc["moves"]:
        where = f"queue '{m.get('name')}' in vhost '{m.get('vhost')}'"
        if m.get("result") == "ok":
            lines.append(f"Moved the leader of {where} from {m.get('from')} to {m.get('to')}")
        else:
            lines.append(f"Could not move the leader of {where} from {m.get('from')} to {m.get('to')}: "
                         f"{m.get('reason')}")
    if not doc["moves"]:
        lines.append("No leader needed to move")
    columns = ["node", "queues", "leaders_before", "leaders_after"]
    table = Table(columns, [[n.get(c) for c in columns] for n in doc["nodes"]])
    lines += ["", *render_table(table, headers=not args.no_table_headers).splitlines()]
    return Report(banner="Re-balancing leaders of quorum queues...", document=doc, lines=lines,
                  failed=sum(m.get("result") != "ok" for m in doc["moves"]))


STATUS_COLUMNS = ("node", "role", "membership", "term", "commit_index", "last_applied", "first_index",
                  "last_index", "match_index", "caught_up", "online")


def cmd_quorum_status(client: Client, args: argparse.Namespace) -> Output:
    rows = _rows(_queue_request(client, args, "GET", _queue_path(args) + "/quorum-status"),
                 "GET .../quorum-status")
    table = Table(list(STATUS_COLUMNS), [[r.get(c) for c in STATUS_COLUMNS] for r in rows])
    return Output(banner=f"Status of quorum queue {args.queue} in vhost {args.vhost} ...", table=table)


# -- migrating mirrored classic queues ----------------------------------------------------------------


def _quorum_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A classic queue's arguments as a quorum queue's, and the classic-only ones dropped."""
    from hutch.core.arguments import QUEUE_TYPE_ARGUMENTS
    allowed = QUEUE_TYPE_ARGUMENTS["quorum"]
    out: dict[str, Any] = {}
    dropped = []
    for key, value in arguments.items():
        if key == "x-queue-master-locator" and "x-queue-leader-locator" not in arguments:
            out["x-queue-leader-locator"] = value  # RabbitMQ's older name of the same setting
        elif key in allowed:
            out[key] = value
        else:
            dropped.append(key)
    out["x-queue-type"] = "quorum"
    return out, dropped


def _skip_reason(q: dict[str, Any]) -> str | None:
    """Why a classic queue cannot be migrated as it is (None: it can)."""
    arguments = q.get("arguments") or {}
    if q.get("exclusive"):
        return "exclusive (a quorum queue cannot be)"
    if not q.get("durable"):
        return "not durable (quorum queues are always durable)"
    if q.get("auto_delete"):
        return "auto-delete (a quorum queue cannot be)"
    if str(q.get("name", "")).startswith("amq.gen-"):
        return "server-named"
    if arguments.get("x-overflow") == "reject-publish-dlx":
        return "x-overflow reject-publish-dlx is not supported by quorum queues"
    if q.get("messages"):
        return f"not empty ({q.get('messages')} messages)"
    if q.get("consumers"):
        return f"in use ({q.get('consumers')} consumers)"
    return None


def _bind_all(client: Client, vhost: str, name: str, bindings: list[dict[str, Any]]) -> None:
    for b in bindings:
        client.request("POST", f"/api/bindings/{seg(vhost)}/e/{seg(b['source'])}/q/{seg(name)}",
                       {"routing_key": b.get("routing_key", ""), "arguments": b.get("arguments") or {}})


def _migrate(client: Client, vhost: str, q: dict[str, Any]) -> str:
    """Delete the empty classic queue and declare it again as a quorum queue with its bindings; on a
    failure after the delete, the classic queue is put back. Returns what happened (raises Refused)."""
    name = q["name"]
    path = f"/api/queues/{seg(vhost)}/{seg(name)}"
    try:
        bindings = [b for b in client.get(path + "/bindings") or [] if b.get("source")]  # not the default exchange
    except ApiFailure as exc:
        raise Refused(f"error: {exc.reason}") from None
    arguments, dropped = _quorum_arguments(q.get("arguments") or {})
    try:
        client.request("DELETE", path + "?if-empty=true&if-unused=true")
    except ApiFailure as exc:
        raise Refused(f"skipped: {exc.reason}") from None
    try:
        client.request("PUT", path, {"durable": True, "auto_delete": False, "arguments": arguments})
        _bind_all(client, vhost, name, bindings)
    except ApiFailure as exc:
        try:
            client.request("DELETE", path)
        except ApiFailure:
            pass
        try:
            client.request("PUT", path, {"durable": True, "auto_delete": False,
                                         "arguments": q.get("arguments") or {}})
            _bind_all(client, vhost, name, bindings)
        except ApiFailure as again:
            raise Refused(f"error: {exc.reason}; restoring the classic queue failed too: {again.reason}") from None
        raise Refused(f"error: {exc.reason} (restored as a classic queue)") from None
    note = f"{len(bindings)} bindings"
    return note + (f"; dropped {', '.join(dropped)}" if dropped else "")


def cmd_migrate_mirrored(client: Client, args: argparse.Namespace) -> Output:
    try:
        pattern = re.compile(args.pattern)
    except re.error as exc:
        raise UsageError(f"argument --pattern: '{args.pattern}' is not a valid regular expression: {exc}") from None
    try:
        queues = client.get(f"/api/queues/{seg(args.vhost)}")
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f'Virtual host "{args.vhost}" does not exist') from None
        raise
    rows = []
    failed = 0
    for q in _rows(queues, "GET /api/queues/{vhost}"):
        if q.get("type", "classic") != "classic" or pattern.search(str(q.get("name", ""))) is None:
            continue
        reason = _skip_reason(q)
        dropped = _quorum_arguments(q.get("arguments") or {})[1]
        if reason is not None:
            result, detail = "skipped", reason
        elif not args.apply:
            result, detail = "would migrate", f"dropped {', '.join(dropped)}" if dropped else ""
        else:
            try:
                result, detail = "migrated", _migrate(client, args.vhost, q)
            except Refused as exc:
                kind, _, detail = str(exc).partition(": ")
                result = kind
                failed += kind == "error"
        rows.append([q.get("name"), q.get("messages"), q.get("consumers"), result, detail])
    action = "Migrating" if args.apply else "Listing (dry run; --apply migrates)"
    return Report(banner=f"{action} classic queues matching '{args.pattern}' in vhost {args.vhost} to quorum "
                         "queues...",
                  table=Table(["name", "messages", "consumers", "result", "detail"], rows), failed=failed)


# -- the command line ---------------------------------------------------------------------------------

Command = Callable[[Client, argparse.Namespace], Output]
def cmd_redrive(client: Client, args: argparse.Namespace) -> Output:
    """Send every message of a dead-letter queue back to the queue it died in (its latest `x-death`), as a
    temporary shovel that removes itself once it has moved the queue's length (docs/shovel.md)."""
    name = args.name or f"redrive-{args.queue}"
    value = {"src-uri": "amqp://", "src-queue": args.queue, "dest-uri": "amqp://", "dest-queue-from-x-death": True,
             "src-delete-after": "queue-length"}
    path = f"/api/queues/{seg(args.vhost)}/{seg(args.queue)}"
    try:
        client.get(path)
    except ApiFailure as exc:
        if exc.status == 404:
            raise Refused(f"queue '{args.queue}' in vhost '{args.vhost}' not found") from None
        raise
    client.request("PUT", f"/api/parameters/shovel/{seg(args.vhost)}/{seg(name)}", {"value": value})
    return Output(banner=f'Redriving the messages of queue "{args.queue}" in vhost "{args.vhost}" to the queues '
                         f'they died in (temporary shovel "{name}"; hutchctl shovel_status shows it) ...')


COMMANDS: dict[str, Command] = {
    "add_member": cmd_add_member,
    "delete_member": cmd_delete_member,
    "grow": cmd_grow,
    "shrink": cmd_shrink,
    "rebalance": cmd_rebalance,
    "quorum_status": cmd_quorum_status,
    "migrate_mirrored": cmd_migrate_mirrored,
    "redrive": cmd_redrive,
}

_QUEUE_NODE = [("queue", {"metavar": "QUEUE"}), ("node", {"metavar": "NODE"})]
_PATTERNS = [("--vhost-pattern", {"default": ".*", "help": "regular expression for vhost names (default .*)"}),
             ("--queue-pattern", {"default": ".*", "help": "regular expression for queue names (default .*)"})]
_COMMAND_ARGS: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {
    "add_member": ("add a member (replica) on NODE to a quorum queue or a replicated stream in a vhost (-p)",
                   _QUEUE_NODE),
    "delete_member": ("remove the member on NODE from a quorum queue or a replicated stream in a vhost (-p)",
                      _QUEUE_NODE),
    "grow": ("add NODE as a member of every matching quorum queue and replicated stream (even: only those "
             "with an even number of members)", [("node", {"metavar": "NODE"}),
                             ("strategy", {"choices": ("all", "even"), "metavar": "all|even"}), *_PATTERNS]),
    "shrink": ("remove NODE from every quorum queue and replicated stream it is a member of",
               [("node", {"metavar": "NODE"}),
                ("--errors-only", {"action": "store_true", "help": "report only the queues that failed"})]),
    "rebalance": ("move quorum queue leaders so every node leads about as many",
                  [("type", {"choices": ("quorum", "all"), "metavar": "quorum|all"}), *_PATTERNS]),
    "quorum_status": ("show a quorum queue's members: Raft role, term, log indexes", [("queue", {"metavar": "QUEUE"})]),
    "migrate_mirrored": ("list (or, with --apply, convert) the empty classic queues a mirroring policy pattern "
                         "matched, as quorum queues",
                         [("--pattern", {"required": True, "metavar": "REGEX",
                                         "help": "the pattern of the old ha-mode policy"}),
                          ("--apply", {"action": "store_true",
                                       "help": "redeclare each empty, unused one as a quorum queue"})]),
    "redrive": ("send each message of a dead-letter queue (-p vhost) back to the queue it died in (its x-death), "
                "as a temporary shovel that removes itself when done",
                [("queue", {"metavar": "QUEUE"}),
                 ("--name", {"default": None, "help": "the shovel's name (default redrive-QUEUE)"})]),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Quorum queue operations on a running hutch cluster through its management HTTP API "
                    "(rabbitmq-queues' commands).",
        epilog="Exit codes: 0 ok, 1 the node refused (or a queue of a many-queue command failed), 2 bad usage, "
               "69 node unreachable, 70 bad reply. See docs/quorum-queues.md, \"Operations\".",
    )
    _add_global_options(parser, in_subcommand=False)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (help_text, arguments) in _COMMAND_ARGS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        for dest, kwargs in arguments:
            cmd.add_argument(dest, **kwargs)
        _add_global_options(cmd, in_subcommand=True)
    return parser


def resolve_args(argv: Sequence[str] | None, environ: dict[str, str]) -> argparse.Namespace:
    """Parse the command line and fill credentials and port from the environment (as hutchctl)."""
    args = build_parser().parse_args(argv)
    if args.port is None:
        text = environ.get("HUTCH_MANAGEMENT_PORT", "")
        if text and not text.isdigit():
            raise UsageError(f"HUTCH_MANAGEMENT_PORT: expected a port number, got '{text}'")
        args.port = int(text) if text else DEFAULT_PORT
    if not 1 <= args.port <= 65535:
        raise UsageError(f"argument --port: expected a port between 1 and 65535, got {args.port}")
    if args.timeout <= 0:
        raise UsageError("argument -t/--timeout: expected a positive number of seconds")
    args.username = args.username if args.username is not None else environ.get("HUTCH_USER") or "guest"
    args.password = args.password if args.password is not None else environ.get("HUTCH_PASSWORD") or "guest"
    args.ssl_context = ssl_context_from_args(args)
    return args


def _refusal_text(exc: ApiFailure, client: Client) -> str:
    if exc.status == 401 and exc.error == "not_authorized":
        return f"authentication failed for user '{client.username}'"
    if exc.status == 401:
        return f"access refused for user '{client.username}': {exc.reason}"
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
    if isinstance(out, Report) and out.failed:
        print(f"{PROG}: {out.failed} queue(s) failed", file=sys.stderr)
        return EX_REFUSED
    return EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
