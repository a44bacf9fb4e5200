"""Several hosts (`option("hosts", ...)` beside `uri`) and writes at a stream's leader.

What is proven here: the `hosts` option's parsing and the order the addresses are tried in (pure); the
failover rule (a host that does not answer is passed over, one that refuses is not, none answering is
an error naming every host tried), pure and against a real hutch process for the stream protocol (the
driver's probes, a read task, the sink) and AMQP 0-9-1 (the queue source); a Spark write and batch read
of a stream whose `uri` names a node that is down; and on a real 3-node cluster: a stream write through
a replica publishes on a connection to the leader the `metadata` command names (each row once in the
stream), a super stream write whose partitions' leaders are on the three nodes takes a connection to each and
routes every row once, and a read whose `uri` node is stopped reads the whole stream from the next host (a replica:
the read stays there, no connection to the leader).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.cluster.nodes import Cluster
from tests.cluster.test_stream_cluster import STREAM_CONF, connect, declare, read_first, stream_port

from conftest import ServerInfo, free_port
from hutch.spark.hosts import first_answering
from hutch.spark.options import (
    HutchOptionError,
    parse_hosts,
    read_options,
    stream_read_options,
    write_options,
)
from hutch.spark.pool import POOL
from hutch.spark.routing import partition_of
from hutch.spark.sink import Publisher
from hutch.spark.source import HutchReadError, open_client
from hutch.spark.stream_sink import StreamPublisher
from hutch.spark.stream_source import HutchStreamBatchReader, HutchStreamReadError, Probe, read_range
from hutch.spark.streamclient import StreamClientError

from .helpers import Broker, amqp_uri, stream_messages, unique

# -- the option (pure) ---------------------------------------------------------------------------------


def test_hosts_parse_as_host_and_optional_port() -> None:
    assert parse_hosts("h1:5552, h2 ,[::1]:7,h1:5552") == (("h1", 5552), ("h2", 0), ("::1", 7))
    for bad in ("", " , ", "h1:0", "h1:99999", "a b", "h1:x", "[::1", "u@h1"):
        with pytest.raises(HutchOptionError, match="hosts"):
            parse_hosts(bad)
    with pytest.raises(HutchOptionError, match="1 to 64 hosts"):
        parse_hosts(",".join(f"h{i}" for i in range(65)))


def test_uri_first_then_hosts_with_the_protocols_port_and_uris_credentials() -> None:
    base = {"uri": "amqp://u:p@h0:5673/v", "hosts": "h1,h2:6000,h0"}
    sr = stream_read_options({**base, "stream": "s", "streamPort": "5560"}, streaming=False)
    assert [(u.host, u.port) for u in sr.stream_uris()] == [("h0", 5560), ("h1", 5560), ("h2", 6000)]
    assert [(u.host, u.port) for u in sr.uris()] == [("h0", 5673), ("h1", 5673), ("h2", 5673)]
    assert {(u.username, u.password, u.vhost) for u in sr.stream_uris()} == {("u", "p", "v")}
    sup = stream_read_options({**base, "superStream": "o"}, streaming=True)
    assert [u.host for u in sup.stream_uris()] == ["h0", "h1", "h2"]
    q = read_options({**base, "queue": "q"})
    assert [(u.host, u.port) for u in q.uris()] == [("h0", 5673), ("h1", 5673), ("h2", 6000)]
    w = write_options({**base, "stream": "s"})
    assert [(u.host, u.port) for u in w.stream_uris()] == [("h0", 5552), ("h1", 5552), ("h2", 6000)]
    assert write_options({"uri": "amqp://h0"}).uris() == (write_options({"uri": "amqp://h0"}).uri,)


def test_failover_skips_what_does_not_answer_and_stops_at_a_refusal() -> None:
    uris = stream_read_options({"uri": "amqp://a", "hosts": "b,c", "stream": "s"}, False).stream_uris()
    seen: list[str] = []

    def connect(codes: dict[str, int]) -> Any:
        def attempt(uri: Any) -> str:
            seen.append(uri.host)
            if uri.host in codes:
                raise StreamClientError(f"{uri.host} failed", codes[uri.host])
            return uri.host
        return attempt

    assert first_answering(uris, connect({"a": 0}), StreamClientError) == "b" and seen == ["a", "b"]
    with pytest.raises(StreamClientError, match="b failed") as refused:
        first_answering(uris, connect({"a": 0, "b": 0x10}), StreamClientError)  # authentication: no failover
    assert refused.value.code == 0x10
    with pytest.raises(StreamClientError, match=r"none of the 3 hosts answered.*a:5552: a failed; "
                                                r"b:5552: b failed; c:5552: c failed"):
        first_answering(uris, connect({"a": 0, "b": 0, "c": 0}), StreamClientError)
    with pytest.raises(StreamClientError, match="^a failed$"):  # one host: its own error, unchanged
        first_answering(uris[:1], connect({"a": 0}), StreamClientError)


# -- against a real node ---------------------------------------------------------------------------------


@pytest.fixture
def sbroker(stream_server: ServerInfo) -> Iterator[Broker]:
    b = Broker(stream_server.amqp_port)
    yield b
    b.close()


def test_probes_tasks_and_queue_reads_try_the_hosts_in_turn(stream_server: ServerInfo, sbroker: Broker) -> None:
    stream, queue = unique("hs"), unique("hq")
    sbroker.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    sbroker.ch.queue_declare(queue)
    for i in range(5):
        sbroker.ch.basic_publish("", stream, f"m{i}".encode())
    dead, dead_stream = free_port(), free_port()
    live = f"127.0.0.1:{stream_server.ports['stream']}"
    opts = stream_read_options({"uri": amqp_uri(dead), "streamPort": str(dead_stream), "hosts": live,
                                "stream": stream}, streaming=False)
    assert stream_messages(stream_server.amqp_port, stream, 5)  # stored
    parts = HutchStreamBatchReader(opts).partitions()
    rows = sum(batch.num_rows for part in parts for batch in read_range(opts, part))
    assert rows == 5
    # The queue source: hosts' ports are AMQP ports there.
    qopts = read_options({"uri": amqp_uri(dead), "hosts": f"127.0.0.1:{stream_server.amqp_port}", "queue": queue})
    open_client(qopts, "hutch-spark test").close()
    # The exchange sink (AMQP 0-9-1) too: three rows to the queue through the next host.
    wopts = write_options({"uri": amqp_uri(dead), "hosts": f"127.0.0.1:{stream_server.amqp_port}",
                           "exchange": "", "routing_key": queue})
    values = pa.record_batch([pa.array([b"a", b"b", b"c"], pa.binary())], names=["value"])
    assert Publisher(wopts, "hq", 0).run(iter([values])).messages == 3
    # None answers: the error names every host tried.
    other = free_port()
    nobody = replace(opts, hosts=(("127.0.0.1", other),))
    with pytest.raises(HutchStreamReadError, match=rf"none of the 2 hosts answered.*127\.0\.0\.1:{dead_stream}: .*"
                                                   rf"127\.0\.0\.1:{other}: "):
        Probe(nobody).end()
    with pytest.raises(HutchReadError, match=rf"none of the 2 hosts answered.*:{dead}: .*:{other}: "):
        open_client(replace(qopts, hosts=(("127.0.0.1", other),)), "hutch-spark test")


@pytest.mark.slow  # ~18 s of Spark; the same failover without Spark is in the default run (above)
def test_spark_write_and_read_when_uris_node_is_down(spark: Any, stream_server: ServerInfo, sbroker: Broker) -> None:
    stream = unique("hsw")
    sbroker.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    down = {"uri": amqp_uri(free_port()), "streamPort": str(free_port()),
            "hosts": f"127.0.0.1:{stream_server.ports['stream']}", "stream": stream}
    df = spark.range(0, 200, numPartitions=1).selectExpr("concat('r', cast(id as string)) as value")
    df.write.format("hutch").mode("append").options(**down, writeId="hw").save()
    got = spark.read.format("hutch").options(**down).load().selectExpr("cast(value as string) as v").collect()
    assert sorted(r.v for r in got) == sorted(f"r{i}" for i in range(200))


# -- on a 3-node cluster -----------------------------------------------------------------------------------


def _batches(n: int) -> Iterator[Any]:
    yield pa.record_batch([pa.array([f"c{i}".encode() for i in range(n)], pa.binary())], names=["value"])


def test_write_through_a_replica_goes_to_the_leader_and_reads_fail_over(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster")
    try:
        for _ in range(3):
            cluster.add(config_text=STREAM_CONF)
        n1, n2, n3 = cluster.nodes
        declare(n1, "placed")  # n1 writes; n2 and n3 replicate
        opts = write_options({"uri": n2.url, "streamPort": str(stream_port(n2)), "stream": "placed", "writeId": "lw"})
        leader = replace(opts.stream_uri(), port=stream_port(n1))
        before = POOL.idle(leader)
        commit = StreamPublisher(opts, "lw", 0, 0).run(_batches(300))
        assert commit.messages == 300
        assert POOL.idle(leader) == before + 1, "the sink did not publish on a connection to the leader n1"
        # The same task again (Spark re-running it): deduplicated on the leader.
        StreamPublisher(opts, "lw", 0, 0).run(_batches(300))
        got = read_first(n2, "placed", 300)
        assert sorted(b for _, b in got) == sorted(f"c{i}" for i in range(300))
        # A super stream whose partitions' leaders are n1, n2, n3, written through n2: a connection per
        # leader (n2's is the task's own), each row in the partition its key routes to, once.
        conn = connect(n2)
        ch = conn.channel()
        ch.exchange_declare("ss", "direct", durable=True, arguments={"x-super-stream": True})
        for i, node in enumerate(cluster.nodes):
            declare(node, f"ss-{i}")
            ch.queue_bind(f"ss-{i}", "ss", str(i), arguments={"x-stream-partition-order": i})
        conn.close()
        sopts = write_options({"uri": n2.url, "streamPort": str(stream_port(n2)), "superStream": "ss"})
        others = [replace(sopts.stream_uri(), port=stream_port(n)) for n in (n1, n3)]
        POOL.close()  # no kept connection: those after the write are the ones it used
        keys = [f"k{i}" for i in range(90)]
        rows = pa.record_batch([pa.array([k.encode() for k in keys], pa.binary()), pa.array(keys)],
                               names=["value", "key"])
        assert StreamPublisher(sopts, "sw", 0, 0).run(iter([rows])).messages == 90
        assert [POOL.idle(u) for u in others] == [1, 1], "not one connection per leader"
        for i in range(3):
            expect = sorted(k for k in keys if partition_of(k, 3) == i)
            assert sorted(b for _, b in read_first(n2, f"ss-{i}", len(expect))) == expect
        # n3 stops: a read whose `uri` names it reads through the next host.
        gone = stream_port(n3)
        n3.stop()
        ropts = stream_read_options({"uri": n3.url, "streamPort": str(gone), "stream": "placed",
                                     "hosts": f"127.0.0.1:{stream_port(n2)}"}, streaming=False)
        POOL.close()
        parts = HutchStreamBatchReader(ropts).partitions()
        assert sum(b.num_rows for part in parts for b in read_range(ropts, part)) == 300
        on_n2 = replace(sopts.stream_uri(), port=stream_port(n2))
        assert (POOL.idle(on_n2), POOL.idle(leader)) == (1, 0), "a read on the replica n2 moved to another node"
    finally:
        cluster.stop()
