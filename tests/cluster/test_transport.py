"""hutch.runtime.clustering.transport on real loopback sockets (port 0): several Transports in one event loop.

Timings are scaled down (heartbeat 50 ms, peer timeout 500 ms) and every wait polls a condition with a
deadline, so the tests are quick and do not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from hutch.cluster import wire
from hutch.runtime.clustering.transport import ConnState, PeerUnavailable, RemoteError, Transport

SECRET = b"the-cluster-cookie-0123456789"
HB = 0.05
TIMEOUT = 0.5


async def until(cond: Callable[[], bool], timeout: float = 3.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Node:
    """A Transport plus everything its callbacks saw."""

    def __init__(self, name: str, secret: bytes = SECRET, port: int = 0, *, host: str = "127.0.0.1",
                 on_request: Callable[[str, Any], Any] | None = None, **kw: Any) -> None:
        self.name = name
        self.messages: list[tuple[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.t = Transport(name, secret, host, port, on_message=self._on_message,
                           on_request=on_request if on_request is not None else self._echo,
                           on_peer_up=lambda p: self.events.append(("up", p)),
                           on_peer_down=lambda p: self.events.append(("down", p)),
                           heartbeat_s=HB, peer_timeout_s=TIMEOUT, **kw)

    def _on_message(self, peer: str, obj: Any) -> None:
        self.messages.append((peer, obj))

    @staticmethod
    def _echo(peer: str, obj: Any) -> Any:
        return {"from": peer, "echo": obj}

    def ups(self, peer: str) -> int:
        return self.events.count(("up", peer))

    def downs(self, peer: str) -> int:
        return self.events.count(("down", peer))

    def open_conns(self) -> list[Any]:
        return [c for c in self.t._conns if c.state is ConnState.OPEN]


Make = Callable[..., Awaitable[Node]]


@pytest_asyncio.fixture
async def make():
    made: list[Node] = []

    async def _make(name: str, secret: bytes = SECRET, port: int = 0, **kw: Any) -> Node:
        node = Node(name, secret, port, **kw)
        await node.t.start()
        made.append(node)
        return node

    yield _make
    for node in made:
        await node.t.stop()


async def connect(a: Node, b: Node) -> None:
    a.t.set_peer(b.name, "127.0.0.1", b.t.port)
    await until(lambda: a.t.connected(b.name) and b.t.connected(a.name), what=f"{a.name} <-> {b.name}")


class Proxy:
    """A TCP relay that records every byte in each direction."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.to_target = bytearray()
        self.from_target = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_w]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, record: bytearray) -> None:
            try:
                while data := await r.read(65536):
                    record += data
                    w.write(data)
            except ConnectionError:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w, self.to_target), pipe(up_r, writer, self.from_target))

    async def stop(self) -> None:
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()


def frames_of(data: bytes) -> list[Any]:
    return wire.FrameDecoder(1 << 26).feed(bytes(data))


def log_lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hutch.transport" and r.levelno >= level]


# -- handshake and authentication ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_handshake_ok_and_a_joining_node_is_learned(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)  # n2 never heard of n1: it learns it from the handshake
    assert n1.t.connected_peers() == ["n2"] and n2.t.connected_peers() == ["n1"]
    assert n2.t.peer_address("n1") == ("127.0.0.1", n1.t.port)
    assert n1.events == [("up", "n2")] and n2.events == [("up", "n1")]
    assert n2.t.send("n1", "hello n1") and n1.t.send("n2", {"k": [1, b"2"]})
    await until(lambda: n1.messages and n2.messages)
    assert n1.messages == [("n2", "hello n1")] and n2.messages == [("n1", {"k": [1, b"2"]})]
    assert await n2.t.call("n1", 5) == {"from": "n2", "echo": 5}
    assert not n1.t.send("nobody", 1) and not n1.t.connected("nobody")


@pytest.mark.asyncio
async def test_a_wildcard_listen_address_is_learned_as_the_source_address(make: Make):
    n1 = await make("n1", host="0.0.0.0")
    n2 = await make("n2")
    n1.t.set_peer("n2", "127.0.0.1", n2.t.port)
    await until(lambda: n2.t.connected("n1"))
    assert n2.t.peer_address("n1") == ("127.0.0.1", n1.t.port)


