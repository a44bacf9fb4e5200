"""Definitions export and import: GET/POST /api/definitions[/{vhost}] and `load_definitions` at boot.

Against real nodes: the export's shape (RabbitMQ 3.10's field names, checked against a 3.10.8 node's
output), export -> import into a fresh node -> the same export, before and after a restart; the
per-vhost forms; a hand-written RabbitMQ 3.10 export with RabbitMQ's salted SHA-256/512/MD5 password
hashes whose users then log in with pika; all-or-nothing imports and their 400 reasons; the
multipart upload and ?download= (not RabbitMQ's ?auth=); who may call it; `load_definitions` at boot
and its one-line errors; `rabbitmqadmin export`/`import` when it is installed. Pure tests of the
password hashes and the config key come first.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from conftest import TEST_WORKERS_ENV, ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)
from hutch.config import ConfigError, parse_config_text
from hutch.core import auth
from hutch.mgmt.definitions import NotJson, parse_document

from .helpers import Api, connect, seg, unique, wait_for, wait_mgmt

# RabbitMQ 3.10's field names (rabbit_mgmt_wm_definitions:rw_state/0), the top level in its order
TOP_KEYS = ["rabbit_version", "rabbitmq_version", "product_name", "product_version", "users", "vhosts",
            "permissions", "topic_permissions", "parameters", "global_parameters", "policies", "queues",
            "exchanges", "bindings"]
VHOST_TOP_KEYS = ["rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings"]
USER_KEYS = {"name", "password_hash", "hashing_algorithm", "tags", "limits"}
PERMISSION_KEYS = {"user", "vhost", "configure", "write", "read"}
PARAMETER_KEYS = {"vhost", "component", "name", "value"}
POLICY_KEYS = {"vhost", "name", "pattern", "definition", "priority", "apply-to"}
QUEUE_KEYS = {"name", "vhost", "durable", "auto_delete", "arguments"}
EXCHANGE_KEYS = {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"}
BINDING_KEYS = {"source", "vhost", "destination", "destination_type", "routing_key", "arguments"}
VHOST_KEYS = {"name", "limits", "metadata"}  # rabbit_definitions:vhost_definition/1 (3.10 mgmt: name only)

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def rabbit_hash(password: str, algorithm: str = "sha256", salt: bytes | None = None) -> str:
    """A password hash as RabbitMQ makes one (rabbit_password:hash/2): base64(salt + H(salt + password))
    with a 4-byte salt."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.new(algorithm, salt + password.encode()).digest()).decode()


def post_definitions(api: Api, doc: Any, vhost: str | None = None) -> Any:
    path = "/api/definitions" + (f"/{seg(vhost)}" if vhost is not None else "")
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return api.call("POST", path, raw=raw)


def export(api: Api, vhost: str | None = None) -> dict[str, Any]:
    return api.ok("/api/definitions" + (f"/{seg(vhost)}" if vhost is not None else ""))


def can_login(port: int, user: str, password: str, vhost: str = "/") -> bool:
    try:
        connect(port, user, password, vhost).close()
    except pika.exceptions.AMQPConnectionError:
        return False
    return True


# -- pure: RabbitMQ password hashes, the config key, parsing ---------------------------------------------


@pytest.mark.parametrize(("algorithm", "digest"), [("rabbit_password_hashing_sha256", "sha256"),
                                                   ("rabbit_password_hashing_sha512", "sha512"),
                                                   ("rabbit_password_hashing_md5", "md5")])
def test_rabbitmq_hashes_verify_and_round_trip(algorithm: str, digest: str):
    exported = rabbit_hash("s3cret", digest)
    stored = auth.import_password_hash(exported, algorithm)
    assert stored == f"{algorithm}${exported}"
    assert auth.verify_password("s3cret", stored)
    assert not auth.verify_password("S3cret", stored)
    assert not auth.verify_password("", stored)
    assert auth.export_password_hash(stored) == (exported, algorithm)
    store = auth.AuthStore(scrypt_n=16)
    store.add_user("u", None, password_hash=stored)
    assert store.authenticate("u", "s3cret") is not None
    again = auth.AuthStore.from_dict(store.to_dict(), scrypt_n=16)  # the durable form keeps it
    assert again.authenticate("u", "s3cret") is not None
    again.set_password_hash("u", None)
    assert again.authenticate("u", "s3cret") is None


def test_hash_from_rabbitmq_3_10_8():
    # made by a RabbitMQ 3.10.8 node for the password "s3cret" (PUT /api/users, then GET /api/definitions)
    stored = auth.import_password_hash("l4W9kW1MsylIKk08v8q6Bcn2xJb9If5MuvG0VivME2fMENK6",
                                       "rabbit_password_hashing_sha256")
    assert auth.verify_password("s3cret", stored)


def test_hutch_hashes_and_bad_hashes():
    scrypt = auth.hash_password("pw", n=16)
    assert auth.import_password_hash(scrypt, auth.HUTCH_HASHING_ALGORITHM) == scrypt
    assert auth.export_password_hash(scrypt) == (scrypt, "hutch_password_hashing_scrypt")
    assert auth.export_password_hash(None) == ("", "hutch_password_hashing_scrypt")
    assert auth.import_password_hash("", "rabbit_password_hashing_sha256") is None
    for password_hash, algorithm, reason in [
        ("!!!", "rabbit_password_hashing_sha256", "not valid base64"),
        (base64.b64encode(b"short").decode(), "rabbit_password_hashing_sha256", "must decode to 36 bytes"),
        (rabbit_hash("pw", "sha256"), "rabbit_password_hashing_sha512", "must decode to 68 bytes"),
        ("abc", "rabbit_password_hashing_bcrypt", "unsupported hashing_algorithm"),
        ("scrypt$1$2", auth.HUTCH_HASHING_ALGORITHM, "scrypt"),
    ]:
        with pytest.raises(ValueError, match=reason):
            auth.import_password_hash(password_hash, algorithm)
    with pytest.raises(ValueError):
        auth.validate_password_hash("rabbit_password_hashing_sha256$AAAA")
    assert not auth.verify_password("pw", "rabbit_password_hashing_md5$garbage")


