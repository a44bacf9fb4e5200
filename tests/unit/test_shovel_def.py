"""The shovel parameter's validation (core/shovel.py), with RabbitMQ 3.10.8's texts, and the runtime
parameter records of the definitions log (core/definition_ops.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.core import definition_ops as ops
from hutch.core.shovel import (
    ShovelDefError,
    delete_after_reached,
    forward_headers,
    is_local_uri,
    local_vhost,
    parse_shovel,
    shown_uri,
    x_death_queue,
)

BASE = {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://"}


def problems(value: object) -> list[str]:
    with pytest.raises(ShovelDefError) as info:
        parse_shovel("probe", value)
    return info.value.problems


def test_defaults_are_rabbitmqs() -> None:
    d = parse_shovel("s", BASE)
    assert (d.ack_mode, d.prefetch_count, d.delete_after, d.reconnect_delay_s) == ("on-confirm", 1000, "never", 5.0)
    assert d.source.queue == "q" and d.source.local and d.dest.queue is None and d.dest.exchange is None
    assert not d.add_forward_headers and not d.add_timestamp_header and d.publish_properties is None


def test_an_empty_definition_names_every_missing_key() -> None:
    # rabbitmqctl set_parameter shovel probe '{}' on RabbitMQ 3.10.8 prints these three lines
    assert set(problems({})) == {"Must specify 'src-exchange' or 'src-queue'", 'Key "dest-uri" not found in probe',
                                 'Key "src-uri" not found in probe'}


def test_rabbitmqs_texts_for_bad_values() -> None:
    found = problems({**BASE, "ack-mode": "bad", "src-delete-after": "x", "src-prefetch-count": "a"})
    assert 'src-delete-after should be a number greater than or equal to 0, "never" or "queue-length", ' \
           'actually was "x"' in found
    assert 'src-prefetch-count should be a number, actually was "a"' in found
    assert 'ack-mode should be one of ["no-ack", "on-publish", "on-confirm"], actually was "bad"' in found


def test_types_of_flags_strings_and_tables() -> None:
    found = problems({**BASE, "dest-add-forward-headers": "x", "dest-add-timestamp-header": 3,
                      "dest-publish-properties": "x", "src-exchange-key": 3})
    assert 'dest-add-forward-headers should be boolean, actually was "x"' in found
    assert "dest-add-timestamp-header should be boolean, actually was 3" in found
    assert 'dest-publish-properties not a list "x"' in found
    assert "src-exchange-key should be binary, actually was 3" in found


def test_names_are_short_strings() -> None:
    assert problems({**BASE, "dest-queue": "q" * 256}) == ["dest-queue should be at most 255 bytes long, actually was 256"]
    assert parse_shovel("s", {**BASE, "dest-queue": "é" * 127}).dest.queue == "é" * 127


def test_exclusive_pairs_unknown_terms_and_uris() -> None:
    assert problems({**BASE, "src-exchange": "x"}) == ["Cannot specify 'src-exchange' and 'src-queue'"]
    assert problems({**BASE, "dest-queue": "a", "dest-exchange": "b"}) == \
        ["Cannot specify 'dest-exchange' and 'dest-queue'"]
    assert problems({**BASE, "foo": 1}) == ['Unrecognised terms ["foo"] in probe']
    assert problems({**BASE, "src-uri": 3}) == ["src-uri should be list, actually was 3"]
    (text,) = problems({**BASE, "src-uri": "http://x"})
    assert text.startswith('"http://x" not a valid URI')
    assert problems({**BASE, "dest-protocol": "amqp10"})[0].startswith("dest-protocol should be one of")


def test_uri_lists_deprecated_keys_and_exchange_sources() -> None:
    d = parse_shovel("s", {"src-uri": ["amqp://u:p@a:5673/v", "amqp://b"], "src-exchange": "logs",
                           "dest-uri": "amqps://c", "dest-exchange": "out", "prefetch-count": 10,
                           "delete-after": 5, "add-forward-headers": True})
    assert d.source.uris == ("amqp://u:p@a:5673/v", "amqp://b") and not d.source.local
    assert d.source.exchange_key == "#" and d.prefetch_count == 10 and d.delete_after == 5
    assert d.add_forward_headers
    assert problems({"src-uri": "amqp://", "src-exchange": "x", "dest-uri": "amqp://",
                     "src-delete-after": "queue-length"}) == ['src-delete-after "queue-length" needs a src-queue']


def test_local_uris() -> None:
    assert is_local_uri("amqp://") and is_local_uri("amqp:///v") and not is_local_uri("amqp://h")
    assert local_vhost("amqp://", "/") == "/" and local_vhost("amqp:///other", "/") == "other"
    assert local_vhost("amqp:///%2F", "x") == "/"


def test_forward_headers_hide_passwords() -> None:
    d = parse_shovel("s", {**BASE, "dest-uri": "amqp://u:secret@h:5673/v", "dest-queue": "d"})
    entry = forward_headers(d, "/", "n@h")
    # as RabbitMQ 3.10.8 writes it: the URI without user and password
    assert entry["dest-uri"] == "amqp://h:5673/v" and "secret" not in str(entry) and "u@" not in str(entry)
    assert list(entry) == ["shovelled-by", "shovel-type", "shovel-name", "shovel-vhost", "src-uri", "dest-uri",
                           "src-queue", "dest-queue"]
    assert shown_uri("amqps://a:b@h/v?cacertfile=/x@y") == "amqps://h/v?cacertfile=/x@y"
    assert shown_uri("amqp://") == "amqp://" and shown_uri("amqp://h:1") == "amqp://h:1"
    assert entry["src-queue"] == "q" and entry["dest-queue"] == "d" and entry["shovel-name"] == "s"


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=10_000))
def test_delete_after_counts(limit: int, moved: int) -> None:
    d = parse_shovel("s", {**BASE, "src-delete-after": limit})
    assert delete_after_reached(d, moved, None) == (moved >= limit)
    q = parse_shovel("s", {**BASE, "src-delete-after": "queue-length"})
    assert delete_after_reached(q, moved, limit) == (moved >= limit)
    assert not delete_after_reached(parse_shovel("s", BASE), moved, limit)


def test_parameter_records_round_trip() -> None:
    for op in (ops.SetParameter("shovel", "/", "s", '{"a": 1}', "guest"), ops.ClearParameter("shovel", "/", "s")):
        assert ops.from_stored(ops.to_stored(op)) == op
    # a record written without its user (the field's default) still loads
    assert ops.from_stored({"op": "parameter.set", "component": "shovel", "vhost": "/", "name": "s",
                            "value": "{}"}).user == ""


def test_the_redrive_key_and_x_death() -> None:
    d = parse_shovel("r", {**BASE, "dest-queue-from-x-death": True, "src-delete-after": "queue-length"})
    assert d.redrive and d.dest.queue is None
    assert problems({**BASE, "dest-queue-from-x-death": True, "dest-queue": "x"}) == \
        ["Cannot specify 'dest-queue-from-x-death' with 'dest-queue' or 'dest-exchange'"]
    assert x_death_queue({"x-death": [{"queue": "last", "count": 1}, {"queue": "first"}]}) == "last"
    assert x_death_queue({"x-death": [{"queue": b"raw"}]}) == "raw"
    for headers in (None, {}, {"x-death": []}, {"x-death": "x"}, {"x-death": [{"count": 1}]}, {"x-death": [3]}):
        assert x_death_queue(headers) is None