@pytest.mark.asyncio
@pytest.mark.parametrize("bad_dials", [True, False], ids=["bad-node-dials", "good-node-dials"])
async def test_wrong_secret_is_refused_with_clear_log_lines(make: Make, caplog, bad_dials: bool):
    caplog.set_level(logging.DEBUG, logger="hutch.transport")
    good, bad = await make("n1"), await make("n2", secret=b"not-the-cookie")
    dialler, acceptor = (bad, good) if bad_dials else (good, bad)
    dialler.t.set_peer(acceptor.name, "127.0.0.1", acceptor.t.port)
    refused = (f"refused inter-node connection from 127.0.0.1:\\d+ \\(claims node '{dialler.name}'\\): "
               "cluster secret mismatch")
    answer = f"node '{acceptor.name}' at 127.0.0.1:{acceptor.t.port} refused our cluster secret"
    await until(lambda: any(re.fullmatch(refused, m) for m in log_lines(caplog))
                and answer in log_lines(caplog), what="both log lines")
    assert not dialler.t.connected(acceptor.name) and not acceptor.t.connected(dialler.name)
    assert good.events == [] and bad.events == []
    # it keeps retrying (a fixed secret heals the cluster), but the warning is not repeated every second
    await asyncio.sleep(0.3)
    assert sum(bool(re.fullmatch(refused, m)) for m in log_lines(caplog)) == 1


