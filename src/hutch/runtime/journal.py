"""The node-wide message journal: persistent messages of durable classic queues.

Owns: one `SegmentedLog` under `<data_dir>/messages/gen-<n>/` (the current generation is named by the
checksummed snapshot file `<data_dir>/messages/CURRENT`), the group-commit driver that keeps at most one
sync job in flight in the default executor, and the live-entry counts that let whole old segments go.

Rules:
- Records are msgpack lists: [ENQ, vhost, queue, seq, exchange, routing_key, properties_raw, body],
  [SETTLE, vhost, queue, [seqs]], [DELETE, vhost, queue]. Only persistent messages routed to durable,
  non-exclusive queues are written; one ENQ per queue the message reaches.
- Appends happen on the loop thread; a sync job is started with `call_soon` after the first append of a
  batch, so everything appended in the same loop iteration (and while a job runs) shares one fdatasync.
- `on_synced(synced_seq)` is called on the loop thread after each completed job; publisher confirms wait
  for the journal seq of their ENQ records.
- Recovery replays the log (ENQ minus SETTLE; DELETE clears the queue), then writes the live messages into
  a fresh generation, switches CURRENT to it and deletes the old one, so the journal does not grow across
  restarts. While running, whole segments below the oldest live ENQ are deleted (a long-lived message pins
  its segment and every later one: copy-forward GC is future work).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import msgpack

from hutch.storage.errors import NoSpaceError, StorageError
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.log import SegmentedLog, SyncJob
from hutch.storage.snapshot import read_snapshot, write_snapshot

log = logging.getLogger("hutch.journal")

ENQ = 1
SETTLE = 2
DELETE = 3

CURRENT_KIND = 2
BUCKET = 4096  # live ENQ counts are kept per range of this many journal seqs

# (vhost, queue) -> {queue seq: (exchange, routing_key, properties_raw, body)}, in seq order
Recovered = dict[tuple[str, str], dict[int, tuple[str, str, bytes, bytes]]]


def replay(entries: Any) -> Recovered:
    """Live messages from an iterable of encoded journal entries, oldest first."""
    live: Recovered = {}
    for raw in entries:
        rec = msgpack.unpackb(raw, raw=False)
        kind = rec[0]
        key = (rec[1], rec[2])
        if kind == ENQ:
            live.setdefault(key, {})[rec[3]] = (rec[4], rec[5], rec[6], rec[7])
        elif kind == SETTLE:
            msgs = live.get(key)
            if msgs:
                for seq in rec[3]:
                    msgs.pop(seq, None)
        elif kind == DELETE:
            live.pop(key, None)
        else:
            raise ValueError(f"unknown message journal record type {kind!r}")
    for key in [k for k, v in live.items() if not v]:
        del live[key]
    return {k: dict(sorted(v.items())) for k, v in live.items()}


class MessageJournal:
    """Not thread-safe except for `SyncJob.run`, which runs in the executor."""

    def __init__(self, data_dir: str, fs: FileSystem | None = None) -> None:
        self.last_enqueued = 0
        self.fs = fs or RealFS()
        self.directory = os.path.join(data_dir, "messages")
        self.fs.make_dirs(self.directory)
        self.current_path = os.path.join(self.directory, "CURRENT")
        payload = read_snapshot(self.fs, self.current_path, kind=CURRENT_KIND)
        self.generation = int(msgpack.unpackb(payload)["generation"]) if payload is not None else 1
        self._remove_other_generations()
        self.log = SegmentedLog.open(self.fs, self._gen_dir(self.generation))
        self.on_synced: Callable[[int], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._job: SyncJob | None = None
        self._scheduled = False
        self.failed: Exception | None = None
        self._live: dict[int, int] = {}  # bucket (jseq // BUCKET) -> live ENQ count
        self._gc_floor = 0  # lowest bucket that may still hold live entries
        self.syncs = 0  # completed sync jobs (for tests and the benchmark)

    def _gen_dir(self, generation: int) -> str:
        return os.path.join(self.directory, f"gen-{generation}")

    def _remove_other_generations(self) -> None:
        keep = f"gen-{self.generation}"
        for name in self.fs.list_dir(self.directory):
            if name.startswith("gen-") and name != keep:
                self._remove_dir(os.path.join(self.directory, name))

    def _remove_dir(self, path: str) -> None:
        for name in self.fs.list_dir(path):
            self.fs.delete(os.path.join(path, name))
        self.fs.fsync_dir(path)
        try:
            os.rmdir(path)
        except OSError:
            pass

    # -- recovery ----------------------------------------------------------------------------------
    def recover(self, keep: Callable[[str, str], bool]) -> Recovered:
        """Replay the journal, then rewrite the live messages of queues `keep` accepts as a new generation.

        Returns those live messages; journal seqs are assigned by `enqueue_recovered` afterwards.
        """
        live = replay(entry for _seq, entry in self.log.read_from(self.log.first_seq, include_unsynced=True))
        live = {k: v for k, v in live.items() if keep(*k)}
        self.log.close()
        self.generation += 1
        new_dir = self._gen_dir(self.generation)
        self._remove_dir_if_exists(new_dir)
        self.fs.make_dirs(new_dir)
        self.log = SegmentedLog.open(self.fs, new_dir)
        return live

    def _remove_dir_if_exists(self, path: str) -> None:
        if self.fs.exists(path):
            self._remove_dir(path)

    def enqueue_recovered(self, vhost: str, queue: str, seq: int, exchange: str, routing_key: str,
                          properties_raw: bytes, body: bytes) -> int:
        return self._append_enq(vhost, queue, seq, exchange, routing_key, properties_raw, body)

    def finish_recovery(self) -> None:
        """Make the new generation durable, switch CURRENT to it, and delete the old one."""
        self.log.sync()
        write_snapshot(self.fs, self.current_path, msgpack.packb({"generation": self.generation}),
                       kind=CURRENT_KIND)
        self._remove_other_generations()

    # -- records -----------------------------------------------------------------------------------
    def _append_enq(self, vhost: str, queue: str, seq: int, exchange: str, routing_key: str,
                    properties_raw: bytes, body: bytes) -> int:
        jseq = self.log.append([msgpack.packb([ENQ, vhost, queue, seq, exchange, routing_key,
                                               properties_raw, body], use_bin_type=True)])
        bucket = jseq // BUCKET
        live = self._live
        live[bucket] = live.get(bucket, 0) + 1
        if not self._scheduled:
            self._schedule()
        return jseq

    def enqueue(self, vhost: str, queue: str, seq: int, msg: Any) -> int:
        """Append an ENQ for `msg` (a Message); returns its journal seq, also kept in `last_enqueued`
        (a plain attribute, so a publishing channel can tell cheaply whether its message was journalled)."""
        jseq = self._append_enq(vhost, queue, seq, msg.exchange, msg.routing_key, msg.properties_raw,
                                msg.body)
        self.last_enqueued = jseq
        return jseq

    def settle(self, vhost: str, queue: str, seqs: list[int], jseqs: list[int], write: bool = True) -> None:
        """Entries `seqs` (journal seqs `jseqs`) are gone: acked, discarded or purged."""
        if write:
            self.log.append([msgpack.packb([SETTLE, vhost, queue, seqs], use_bin_type=True)])
            if not self._scheduled:
                self._schedule()
        self.forget(jseqs)

    def forget(self, jseqs: list[int]) -> None:
        """Drop live counts without writing a record (entries of a deleted queue)."""
        live = self._live
        for jseq in jseqs:
            bucket = jseq // BUCKET
            n = live[bucket] - 1
            if n:
                live[bucket] = n
            else:
                del live[bucket]

    def delete(self, vhost: str, queue: str) -> None:
        self.log.append([msgpack.packb([DELETE, vhost, queue], use_bin_type=True)])
        if not self._scheduled:
            self._schedule()

    @property
    def last_seq(self) -> int:
        return self.log.last_seq

    @property
    def synced_seq(self) -> int:
        return self.log.synced_seq

    # -- group commit --------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, on_synced: Callable[[int], None]) -> None:
        self._loop = loop
        self.on_synced = on_synced
        if self.log.pending_count:
            self._schedule()

    def _schedule(self) -> None:
        if self._loop is None or self._job is not None or self.failed is not None:
            return
        self._scheduled = True
        self._loop.call_soon(self._start_job)

    def _start_job(self) -> None:
        self._scheduled = False
        if self._job is not None or self.failed is not None or self._loop is None:
            return
        job = self.log.begin_sync()
        if job is None:
            return
        self._job = job
        self._scheduled = True  # appends while the job runs join the next batch, started on completion
        self._loop.run_in_executor(None, job.run).add_done_callback(self._job_done)

    def _job_done(self, _fut: asyncio.Future[None]) -> None:
        job, self._job = self._job, None
        self._scheduled = False
        assert job is not None
        try:
            synced = job.complete()
        except NoSpaceError as exc:
            log.error("message journal: %s; retrying in 1 s", exc)
            if self._loop is not None:
                self._scheduled = True
                self._loop.call_later(1.0, self._start_job)
            return
        except StorageError as exc:
            log.error("message journal failed: %s; persistent messages are no longer confirmed", exc)
            self.failed = exc
            if self.on_synced is not None:
                self.on_synced(0)  # channels waiting for confirms nack them
            return
        self.syncs += 1
        if self.on_synced is not None:
            self.on_synced(synced)
        self._collect_garbage()
        if self.log.pending_count:
            self._start_job()

    def _collect_garbage(self) -> None:
        """Delete whole segments that hold no live ENQ (only below the oldest live one)."""
        live = self._live
        floor = min(live) * BUCKET if live else self.log.last_seq + 1
        floor = max(floor, 1)
        if floor // BUCKET <= self._gc_floor or len(self.log.segments()) < 2:
            return
        self._gc_floor = floor // BUCKET
        try:
            self.log.truncate_before(min(floor, self.log.synced_seq + 1))
        except StorageError as exc:
            log.warning("message journal: cannot delete old segments: %s", exc)

    async def close(self) -> None:
        """Finish the in-flight job, sync what is pending, close the log."""
        while self._job is not None:
            await asyncio.sleep(0.005)
        self._loop = None
        if self.failed is None:
            try:
                self.log.sync()
            except StorageError as exc:
                log.error("message journal: final sync failed: %s", exc)
        self.log.close()
