"""hutch-perf without a broker: options and URIs, the latency histogram, the pre-encoded frames, the
client hot paths driven through a fake transport (whole, one byte at a time), confirm accounting, the
per-second aggregation, and the CLI's exit statuses."""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import socket
import struct

import pytest

from hutch.amqp import spec
from hutch.amqp.frames import FrameReader, content_frames, method_frame
from hutch.cli.perf import main
from hutch.perf import runner
from hutch.perf.consumer import ConsumePlan, Consumer, ack_frame_parts
from hutch.perf.histogram import (
    MAX_VALUE,
    SUB_BUCKETS,
    LatencyHistogram,
    bucket_bounds,
    bucket_index,
)
from hutch.perf.options import AmqpUri, UsageError, parse_args, parse_queue_args, parse_uri
from hutch.perf.producer import ConfirmTracker, Producer, PublishPlan, encode_publish
from hutch.perf.protocol import AmqpClient, AmqpClosed
from hutch.perf.report import Collector, Totals, interval_line
from hutch.perf.runner import Run, Topology, make_tasks, split

# -- options ------------------------------------------------------------------------------------------


def test_defaults():
    o = parse_args([])
    assert (o.producers, o.consumers, o.size_bytes, o.confirm_window, o.qos) == (1, 1, 12, 0, 0)
    assert o.uri == AmqpUri()
    assert o.queue is None and o.queue_name(42) == "hutch-perf-42"
    assert not (o.persistent or o.mandatory or o.autoack or o.quorum or o.json)
    assert o.exchange == "" and o.routing_key is None and o.time_s == 0 and o.rate == 0


def test_without_uri_the_port_is_hutch_amqp_port_when_set():
    """Issue 22: hutch-perf must not silently go to 5672 (maybe RabbitMQ) when hutch-server was given
    HUTCH_AMQP_PORT; an explicit --uri still wins."""
    assert parse_args([], {"HUTCH_AMQP_PORT": "5699"}).uri.port == 5699
    assert parse_args([], {"HUTCH_AMQP_PORT": ""}).uri.port == 5672
    assert parse_args(["--uri", "amqp://h:5700/%2F"], {"HUTCH_AMQP_PORT": "5699"}).uri.port == 5700
    with pytest.raises(UsageError, match="^HUTCH_AMQP_PORT: expected a port number, got 'x'$"):
        parse_args([], {"HUTCH_AMQP_PORT": "x"})


def test_all_options():
    o = parse_args(["--uri", "amqp://u:p@h:5673/v", "-x", "3", "-y", "2", "-s", "100", "-c", "500",
                    "-A", "50", "-q", "100", "-f", "persistent", "-f", "mandatory", "--queue-args",
                    "x-max-length=10,x-overflow=reject-publish", "-u", "q1", "-e", "ex", "-t", "fanout",
                    "-k", "rk", "-z", "7.5", "-r", "250", "-C", "1000", "--json", "--id", "run1",
                    "--processes", "2"])
    assert (o.uri.host, o.uri.port, o.uri.username, o.uri.password, o.uri.vhost) == ("h", 5673, "u", "p", "v")
    assert (o.producers, o.consumers, o.size_bytes, o.confirm_window) == (3, 2, 100, 500)
    assert (o.multi_ack_every, o.qos, o.persistent, o.mandatory) == (50, 100, True, True)
    assert o.queue_args == {"x-max-length": 10, "x-overflow": "reject-publish"}
    assert (o.queue, o.exchange, o.exchange_type, o.routing_key) == ("q1", "ex", "fanout", "rk")
    assert (o.time_s, o.rate, o.pmessages, o.json, o.run_id, o.processes) == (7.5, 250.0, 1000, True, "run1", 2)


def test_cmessages_option():
    assert parse_args([]).cmessages == 0
    assert parse_args(["-D", "500"]).cmessages == 500
    o = parse_args(["--cmessages", "7", "-x", "0", "-y", "2"])
    assert (o.cmessages, o.producers, o.consumers, o.pmessages) == (7, 0, 2, 0)
    assert parse_args(["-x", "1", "-y", "0", "-C", "3"]).consumers == 0
    with pytest.raises(UsageError, match="non-negative"):
        parse_args(["-D", "-1"])
    with pytest.raises(UsageError, match="-D/--cmessages"):
        parse_args(["-D", "many"])


def test_make_tasks_without_producers_passes_the_consumer_limit():
    o = parse_args(["-x", "0", "-y", "3", "-D", "10", "-u", "q", "--processes", "2"])
    tasks = make_tasks(o, Topology("q", "q", delete_queue=False, delete_exchange=False))
    assert [(t.role, t.count) for t in tasks] == [("consumer", 2), ("consumer", 1)]
    assert all(t.consume is not None and t.consume.limit == 10 and t.consume.queue == "q" for t in tasks)
    assert all(t.consume is not None and t.consume.consume_at_start for t in tasks)  # a drain: from "go"
    (_, consumer_task) = make_tasks(parse_args(["-D", "10"]), Topology("q", "q", True, False))
    assert consumer_task.consume is not None and not consumer_task.consume.consume_at_start
    tasks = make_tasks(parse_args(["-y", "0", "-C", "5"]), Topology("q", "q", True, False))
    assert [(t.role, t.count) for t in tasks] == [("producer", 1)]


