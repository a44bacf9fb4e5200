"""runtime/broker/logins.py: the login gate's bounds and its cache bypass, driven on an event loop with
a password check that blocks until the test releases it (no sockets, no timing)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
from types import SimpleNamespace
from typing import Any

from hutch.config import Config
from hutch.core.auth import AuthStore, LoginCheck, hash_password, import_password_hash
from hutch.core.definition_ops import RehashUser
from hutch.runtime.app import build_node
from hutch.runtime.broker.logins import (
    CLEAN_SHARE,
    SUSPECT_AFTER_FAILURES,
    TOO_MANY_PENDING,
    LoginGate,
    source_group,
)

CHEAP_N = 2**4


class _Node(SimpleNamespace):
    def password_rehashed(self, user: str, previous_hash: str, new_hash: str) -> bool:
        if not self.auth.upgrade_password_hash(user, previous_hash, new_hash):
            return False
        self.recorded += 1
        return True


def _gate(**config: Any) -> tuple[LoginGate, _Node, threading.Event]:
    auth = AuthStore(scrypt_n=CHEAP_N)
    auth.bootstrap("guest", "guest")
    node = _Node(config=Config(**config), auth=auth, recorded=0)
    release = threading.Event()
    real = auth.check_login

    def blocking(name: str, password: str) -> LoginCheck:
        release.wait(10)
        return real(name, password)

    auth.check_login = blocking  # type: ignore[method-assign]
    return LoginGate(node), node, release


def _recorded(node: _Node) -> list[str]:
    """The passwords the pool checks, in order (the gate's check wrapped)."""
    checked: list[str] = []
    blocking = node.auth.check_login

    def recording(name: str, password: str) -> LoginCheck:
        checked.append(password)
        return blocking(name, password)

    node.auth.check_login = recording  # type: ignore[method-assign]
    return checked


def test_bounds_per_source_and_overall_refuse_at_once_and_cache_bypasses():
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1, auth_max_pending_logins=3,
                                    auth_max_pending_logins_per_source=2)
        node.auth.authenticate_cached("guest", "guest")  # nothing cached yet
        a1 = asyncio.ensure_future(gate.check("guest", "bad1", "10.0.0.1"))
        a2 = asyncio.ensure_future(gate.check("guest", "bad2", "10.0.0.1"))
        b1 = asyncio.ensure_future(gate.check("guest", "bad3", "10.0.0.2"))
        await asyncio.sleep(0.05)
        assert gate.pending == 3
        assert (await gate.check("guest", "bad4", "10.0.0.1")).reason == TOO_MANY_PENDING  # per source
        assert (await gate.check("guest", "guest", "10.0.0.3")).reason == TOO_MANY_PENDING  # overall
        release.set()
        assert [(await f).reason for f in (a1, a2, b1)] == ["invalid credentials"] * 3
        assert gate.pending == 0
        assert (await gate.check("guest", "guest", "10.0.0.3")).user is not None  # now cached
        release.clear()
        blockers = [asyncio.ensure_future(gate.check("guest", f"bad{i}", f"10.0.1.{i}")) for i in range(3)]
        await asyncio.sleep(0.05)
        assert gate.pending == 3
        cached = await gate.check("guest", "guest", "10.0.0.3")  # full pool: still answered at once
        assert cached.user is not None and cached.user.name == "guest"
        release.set()
        await asyncio.gather(*blockers)
        gate.close()

    asyncio.run(scenario())


def _rabbit_sha256(password: str) -> str:
    salt = b"\x01\x02\x03\x04"
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_imported_hash_is_replaced_once_and_recorded():
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1)
        release.set()
        node.auth.add_user("imp", None, password_hash=import_password_hash(_rabbit_sha256("pw"),
                                                                             "rabbit_password_hashing_sha256"))
        stored = node.auth.get_user("imp").password_hash
        assert (await gate.check("imp", "wrong", "10.0.0.1")).user is None
        assert node.auth.get_user("imp").password_hash == stored and node.recorded == 0
        assert (await gate.check("imp", "pw", "10.0.0.1")).user is not None
        assert node.auth.get_user("imp").password_hash.startswith("scrypt$") and node.recorded == 1
        assert (await gate.check("imp", "pw", "10.0.0.1")).user is not None  # cached now; no second re-hash
        assert node.recorded == 1
        gate.close()

    asyncio.run(scenario())