def test_config_key():
    assert parse_config_text("load_definitions = /etc/hutch/definitions.json")[0] == {
        "load_definitions": "/etc/hutch/definitions.json"}
    assert parse_config_text("management.load_definitions = /d.json")[0] == {"load_definitions": "/d.json"}
    with pytest.raises(ConfigError, match="load_definitions"):
        parse_config_text("load_definitions =")


def test_parse_document():
    assert parse_document(b"") == {} == parse_document(b"  \n")
    assert parse_document(b'{"users": []}') == {"users": []}
    for bad in (b"{", b"[1]", b'"x"', b"\xff\xfe{", b"null"):
        with pytest.raises(NotJson):
            parse_document(bad)


# -- export ----------------------------------------------------------------------------------------------


def build_topology(info: ServerInfo, api: Api) -> None:
    """Users, vhosts, permissions, policies and topology of every kind the export must (not) show."""
    assert api.put("/api/vhosts/dev", {"description": "dev vhost", "tags": "a,b"}).status == 201
    assert api.put("/api/users/alice", {"password": "alice-pw", "tags": "management,policymaker"}).status == 201
    assert api.put("/api/users/nopass", {"password_hash": "", "tags": ""}).status == 201
    assert api.put("/api/permissions/dev/alice", {"configure": "^a", "write": ".*", "read": ""}).status == 201
    assert api.put("/api/policies/dev/lim", {"pattern": "^orders", "definition": {"max-length": 10},
                                             "priority": 2, "apply-to": "queues"}).status == 201
    assert api.put("/api/operator-policies/dev/cap", {"pattern": "^orders", "definition": {"max-length": 5},
                                                      "priority": 1, "apply-to": "queues"}).status == 201
    assert api.put("/api/queues/dev/orders", {"durable": True, "arguments": {"x-message-ttl": 1000}}).status == 201
    assert api.put("/api/queues/dev/scratch", {"durable": False, "auto_delete": True}).status == 201
    assert api.put("/api/exchanges/dev/events", {"type": "topic", "durable": True,
                                                 "arguments": {"alternate-exchange": "ae"}}).status == 201
    assert api.put("/api/exchanges/dev/fan", {"type": "fanout", "durable": True, "internal": True}).status == 201
    assert api.put("/api/queues/%2F/plain", {"durable": True}).status == 201
    with connect(info.amqp_port, vhost="dev") as conn:
        ch = conn.channel()
        ch.queue_bind("orders", "events", "orders.#", arguments={"x-a": 1})
        ch.exchange_bind("fan", "events", "fan.#")
        ch.queue_bind("scratch", "events", "scratch")
        ch.queue_bind("orders", "amq.topic", "legacy.#")


def test_export_shape_matches_rabbitmq(clean_mgmt: ServerInfo, clean_api: Api):
    api = clean_api
    build_topology(clean_mgmt, api)
    with connect(clean_mgmt.amqp_port, vhost="dev") as conn:  # exclusive queues are never exported
        ch = conn.channel()
        ch.queue_declare("mine", exclusive=True)
        ch.queue_bind("mine", "events", "mine")
        doc = export(api)
    assert list(doc) == TOP_KEYS
    assert doc["rabbit_version"] == doc["rabbitmq_version"] == doc["product_version"]
    assert doc["product_name"] == "hutch"
    for key, fields in (("users", USER_KEYS), ("permissions", PERMISSION_KEYS), ("parameters", PARAMETER_KEYS),
                        ("policies", POLICY_KEYS), ("queues", QUEUE_KEYS), ("exchanges", EXCHANGE_KEYS),
                        ("bindings", BINDING_KEYS), ("vhosts", VHOST_KEYS)):
        assert doc[key], key
        assert all(set(item) == fields for item in doc[key]), (key, doc[key])
    assert doc["topic_permissions"] == [] and doc["global_parameters"] == []

    users = {u["name"]: u for u in doc["users"]}
    assert users["alice"]["tags"] == ["management", "policymaker"]  # a list, as RabbitMQ 3.9+ exports
    assert users["alice"]["hashing_algorithm"] == "hutch_password_hashing_scrypt"
    assert users["alice"]["password_hash"].startswith("scrypt$")
    assert users["nopass"]["password_hash"] == "" and users["alice"]["limits"] == {}
    assert {"name": "dev", "limits": {}, "metadata": {"description": "dev vhost", "tags": ["a", "b"],
                                                      "default_queue_type": "classic"}} in doc["vhosts"]
    assert {"user": "alice", "vhost": "dev", "configure": "^a", "write": ".*", "read": ""} in doc["permissions"]
    assert doc["policies"] == [{"vhost": "dev", "name": "lim", "pattern": "^orders", "apply-to": "queues",
                                "definition": {"max-length": 10}, "priority": 2}]
    # operator policies are runtime parameters of component operator_policy, as in RabbitMQ
    assert doc["parameters"] == [{"value": {"pattern": "^orders", "definition": {"max-length": 5}, "priority": 1,
                                            "apply-to": "queues"},
                                  "vhost": "dev", "component": "operator_policy", "name": "cap"}]
    # every non-exclusive queue, durable or not (RabbitMQ 3.10 exports transient ones too)
    assert doc["queues"] == [
        {"name": "plain", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
        {"name": "orders", "vhost": "dev", "durable": True, "auto_delete": False,
         "arguments": {"x-message-ttl": 1000}},
        {"name": "scratch", "vhost": "dev", "durable": False, "auto_delete": True, "arguments": {}}]
    # neither the default exchange nor amq.*
    assert [(x["vhost"], x["name"], x["type"], x["internal"]) for x in doc["exchanges"]] == [
        ("dev", "events", "topic", False), ("dev", "fan", "fanout", True)]
    assert doc["exchanges"][0]["arguments"] == {"alternate-exchange": "ae"}
    # no implicit default-exchange bindings, nothing to the exclusive queue; amq.* sources are kept
    assert [(b["source"], b["destination_type"], b["destination"], b["routing_key"], b["arguments"])
            for b in doc["bindings"]] == [
        ("amq.topic", "queue", "orders", "legacy.#", {}),
        ("events", "exchange", "fan", "fan.#", {}),
        ("events", "queue", "orders", "orders.#", {"x-a": 1}),
        ("events", "queue", "scratch", "scratch", {})]


def test_vhost_export_shape(clean_mgmt: ServerInfo, clean_api: Api):
    api = clean_api
    build_topology(clean_mgmt, api)
    doc = export(api, "dev")
    assert list(doc) == VHOST_TOP_KEYS
    assert doc["rabbit_version"] == export(api)["rabbit_version"]
    # queues, exchanges and bindings lose their vhost; policies and parameters keep it (as RabbitMQ 3.10)
    assert all(set(q) == QUEUE_KEYS - {"vhost"} for q in doc["queues"])
    assert all(set(x) == EXCHANGE_KEYS - {"vhost"} for x in doc["exchanges"])
    assert all(set(b) == BINDING_KEYS - {"vhost"} for b in doc["bindings"])
    assert [q["name"] for q in doc["queues"]] == ["orders", "scratch"]
    assert [p["name"] for p in doc["policies"]] == ["lim"] and doc["policies"][0]["vhost"] == "dev"
    assert [p["name"] for p in doc["parameters"]] == ["cap"]
    root = export(api, "/")
    assert root["queues"] == [{"name": "plain", "durable": True, "auto_delete": False, "arguments": {}}]
    assert root["exchanges"] == root["bindings"] == root["policies"] == root["parameters"] == []
    # a missing vhost: 400 vhost_not_found (RabbitMQ's answer to GET; POST gives 404)
    reply = api.get("/api/definitions/nope")
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "vhost_not_found"})
    # ?download= names the file, as the management UI's download button asks
    reply = api.get("/api/definitions/dev?download=dev-defs.json")
    assert reply.headers["Content-Disposition"] == "attachment; filename=dev-defs.json"
    assert reply.body == doc
    assert "Content-Disposition" not in api.get("/api/definitions").headers
    assert api.call("HEAD", "/api/definitions").status == 200
    assert api.call("PUT", "/api/definitions", {}).status == 405


