"""What `--workers auto` (the default) resolves to, and why.

Owns: `workers_for` (the workers a node's Config asks for), `resolve_auto` (pure: the workers a node of `auto` gets from its usable cores, its clustering
settings and the shape of the data it already holds) and `data_shape` (that shape, read from the data
directory), and the reason the start log gives for the choice.

Rules (docs/scaling.md, "auto"):
- A data directory keeps its shape: a one-process node's data is served by one process, a node of K
  workers' data by K workers (changing it is an explicit `--workers N`, never a change of machine).
- A node that is, or is set up to be, a member of a multi-node cluster is one process: `--join`
  (`cluster.join`) or an inter-node port given explicitly (`--cluster-port`, `HUTCH_CLUSTER_PORT`,
  `cluster.listener.port`), so a cluster formed with the default keeps the shape it had before nodes of
  workers could be members. A node of workers in a cluster is asked for with `--workers N`
  (docs/scaling.md, "A node of workers in a multi-node cluster").
- A node without a data directory is one process (workers keep their data under it).
- Otherwise the usable cores (runtime/workers/cores.py): CPU affinity capped by the cgroup quota.
"""

from __future__ import annotations

import os
import re

from hutch.config import Config
from hutch.runtime.workers.cores import usable_cores
from hutch.runtime.workers.spec import LONE_NODE_ENTRIES

_WORKER_DIR = re.compile(r"w(\d+)")


def data_shape(data_dir: str) -> int | None:
    """The workers the data in `data_dir` was written by: 1 for a one-process node's data, K for a node of
    workers' (`w0/` .. `w<K-1>/`), None for a fresh (or missing) directory."""
    if not data_dir or not os.path.isdir(data_dir):
        return None
    try:
        entries = os.listdir(data_dir)
    except OSError:
        return None
    if any(e in LONE_NODE_ENTRIES for e in entries):
        return 1
    indexes = [int(m.group(1)) for e in entries
               if (m := _WORKER_DIR.fullmatch(e)) and os.path.isdir(os.path.join(data_dir, e))]
    return max(indexes) + 1 if 0 in indexes else None


def resolve_auto(cores: int, *, join: bool, cluster_port_set: bool, shape: int | None) -> tuple[int, str]:
    """(workers, why) for `--workers auto`; see the module's rules, in their order."""
    assert cores >= 1
    if shape == 1:
        return 1, "the data directory holds a one-process node's data"
    if shape is not None:
        return shape, f"the data directory holds a node of {shape} workers"
    if join:
        return 1, "--join: a member of a multi-node cluster is one process unless --workers says otherwise"
    if cluster_port_set:
        return 1, ("an inter-node port is configured (a member of a multi-node cluster is one process unless "
                   "--workers says otherwise)")
    return cores, f"{cores} usable core{'s' if cores != 1 else ''}"


def workers_for(config: Config) -> tuple[int, str]:
    """(workers, why) the node `config` describes runs with: its `workers` when given, else `auto`'s."""
    if config.workers:
        return config.workers, "--workers (workers) given"
    if not config.data_dir:  # workers keep their data under it: without one, one process (as before)
        return 1, "no data directory"
    return resolve_auto(usable_cores(), join=bool(config.cluster_join), cluster_port_set=config.cluster_port_set,
                        shape=data_shape(config.data_dir))


__all__ = ["data_shape", "resolve_auto", "workers_for"]
