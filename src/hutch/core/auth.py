"""Users, password hashing, virtual hosts and permissions: the internal auth backend.

This module owns:

* password hashing (``hash_password`` / ``verify_password``) with scrypt and a bounded
  cache of successful verifications; RabbitMQ's salted SHA-256/SHA-512/MD5 hashes are
  accepted as imported (``import_password_hash`` / ``export_password_hash``) so that users
  moved from RabbitMQ keep their passwords;
* the ``AuthStore``: users, virtual hosts and per-(user, vhost) permissions, with the
  RabbitMQ rules for who may open which vhost and touch which resource;
* the small pure helpers the AMQP handshake needs: SASL PLAIN and AMQPLAIN decoding, the
  loopback test for the ``loopback_users`` rule, and RabbitMQ's refusal texts.

Rules (RabbitMQ's, see docs/access-control.md):

* A user may open a vhost only if it has a permission entry for it (even ``"" "" ""``).
* A permission is three regular expressions (configure, write, read) searched, unanchored,
  in the resource name. The empty expression matches nothing.
* For permission checks the default exchange (name ``""``) is called ``amq.default``.
* Empty passwords never authenticate.

No IO, no clocks. ``check_login`` costs ~40-50 ms of scrypt on a cache miss, for every refusal as for
a success (so timing reveals nothing); the runtime answers cached logins with ``authenticate_cached``
(one HMAC) on the event loop and runs ``check_login`` in its own bounded pool
(runtime/broker/logins.py), which is why the cache is guarded by a lock. Permission regexes are RE2
(core/patterns.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from hutch.amqp.errors import FrameError
from hutch.amqp.table import decode_table

from .patterns import PatternError, UserPattern, compile_pattern, compile_stored

__all__ = [
    "AUTH_SECTIONS",
    "DEFAULT_EXCHANGE_RESOURCE",
    "FULL_PERMISSION",
    "HUTCH_HASHING_ALGORITHM",
    "LoginCheck",
    "RABBIT_HASHING_ALGORITHMS",
    "SCRYPT_N",
    "AuthError",
    "AuthStore",
    "auth_diff",
    "auth_patch",
    "NoSuchUser",
    "NoSuchVhost",
    "Permission",
    "PermissionKind",
    "User",
    "UserExists",
    "UserPermission",
    "Vhost",
    "VhostExists",
    "clear_verify_cache",
    "export_password_hash",
    "hash_password",
    "import_password_hash",
    "is_cached",
    "is_loopback_address",
    "loopback_refused",
    "parse_amqplain",
    "parse_plain",
    "topic_permission_allows",
    "resource_access_refused_text",
    "vhost_access_refused_text",
    "validate_password_hash",
    "verify_password",
]

# --------------------------------------------------------------------------------------------
# Password hashing

SCRYPT_N = 2**14
"""scrypt CPU/memory cost used for new hashes (16 MiB, ~40-50 ms). Tests pass a smaller ``n``."""
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32
_SCHEME = "scrypt"

# Bounds on parameters read back from a stored hash, so that a corrupt or hostile definitions
# file cannot make one login allocate gigabytes or spin for minutes.
_MAX_N = 2**20
_MAX_R = 32
_MAX_P = 16

_DUMMY_SALT = secrets.token_bytes(SALT_BYTES)  # for the scrypt a refusal pays (AuthStore._pay_scrypt)

VERIFY_CACHE_MAX_ENTRIES = 1024
"""Bound on the successful-verification cache (one entry per distinct (hash, password))."""


def _b64encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    # OpenSSL refuses unless maxmem covers 128*r*(n + p + 2) bytes; give it exactly that plus slack.
    maxmem = 128 * r * (n + p + 2) + 1024 * 1024
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=dklen, maxmem=maxmem)


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    """Hash ``password`` with scrypt and a fresh 16-byte salt.

    Returns the self-describing form ``"scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>"``, so the
    cost can be raised later without breaking stored hashes. ``n`` exists for tests; the
    broker always uses the default ``SCRYPT_N`` (2**14).
    """
    if n < 2 or n & (n - 1) or n > _MAX_N:
        raise ValueError(f"scrypt n must be a power of two between 2 and {_MAX_N}, got {n}")
    salt = secrets.token_bytes(SALT_BYTES)
    key = _scrypt(password, salt, n, SCRYPT_R, SCRYPT_P, KEY_BYTES)
    return f"{_SCHEME}${n}${SCRYPT_R}${SCRYPT_P}${_b64encode(salt)}${_b64encode(key)}"


class _ParsedHash(NamedTuple):
    n: int
    r: int
    p: int
    salt: bytes
    key: bytes


def _parse_stored(stored: str) -> _ParsedHash:
    """Split a stored hash into its parts; ValueError if it is not one ``hash_password`` makes."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != _SCHEME:
        raise ValueError("password hash is not in the form 'scrypt$N$r$p$salt$hash'")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        key = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"malformed scrypt password hash: {exc}") from None
    if n < 2 or n & (n - 1) or n > _MAX_N or not 1 <= r <= _MAX_R or not 1 <= p <= _MAX_P:
        raise ValueError(f"scrypt parameters out of range in password hash: n={n} r={r} p={p}")
    if not salt or not 16 <= len(key) <= 64:
        raise ValueError("malformed scrypt password hash: bad salt or key length")
    return _ParsedHash(n, r, p, salt, key)


