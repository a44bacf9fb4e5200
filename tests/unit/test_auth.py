"""Pure tests of hutch.core.auth: hashing, the store, permission semantics, SASL decoding."""

from __future__ import annotations

import json
import struct

import pytest

from hutch.core import auth
from hutch.core.auth import (
    AuthError,
    AuthStore,
    NoSuchUser,
    NoSuchVhost,
    Permission,
    UserExists,
    VhostExists,
    hash_password,
    is_loopback_address,
    loopback_refused,
    parse_amqplain,
    parse_plain,
    resource_access_refused_text,
    verify_password,
    vhost_access_refused_text,
)

CHEAP_N = 2**4  # scrypt cost for tests; the broker uses auth.SCRYPT_N


@pytest.fixture(autouse=True)
def _fresh_cache():
    auth.clear_verify_cache()
    yield
    auth.clear_verify_cache()


@pytest.fixture
def store() -> AuthStore:
    s = AuthStore(scrypt_n=CHEAP_N)
    s.bootstrap()
    return s


# -- hashing ---------------------------------------------------------------------------------


def test_default_cost_is_rabbitmq_grade():
    assert auth.SCRYPT_N == 2**14 and auth.SCRYPT_R == 8 and auth.SCRYPT_P == 1


def test_hash_format_is_self_describing():
    stored = hash_password("s3cret", n=CHEAP_N)
    scheme, n, r, p, salt, key = stored.split("$")
    assert (scheme, n, r, p) == ("scrypt", str(CHEAP_N), "8", "1")
    assert len(auth.base64.b64decode(salt)) == 16
    assert len(auth.base64.b64decode(key)) == 32


def test_default_hash_uses_n_16384():
    stored = hash_password("pw")
    assert stored.startswith("scrypt$16384$8$1$")
    assert verify_password("pw", stored)


def test_salts_differ():
    assert hash_password("pw", n=CHEAP_N) != hash_password("pw", n=CHEAP_N)


def test_verify_right_and_wrong():
    stored = hash_password("pässword", n=CHEAP_N)
    assert verify_password("pässword", stored)
    assert not verify_password("password", stored)
    assert not verify_password("", stored)


@pytest.mark.parametrize(
    "stored",
    ["", "plain", "scrypt$16$8$1$AAAA", "bcrypt$16$8$1$AAAA$AAAA", "scrypt$15$8$1$AAAAAAAA$" + "A" * 44,
     "scrypt$16$8$1$!!!$AAAA", "scrypt$1073741824$8$1$AAAAAAAA$" + "A" * 44],
)  # fmt: skip
def test_malformed_stored_hash_verifies_nothing(stored):
    assert not verify_password("pw", stored)
    with pytest.raises(ValueError):
        auth.validate_password_hash(stored)


def test_bad_cost_rejected():
    with pytest.raises(ValueError):
        hash_password("pw", n=1000)


def test_success_is_cached_failure_is_not(monkeypatch):
    stored = hash_password("pw", n=CHEAP_N)
    calls = []
    real = auth._scrypt

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(auth, "_scrypt", counting)
    for _ in range(5):
        assert verify_password("pw", stored)
    assert len(calls) == 1
    for _ in range(3):
        assert not verify_password("wrong", stored)
    assert len(calls) == 4


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(auth, "VERIFY_CACHE_MAX_ENTRIES", 3)
    hashes = [(f"pw{i}", hash_password(f"pw{i}", n=CHEAP_N)) for i in range(5)]
    for pw, stored in hashes:
        assert verify_password(pw, stored)
    assert len(auth._verify_cache) == 3


def test_cache_does_not_leak_password_across_hashes():
    a = hash_password("pw", n=CHEAP_N)
    b = hash_password("other", n=CHEAP_N)
    assert verify_password("pw", a)
    assert not verify_password("pw", b)


# -- permissions -----------------------------------------------------------------------------