def test_queue_pattern_options():
    o = parse_args(["--queue-pattern", "perf-%d", "--queue-pattern-to", "3"])
    assert o.pattern_queues() == ("perf-1", "perf-2", "perf-3")
    assert o.queue_name(1) == "perf-1"
    o = parse_args(["--queue-pattern", "q%d-x", "--queue-pattern-from", "0", "--queue-pattern-to", "1"])
    assert o.pattern_queues() == ("q0-x", "q1-x")
    assert parse_args([]).pattern_queues() == ()


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--queue-pattern", "perf", "--queue-pattern-to", "2"], "%d exactly once"),
    (["--queue-pattern", "p%d%d", "--queue-pattern-to", "2"], "%d exactly once"),
    (["--queue-pattern", "p%s%d", "--queue-pattern-to", "2"], "no other %"),
    (["--queue-pattern", "p%d"], "at least --queue-pattern-from"),
    (["--queue-pattern", "p%d", "--queue-pattern-from", "5", "--queue-pattern-to", "4"], "at least"),
    (["--queue-pattern", "p%d", "--queue-pattern-to", "100001"], "more than 100000"),
    (["--queue-pattern", "p%d", "--queue-pattern-to", "2", "-u", "q"], "exclude each other"),
    (["--queue-pattern-to", "2"], "needs --queue-pattern"),
    (["--queue-pattern", "x" * 254 + "%d", "--queue-pattern-to", "10"], "longer than 255"),
])
def test_queue_pattern_errors(argv, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        parse_args(argv)


def test_make_tasks_with_a_queue_pattern_spreads_clients_over_the_queues():
    o = parse_args(["-x", "3", "-y", "5", "--queue-pattern", "p-%d", "--queue-pattern-to", "2", "--processes", "2"])
    topology = Topology("p-1", "p-1", True, False, queues=o.pattern_queues())
    tasks = make_tasks(o, topology)
    producers = [k for t in tasks if t.role == "producer" for k in t.targets]
    consumers = [q for t in tasks if t.role == "consumer" for q in t.targets]
    assert producers == ["p-1", "p-2", "p-1"]  # producer k -> queue k mod 2 (its routing key)
    assert consumers == ["p-1", "p-2", "p-1", "p-2", "p-1"]
    assert all(len(t.targets) == t.count for t in tasks)
    # with -k the producers publish with that key (a fanout exchange ignores it)
    o = parse_args(["-x", "1", "-y", "3", "-e", "fx", "-t", "fanout", "-k", "any", "--queue-pattern", "f-%d",
                    "--queue-pattern-to", "3"])
    tasks = make_tasks(o, Topology("f-1", "any", True, False, queues=o.pattern_queues()))
    assert [t.targets for t in tasks if t.role == "producer"] == [("any",)]
    # without a pattern nothing changes: one queue, no per-client targets
    assert all(t.targets == () for t in make_tasks(parse_args([]), Topology("q", "q", True, False)))


def test_quorum_queue_sets_the_type_argument():
    o = parse_args(["--quorum-queue", "--queue-args", "x-quorum-initial-group-size=1"])
    assert o.quorum
    assert o.queue_args == {"x-quorum-initial-group-size": 1, "x-queue-type": "quorum"}
    assert parse_args(["--queue-args", "x-queue-type=quorum"]).quorum


def test_queue_args_types():
    assert parse_queue_args("a=1, b=-2,c=true,d=False,e=x=y,f=") == {
        "a": 1, "b": -2, "c": True, "d": False, "e": "x=y", "f": ""}


@pytest.mark.parametrize("argv, fragment", [
    (["-x", "abc"], "-x/--producers"),
    (["-y", "-1"], "non-negative"),
    (["-f", "bogus"], "unknown flag"),
    (["-x", "0", "-y", "0"], "nothing to do"),
    (["-s", "7"], "at least 8"),
    (["-q", "70000"], "at most 65535"),
    (["-a", "-A", "10"], "exclude"),
    (["-q", "10", "-A", "11"], "exceeds --qos"),
    (["--queue-args", "novalue"], "key=value"),
    (["--queue-args", "=1"], "key=value"),
    (["--quorum-queue", "--queue-args", "x-queue-type=classic"], "contradicts"),
    (["-u", ""], "must not be empty"),
    (["-u", "q" * 256], "longer than 255"),
    (["-z", "soon"], "expected a number"),
    (["-r", "nan"], "non-negative"),
    (["-t", "weird"], "invalid choice"),
    (["--bogus"], "unrecognized"),
    (["--uri", "http://h/"], "scheme"),
])
def test_bad_arguments(argv, fragment):
    with pytest.raises(UsageError, match=fragment.replace("-", r"\-").replace("+", r"\+")):
        parse_args(argv)


@pytest.mark.parametrize("argv", [["-x", "zz"], ["-f", "nope"], ["--uri", "amqp://h:99999/"], ["-z"]])
def test_main_bad_arguments_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hutch-perf: error: ")


def test_main_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "--producers" in capsys.readouterr().out


def test_main_connection_refused_one_line_exit_1(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--uri", f"amqp://guest:secret@127.0.0.1:{port}/%2F", "-z", "1"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"hutch-perf: cannot connect to amqp://guest@127.0.0.1:{port}/%2F: ")
    assert "secret" not in captured.err


# -- URIs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("amqp://", AmqpUri()),
    ("amqp://guest:guest@127.0.0.1:5672/%2F", AmqpUri()),
    ("amqp://h", AmqpUri(host="h")),
    ("amqp://h/", AmqpUri(host="h")),
    ("amqp://h/vh", AmqpUri(host="h", vhost="vh")),
    ("amqp://h/a%2Fb", AmqpUri(host="h", vhost="a/b")),
    ("amqp://us%40er:p%3Ass@h:1234/v", AmqpUri(host="h", port=1234, username="us@er", password="p:ss", vhost="v")),
    ("amqp://[::1]:5673/", AmqpUri(host="::1", port=5673)),
    ("amqp://h?heartbeat=10&frame_max=8192&connection_timeout=2500",
     AmqpUri(host="h", heartbeat_s=10, frame_max_bytes=8192, connect_timeout_s=2.5)),
])
def test_parse_uri(text, expected):
    assert parse_uri(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("amqp://h/?cacertfile=/ca.pem", "is a TLS parameter: use amqps://"),
    ("amqps://h/?verify=maybe", "verify must be verify_peer or verify_none"),
    ("http://h/", "scheme"),
    ("amqp://h:notaport/", "bad URI"),
    ("amqp://h:70000/", "bad URI"),
    ("amqp://h/a/b", "one path segment"),
    ("amqp://h?heartbeat=-1", "heartbeat"),
    ("amqp://h?frame_max=100", "at least 4096"),
    ("amqp://h?channel_max=3", "unsupported query parameter"),
])
def test_parse_uri_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_uri(text)


