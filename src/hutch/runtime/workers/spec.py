"""What a worker process is told when the supervisor starts it, and the configuration it derives.

Owns: `WorkerSpec` (the worker's index, the node's worker count, the descriptors it inherits: its
control socket and one worker-link socket per other worker, and the ports the supervisor reserved), its
form in the environment (`HUTCH_WORKER_SPEC`, JSON: set by the supervisor for its children only), the
worker names (`<node>#w<N>`), `public_name` (the one name a node of workers shows outside) and
`worker_config`, a worker's own Config derived from the node's.

Rules:
- A worker's data lives in `<data dir>/w<N>`; worker 0 founds the node's internal cluster (or, with
  `--join`, joins the multi-node cluster of the seed), the others join it through worker 0 on their first
  start (their definitions come from its metadata group).
- Only worker 0 runs the management API and `load_definitions`; every worker listens on the node's AMQP
  (and AMQP over TLS) port and on its stream protocol ports (plain and TLS), shared with `SO_REUSEPORT`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from hutch.config import Config

SPEC_ENV = "HUTCH_WORKER_SPEC"
SEED_ADDRESS = "worker-link:1"  # a seed's address is never dialled on the worker link (paired transport)


def worker_name(node_name: str, index: int) -> str:
    return f"{node_name}#w{index}"


def node_of_worker(name: str) -> str:
    """The node's name of a worker's (`<node>#w<N>` -> `<node>`): the one name its management agent
    answers as."""
    node, sep, index = name.rpartition("#w")
    return node if sep and index.isdigit() else name


def public_name(config: Config) -> str:
    """The node's name as everyone outside sees it: clients, the management API and UI, /metrics,
    hutchctl. A one-process node's `node_name`; in a worker (`worker_index` set) the node's, without
    `#w<N>`: a node of workers is one node outside (its workers' own names are the internal cluster's
    members, never shown)."""
    return node_of_worker(config.node_name) if config.worker_index is not None else config.node_name


def worker_dir(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, f"w{index}")


LONE_NODE_ENTRIES = ("cluster", "definitions", "msg_stores", "queues")  # what a one-process node keeps


def data_dir_mismatch(data_dir: str, workers: int) -> str | None:
    """Why `data_dir` cannot serve a node of `workers` processes, or None. A one-process node's data is
    not moved into workers' sub-directories (nor back), so starting it with another shape would show an
    empty node over data that is still there: refused in one line instead."""
    if not data_dir or not os.path.isdir(data_dir):
        return None
    if workers > 1:
        found = [e for e in LONE_NODE_ENTRIES if os.path.exists(os.path.join(data_dir, e))]
        if found:
            return (f"data directory {data_dir} holds a one-process node's data ({', '.join(found)}); "
                    "start it without --workers (moving a node's data to workers is not supported yet)")
    elif os.path.isdir(worker_dir(data_dir, 0)):
        return (f"data directory {data_dir} belongs to a node of worker processes (w0/, ...); start it with "
                "--workers")
    return None


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    count: int
    control_fd: int
    peer_fds: dict[int, int]  # other worker's index -> this worker's end of their socket pair
    amqp_port: int
    amqps_port: int | None
    own_port: bool
    stream_port: int | None = None  # the node's stream protocol ports, reserved by the supervisor
    stream_tls_port: int | None = None

    def to_env(self) -> str:
        return json.dumps({"index": self.index, "count": self.count, "control_fd": self.control_fd,
                           "peer_fds": {str(k): v for k, v in self.peer_fds.items()},
                           "amqp_port": self.amqp_port, "amqps_port": self.amqps_port, "own_port": self.own_port,
                           "stream_port": self.stream_port, "stream_tls_port": self.stream_tls_port})

    @classmethod
    def from_env(cls, text: str) -> WorkerSpec:
        doc = json.loads(text)
        return cls(int(doc["index"]), int(doc["count"]), int(doc["control_fd"]),
                   {int(k): int(v) for k, v in doc["peer_fds"].items()}, int(doc["amqp_port"]),
                   _port(doc["amqps_port"]), bool(doc["own_port"]), _port(doc.get("stream_port")),
                   _port(doc.get("stream_tls_port")))


def _port(value: Any) -> int | None:
    return None if value is None else int(value)


def worker_config(config: Config, spec: WorkerSpec) -> Config:
    """The Config of worker `spec.index` of the node `config` describes. A node set up for a multi-node
    cluster (`--join`, or an inter-node port given) has every worker listen for other nodes too
    (`cluster_port_set` in the worker's Config): worker 0 on the node's inter-node port (a seed others
    name), the others on a port of their own; worker 0 joins through the node's seed, the others through
    worker 0 (docs/scaling.md, "A node of workers in a multi-node cluster")."""
    first = spec.index == 0
    multi = bool(config.cluster_join) or config.cluster_port_set
    return dataclasses.replace(
        config,
        data_dir=worker_dir(config.data_dir, spec.index),
        node_name=worker_name(config.node_name, spec.index),
        cluster_name=config.cluster_name,
        amqp_port=spec.amqp_port,
        amqps_port=spec.amqps_port,
        stream_port=spec.stream_port,
        stream_tls_port=spec.stream_tls_port,
        load_definitions=config.load_definitions if first else None,
        cluster_enabled=True,  # the workers are the node's internal cluster, whatever the node is
        cluster_port=config.cluster_port if multi and first else 0,
        cluster_port_set=multi,
        cluster_join=config.cluster_join if first else f"{worker_name(config.node_name, 0)}@{SEED_ADDRESS}",
        workers=spec.count,
        worker_index=spec.index,
    )
