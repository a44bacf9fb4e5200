"""`DirectoryCatalog`: the node's streams kept by the stream protocol itself, one directory each.

Owns: a `StreamCatalog` (ports.py) over a directory tree, `<root>/<vhost>/<stream>/` (both names
percent-encoded, so no name can leave the root), each an open `StreamHandle`; reopening every stream
found there at start (`open_all`), closing them at stop; the stream-protocol `create` arguments
RabbitMQ's stream plugin accepts (`max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`,
`initial-cluster-size`/`queue-leader-locator` accepted and not used on one node).

This is how the stream listener works on a node where the stream queue type (issue 23's streams core)
is not registered; when it is, the composition root hands the queue type, which implements the same
port, and the streams are queues AMQP 0-9-1 and management see too (docs/streams.md).
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote, unquote

from hutch.queues.stream.offset_spec import interval_ms
from hutch.queues.stream.retention import Retention
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamOptions
from hutch.runtime.stream_session.ports import StreamExists, StreamRefused
from hutch.storage.fs import FileSystem
from hutch.streamproto.codes import Code

IGNORED_ARGUMENTS = ("initial-cluster-size", "queue-leader-locator")


def stream_options(arguments: dict[str, str]) -> StreamOptions:
    """StreamOptions from stream-protocol create arguments; StreamRefused(PRECONDITION_FAILED) if bad."""
    opts = StreamOptions()
    max_bytes = max_age = None
    for key, value in arguments.items():
        try:
            if key == "max-length-bytes":
                max_bytes = int(value)
                if max_bytes <= 0:
                    raise ValueError(value)
            elif key == "max-age":
                max_age = interval_ms(value)
                if max_age is None:
                    raise ValueError(value)
            elif key == "stream-max-segment-size-bytes":
                opts.max_segment_size_bytes = int(value)
                if opts.max_segment_size_bytes <= 0:
                    raise ValueError(value)
            elif key not in IGNORED_ARGUMENTS:
                raise StreamRefused(Code.PRECONDITION_FAILED, f"unknown stream argument {key}")
        except ValueError:
            raise StreamRefused(Code.PRECONDITION_FAILED, f"invalid value {value!r} for {key}") from None
    opts.retention = Retention(max_bytes, max_age)
    return opts


class DirectoryCatalog:
    def __init__(self, fs: FileSystem, root: str, clock: Clock) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.clock = clock
        self.handles: dict[tuple[str, str], StreamHandle] = {}
        self._busy: set[tuple[str, str]] = set()

    def _dir(self, vhost: str, name: str) -> str:
        return f"{self.root}/{quote(vhost, safe='')}/{quote(name, safe='')}"

    async def open_all(self) -> None:
        if not self.fs.exists(self.root):
            return
        for vdir in sorted(self.fs.list_dir(self.root)):
            for sdir in sorted(self.fs.list_dir(f"{self.root}/{vdir}")):
                key = (unquote(vdir), unquote(sdir))
                self.handles[key] = await StreamHandle.open(self.fs, f"{self.root}/{vdir}/{sdir}",
                                                            clock=self.clock)

    def lookup(self, vhost: str, name: str) -> StreamHandle | None:
        return self.handles.get((vhost, name))

    def is_stream(self, vhost: str, name: str) -> bool:
        return (vhost, name) in self.handles

    async def create(self, vhost: str, name: str, arguments: dict[str, str]) -> None:
        key = (vhost, name)
        if key in self.handles or key in self._busy:
            raise StreamExists(f"stream {name} already exists")
        options = stream_options(arguments)
        self._busy.add(key)
        try:
            self.handles[key] = await StreamHandle.open(self.fs, self._dir(vhost, name), options=options,
                                                        clock=self.clock)
        finally:
            self._busy.discard(key)

    async def delete(self, vhost: str, name: str) -> bool:
        handle = self.handles.pop((vhost, name), None)
        if handle is None:
            return False
        await handle.delete()
        return True

    async def close(self) -> None:
        handles = list(self.handles.values())
        self.handles.clear()
        await asyncio.gather(*(h.close() for h in handles))
