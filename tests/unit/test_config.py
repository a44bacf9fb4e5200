"""Pure tests of hutch.config: defaults, the file parser, precedence and error messages."""

from __future__ import annotations

import dataclasses

import pytest

from hutch.config import (
    Config,
    ConfigError,
    default_node_name,
    load_config,
    parse_config_text,
    parse_information_unit,
)


def _write(tmp_path, text: str, name: str = "hutch.conf") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- defaults --------------------------------------------------------------------------------


def test_defaults_are_rabbitmqs():
    c = load_config({}, {}, hostname="box.example.com")
    assert (c.amqp_host, c.amqp_port) == ("", 5672)  # both families (issue 16: IPv6)
    assert (c.management_host, c.management_port) == ("", 15672)
    assert c.data_dir == "./var"
    assert c.node_name == "hutch@box"
    assert c.cluster_name == "hutch@box"
    assert (c.frame_max, c.channel_max, c.heartbeat_s) == (131072, 2047, 60)
    assert c.max_message_size == 16 * 1024 * 1024
    assert c.handshake_timeout_ms == 10_000
    assert c.consumer_timeout_ms == 30 * 60 * 1000
    assert (c.default_user, c.default_pass, c.default_vhost) == ("guest", "guest", "/")
    assert c.loopback_users == ("guest",)
    assert c.log_level == "info"
    assert c.vm_memory_high_watermark == 0.4
    assert c.disk_free_limit_bytes == 50_000_000
    assert c.collect_statistics_interval_ms == 5000
    assert c.config_file is None and c.raw == {}


def test_config_is_frozen_and_hides_password():
    c = Config(node_name="n@h", default_pass="topsecret")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.amqp_port = 1  # type: ignore[misc]
    assert "topsecret" not in repr(c)
    assert c.cluster_name == "n@h"


def test_direct_construction_allows_port_zero():
    assert Config(amqp_port=0).amqp_port == 0


def test_default_node_name():
    assert default_node_name("host.domain") == "hutch@host"
    assert default_node_name("") == "hutch@localhost"
    assert default_node_name().startswith("hutch@")


# -- file parsing ----------------------------------------------------------------------------

FULL_FILE = """\
# a comment
   # an indented comment

listeners.tcp.default = 127.0.0.1:5673
management.tcp.port = 15673
management.tcp.ip = ::1
frame_max = 65536
channel_max = 100
heartbeat = 30
max_message_size = 1048576
handshake_timeout = 5000
consumer_timeout = 60000
default_user = admin
default_pass = pa=ss#word
default_vhost = main
loopback_users.guest = false
loopback_users.admin = true
log.console.level = DEBUG
vm_memory_high_watermark.relative = 0.6
disk_free_limit.absolute = 2GiB
collect_statistics_interval = 10000
cluster_name = prod
node_name = rabbit@node1
data_dir = /var/lib/hutch
"""


def test_full_file(tmp_path):
    path = _write(tmp_path, FULL_FILE)
    c = load_config({"config": path}, {}, hostname="h")
    assert (c.amqp_host, c.amqp_port) == ("127.0.0.1", 5673)
    assert (c.management_host, c.management_port) == ("::1", 15673)
    assert (c.frame_max, c.channel_max, c.heartbeat_s) == (65536, 100, 30)
    assert c.max_message_size == 1048576
    assert (c.handshake_timeout_ms, c.consumer_timeout_ms) == (5000, 60000)
    assert (c.default_user, c.default_pass, c.default_vhost) == ("admin", "pa=ss#word", "main")
    assert c.loopback_users == ("admin",)
    assert c.log_level == "debug"
    assert c.vm_memory_high_watermark == 0.6
    assert c.disk_free_limit_bytes == 2 * 1024**3
    assert c.collect_statistics_interval_ms == 10000
    assert c.cluster_name == "prod"
    assert c.node_name == "rabbit@node1"
    assert c.data_dir == "/var/lib/hutch"
    assert c.config_file == path
    assert c.raw["default_pass"] == "pa=ss#word"
    assert c.raw["listeners.tcp.default"] == "127.0.0.1:5673"


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [("5673", None, 5673), ("127.0.0.1:5673", "127.0.0.1", 5673), ("[::1]:5673", "::1", 5673),
     ("::1:5673", "::1", 5673), (":::5672", "::", 5672), ("localhost:5672", "localhost", 5672)],
)  # fmt: skip
def test_listener_forms(value, host, port):
    settings, _ = parse_config_text(f"listeners.tcp.default = {value}")
    assert settings.get("amqp_host") == host
    assert settings["amqp_port"] == port