def validate_password_hash(stored: str) -> None:
    """Raise ValueError unless ``stored`` is a well-formed hash (used when loading definitions):
    hutch's scrypt form, or an imported RabbitMQ hash (``<algorithm>$<base64>``)."""
    if _is_rabbit_hash(stored):
        _parse_rabbit(stored)
    else:
        _parse_stored(stored)


# RabbitMQ's hashes (rabbit_password): base64(salt + H(salt + password)) with a 4-byte random salt,
# H named by the user's `hashing_algorithm`. Stored as "<algorithm>$<base64>" (base64 has no "$", and
# scrypt hashes start "scrypt$", so the forms cannot be confused); export gives back exactly what
# was imported. They are fast hashes: a user keeps one only until its password is next set.
HUTCH_HASHING_ALGORITHM = "hutch_password_hashing_scrypt"
RABBIT_HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": "sha256",
    "rabbit_password_hashing_sha512": "sha512",
    "rabbit_password_hashing_md5": "md5",
}
RABBIT_SALT_BYTES = 4


def _is_rabbit_hash(stored: str) -> bool:
    return stored.partition("$")[0] in RABBIT_HASHING_ALGORITHMS


def _rabbit_digest(algorithm: str, data: bytes) -> bytes:
    name = RABBIT_HASHING_ALGORITHMS[algorithm]
    return hashlib.new(name, data, usedforsecurity=name != "md5").digest()


def _parse_rabbit(stored: str) -> tuple[str, bytes, bytes]:
    """(algorithm, salt, digest) of a stored RabbitMQ hash; ValueError if malformed."""
    algorithm, _, encoded = stored.partition("$")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error):
        raise ValueError(f"password hash of {algorithm} is not valid base64") from None
    expected = RABBIT_SALT_BYTES + len(_rabbit_digest(algorithm, b""))
    if len(raw) != expected:
        raise ValueError(f"password hash of {algorithm} must decode to {expected} bytes "
                         f"(4-byte salt + digest), got {len(raw)}")
    return algorithm, raw[:RABBIT_SALT_BYTES], raw[RABBIT_SALT_BYTES:]


def import_password_hash(password_hash: str, hashing_algorithm: str) -> str | None:
    """The stored form of a user's ``password_hash`` and ``hashing_algorithm`` as a definitions
    export gives them: ``""`` is "no password" (None); hutch's scrypt hashes are kept as they are;
    RabbitMQ's ``rabbit_password_hashing_sha256``/``_sha512``/``_md5`` hashes (base64 of a 4-byte salt
    and H(salt + password)) become ``<algorithm>$<base64>``. ValueError if malformed or unknown."""
    if password_hash == "":
        return None
    if hashing_algorithm == HUTCH_HASHING_ALGORITHM:
        _parse_stored(password_hash)
        return password_hash
    if hashing_algorithm in RABBIT_HASHING_ALGORITHMS:
        stored = f"{hashing_algorithm}${password_hash}"
        _parse_rabbit(stored)
        return stored
    known = ", ".join([HUTCH_HASHING_ALGORITHM, *RABBIT_HASHING_ALGORITHMS])
    raise ValueError(f"unsupported hashing_algorithm '{hashing_algorithm}' (supported: {known})")


