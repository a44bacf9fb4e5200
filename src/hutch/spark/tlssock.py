"""TLS for the Spark connector's blocking AMQP client (`amqps://` URIs), safe with one reader thread and
several writer threads on one connection.

Owns: `TlsSocket`, a socket-like object (the calls `client.py` makes: `recv`, `sendall`, `settimeout`,
`setsockopt`, `fileno`, `shutdown`, `close`) that runs TLS in memory (`ssl.MemoryBIO` + `SSLObject`)
over a plain socket.

Why not `ssl.SSLSocket`: the client reads in one thread while others write, and OpenSSL does not allow
one SSL object to be used by two threads at once; `SSLSocket` releases the GIL inside `SSL_read` and
`SSL_write`. Here every OpenSSL call is made under `_tls_lock` and never blocks (it works on memory
buffers); the socket IO happens outside that lock. Also, `select()` on an `SSLSocket` can miss data
OpenSSL already decrypted; `recv` here always returns every decrypted byte, so nothing is left behind a
`select`.

Rules: lock order is `_send_lock` then `_tls_lock`. Records leave in the order OpenSSL produced them:
whoever holds `_send_lock` writes everything the outgoing buffer holds; the reader only flushes (TLS
records of its own, e.g. a key update) when it can take `_send_lock` without waiting, otherwise the
next `sendall` carries them.
"""

from __future__ import annotations

import socket
import ssl
import threading

READ_BYTES = 256 * 1024


class TlsSocket:
    """A TLS client connection over `raw`, established by `connect` (handshake included)."""

    def __init__(self, raw: socket.socket, ctx: ssl.SSLContext, server_name: str) -> None:
        self._raw = raw
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_name)
        self._tls_lock = threading.Lock()
        self._send_lock = threading.Lock()

    @classmethod
    def connect(cls, raw: socket.socket, ctx: ssl.SSLContext, server_name: str) -> TlsSocket:
        """Do the TLS handshake (the caller's thread, before any other uses the socket). Raises
        ssl.SSLError (e.g. the broker's certificate does not verify) or OSError."""
        sock = cls(raw, ctx, server_name)
        while True:
            try:
                sock._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock._flush()
                data = raw.recv(READ_BYTES)
                if not data:
                    raise ConnectionResetError("the broker closed the connection during the TLS handshake") from None
                sock._in.write(data)
        sock._flush()
        return sock

    def _flush(self) -> None:
        """Write what OpenSSL produced. Caller holds `_send_lock` (or is the only thread)."""
        with self._tls_lock:
            data = self._out.read()
        if data:
            self._raw.sendall(data)

    def _decrypted(self) -> bytes | None:
        """Every byte OpenSSL can decrypt now (b"" if none yet); None at the end of the TLS stream."""
        chunks = []
        with self._tls_lock:
            while True:
                try:
                    chunks.append(self._tls.read(READ_BYTES))
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    return b"".join(chunks) or None
        return b"".join(chunks)

    def recv(self, bufsize: int) -> bytes:
        """The next decrypted bytes (possibly more than `bufsize`: all that is decrypted, so nothing waits
        behind a select()); b"" at the end of the connection."""
        while True:
            data = self._decrypted()
            if data is None:
                return b""
            if data:
                if self._out.pending and self._send_lock.acquire(blocking=False):
                    try:
                        self._flush()
                    finally:
                        self._send_lock.release()
                return data
            raw = self._raw.recv(max(bufsize, READ_BYTES))
            if not raw:
                return b""
            with self._tls_lock:
                self._in.write(raw)

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            view = memoryview(data)
            while view:  # a memory BIO takes everything at once; the loop only guards a partial write
                with self._tls_lock:
                    written = self._tls.write(view)
                view = view[written:]
            self._flush()

    # -- the plain socket's calls ------------------------------------------------------------------
    def settimeout(self, timeout: float | None) -> None:
        self._raw.settimeout(timeout)

    def setsockopt(self, *args: int) -> None:
        self._raw.setsockopt(*args)

    def fileno(self) -> int:
        return self._raw.fileno()

    def shutdown(self, how: int) -> None:
        self._raw.shutdown(how)

    def close(self) -> None:
        self._raw.close()


__all__ = ["TlsSocket"]
