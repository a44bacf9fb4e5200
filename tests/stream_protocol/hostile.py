"""Helpers of the stream-protocol attack tests (test_security_stream.py): a blocking raw client over a real
socket, frames encoded and decoded by hutch.streamproto (its codec is checked against rstream's in
tests/codec/test_streamproto.py), so a test can send what no well-behaved client sends (huge filters,
floods of commands, a handshake never finished); and the node's resident memory and descriptors read
from /proc. The event-loop stall is measured by the AMQP probe of the management suite
(tests/mgmt/helpers.StallProbe) beside it."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path

from hutch.streamproto import commands as sc
from hutch.streamproto.codes import Code, OffsetType
from hutch.streamproto.framer import FrameReader
from hutch.streamproto.wire import OffsetSpec

TIMEOUT_S = 30.0


class RawStream:
    """One logged-in stream-protocol connection (user guest, vhost /), blocking."""

    def __init__(self, port: int, frame_max: int = 1 << 20, login: bool = True, source: str | None = None) -> None:
        """`source`: a local address to connect from (127.0.0.x: another client host on loopback)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S,
                                             source_address=(source, 0) if source else None)
        self.frames = FrameReader(0)
        self.corr = 0
        self.pending: list[sc.Command] = []
        if login:
            self.request(sc.PeerProperties(self.next_corr(), {"product": "hostile"}))
            self.request(sc.SaslHandshake(self.next_corr()))
            self.request(sc.SaslAuthenticate(self.next_corr(), "PLAIN", b"\0guest\0guest"), 2)
            self.send(sc.TuneResponse(frame_max, 0))
            (opened,) = self.request(sc.Open(self.next_corr(), "/"))
            assert isinstance(opened, sc.OpenResponse) and opened.code == Code.OK, opened

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def send(self, *cmds: sc.Command) -> None:
        self.sock.sendall(b"".join(sc.encode(cmd) for cmd in cmds))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, count: int = 1, timeout: float = TIMEOUT_S) -> list[sc.Command]:
        """The next `count` frames (heartbeats skipped)."""
        deadline = time.monotonic() + timeout
        while len(self.pending) < count:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the node closed the connection")
            self.frames.feed(data)
            self.pending.extend(cmd for cmd in map(sc.decode, self.frames.frames())
                                if not isinstance(cmd, sc.Heartbeat))
        got, self.pending = self.pending[:count], self.pending[count:]
        return got

    def request(self, cmd: sc.Command, answers: int = 1) -> list[sc.Command]:
        self.send(cmd)
        return self.receive(answers)

    def ok(self, cmd: sc.Command) -> None:
        (answer,) = self.request(cmd)
        assert getattr(answer, "code", None) == Code.OK, answer

    def create(self, stream: str) -> None:
        self.ok(sc.Create(self.next_corr(), stream, {}))

    def subscribe(self, sub_id: int, stream: str, credit: int, properties: dict[str, str] | None = None,
                  spec: OffsetSpec | None = None) -> None:
        self.ok(sc.Subscribe(self.next_corr(), sub_id, stream, spec or OffsetSpec(OffsetType.FIRST), credit,
                             properties or {}))

    def closed_by_peer(self, timeout: float) -> bool:
        """Whether the node closes the socket within `timeout` (frames read meanwhile are dropped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(1 << 20):
                    return True
            except TimeoutError:
                return False
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


class Drain:
    """Read and count (not decode) what the node writes to `client`, in a thread, until `stop()` (select,
    not a socket timeout: that would also cut the test's own `sendall` on the same socket)."""

    def __init__(self, client: RawStream) -> None:
        self.sock = client.sock
        self.bytes = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not select.select([self.sock], [], [], 0.2)[0]:
                continue
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            self.bytes += len(data)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)


def rss_bytes(pid: int) -> int:
    """The process's resident set size (/proc/PID/statm's second field, in pages)."""
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))
