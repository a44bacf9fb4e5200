"""Message persistence on one node: the group-commit driver, the message stores and the queue indexes.

Owns: `GroupCommit`, the SyncSink every queue index and message store writes through (one flush of every
touched file per batch on the loop thread, then one job that fdatasyncs them all), and
`Persistence`, which places the files under the data directory (`<data_dir>/queues/<id>/` per queue,
`<data_dir>/msg_stores/<id>/` per vhost), creates indexes and stores with the configured knobs, and
recovers them at start.

Rules:
- A batch starts with `call_soon` after the first touch, so everything written in the same loop
  iteration (and while a sync job runs) shares one fdatasync per file. At most one job is in flight.
- Publisher confirms: a queue that wrote a message for good hands its receipt to `confirm_after_sync`;
  the receipts held when a job starts are settled when it completes (after the fdatasync of every file
  touched before them), in the order they came. Store files are synced before index files, so an index
  entry that survives a crash points to a stored message whenever its confirm was sent.
- `last_enqueued` counts durable touches and `synced_seq` the count covered by the last completed job:
  statistics (tests, the benchmark); nothing decides a confirm from them.
- Where a job syncs: `placement` decides (runtime/sync_placement.py: on the loop thread while it has time
  and the disk is fast, else in the default executor); a job on the loop runs last in its loop turn.
- File handles are closed only between jobs (never under an fdatasync in flight); deletions happen at once
  (an unlinked file being synced is harmless). A synced file not written for a whole job gives its
  descriptor back (bounded: files written in the last two jobs keep theirs).
- Flow control, the last link of the chain (seed 003): when one batch has to write more than
  `FLOW_BATCH_BYTES` (the disk is slower than what arrives while it syncs), `congested` is set; durable
  queues then ask their publishers' connections to stop reading (ClassicQueue.needs_flow_control), and a
  batch back under the bound clears it and lets them read again (`on_drained`).
- A failed write with no space left is retried every second (nothing is confirmed meanwhile); any other
  storage failure stops confirming: every receipt held then or later is rejected with the error (a
  confirming publisher gets basic.nack, a transaction's commit closes the connection with 541).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

from hutch.runtime.sync_placement import SyncPlacement
from hutch.storage.appendfile import AppendFile, SyncReceipt
from hutch.storage.errors import NoSpaceError, StorageError
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.msg_store import DEFAULT_FILE_SIZE_LIMIT, MessageStore
from hutch.storage.queue_index import (
    DEFAULT_EMBED_BELOW,
    DEFAULT_SEGMENT_ENTRIES,
    QueueIndex,
    remove_queue_directory,
)

log = logging.getLogger("hutch.persistence")

FLOW_BATCH_BYTES = 16 * 1024 * 1024  # a batch bigger than this means the disk is not keeping up


class GroupCommit:
    """The node's SyncSink. Loop thread only, except `_run`, which runs in the default executor."""

    def __init__(self) -> None:
        self.last_enqueued = 0
        self.synced_seq = 0
        self.failed: Exception | None = None
        self.syncs = 0  # completed jobs that synced at least one file (tests and the benchmark)
        self.fsyncs = 0  # fdatasync calls made
        self.on_synced: Callable[[int], None] | None = None  # after each job: synced_seq (0: failed)
        self.on_drained: Callable[[], None] | None = None  # congestion is over: release paused publishers
        self.congested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._touched: dict[AppendFile, None] = {}
        self._callbacks: list[Callable[[], None]] = []
        self._held: list[tuple[SyncReceipt, Any]] = []  # receipts waiting for the next job
        self._job: asyncio.Future[None] | None = None  # the fsync job in flight
        self._to_close: list[AppendFile] = []
        self._all: weakref.WeakSet[AppendFile] = weakref.WeakSet()
        self._scheduled = False
        self._busy = False
        self._idle: dict[AppendFile, int] = {}  # synced files not written since: job number then
        self.placement = SyncPlacement()  # the runtime sets its has_time (the node's loop load)
        self._deferred = False  # an inline job was put back once to the end of the loop's turn

    # -- SyncSink ----------------------------------------------------------------------------------
    def touch(self, file: AppendFile, durable: bool) -> None:
        self._touched[file] = None
        if durable:
            self.last_enqueued += 1
        if not self._scheduled:
            self._schedule()

    def retire(self, file: AppendFile, delete: bool) -> None:
        self._touched.pop(file, None)
        if delete:
            try:
                if file.fs.exists(file.path):
                    file.fs.delete(file.path)
            except StorageError as exc:
                log.warning("cannot delete %s: %s", file.path, exc)
        file.closed = True
        if self._busy:
            self._to_close.append(file)
        else:
            _close_quietly(file)

    def after_sync(self, fn: Callable[[], None]) -> None:
        self._callbacks.append(fn)
        if not self._scheduled:
            self._schedule()

    def confirm_after_sync(self, receipt: SyncReceipt, queue: Any) -> None:
        if self.failed is not None:  # never durable now; rejected from the loop, not inside the caller
            if self._loop is not None:
                self._loop.call_soon(receipt.reject, queue, self._failure_text())
            return
        self._held.append((receipt, queue))
        if not self._scheduled:
            self._schedule()

    # -- the driver ----------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, on_synced: Callable[[int], None] | None = None) -> None:
        self._loop = loop
        self.on_synced = on_synced
        if self._touched or self._callbacks or self._held:
            self._schedule()

    def _schedule(self) -> None:
        if self._loop is None or self._busy or self.failed is not None:
            return
        self._scheduled = True
        self._loop.call_soon(self._start_job)

    def _flush_touched(self) -> list[AppendFile]:
        files = list(self._touched)
        self._touched.clear()
        written: list[AppendFile] = []
        batch_bytes = 0
        for i, f in enumerate(files):
            if f.closed:
                continue
            batch_bytes += f.pending_bytes
            try:
                f.flush()
            except StorageError:
                for g in files[i:]:  # keep what was not written for the next try
                    self._touched[g] = None
                raise
            self._all.add(f)
            if f.needs_sync:
                written.append(f)
        written.sort(key=_sync_order)
        congested = batch_bytes > FLOW_BATCH_BYTES
        if congested != self.congested:
            self.congested = congested
            if congested:
                log.info("message storage is behind (%d bytes in one batch): publishers are paused", batch_bytes)
            elif self.on_drained is not None:
                self.on_drained()
        return written

    def _start_job(self) -> None:
        if self._busy or self.failed is not None or self._loop is None:
            self._scheduled = False
            return
        inline = self.placement.inline()
        if inline and not self._deferred:
            # a sync on the loop goes last in its turn: the writes the same input scheduled (deliveries
            # to consumers) go out before the loop blocks in fdatasync
            self._deferred = True
            self._loop.call_soon(self._start_job)
            return
        self._deferred = False
        self._scheduled = False
        try:
            files = self._flush_touched()
        except NoSpaceError as exc:
            log.error("message storage: %s; retrying in 1 s", exc)
            self._scheduled = True
            self._loop.call_later(1.0, self._start_job)
            return
        except StorageError as exc:
            self._fail(exc)
            return
        target = self.last_enqueued
        callbacks, self._callbacks = self._callbacks, []
        held, self._held = self._held, []
        if not files:
            self._finish(target, callbacks, held)
            return
        for f in files:
            f.needs_sync = False  # a flush while the job runs sets it again (and touches the file)
        self._busy = True
        if inline:
            # the loop has time, and the disk syncs fast: sync here, without two thread wake-ups
            error: BaseException | None = None
            try:
                self.placement.run_inline(_sync_files, files)
            except Exception as exc:  # noqa: BLE001 - a storage failure stops confirming (_fail)
                error = exc
            self._job_done(error, target, callbacks, files, held)
            return
        self._scheduled = True  # touches while the job runs join the next batch, started on completion
        self._job = fut = self._loop.run_in_executor(None, self.placement.measure, _sync_files, files)
        fut.add_done_callback(lambda fut: self._job_done(fut.exception(), target, callbacks, files, held))

    def _job_done(self, error: BaseException | None, target: int, callbacks: list[Callable[[], None]],
                  files: list[AppendFile], held: list[tuple[SyncReceipt, Any]]) -> None:
        self._busy = False
        self._job = None
        self._scheduled = False
        nfiles = len(files)
        for f in self._to_close:
            _close_quietly(f)
        self._to_close.clear()
        self._release_idle(files)
        if error is not None:
            self._fail(error, held)
            return
        self.syncs += 1
        self.fsyncs += nfiles
        self._finish(target, callbacks, held)
        if self._touched or self._callbacks or self._held:
            self._schedule()

    def _release_idle(self, files: list[AppendFile]) -> None:
        """Give back the descriptors of files idle for a whole job: a queue with a deep backlog has
        hundreds of segment files, and only the ones being written or acked need one open. A file idle
        only since this job keeps its descriptor one job longer (a publisher that writes in bursts would
        otherwise reopen its segment for every burst)."""
        touched = self._touched
        idle = self._idle
        job = self.syncs
        for f in files:
            idle[f] = job
        for f, since in list(idle.items()):
            if f in touched or f.dirty or f.needs_sync or f.closed:
                del idle[f]  # written again (it is in a later job) or gone
            elif since < job:
                del idle[f]
                try:
                    f.release_handle()
                except StorageError as exc:
                    log.warning("cannot close %s: %s", f.path, exc)

    def _finish(self, target: int, callbacks: list[Callable[[], None]],
                held: list[tuple[SyncReceipt, Any]]) -> None:
        if target > self.synced_seq:
            self.synced_seq = target
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a cleanup callback must not stop confirms
                log.exception("message storage: post-sync step failed")
        for receipt, queue in held:
            receipt.settle(queue)
        if self.on_synced is not None:
            self.on_synced(self.synced_seq)

    def _failure_text(self) -> str:
        return f"message storage failed: {self.failed}"

    def _fail(self, exc: BaseException, held: list[tuple[SyncReceipt, Any]] | None = None) -> None:
        log.error("message storage failed: %s; persistent messages are no longer confirmed", exc)
        self.failed = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
        waiting = (held or []) + self._held
        self._held = []
        text = self._failure_text()
        for receipt, queue in waiting:
            receipt.reject(queue, text)  # a confirming publisher gets basic.nack
        if self.on_synced is not None:
            self.on_synced(0)

    def sync_now(self) -> None:
        """Flush and sync everything synchronously (start-up and shutdown)."""
        for f in self._flush_touched():
            f.sync()
            f.needs_sync = False
            self.fsyncs += 1
        self.synced_seq = self.last_enqueued
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()
        held, self._held = self._held, []
        for receipt, queue in held:
            receipt.settle(queue)

    async def close(self) -> None:
        """Finish the job in flight, sync what is pending, close every file."""
        while self._busy and self._job is not None:  # the job's future says when it is done (its
            await asyncio.wait([self._job])            # completion may start the next batch's job)
        self._loop = None
        if self.failed is None:
            try:
                self.sync_now()
            except StorageError as exc:
                log.error("message storage: final sync failed: %s", exc)
        for f in list(self._all):
            _close_quietly(f)