def test_last_occurrence_wins():
    settings, raw = parse_config_text("heartbeat = 10\nheartbeat = 20\n")
    assert settings == {"heartbeat_s": 20}
    assert raw == {"heartbeat": "20"}


def test_no_spaces_around_equals_and_crlf():
    settings, _ = parse_config_text("heartbeat=10\r\nchannel_max =5\r\n")
    assert settings == {"heartbeat_s": 10, "channel_max": 5}


def test_loopback_users_semantics():
    assert parse_config_text("loopback_users.guest = false")[0]["loopback_users"] == ()
    assert parse_config_text("loopback_users = none")[0]["loopback_users"] == ()
    assert parse_config_text("loopback_users = none\nloopback_users.bob = true")[0]["loopback_users"] == (
        "bob",
    )
    assert parse_config_text("loopback_users.bob = true")[0]["loopback_users"] == ("guest", "bob")
    assert parse_config_text("loopback_users.guest = true")[0]["loopback_users"] == ("guest",)
    assert "loopback_users" not in parse_config_text("heartbeat = 1")[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("50000000", 50_000_000), ("50MB", 50_000_000), ("50mb", 50_000_000), ("1GB", 10**9), ("500kB", 500_000),
     ("2GiB", 2 * 1024**3), ("2G", 2 * 1024**3), ("512k", 512 * 1024), ("512KiB", 512 * 1024),
     ("3M", 3 * 1024**2), ("3MiB", 3 * 1024**2), ("1TB", 10**12), ("0", 0)],
)  # fmt: skip
def test_information_units(text, expected):
    assert parse_information_unit(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "1.5GB", "-1", "10 XB", "1e9"])
def test_information_units_invalid(text):
    with pytest.raises(ValueError):
        parse_information_unit(text)


# -- file errors: one line, file:line, key, what is allowed -----------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "# c\n\nframe_max = abc",
            "hutch.conf:3: invalid value 'abc' for 'frame_max': "
            "expected 0 (no limit) or an integer between 4096 and 2147483647",
        ),
        ("frame_max = 100", "hutch.conf:1: invalid value '100' for 'frame_max'"),
        ("channel_max = 65536", "expected an integer between 0 and 65535"),
        ("heartbeat = -1", "invalid value '-1' for 'heartbeat': expected an integer between 0 and 65535"),
        ("listeners.tcp.default = 70000", "invalid value '70000' for 'listeners.tcp.default'"),
        ("listeners.tcp.default = host:", "for 'listeners.tcp.default': expected a port"),
        ("management.tcp.port = 65536", "expected an integer between 0 and 65535"),
        ("management.tcp.ip = not a host", "expected an IP address or host name"),
        ("max_message_size = 536870913", "expected an integer between 1 and 536870912"),
        ("log.console.level = loud", "expected one of debug, info, warning, error, critical, none"),
        ("vm_memory_high_watermark.relative = 1.5", "expected a fraction of RAM between 0.0 and 1.0"),
        ("vm_memory_high_watermark.relative = half", "expected a fraction of RAM"),
        ("disk_free_limit.absolute = lots", "for 'disk_free_limit.absolute': expected a size in bytes"),
        ("loopback_users.guest = maybe", "for 'loopback_users.guest': expected true or false"),
        ("loopback_users = all", "for 'loopback_users': expected none"),
        ("default_user =", "invalid value '' for 'default_user': expected a non-empty string"),
        ("node_name = a b", "for 'node_name': expected a name like"),
        ("heartbeat = 10 # seconds", "(inline comments are not supported)"),
        ("frame_maxx = 4096", "hutch.conf:1: unknown key 'frame_maxx'; did you mean 'frame_max'?"),
        ("zzzz = 1", "unknown key 'zzzz'; see docs/configuration.md"),
        (
            "listeners.tcp.other = 5672",
            "unknown key 'listeners.tcp.other'; did you mean 'listeners.tcp.default'?",
        ),
        ("just some words", "hutch.conf:1: expected 'key = value', got 'just some words'"),
        ("= 5", "expected 'key = value'"),
    ],
)
def test_file_errors(text, message):
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, source="hutch.conf")
    text_of_error = str(info.value)
    assert message in text_of_error
    assert "\n" not in text_of_error
    assert text_of_error.startswith("hutch.conf:")