def test_upgrade_loses_to_a_password_change():
    auth = AuthStore(scrypt_n=CHEAP_N)
    auth.add_user("u", None, password_hash=hash_password("x", n=CHEAP_N))
    previous = auth.get_user("u").password_hash
    auth.change_password("u", "changed")
    assert not auth.upgrade_password_hash("u", previous, hash_password("x", n=CHEAP_N))
    assert auth.authenticate("u", "changed") is not None


def test_the_same_login_in_flight_is_checked_once_and_not_refused():
    """A reconnect storm of one application (the same user and password from one address, more than the
    per-source bound at once) costs one check and every login gets its answer; RabbitMQ accepts it too.
    Before: all past the bound were refused with "too many logins pending"."""
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1, auth_max_pending_logins=3,
                                    auth_max_pending_logins_per_source=2)
        calls = _recorded(node)
        good = [asyncio.ensure_future(gate.check("guest", "guest", "10.0.0.1")) for _ in range(50)]
        bad = [asyncio.ensure_future(gate.check("guest", "nope", "10.0.0.1")) for _ in range(50)]
        await asyncio.sleep(0.05)
        assert gate.pending == 2  # one check each, both waiting on the pool's one thread
        release.set()
        assert all(r.user is not None for r in await asyncio.gather(*good))
        assert [(await f).reason for f in bad] == ["invalid credentials"] * 50
        assert sorted(calls) == ["guest", "nope"] and gate.pending == 0
        # a cancelled first login leaves the check to those still waiting for it
        release.clear()
        first = asyncio.ensure_future(gate.check("guest", "other", "10.0.0.1"))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(gate.check("guest", "other", "10.0.0.1"))
        await asyncio.sleep(0.01)
        first.cancel()
        release.set()
        assert (await second).reason == "invalid credentials"
        assert calls.count("other") == 1
        gate.close()

    asyncio.run(scenario())


def test_source_groups_are_ipv4_addresses_and_ipv6_slash_64s():
    assert source_group("10.0.0.1") == "10.0.0.1"
    assert source_group("2001:db8:1:2:aaaa::1") == source_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_group("2001:db8:1:3::1") != source_group("2001:db8:1:2::1")
    assert source_group("::ffff:10.0.0.7") == "10.0.0.7"
    assert source_group("fe80::1%eth0") == "fe80::/64"
    assert source_group("") == ""


def test_a_flood_from_a_few_sources_does_not_refuse_a_newcomer_and_the_pool_takes_turns():
    """Issue 21 item 4: wrong passwords from 3 sources fill the overall bound; a login from a fourth source
    takes the busiest source's newest place (that one is refused) and is checked within one round of the
    sources, not after every waiting login."""
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1, auth_max_pending_logins=9,
                                    auth_max_pending_logins_per_source=4)
        order = _recorded(node)
        flood = [asyncio.ensure_future(gate.check("guest", f"bad-{src}-{i}", f"10.0.0.{src}"))
                 for i in range(4) for src in (1, 2, 3)]
        await asyncio.sleep(0.05)
        assert gate.pending == 9  # three refused at once: the overall bound, no source waits 2 more
        refused = [f for f in flood if f.done()]
        assert len(refused) == 3 and all(f.result().reason == TOO_MANY_PENDING for f in refused)
        newcomer = asyncio.ensure_future(gate.check("guest", "guest", "10.0.0.4"))
        await asyncio.sleep(0.05)
        assert gate.pending == 9 and sum(f.done() for f in flood) == 4  # one flood login gave its place
        release.set()
        assert (await newcomer).user is not None
        await asyncio.gather(*flood)
        assert order.index("guest") <= 4  # one round: the running check, then at most one per other source
        assert gate.pending == 0
        gate.close()

    asyncio.run(scenario())


