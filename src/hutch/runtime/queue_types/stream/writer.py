"""A stream's writer thread: the group fdatasync of one stream's log, off the event loop.

Owns: `WriterThread`, one OS thread per stream (started at the stream's first sync, gone after
`IDLE_EXIT_S` without work, started again on demand), which runs the syncs the handle asks for in
order, and tells the loop what each covered (`loop.call_soon_threadsafe`).

Why a thread of its own (docs/streams.md, "Performance over AMQP 0-9-1"): a stream's confirms and its
readers both wait for the commit point, so its sync is on every publish's and every delivery's path. On
the loop it blocks the node's only Python thread for the whole fdatasync; in the default executor each
sync is a job handed to a pool and back. Here the thread waits on its own condition, takes the newest
request as soon as the previous sync ends (requests made meanwhile are merged: one fdatasync covers every
chunk written before it began), and the loop goes on reading and delivering. `os.fdatasync` releases the
GIL, so the disk's wait overlaps the loop's work.

Rules:
- The loop calls `request(target, handles)` (the chunk id the sync will make durable, and the files to
  sync: `StreamLog.sync_handles`) at most once per loop turn; the thread answers
  `done(seq, target, error)` on the loop for each sync it ran, where `seq` is the number of the newest
  request the sync covered. The loop is idle-synced when the last answer's `seq` is the last request's
  (`WriterThread.pending`): only then may it close handles the sync might still use (retired segments).
- A sync's handles are the request's and every merged request's, each once. `sync_together` syncs
  them at the same time (the first on the writer thread, the others, a segment's index, on a small
  shared pool) and returns once every one is durable: two fdatasyncs issued together share the file
  system's journal commit, where one after the other each waits for its own (on this machine's ext4:
  4.4-5.2 ms p50 together against 8.9-9.2 ms one after the other, 3.8-4.3 ms for the segment alone).
  Their order does not matter: recovery keeps only index records whose chunks verify.
- A failed sync is answered with its error; the handle fails the stream (no later sync is trusted).
- `stop()` lets a sync under way finish (its answer is still sent) and ends the thread; the handle stops
  it on close and delete, after waiting for its answers.
- Invariant: at most one sync runs per stream at a time, on the writer thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from hutch.storage.fs import FileHandle

IDLE_EXIT_S = 10.0  # a writer thread with no sync to run for this long ends (an idle stream holds no thread)
SIDE_SYNC_THREADS = 8  # threads, shared by every stream of the process, that sync a segment's index beside it

_side = ThreadPoolExecutor(max_workers=SIDE_SYNC_THREADS, thread_name_prefix="stream-side-sync")

Done = Callable[[int, int, BaseException | None], None]  # (seq, target chunk id, error)
Sync = Callable[[list[FileHandle]], None]


class WriterThread:
    """One stream's writer thread (module docstring). All methods but `_run` are called on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sync: Sync, done: Done, name: str) -> None:
        self._loop = loop
        self._sync = sync
        self._done = done
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        # guarded by _cond: the merged request not yet taken (seq, target, handles), whether the thread runs
        self._request: tuple[int, int, list[FileHandle]] | None = None
        self._running = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.requested = 0  # the seq of the last request (loop side)
        self.answered = 0  # the seq covered by the last answer delivered on the loop (loop side)
        self.started = 0  # threads started (tests, the benchmark)

    @property
    def pending(self) -> bool:
        """A request has not been answered yet (a sync may be running on the handles)."""
        return self.answered < self.requested

    def request(self, target: int, handles: list[FileHandle]) -> None:
        """Ask for a sync of `handles` that makes chunk `target` durable (merged with one not yet taken)."""
        assert handles, "a sync of nothing is answered by the caller, not the thread"
        self.requested += 1
        seq = self.requested
        with self._cond:
            if self._stopping:
                raise RuntimeError("the writer thread was stopped")
            if self._request is not None:
                _, _, earlier = self._request
                handles = earlier + [h for h in handles if all(h is not e for e in earlier)]
            self._request = (seq, target, handles)
            if self._running:
                self._cond.notify()
                return
            self._running = True
        self.started += 1
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def answer(self, seq: int, target: int, error: BaseException | None) -> None:
        """(On the loop) one sync's answer: note what it covered, then tell the handle."""
        self.answered = max(self.answered, seq)
        self._done(seq, target, error)

    def stop(self) -> None:
        """End the thread after the sync under way (a request not yet taken is dropped: the caller syncs
        itself after waiting for `pending` to clear, so there is none)."""
        with self._cond:
            self._stopping = True
            self._request = None
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._request is None and not self._stopping:
                    self._cond.wait(IDLE_EXIT_S)
                if self._request is None or self._stopping:
                    self._running = False
                    return
                seq, target, handles = self._request
                self._request = None
            error: BaseException | None = None
            try:
                self._sync(handles)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the loop, which fails the stream
                error = exc
            try:
                self._loop.call_soon_threadsafe(self.answer, seq, target, error)
            except RuntimeError:  # the loop is closed: nobody waits for the answer
                with self._cond:
                    self._running = False
                return


def sync_together(handles: list[FileHandle]) -> None:
    """fdatasync every handle, at the same time (module docstring); raises the first failure once all
    have ended (a handle is never closed under a sync still running)."""
    side: list[Future[None]] = [_side.submit(h.sync) for h in handles[1:]]
    error: BaseException | None = None
    try:
        if handles:
            handles[0].sync()
    except BaseException as exc:  # noqa: BLE001 - raised below, after the side syncs ended
        error = exc
    for fut in side:
        failed = fut.exception()
        if failed is not None and error is None:
            error = failed
    if error is not None:
        raise error
