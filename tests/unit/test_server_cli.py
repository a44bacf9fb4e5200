"""hutch-server's command line: flag parsing, the one-line error contract, hand-off to run_node.

run_node is replaced by a fake module, so no listener is ever started.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import pytest

from hutch import __version__
from hutch.cli import server
from hutch.config import Config


@pytest.fixture
def fake_run_node(monkeypatch):
    """Install a fake hutch.runtime.app whose run_node records its Config."""
    seen: list[Config] = []

    def run_node(config: Config, services=(), prepare=None) -> int:
        seen.append(config)
        services_seen.extend(services)
        return 0

    services_seen: list[object] = []
    run_node.services = services_seen  # type: ignore[attr-defined]

    module = types.ModuleType("hutch.runtime.app")
    module.run_node = run_node  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hutch.runtime.app", module)
    for name in list(os.environ):
        if name.startswith("HUTCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HUTCH_WORKERS", "1")  # auto (the default) would supervise real workers on a multi-core machine
    root = logging.getLogger()
    level = root.level
    yield seen
    root.setLevel(level)


def test_flags_reach_run_node(fake_run_node, tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text("heartbeat = 15\n", encoding="utf-8")
    argv = [
        "--config", str(conf), "--data-dir", str(tmp_path / "data"), "--amqp-port", "5999",
        "--management-port", "15999", "--node-name", "n1@h", "--log-level", "warning",
    ]  # fmt: skip
    assert server.main(argv) == 0
    (config,) = fake_run_node
    assert config.heartbeat_s == 15
    assert config.data_dir == str(tmp_path / "data")
    assert (config.amqp_port, config.management_port) == (5999, 15999)
    assert config.node_name == "n1@h"
    assert config.log_level == "warning"
    assert logging.getLogger().level == logging.WARNING
    from hutch.mgmt import start_management

    assert sys.modules["hutch.runtime.app"].run_node.services == [start_management]


def test_env_is_read(fake_run_node, monkeypatch):
    monkeypatch.setenv("HUTCH_AMQP_PORT", "6001")
    assert server.main([]) == 0
    assert fake_run_node[0].amqp_port == 6001


def test_run_node_exit_code_is_returned(fake_run_node, monkeypatch):
    monkeypatch.setattr(sys.modules["hutch.runtime.app"], "run_node", lambda config, services=(), prepare=None: 3)
    assert server.main([]) == 3


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--amqp-port", "x"], "hutch-server: error: argument --amqp-port: invalid int value: 'x'"),
        (["--bogus"], "hutch-server: error: unrecognized arguments: --bogus"),
        (["--data-dir"], "hutch-server: error: argument --data-dir: expected one argument"),
        (["extra"], "hutch-server: error: unrecognized arguments: extra"),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(fake_run_node, capsys, argv, line):
    assert server.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == line + "\n"
    assert fake_run_node == []


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--amqp-port", "70000"], "hutch-server: --amqp-port: invalid value '70000': expected an integer between 0 and 65535"),
        (["--log-level", "loud"], "hutch-server: --log-level: invalid value 'loud': expected one of "
         "debug, info, warning, error, critical, none"),
    ],
)  # fmt: skip
def test_bad_value_is_config_error_exit_2(fake_run_node, capsys, argv, line):
    assert server.main(argv) == 2
    assert capsys.readouterr().err == line + "\n"
    assert fake_run_node == []


def test_bad_config_file_is_one_line(fake_run_node, capsys, tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text("heartbeat = 1\nframe_max = abc\n", encoding="utf-8")
    assert server.main(["--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hutch-server: {conf}:2: invalid value 'abc' for 'frame_max': "
        "expected 0 (no limit) or an integer between 4096 and 2147483647\n"
    )


def test_bad_env_names_variable(fake_run_node, capsys, monkeypatch):
    monkeypatch.setenv("HUTCH_MANAGEMENT_PORT", "http")
    assert server.main([]) == 2
    assert capsys.readouterr().err.startswith("hutch-server: HUTCH_MANAGEMENT_PORT: invalid value 'http'")


def test_version(fake_run_node, capsys):
    assert server.main(["--version"]) == 0
    assert capsys.readouterr().out == f"hutch-server {__version__}\n"
    assert fake_run_node == []


def test_help(fake_run_node, capsys):
    assert server.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hutch-server")
    for flag in ("--config", "--data-dir", "--amqp-port", "--management-port", "--node-name", "--log-level"):
        assert flag in out


def test_configure_logging_levels():
    root = logging.getLogger()
    level = root.level
    try:
        server.configure_logging("debug")
        assert root.level == logging.DEBUG
        server.configure_logging("none")
        assert root.level > logging.CRITICAL
    finally:
        root.setLevel(level)


def test_module_entry_point_bad_flag_subprocess():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "hutch.cli.server", "--amqp-port", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == ["hutch-server: error: argument --amqp-port: invalid int value: 'x'"]


def test_a_lone_node_is_a_cluster_of_one_unless_told_otherwise(fake_run_node, monkeypatch, tmp_path):
    """Issue 16: as a RabbitMQ node, hutch-server alone is a cluster (of one) on inter-node port 25672;
    --no-cluster, HUTCH_CLUSTER_ENABLED=false or cluster.enabled = false turn clustering off."""
    assert server.main([]) == 0
    assert (fake_run_node[-1].cluster_enabled, fake_run_node[-1].cluster_port) == (True, 25672)
    assert server.main(["--no-cluster"]) == 0
    assert fake_run_node[-1].cluster_enabled is False
    monkeypatch.setenv("HUTCH_CLUSTER_ENABLED", "false")
    assert server.main([]) == 0
    assert fake_run_node[-1].cluster_enabled is False
    monkeypatch.delenv("HUTCH_CLUSTER_ENABLED")
    conf = tmp_path / "hutch.conf"
    conf.write_text("cluster.enabled = false\n", encoding="utf-8")
    assert server.main(["--config", str(conf)]) == 0
    assert fake_run_node[-1].cluster_enabled is False


def test_join_without_clustering_is_a_one_line_error(fake_run_node, capsys):
    assert server.main(["--no-cluster", "--join", "n1@127.0.0.1:25672"]) == 2
    assert capsys.readouterr().err.startswith("hutch-server: --join (cluster.join) asks to join a cluster, but "
                                              "clustering is turned off")


def test_auto_stays_one_process_for_a_node_set_up_for_a_cluster(fake_run_node, monkeypatch, tmp_path, caplog):
    """`--workers auto` (the default) with `--join` or an inter-node port: one process (run_node, no
    supervisor), whatever the machine's cores, and the start log says why (runtime/workers/auto.py)."""
    monkeypatch.delenv("HUTCH_WORKERS")
    caplog.set_level(logging.INFO, logger="hutch.server")
    data = str(tmp_path / "data")
    assert server.main(["--data-dir", data, "--join", "n1@127.0.0.1:25672"]) == 0
    assert fake_run_node[-1].workers == 0 and fake_run_node[-1].cluster_join == "n1@127.0.0.1:25672"
    assert "workers auto: 1 (--join" in caplog.text
    assert server.main(["--data-dir", data, "--cluster-port", "25682"]) == 0
    assert "workers auto: 1 (an inter-node port is configured" in caplog.text
    assert len(fake_run_node) == 2