def test_permission_is_unanchored_search():
    p = Permission(configure="^app\\.", write="log", read=".*")
    assert p.allows("configure", "app.q1")
    assert not p.allows("configure", "my.app.q1")
    assert p.allows("write", "audit-log-2")  # found anywhere in the name
    assert p.allows("read", "")
    assert p.allows("read", "anything")


def test_empty_permission_matches_nothing():
    p = Permission("", "", "")
    for kind in ("configure", "write", "read"):
        assert not p.allows(kind, "")
        assert not p.allows(kind, "q")


def test_caret_dollar_matches_only_empty_name():
    p = Permission("^$", "^$", "^$")
    assert not p.allows("read", "q")
    assert p.allows("read", "")


def test_invalid_regex_is_value_error_naming_kind():
    with pytest.raises(ValueError, match="invalid write permission regex '\\('"):
        Permission(".*", "(", ".*")


def test_unknown_permission_kind():
    with pytest.raises(ValueError, match="unknown permission kind"):
        Permission(".*", ".*", ".*").allows("delete", "q")  # type: ignore[arg-type]


def test_permission_equality_ignores_compiled():
    assert Permission("a", "b", "c") == Permission("a", "b", "c")


# -- store -----------------------------------------------------------------------------------


def test_bootstrap_creates_guest(store):
    guest = store.get_user("guest")
    assert guest is not None and guest.tags == ["administrator"]
    assert store.has_vhost("/")
    assert store.get_permissions("guest", "/") == Permission(".*", ".*", ".*")
    assert store.authenticate("guest", "guest") is guest
    assert store.can_access_vhost("guest", "/")


def test_bootstrap_is_idempotent(store):
    store.change_password("guest", "changed")
    store.bootstrap()
    assert store.authenticate("guest", "changed") is not None
    assert len(store.list_users()) == 1 and len(store.list_vhosts()) == 1


def test_bootstrap_custom_names():
    s = AuthStore(scrypt_n=CHEAP_N)
    s.bootstrap(default_user="admin", default_pass="pw", default_vhost="main")
    assert s.authenticate("admin", "pw") is not None
    assert s.can_access_vhost("admin", "main")
    assert not s.has_vhost("/")


def test_authenticate_failures(store):
    assert store.authenticate("guest", "wrong") is None
    assert store.authenticate("nobody", "guest") is None
    store.add_user("nopass", None)
    assert store.authenticate("nopass", "") is None
    assert store.authenticate("nopass", "anything") is None


def test_blank_password_never_authenticates(store):
    store.add_user("blank", "")
    assert store.get_user("blank").password_hash is None
    assert store.authenticate("blank", "") is None


def test_user_lifecycle(store):
    store.add_user("bob", "pw1", tags=["monitoring"])
    with pytest.raises(UserExists, match='User "bob" already exists'):
        store.add_user("bob", "x")
    store.change_password("bob", "pw2")
    assert store.authenticate("bob", "pw1") is None
    assert store.authenticate("bob", "pw2") is not None
    store.clear_password("bob")
    assert store.authenticate("bob", "pw2") is None
    store.set_user_tags("bob", ["management", "policymaker"])
    assert store.get_user("bob").tags == ["management", "policymaker"]
    assert [u.name for u in store.list_users()] == ["bob", "guest"]
    store.delete_user("bob")
    assert store.get_user("bob") is None
    with pytest.raises(NoSuchUser, match='User "bob" does not exist'):
        store.delete_user("bob")
    for op in (store.change_password, store.set_user_tags):
        with pytest.raises(NoSuchUser):
            op("bob", "x")
    with pytest.raises(NoSuchUser):
        store.clear_password("bob")


def test_changed_password_invalidates_cached_success(store):
    assert store.authenticate("guest", "guest") is not None
    store.change_password("guest", "new")
    assert store.authenticate("guest", "guest") is None


def test_errors_are_auth_errors():
    for exc in (NoSuchUser("u"), UserExists("u"), NoSuchVhost("v"), VhostExists("v")):
        assert isinstance(exc, AuthError)