@pytest.mark.asyncio
async def test_dialler_refuses_an_acceptor_that_cannot_prove_the_secret(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    got: list[Any] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # speaks the protocol but does not know the secret: skips the check and sends a made-up proof
        dec = wire.FrameDecoder(1 << 16)
        hs = wire.Handshake(wire.Role.ACCEPTOR, node="n2", secret=b"guess", nonce=b"i" * 32,
                            host="127.0.0.1", port=1, max_frame_bytes=1 << 20)
        while data := await reader.read(4096):
            for obj in dec.feed(data):
                got.append(obj)
                if obj.get("t") == "hello":
                    writer.write(hs.receive(obj))
                elif obj.get("t") == "proof":
                    writer.write(wire.encode_frame({"t": "welcome", "mac": b"\x00" * 32}))
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    n1 = await make("n1")
    n1.t.set_peer("n2", "127.0.0.1", port)
    line = f"refused inter-node connection to 127.0.0.1:{port} (claims node 'n2'): cluster secret mismatch"
    await until(lambda: line in log_lines(caplog), what=line)
    await until(lambda: any(isinstance(o, dict) and o.get("t") == "refused" for o in got))
    assert not n1.t.connected("n2") and n1.events == []
    server.close()


@pytest.mark.asyncio
async def test_node_name_clash_is_refused(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    n1, twin = await make("n1"), await make("n1")
    with pytest.raises(ValueError):
        n1.t.set_peer("n1", "127.0.0.1", twin.t.port)
    n1.t.set_peer("n2", "127.0.0.1", twin.t.port)  # thinks it dials n2, reaches another "n1"
    await until(lambda: any("(claims node 'n1'): node name clash" in m for m in log_lines(caplog)))
    await until(lambda: any(m.startswith(f"node 'n2' at 127.0.0.1:{twin.t.port} refused the inter-node "
                                         "connection: node name clash") for m in log_lines(caplog)))
    assert n1.t.connected_peers() == [] and twin.t.connected_peers() == []


@pytest.mark.asyncio
async def test_dialling_an_address_that_is_another_node(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    n1, n3 = await make("n1"), await make("n3")
    n1.t.set_peer("n2", "127.0.0.1", n3.t.port)
    await until(lambda: any("expected node 'n2' there, found 'n3'" in m for m in log_lines(caplog)))
    assert not n1.t.connected("n2") and not n1.t.connected("n3") and not n3.t.connected("n1")


@pytest.mark.asyncio
async def test_the_secret_never_crosses_the_wire(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    proxy = await Proxy(n2.t.port).start()
    n1.t.set_peer("n2", "127.0.0.1", proxy.port)
    await until(lambda: n1.t.connected("n2") and n2.t.connected("n1"))
    n1.t.send("n2", SECRET[:5])  # parts of it may be data; the whole secret must never be
    assert await n1.t.call("n2", "x") == {"from": "n1", "echo": "x"}
    await asyncio.sleep(3 * HB)  # some heartbeats too
    wire_bytes = bytes(proxy.to_target) + bytes(proxy.from_target)
    assert len(wire_bytes) > 200
    for form in (SECRET, SECRET.hex().encode(), SECRET[::-1]):
        assert form not in wire_bytes
    hellos = [f for f in frames_of(proxy.to_target) + frames_of(proxy.from_target)
              if isinstance(f, dict) and f.get("t") == "hello"]
    assert {h["node"] for h in hellos} == {"n1", "n2"}
    await proxy.stop()


# -- messages, batching, requests ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sends_in_one_iteration_go_out_as_one_frame_in_order(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    proxy = await Proxy(n2.t.port).start()
    n1.t.set_peer("n2", "127.0.0.1", proxy.port)
    await until(lambda: n1.t.connected("n2") and n2.t.connected("n1"))
    n1.t.set_delay("n2", 0)
    before = len(frames_of(proxy.to_target))
    assert all(n1.t.send("n2", i) for i in range(500))
    await until(lambda: len(n2.messages) == 500)
    assert [m for _, m in n2.messages] == list(range(500))
    batches = [f for f in frames_of(proxy.to_target)[before:] if f]  # heartbeats are empty batches
    assert len(batches) == 1 and batches[0] == [[wire.MESSAGE, i] for i in range(500)]
    # across iterations, order holds too
    for i in range(500, 600):
        n1.t.send("n2", i)
        if i % 7 == 0:
            await asyncio.sleep(0)
    await until(lambda: len(n2.messages) == 600)
    assert [m for _, m in n2.messages] == list(range(600))
    await proxy.stop()


@pytest.mark.asyncio
async def test_a_large_batch_is_split_below_the_frame_limit(make: Make):
    n1, n2 = await make("n1", max_frame_bytes=8192), await make("n2", max_frame_bytes=1 << 20)
    await connect(n1, n2)
    blob = b"x" * 3000
    for _ in range(10):
        assert n2.t.send("n1", blob)  # n1's limit (8 KiB) applies to what n2 sends it
    await until(lambda: len(n1.messages) == 10)
    with pytest.raises(ValueError):
        n2.t.send("n1", b"y" * 9000)
    with pytest.raises(TypeError):
        n1.t.send("n2", object())
    assert n1.t.connected("n2")


@pytest.mark.asyncio
async def test_call_reply_remote_error_timeout_and_async_handlers(make: Make):
    gate = asyncio.Event()

    async def handler(peer: str, obj: Any) -> Any:
        if obj == "boom":
            raise KeyError("no such queue")
        if obj == "async-boom":
            await asyncio.sleep(0)
            raise RuntimeError("failed later")
        if obj == "slow":
            await gate.wait()
            return "finally"
        if obj == "unencodable":
            return object()
        await asyncio.sleep(0)
        return ["async", obj]

    def sync_handler(peer: str, obj: Any) -> Any:
        return handler(peer, obj) if obj != "sync" else "direct"

    n1, n2 = await make("n1"), await make("n2", on_request=sync_handler)
    await connect(n1, n2)
    assert await n1.t.call("n2", "sync") == "direct"
    assert await n1.t.call("n2", 7) == ["async", 7]
    results = await asyncio.gather(*(n1.t.call("n2", i) for i in range(50)))
    assert results == [["async", i] for i in range(50)]
    with pytest.raises(RemoteError) as ei:
        await n1.t.call("n2", "boom")
    assert str(ei.value) == "'no such queue'" and ei.value.remote_type == "KeyError"
    with pytest.raises(RemoteError, match="failed later"):
        await n1.t.call("n2", "async-boom")
    with pytest.raises(RemoteError, match="cannot be encoded"):
        await n1.t.call("n2", "unencodable")
    with pytest.raises(asyncio.TimeoutError):
        await n1.t.call("n2", "slow", timeout=0.1)
    gate.set()  # the late reply is ignored
    assert await n1.t.call("n2", "sync") == "direct"
    assert not n1.t._calls
    # the other way: n1 echoes
    assert await n2.t.call("n1", None) == {"from": "n2", "echo": None}


@pytest.mark.asyncio
async def test_call_without_a_handler_and_to_an_unknown_peer(make: Make):
    n1 = await make("n1")
    n2 = Node("n2")
    n2.t.on_request = None
    await n2.t.start()
    try:
        await connect(n1, n2)
        with pytest.raises(RemoteError, match="takes no requests"):
            await n1.t.call("n2", 1)
        with pytest.raises(PeerUnavailable):
            await n1.t.call("n9", 1)
    finally:
        await n2.t.stop()


@pytest.mark.asyncio
async def test_peer_stopping_mid_call_raises_peer_unavailable(make: Make):
    started = asyncio.Event()

    async def never(peer: str, obj: Any) -> Any:
        started.set()
        await asyncio.Event().wait()

    n1, n2 = await make("n1"), await make("n2", on_request=never)
    await connect(n1, n2)
    call = asyncio.ensure_future(n1.t.call("n2", "q", timeout=10))
    await started.wait()
    await n2.t.stop()
    with pytest.raises(PeerUnavailable):
        await asyncio.wait_for(call, 2)
    assert n1.events == [("up", "n2"), ("down", "n2")]
    assert n2.events == [("up", "n1"), ("down", "n1")]


@pytest.mark.asyncio
async def test_set_delay_holds_batches_and_keeps_order(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)
    loop = asyncio.get_running_loop()
    n1.t.set_delay("n2", 0.2)
    t0 = loop.time()
    n1.t.send("n2", 1)
    await asyncio.sleep(0.01)
    n1.t.set_delay("n2", 0.05)  # shorter now: 2 must still not overtake 1
    n1.t.send("n2", 2)
    await until(lambda: len(n2.messages) == 2)
    assert loop.time() - t0 >= 0.19
    assert [m for _, m in n2.messages] == [1, 2]
    n1.t.set_delay("n2", 0)
    assert await n1.t.call("n2", 3) == {"from": "n1", "echo": 3}


# -- one connection per pair, reconnects, liveness -------------------------------------------------


@pytest.mark.asyncio
async def test_simultaneous_dial_keeps_one_connection_the_lower_names(make: Make):
    for round_ in range(5):
        a, b = await make(f"a{round_}"), await make(f"b{round_}")
        a.t.set_peer(b.name, "127.0.0.1", b.t.port)
        b.t.set_peer(a.name, "127.0.0.1", a.t.port)  # same iteration: both dial
        sent_a: list[int] = []
        sent_b: list[int] = []
        await until(lambda a=a, b=b: a.t.connected(b.name) and b.t.connected(a.name))
        for i in range(20):  # send as soon as up, while the loser may still be closing
            if a.t.send(b.name, i):
                sent_a.append(i)
            if b.t.send(a.name, i):
                sent_b.append(i)
        await asyncio.sleep(0.15)
        assert len(a.open_conns()) == 1 and len(b.open_conns()) == 1
        assert a.open_conns()[0].role is wire.Role.DIALLER  # a sorts lower: a's dial is kept
        assert b.open_conns()[0].role is wire.Role.ACCEPTOR
        assert a.events == [("up", b.name)] and b.events == [("up", a.name)]
        assert [m for _, m in b.messages] == sent_a == list(range(20))
        assert [m for _, m in a.messages] == sent_b == list(range(20))


@pytest.mark.asyncio
async def test_reconnects_after_the_peer_restarts_on_the_same_port(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)
    port = n2.t.port
    await n2.t.stop()
    await until(lambda: not n1.t.connected("n2"))
    assert not n1.t.send("n2", "lost")
    await asyncio.sleep(0.3)  # a few failed dials (connection refused)
    n2b = await make("n2", port=port)
    await until(lambda: n1.t.connected("n2") and n2b.t.connected("n1"), timeout=4)
    assert n1.events == [("up", "n2"), ("down", "n2"), ("up", "n2")]
    assert n1.t.send("n2", "again")
    await until(lambda: n2b.messages == [("n1", "again")])


@pytest.mark.asyncio
async def test_accepting_side_does_not_redial_an_unregistered_peer(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)
    n1.t.remove_peer("n2")
    await until(lambda: not n2.t.connected("n1"))
    await asyncio.sleep(0.3)
    assert not n1.t.connected("n2") and not n2.t.connected("n1")
    assert n2.t.peer_address("n1") == ("127.0.0.1", n1.t.port)  # still known, just not dialled
    assert n1.events == [("up", "n2"), ("down", "n2")] and n2.events == [("up", "n1"), ("down", "n1")]
    n2.t.set_peer("n1", *n2.t.peer_address("n1"))  # now it does
    await until(lambda: n1.t.connected("n2") and n2.t.connected("n1"))


@pytest.mark.asyncio
async def test_block_and_unblock_partition_the_pair(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    n2.t.set_peer("n1", "127.0.0.1", n1.t.port)  # both sides keep trying to reconnect
    await connect(n1, n2)
    n1.t.block("n2")
    assert not n1.t.connected("n2") and n1.events[-1] == ("down", "n2")  # at once, on this side
    assert not n1.t.send("n2", "dropped")
    with pytest.raises(PeerUnavailable):
        await n1.t.call("n2", 1)
    await until(lambda: not n2.t.connected("n1"), timeout=TIMEOUT + 0.2)
    await asyncio.sleep(0.4)  # n2 redials and is turned away; n1 does not dial
    assert not n1.t.connected("n2") and not n2.t.connected("n1")
    assert n1.downs("n2") == 1 and n2.downs("n1") == 1
    n1.t.unblock("n2")
    await until(lambda: n1.t.connected("n2") and n2.t.connected("n1"), timeout=3)
    assert n1.events == [("up", "n2"), ("down", "n2"), ("up", "n2")]
    assert n2.events == [("up", "n1"), ("down", "n1"), ("up", "n1")]
    assert n2.messages == []


@pytest.mark.asyncio
async def test_idle_connection_stays_up_on_heartbeats(make: Make):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)
    await asyncio.sleep(3 * TIMEOUT)
    assert n1.events == [("up", "n2")] and n2.events == [("up", "n1")]


async def fake_peer(port: int, name: str = "n9", secret: bytes = SECRET
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An authenticated connection driven by hand with the pure handshake."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hs = wire.Handshake(wire.Role.DIALLER, node=name, secret=secret, nonce=b"f" * 32, host="127.0.0.1",
                        port=1, max_frame_bytes=1 << 20)
    dec = wire.FrameDecoder(1 << 20)
    writer.write(hs.start())
    while not hs.done:
        for obj in dec.feed(await reader.read(4096)):
            if not hs.done:
                out = hs.receive(obj)
                if out:
                    writer.write(out)
    return reader, writer


@pytest.mark.asyncio
async def test_a_silent_peer_is_declared_down_within_peer_timeout(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    n1 = await make("n1")
    reader, writer = await fake_peer(n1.t.port)
    await until(lambda: n1.t.connected("n9"))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await until(lambda: not n1.t.connected("n9"), timeout=2 * TIMEOUT)  # it never sends a heartbeat
    assert loop.time() - t0 <= TIMEOUT + 0.3
    assert n1.events == [("up", "n9"), ("down", "n9")]
    assert any("node 'n9' silent for" in m for m in log_lines(caplog))
    writer.close()


@pytest.mark.asyncio
async def test_writable_follows_the_write_buffer_and_the_hard_bound_drops(make: Make):
    n1 = await make("n1", write_buffer_high_bytes=16 << 10, max_buffered_bytes=1 << 20,
                    max_frame_bytes=1 << 20)
    reader, writer = await fake_peer(n1.t.port)  # reads nothing from now on
    await until(lambda: n1.t.connected("n9"))
    assert n1.t.writable("n9")
    chunk = b"z" * 60_000
    sent = 0
    while n1.t.send("n9", chunk):
        sent += 1
        await asyncio.sleep(0)
        assert sent < 200, "the hard bound never applied"
    assert not n1.t.writable("n9") and n1.t.connected("n9")
    while True:  # drain: it becomes writable again
        data = await asyncio.wait_for(reader.read(1 << 20), 1)
        assert data
        if n1.t.writable("n9"):
            break
    assert n1.t.send("n9", b"ok")
    writer.close()


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_garbage_bytes_close_the_connection_with_a_log_line(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    n1, n2 = await make("n1"), await make("n2")
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"AMQP\x00\x00\x09\x01", b"\x00\x00\x00\x02\xc1\xc1"):
        reader, writer = await asyncio.open_connection("127.0.0.1", n1.t.port)
        writer.write(garbage)
        assert await asyncio.wait_for(reader.read(100), 2) == b""  # closed, no reply
        writer.close()
    lines = [m for m in log_lines(caplog) if m.startswith("closing inter-node connection from 127.0.0.1:")]
    assert len(lines) == 3
    assert "exceeds the limit of 4096" in lines[0] and "undecodable" in lines[2]
    await connect(n1, n2)  # the node is fine
    assert n1.events == [("up", "n2")]


@pytest.mark.asyncio
async def test_a_connection_that_never_finishes_its_handshake_is_closed(make: Make):
    n1 = await make("n1")
    reader, writer = await asyncio.open_connection("127.0.0.1", n1.t.port)
    assert await asyncio.wait_for(reader.read(100), 2 * TIMEOUT + 0.5) == b""
    writer.close()


@pytest.mark.asyncio
async def test_oversize_and_malformed_frames_from_an_authenticated_peer(make: Make, caplog):
    caplog.set_level(logging.INFO, logger="hutch.transport")
    n1 = await make("n1", max_frame_bytes=8192)
    cases = [
        (struct.pack(">I", 8193), "frame of 8193 bytes exceeds the limit of 8192"),
        (wire.encode_frame("not a batch"), "a batch frame must hold an array"),
        (wire.encode_frame([[99, 1]]), "unknown entry kind 99"),
        (wire.encode_frame([[]]), "malformed batch (IndexError"),
        (wire.encode_frame([[wire.REQUEST, "id", 1]]), "request id must be an integer"),
    ]
    for i, (frame, expected) in enumerate(cases):
        reader, writer = await fake_peer(n1.t.port)
        await until(lambda: n1.t.connected("n9"))
        writer.write(wire.encode_batch([wire.pack_message(i)]) + frame)
        await until(lambda: not n1.t.connected("n9"))
        assert any(expected in m and "(node 'n9')" in m for m in log_lines(caplog)), expected
        writer.close()
    # the good message in front of each bad frame was delivered
    assert [m for _, m in n1.messages] == list(range(len(cases)))
    assert n1.downs("n9") == len(cases)


@pytest.mark.asyncio
async def test_callback_exceptions_are_logged_and_the_connection_survives(make: Make, caplog):
    n1, n2 = await make("n1"), await make("n2")
    await connect(n1, n2)

    def explode(peer: str, obj: Any) -> None:
        raise RuntimeError("handler bug")

    n2.t.on_message = explode
    n1.t.send("n2", 1)
    await until(lambda: any("on_message failed" in r.getMessage() for r in caplog.records))
    assert await n1.t.call("n2", "still") == {"from": "n1", "echo": "still"}


def test_runs_on_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        n1, n2 = Node("n1"), Node("n2")
        await n1.t.start()
        await n2.t.start()
        try:
            await connect(n1, n2)
            for i in range(100):
                n1.t.send("n2", i)
            await until(lambda: len(n2.messages) == 100)
            assert [m for _, m in n2.messages] == list(range(100))
            assert await n2.t.call("n1", "u") == {"from": "n2", "echo": "u"}
        finally:
            await n1.t.stop()
            await n2.t.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


@pytest.mark.asyncio
async def test_silent_sockets_from_one_source_cannot_keep_a_peer_out(caplog):
    """Issue 15, finding 8: more silent sockets than MAX_HANDSHAKING, all from the peer's own address, and
    a peer that proves the secret still gets in at once (not after the handshake timeout), while the
    silent ones are cut down to the per-source limit."""
    from hutch.runtime.clustering import transport as module

    def transport(name: str) -> Transport:
        return Transport(name, SECRET, "127.0.0.1", 0, on_message=lambda p, o: None, heartbeat_s=0.5,
                         peer_timeout_s=10.0)

    n1, n2 = transport("n1"), transport("n2")
    await n1.start()
    await n2.start()
    silent = []
    try:
        for _ in range(module.MAX_HANDSHAKING + 32):
            silent.append(await asyncio.open_connection("127.0.0.1", n1.port))
        await asyncio.sleep(0.1)
        n2.set_peer("n1", "127.0.0.1", n1.port)
        await until(lambda: n2.connected("n1") and n1.connected("n2"), timeout=3.0, what="n2 joined")
        handshaking = [c for c in n1._conns if c.state is ConnState.HANDSHAKE]
        assert len(handshaking) <= module.MAX_HANDSHAKING_PER_SOURCE
        assert sum(1 for m in log_lines(caplog) if "in their handshake" in m) >= 1
        assert n2.send("n1", "after the flood")
    finally:
        for _, writer in silent:
            writer.close()
        await n2.stop()
        await n1.stop()


@pytest.mark.asyncio
async def test_a_worker_of_a_node_in_a_cluster_links_its_own_workers_by_pair_and_the_others_by_network(make: Make):
    """A node of workers in a multi-node cluster (docs/scaling.md): `paired=True, network=True`. Its two
    workers share a socket pair and never dial each other; another node's member dials both; one of them
    dialling its sibling over the network (with the secret, under its own name) is refused; and a node
    dialled under the node's name (a `--join` seed) may answer as its worker 0."""
    import socket

    from hutch.runtime.workers.membership import same_node, seed_answers

    def worker(name: str) -> Node:
        return Node(name, paired=True, network=True, answers_as=seed_answers,
                    is_sibling=lambda peer, me=name: peer != me and same_node(peer, me))

    w0, w1 = worker("a@h#w0"), worker("a@h#w1")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    w0.t.adopt(w1.name, ours)
    w1.t.adopt(w0.name, theirs)
    for w in (w0, w1):
        await w.t.start()
    other = await make("b@h", answers_as=seed_answers)
    try:
        await until(lambda: w0.t.connected(w1.name) and w1.t.connected(w0.name), what="the worker link")
        w0.t.set_peer(w1.name, "127.0.0.1", w1.t.port)  # learnt from the member table: never dialled
        await connect(other, w0)
        await connect(other, w1)
        assert await other.t.call(w1.name, "hi") == {"from": other.name, "echo": "hi"}
        assert await w0.t.call(w1.name, "hi") == {"from": w0.name, "echo": "hi"}
        assert w0.t._peers[w1.name].dialing is None and w0.t._peers[w1.name].retry is None
        # a sibling's name over the network is refused by the acceptor
        impostor = await make("a@h#w1-net", answers_as=seed_answers)
        impostor.t.node_name = w1.name
        impostor.t.set_peer(w0.name, "127.0.0.1", w0.t.port)
        await until(lambda: any(key[0] == "sibling" for key in w0.t._warned), what="the refusal")
        assert not impostor.t.connected(w0.name) and w0.ups(w1.name) == 1
        # the node's name dialled (a join seed) reaches its worker 0
        seed = await make("c@h", answers_as=seed_answers)
        seed.t.set_peer("a@h", "127.0.0.1", w0.t.port)
        await until(lambda: seed.t.connected("a@h"), what="the seed's worker 0")
        assert (await seed.t.call("a@h", "x"))["from"] == seed.name
    finally:
        for w in (w0, w1):
            await w.t.stop()