# -- import ----------------------------------------------------------------------------------------------


def without_transient(doc: dict[str, Any]) -> dict[str, Any]:
    """What survives a restart: the export minus transient queues, exchanges and their bindings."""
    doc = json.loads(json.dumps(doc))
    gone = {("queue", q["vhost"], q["name"]) for q in doc["queues"] if not q["durable"]}
    gone |= {("exchange", x["vhost"], x["name"]) for x in doc["exchanges"] if not x["durable"]}
    doc["queues"] = [q for q in doc["queues"] if q["durable"]]
    doc["exchanges"] = [x for x in doc["exchanges"] if x["durable"]]
    doc["bindings"] = [b for b in doc["bindings"]
                       if (b["destination_type"], b["vhost"], b["destination"]) not in gone
                       and ("exchange", b["vhost"], b["source"]) not in gone]
    return doc


def test_export_import_into_fresh_node_and_restart(clean_mgmt: ServerInfo, clean_api: Api, tmp_path: Path):
    build_topology(clean_mgmt, clean_api)
    original = export(clean_api)
    target = start_server(tmp_path / "b")
    try:
        api = Api(wait_mgmt(target).mgmt_url)
        reply = post_definitions(api, original)
        assert (reply.status, reply.body) == (204, None)
        assert export(api) == original
        # the objects work, not just the listing: alice logs in with her password, the operator
        # policy and the policy apply to the imported queue, the bindings route
        assert can_login(target.amqp_port, "alice", "alice-pw", "dev")
        orders = api.ok("/api/queues/dev/orders")
        assert (orders["policy"], orders["operator_policy"]) == ("lim", "cap")
        assert orders["effective_policy_definition"] == {"max-length": 5}
        with connect(target.amqp_port, vhost="dev") as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("events", "orders.new", b"hello")
            ch.basic_publish("amq.topic", "legacy.x", b"old")
        assert wait_for(lambda: api.ok("/api/queues/dev/orders")["messages"] == 2)
        # importing the same document again changes nothing
        assert post_definitions(api, original).status == 204
        assert export(api) == original
        target.stop()
        target = start_server(tmp_path / "b")  # the same data directory
        api = Api(wait_mgmt(target).mgmt_url)
        assert export(api) == without_transient(original)
        assert can_login(target.amqp_port, "alice", "alice-pw", "dev")
    finally:
        target.stop()