def test_display_hides_password():
    uri = parse_uri("amqp://bob:hunter2@[::1]:5673/prod")
    assert uri.display() == "amqp://bob@[::1]:5673/prod"
    assert AmqpUri().display() == "amqp://guest@127.0.0.1:5672/%2F"


# -- histogram ----------------------------------------------------------------------------------------


def test_histogram_small_values_are_exact():
    h = LatencyHistogram()
    h.record_many(range(1, 101))
    assert h.percentiles(0, 50, 75, 95, 99, 100) == [1, 50, 75, 95, 99, 100]
    assert (h.total, h.min_value, h.max_value) == (100, 1, 100)


def test_histogram_relative_error_bound():
    rng = random.Random(7)
    values = sorted(int(rng.lognormvariate(13, 2)) for _ in range(20_000))  # around 0.4 ms, wide spread
    h = LatencyHistogram()
    h.record_many(values)
    for p in (1, 25, 50, 75, 90, 95, 99, 99.9):
        exact = values[max(0, math.ceil(len(values) * p / 100) - 1)]
        got = h.value_at_percentile(p)
        assert exact <= got <= exact * (1 + 1 / SUB_BUCKETS) + 1, (p, exact, got)
    assert h.value_at_percentile(100) == values[-1]
    assert h.value_at_percentile(0) == values[0]


