"""A rabbitmq.conf written for RabbitMQ starts hutch: the RabbitMQ keys without an equivalent here
(acceptor counts, the metrics collector, the memory calculation strategy, reverse DNS off) are checked
and change nothing, and `log.console = false` turns the console log off (docs/configuration.md, "RabbitMQ
keys without an effect"). pika's own broker config (its testdata/rabbitmq.conf.in) has the first four and
the last one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pika

from conftest import start_server

RABBITMQ_KEYS = """\
num_acceptors.tcp = 10
num_acceptors.ssl = 10
reverse_dns_lookups = false
management_agent.disable_metrics_collector = true
vm_memory_calculation_strategy = rss
loopback_users.guest = true
"""


def test_a_rabbitmq_conf_starts_the_node_and_log_console_false_silences_it(tmp_path: Path) -> None:
    server = start_server(tmp_path, config_text=RABBITMQ_KEYS + "log.console = false\nlog.console.level = debug\n")
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
        ch = conn.channel()
        ch.queue_declare("from-a-rabbitmq-conf")
        ch.basic_publish("", "from-a-rabbitmq-conf", b"hello")
        assert conn.channel().basic_get("from-a-rabbitmq-conf", auto_ack=True)[2] == b"hello"
        conn.close()
    finally:
        assert server.stop() == 0
    assert server.log_path.read_text() == ""  # no console log at all, whatever log.console.level says


def test_reverse_dns_lookups_true_is_refused_with_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "hutch.conf"
    conf.write_text(RABBITMQ_KEYS + "reverse_dns_lookups = true\n")
    out = subprocess.run([sys.executable, "-m", "hutch.cli.server", "--config", str(conf), "--data-dir",
                          str(tmp_path / "data"), "--amqp-port", "0", "--management-port", "0", "--no-cluster"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert lines == [f"hutch-server: {conf}:7: invalid value 'true' for 'reverse_dns_lookups': expected false "
                     "(hutch shows a connection's peer address, never a looked-up host name)"]