def test_vhost_import_into_another_vhost(clean_mgmt: ServerInfo, clean_api: Api):
    api = clean_api
    build_topology(clean_mgmt, api)
    doc = export(api, "dev")
    doc["users"] = [{"name": "ignored", "password": "x", "tags": ""}]  # a per-vhost import ignores these
    assert api.put("/api/vhosts/staging", {}).status == 201
    reply = post_definitions(api, doc, "staging")
    assert (reply.status, reply.body) == (204, None)
    copied = export(api, "staging")
    for item in copied["policies"] + copied["parameters"]:
        assert item["vhost"] == "staging"
        item["vhost"] = "dev"
    assert copied == {k: v for k, v in doc.items() if k != "users"}
    assert api.get("/api/users/ignored").status == 404
    reply = post_definitions(api, doc, "nope")
    assert (reply.status, reply.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def rabbitmq_310_export(hashes: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """A realistic RabbitMQ 3.10 export (the shape GET /api/definitions gives on 3.10.8)."""
    users = [{"name": name, "password_hash": password_hash, "hashing_algorithm": algorithm,
              "tags": tags, "limits": {}}
             for name, (password_hash, algorithm), tags in zip(
                 hashes, hashes.values(), (["administrator"], [], "management", []), strict=True)]
    return {
        "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "product_name": "RabbitMQ",
        "product_version": "3.10.8",
        "users": users,
        "vhosts": [{"name": "/"}, {"name": "shop"}],
        "permissions": [
            {"user": "ops", "vhost": "/", **FULL}, {"user": "ops", "vhost": "shop", **FULL},
            {"user": "app", "vhost": "shop", "configure": "^orders", "write": "^orders", "read": "^orders"},
            {"user": "legacy", "vhost": "shop", "configure": "", "write": "", "read": ".*"}],
        "topic_permissions": [],
        "parameters": [{"value": {"pattern": "^orders", "definition": {"max-length": 1000}, "priority": 0,
                                  "apply-to": "queues"},
                        "vhost": "shop", "component": "operator_policy", "name": "cap"}],
        "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-8n6fucMz0YkXOoZZjgBvSA"}],
        "policies": [{"vhost": "shop", "name": "dlx", "pattern": "^orders\\.", "apply-to": "queues",
                      "definition": {"dead-letter-exchange": "orders.dlx", "message-ttl": 60000}, "priority": 1}],
        "queues": [
            {"name": "orders.created", "vhost": "shop", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "classic"}},
            {"name": "orders.dead", "vhost": "shop", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "classic", "x-queue-mode": "lazy"}},
            {"name": "audit", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-max-length": 10000, "x-overflow": "reject-publish"}}],
        "exchanges": [
            {"name": "orders", "vhost": "shop", "type": "topic", "durable": True, "auto_delete": False,
             "internal": False, "arguments": {}},
            {"name": "orders.dlx", "vhost": "shop", "type": "fanout", "durable": True, "auto_delete": False,
             "internal": False, "arguments": {}}],
        "bindings": [
            {"source": "orders", "vhost": "shop", "destination": "orders.created", "destination_type": "queue",
             "routing_key": "order.created", "arguments": {}},
            {"source": "orders.dlx", "vhost": "shop", "destination": "orders.dead", "destination_type": "queue",
             "routing_key": "", "arguments": {}},
            {"source": "amq.topic", "vhost": "shop", "destination": "orders", "destination_type": "exchange",
             "routing_key": "legacy.#", "arguments": {}},
            {"source": "amq.fanout", "vhost": "/", "destination": "audit", "destination_type": "queue",
             "routing_key": "", "arguments": {}}],
    }


def test_rabbitmq_310_export_imported_and_users_log_in(fresh_server: ServerInfo, tmp_path: Path):
    api = Api(wait_mgmt(fresh_server).mgmt_url)
    hashes = {"ops": (rabbit_hash("ops-pw", "sha256"), "rabbit_password_hashing_sha256"),
              "app": (rabbit_hash("app-pw", "sha512"), "rabbit_password_hashing_sha512"),
              "legacy": (rabbit_hash("legacy-pw", "md5"), "rabbit_password_hashing_md5"),
              "svc": ("", "rabbit_password_hashing_sha256")}
    sample = rabbitmq_310_export(hashes)
    reply = post_definitions(api, sample)
    assert (reply.status, reply.body) == (204, None)
    port = fresh_server.amqp_port

    # until a user's first login, the export gives the RabbitMQ hashes back as they came, so the users can
    # move back (the first successful login replaces the fast hash by scrypt: issue 15, docs/security.md)
    users = {u["name"]: u for u in export(api)["users"]}
    for name, (password_hash, algorithm) in hashes.items():
        if password_hash:  # "" (no password) is exported with hutch's algorithm name
            assert (users[name]["password_hash"], users[name]["hashing_algorithm"]) == (password_hash, algorithm)
    assert users["svc"]["password_hash"] == ""

    assert can_login(port, "ops", "ops-pw") and can_login(port, "ops", "ops-pw", "shop")
    assert can_login(port, "app", "app-pw", "shop")
    assert can_login(port, "legacy", "legacy-pw", "shop")
    assert not can_login(port, "ops", "wrong")
    assert not can_login(port, "svc", "")
    assert Api(api.base, "ops", "ops-pw").ok("/api/whoami") == {"name": "ops", "tags": ["administrator"]}

    # the topology works through pika as the imported user
    with connect(port, "app", "app-pw", "shop") as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("orders", "order.created", b"order-1")
        method, _props, body = ch.basic_get("orders.created", auto_ack=True)
        assert body == b"order-1"
    q = api.ok("/api/queues/shop/orders.created")
    assert (q["policy"], q["operator_policy"]) == ("dlx", "cap")

    # after their first login the users' hashes are scrypt (the same passwords still work)
    users = {u["name"]: u for u in export(api)["users"]}
    for name, (password_hash, _algorithm) in hashes.items():
        if password_hash:
            assert users[name]["hashing_algorithm"] == "hutch_password_hashing_scrypt", name
    assert users["svc"]["password_hash"] == ""

    # an export of RabbitMQ before 3.6 names no algorithm: its hashes are MD5
    old = {"rabbit_version": "3.5.7", "users": [{"name": "old", "password_hash": rabbit_hash("old-pw", "md5"),
                                                 "tags": "administrator"}],
           "permissions": [{"user": "old", "vhost": "/", **FULL}]}
    assert post_definitions(api, old).status == 204
    assert can_login(port, "old", "old-pw")
    # 3.6.1 and later default to SHA-256
    new = {"rabbitmq_version": "3.10.8", "users": [{"name": "new", "password_hash": rabbit_hash("new-pw"),
                                                    "tags": []}],
           "permissions": [{"user": "new", "vhost": "/", **FULL}]}
    assert post_definitions(api, new).status == 204
    assert can_login(port, "new", "new-pw")

    # imported users, hashes and topology are durable
    fresh_server.stop()
    again = start_server(fresh_server.data_dir.parent)
    try:
        wait_mgmt(again)
        assert can_login(again.amqp_port, "legacy", "legacy-pw", "shop")
        assert can_login(again.amqp_port, "old", "old-pw")
        after = Api(again.mgmt_url, "ops", "ops-pw")
        assert [b["destination"] for b in export(after, "shop")["bindings"]] == [
            "orders", "orders.created", "orders.dead"]
    finally:
        again.stop()