def export_password_hash(stored: str | None) -> tuple[str, str]:
    """(password_hash, hashing_algorithm) of a stored hash, as a definitions export shows them: the
    inverse of ``import_password_hash``. No password is ``("", HUTCH_HASHING_ALGORITHM)``."""
    if stored is None:
        return "", HUTCH_HASHING_ALGORITHM
    if _is_rabbit_hash(stored):
        algorithm, _, encoded = stored.partition("$")
        return encoded, algorithm
    return stored, HUTCH_HASHING_ALGORITHM


def _check_password(password: str, stored: str) -> bool:
    """The uncached check: scrypt, or an imported RabbitMQ hash. Malformed ``stored`` is False."""
    try:
        if _is_rabbit_hash(stored):
            algorithm, salt, digest = _parse_rabbit(stored)
            candidate = _rabbit_digest(algorithm, salt + password.encode("utf-8"))
            return hmac.compare_digest(candidate, digest)
        parsed = _parse_stored(stored)
    except ValueError:
        return False
    candidate = _scrypt(password, parsed.salt, parsed.n, parsed.r, parsed.p, len(parsed.key))
    return hmac.compare_digest(candidate, parsed.key)


# Cache of successful verifications. Key: HMAC-SHA256 under a per-process random secret of
# (stored hash, password). Value: None (presence is the fact). Insertion order = LRU order.
_verify_cache: OrderedDict[bytes, None] = OrderedDict()
_verify_cache_lock = threading.Lock()
_verify_cache_secret = secrets.token_bytes(32)


def _cache_key(password: str, stored: str) -> bytes:
    message = stored.encode("utf-8") + b"\x00" + password.encode("utf-8")
    return hmac.new(_verify_cache_secret, message, hashlib.sha256).digest()


def is_cached(password: str, stored: str) -> bool:
    """Has ``password`` verified against ``stored`` before (and is it still cached)? One HMAC."""
    key = _cache_key(password, stored)
    with _verify_cache_lock:
        if key in _verify_cache:
            _verify_cache.move_to_end(key)
            return True
    return False


def clear_verify_cache() -> None:
    """Forget every cached verification (tests; or after bulk credential changes)."""
    with _verify_cache_lock:
        _verify_cache.clear()


def verify_password(password: str, stored: str) -> bool:
    """True if ``password`` hashes to ``stored``. Malformed ``stored`` verifies nothing.

    ``stored`` is a scrypt hash or an imported RabbitMQ one (see ``import_password_hash``). The
    comparison uses ``hmac.compare_digest`` (constant time).

    Successful verifications are cached (LRU, ``VERIFY_CACHE_MAX_ENTRIES`` entries), so a
    thousand connections logging in as the same user pay the ~50 ms scrypt cost once, not a
    thousand times. Why this is safe:

    * Only *successes* are cached. A wrong guess always pays the full scrypt cost, so the
      cache does not speed up online guessing at all.
    * The key covers the stored hash, whose salt is fresh on every password change, so
      changing or clearing a password makes every old entry unreachable (they age out).
    * The key is an HMAC under a random per-process secret, not a bare hash of the password:
      the cache holds nothing an offline attacker could brute-force faster than the stored
      scrypt hashes themselves, and it is never persisted. (Anyone who can read this
      process's memory can read the plaintext passwords of arriving logins anyway.)
    * It is bounded, so unique passwords cannot grow it without limit.
    """
    if is_cached(password, stored):
        return True
    if not _check_password(password, stored):
        return False
    key = _cache_key(password, stored)
    with _verify_cache_lock:
        _verify_cache[key] = None
        _verify_cache.move_to_end(key)
        while len(_verify_cache) > VERIFY_CACHE_MAX_ENTRIES:
            _verify_cache.popitem(last=False)
    return True


# --------------------------------------------------------------------------------------------
# Model

PermissionKind = Literal["configure", "write", "read"]
_PERMISSION_KINDS: tuple[PermissionKind, ...] = ("configure", "write", "read")

