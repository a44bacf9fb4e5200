"""Message rates and sample histories (hutch.mgmt.stats): the pure parts without a node, then a real
node sampled every 200 ms, checked through the API (rates, samples for RabbitMQ's range parameters,
exchange publish_in/publish_out, vhost and overview totals, node figures)."""

from __future__ import annotations

import time

import pytest

from conftest import start_server  # tests/conftest.py
from hutch.mgmt.errors import ApiError
from hutch.mgmt.stats import Collector, History, Range, StatsView, combined, parse_ranges

from .helpers import Api, connect, unique, wait_for, wait_mgmt

# -- pure ---------------------------------------------------------------------------------------------


def test_history_is_sparse_and_answers_any_time():
    h = History()
    for t, v in ((1000, (1,)), (2000, (1,)), (3000, (4,)), (4000, (4,)), (5000, (9,))):
        h.record(t, v, horizon_ms=0)
    assert list(h.ts) == [1000, 3000, 5000]  # unchanged samples are not stored
    assert [h.at(t) for t in (999, 1000, 2500, 3000, 4999, 9999)] == [None, (1,), (1,), (4,), (4,), (9,)]


def test_history_keeps_one_point_before_the_horizon():
    h = History()
    for t in range(1, 11):
        h.record(t * 1000, (t,), horizon_ms=0)
    h.record(11_000, (11,), horizon_ms=7_500)
    assert list(h.ts)[0] == 7000  # still answers for 7500..
    assert h.at(7500) == (7,)


def test_combined_sums_histories_at_every_time():
    a, b = History(), History()
    a.record(1000, (1, 1), 0)
    a.record(3000, (5, 1), 0)
    b.record(2000, (10, 0), 0)
    c = combined([a, b])
    assert list(c.ts) == [1000, 2000, 3000]
    assert list(c.values) == [(1, 1), (11, 1), (15, 1)]


def test_parse_ranges():
    ranges = parse_ranges({"lengths_age": "60", "lengths_incr": "5", "msg_rates_age": "10"}, 1_000_003_700)
    assert ranges == {"lengths": Range(1_000_000_000 - 60_000, 1_000_000_000, 5000)}  # msg_rates: no incr
    for age, incr in (("0", "5"), ("60", "0"), ("x", "5"), ("5000", "1")):
        with pytest.raises(ApiError) as bad:
            parse_ranges({"msg_rates_age": age, "msg_rates_incr": incr}, 0)
        assert bad.value.status == 400
        assert bad.value.reason == f"Invalid range parameters: age {age}, incr {incr}"


def test_rate_and_range_samples_from_a_collector():
    c = Collector(5000)
    h = History()
    c.prev_ms, c.last_ms = 10_000, 15_000
    h.record(10_000, (100,), 0)
    h.record(15_000, (150,), 0)
    view = StatsView(c)
    out = view.fields(h, (("publish", (0,)),), (160,), "msg_rates", {})
    assert out == {"publish": 160, "publish_details": {"rate": 10.0}}
    c.prev_ms, c.last_ms = 15_000, 20_000  # no change in the last interval: rate 0
    assert view.fields(h, (("publish", (0,)),), None, "msg_rates", {})["publish_details"] == {"rate": 0.0}

    ranged = StatsView(c, {"msg_rates": Range(5000, 20_000, 5000)})
    details = ranged.fields(h, (("publish", (0,)),), None, "msg_rates", {})["publish_details"]
    assert details["samples"] == [{"sample": 150, "timestamp": 20_000}, {"sample": 150, "timestamp": 15_000},
                                  {"sample": 100, "timestamp": 10_000}]  # newest first; 5000 predates the object
    assert details["rate"] == 0.0  # over the last step
    assert details["avg_rate"] == 5.0  # (150 - 100) / 10 s
    assert details["avg"] == pytest.approx(133.33, abs=0.01)


# -- a node sampled every 200 ms ---------------------------------------------------------------------


@pytest.fixture
def fast_stats(tmp_path):
    info = wait_mgmt(start_server(tmp_path, config_text="collect_statistics_interval = 200\n"))
    yield info
    info.stop()


