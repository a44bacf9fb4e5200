"""What an fdatasync costs the process on the event loop's thread and through `run_in_executor`.

    python benchmarks/sync_hop.py [none|inline|executor ...]

Each mode appends 2 kB to a file and then, every 4 ms, 2,000 times: nothing (`none`, the idle loop's own
cost), fdatasync on the loop (`inline`), or fdatasync handed to the default executor and awaited
(`executor`). Prints the process CPU (user + system) per job; subtract `none` for the sync's share.
docs/BENCHMARKS.md, "Issue 17: syncs on the loop", quotes it. The file lives in a temporary directory
on the file system of the current directory (the data directory's, when run from there).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import tempfile
import time

import uvloop

JOBS = 2000


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(mode: str, path: str) -> None:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        c0, w0 = cpu_s(), time.perf_counter()
        for _ in range(JOBS):
            os.write(fd, b"x" * 2000)
            if mode == "inline":
                os.fdatasync(fd)
            elif mode == "executor":
                await loop.run_in_executor(None, os.fdatasync, fd)
            await asyncio.sleep(0.004)
        print(f"{mode}: {(cpu_s() - c0) / JOBS * 1e6:.1f} µs CPU per job, {time.perf_counter() - w0:.2f} s")
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    modes = argv or ["none", "inline", "executor"]
    bad = [m for m in modes if m not in ("none", "inline", "executor")]
    if bad:
        print(f"sync_hop.py: unknown mode {bad[0]!r} (none, inline or executor)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(dir=".") as d:
        for mode in modes:
            uvloop.run(run(mode, os.path.join(d, "sync.test")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
