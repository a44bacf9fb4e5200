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
  `auth_max_pending_logins_per_source` from one source address. Past either bound a login is refused
  at once, as a wrong password is (RabbitMQ's 403 / HTTP 401): a flood of bad logins costs the node at
  most the pool's threads, and a cached or a well-behaved client is not queued behind it.
- A re-hash (imported RabbitMQ hash to scrypt) is stored on the loop, only if the user's hash is still
  the one verified, and recorded like a password change (`Node.permissions_changed`: the definitions
  log, or the metadata Raft group of a cluster).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from hutch.core.auth import LoginOutcome
from hutch.core.logsafe import safe

if TYPE_CHECKING:
    from hutch.config import Config
    from hutch.core.auth import AuthStore, LoginCheck

log = logging.getLogger("hutch.auth")

TOO_MANY_PENDING = "too many logins pending"


def default_hash_threads() -> int:
    """Half the CPUs, at least one: scrypt releases the GIL, so each thread is a busy core."""
    return max(1, (os.cpu_count() or 2) // 2)


class LoginNode(Protocol):
    """What the gate needs of its node (the broker's Node): its settings, its current auth store (a
    cluster replaces it as metadata is applied) and the record of an auth change."""

    config: Config
    auth: AuthStore

    def permissions_changed(self) -> None: ...


class LoginGate:
    """Checks logins for one node. Invariant: `_pending` is the sum of `_pending_by_source`, and both
    count exactly the checks submitted to `_executor` and not yet finished."""

    def __init__(self, node: LoginNode) -> None:
        cfg = node.config
        self._node = node
        self._threads = cfg.auth_hash_threads or default_hash_threads()
        self._max_pending = cfg.auth_max_pending_logins
        self._max_per_source = cfg.auth_max_pending_logins_per_source
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0
        self._pending_by_source: dict[str, int] = {}
        self._inflight: dict[bytes, asyncio.Future[LoginCheck]] = {}
        self._key = os.urandom(32)

    @property
    def pending(self) -> int:
        return self._pending

    async def check(self, user: str, password: str, source: str) -> LoginOutcome:
        """Authenticate `user`; `source` is the client's address (the per-source bound)."""
        auth = self._node.auth
        cached = auth.authenticate_cached(user, password)
        if cached is not None:
            return LoginOutcome(cached)
        key = hmac.new(self._key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()
        same = self._inflight.get(key)
        if same is not None:  # the same (user, password) is being checked: its answer is ours
            result = await asyncio.shield(same)
        elif self._pending >= self._max_pending or self._pending_by_source.get(source, 0) >= self._max_per_source:
            return LoginOutcome(None, TOO_MANY_PENDING)
        else:
            result = await self._check_in_pool(key, user, password, source)
        return LoginOutcome(result.user) if result.user is not None else LoginOutcome(None, "invalid credentials")

    async def _check_in_pool(self, key: bytes, user: str, password: str, source: str) -> LoginCheck:
        """One scrypt check in the pool, listed in flight under `key` until it finishes (also when this
        login is cancelled first: others may wait for it); stores the re-hash of a verified import."""
        self._acquire(source)
        loop = asyncio.get_running_loop()
        check = loop.run_in_executor(self._pool(), self._node.auth.check_login, user, password)
        self._inflight[key] = check
        try:
            result = await asyncio.shield(check)
        finally:
            self._release(source)
            if check.done():
                self._forget(key, check)
            else:  # this login was cancelled (its connection closed); others may still wait for the check
                check.add_done_callback(lambda _f: self._forget(key, check))
        if result.user is not None and result.rehash is not None and result.previous_hash is not None:
            self._store_rehash(user, result.previous_hash, result.rehash)
        return result

    def _forget(self, key: bytes, check: asyncio.Future[LoginCheck]) -> None:
        if self._inflight.get(key) is check:
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

    def _acquire(self, source: str) -> None:
        self._pending += 1
        self._pending_by_source[source] = self._pending_by_source.get(source, 0) + 1

    def _release(self, source: str) -> None:
        self._pending -= 1
        left = self._pending_by_source[source] - 1
        if left:
            self._pending_by_source[source] = left
        else:
            del self._pending_by_source[source]
        assert self._pending >= 0 and self._pending == sum(self._pending_by_source.values())

    def _store_rehash(self, user: str, previous_hash: str, new_hash: str) -> None:
        if self._node.auth.upgrade_password_hash(user, previous_hash, new_hash):
            self._node.permissions_changed()  # recorded (and replicated) like a password change
            log.info("user '%s': imported RabbitMQ password hash replaced by scrypt on first login", safe(user))


__all__ = ["TOO_MANY_PENDING", "LoginGate", "LoginNode", "LoginOutcome", "default_hash_threads"]
