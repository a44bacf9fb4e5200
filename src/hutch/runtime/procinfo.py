"""This process's own figures, as the management API's node shows them (GET /api/nodes, /metrics).

Owns: reading the resident memory (`/proc/self/statm`, else the peak from `getrusage`), the open file
descriptors (`/proc/self/fd`) and the threads of this process, and `PROCESS_FIGURES`, the names a
management agent answers them under (`ManagementAgentPort.process_figures`), which a node of worker
processes sums over its workers.
"""

from __future__ import annotations

import os
import platform
import resource
import threading

PROCESS_FIGURES = ("mem_used", "fd_used", "sockets_used", "proc_used", "io_sync_count", "io_sync_batch_count")
"""Additive figures of one process (bytes, descriptors, AMQP sockets, threads, fsyncs, synced batches):
a node of several processes shows their sums."""


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


def fd_used() -> int:
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 0


def threads() -> int:
    return threading.active_count()


def started_at(pid: int) -> float | None:
    """When process `pid` started, in wall-clock seconds (Linux: /proc/PID/stat's start time in clock
    ticks after boot, plus /proc/stat's boot time); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22; the name in (...) may hold spaces
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def node_process(worker_index: int | None, own_started_at: float) -> tuple[int, float]:
    """The node's process id and start time, as GET /api/nodes shows them (`os_pid`, `uptime`): a
    one-process node's own; in a worker, the supervisor's (the node outlives a restarted worker)."""
    if worker_index is None:
        return os.getpid(), own_started_at
    parent = os.getppid()
    started = started_at(parent)
    return parent, min(started, own_started_at) if started is not None else own_started_at


__all__ = ["PROCESS_FIGURES", "fd_used", "node_process", "rss_bytes", "started_at", "threads"]