def test_a_queued_check_whose_logins_all_went_is_not_run():
    """A login queued behind others whose connection closes before its turn costs no scrypt."""
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1)
        checked = _recorded(node)
        running = asyncio.ensure_future(gate.check("guest", "first", "10.0.0.1"))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(gate.check("guest", "gone", "10.0.0.2"))
        await asyncio.sleep(0.05)
        queued.cancel()
        await asyncio.sleep(0.01)
        release.set()
        assert (await running).reason == "invalid credentials"
        assert (await gate.check("guest", "guest", "10.0.0.3")).user is not None
        assert checked == ["first", "guest"] and gate.pending == 0
        gate.close()

    asyncio.run(scenario())


def test_sources_with_refused_logins_wait_behind_clean_ones():
    """Issue 21 item 4: once a flood's sources have had SUSPECT_AFTER_FAILURES logins refused, a login
    from a source without failures is checked right after the check that is running; the suspect ones
    still get every (CLEAN_SHARE + 1)-th check."""
    async def scenario() -> None:
        gate, node, release = _gate(auth_hash_threads=1, auth_max_pending_logins=64,
                                    auth_max_pending_logins_per_source=8)
        release.set()
        for i in range(SUSPECT_AFTER_FAILURES):  # the flood's history: refusals from 10.0.0.1-3
            await asyncio.gather(*(gate.check("guest", f"old-{src}-{i}", f"10.0.0.{src}") for src in (1, 2, 3)))
        release.clear()
        order = _recorded(node)
        flood = [asyncio.ensure_future(gate.check("guest", f"bad-{src}-{i}", f"10.0.0.{src}"))
                 for i in range(4) for src in (1, 2, 3)]
        await asyncio.sleep(0.05)
        clean = [asyncio.ensure_future(gate.check("guest", "guest" if n == 0 else f"new-{n}", f"10.0.1.{n}"))
                 for n in range(CLEAN_SHARE + 1)]
        await asyncio.sleep(0.05)
        release.set()
        assert (await clean[0]).user is not None
        await asyncio.gather(*flood, *clean)
        assert order[1:CLEAN_SHARE + 1] == ["guest", "new-1", "new-2"]  # after the one running
        assert order[CLEAN_SHARE + 1].startswith("bad-") and order[CLEAN_SHARE + 2] == "new-3"
        gate.close()

    asyncio.run(scenario())


def test_a_rehash_is_recorded_as_that_change_and_undoes_none_made_elsewhere() -> None:
    """Two members (or workers) with the same users: a rehash on A is recorded as `RehashUser`, not A's
    whole auth store, so B, which meanwhile added a user, keeps it when it applies A's record (the lost
    update a whole `SetAuth` made: a user imported through one worker gone after a login on the other)."""
    a, b = (build_node(Config(data_dir="", node_name=f"{n}@localhost"), monitor_resources=False) for n in "ab")
    recorded: list[object] = []
    a._record = recorded.append  # type: ignore[method-assign]  # what a would replicate
    imported = import_password_hash(_rabbit_sha256("pw"), "rabbit_password_hashing_sha256")
    for node in (a, b):
        node.auth.add_user("imp", None, password_hash=imported)
    b.auth.add_user("new", "new-pw")  # committed meanwhile on the other member
    new_hash = hash_password("pw", n=CHEAP_N)
    assert a.password_rehashed("imp", imported, new_hash)
    assert not a.password_rehashed("imp", imported, new_hash)  # no longer the hash verified: nothing to do
    assert recorded == [RehashUser("imp", imported, new_hash)]
    b.apply_op(recorded[0])  # type: ignore[arg-type]
    assert b.auth.get_user("imp").password_hash == new_hash
    assert b.auth.get_user("new") is not None
    b.apply_op(RehashUser("new", "not its hash", new_hash))  # a password changed since: the change wins
    assert b.auth.get_user("new").password_hash != new_hash
