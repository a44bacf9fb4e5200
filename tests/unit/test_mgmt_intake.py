"""Pure parts of the management listener's defences (hutch.mgmt.jsontext, intake.same_origin, listener):
the JSON nesting scan against the real nesting of generated documents (Hypothesis), the same-origin rule,
and the connection guard's cap and inactivity watchdog driven on an event loop with an in-memory
transport. The same defences against a real node: tests/mgmt/test_security.py."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.mgmt.intake import same_origin
from hutch.mgmt.jsontext import MAX_JSON_DEPTH, JsonTooDeep, json_depth, loads_bounded
from hutch.mgmt.listener import ConnectionGuard, ListenerLimits

# -- JSON nesting ------------------------------------------------------------------------------------

_text = st.text(alphabet=st.sampled_from('ab[]{}"\\\n é'), max_size=8)
_json = st.recursive(st.none() | st.booleans() | st.integers() | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=30)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(_json, st.booleans())
def test_the_scan_finds_the_real_nesting(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_depth(text) == _depth(value)
    assert loads_bounded(text) == value


def test_limit_and_strings() -> None:
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(JsonTooDeep):
        loads_bounded("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(JsonTooDeep):  # a million levels: refused before the recursive parser runs
        loads_bounded(b"[" * 1_000_000)
    assert loads_bounded(json.dumps({"k": "[{" * 1000 + '\\"'})) == {"k": "[{" * 1000 + '\\"'}
    with pytest.raises(ValueError):
        loads_bounded(b'{"unterminated": "[[[')


# -- same origin --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("origin", "host", "scheme", "same"), [
    ("http://127.0.0.1:15672", "127.0.0.1:15672", "http", True),
    ("http://LOCALHOST:15672", "localhost:15672", "http", True),
    ("http://[::1]:15672", "[::1]:15672", "http", True),
    ("https://broker.example", "broker.example", "http", True),  # a TLS proxy in front: Host has no port
    ("http://127.0.0.1:8080", "127.0.0.1:15672", "http", False),
    ("http://127.0.0.1:8080", "127.0.0.1", "http", False),  # another service of the host, port 80 here
    ("http://broker.example", "broker.example", "http", True),
    ("http://evil.example", "127.0.0.1:15672", "http", False),
    ("http://127.0.0.1.evil.example:15672", "127.0.0.1:15672", "http", False),
    ("null", "127.0.0.1:15672", "http", False),
    ("file://", "127.0.0.1:15672", "http", False),
    ("http://127.0.0.1:99999", "127.0.0.1:15672", "http", False),
    ("", "127.0.0.1:15672", "http", False),
])
def test_same_origin(origin: str, host: str, scheme: str, same: bool) -> None:
    assert same_origin(origin, host, scheme) is same


# -- the connection guard -----------------------------------------------------------------------------


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Handler(asyncio.Protocol):
    def __init__(self) -> None:
        self.events: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(data.decode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")


def test_cap_and_inactivity_watchdog() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        handlers: list[_Handler] = []

        def make() -> _Handler:
            handlers.append(_Handler())
            return handlers[-1]

        guard = ConnectionGuard(make, ListenerLimits(1.0, 1.0, 0.2, 2, 1000), loop)
        first, second = guard(), guard()
        t1, t2 = _Transport(), _Transport()
        first.connection_made(t1)
        second.connection_made(t2)
        assert guard.open_connections == 2
        refused, t3 = guard(), _Transport()
        refused.connection_made(t3)
        assert t3.closed and guard.refused == 1 and len(handlers) == 2
        for _ in range(4):  # data keeps the first one alive past the inactivity timeout
            await asyncio.sleep(0.1)
            first.data_received(b"x")
        assert not t1.closed and t2.closed  # the silent one was closed after 0.2 s
        second.connection_lost(None)
        assert guard.open_connections == 1 and handlers[1].events == ["made", "lost"]
        third, t4 = guard(), _Transport()  # under the cap again
        third.connection_made(t4)
        assert not t4.closed and guard.open_connections == 2
        assert handlers[0].events[:2] == ["made", "x"]

    asyncio.run(scenario())


def test_orjson_keeps_what_json_allows_and_the_collector_comes_back() -> None:
    """Issue 21 item 6: bodies are decoded with orjson, with the cycle collector paused; integers past
    64 bits stay exact and escaped lone surrogates decode (`json.loads` takes those small bodies)."""
    assert loads_bounded(b'{"n": 18446744073709551616}') == {"n": 2**64}
    assert loads_bounded(b'["\\ud800"]') == ["\ud800"]
    assert loads_bounded(b'{"a": [1, 2.5, null, true, "x"]}') == {"a": [1, 2.5, None, True, "x"]}
    assert gc.isenabled()
    with pytest.raises(ValueError):
        loads_bounded(b"[1, 2")
    assert gc.isenabled()
    text = json.dumps({"s": '"[[[{{{' * 30 + "\\" * 3, "t": ["a\\\"[", {"u": "]]]"}]}).encode()
    assert json_depth(text) == 3 and loads_bounded(text)["t"][1] == {"u": "]]]"}
    assert json_depth(b"[" * 70 + b"]" * 70) == MAX_JSON_DEPTH + 1  # stops counting past the limit