def test_import_updates_users_permissions_policies_and_keeps_queues(clean_mgmt: ServerInfo, clean_api: Api):
    api = clean_api
    build_topology(clean_mgmt, api)
    doc = {
        "users": [{"name": "alice", "password": "new-pw", "tags": ["administrator"]},
                  {"name": "nopass", "password_hash": rabbit_hash("now-set"), "tags": "",
                   "hashing_algorithm": "rabbit_password_hashing_sha256"}],
        "vhosts": [{"name": "dev"}],  # no description or tags given: kept as they are
        "permissions": [{"user": "alice", "vhost": "dev", **FULL}, {"user": "nopass", "vhost": "/", **FULL}],
        "policies": [{"vhost": "dev", "name": "lim", "pattern": "^orders", "definition": {"max-length": 20}}],
        # exists with other properties: kept as it is, without an equivalence error (as RabbitMQ)
        "queues": [{"name": "orders", "vhost": "dev", "durable": False, "auto_delete": True,
                    "arguments": {"x-max-length": 3}}],
        "exchanges": [{"name": "events", "vhost": "dev", "type": "direct", "durable": False}],
    }
    reply = post_definitions(api, doc)
    assert (reply.status, reply.body) == (204, None)
    port = clean_mgmt.amqp_port
    assert not can_login(port, "alice", "alice-pw", "dev") and can_login(port, "alice", "new-pw", "dev")
    assert can_login(port, "nopass", "now-set")
    assert api.ok("/api/users/alice")["tags"] == ["administrator"]
    assert api.ok("/api/permissions/dev/alice")["configure"] == ".*"
    assert api.ok("/api/vhosts/dev")["description"] == "dev vhost"
    policy = api.ok("/api/policies/dev/lim")
    assert (policy["definition"], policy["priority"], policy["apply-to"]) == ({"max-length": 20}, 0, "all")
    orders = api.ok("/api/queues/dev/orders")
    assert (orders["durable"], orders["arguments"]) == (True, {"x-message-ttl": 1000})
    assert api.ok("/api/exchanges/dev/events")["type"] == "topic"
    # a user given neither password nor hash loses its password (RabbitMQ's put_user)
    assert post_definitions(api, {"users": [{"name": "alice", "tags": "administrator"}]}).status == 204
    assert not can_login(port, "alice", "new-pw", "dev")


def test_new_vhost_gives_importer_full_permissions(clean_api: Api):
    api = clean_api
    assert post_definitions(api, {"vhosts": [{"name": "v1"}, {"name": "v2"}],
                                  "permissions": [{"user": "guest", "vhost": "v2", "configure": "^x",
                                                   "write": "", "read": ""}]}).status == 204
    assert api.ok("/api/permissions/v1/guest") == {"user": "guest", "vhost": "v1", **FULL}
    assert api.ok("/api/permissions/v2/guest")["configure"] == "^x"  # the document's entry wins


# -- bad input: 400, and nothing changes -----------------------------------------------------------------


def bad_documents(name: str) -> list[tuple[Any, str]]:
    q, v, u = f"q-{name}", f"v-{name}", f"u-{name}"
    queue = {"name": q, "vhost": "/", "durable": True}
    return [
        (b'{"users":', "failed_to_parse_json"),
        (b"[1, 2]", "failed_to_parse_json"),
        (b'"a string"', "failed_to_parse_json"),
        ({"queues": "x"}, "'queues' must be a list of objects"),
        ({"queues": [1]}, "queues[0] must be a JSON object"),
        ({"users": [{"name": u, "password": "x"}]}, f"user '{u}': tags_not_present"),
        ({"users": [{"name": u, "password": "a", "password_hash": "b", "tags": ""}]},
         "both_password_and_password_hash_are_provided"),
        ({"users": [{"name": u, "password_hash": "!!!", "tags": "",
                     "hashing_algorithm": "rabbit_password_hashing_sha256"}]}, "not valid base64"),
        ({"users": [{"name": u, "password_hash": "abc", "tags": "",
                     "hashing_algorithm": "rabbit_password_hashing_bcrypt"}]}, "unsupported hashing_algorithm"),
        ({"users": [{"name": u, "password": "x", "tags": "", "limits": {"max-connections": "1"}}]},
         f"user '{u}': max-connections should be a number, actually was <<\"1\">>"),  # limits: issue 16
        ({"vhosts": [{"name": v, "metadata": {"default_queue_type": "stream"}}]},
         "default_queue_type 'stream' is not supported"),
        ({"vhosts": [{"name": v, "default_queue_type": "quorum"}]},
         "default_queue_type 'quorum' is not supported by this node: quorum queues need a clustered node"),
        ({"permissions": [{"user": u, "vhost": "/", **FULL}]}, f"user '{u}' does not exist"),
        ({"permissions": [{"user": "guest", "vhost": "/", "configure": "(", "write": "", "read": ""}]},
         "invalid configure permission regex"),
        ({"topic_permissions": [{"user": u, "vhost": "/", "exchange": "amq.topic", "write": ".*",
                                 "read": ".*"}]}, f"user '{u}' does not exist"),
        ({"topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": "(",
                                 "read": ".*"}]}, "invalid regular expression '('"),
        ({"parameters": [{"vhost": "/", "component": "vhost-limits", "name": "limits",
                          "value": {"max-widgets": 1}}]}, 'Unrecognised terms [{<<"max-widgets">>,1}] in limits'),
        ({"parameters": [{"vhost": "/", "component": "mqtt-port-to-vhost-mapping", "name": "m", "value": {}}]},
         "component 'mqtt-port-to-vhost-mapping' is not supported by hutch"),
        # shovels and federation upstreams are imported, and validated as set_parameter validates them
        ({"parameters": [{"vhost": "/", "component": "federation-upstream", "name": "up", "value": {}}]},
         "federation-upstream 'up' in vhost '/': Key \"uri\" not found in up"),
        ({"parameters": [{"vhost": "/", "component": "shovel", "name": "s", "value": {"src-uri": "amqp://"}}]},
         "shovel 's' in vhost '/': Must specify 'src-exchange' or 'src-queue'"),
        ({"policies": [{"vhost": "/", "name": name, "pattern": ".*", "definition": {"ha-mode": "all"}}]},
         'Validation failed: ["ha-mode"] are not recognised policy settings'),
        ({"queues": [{**queue, "vhost": v}]}, f"virtual host '{v}' does not exist and the definitions do not"),
        ({"queues": [{**queue, "arguments": {"x-queue-type": "quorum"}}]}, "quorum queues need a clustered node"),
        ({"queues": [{**queue, "arguments": {"x-message-ttl": "abc"}}]}, "invalid arg 'x-message-ttl'"),
        ({"queues": [{"name": q, "vhost": "/"}]}, "'durable' is missing"),
        ({"queues": [{**queue, "durable": "true"}]}, "'durable' must be true or false"),
        ({"queues": [{**queue, "name": "x" * 256}]}, "name is longer than 255 bytes"),
        ({"exchanges": [{"name": q, "vhost": "/", "type": "x-modulus-hash", "durable": True}]},
         "unknown exchange type 'x-modulus-hash'"),
        ({"exchanges": [{"name": q, "vhost": "/", "type": "x-delayed-message", "durable": True}]},
         "'x-delayed-type' must be an existing exchange type"),
        ({"exchanges": [{"name": q, "vhost": "/", "type": "x-consistent-hash", "durable": True,
                         "arguments": {"hash-property": "priority"}}]}, "Unsupported property: priority"),
        ({"bindings": [{"source": "amq.direct", "vhost": "/", "destination": q, "destination_type": "queue",
                        "routing_key": "k", "arguments": {}}]}, f"no queue '{q}' in vhost '/'"),
        ({"bindings": [{"source": q, "vhost": "/", "destination": "amq.direct", "destination_type": "exchange",
                        "routing_key": "k", "arguments": {}}]}, f"no exchange '{q}' in vhost '/'"),
        ({"bindings": [{"source": "amq.headers", "vhost": "/", "destination": "amq.direct",
                        "destination_type": "exchange", "arguments": {"x-match": "bogus"}}]},
         "Invalid x-match field value"),
        ({"bindings": [{"source": "amq.direct", "vhost": "/", "destination": "x", "destination_type": "topic"}]},
         "'destination_type' must be"),
    ]