def test_histogram_buckets_tile_the_range():
    previous_high = -1
    for index in range(bucket_index(MAX_VALUE) + 1):
        low, high = bucket_bounds(index)
        assert low == previous_high + 1
        assert bucket_index(low) == index and bucket_index(high) == index
        assert (high - low + 1) <= max(1, low // SUB_BUCKETS)
        previous_high = high


def test_histogram_clamps_and_empty():
    h = LatencyHistogram()
    assert h.percentiles(50, 99) == [0, 0]
    h.record(-5)
    h.record(MAX_VALUE * 10)
    assert h.total == 2 and h.min_value == 0 and h.max_value == MAX_VALUE
    assert len(h.counts) == bucket_index(MAX_VALUE) + 1  # bounded whatever was recorded


def test_histogram_wire_merge_equals_recording_everything():
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    a.record_many([5, 900, 70_000])
    b.record_many([3, 1_000_000_000])
    both.record_many([5, 900, 70_000, 3, 1_000_000_000])
    merged = LatencyHistogram()
    merged.merge_wire(a.to_wire())
    merged.merge(b)
    merged.merge_wire(LatencyHistogram().to_wire())  # empty: no effect on min
    assert merged.counts == both.counts
    assert (merged.total, merged.min_value, merged.max_value) == (5, 3, 1_000_000_000)


# -- pre-encoded frames -------------------------------------------------------------------------------


def _frames(data: bytes, frame_max: int = 131072) -> list[tuple[int, int, bytes]]:
    reader = FrameReader(frame_max)
    reader.feed(data)
    frames = list(reader.frames())
    assert reader.buffered == 0
    return frames


@pytest.mark.parametrize("size, frame_max", [(8, 131072), (16, 131072), (10_000, 4096)])
def test_encode_publish_is_a_valid_publish_with_the_timestamp_first(size, frame_max):
    plan = PublishPlan(exchange="ex", routing_key="rk", size_bytes=size, mandatory=True, persistent=True)
    prefix, suffix = encode_publish(plan, frame_max)
    frames = _frames(prefix + struct.pack(">Q", 123456789) + suffix, frame_max)
    assert spec.decode_method(frames[0][2]) == spec.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True)
    ftype, channel, header = frames[1]
    assert (ftype, channel) == (spec.FRAME_HEADER, 1)
    assert struct.unpack_from(">Q", header, 4)[0] == size
    assert spec.BasicProperties.decode(header, 12).delivery_mode == 2
    body = b"".join(f[2] for f in frames[2:])
    assert all(f[0] == spec.FRAME_BODY and len(f[2]) + 8 <= frame_max for f in frames[2:])
    assert len(body) == size and struct.unpack_from(">Q", body)[0] == 123456789 and not any(body[8:])


def test_ack_frame_parts():
    for multiple in (False, True):
        prefix, suffix = ack_frame_parts(multiple)
        ((_, channel, payload),) = _frames(prefix + struct.pack(">Q", 77) + suffix)
        assert channel == 1
        assert spec.decode_method(payload) == spec.Basic.Ack(delivery_tag=77, multiple=multiple)


# -- confirms -----------------------------------------------------------------------------------------


def test_confirm_tracker_counts_every_tag_once():
    t = ConfirmTracker()
    assert t.settle(3, False, 10) == 1          # out of order
    assert t.settle(3, False, 10) == 0          # twice: nothing new
    assert t.settle(1, False, 10) == 1 and t.low == 2
    assert t.settle(2, False, 10) == 1 and t.low == 4 and not t.singles  # 3 was already settled
    assert t.settle(6, False, 10) == 1
    assert t.settle(8, True, 10) == 4           # 4, 5, 7, 8 (6 already)
    assert t.low == 9 and not t.singles
    assert t.settle(5, True, 10) == 0           # below low
    assert t.settle(11, False, 10) == 0         # never published
    assert t.settle(10, True, 10) == 2


def test_confirm_tracker_random_orders_match_a_set():
    rng = random.Random(3)
    for _ in range(200):
        published = rng.randint(1, 40)
        tracker, settled, total = ConfirmTracker(), set(), 0
        for _ in range(30):
            tag, multiple = rng.randint(1, published + 2), rng.random() < 0.3
            new = set(range(1, tag + 1)) if multiple else {tag}
            new = {x for x in new if x <= published} if tag <= published else set()
            total += tracker.settle(tag, multiple, published)
            settled |= new
            assert total == len(settled)
        assert len(tracker.singles) <= published


# -- the hot paths through a fake transport -----------------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts) -> None:
        self.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def methods(self) -> list[spec.Method]:
        data = b"".join(self.written)
        self.written.clear()
        if data.startswith(spec.PROTOCOL_HEADER):
            data = data[len(spec.PROTOCOL_HEADER):]
        return [spec.decode_method(p) for t, _, p in _frames(data) if t == spec.FRAME_METHOD]


def _run(coro_fn):
    return asyncio.run(coro_fn())


