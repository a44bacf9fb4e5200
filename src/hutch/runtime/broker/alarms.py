"""Resource alarms (seed 003): the memory high watermark and the free-disk limit.

Owns: measuring the node's resident memory and the free space of its data directory on a timer, and
raising or clearing the node's "memory" and "disk" alarms. What an alarm does to connections (publishers
are blocked, consumers keep going) is the node's and the connection's business.

Rules (RabbitMQ's, seed 003):
- Memory alarm while RSS > vm_memory_high_watermark (relative to total RAM, default 0.4, or `.absolute`
  in bytes). Checked every second (reading /proc/self/statm is cheap).
- RSS does not fall when Python frees memory: glibc keeps freed heap pages (issue 21: a burst of
  unfinished bodies took RSS from 77 to 440 MB, and after every connection closed the alarm stayed set
  for minutes, blocking every publisher). So while RSS is over the paging threshold, at most every
  `TRIM_EVERY_S`, the monitor first hands freed pages back to the system (`malloc_trim(0)`, glibc; a
  no-op elsewhere) and then measures: the alarm is about what hutch holds, and it clears once that is
  back under the mark, as RabbitMQ's does.
- Paging (seed 004) while RSS > watermark x vm_memory_high_watermark_paging_ratio (default 0.5): the
  node tells its queues to keep only a small working set in RAM and page the rest, transient messages
  included, to disk (Node.set_memory_pressure).
- Disk alarm while free space on the data directory's file system < disk_free_limit (`.absolute`,
  default 50 MB, or `.relative` to total RAM).
  Checked every 10 s, and more often as free space approaches the limit: every second below 2x the
  limit, ten times a second below 1.1x.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hutch.config import Config


class AlarmTarget(Protocol):
    """What the monitor asks of the node (`broker/node.py`)."""

    name: str
    config: Config
    alarms: set[str]
    local_alarms: set[str]
    memory_pressure: bool

    def set_alarm(self, name: str) -> None: ...

    def clear_alarm(self, name: str) -> None: ...

    def set_memory_pressure(self, on: bool) -> None: ...

    def reap_blocked_connections(self) -> int: ...

log = logging.getLogger("hutch.alarms")

MEMORY_CHECK_S = 1.0
DISK_CHECK_S = 10.0
TRIM_EVERY_S = 5.0  # malloc_trim walks the whole heap (~10 ms per 400 MB): not every second


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another libc: nothing to trim with)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_malloc_trim = _load_malloc_trim()


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim(0)`); True if it did."""
    return _malloc_trim is not None and bool(_malloc_trim(0))


def memory_limit_bytes(cfg: Config) -> int:
    """The memory high watermark in bytes (`vm_memory_high_watermark.absolute`, or relative to RAM)."""
    return cfg.vm_memory_high_watermark_bytes or int(total_memory_bytes() * cfg.vm_memory_high_watermark)


def total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 8 * 1024**3


def resident_memory_bytes() -> int:
    """The process's resident set size (VmRSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - no procfs
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_check_interval_s(free: int, limit: int) -> float:
    """Check more often as free space approaches the limit, as RabbitMQ does."""
    if free < limit * 1.1:
        return 0.1
    if free < limit * 2:
        return 1.0
    return DISK_CHECK_S


def _existing_dir(path: str) -> str:
    """The data directory, or its nearest existing parent (free space is per file system)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


class ResourceMonitor:
    def __init__(self, node: AlarmTarget) -> None:
        self.node = node
        cfg = node.config
        total = total_memory_bytes()
        self.memory_limit_bytes = memory_limit_bytes(cfg)
        self.disk_limit_bytes = (int(total * cfg.disk_free_limit_relative) if cfg.disk_free_limit_relative
                                 else cfg.disk_free_limit_bytes)
        self.paging_limit_bytes = int(self.memory_limit_bytes * cfg.vm_memory_high_watermark_paging_ratio)
        self.paging = False
        self.data_dir = cfg.data_dir
        self.memory_used_bytes = 0
        self.disk_free_bytes = 0
        self._handles: list[asyncio.TimerHandle] = []
        self._trimmed_at = -TRIM_EVERY_S

    def start(self) -> None:
        self._check_memory()
        self._check_disk()

    def stop(self) -> None:
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()

    def _later(self, delay_s: float, fn: Callable[[], object]) -> None:
        loop = asyncio.get_running_loop()
        self._handles = [h for h in self._handles if not h.cancelled()]
        self._handles.append(loop.call_later(delay_s, fn))

    def _check_memory(self) -> None:
        if self.node.alarms:
            self.node.reap_blocked_connections()  # clients gone while blocked let go of what they held
        self.memory_used_bytes = resident_memory_bytes()
        now = time.monotonic()
        if self.memory_used_bytes > self.paging_limit_bytes and now - self._trimmed_at >= TRIM_EVERY_S:
            self._trimmed_at = now
            if trim_heap():  # freed pages go back: measure what hutch still holds
                self.memory_used_bytes = resident_memory_bytes()
        over = self.memory_used_bytes > self.memory_limit_bytes
        paging = self.memory_used_bytes > self.paging_limit_bytes
        if paging != self.paging:
            self.paging = paging
            log.warning("memory paging %s on node %s: memory used %d bytes, paging threshold %d bytes",
                        "started" if paging else "stopped", self.node.name, self.memory_used_bytes,
                        self.paging_limit_bytes)
        if paging or self.node.memory_pressure:
            self.node.set_memory_pressure(paging)
        self._update("memory", over, f"memory used {self.memory_used_bytes} bytes, watermark "
                                     f"{self.memory_limit_bytes} bytes")
        self._later(MEMORY_CHECK_S, self._check_memory)

    def _check_disk(self) -> None:
        try:
            self.disk_free_bytes = shutil.disk_usage(_existing_dir(self.data_dir)).free
        except OSError as exc:
            log.warning("cannot check free disk space of %s: %s", self.data_dir, exc)
            self._later(DISK_CHECK_S, self._check_disk)
            return
        under = self.disk_free_bytes < self.disk_limit_bytes
        self._update("disk", under, f"free disk space {self.disk_free_bytes} bytes, limit "
                                    f"{self.disk_limit_bytes} bytes")
        self._later(disk_check_interval_s(self.disk_free_bytes, self.disk_limit_bytes), self._check_disk)

    def _update(self, name: str, raised: bool, detail: str) -> None:
        if raised and name not in self.node.local_alarms:
            log.warning("%s resource limit alarm set on node %s: %s", name, self.node.name, detail)
            self.node.set_alarm(name)
        elif not raised and name in self.node.local_alarms:
            log.warning("%s resource limit alarm cleared on node %s: %s", name, self.node.name, detail)
            self.node.clear_alarm(name)