DEFAULT_EXCHANGE_RESOURCE = "amq.default"
"""Name the default exchange ("") goes by in permission checks, as in RabbitMQ."""


@dataclass
class User:
    """An internal user. Invariant: ``password_hash`` is None, a ``hash_password`` output or an
    imported RabbitMQ hash (``validate_password_hash`` accepts it); None means the user cannot log
    in with a password."""

    name: str
    password_hash: str | None
    tags: list[str] = field(default_factory=list)


@dataclass
class Vhost:
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    default_queue_type: str = "classic"


def _compile_permission(kind: str, pattern: str, stored: bool) -> UserPattern | None:
    if pattern == "":
        return None
    try:
        return compile_stored(pattern, f"{kind} permission regex") if stored else compile_pattern(pattern)
    except PatternError as exc:
        raise ValueError(f"invalid {kind} permission regex '{pattern}': {exc.reason}") from None


@dataclass(frozen=True)
class Permission:
    """Three regular expressions over resource names (RabbitMQ semantics).

    A name is allowed when the expression is found anywhere in it (a search, unanchored:
    write ``^name$`` to match exactly). ``""`` matches nothing; ``.*`` matches everything.
    The expressions are RE2 (``hutch.core.patterns``: linear time in the name). An expression RE2
    refuses raises ValueError at construction, unless ``stored`` (it was accepted before: loaded
    from the definitions log or replicated metadata), when it is logged and matches nothing.
    """

    configure: str
    write: str
    read: str
    stored: bool = field(default=False, repr=False, compare=False)
    _compiled: tuple[UserPattern | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = tuple(_compile_permission(k, getattr(self, k), self.stored) for k in _PERMISSION_KINDS)
        object.__setattr__(self, "_compiled", compiled)

    def allows(self, kind: PermissionKind, resource_name: str) -> bool:
        try:
            pattern = self._compiled[_PERMISSION_KINDS.index(kind)]
        except ValueError:
            raise ValueError(f"unknown permission kind '{kind}': expected configure, write or read") from None
        return pattern is not None and pattern.search(resource_name)

    def to_dict(self) -> dict[str, str]:
        return {"configure": self.configure, "write": self.write, "read": self.read}


FULL_PERMISSION = ".*"


def topic_permission_allows(pattern: str, user: str, vhost: str, routing_key: str) -> bool:
    """RabbitMQ's topic authorisation of one routing key (check_topic_access): ``""`` means ``^$``,
    ``{username}`` and ``{vhost}`` are expanded, then the pattern is searched in the key. RE2, so
    linear in the key; compiled patterns are cached (core/patterns.py). An expanded pattern RE2
    refuses (patterns are checked when set, but a user name can make one) allows nothing."""
    expanded = (pattern or "^$").replace("{username}", user).replace("{vhost}", vhost)
    try:
        return compile_pattern(expanded).search(routing_key)
    except PatternError:
        return False


class LoginOutcome(NamedTuple):
    """A login's answer (runtime/broker/logins.py): the user (None: refused) and, when refused, why (for
    the log; the client gets the generic text)."""

    user: User | None
    reason: str = ""


class LoginCheck(NamedTuple):
    """What ``AuthStore.check_login`` found: the user (None: refused), and for a user whose stored
    hash is an imported RabbitMQ one, the scrypt hash that should replace it (``rehash``), valid
    while the stored hash is still ``previous_hash``."""

    user: User | None
    previous_hash: str | None = None
    rehash: str | None = None


class UserPermission(NamedTuple):
    user: str
    vhost: str
    permission: Permission


# --------------------------------------------------------------------------------------------
# Errors (texts follow rabbitmqctl's)


class AuthError(Exception):
    """Base of the user/vhost management errors."""


class NoSuchUser(AuthError):
    def __init__(self, name: str) -> None:
        super().__init__(f'User "{name}" does not exist')
        self.name = name


class UserExists(AuthError):
    def __init__(self, name: str) -> None:
        super().__init__(f'User "{name}" already exists')
        self.name = name


class NoSuchVhost(AuthError):
    def __init__(self, name: str) -> None:
        super().__init__(f'Virtual host "{name}" does not exist')
        self.name = name


class VhostExists(AuthError):
    def __init__(self, name: str) -> None:
        super().__init__(f'Virtual host "{name}" already exists')
        self.name = name


def vhost_access_refused_text(user: str, vhost: str) -> str:
    """Text of the 530 NOT_ALLOWED sent when ``can_access_vhost`` is false."""
    return f"access to vhost '{vhost}' refused for user '{user}'"


def resource_access_refused_text(
    user: str, vhost: str, kind: PermissionKind, resource_type: str, resource_name: str
) -> str:
    """Text of the 403 ACCESS_REFUSED sent when ``check`` is false, e.g.
    "configure access to queue 'q' in vhost '/' refused for user 'bob'"."""
    if resource_type == "exchange" and resource_name == "":
        resource_name = DEFAULT_EXCHANGE_RESOURCE
    return f"{kind} access to {resource_type} '{resource_name}' in vhost '{vhost}' refused for user '{user}'"


# --------------------------------------------------------------------------------------------
# The store


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string")


class AuthStore:
    """Users, vhosts and permissions held in memory; ``to_dict``/``from_dict`` for persistence.

    Invariants: every permission key (user, vhost) names an existing user and vhost
    (deleting either deletes its permissions); user and vhost names are non-empty.
    Not thread-safe for mutation: mutate from one thread (the event loop); ``authenticate``
    only reads, so it may run in an executor thread.
    """

    def __init__(self, *, scrypt_n: int = SCRYPT_N) -> None:
        self._scrypt_n = scrypt_n
        self._users: dict[str, User] = {}
        self._vhosts: dict[str, Vhost] = {}
        self._permissions: dict[tuple[str, str], Permission] = {}

    # -- bootstrap --------------------------------------------------------------------------

    def bootstrap(
        self, default_user: str = "guest", default_pass: str = "guest", default_vhost: str = "/"
    ) -> None:
        """First-boot state: the default vhost, the default user tagged ``administrator``
        with ``.* .* .*`` on it. Existing entries are kept (safe to call on every boot of an
        empty store, harmless on a populated one)."""
        if not self.has_vhost(default_vhost):
            self.add_vhost(default_vhost, description="Default virtual host")
        if default_user not in self._users:
            self.add_user(default_user, default_pass, tags=("administrator",))
            self.set_permissions(
                default_user, default_vhost, FULL_PERMISSION, FULL_PERMISSION, FULL_PERMISSION
            )

    # -- users ------------------------------------------------------------------------------

    def add_user(
        self,
        name: str,
        password: str | None,
        tags: Iterable[str] = (),
        *,
        password_hash: str | None = None,
    ) -> User:
        """Create a user. ``password`` None or "" means no password login (RabbitMQ refuses
        blank passwords anyway). ``password_hash`` imports an existing hash instead."""
        _check_name("user", name)
        if name in self._users:
            raise UserExists(name)
        if password_hash is not None:
            validate_password_hash(password_hash)
            stored: str | None = password_hash
        else:
            stored = self._hash(password)
        user = User(name=name, password_hash=stored, tags=list(tags))
        self._users[name] = user
        return user

    def delete_user(self, name: str) -> None:
        """Delete a user and all its permissions. NoSuchUser if absent."""
        self._require_user(name)
        del self._users[name]
        for key in [k for k in self._permissions if k[0] == name]:
            del self._permissions[key]

    def change_password(self, name: str, password: str | None) -> None:
        self._require_user(name).password_hash = self._hash(password)

    def clear_password(self, name: str) -> None:
        self._require_user(name).password_hash = None

    def set_password_hash(self, name: str, password_hash: str | None) -> None:
        """Replace the stored hash (None: no password login); ValueError if it is malformed."""
        user = self._require_user(name)
        if password_hash is not None:
            validate_password_hash(password_hash)
        user.password_hash = password_hash

    def set_user_tags(self, name: str, tags: Iterable[str]) -> None:
        self._require_user(name).tags = list(tags)

    def list_users(self) -> list[User]:
        return sorted(self._users.values(), key=lambda u: u.name)

    def get_user(self, name: str) -> User | None:
        return self._users.get(name)

    def authenticate(self, name: str, password: str) -> User | None:
        """The user if ``password`` is right, else None (unknown user, no password, blank or
        wrong password). ``check_login`` without the re-hash; see there for the cost."""
        return self.check_login(name, password).user

    def authenticate_cached(self, name: str, password: str) -> User | None:
        """The user if this (user, password) verified before and is still in the verification
        cache, else None ("not known here": call ``check_login``). Costs one HMAC, no scrypt: the
        runtime answers it on the event loop, so cached logins never wait behind failed ones."""
        user = self._users.get(name)
        if user is None or user.password_hash is None or password == "":
            return None
        return user if is_cached(password, user.password_hash) else None

    def check_login(self, name: str, password: str) -> LoginCheck:
        """The full check, ~40-50 ms of scrypt (call it from an executor thread).

        Every refusal costs what a wrong password costs, so timing tells nothing about which
        user names exist or how a password is stored: an unknown user, a user without a
        password, a blank password, and a wrong password against an imported RabbitMQ hash (a
        fast hash) each pay one scrypt at this store's cost. A right password against an
        imported RabbitMQ hash returns the scrypt hash that replaces it (``LoginCheck.rehash``;
        the runtime stores it with ``upgrade_password_hash``), which costs the same scrypt.
        """
        user = self._users.get(name)
        stored = user.password_hash if user is not None else None
        if user is None or stored is None or password == "":
            self._pay_scrypt(password)
            return LoginCheck(None)
        if not _is_rabbit_hash(stored):
            return LoginCheck(user if verify_password(password, stored) else None)
        if not verify_password(password, stored):
            self._pay_scrypt(password)
            return LoginCheck(None)
        return LoginCheck(user, previous_hash=stored, rehash=hash_password(password, n=self._scrypt_n))

    def upgrade_password_hash(self, name: str, previous_hash: str, new_hash: str) -> bool:
        """Replace a user's hash by ``new_hash`` if it is still ``previous_hash`` (a password change
        since the login wins); True if replaced. Runs on the event loop, which owns mutation."""
        user = self._users.get(name)
        if user is None or user.password_hash != previous_hash:
            return False
        validate_password_hash(new_hash)
        user.password_hash = new_hash
        return True

    # -- vhosts -----------------------------------------------------------------------------

    def add_vhost(
        self,
        name: str,
        description: str = "",
        tags: Iterable[str] = (),
        default_queue_type: str = "classic",
    ) -> Vhost:
        _check_name("vhost", name)
        if name in self._vhosts:
            raise VhostExists(name)
        vhost = Vhost(
            name=name, description=description, tags=list(tags), default_queue_type=default_queue_type
        )
        self._vhosts[name] = vhost
        return vhost

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost and every permission on it. NoSuchVhost if absent."""
        self._require_vhost(name)
        del self._vhosts[name]
        for key in [k for k in self._permissions if k[1] == name]:
            del self._permissions[key]

    def list_vhosts(self) -> list[Vhost]:
        return sorted(self._vhosts.values(), key=lambda v: v.name)

    def get_vhost(self, name: str) -> Vhost | None:
        return self._vhosts.get(name)

    def has_vhost(self, name: str) -> bool:
        return name in self._vhosts

    # -- permissions ------------------------------------------------------------------------

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str, *,
                        stored: bool = False) -> Permission:
        """Replace the user's permissions on the vhost. ValueError on an invalid regex (unless
        ``stored``: see ``Permission``)."""
        self._require_user(user)
        self._require_vhost(vhost)
        permission = Permission(configure, write, read, stored=stored)
        self._permissions[(user, vhost)] = permission
        return permission

    def clear_permissions(self, user: str, vhost: str) -> None:
        """Remove the entry (idempotent once user and vhost exist)."""
        self._require_user(user)
        self._require_vhost(vhost)
        self._permissions.pop((user, vhost), None)

    def get_permissions(self, user: str, vhost: str) -> Permission | None:
        return self._permissions.get((user, vhost))

    def list_permissions(self, vhost: str | None = None, user: str | None = None) -> list[UserPermission]:
        """Entries filtered by vhost and/or user, sorted by (user, vhost)."""
        return [
            UserPermission(u, v, p)
            for (u, v), p in sorted(self._permissions.items())
            if (vhost is None or v == vhost) and (user is None or u == user)
        ]

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        """True if the user has any permission entry on the vhost (RabbitMQ's rule)."""
        return (user, vhost) in self._permissions and vhost in self._vhosts

    def check(
        self,
        user: str,
        vhost: str,
        kind: PermissionKind,
        resource_name: str,
        resource_type: str = "exchange",
    ) -> bool:
        """May ``user`` do ``kind`` on the named resource in ``vhost``?

        An exchange named ``""`` (the default exchange) is checked as ``amq.default``.
        No entry for (user, vhost) means no.
        """
        permission = self._permissions.get((user, vhost))
        if permission is None:
            return False
        if resource_name == "" and resource_type == "exchange":
            resource_name = DEFAULT_EXCHANGE_RESOURCE
        return permission.allows(kind, resource_name)

    # -- persistence ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able snapshot, shaped like a RabbitMQ definitions export."""
        return {
            "version": 1,
            "users": [
                {"name": u.name, "password_hash": u.password_hash, "tags": list(u.tags)}
                for u in self.list_users()
            ],
            "vhosts": [
                {
                    "name": v.name,
                    "description": v.description,
                    "tags": list(v.tags),
                    "default_queue_type": v.default_queue_type,
                }
                for v in self.list_vhosts()
            ],
            "permissions": [
                {"user": e.user, "vhost": e.vhost, **e.permission.to_dict()} for e in self.list_permissions()
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, scrypt_n: int = SCRYPT_N) -> AuthStore:
        """Rebuild a store from ``to_dict`` output. ValueError (or an AuthError) if it is
        inconsistent: a bad hash, a duplicate, a permission naming a missing user. A stored regex
        RE2 refuses is logged and matches nothing (``Permission``), so a node always starts."""
        store = cls(scrypt_n=scrypt_n)
        try:
            for v in data.get("vhosts", []):
                store.add_vhost(
                    v["name"],
                    description=v.get("description", ""),
                    tags=v.get("tags", []),
                    default_queue_type=v.get("default_queue_type", "classic"),
                )
            for u in data.get("users", []):
                store.add_user(u["name"], None, tags=u.get("tags", []), password_hash=u.get("password_hash"))
            for p in data.get("permissions", []):
                store.set_permissions(p["user"], p["vhost"], p["configure"], p["write"], p["read"], stored=True)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed auth definitions: {exc!r}") from None
        return store

    # -- internals --------------------------------------------------------------------------

    def _hash(self, password: str | None) -> str | None:
        if password is None or password == "":
            return None
        return hash_password(password, n=self._scrypt_n)

    def _pay_scrypt(self, password: str) -> None:
        """Spend exactly what verifying a hash of this store's cost spends, and discard it."""
        _scrypt(password, _DUMMY_SALT, self._scrypt_n, SCRYPT_R, SCRYPT_P, KEY_BYTES)

    def _require_user(self, name: str) -> User:
        user = self._users.get(name)
        if user is None:
            raise NoSuchUser(name)
        return user

    def _require_vhost(self, name: str) -> Vhost:
        vhost = self._vhosts.get(name)
        if vhost is None:
            raise NoSuchVhost(name)
        return vhost


# --------------------------------------------------------------------------------------------
# Loopback rule


def is_loopback_address(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped ::ffff:127.x.y.z. Accepts ``[::1]`` and a
    ``%zone`` suffix. Anything that is not an IP address (including "localhost") is False:
    this judges socket peer addresses, never names."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def loopback_refused(user: str, peer_host: str, loopback_users: Iterable[str]) -> bool:
    """True if ``user`` may log in only from loopback and ``peer_host`` is not loopback."""
    return user in set(loopback_users) and not is_loopback_address(peer_host)


# --------------------------------------------------------------------------------------------
# SASL responses


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not valid UTF-8") from None


def parse_plain(response: bytes) -> tuple[str, str]:
    """Decode a SASL PLAIN response ``authzid NUL authcid NUL passwd`` into (user, password).

    The authorization identity is ignored (clients send it empty). ValueError unless there are
    exactly two NULs and both fields are UTF-8.
    """
    parts = bytes(response).split(b"\x00")
    if len(parts) != 3:
        raise ValueError("PLAIN response must be 'authzid\\0user\\0password'")
    return _utf8(parts[1], "PLAIN user name"), _utf8(parts[2], "PLAIN password")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """Decode an AMQPLAIN response into (user, password).

    The response is an AMQP field table *without* its 4-byte length prefix, decoded with the
    protocol's own table codec. LOGIN and PASSWORD must be present as longstr ('S') or byte array
    ('x') values; other entries are ignored. ValueError on anything else.
    """
    raw = bytes(response)
    try:
        table, _ = decode_table(struct.pack(">I", len(raw)) + raw, 0)
    except FrameError as exc:
        raise ValueError(f"malformed AMQPLAIN response: {exc}") from None
    found: dict[str, str] = {}
    for key in ("LOGIN", "PASSWORD"):
        value = table.get(key)
        if value is None:
            raise ValueError("AMQPLAIN response is missing the LOGIN or PASSWORD field")
        if isinstance(value, bytes):
            value = _utf8(value, f"AMQPLAIN {key}")
        if not isinstance(value, str):
            raise ValueError(f"AMQPLAIN field '{key}' must be a longstr, got {type(value).__name__}")
        found[key] = value
    return found["LOGIN"], found["PASSWORD"]


# -- changes between two snapshots (replicated as `definition_ops.PatchAuth`) ---------------------------

AUTH_SECTIONS = ("vhosts", "users", "permissions")
"""The sections of `AuthStore.to_dict()` a change names, in the order a patched snapshot lists them."""


def _auth_key(section: str, entry: dict[str, Any]) -> tuple[str, ...]:
    return (entry["user"], entry["vhost"]) if section == "permissions" else (entry["name"],)


def _auth_entries(doc: dict[str, Any]) -> dict[str, dict[tuple[str, ...], dict[str, Any]]]:
    return {s: {_auth_key(s, e): e for e in doc.get(s, [])} for s in AUTH_SECTIONS}


def auth_diff(before: dict[str, Any], after: dict[str, Any]) -> list[list[Any]]:
    """The changes that turn snapshot `before` into `after` (both `AuthStore.to_dict()` output), one per
    user, vhost or permission entry: `[section, key, entry]` where it was added or changed, `[section, key,
    None]` where it was removed (key: `[name]`, or `[user, vhost]` for a permission). Two members that
    change different entries at once then both keep both changes (a whole snapshot from each would undo the
    other's)."""
    old, new = _auth_entries(before), _auth_entries(after)
    changes: list[list[Any]] = []
    for section in AUTH_SECTIONS:
        was, now = old[section], new[section]
        changes += [[section, list(k), e] for k, e in now.items() if was.get(k) != e]
        changes += [[section, list(k), None] for k in was if k not in now]
    return changes


def auth_patch(doc: dict[str, Any], changes: list[Any]) -> dict[str, Any]:
    """`doc` (an `AuthStore.to_dict()` snapshot) with `changes` (`auth_diff`'s) applied: a new snapshot,
    in which a permission whose user or vhost is gone (one member deleted the user while another set its
    permissions) is left out, as deleting the user would have removed it. ValueError on a malformed change
    (the same on every member, so all of them refuse it alike)."""
    entries = _auth_entries(doc)
    for change in changes:
        if not (isinstance(change, list | tuple) and len(change) == 3 and change[0] in AUTH_SECTIONS
                and isinstance(change[1], list | tuple) and all(isinstance(k, str) for k in change[1])):
            raise ValueError(f"malformed auth change {change!r:.200}")
        section, key, entry = change[0], tuple(change[1]), change[2]
        if entry is None:
            entries[section].pop(key, None)
        elif not isinstance(entry, dict) or _auth_key(section, entry) != key:
            raise ValueError(f"malformed auth change {change!r:.200}")
        else:
            entries[section][key] = entry
    users, vhosts = entries["users"], entries["vhosts"]
    permissions = {k: e for k, e in entries["permissions"].items() if (k[0],) in users and (k[1],) in vhosts}
    return {"version": doc.get("version", 1),
            "vhosts": [vhosts[k] for k in sorted(vhosts)],
            "users": [users[k] for k in sorted(users)],
            "permissions": [permissions[k] for k in sorted(permissions)]}