def _server_handshake(frame_max=131072, channel_max=2047, heartbeat=60) -> bytes:
    return (method_frame(0, spec.Connection.Start(version_major=0, version_minor=9, server_properties={},
                                                  mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"))
            + method_frame(0, spec.Connection.Tune(channel_max=channel_max, frame_max=frame_max,
                                                   heartbeat=heartbeat))
            + method_frame(0, spec.Connection.OpenOk()))


@pytest.mark.parametrize("uri_text, frame_max", [("amqp://u:p@h/vh", 131072),
                                                 ("amqp://u:p@h/vh?frame_max=8192", 8192)])
def test_handshake_plain_and_tune(uri_text, frame_max):
    async def body():
        client = AmqpClient(parse_uri(uri_text))
        transport = FakeTransport()
        client.connection_made(transport)
        for byte in _server_handshake():  # one byte at a time
            client.data_received(bytes([byte]))
        assert client.ready.done() and client.ready.exception() is None
        start_ok, tune_ok, open_ = transport.methods()
        assert start_ok.mechanism == "PLAIN" and start_ok.response == b"\0u\0p"
        assert start_ok.client_properties["capabilities"]["publisher_confirms"] is True
        assert tune_ok == spec.Connection.TuneOk(channel_max=2047, frame_max=frame_max, heartbeat=0)
        assert open_.virtual_host == "vh"
        assert client.frame_max == frame_max
    _run(body)


def test_server_close_during_handshake_fails_ready():
    async def body():
        client = AmqpClient(AmqpUri())
        client.connection_made(FakeTransport())
        client.data_received(method_frame(0, spec.Connection.Close(reply_code=403, reply_text="ACCESS_REFUSED - no",
                                                                    class_id=0, method_id=0)))
        assert "403 ACCESS_REFUSED - no" in str(client.ready.exception())
    _run(body)


def _deliveries(tags, body_size=16, frame_max=131072, sent_ns=1_000) -> bytes:
    out = []
    for tag in tags:
        body = struct.pack(">Q", sent_ns) + bytes(body_size - 8)
        out.append(method_frame(1, spec.Basic.Deliver(consumer_tag="ctag-1", delivery_tag=tag,
                                                      exchange="", routing_key="q")))
        out.extend(content_frames(1, 60, spec.BasicProperties(delivery_mode=1).encode(), body, frame_max))
    return b"".join(out)


def _consumer(plan: ConsumePlan, frame_max=131072) -> tuple[Consumer, FakeTransport]:
    consumer = Consumer(AmqpUri(), plan, LatencyHistogram())
    transport = FakeTransport()
    consumer.connection_made(transport)
    transport.written.clear()
    consumer.frame_max = frame_max
    consumer.fast_methods[spec.Basic.Deliver.INDEX] = consumer._on_deliver
    return consumer, transport


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_consumer_counts_acks_and_measures_latency(chunk):
    async def body():
        consumer, transport = _consumer(ConsumePlan(queue="q", multi_ack_every=10))
        data = _deliveries(range(1, 26)) + b"\x01\x00"  # trailing partial frame
        pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
        for piece in pieces:
            consumer.data_received(piece)
        assert consumer.received == 25
        assert consumer.histogram.total == 25 and consumer.histogram.min_value > 0
        acks = transport.methods()
        assert acks == [spec.Basic.Ack(delivery_tag=10, multiple=True), spec.Basic.Ack(delivery_tag=20, multiple=True)]
        consumer.stop()  # acks the rest with one multiple ack
        assert transport.methods() == [spec.Basic.Ack(delivery_tag=25, multiple=True)]
    _run(body)


@pytest.mark.parametrize("chunk", [None, 1, 13])
def test_consumer_limit_counts_n_acks_cancels_and_gives_back_the_rest(chunk):
    async def body():
        done = []
        consumer = Consumer(AmqpUri(), ConsumePlan(queue="q", multi_ack_every=10, limit=15), LatencyHistogram(),
                            on_done=lambda: done.append(1))
        transport = FakeTransport()
        consumer.connection_made(transport)
        transport.written.clear()
        consumer.fast_methods[spec.Basic.Deliver.INDEX] = consumer._on_deliver
        consumer.consumer_tag = "ctag-1"
        data = _deliveries(range(1, 21))
        pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
        for piece in pieces:
            consumer.data_received(piece)
        assert consumer.received == 15 and consumer.done and done == [1]
        assert consumer.histogram.total == 15
        methods = transport.methods()
        # in order: the regular ack, the last counted one, the cancel, then the rest given back
        assert methods[:3] == [spec.Basic.Ack(delivery_tag=10, multiple=True),
                               spec.Basic.Ack(delivery_tag=15, multiple=True),
                               spec.Basic.Cancel(consumer_tag="ctag-1", nowait=True)]
        assert methods[3:] and all(isinstance(m, spec.Basic.Nack) and m.multiple and m.requeue
                                   for m in methods[3:])
        assert methods[-1].delivery_tag == 20
        consumer.data_received(_deliveries([21]))  # in flight before the cancel: given back too
        assert transport.methods() == [spec.Basic.Nack(delivery_tag=21, multiple=True, requeue=True)]
        consumer.stop()  # nothing left to ack
        assert transport.written == [] and consumer.received == 15 and done == [1]
    _run(body)


def test_consumer_limit_on_a_multiple_of_the_ack_batch_and_with_single_acks():
    async def body():
        consumer, transport = _consumer(ConsumePlan(queue="q", multi_ack_every=5, limit=10))
        consumer.data_received(_deliveries(range(1, 11)))
        methods = transport.methods()
        assert methods[:2] == [spec.Basic.Ack(delivery_tag=5, multiple=True),
                               spec.Basic.Ack(delivery_tag=10, multiple=True)]
        assert isinstance(methods[2], spec.Basic.Cancel) and len(methods) == 3
        consumer, transport = _consumer(ConsumePlan(queue="q", limit=2))
        consumer.data_received(_deliveries([1, 2, 3]))
        assert [type(m).__name__ for m in transport.methods()] == ["BasicAck", "BasicAck", "BasicCancel", "BasicNack"]
        assert consumer.received == 2
    _run(body)


def test_consumer_limit_chooses_its_tag_before_consuming():
    async def body():
        consumer = Consumer(AmqpUri(), ConsumePlan(queue="q", limit=1), LatencyHistogram())
        sent = []

        async def call(channel, method, *replies):
            sent.append(method)
            if isinstance(method, spec.Basic.Consume):
                return spec.Basic.ConsumeOk(consumer_tag=method.consumer_tag)
            return None

        async def open_channel(channel=1):
            return None

        consumer.call, consumer.open_channel = call, open_channel
        await consumer.setup()
        (consume,) = sent
        assert consume.consumer_tag.startswith("hutch-perf-") and consumer.consumer_tag == consume.consumer_tag
    _run(body)


def test_consumer_bodies_split_over_frames_and_autoack():
    async def body():
        consumer, transport = _consumer(ConsumePlan(queue="q", autoack=True), frame_max=4096)
        consumer.data_received(_deliveries([1, 2, 3], body_size=10_000, frame_max=4096))
        assert consumer.received == 3 and consumer.histogram.total == 3
        assert transport.written == []
    _run(body)


def test_consumer_acks_each_message_when_not_multi():
    async def body():
        consumer, transport = _consumer(ConsumePlan(queue="q"))
        consumer.data_received(_deliveries([1, 2, 3]))
        assert len(transport.written) == 1  # the acks of one read leave in one write
        assert transport.methods() == [spec.Basic.Ack(delivery_tag=t, multiple=False) for t in (1, 2, 3)]
    _run(body)


def _producer(plan: PublishPlan) -> tuple[Producer, FakeTransport, list[str]]:
    events: list[str] = []
    producer = Producer(AmqpUri(), plan, on_done=lambda: events.append("done"))
    transport = FakeTransport()
    producer.connection_made(transport)
    transport.written.clear()
    producer.frame_max = 131072
    producer._prefix, producer._suffix = encode_publish(plan, 131072)
    producer._batch_max = 64
    producer.fast_methods[spec.Basic.Ack.INDEX] = producer._on_ack
    producer.fast_methods[spec.Basic.Nack.INDEX] = producer._on_nack
    producer.fast_methods[spec.Basic.Return.INDEX] = producer._on_return
    return producer, transport, events


def _publishes(transport: FakeTransport) -> int:
    return sum(isinstance(m, spec.Basic.Publish) for m in transport.methods())


def test_producer_respects_the_confirm_window_and_limit():
    async def body():
        producer, transport, events = _producer(PublishPlan("", "q", 16, confirm_window=10, limit=25))
        producer.start()
        await asyncio.sleep(0)
        assert _publishes(transport) == 10 and producer.outstanding == 10
        producer.data_received(method_frame(1, spec.Basic.Ack(delivery_tag=4, multiple=True)))
        assert _publishes(transport) == 4 and producer.outstanding == 10
        producer.data_received(method_frame(1, spec.Basic.Nack(delivery_tag=14, multiple=True, requeue=False)))
        await asyncio.sleep(0)
        assert producer.sent == 24 and producer.nacked == 10
        producer.data_received(method_frame(1, spec.Basic.Ack(delivery_tag=24, multiple=True)))
        assert producer.sent == 25 and events == []
        producer.data_received(method_frame(1, spec.Basic.Ack(delivery_tag=25, multiple=False)))
        assert events == ["done"] and producer.confirmed == 15 and producer.outstanding == 0
    _run(body)


def test_producer_pauses_with_the_transport_and_counts_returns():
    async def body():
        producer, transport, _ = _producer(PublishPlan("", "q", 16))
        producer.start()
        assert producer.sent == 64
        producer.pause_writing()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert producer.sent == 64
        producer.resume_writing()
        await asyncio.sleep(0)
        assert producer.sent == 128
        producer.stop()
        returned = (method_frame(1, spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="",
                                                      routing_key="q"))
                    + b"".join(content_frames(1, 60, b"\x00\x00", b"x" * 16, 131072)))
        producer.data_received(returned + returned)
        assert producer.returned == 2
    _run(body)


def test_producer_rate_limit():
    async def body():
        producer, transport, _ = _producer(PublishPlan("", "q", 16, rate=500))
        loop = asyncio.get_running_loop()
        started = loop.time()
        producer.start()
        await asyncio.sleep(0.2)
        producer.stop()
        elapsed = loop.time() - started  # a loaded machine sleeps longer than asked: bound by what passed
        assert 20 <= producer.sent <= 500 * elapsed + 40, (producer.sent, elapsed)  # ~100 at 500 msg/s
    _run(body)


def test_producer_timestamps_come_from_the_monotonic_clock():
    async def body():
        import time
        producer, transport, _ = _producer(PublishPlan("", "q", 16, limit=3))
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        producer.start()
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        frames = _frames(b"".join(transport.written))
        bodies = [p for t, _, p in frames if t == spec.FRAME_BODY]
        assert len(bodies) == 3
        assert all(before <= struct.unpack_from(">Q", b)[0] <= after for b in bodies)
    _run(body)


# -- aggregation and output ---------------------------------------------------------------------------


def _wire(*values):
    h = LatencyHistogram()
    h.record_many(values)
    return h.to_wire()


def test_collector_prints_a_second_once_every_worker_reported_it():
    c = Collector([0, 1], run_id=None)
    assert c.on_tick(0, 1, 1_000_000_000, Totals(sent=1000, confirmed=900), _wire()) == []
    (line,) = c.on_tick(1, 1, 1_000_000_000, Totals(received=800), _wire(*[100_000] * 800))
    assert line == ("time: 1.000s, sent: 1000 msg/s, confirmed: 900 msg/s, returned: 0 msg/s, received: 800 msg/s, "
                    "min/median/75th/95th/99th consumer latency: 100/100/100/100/100 µs")
    c.on_tick(1, 2, 2_000_000_000, Totals(received=2000), _wire(50_000, 2_000_000))
    (line,) = c.on_tick(0, 2, 2_000_000_000, Totals(sent=2500, confirmed=2400, returned=3), _wire())
    assert "time: 2.000s, sent: 1500 msg/s, confirmed: 1500 msg/s, returned: 3 msg/s, received: 1200 msg/s" in line
    assert line.endswith("consumer latency: 50/50/2000/2000/2000 µs")
    c.muted = True
    assert c.on_final(0, Totals(sent=2600, confirmed=2600, returned=3, producers_done=1), _wire()) == []
    s = c.summary(2.5, confirms=True, config={"producers": 1})
    assert s.totals.sent == 2600 and s.totals.received == 2000
    assert s.latency_us["samples"] == 802 and s.latency_us["max"] == 2000
    text = "\n".join(s.lines())
    assert "sending rate avg: 1040 msg/s" in text and "receiving rate avg: 800 msg/s" in text
    assert "confirm rate avg: 1040 msg/s" in text
    doc = json.loads(s.to_json())
    assert doc["send_rate"] == 1040 and doc["receive_rate"] == 800 and doc["producers"] == 1
    assert doc["latency_us"]["p50"] == 100 and doc["duration_s"] == 2.5


def test_collector_gone_worker_does_not_block_lines():
    c = Collector([0, 1], run_id="r")
    assert c.on_tick(0, 1, 1_000_000_000, Totals(sent=5), _wire()) == []
    (line,) = c.on_gone(1)
    assert line.startswith("id: r, time: 1.000s, sent: 5 msg/s")


def test_interval_line_format():
    line = interval_line("x", 3.0, {"sent": 1.4, "confirmed": 2, "returned": 0, "received": 9.6}, [1, 2, 3, 4, 5])
    assert line == ("id: x, time: 3.000s, sent: 1 msg/s, confirmed: 2 msg/s, returned: 0 msg/s, "
                    "received: 10 msg/s, min/median/75th/95th/99th consumer latency: 1/2/3/4/5 µs")


def test_totals_minus_keeps_the_done_counts():
    now = Totals(sent=10, confirmed=9, nacked=1, returned=2, received=8, producers_done=1, consumers_done=1,
                 last_activity_ns=99)
    base = Totals(sent=4, confirmed=3, nacked=1, returned=1, received=5, producers_done=0, consumers_done=1,
                  last_activity_ns=50)
    assert now.minus(base) == Totals(6, 6, 0, 1, 3, 1, 1, 99)
    c = Collector([0, 1])
    c.on_progress(0, Totals(received=3, consumers_done=1, last_activity_ns=7))
    c.on_progress(1, Totals(sent=2, producers_done=1, consumers_done=0, last_activity_ns=9))
    assert c.totals == Totals(sent=2, received=3, producers_done=1, consumers_done=1, last_activity_ns=9)


def _counted_run(argv: list[str]) -> Run:
    opts = parse_args(["--processes", "1", *argv])
    run_ = Run(opts, make_tasks(opts, Topology("q", "q", False, False)), lines=None)
    run_.start_ns = 1
    return run_


@pytest.mark.parametrize("argv, reports, stops", [
    # drain only: the consumers' -D decides
    (["-x", "0", "-y", "1", "-D", "10"], [Totals(received=9)], False),
    (["-x", "0", "-y", "1", "-D", "10"], [Totals(received=10, consumers_done=1)], True),
    (["-x", "0", "-y", "2", "-D", "10"], [Totals(received=15, consumers_done=1)], False),
    # publish only: the producers' -C decides
    (["-x", "1", "-y", "0", "-C", "5"], [Totals(sent=5)], False),
    (["-x", "1", "-y", "0", "-C", "5"], [Totals(sent=5, confirmed=5, producers_done=1)], True),
    # both limits: both must be done
    (["-C", "5", "-D", "5"], [Totals(sent=5, producers_done=1), Totals(received=4)], False),
    (["-C", "5", "-D", "5"], [Totals(sent=5), Totals(received=5, consumers_done=1)], False),
    (["-C", "5", "-D", "5"], [Totals(sent=5, producers_done=1), Totals(received=5, consumers_done=1)], True),
    # -D with unlimited producers: producers are never done
    (["-D", "5"], [Totals(sent=100), Totals(received=5, consumers_done=1)], False),
    # -C alone: consumers done once they received what was sent
    (["-C", "5"], [Totals(sent=5, producers_done=1), Totals(received=5)], True),
])
def test_run_ends_when_all_producers_and_consumers_are_done(argv, reports, stops):
    run_ = _counted_run(argv)
    for i, totals in enumerate(reports):
        run_.collector.on_progress(i, totals)
    run_.check_counts()
    assert bool(run_.stop_ns) == stops


class _FakeTopologyClient:
    """Answers declares like a broker holding `queues`; records what was asked."""

    def __init__(self, queues: dict[str, bool]) -> None:
        self.queues = queues  # name -> durable
        self.calls: list[spec.Method] = []

    async def open_channel(self, channel: int = 1) -> None:
        pass

    async def close(self) -> None:
        pass

    async def call(self, channel, method, *replies):
        self.calls.append(method)
        if isinstance(method, spec.Queue.Declare):
            if method.passive:
                if method.queue not in self.queues:
                    raise AmqpClosed("404 NOT_FOUND", 404)
            elif self.queues.get(method.queue, method.durable) != method.durable:
                raise AmqpClosed("406 PRECONDITION_FAILED - inequivalent arg 'durable'", 406)
            else:
                self.queues[method.queue] = method.durable
            return spec.Queue.DeclareOk(queue=method.queue, message_count=0, consumer_count=0)
        return None


@pytest.mark.parametrize("argv, queues, declares, delete", [
    # a durable queue declared beforehand: one passive declare, used as it is, kept
    (["-u", "perf-durable"], {"perf-durable": True}, [("perf-durable", True, None)], False),
    (["-u", "fresh"], {}, [("fresh", True, None), ("fresh", False, False)], False),
    (["--queue-args", "x-max-length=5", "-u", "q"], {}, [("q", False, False)], False),
    ([], {}, [("hutch-perf-7", False, False)], True),
])
def test_declare_topology_uses_an_existing_named_queue_as_is(argv, queues, declares, delete, monkeypatch):
    fake = _FakeTopologyClient(queues)

    async def connect(uri, factory):
        return fake

    monkeypatch.setattr(runner, "connect", connect)
    opts = parse_args(argv)
    topology = asyncio.run(runner.declare_topology(opts, opts.queue_name(7), "rk"))
    got = [(m.queue, m.passive, None if m.passive else m.durable) for m in fake.calls]
    assert got == declares
    assert topology.delete_queue == delete and topology.queue == opts.queue_name(7)


def test_declare_topology_with_queue_args_reports_a_406(monkeypatch):
    fake = _FakeTopologyClient({"perf-durable": True})

    async def connect(uri, factory):
        return fake

    monkeypatch.setattr(runner, "connect", connect)
    opts = parse_args(["-u", "perf-durable", "--queue-args", "x-max-length=5"])
    with pytest.raises(AmqpClosed, match="406"):
        asyncio.run(runner.declare_topology(opts, "perf-durable", "perf-durable"))


@pytest.mark.parametrize("total, groups, expected", [
    (1, 4, [1]), (5, 2, [3, 2]), (4, 4, [1, 1, 1, 1]), (0, 3, []), (7, 1, [7])])
def test_split_clients_over_processes(total, groups, expected):
    assert split(total, groups) == expected


def test_priorities_option_encodes_one_publish_per_priority() -> None:
    opts = parse_args(["--priorities", "10", "--queue-args", "x-max-priority=10"])
    assert opts.priorities == 10
    plan = PublishPlan(exchange="", routing_key="q", size_bytes=16, priorities=3)
    frames = []
    for p in range(3):
        prefix, suffix = encode_publish(plan, 131072, priority=p)
        reader = FrameReader(131072)
        reader.feed(prefix + b"\x00" * 8 + suffix)
        frames.append(list(reader.frames()))
    priorities = [spec.BasicProperties.decode(bytes(f[1][2][12:]), 0).priority for f in frames]
    assert priorities == [0, 1, 2]