def test_bad_documents_are_400_with_a_reason(api: Api):
    name = unique("bad")
    for doc, reason in bad_documents(name):
        if os.environ.get(TEST_WORKERS_ENV) and "quorum queues need a clustered node" in reason:
            continue  # a node of workers is their cluster (docs/scaling.md): it takes quorum queues
        reply = post_definitions(api, doc)
        assert reply.status == 400, (doc, reply.body)
        assert reply.body["error"] == "bad_request"
        assert reason in reply.body["reason"], (doc, reply.body)
    assert api.get(f"/api/users/u-{name}").status == 404
    assert api.get(f"/api/vhosts/v-{name}").status == 404
    assert api.get(f"/api/queues/%2F/q-{name}").status == 404


def test_import_is_all_or_nothing(api: Api):
    """Everything is checked before anything changes: RabbitMQ 3.10.8 would have created the user, the
    vhost, the permission, the exchange and the queue before failing on the binding."""
    name = unique("aon")
    doc = {
        "users": [{"name": name, "password": "pw", "tags": ["management"]}],
        "vhosts": [{"name": name}],
        "permissions": [{"user": name, "vhost": name, **FULL}],
        "policies": [{"vhost": name, "name": "p", "pattern": ".*", "definition": {"max-length": 1}}],
        "exchanges": [{"name": "x", "vhost": name, "type": "direct", "durable": True}],
        "queues": [{"name": "q", "vhost": name, "durable": True}],
        "bindings": [{"source": "x", "vhost": name, "destination": "q", "destination_type": "queue",
                      "routing_key": "k"},
                     {"source": "x", "vhost": name, "destination": "missing", "destination_type": "queue",
                      "routing_key": "k"}],
    }
    reply = post_definitions(api, doc)
    assert reply.status == 400
    assert reply.body["reason"] == (f"binding of queue 'missing' in vhost '{name}' to exchange 'x': "
                                    f"no queue 'missing' in vhost '{name}'")
    assert api.get(f"/api/users/{seg(name)}").status == 404
    assert api.get(f"/api/vhosts/{seg(name)}").status == 404
    del doc["bindings"][1]
    assert post_definitions(api, doc).status == 204
    assert [b["destination"] for b in export(api, name)["bindings"]] == ["q"]
    assert api.delete(f"/api/vhosts/{seg(name)}").status == 204
    assert api.delete(f"/api/users/{seg(name)}").status == 204


