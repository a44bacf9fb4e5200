"""Option parsing and checking (pure: no Spark, no broker)."""

from __future__ import annotations

import pytest

from hutch.spark.options import HutchOptionError, parse_uri, read_options, write_options

URI = "amqp://guest:guest@127.0.0.1:5673/%2F"


def test_uri_parts_and_defaults() -> None:
    u = parse_uri("amqp://alice:s%40cret@broker.example:5999/prod?heartbeat=5&connection_timeout=2500")
    assert (u.host, u.port, u.username, u.password, u.vhost) == ("broker.example", 5999, "alice", "s@cret", "prod")
    assert u.heartbeat_s == 5 and u.connect_timeout_s == 2.5
    d = parse_uri("amqp://localhost")
    assert (d.port, d.vhost, d.username, d.heartbeat_s) == (5672, "/", "guest", 60)
    assert parse_uri("amqp://h/%2F").vhost == "/"
    assert "s@cret" not in u.display()


@pytest.mark.parametrize(("uri", "fragment"), [
    ("http://localhost", "must start with amqp://"),
    ("amqp://localhost?certfile=/c.pem", "certfile is a TLS parameter: use amqps://"),
    ("amqp://localhost:notaport", "bad URI"),
    ("amqp://", "no host"),
    ("amqp://h/a/b", "one path segment"),
    ("amqp://h?heartbeat=x", "heartbeat must be a non-negative integer"),
    ("amqp://h?frame_max=100", "frame_max must be 0 or at least 4096"),
    ("amqp://h?color=red", "unsupported query parameter 'color'"),
])
def test_bad_uris_say_what_is_wrong(uri: str, fragment: str) -> None:
    with pytest.raises(HutchOptionError, match="option 'uri'") as err:
        parse_uri(uri)
    assert fragment in str(err.value)


def test_password_is_not_echoed_in_errors() -> None:
    with pytest.raises(HutchOptionError) as err:
        parse_uri("http://u:topsecret@h")
    assert "topsecret" not in str(err.value)


def test_read_options_defaults_and_case_insensitive_names() -> None:
    o = read_options({"URI": URI, "Queue": "orders", "MAXMESSAGESPERTRIGGER": "50", "includeHeaders": "false"})
    assert o.queue == "orders" and o.max_messages_per_trigger == 50 and o.include_headers is False
    assert o.prefetch == 20_000 and o.poll_timeout_ms == 100 and o.ack_mode == "afterPartition"
    assert read_options({"uri": URI, "queue": "q", "ackmode": "NONE"}).ack_mode == "none"
    # a small prefetch lowers the default per-trigger limit with it
    assert read_options({"uri": URI, "queue": "q", "prefetch": "10"}).max_messages_per_trigger == 10


@pytest.mark.parametrize(("options", "fragment"), [
    ({"queue": "q"}, "option 'uri' is required"),
    ({"uri": URI}, "option 'queue' is required"),
    ({"uri": URI, "queue": "q", "prefetch": "0"}, "'prefetch' must be between 1 and 65535"),
    ({"uri": URI, "queue": "q", "prefetch": "70000"}, "'prefetch' must be between 1 and 65535"),
    ({"uri": URI, "queue": "q", "prefetch": "ten"}, "'prefetch' must be an integer"),
    ({"uri": URI, "queue": "q", "prefetch": "100", "maxMessagesPerTrigger": "200"},
     "must not exceed 'prefetch'"),
    ({"uri": URI, "queue": "q", "includeHeaders": "maybe"}, "'includeHeaders' must be true or false"),
    ({"uri": URI, "queue": "q", "ackMode": "later"}, "'ackMode' must be one of"),
    ({"uri": URI, "queue": "q", "maxMessagesPerTriger": "5"}, "unknown option(s) for a hutch source"),
    ({"uri": URI, "queue": "x" * 256}, "at most 255 bytes"),
])
def test_bad_read_options(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(HutchOptionError) as err:
        read_options(options)
    assert fragment in str(err.value)


def test_spark_owned_option_keys_are_tolerated() -> None:
    read_options({"uri": URI, "queue": "q", "path": "ignored"})
    write_options({"uri": URI, "routing_key": "q", "checkpointLocation": "/tmp/x"})


def test_write_options() -> None:
    o = write_options({"uri": URI, "exchange": "orders", "mandatory": "false", "deliveryMode": "1"})
    assert o.exchange == "orders" and o.routing_key is None and not o.mandatory and o.delivery_mode == 1
    assert write_options({"uri": URI}).max_unconfirmed == 10_000
    with pytest.raises(HutchOptionError, match="'deliveryMode' must be between 1 and 2"):
        write_options({"uri": URI, "deliveryMode": "3"})
    with pytest.raises(HutchOptionError, match="unknown option"):
        write_options({"uri": URI, "queue": "q"})
    with pytest.raises(HutchOptionError, match="writeId"):
        write_options({"uri": URI, "writeId": "a:b"})