def test_rates_and_samples_through_the_api(fast_stats):
    api = Api(fast_stats.mgmt_url)
    q, x = unique("rq"), unique("rx")
    conn = connect(fast_stats.amqp_port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q)
        ch.exchange_declare(x, "fanout")
        ch.queue_bind(q, x)
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # ~1 s of publishing, to two exchanges
            ch.basic_publish(x, "", b"m")
            ch.basic_publish("", q, b"m")
        assert wait_for(lambda: api.ok(f"/api/queues/%2F/{q}")["message_stats"]["publish_details"]["rate"] > 0)
        queue = api.ok(f"/api/queues/%2F/{q}")
        assert queue["messages_details"]["rate"] > 0
        assert {"publish", "deliver", "get", "ack", "redeliver", "deliver_get"} <= set(queue["message_stats"])

        chan = api.ok("/api/channels")[0]
        stats = chan["message_stats"]
        assert stats["publish"] == queue["message_stats"]["publish"] and stats["confirm"] == stats["publish"]
        assert {"publish_details", "confirm_details", "deliver_get_details", "get_empty_details"} <= set(stats)
        assert api.ok("/api/connections")[0]["recv_oct_details"]["rate"] >= 0

        def exchange_stats(name: str) -> dict:
            return api.ok(f"/api/exchanges/%2F/{name}")["message_stats"]

        assert wait_for(lambda: exchange_stats(x)["publish_in"] * 2 == stats["publish"] or
                        exchange_stats(x)["publish_in"] > 0)
        half = stats["publish"] // 2
        assert wait_for(lambda: exchange_stats(x)["publish_in"] == half, timeout=3)
        assert exchange_stats(x)["publish_out"] == half
        assert exchange_stats("amq.default")["publish_in"] == half
        vhost = api.ok("/api/vhosts/%2F")
        assert vhost["message_stats"]["publish"] >= 2 * half and vhost["messages"] >= 2 * half
        assert "recv_oct_details" in vhost and "messages_details" in vhost

        ranged_path = f"/api/queues/%2F/{q}?lengths_age=4&lengths_incr=1&msg_rates_age=4&msg_rates_incr=1"
        # one sample a second since the queue appeared, at most age / incr + 1
        assert wait_for(lambda: len(api.ok(ranged_path)["messages_details"]["samples"]) >= 2, timeout=4)
        ranged = api.ok(ranged_path)
        samples = ranged["messages_details"]["samples"]
        assert 2 <= len(samples) <= 5
        stamps = [s["timestamp"] for s in samples]
        assert stamps == sorted(stamps, reverse=True) and all(t % 1000 == 0 for t in stamps)
        assert {"avg", "avg_rate", "rate"} <= set(ranged["message_stats"]["publish_details"])
        over = api.ok("/api/overview?msg_rates_age=4&msg_rates_incr=1&lengths_age=4&lengths_incr=1")
        assert over["message_stats"]["publish_details"]["samples"]
        assert over["queue_totals"]["messages_details"]["samples"]
        assert over["churn_rates"]["queue_declared"] >= 1
        assert over["sample_retention_policies"] == {"global": [600, 3600], "basic": [600], "detailed": [600]}
        node = api.ok("/api/nodes/test@localhost?node_stats_age=2&node_stats_incr=1")
        assert node["mem_used_details"]["samples"] and "fd_used_details" in node
        bad = api.get(f"/api/queues/%2F/{q}?lengths_age=10&lengths_incr=0")
        assert (bad.status, bad.body["reason"]) == (400, "Invalid range parameters: age 10, incr 0")

        time.sleep(0.6)  # idle now: rates fall back to 0
        assert api.ok(f"/api/queues/%2F/{q}")["message_stats"]["publish_details"]["rate"] == 0.0
        sorted_page = api.ok("/api/queues?page=1&sort=message_stats.publish_details.rate&sort_reverse=true")
        assert sorted_page["items"]
    finally:
        conn.close()


def test_non_monitor_overview_sums_its_vhosts(fast_stats):
    api = Api(fast_stats.mgmt_url)
    assert api.put("/api/vhosts/mine").status == 201
    assert api.put("/api/users/m", {"password": "pw", "tags": "management"}).status == 201
    assert api.put("/api/permissions/mine/m", {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    conn = connect(fast_stats.amqp_port, "m", "pw", vhost="mine")
    try:
        ch = conn.channel()
        ch.queue_declare("q")
        for _ in range(5):
            ch.basic_publish("", "q", b"x")
        root = connect(fast_stats.amqp_port)
        root.channel().basic_publish("amq.direct", "none", b"x")
        root.close()
        mine = api.as_user("m", "pw")
        assert wait_for(lambda: mine.ok("/api/overview")["message_stats"]["publish"] == 5)
        assert api.ok("/api/overview")["message_stats"]["publish"] == 6
        assert mine.ok("/api/overview")["queue_totals"]["messages"] == 5
    finally:
        conn.close()