def test_empty_names_rejected(store):
    with pytest.raises(ValueError):
        store.add_user("", "pw")
    with pytest.raises(ValueError):
        store.add_vhost("")


def test_vhost_lifecycle(store):
    v = store.add_vhost("dev", description="Development", tags=["x"])
    assert v.default_queue_type == "classic"
    with pytest.raises(VhostExists, match='Virtual host "dev" already exists'):
        store.add_vhost("dev")
    assert [v.name for v in store.list_vhosts()] == ["/", "dev"]
    store.set_permissions("guest", "dev", ".*", ".*", ".*")
    store.delete_vhost("dev")
    assert not store.has_vhost("dev")
    assert store.list_permissions(vhost="dev") == []
    with pytest.raises(NoSuchVhost, match='Virtual host "dev" does not exist'):
        store.delete_vhost("dev")


def test_vhost_access_needs_an_entry_even_an_empty_one(store):
    store.add_user("bob", "pw")
    store.add_vhost("dev")
    assert not store.can_access_vhost("bob", "dev")
    store.set_permissions("bob", "dev", "", "", "")
    assert store.can_access_vhost("bob", "dev")
    assert not store.check("bob", "dev", "read", "q")
    store.clear_permissions("bob", "dev")
    assert not store.can_access_vhost("bob", "dev")
    store.clear_permissions("bob", "dev")  # idempotent


def test_set_permissions_requires_user_and_vhost(store):
    with pytest.raises(NoSuchUser):
        store.set_permissions("nobody", "/", ".*", ".*", ".*")
    with pytest.raises(NoSuchVhost):
        store.set_permissions("guest", "nowhere", ".*", ".*", ".*")
    with pytest.raises(ValueError, match="invalid configure permission regex"):
        store.set_permissions("guest", "/", "[", ".*", ".*")
    assert store.get_permissions("guest", "/") == Permission(".*", ".*", ".*")  # unchanged


def test_check(store):
    store.add_user("app", "pw")
    store.set_permissions("app", "/", "^app-", "^(app-|amq\\.default$)", "^app-")
    assert store.check("app", "/", "configure", "app-q", "queue")
    assert not store.check("app", "/", "configure", "other", "queue")
    assert store.check("app", "/", "write", "")  # default exchange is amq.default
    assert store.check("app", "/", "write", "amq.default")
    assert not store.check("app", "/", "read", "")
    assert not store.check("app", "other-vhost", "read", "app-q")
    assert not store.check("nobody", "/", "read", "app-q")


def test_default_exchange_mapping_is_for_exchanges_only(store):
    store.add_user("app", "pw")
    store.set_permissions("app", "/", "amq\\.default", "amq\\.default", "amq\\.default")
    assert store.check("app", "/", "write", "", "exchange")
    assert not store.check("app", "/", "write", "", "queue")


def test_delete_user_removes_permissions(store):
    store.add_user("bob", "pw")
    store.set_permissions("bob", "/", ".*", ".*", ".*")
    store.delete_user("bob")
    store.add_user("bob", "pw")
    assert not store.can_access_vhost("bob", "/")


def test_list_permissions_filters(store):
    store.add_user("bob", "pw")
    store.add_vhost("dev")
    store.set_permissions("bob", "/", "a", "b", "c")
    store.set_permissions("bob", "dev", "", "", "")
    assert [(e.user, e.vhost) for e in store.list_permissions()] == [
        ("bob", "/"),
        ("bob", "dev"),
        ("guest", "/"),
    ]
    assert [(e.user, e.vhost) for e in store.list_permissions(vhost="/")] == [("bob", "/"), ("guest", "/")]
    assert [(e.user, e.vhost) for e in store.list_permissions(user="bob", vhost="dev")] == [("bob", "dev")]
    assert store.list_permissions(user="bob", vhost="/")[0].permission == Permission("a", "b", "c")