def test_missing_file_is_config_error(tmp_path):
    missing = str(tmp_path / "nope.conf")
    with pytest.raises(
        ConfigError, match=r"cannot read config file '.*nope\.conf': No such file or directory"
    ):
        load_config({"config": missing}, {})


def test_non_utf8_file(tmp_path):
    path = tmp_path / "bad.conf"
    path.write_bytes(b"default_user = \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config({"config": str(path)}, {})


def test_error_names_the_file_as_given(tmp_path):
    path = _write(tmp_path, "heartbeat = x\n")
    with pytest.raises(ConfigError, match=rf"^{path}:1: invalid value 'x' for 'heartbeat'"):
        load_config({"config": path}, {})


# -- precedence: flag > env > file > default -------------------------------------------------


def test_precedence(tmp_path):
    path = _write(
        tmp_path, "listeners.tcp.default = 127.0.0.1:1111\nmanagement.tcp.port = 2222\ndata_dir = /file\n"
    )
    env = {"HUTCH_CONFIG": path, "HUTCH_MANAGEMENT_PORT": "3333", "HUTCH_DATA_DIR": "/env"}
    c = load_config({"data_dir": "/flag"}, env, hostname="h")
    assert c.amqp_port == 1111 and c.amqp_host == "127.0.0.1"  # file (host kept even if port overridden)
    assert c.management_port == 3333  # env beats file
    assert c.data_dir == "/flag"  # flag beats env and file
    c2 = load_config({"amqp_port": 4444}, env, hostname="h")
    assert (c2.amqp_host, c2.amqp_port) == ("127.0.0.1", 4444)


def test_config_flag_beats_config_env(tmp_path):
    from_env = _write(tmp_path, "heartbeat = 1\n", "env.conf")
    from_flag = _write(tmp_path, "heartbeat = 2\n", "flag.conf")
    c = load_config({"config": from_flag}, {"HUTCH_CONFIG": from_env})
    assert c.heartbeat_s == 2 and c.config_file == from_flag
    assert load_config({}, {"HUTCH_CONFIG": from_env}).heartbeat_s == 1


def test_every_env_var(tmp_path):
    env = {
        "HUTCH_DATA_DIR": "/d",
        "HUTCH_AMQP_PORT": " 5000 ",
        "HUTCH_MANAGEMENT_PORT": "5001",
        "HUTCH_NODE_NAME": "n1@host",
        "HUTCH_LOG_LEVEL": "WARNING",
    }
    c = load_config({}, env)
    assert (c.data_dir, c.amqp_port, c.management_port, c.node_name, c.log_level) == (
        "/d", 5000, 5001, "n1@host", "warning"
    )  # fmt: skip
    assert c.cluster_name == "n1@host"


def test_empty_env_var_is_unset():
    c = load_config({}, {"HUTCH_AMQP_PORT": "", "HUTCH_CONFIG": "  "})
    assert c.amqp_port == 5672 and c.config_file is None


def test_unrelated_env_ignored():
    assert load_config({}, {"RABBITMQ_NODE_PORT": "1", "HUTCH_OTHER": "x"}).amqp_port == 5672


def test_none_flags_are_not_given():
    c = load_config({"amqp_port": None, "data_dir": None}, {"HUTCH_AMQP_PORT": "6000"})
    assert c.amqp_port == 6000 and c.data_dir == "./var"


def test_node_name_without_host_gets_one():
    assert load_config({"node_name": "alpha"}, {}, hostname="box.lan").node_name == "alpha@box"


def test_cluster_name_from_file_survives_node_name_flag(tmp_path):
    path = _write(tmp_path, "cluster_name = prod\n")
    c = load_config({"config": path, "node_name": "x@y"}, {})
    assert (c.node_name, c.cluster_name) == ("x@y", "prod")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"HUTCH_AMQP_PORT": "x"},
            "HUTCH_AMQP_PORT: invalid value 'x': expected an integer between 0 and 65535",
        ),
        ({"HUTCH_MANAGEMENT_PORT": "-1"}, "HUTCH_MANAGEMENT_PORT: invalid value '-1'"),
        ({"HUTCH_NODE_NAME": "a@b@c"}, "HUTCH_NODE_NAME: invalid value 'a@b@c'"),
        ({"HUTCH_LOG_LEVEL": "chatty"}, "HUTCH_LOG_LEVEL: invalid value 'chatty': expected one of debug"),
    ],
)
def test_env_errors_name_the_variable(env, message):
    with pytest.raises(ConfigError) as info:
        load_config({}, env)
    assert str(info.value) == message or str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"amqp_port": 70000}, "--amqp-port: invalid value '70000': expected an integer between 0 and 65535"),
        ({"management_port": -1}, "--management-port: invalid value '-1'"),
        ({"log_level": "loud"}, "--log-level: invalid value 'loud'"),
        ({"data_dir": ""}, "--data-dir: invalid value '': expected a non-empty string"),
    ],
)
def test_flag_errors_name_the_flag(flags, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_config(flags, {})


def test_bad_flag_reported_before_file_is_read(tmp_path):
    # A bad flag is reported even when the file would also be bad: flags are checked first.
    path = _write(tmp_path, "heartbeat = x\n")
    with pytest.raises(ConfigError, match="^--amqp-port"):
        load_config({"config": path, "amqp_port": "x"}, {})


def test_unknown_argv_key():
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config({"frame_max": 1}, {})


def test_absolute_memory_watermark_and_relative_disk_limit() -> None:
    settings, _raw = parse_config_text(
        "vm_memory_high_watermark.relative = 0.5\nvm_memory_high_watermark.absolute = 2GB\n"
        "disk_free_limit.absolute = 1GB\ndisk_free_limit.relative = 1.5\n", "t.conf")
    assert settings["vm_memory_high_watermark_bytes"] == 2_000_000_000
    assert settings["disk_free_limit_relative"] == 1.5
    # the last key wins, as with RabbitMQ's config schema
    settings, _raw = parse_config_text(
        "vm_memory_high_watermark.absolute = 2GB\nvm_memory_high_watermark.relative = 0.5\n", "t.conf")
    assert settings["vm_memory_high_watermark_bytes"] == 0
    assert settings["vm_memory_high_watermark"] == 0.5


def test_bad_absolute_watermark_and_relative_disk_limit() -> None:
    with pytest.raises(ConfigError, match="vm_memory_high_watermark.absolute"):
        parse_config_text("vm_memory_high_watermark.absolute = lots\n", "t.conf")
    with pytest.raises(ConfigError, match="disk_free_limit.relative"):
        parse_config_text("disk_free_limit.relative = -1\n", "t.conf")


def test_storage_knobs() -> None:
    settings, _raw = parse_config_text(
        "vm_memory_high_watermark_paging_ratio = 0.25\nqueue_index_embed_msgs_below = 1024\n"
        "msg_store_file_size_limit = 4MiB\nqueue_index_segment_entries = 4096\n", "t.conf")
    assert settings["vm_memory_high_watermark_paging_ratio"] == 0.25
    assert settings["queue_index_embed_msgs_below"] == 1024
    assert settings["msg_store_file_size_limit"] == 4 * 1024 * 1024
    assert settings["queue_index_segment_entries"] == 4096


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("vm_memory_high_watermark_paging_ratio = 2", "expected a fraction of the memory high watermark"),
        ("queue_index_embed_msgs_below = -1", "expected an integer between 0 and 536870912"),
        ("msg_store_file_size_limit = 1kB", "expected a size between 64kB and 2GiB"),
        ("queue_index_segment_entries = 3", "expected an integer between 16 and 1048576"),
    ],
)
def test_bad_storage_knobs(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config_text(line + "\n", "t.conf")


def test_cluster_and_quorum_keys() -> None:
    from hutch.config import parse_config_text

    settings, _raw = parse_config_text(
        "cluster.listener.port = 25672\ncluster.join = n1@127.0.0.1:25672\ncluster.metadata_timeout = 5000\n"
        "cluster.fault_injection = true\nquorum_cluster_size = 5\ndead_letter_worker_consumer_prefetch = 64\n"
        "raft.wal_max_size_bytes = 1048576\nraft.segment_max_entries = 1000\nquorum_commands_soft_limit = 10\n")
    assert settings == {"cluster_port": 25672, "cluster_join": "n1@127.0.0.1:25672",
                        "cluster_metadata_timeout_ms": 5000, "cluster_fault_injection": True,
                        "quorum_cluster_size": 5, "dead_letter_worker_consumer_prefetch": 64,
                        "raft_wal_max_size_bytes": 1048576, "raft_segment_max_entries": 1000,
                        "quorum_commands_soft_limit": 10}


def test_bad_join_and_segment_values_are_one_line_errors() -> None:
    import pytest as _pytest

    from hutch.config import ConfigError, parse_config_text

    with _pytest.raises(ConfigError, match="expected a seed node as NODE@HOST:PORT"):
        parse_config_text("cluster.join = n1\n")
    with _pytest.raises(ConfigError, match="raft.segment_max_entries"):
        parse_config_text("raft.segment_max_entries = 70000\n")


def test_port_zero_asks_for_any_free_port_on_every_listener():
    """Issue 22: harnesses start a node with port 0 everywhere and read the ports file (hutch/portfile.py)."""
    c = load_config({"amqp_port": "0", "management_port": "0", "cluster_port": "0"}, {})
    assert (c.amqp_port, c.management_port, c.cluster_port) == (0, 0, 0)
    env = {"HUTCH_AMQP_PORT": "0", "HUTCH_MANAGEMENT_PORT": "0", "HUTCH_CLUSTER_PORT": "0"}
    assert load_config({}, env).management_port == 0


def test_log_throttle_interval_key() -> None:
    assert load_config({}, {}).log_throttle_interval_ms == 10_000
    settings, _raw = parse_config_text("log.throttle_interval = 500\n", "t.conf")
    assert settings == {"log_throttle_interval_ms": 500}
    for bad in ("0", "-1", "2s", "2147483648"):
        with pytest.raises(ConfigError, match="expected an integer between 1 and 2147483647") as info:
            parse_config_text(f"log.throttle_interval = {bad}\n", "t.conf")
        assert "\n" not in str(info.value)


# -- RabbitMQ keys without an effect ------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "num_acceptors.tcp = 10", "num_acceptors.ssl = 1", "management_agent.disable_metrics_collector = true",
    "management_agent.disable_metrics_collector = false", "vm_memory_calculation_strategy = rss",
    "vm_memory_calculation_strategy = allocated", "reverse_dns_lookups = false",
])
def test_rabbitmq_keys_without_an_effect_are_accepted_and_set_nothing(line):
    settings, raw = parse_config_text(line)
    assert settings == {}
    assert raw == {line.split(" = ")[0]: line.split(" = ")[1]}


@pytest.mark.parametrize(("line", "expected"), [
    ("num_acceptors.tcp = 0", "an integer between 1 and 2147483647"),
    ("num_acceptors.ssl = many", "an integer between 1 and 2147483647"),
    ("management_agent.disable_metrics_collector = yes", "true or false"),
    ("vm_memory_calculation_strategy = pss", "one of rss, allocated, legacy, erlang"),
    ("reverse_dns_lookups = true", "false (hutch shows a connection's peer address, never a looked-up host name)"),
])
def test_rabbitmq_keys_without_an_effect_still_check_their_value(line, expected):
    with pytest.raises(ConfigError) as info:
        parse_config_text(line, "r.conf")
    key, value = line.split(" = ")
    assert str(info.value) == f"r.conf:1: invalid value '{value}' for '{key}': expected {expected}"


def test_log_console_false_turns_the_console_log_off_whatever_its_level():
    for text in ("log.console = false\nlog.console.level = debug", "log.console.level = debug\nlog.console = false"):
        settings, _raw = parse_config_text(text)
        assert Config(**settings).console_log_level == "none"
    settings, _raw = parse_config_text("log.console = true\nlog.console.level = warning")
    assert Config(**settings).console_log_level == "warning"
    assert Config().console_log_level == "info"
