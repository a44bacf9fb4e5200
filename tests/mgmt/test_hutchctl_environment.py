"""`hutchctl environment` (rabbitmqctl's `environment`) against a real node started from a configuration
file that holds secrets: the effective settings come out, in name order, as `name<TAB>value` lines or a
JSON object, and no secret does (the default user's password, a TLS key's passphrase, the cluster
secret from the environment), as RabbitMQ leaves them out (mgmt/environment.py). Non-administrators are refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import ServerInfo, start_server

from hutch.config import Config
from hutch.mgmt.environment import effective_settings

from .helpers import Api, wait_mgmt
from .test_hutchctl import fails, ok

SECRETS = ("pw-of-the-default-user-3141", "passphrase-of-the-key-2718", "secret-of-the-cluster-1618")
CONFIG = f"""
default_user = admin
default_pass = {SECRETS[0]}
ssl_options.password = {SECRETS[1]}
frame_max = 65536
"""
ADMIN = {"HUTCH_USER": "admin", "HUTCH_PASSWORD": SECRETS[0]}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = wait_mgmt(start_server(tmp_path_factory.mktemp("ctl-env"), config_text=CONFIG,
                                  env={"HUTCH_CLUSTER_SECRET": SECRETS[2]}), 30)
    yield info
    info.stop()


def test_the_effective_settings_without_their_secrets(node: ServerInfo) -> None:
    out = ok(node, "environment", env=ADMIN)
    lines = out.splitlines()
    assert lines[0] == "Application environment of node test@localhost ..."
    settings = dict(line.split("\t", 1) for line in lines[1:])
    assert list(settings) == sorted(settings)
    assert settings["frame_max"] == "65536"  # the file's value
    assert settings["channel_max"] == "2047"  # a default
    assert settings["default_user"] == "admin"
    assert settings["config_file"].endswith("hutch.conf")
    assert json.loads(settings["ssl_options"])["verify"] == "verify_none"
    for secret in SECRETS:
        assert secret not in out
    assert not {"default_pass", "cluster_secret", "raw"} & set(settings)
    assert "password" not in json.loads(settings["ssl_options"])


def test_json_is_the_settings_object(node: ServerInfo) -> None:
    doc = json.loads(ok(node, "--formatter", "json", "environment", env=ADMIN))
    assert doc["frame_max"] == 65536 and doc["loopback_users"] == ["guest"]
    assert doc["ssl_options"]["versions"] == []
    assert not any(secret in json.dumps(doc) for secret in SECRETS)


def test_only_administrators_see_it(node: ServerInfo) -> None:
    api = Api(f"http://127.0.0.1:{node.management_port}", "admin", SECRETS[0])
    api.put("/api/users/watcher", {"password": "w", "tags": "monitoring"})
    assert fails(node, 1, "environment", env={"HUTCH_USER": "watcher", "HUTCH_PASSWORD": "w"}) == \
        "hutchctl: access refused for user 'watcher': Not administrator user"


def test_a_secret_is_what_config_declares_hidden(tmp_path: Path) -> None:
    """Pure: every field of Config declared `repr=False` is left out, nested ones too."""
    settings = effective_settings(Config(default_pass="x", cluster_secret="y", data_dir=str(tmp_path)))
    assert "default_pass" not in settings and "cluster_secret" not in settings
    assert settings["data_dir"] == str(tmp_path)
    assert "password" not in settings["management_ssl"]