def test_plugin_exchange_types_import_and_export(api: Api):
    """x-consistent-hash (weights as binding keys), x-random, x-local-random and x-delayed-message, as a
    RabbitMQ export with those plugins lists them; a bad weight is refused before anything changes."""
    name = unique("plugx")
    doc = {
        "vhosts": [{"name": name}],
        "exchanges": [
            {"name": "ring", "vhost": name, "type": "x-consistent-hash", "durable": True,
             "arguments": {"hash-header": "user"}},
            {"name": "later", "vhost": name, "type": "x-delayed-message", "durable": True,
             "arguments": {"x-delayed-type": "topic"}},
            {"name": "any", "vhost": name, "type": "x-random", "durable": True},
            {"name": "near", "vhost": name, "type": "x-local-random", "durable": True},
        ],
        "queues": [{"name": "q", "vhost": name, "durable": True}],
        "bindings": [{"source": "ring", "vhost": name, "destination": "q", "destination_type": "queue",
                      "routing_key": "10"},
                     {"source": "later", "vhost": name, "destination": "q", "destination_type": "queue",
                      "routing_key": "a.*"},
                     {"source": "any", "vhost": name, "destination": "q", "destination_type": "queue",
                      "routing_key": ""}],
    }
    bad = {**doc, "bindings": [*doc["bindings"], {"source": "ring", "vhost": name, "destination": "q",
                                                  "destination_type": "queue", "routing_key": "heavy"}]}
    reply = post_definitions(api, bad)
    assert reply.status == 400 and "The binding key must be an integer" in reply.body["reason"]
    assert api.get(f"/api/vhosts/{seg(name)}").status == 404
    assert post_definitions(api, doc).status == 204
    exported = export(api, name)
    assert {(x["name"], x["type"]) for x in exported["exchanges"]} == {
        ("ring", "x-consistent-hash"), ("later", "x-delayed-message"), ("any", "x-random"),
        ("near", "x-local-random")}
    assert {(b["source"], b["routing_key"]) for b in exported["bindings"]} == {("ring", "10"), ("later", "a.*"),
                                                                               ("any", "")}
    later = api.get(f"/api/exchanges/{seg(name)}/later").body
    assert later["arguments"] == {"x-delayed-type": "topic"} and later["messages_delayed"] == 0
    assert api.put(f"/api/exchanges/{seg(name)}/more", {"type": "x-random"}).status == 201
    reply = api.put(f"/api/exchanges/{seg(name)}/wrong", {"type": "x-delayed-message", "arguments": {}})
    assert reply.status == 400, reply.body
    assert "'x-delayed-type' must be an existing exchange type" in reply.body["reason"]
    assert api.delete(f"/api/vhosts/{seg(name)}").status == 204


def test_empty_body_imports_nothing(api: Api):
    assert post_definitions(api, b"").status == 204
    assert post_definitions(api, {}).status == 204


# -- the management UI's forms ---------------------------------------------------------------------------


def multipart(fields: dict[str, tuple[str | None, bytes]]) -> tuple[bytes, str]:
    boundary = "hutch-" + uuid.uuid4().hex
    body = b""
    for name, (filename, content) in fields.items():
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
                 "Content-Type: application/json\r\n\r\n").encode() + content + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_multipart_upload_and_download(api: Api):
    name = unique("mp")
    body, content_type = multipart({"file": ("defs.json", json.dumps({"vhosts": [{"name": name}]}).encode())})
    reply = api.call("POST", "/api/definitions", raw=body, headers={"Content-Type": content_type})
    assert (reply.status, reply.body) == (204, None)
    assert api.get(f"/api/vhosts/{seg(name)}").status == 200
    # per vhost, as the UI's "Virtual host" choice sends it
    body, content_type = multipart({"file": ("d.json", json.dumps(
        {"queues": [{"name": "from-ui", "durable": True}]}).encode())})
    reply = api.call("POST", f"/api/definitions/{seg(name)}", raw=body, headers={"Content-Type": content_type})
    assert reply.status == 204
    assert api.get(f"/api/queues/{seg(name)}/from-ui").status == 200
    body, content_type = multipart({"other": (None, b"{}")})
    reply = api.call("POST", "/api/definitions", raw=body, headers={"Content-Type": content_type})
    assert (reply.status, reply.body["reason"]) == (400, "failed_to_parse_json")
    # a download (?download= names the file) authenticates with the Authorization header
    reply = api.get(f"/api/definitions/{seg(name)}?download=x.json")
    assert reply.status == 200 and reply.body["queues"][0]["name"] == "from-ui"
    assert reply.headers["Content-Disposition"] == "attachment; filename=x.json"
    # RabbitMQ's ?auth=base64(user:password) is not accepted (issue 15: credentials in a URL, and a
    # web page could post definitions as guest): the request is unauthenticated
    token = seg(base64.b64encode(b"guest:guest").decode())
    assert api.get(f"/api/definitions/{seg(name)}?auth={token}&download=x.json", auth=False).status == 401
    bad = seg(base64.b64encode(b"guest:wrong").decode())
    assert api.get(f"/api/definitions?auth={bad}", auth=False).status == 401
    assert api.delete(f"/api/vhosts/{seg(name)}").status == 204


# -- who may --------------------------------------------------------------------------------------------


def test_only_administrators(api: Api):
    name = unique("defs-user")
    not_admin = {"error": "not_authorised", "reason": "Not administrator user"}
    for tags in ("management", "monitoring", "policymaker"):
        user = f"{name}-{tags}"
        assert api.put(f"/api/users/{user}", {"password": "pw", "tags": tags}).status == 201
        assert api.put(f"/api/permissions/%2F/{user}", FULL).status == 201
        other = api.as_user(user, "pw")
        for reply in (other.get("/api/definitions"), other.get("/api/definitions/%2F"),
                      post_definitions(other, {"vhosts": [{"name": user}]}),
                      post_definitions(other, {"queues": [{"name": user, "durable": True}]}, "/")):
            assert (reply.status, reply.body) == (401, not_admin)
        assert api.get(f"/api/vhosts/{user}").status == 404
        assert api.get(f"/api/queues/%2F/{user}").status == 404
        assert api.delete(f"/api/users/{user}").status == 204
    reply = api.get("/api/definitions", auth=False)
    assert reply.status == 401 and reply.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert post_definitions(api.as_user("guest", "wrong"), {}).status == 401


# -- load_definitions at boot ----------------------------------------------------------------------------


