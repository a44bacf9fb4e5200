"""Password checks of AMQP and HTTP logins, off the event loop and bounded.

Owns: `LoginGate`, the one way the runtime (the AMQP handshake, the management API) checks a user
name and password: its own thread pool for scrypt (never the loop's shared default executor, which
storage and definitions imports also use), the count of uncached logins waiting for that pool in all
and per source address, and storing the scrypt hash that replaces an imported RabbitMQ hash after its
first successful login.

Rules (docs/security.md, "Authentication"):
- A login whose (user, password) verified before is answered on the loop from the verification cache
  (one HMAC, `AuthStore.authenticate_cached`): it never waits behind failed logins in the pool.
- Any other login costs one scrypt in the pool (`AuthStore.check_login`; refusals cost the same).
- Logins with the same (user, password) as a check in flight wait for that check's answer instead of
  starting their own (a reconnect storm of one application after a restart costs one scrypt, not one
  per connection, and is not refused by the bounds below; RabbitMQ accepts such a storm too). The
  in-flight table is keyed by an HMAC under a per-process random key, never the password itself.
- At most `auth_max_pending_logins` uncached logins wait for or run in the pool at once, and at most
  `auth_max_pending_logins_per_source` from one source (an IPv4 address, or an IPv6 /64: one host holds
  a whole /64). Past the per-source bound a login is refused at once, as a wrong password is (RabbitMQ's
  403 / HTTP 401).
- Fair queuing (issue 21: 10 addresses x 8 threads of wrong passwords refused 10 of 10 first logins of
  valid users, and after a restart nothing is cached): waiting logins queue per source and the pool takes
  them round-robin over the sources, so a login from a source that is not flooding waits for at most one
  check per busy source. When the overall bound is reached, a login from a source with fewer waiting
  than the busiest one takes the place of the busiest source's newest waiting login (which is refused);
  only when every source waits equally is the newcomer refused. A flood from N sources thus costs a
  well-behaved client one place in a round of N + 1, never its login.
- Suspect sources go second: a source with `SUSPECT_AFTER_FAILURES` refused logins since its last
  successful one (remembered for the `FAILURE_SOURCES` most recent sources) waits in a second ring,
  served only every `CLEAN_SHARE + 1`-th check while clean sources wait. A flood's sources turn suspect
  after a few checks each, so a valid client's first login (no failures behind it) waits for the check
  running and the other clean sources, not for the flood.
- A re-hash (imported RabbitMQ hash to scrypt) is stored on the loop, only if the user's hash is still
  the one verified, and recorded as that one change (`Node.password_rehashed`: the definitions log, or
  the metadata Raft group of a cluster, as a `RehashUser` record: a whole auth document would undo what
  another member committed meanwhile).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hutch.core.auth import LoginOutcome
from hutch.core.logsafe import safe

if TYPE_CHECKING:
    from hutch.config import Config
    from hutch.core.auth import AuthStore, LoginCheck

log = logging.getLogger("hutch.auth")

TOO_MANY_PENDING = "too many logins pending"
SUSPECT_AFTER_FAILURES = 3  # refused logins since the source's last successful one
FAILURE_SOURCES = 4096  # sources whose failures are remembered (the oldest forgotten first)
CLEAN_SHARE = 3  # clean sources' checks for one suspect source's check, while both wait


def default_hash_threads() -> int:
    """Half the CPUs, at least one: scrypt releases the GIL, so each thread is a busy core."""
    return max(1, (os.cpu_count() or 2) // 2)


class LoginNode(Protocol):
    """What the gate needs of its node (the broker's Node): its settings, its current auth store (a
    cluster replaces it as metadata is applied) and the store and record of a re-hash."""

    config: Config
    auth: AuthStore

    def password_rehashed(self, user: str, previous_hash: str, new_hash: str) -> bool: ...


class _Evicted(Exception):
    """A waiting login whose place went to a source with fewer waiting (the overall bound was reached)."""


@dataclass(slots=True, eq=False)
class _Waiting:
    """One check, queued or running, and how many logins wait for its answer. A queued check nobody
    waits for any more (their connections closed) is dropped instead of run."""

    key: bytes
    user: str
    password: str = field(repr=False)
    source: str
    answer: asyncio.Future[LoginCheck]
    waiters: int = 0


def source_group(address: str) -> str:
    """The unit of fairness and of the per-source bound: an IPv4 address, or the /64 of an IPv6 one
    (an IPv4-mapped IPv6 address is its IPv4 address); anything else (a Unix socket's "") as it is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class LoginGate:
    """Checks logins for one node. Invariants: `_pending` is the sum of `_pending_by_source` (waiting
    and running checks, by source group); `_queues` holds only non-empty queues, and `_turns` and
    `_suspect_turns` together name each of them once; at most `_threads` checks run in `_executor`."""

    def __init__(self, node: LoginNode) -> None:
        cfg = node.config
        self._node = node
        self._threads = cfg.auth_hash_threads or default_hash_threads()
        self._max_pending = cfg.auth_max_pending_logins
        self._max_per_source = cfg.auth_max_pending_logins_per_source
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0
        self._pending_by_source: dict[str, int] = {}
        self._queues: dict[str, deque[_Waiting]] = {}  # source group -> its logins waiting for the pool
        self._turns: deque[str] = deque()  # clean source groups with waiting logins, round-robin
        self._suspect_turns: deque[str] = deque()  # the same for suspect ones (SUSPECT_AFTER_FAILURES)
        self._failures: OrderedDict[str, int] = OrderedDict()  # group -> refusals since its last success
        self._clean_in_row = 0
        self._running = 0
        self._inflight: dict[bytes, _Waiting] = {}
        self._key = os.urandom(32)

    @property
    def pending(self) -> int:
        return self._pending

    async def check(self, user: str, password: str, source: str) -> LoginOutcome:
        """Authenticate `user`; `source` is the client's address (fairness and the per-source bound)."""
        auth = self._node.auth
        cached = auth.authenticate_cached(user, password)
        if cached is not None:
            return LoginOutcome(cached)
        key = hmac.new(self._key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()
        entry = self._inflight.get(key)  # the same (user, password) is being checked: its answer is ours
        if entry is None:
            entry = self._enqueue(key, user, password, source_group(source))
            if entry is None:
                return LoginOutcome(None, TOO_MANY_PENDING)
        entry.waiters += 1
        try:
            result = await asyncio.shield(entry.answer)
        except _Evicted:
            return LoginOutcome(None, TOO_MANY_PENDING)
        finally:
            entry.waiters -= 1
        return LoginOutcome(result.user) if result.user is not None else LoginOutcome(None, "invalid credentials")

    def _enqueue(self, key: bytes, user: str, password: str, group: str) -> _Waiting | None:
        """Queue one check for the pool (None: refused by the bounds), listed in flight under `key` until
        it is answered (also when this login is cancelled first: others may wait for it). The pool starts
        it on a later turn of the loop, once the caller waits for it."""
        mine = self._pending_by_source.get(group, 0)
        if mine >= self._max_per_source:
            return None
        if self._pending >= self._max_pending and not self._evict_for(mine):
            return None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[LoginCheck] = loop.create_future()
        entry = _Waiting(key, user, password, group, answer)
        answer.add_done_callback(lambda _f: self._forget(key, entry))
        self._inflight[key] = entry
        self._pending += 1
        self._pending_by_source[group] = mine + 1
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = deque()
            self._ring(group).append(group)
        queue.append(entry)
        loop.call_soon(self._pump)
        return entry

    def _evict_for(self, waiting: int) -> bool:
        """Make room for a source with `waiting` logins: refuse the newest waiting login of the source
        with the most waiting, if it has at least two more. False when no source has."""
        busiest = max(self._queues, key=lambda g: len(self._queues[g]), default=None)
        if busiest is None or len(self._queues[busiest]) < waiting + 2:
            return False
        evicted = self._queues[busiest].pop()
        self._release(busiest)
        if not evicted.answer.done():
            evicted.answer.set_exception(_Evicted())
            evicted.answer.exception()  # retrieved: a login that was cancelled meanwhile logs nothing
        return True

    def _ring(self, group: str) -> deque[str]:
        suspect = self._failures.get(group, 0) >= SUSPECT_AFTER_FAILURES
        return self._suspect_turns if suspect else self._turns

    def _next_group(self) -> str:
        """The source whose turn it is: clean ones first, a suspect one every CLEAN_SHARE + 1 checks."""
        if self._turns and (not self._suspect_turns or self._clean_in_row < CLEAN_SHARE):
            self._clean_in_row += 1
            return self._turns.popleft()
        self._clean_in_row = 0
        return self._suspect_turns.popleft()

    def _pump(self) -> None:
        """Start waiting checks while the pool has a free thread, one source at a time, round-robin."""
        while self._running < self._threads and (self._turns or self._suspect_turns):
            group = self._next_group()
            queue = self._queues[group]
            item = queue.popleft()
            if queue:
                self._ring(group).append(group)
            else:
                del self._queues[group]
            if item.waiters == 0:  # every login waiting for it is gone (connection closed): not worth a hash
                self._release(group)
                item.answer.cancel()
                continue
            self._running += 1
            check = asyncio.get_running_loop().run_in_executor(self._pool(), self._node.auth.check_login,
                                                               item.user, item.password)
            check.add_done_callback(functools.partial(self._finished, item))

    def _finished(self, item: _Waiting, check: asyncio.Future[LoginCheck]) -> None:
        self._running -= 1
        self._release(item.source)
        if check.cancelled():  # the pool was shut down (node stopping)
            if not item.answer.done():
                item.answer.cancel()
        elif (exc := check.exception()) is not None:
            if not item.answer.done():
                item.answer.set_exception(exc)
        else:
            result = check.result()
            self._count(item.source, result.user is not None)
            if result.user is not None and result.rehash is not None and result.previous_hash is not None:
                self._store_rehash(item.user, result.previous_hash, result.rehash)
            if not item.answer.done():
                item.answer.set_result(result)
        self._pump()

    def _count(self, group: str, succeeded: bool) -> None:
        """Remember a source's refusals since its last successful login (bounded: FAILURE_SOURCES)."""
        if succeeded:
            self._failures.pop(group, None)
            return
        self._failures[group] = self._failures.get(group, 0) + 1
        self._failures.move_to_end(group)
        if len(self._failures) > FAILURE_SOURCES:
            self._failures.popitem(last=False)

    def _forget(self, key: bytes, entry: _Waiting) -> None:
        if self._inflight.get(key) is entry:
            del self._inflight[key]

    def close(self) -> None:
        """Stop the pool (node shutdown); checks in flight finish, nothing new starts."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="hutch-login")
        return self._executor

    def _release(self, group: str) -> None:
        self._pending -= 1
        left = self._pending_by_source[group] - 1
        if left:
            self._pending_by_source[group] = left
        else:
            del self._pending_by_source[group]
        assert self._pending >= 0 and self._pending == sum(self._pending_by_source.values())

    def _store_rehash(self, user: str, previous_hash: str, new_hash: str) -> None:
        if self._node.password_rehashed(user, previous_hash, new_hash):  # recorded (and replicated)
            log.info("user '%s': imported RabbitMQ password hash replaced by scrypt on first login", safe(user))


__all__ = ["TOO_MANY_PENDING", "LoginGate", "LoginNode", "LoginOutcome", "default_hash_threads", "source_group"]
