"""How many workers `--workers auto` means: the cores this process may run on.

Owns: reading the CPU affinity (`os.sched_getaffinity`) and the cgroup v2 CPU quota (`cpu.max`, e.g.
`200000 100000` = 2 cores; `max 100000` = no quota), and the rule that combines them (`cores_from`,
pure): the smaller of the two, the quota rounded up, never less than 1.
"""

from __future__ import annotations

import math
import os

CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def cores_from(affinity: int, cpu_max: str | None) -> int:
    """The usable cores from the affinity's size and the text of `cpu.max` (None: no such file)."""
    cores = max(1, affinity)
    if cpu_max:
        parts = cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return cores
            if quota > 0 and period > 0:
                cores = min(cores, max(1, math.ceil(quota / period)))
    return cores


def usable_cores(cpu_max_path: str = CGROUP_CPU_MAX) -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 1
    try:
        with open(cpu_max_path) as f:
            text: str | None = f.read().strip()
    except OSError:
        text = None
    return cores_from(affinity, text)