def boot_document() -> dict[str, Any]:
    return {
        "users": [{"name": "boss", "password": "boss-pw", "tags": ["administrator"]},
                  {"name": "worker", "password_hash": rabbit_hash("worker-pw"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
        "vhosts": [{"name": "/"}, {"name": "jobs", "description": "job queues"}],
        "permissions": [{"user": "boss", "vhost": "/", **FULL}, {"user": "boss", "vhost": "jobs", **FULL},
                        {"user": "worker", "vhost": "jobs", **FULL}],
        "queues": [{"name": "work", "vhost": "jobs", "durable": True, "auto_delete": False, "arguments": {}}],
        "exchanges": [{"name": "tasks", "vhost": "jobs", "type": "direct", "durable": True}],
        "bindings": [{"source": "tasks", "vhost": "jobs", "destination": "work", "destination_type": "queue",
                      "routing_key": "run", "arguments": {}}],
    }


def test_load_definitions_at_boot(tmp_path: Path):
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(boot_document()))
    server = start_server(tmp_path, config_text=f"load_definitions = {path}\n")
    try:
        wait_mgmt(server)
        api = Api(server.mgmt_url, "boss", "boss-pw")
        # imported before the listeners accepted clients: the first client finds it all
        assert "definitions loaded from" in server.log()
        assert server.log().index("definitions loaded from") < server.log().index("AMQP listener started")
        # as RabbitMQ, a node that loads definitions does not create the default user
        assert not can_login(server.amqp_port, "guest", "guest")
        assert api.ok("/api/vhosts/jobs")["description"] == "job queues"
        with connect(server.amqp_port, "worker", "worker-pw", "jobs") as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("tasks", "run", b"job-1", pika.BasicProperties(delivery_mode=2))
        server.stop()
        # loaded again at every boot: existing queues are kept (with their messages), users updated
        doc = boot_document()
        doc["users"][0]["password"] = "rotated"
        path.write_text(json.dumps(doc))
        server = start_server(tmp_path, config_text=f"load_definitions = {path}\n")
        wait_mgmt(server)
        api = Api(server.mgmt_url, "boss", "rotated")
        assert api.ok("/api/queues/jobs/work")["messages"] == 1
        assert not can_login(server.amqp_port, "boss", "boss-pw")
    finally:
        server.stop()


def run_server(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "hutch.conf"
    config.write_text(config_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    args = [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "0", "--management-port", "0",
            "--data-dir", str(tmp_path / "data"), "--config", str(config), "--log-level", "error", "--no-cluster",
            "--workers", "1"]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.parametrize(("content", "message"), [
    (None, "No such file or directory"),
    ("{\"users\": [", "not valid JSON: Expecting value: line 1 column 12 (char 11)"),
    ("[]", "not a JSON object but a JSON list"),
    (json.dumps({"queues": [{"name": "q", "vhost": "/", "durable": True}]}),
     "queues[0]: virtual host '/' does not exist and the definitions do not create it"),
    (json.dumps({"users": [{"name": "x", "password": "pw"}]}), "user 'x': tags_not_present"),
])
def test_load_definitions_errors_exit_1_with_one_line(tmp_path: Path, content: str | None, message: str):
    path = tmp_path / "definitions.json"
    if content is not None:
        path.write_text(content)
    result = run_server(tmp_path, f"load_definitions = {path}\n")
    assert result.returncode == 1
    assert result.stderr == f"hutch-server: cannot load definitions from {path}: {message}\n"


def test_load_definitions_empty_value_is_a_config_error(tmp_path: Path):
    result = run_server(tmp_path, "load_definitions =\n")
    assert result.returncode == 2
    assert "invalid value '' for 'load_definitions'" in result.stderr


# -- rabbitmqadmin ---------------------------------------------------------------------------------------


def find_rabbitmqadmin() -> str | None:
    found = sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/"
                             "priv/www/cli/rabbitmqadmin"))
    return found[-1] if found else shutil.which("rabbitmqadmin")


RABBITMQADMIN = find_rabbitmqadmin()


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed (looked under "
                    "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/ "
                    "and on PATH)")
def test_rabbitmqadmin_export_and_import(clean_mgmt: ServerInfo, clean_api: Api, tmp_path: Path):
    api = clean_api
    build_topology(clean_mgmt, api)

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        python = shutil.which("python3") or sys.executable
        return subprocess.run([python, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P", str(clean_mgmt.management_port),
                               "-u", "guest", "-p", "guest", *args], capture_output=True, text=True, timeout=60)

    everything, dev = tmp_path / "all.json", tmp_path / "dev.json"
    result = admin("export", str(everything))
    assert result.returncode == 0, result.stderr
    assert json.loads(everything.read_text()) == export(api)
    result = admin("-V", "dev", "export", str(dev))
    assert result.returncode == 0, result.stderr
    assert json.loads(dev.read_text()) == export(api, "dev")

    doc = json.loads(everything.read_text())
    doc["vhosts"].append({"name": "copied"})
    doc["queues"].append({"name": "added", "vhost": "copied", "durable": True, "auto_delete": False,
                          "arguments": {}})
    everything.write_text(json.dumps(doc))
    result = admin("import", str(everything))
    assert result.returncode == 0, result.stderr
    assert api.get("/api/queues/copied/added").status == 200
    result = admin("-V", "copied", "import", str(dev))
    assert result.returncode == 0, result.stderr
    assert [q["name"] for q in export(api, "copied")["queues"]] == ["added", "orders", "scratch"]

    (tmp_path / "bad.json").write_text(json.dumps({"queues": [{"name": "q", "vhost": "nope", "durable": True}]}))
    result = admin("import", str(tmp_path / "bad.json"))
    assert result.returncode == 1
    assert "virtual host 'nope' does not exist" in result.stderr



def test_topic_permissions_round_trip(clean_api: Api):
    api = clean_api
    body = {"exchange": "amq.topic", "write": "^a\\.", "read": ".*"}
    assert api.put("/api/topic-permissions/%2F/guest", body).status == 201
    doc = api.ok("/api/definitions")
    assert doc["topic_permissions"] == [{"user": "guest", "vhost": "/", **body}]
    assert api.delete("/api/topic-permissions/%2F/guest").status == 204
    assert api.call("POST", "/api/definitions", doc).status == 204
    assert api.ok("/api/topic-permissions") == [{"user": "guest", "vhost": "/", **body}]