def test_round_trip_through_json(store):
    store.add_user("bob", "pw", tags=["monitoring"])
    store.add_user("svc", None)
    store.add_vhost("dev", description="d", tags=["t"], default_queue_type="quorum")
    store.set_permissions("bob", "dev", "^x", "", ".*")
    data = json.loads(json.dumps(store.to_dict()))
    again = AuthStore.from_dict(data, scrypt_n=CHEAP_N)
    assert again.to_dict() == store.to_dict()
    assert again.authenticate("bob", "pw") is not None
    assert again.get_user("svc").password_hash is None
    assert again.get_vhost("dev").default_queue_type == "quorum"
    assert again.check("bob", "dev", "configure", "xq", "queue")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["users"][0].update(password_hash="nonsense"),
        lambda d: d["permissions"].append(
            {"user": "ghost", "vhost": "/", "configure": "", "write": "", "read": ""}
        ),
        lambda d: d["permissions"][0].update(read="("),
        lambda d: d["vhosts"].append({"description": "no name"}),
    ],
)
def test_from_dict_rejects_inconsistent_data(store, mutate):
    data = store.to_dict()
    mutate(data)
    with pytest.raises((ValueError, AuthError)):
        AuthStore.from_dict(data, scrypt_n=CHEAP_N)


def test_add_user_with_imported_hash(store):
    stored = hash_password("pw", n=CHEAP_N)
    store.add_user("imp", None, password_hash=stored)
    assert store.authenticate("imp", "pw") is not None
    with pytest.raises(ValueError):
        store.add_user("bad", None, password_hash="md5$x")


def test_refusal_texts():
    assert vhost_access_refused_text("bob", "dev") == "access to vhost 'dev' refused for user 'bob'"
    assert (
        resource_access_refused_text("bob", "/", "configure", "queue", "q")
        == "configure access to queue 'q' in vhost '/' refused for user 'bob'"
    )
    assert (
        resource_access_refused_text("bob", "/", "write", "exchange", "")
        == "write access to exchange 'amq.default' in vhost '/' refused for user 'bob'"
    )


# -- loopback --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "::ffff:127.0.0.1", "::FFFF:127.9.9.9", "::1%lo"]
)
def test_loopback_addresses(host):
    assert is_loopback_address(host)


@pytest.mark.parametrize(
    "host", ["10.0.0.1", "128.0.0.1", "::2", "::ffff:10.0.0.1", "localhost", "", "garbage"]
)
def test_non_loopback_addresses(host):
    assert not is_loopback_address(host)


def test_loopback_refused():
    assert loopback_refused("guest", "10.0.0.5", ("guest",))
    assert not loopback_refused("guest", "127.0.0.1", ("guest",))
    assert not loopback_refused("guest", "10.0.0.5", ())
    assert not loopback_refused("bob", "10.0.0.5", ("guest",))


# -- SASL ------------------------------------------------------------------------------------


def test_parse_plain():
    assert parse_plain(b"\x00guest\x00guest") == ("guest", "guest")
    assert parse_plain(b"admin\x00bob\x00p\xc3\xa4ss") == ("bob", "päss")  # authzid ignored
    assert parse_plain(b"\x00\x00") == ("", "")
    assert parse_plain(memoryview(b"\x00u\x00p")) == ("u", "p")


@pytest.mark.parametrize("response", [b"", b"guest", b"\x00guest", b"\x00a\x00b\x00c", b"\x00\xff\x00pw"])
def test_parse_plain_malformed(response):
    with pytest.raises(ValueError):
        parse_plain(response)


def _shortstr(s: str) -> bytes:
    raw = s.encode()
    return bytes([len(raw)]) + raw


def _longstr_field(key: str, value: bytes, type_letter: bytes = b"S") -> bytes:
    return _shortstr(key) + type_letter + struct.pack(">I", len(value)) + value


