"""Connection locality for TLS connections: the plaintext relay between a client's TLS session, which stays
in the worker that accepted it, and the worker the connection moved to (docs/scaling.md, "Connection
locality", TLS connections).

Owns: `TlsRelay`, a byte pump in the accepting worker. Python's `ssl` cannot export a TLS session, so a
TLS connection's socket cannot be handed over as a plain one's is. Instead the accepting worker keeps the
TLS transport (its socket and `SSLObject`) and hands over one end of a fresh `AF_UNIX` socket pair as
the connection's socket (runtime/workers/handover.py, `Locality.relay`); the relay holds the other end
and pumps: decrypted bytes from the client are written to the pair, bytes from the pair are written to
the TLS transport (encrypted there). The home worker serves the connection as any adopted one: every
publish and delivery is local there, only the bytes cross the pair.

Rules:
- Backpressure both ways, no unbounded buffer: each side's write buffer is bounded (`WRITE_HIGH` /
  `WRITE_LOW`); when one side's buffer passes its high mark the other side stops reading until it
  drains. A slow TLS client thus fills the pair's kernel buffer and then the home's transport, whose
  paused-consumer path sees it as it would see the client's own socket.
- Ends propagate both ways: the client gone (EOF, close_notify, reset) closes the pair (the home sees
  the end of file and cleans up the connection); the home closing (its connection.close, a queue
  deleted under an exclusive consumer, its worker gone) closes the TLS transport (close_notify after
  what was written). A relay is ended once (`_ended`), and told to its owner (`on_end`).
- The client gone while the home does not read (an alarm blocks the publisher there): the pair is not
  held open by bytes the home will not take. If it took none of them for `DRAIN_CHECK_S` they are dropped
  and the pair closed; the home, which does not read, sees its end by poll (`peer_hung_up`, through
  the alarm's reaper of blocked connections whose clients have gone). While the client's reading is
  paused, its socket is looked at every `DRAIN_CHECK_S` for an end of file or reset not read yet.
- Before the home side is open (the pair is registered on the loop asynchronously), the client side's
  reading is paused; bytes the TLS layer had already decrypted are kept (at most what one read gives)
  and written first.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger("hutch.workers")

WRITE_HIGH = 1 << 20  # each side's write buffer: stop reading the other side above this
WRITE_LOW = 256 << 10  # ... and read again below this
MAX_EARLY_BYTES = 1 << 20  # decrypted bytes that arrive before the home side is open (one read, bounded)
DRAIN_CHECK_S = 1.0  # the client gone, bytes left for the home: closed at once if it took none for this long


def peer_hung_up(fd: int) -> bool:
    """Has the peer of this stream socket closed or shut down its writing, or reset it (a FIN or an RST
    that a paused reader has not read)? Linux only (poll's POLLRDHUP); elsewhere False."""
    rdhup = getattr(select, "POLLRDHUP", 0)
    if not rdhup:
        return False
    poller = select.poll()
    poller.register(fd, rdhup)
    return any(events & (rdhup | select.POLLHUP | select.POLLERR) for _fd, events in poller.poll(0))


class TlsRelay:
    """One relayed TLS connection: `client` is the TLS transport (plaintext in and out), `pair` this
    worker's end of the socket pair whose other end the home worker adopted."""

    def __init__(self, client: Any, pair: socket.socket, on_end: Callable[[TlsRelay], None]) -> None:
        # Any: the loop's TLS transport (asyncio's or uvloop's, not an asyncio.Transport subclass)
        self.client = cast(asyncio.Transport, client)
        self.home: asyncio.Transport | None = None
        self._pair = pair
        self._on_end = on_end
        self._early: list[bytes] = []
        self._early_bytes = 0
        self._client_eof = False
        self._home_closed = False  # the pair's transport closed (its connection_lost or end of file)
        self._watching_client = False  # a check of the paused client's socket is due (_watch_paused_client)
        self._ended = False
        self._opening: asyncio.Future[None] | None = None
        self.bytes_in = 0  # from the client to the home
        self.bytes_out = 0  # from the home to the client

    def start(self) -> asyncio.Future[None]:
        """Take over the client's TLS transport now, and open the pair on the loop (the returned task)."""
        self.client.pause_reading()
        self.client.set_protocol(_ClientSide(self))
        self.client.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        self._opening = asyncio.ensure_future(self._open_home())  # (held: a task nobody holds may vanish)
        return self._opening

    async def _open_home(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_unix_connection(lambda: _HomeSide(self), sock=self._pair)
        except OSError as exc:
            log.warning("a TLS connection's relay could not open its socket pair: %s", exc)
            self._pair.close()
            self.end()
            return
        home = transport
        if self._ended:  # the client went away meanwhile
            home.close()
            return
        home.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        self.home = home
        early, self._early = self._early, []
        if early:
            home.writelines(early)
        if self._client_eof:
            home.write_eof()
        elif not self.client.is_closing():
            self.client.resume_reading()

    # -- the client's side (decrypted bytes in) --------------------------------------------------------
    def from_client(self, data: bytes) -> None:
        self.bytes_in += len(data)
        home = self.home
        if home is not None:
            home.write(data)
            return
        self._early_bytes += len(data)
        if self._early_bytes > MAX_EARLY_BYTES:  # cannot happen with reading paused; never unbounded
            log.warning("a relayed TLS connection sent %d bytes before its relay was open: closed",
                        self._early_bytes)
            self.abort()
            return
        self._early.append(data)

    def client_eof(self) -> None:
        self._client_eof = True
        if self.home is not None and self.home.can_write_eof() and not self.home.is_closing():
            self.home.write_eof()

    def client_lost(self) -> None:
        home = self.home
        if home is not None and not home.is_closing():
            home.close()  # what the client sent last is written first; the home sees the end of file
            left = home.get_write_buffer_size()
            if left:  # unless the home does not read it (blocked by an alarm): then it must not wait on us
                asyncio.get_running_loop().call_later(DRAIN_CHECK_S, self._drain_or_abort, home, left)
        self.end()

    def _drain_or_abort(self, home: asyncio.Transport, left_before: int) -> None:
        """The client is gone and the home was left bytes to read: while it takes some, let it; once it
        took none for DRAIN_CHECK_S, drop them and close the pair now (what the client sent last is lost,
        as it would be in a blocked node's socket buffer; its end reaches the home at once)."""
        if self._home_closed:
            return
        left = home.get_write_buffer_size()
        if left and left >= left_before:
            log.info("a relayed TLS connection's client is gone and its home reads nothing (%d bytes left): "
                     "closed", left)
            home.abort()
        else:
            asyncio.get_running_loop().call_later(DRAIN_CHECK_S, self._drain_or_abort, home, left)

    # -- the home's side (plaintext to encrypt out) -------------------------------------------------------
    def from_home(self, data: bytes) -> None:
        self.bytes_out += len(data)
        if not self.client.is_closing():
            self.client.write(data)

    def home_lost(self) -> None:
        self._home_closed = True
        if not self.client.is_closing():
            self.client.close()  # close_notify after what the home wrote
        self.end()

    # -- both --------------------------------------------------------------------------------------------
    def pause_reading_client(self) -> None:
        if not self.client.is_closing():
            self.client.pause_reading()
            if not self._watching_client:
                self._watching_client = True
                asyncio.get_running_loop().call_later(DRAIN_CHECK_S, self._watch_paused_client)

    def _watch_paused_client(self) -> None:
        """While the client's reading is paused (the home does not take its bytes), its end of file or reset
        is not read: look for it every DRAIN_CHECK_S, and end the relay when the client has gone."""
        self._watching_client = False
        if self._ended or self.client.is_closing() or self.client.is_reading():
            return
        sock = self.client.get_extra_info("socket")
        if sock is not None and peer_hung_up(sock.fileno()):
            log.info("a relayed TLS connection's client is gone while its home reads nothing: closed")
            self.abort()
            return
        self._watching_client = True
        asyncio.get_running_loop().call_later(DRAIN_CHECK_S, self._watch_paused_client)

    def resume_reading_client(self) -> None:
        if self.home is not None and not self.client.is_closing():
            self.client.resume_reading()

    def pause_reading_home(self) -> None:
        if self.home is not None and not self.home.is_closing():
            self.home.pause_reading()

    def resume_reading_home(self) -> None:
        if self.home is not None and not self.home.is_closing():
            self.home.resume_reading()

    def abort(self) -> None:
        """End both sides now (the worker stops, or a relay that cannot go on)."""
        if not self.client.is_closing():
            self.client.abort()
        if self.home is not None and not self.home.is_closing():
            self.home.abort()
        self.end()

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._on_end(self)


class _ClientSide(asyncio.Protocol):
    """The TLS transport's protocol once relayed."""

    __slots__ = ("relay",)

    def __init__(self, relay: TlsRelay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_client(data)

    def eof_received(self) -> bool | None:
        self.relay.client_eof()
        return None  # (TLS cannot stay half-open: the transport closes, connection_lost follows)

    def pause_writing(self) -> None:  # the client is not reading what the home sends
        self.relay.pause_reading_home()

    def resume_writing(self) -> None:
        self.relay.resume_reading_home()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.client_lost()


class _HomeSide(asyncio.Protocol):
    """This worker's end of the socket pair."""

    __slots__ = ("relay",)

    def __init__(self, relay: TlsRelay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_home(data)

    def eof_received(self) -> bool | None:
        self.relay.home_lost()
        return None

    def pause_writing(self) -> None:  # the home is not reading what the client sends
        self.relay.pause_reading_client()

    def resume_writing(self) -> None:
        self.relay.resume_reading_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.home_lost()


__all__ = ["DRAIN_CHECK_S", "MAX_EARLY_BYTES", "WRITE_HIGH", "WRITE_LOW", "TlsRelay", "peer_hung_up"]
