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


__all__ = ["PROCESS_FIGURES", "fd_used", "rss_bytes", "threads"]
