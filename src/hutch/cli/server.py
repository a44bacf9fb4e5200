"""``hutch-server``: parse the command line, resolve the Config, set up logging, run the node.

This module owns the command-line surface of the server and its error contract: a bad flag
or a bad setting prints exactly one line to stderr and exits 2 (``hutch-server: error: …``
for flags, ``hutch-server: <message>`` for configuration). Everything after that (listeners,
signals, a port already in use) belongs to ``hutch.runtime.app.run_node``, which also starts the
management HTTP API (``hutch.mgmt.start_management``) as a service.

With ``--workers N`` (N > 1, or ``auto``, the default, on a machine with more than one usable core) this
process is the node's supervisor (``hutch.runtime.workers.supervisor``), which starts N copies of this
command as its workers; a process started with ``HUTCH_WORKER_SPEC`` in its environment is one of those
workers. ``auto`` is one process for a node set up for a multi-node cluster (``--join``, an inter-node port
given) or holding a one-process node's data (``hutch.runtime.workers.auto``, logged at start);
``--workers 1`` is one process and no supervisor, exactly as before workers existed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from hutch import __version__
from hutch.amqp import speedups
from hutch.config import LOG_LEVELS, Config, ConfigError, load_config
from hutch.core.logsafe import LogThrottle, SafeArgsFilter
from hutch.runtime.workers.auto import workers_for
from hutch.runtime.workers.control import beat_interval_s
from hutch.runtime.workers.link import WorkerLink
from hutch.runtime.workers.spec import SPEC_ENV, WorkerSpec, data_dir_mismatch, worker_config
from hutch.runtime.workers.supervisor import supervise

PROG = "hutch-server"
LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"

_LOGGING_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}
assert set(_LOGGING_LEVELS) == set(LOG_LEVELS)


class _UsageError(Exception):
    """Raised instead of argparse's print-usage-and-exit, so main() can print one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(" ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run a hutch node (an AMQP 0-9-1 broker with RabbitMQ's model).",
        epilog="Flags beat HUTCH_* environment variables, which beat the config file. Port 0 binds any "
        "free port; the ports bound are logged and written to <data-dir>/ports.json. See docs/configuration.md.",
    )
    parser.add_argument("--config", metavar="FILE", help="RabbitMQ-style config file (env HUTCH_CONFIG)")
    parser.add_argument(
        "--data-dir", metavar="DIR", help="data directory (env HUTCH_DATA_DIR; default ./var)"
    )
    parser.add_argument(
        "--amqp-port", metavar="N", type=int, help="AMQP listener port (env HUTCH_AMQP_PORT; default 5672)"
    )
    parser.add_argument(
        "--amqps-port", metavar="N", type=int,
        help="AMQP over TLS listener port (env HUTCH_AMQPS_PORT; default: none; needs ssl_options.* in the "
        "config file, see docs/security.md)",
    )
    parser.add_argument(
        "--stream-port", metavar="N", type=int,
        help="stream protocol listener port (env HUTCH_STREAM_PORT; default: none, RabbitMQ's is 5552; "
        "0: any free port; see docs/streams.md)",
    )
    parser.add_argument(
        "--stream-tls-port", metavar="N", type=int,
        help="stream protocol over TLS port (env HUTCH_STREAM_TLS_PORT; default: none; needs ssl_options.*)",
    )
    parser.add_argument(
        "--management-port",
        metavar="N",
        type=int,
        help="management HTTP port (env HUTCH_MANAGEMENT_PORT; default 15672)",
    )
    parser.add_argument(
        "--node-name", metavar="NAME", help="node name (env HUTCH_NODE_NAME; default hutch@<short hostname>)"
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)} (env HUTCH_LOG_LEVEL; default info)",
    )
    parser.add_argument(
        "--cluster-port", metavar="N", type=int,
        help="inter-node port (env HUTCH_CLUSTER_PORT; default 25672; see docs/clustering.md)",
    )
    parser.add_argument(
        "--no-cluster", action="store_true",
        help="not a cluster, not even of one: no inter-node port, no quorum queues (env HUTCH_CLUSTER_ENABLED=false)",
    )
    parser.add_argument(
        "--join", metavar="NODE@HOST:PORT",
        help="on first start, join the cluster of this seed node (env HUTCH_CLUSTER_JOIN)",
    )
    parser.add_argument(
        "--cluster-secret-file", metavar="FILE",
        help="shared secret of the cluster (env HUTCH_CLUSTER_SECRET_FILE; default <data-dir>/.hutch.secret)",
    )
    parser.add_argument(
        "--allow-insecure-secret-file", action="store_true", default=None,
        help="start even if the cluster secret file is readable by group or others (warned; "
        "config cluster.secret_file_insecure_ok)",
    )
    parser.add_argument(
        "--workers", metavar="N",
        help="worker processes serving the node: auto (the default: the usable cores; 1 with --join, an "
        "inter-node port given or a one-process node's data) or 1..1024 (env HUTCH_WORKERS; 1: one process, "
        "no supervisor; see docs/scaling.md)",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def configure_logging(level_name: str, worker: str = "", throttle_interval_ms: int = 10_000) -> None:
    """Root logging to stderr with the house format, at the configured level; every argument of a
    record is escaped and capped (`SafeArgsFilter`: user names, queue names and client texts). A
    worker's lines carry its name (`[w1]`) after the time. `throttle_interval_ms`: the log throttle's
    window (`log.throttle_interval`, core/logsafe.py)."""
    LogThrottle.set_default_interval(throttle_interval_ms / 1000)
    level = _LOGGING_LEVELS[level_name]
    fmt = LOG_FORMAT.replace("%(asctime)s ", f"%(asctime)s [{worker}] ") if worker else LOG_FORMAT
    logging.basicConfig(format=fmt, stream=sys.stderr)
    root = logging.getLogger()
    root.setLevel(level)
    for handler in root.handlers:  # user strings in log arguments: escaped and capped (core/logsafe.py)
        if not any(isinstance(f, SafeArgsFilter) for f in handler.filters):
            handler.addFilter(SafeArgsFilter())


def _warn_if_data_dir_open(data_dir: str) -> None:
    """An existing data directory that group or others may enter is kept as it is, with a warning
    (hutch creates its own 0700; changing an operator's directory is not its call)."""
    try:
        mode = os.stat(data_dir).st_mode & 0o777
    except OSError:
        return
    if mode & 0o077:
        logging.getLogger("hutch.server").warning(
            "data directory %s is accessible by group or others (mode %04o); it holds message bodies and "
            "password hashes: chmod 700 it", data_dir, mode)


def resolve_config(argv: Sequence[str] | None, environ: dict[str, str] | None = None) -> Config:
    """Parse flags and resolve the Config. Raises _UsageError, ConfigError or SystemExit(0)
    (for --help and --version)."""
    args = build_parser().parse_args(argv)
    flags = {
        "config": args.config,
        "data_dir": args.data_dir,
        "amqp_port": args.amqp_port,
        "amqps_port": args.amqps_port,
        "stream_port": args.stream_port,
        "stream_tls_port": args.stream_tls_port,
        "management_port": args.management_port,
        "node_name": args.node_name,
        "log_level": args.log_level,
        "cluster_port": args.cluster_port,
        "cluster_join": args.join,
        "cluster_secret_file": args.cluster_secret_file,
        "cluster_enabled": "false" if args.no_cluster else None,
        "cluster_secret_file_insecure_ok": "true" if args.allow_insecure_secret_file else None,
        "workers": args.workers,
    }
    return load_config(flags, dict(os.environ) if environ is None else environ)


def main(argv: Sequence[str] | None = None) -> int:
    spec_text = os.environ.get(SPEC_ENV)
    try:
        config = resolve_config(argv)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help / --version already printed their output
        return exc.code if isinstance(exc.code, int) else 0

    if spec_text:
        return _run_worker(config, WorkerSpec.from_env(spec_text))
    count, why = workers_for(config)
    configure_logging(config.console_log_level, throttle_interval_ms=config.log_throttle_interval_ms)
    _warn_if_data_dir_open(config.data_dir)
    if not config.workers:
        logging.getLogger("hutch.server").info("workers auto: %d (%s)", count, why)
    if count > 1:
        logging.getLogger("hutch.server").info("starting node %s with %d workers (config file: %s, data dir: %s)",
                                               config.node_name, count, config.config_file or "none",
                                               config.data_dir)
        return supervise(config, sys.argv[1:] if argv is None else list(argv), count)
    problem = data_dir_mismatch(config.data_dir, 1)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 1
    logging.getLogger("hutch.server").info(
        "starting node %s (config file: %s, data dir: %s)",
        config.node_name,
        config.config_file or "none",
        config.data_dir,
    )
    logging.getLogger("hutch.server").info("%s", speedups.describe())  # compiled or pure-Python hot path
    from hutch.mgmt import start_management
    from hutch.mgmt.definitions import boot_definitions
    from hutch.runtime.app import run_node

    return run_node(config, services=[start_management], prepare=boot_definitions)


def _run_worker(config: Config, spec: WorkerSpec) -> int:
    """One worker of a node (its supervisor started it): worker 0 also runs the management API and the
    definitions import."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the process group: the supervisor decides
    link = WorkerLink(spec, config.node_name, beat_interval_s(config.worker_heartbeat_timeout_ms))
    config = worker_config(config, spec)
    configure_logging(config.console_log_level, f"w{spec.index}", config.log_throttle_interval_ms)
    logging.getLogger("hutch.server").info("worker %d of %d of node %s (data dir: %s)", spec.index, spec.count,
                                           link.node_name, config.data_dir)
    from hutch.mgmt import serve_management_peers, start_management
    from hutch.mgmt.definitions import boot_definitions
    from hutch.runtime.app import run_node

    first = spec.index == 0
    return run_node(config, services=[start_management if first else serve_management_peers],
                    prepare=boot_definitions if first else None, worker=link)


if __name__ == "__main__":
    raise SystemExit(main())