def test_parse_amqplain():
    body = _longstr_field("LOGIN", b"guest") + _longstr_field("PASSWORD", "pä".encode())
    assert parse_amqplain(body) == ("guest", "pä")


def test_parse_amqplain_byte_array_and_extra_fields():
    body = (
        _shortstr("VERSION") + b"I" + struct.pack(">i", 1)
        + _longstr_field("PASSWORD", b"pw", b"x")
        + _shortstr("FLAG") + b"t\x01"
        + _longstr_field("LOGIN", b"bob")
        + _shortstr("NOTE") + b"V"
    )  # fmt: skip
    assert parse_amqplain(body) == ("bob", "pw")


def test_parse_amqplain_matches_py_amqp_encoding():
    """kombu/celery (py-amqp) send AMQPLAIN by default: their table minus the length prefix."""
    amqp_serialization = pytest.importorskip("amqp.serialization")
    table = amqp_serialization.dumps("F", [{"LOGIN": "guest", "PASSWORD": "secret"}])
    assert parse_amqplain(table[4:]) == ("guest", "secret")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        _longstr_field("LOGIN", b"guest"),  # no PASSWORD
        _longstr_field("LOGIN", b"guest") + _shortstr("PASSWORD") + b"I" + struct.pack(">i", 5),
        _longstr_field("LOGIN", b"guest") + _longstr_field("PASSWORD", b"pw")[:-1],  # truncated
        _longstr_field("LOGIN", b"guest") + _shortstr("PASSWORD"),  # no type
        _longstr_field("LOGIN", b"guest") + _shortstr("X") + b"?" + _longstr_field("PASSWORD", b"pw"),
        b"\x10LOG",  # truncated key
        _longstr_field("LOGIN", b"\xff") + _longstr_field("PASSWORD", b"pw"),
        _longstr_field("LOGIN", b"guest") + _shortstr("PASSWORD") + b"S\x00\x00",
    ],
)
def test_parse_amqplain_malformed(body):
    with pytest.raises(ValueError):
        parse_amqplain(body)


# -- RE2 permission patterns (issue 15, finding 6) ------------------------------------------------------


def test_permission_regex_re2_refuses_is_value_error():
    with pytest.raises(ValueError, match="invalid read permission regex '\\(a\\)\\\\1'"):
        Permission(".*", ".*", "(a)\\1")


def test_stored_permission_regex_re2_refuses_allows_nothing(store, caplog):
    store.add_user("bob", "pw")
    store.set_permissions("bob", "/", ".*", ".*", ".*")
    data = store.to_dict()
    next(p for p in data["permissions"] if p["user"] == "bob").update(configure="^(?!amq\\.)")
    with caplog.at_level("WARNING", logger="hutch.patterns"):
        again = AuthStore.from_dict(data, scrypt_n=CHEAP_N)
    assert "configure permission regex" in caplog.text and "matches nothing" in caplog.text
    assert not again.check("bob", "/", "configure", "orders", "queue")
    assert again.check("bob", "/", "write", "orders", "queue")


def test_topic_permission_allows_expands_and_searches():
    assert auth.topic_permission_allows("^{username}\\.", "bob", "/", "bob.x")
    assert not auth.topic_permission_allows("^{username}\\.", "bob", "/", "alice.x")
    assert auth.topic_permission_allows("", "bob", "/", "")
    assert not auth.topic_permission_allows("", "bob", "/", "x")
    assert not auth.topic_permission_allows("{username}", "(a)\\1", "/", "aa")  # expands to what RE2 refuses


def test_put_user_body_is_hashed_before_the_loop_sees_it():
    from hutch.mgmt.users import hash_plain_password

    body = hash_plain_password({"password": "pw", "tags": "management"})
    assert set(body) == {"password_hash", "tags"} and auth.verify_password("pw", body["password_hash"])
    for untouched in ({"password": "", "tags": ""}, {"password": "a", "password_hash": "b"}, {"tags": ""}, "x"):
        assert hash_plain_password(untouched) is untouched