def _sync_order(f: AppendFile) -> int:
    return f.rtype  # message store files (0x21) before queue index files (0x31)


def _sync_files(files: list[AppendFile]) -> None:
    """fdatasync every file not retired meanwhile."""
    for f in files:
        if f.closed:
            continue  # retired meanwhile (its queue was deleted): nothing to make durable
        try:
            f.sync()
        except StorageError:
            if not f.closed:
                raise


def _close_quietly(f: AppendFile) -> None:
    try:
        f.close()
    except StorageError as exc:
        log.warning("cannot close %s: %s", f.path, exc)


def resource_dir(*parts: str) -> str:
    """A stable, file-system-safe directory name for a vhost or a (vhost, queue) pair."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


class Persistence:
    """Where queue indexes and message stores live, with the knobs from the config."""

    def __init__(self, data_dir: str, fs: FileSystem | None = None, *,
                 embed_below: int = DEFAULT_EMBED_BELOW, segment_entries: int = DEFAULT_SEGMENT_ENTRIES,
                 store_file_size_limit: int = DEFAULT_FILE_SIZE_LIMIT) -> None:
        self.fs = fs or RealFS()
        self.data_dir = data_dir
        self.sink = GroupCommit()
        self.embed_below = embed_below
        self.segment_entries = segment_entries
        self.store_file_size_limit = store_file_size_limit
        self.queues_dir = os.path.join(data_dir, "queues")
        self.stores_dir = os.path.join(data_dir, "msg_stores")
        self.fs.make_dirs(self.queues_dir)
        self.fs.make_dirs(self.stores_dir)
        self.stores: dict[str, MessageStore] = {}
        self._recovered_refs: dict[str, dict[int, int]] = {}

    # statistics (tests): durable touches made, and covered by the last completed job
    @property
    def last_enqueued(self) -> int:
        return self.sink.last_enqueued

    @property
    def synced_seq(self) -> int:
        return self.sink.synced_seq

    @property
    def failed(self) -> Exception | None:
        return self.sink.failed

    def store(self, vhost: str) -> MessageStore:
        store = self.stores.get(vhost)
        if store is None:
            directory = os.path.join(self.stores_dir, resource_dir(vhost))
            self.fs.make_dirs(directory)
            store = MessageStore(self.fs, directory, self.sink, file_size_limit=self.store_file_size_limit)
            store.recover()
            self.stores[vhost] = store
        return store

    def queue_dir(self, vhost: str, queue: str, unique: str = "") -> str:
        name = resource_dir(vhost, queue, unique) if unique else resource_dir(vhost, queue)
        return os.path.join(self.queues_dir, name)

    def index(self, vhost: str, queue: str, unique: str = "") -> QueueIndex:
        """The index of a queue (call `recover` on it before writing when the queue is durable).
        `unique` tells apart the directories of non-durable queues, which never outlive the process."""
        return QueueIndex(self.fs, self.queue_dir(vhost, queue, unique), self.sink, store=self.store(vhost),
                          segment_entries=self.segment_entries, embed_below=self.embed_below)

    def remove_orphans(self, keep: set[str]) -> int:
        """Delete queue directories not in `keep` (queues deleted or transient before the restart)."""
        removed = 0
        for name in self.fs.list_dir(self.queues_dir):
            if name in keep:
                continue
            path = os.path.join(self.queues_dir, name)
            try:
                remove_queue_directory(self.fs, path)
            except StorageError as exc:
                log.warning("cannot remove stale queue directory %s: %s", path, exc)
            removed += 1
        return removed

    def set_store_refs(self, refs_by_vhost: dict[str, dict[int, int]]) -> None:
        """After every durable queue's index was recovered: the store reference counts they hold."""
        for vhost, store in self.stores.items():
            store.set_refs(refs_by_vhost.get(vhost, {}))

    def start(self, loop: asyncio.AbstractEventLoop, on_synced: Callable[[int], None] | None = None) -> None:
        self.sink.start(loop, on_synced)

    async def close(self) -> None:
        await self.sink.close()
        for store in self.stores.values():
            store.close()
