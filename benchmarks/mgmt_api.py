"""Cost of the management API: listing many queues, the statistics collector, and scraping under load.

Modes (docs/BENCHMARKS.md has the figures and the exact commands):

listing   Declares N queues (default 10,000, one 100-byte message each) on a running broker over AMQP and
          times GET /api/queues?page=1&page_size=100, GET /api/queues (all of them), /api/overview and
          /metrics end to end (urllib client, median and max of --repeat), then deletes the queues.
          The issue's bound: a page of the listing in under a second.
tick      In process, no sockets: one statistics-collector sample (stats.Collector.tick) of a node with
          N queues, the pause the collector makes every collect_statistics_interval (5 s).
cycle     In process: the CPU time of one scrape cycle (/api/overview, /api/queues?page=1, /metrics as
          the handlers build them, without HTTP) with N queues: the share of the event loop a scraper
          polling every second takes, which is its cost at full load. Immune to other work on the machine.
scrape    Broker throughput with the management API idle vs. with a scraper that GETs /api/overview,
          /api/queues?page=1 and /metrics every second (as a monitoring system and the web UI would).
          Starts its own hutch-server (ports 5699/15699 by default) and runs hutch-perf against it,
          alternating idle and scraped runs. The issue's bound: under 5% of throughput.
scrape-cpu  The broker's own CPU time per second without AMQP load, idle vs. scraped (as in `scrape`),
          read from /proc for the server process: the scraper's cost in event-loop time, HTTP,
          authentication and garbage collection included, undisturbed by other work on the machine.
counters  Broker throughput of this tree vs. a baseline tree (--baseline-src, e.g. a `git archive` of the
          commit before the message counters were added), alternating, with the API idle: the cost of
          the counters on the message path.

Usage: python benchmarks/mgmt_api.py listing --amqp-port 5699 --mgmt-port 15699 [--queues 10000] [--repeat 5]
       python benchmarks/mgmt_api.py tick [--queues 10000]
       python benchmarks/mgmt_api.py cycle [--queues 10000] [--repeat 5]
       python benchmarks/mgmt_api.py scrape [--runs 3] [--seconds 15] [--queues 0]
       python benchmarks/mgmt_api.py scrape-cpu [--seconds 15] [--queues 10000]
       python benchmarks/mgmt_api.py counters --baseline-src BASE/src [--this-src NEW/src] [--runs 3] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PERF_ARGS = ["-x", "1", "-y", "1", "-s", "16", "-c", "1000", "-q", "1000", "-A", "100"]
AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
SCRAPED = ("/api/overview", "/api/queues?page=1", "/metrics")


def get(mgmt_port: int, path: str) -> tuple[float, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}{path}", headers=AUTH)
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        body = resp.read()
    return time.perf_counter() - start, body


# -- listing ----------------------------------------------------------------------------------------


def listing(amqp_port: int, mgmt_port: int, queues: int, repeat: int) -> None:
    import pika  # a test dependency: only the modes that talk AMQP need it

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    names = [f"bench-mgmt.{i:06d}" for i in range(queues)]
    started = time.perf_counter()
    for name in names:
        ch.queue_declare(name)
        ch.basic_publish("", name, b"x" * 100)
    print(f"{queues} queues declared in {time.perf_counter() - started:.1f} s; GET over HTTP, "
          f"median / max of {repeat}")
    time.sleep(6)  # let the collector sample them once (collect_statistics_interval 5 s)
    try:
        for path in ("/api/queues?page=1&page_size=100", "/api/queues", "/api/overview", "/metrics"):
            times = []
            body = b""
            for _ in range(repeat):
                elapsed, body = get(mgmt_port, path)
                times.append(elapsed)
            print(f"{path:>36}: median {statistics.median(times) * 1000:7.1f} ms, max {max(times) * 1000:7.1f} ms, "
                  f"{len(body) / 1e6:5.2f} MB")
    finally:
        for name in names:
            ch.queue_delete(name)
        conn.close()


# -- tick -------------------------------------------------------------------------------------------


def tick(queues: int, repeat: int) -> None:
    from hutch.amqp.spec import BasicProperties
    from hutch.config import Config
    from hutch.core.message import Message
    from hutch.mgmt import stats, system
    from hutch.runtime.app import build_node

    node = build_node(Config(node_name="bench@localhost"), monitor_resources=False)
    vhost = node.vhosts["/"]
    for i in range(queues):
        q = node.declare_queue(vhost, f"bench.{i:06d}", False, False, False, {}, None)
        q.publish(Message("", q.name, BasicProperties(), b"x" * 100))
    collector = stats.Collector()
    agent = node.agent
    assert agent is not None  # build_node sets it
    loop = asyncio.new_event_loop()
    times = []
    for k in range(repeat):
        figures = loop.run_until_complete(system.node_figures(agent, node))
        start = time.perf_counter()  # the agent's samples and the tick: one sampling turn of the loop
        samples = loop.run_until_complete(agent.samples())
        collector.tick(samples, node.vhosts.keys(), lambda v, x: x in node.vhosts[v].exchanges,
                       node.wall_ms() + k * 5000, figures)
        times.append(time.perf_counter() - start)
    print(f"agent samples + collector tick, {queues} queues: first {times[0] * 1000:.1f} ms, then median "
          f"{statistics.median(times[1:]) * 1000:.1f} ms, max {max(times[1:]) * 1000:.1f} ms")


# -- one scrape cycle, in process ------------------------------------------------------------------


def cycle(queues: int, repeat: int) -> None:
    """The event-loop time one scrape cycle costs (what `scrape` adds every second), measured as CPU
    time in process: the handlers' work without the HTTP client. At full load the broker is CPU-bound
    on its one event loop, so this time per second is the throughput it takes away."""
    from hutch.amqp.spec import BasicProperties
    from hutch.config import Config
    from hutch.core.message import Message
    from hutch.mgmt import prometheus, stats, system, topology
    from hutch.mgmt.access import Principal
    from hutch.runtime.app import build_node

    node = build_node(Config(node_name="bench@localhost"), monitor_resources=False)
    vhost = node.vhosts["/"]
    for i in range(queues):
        q = node.declare_queue(vhost, f"bench.{i:06d}", False, False, False, {}, None)
        q.publish(Message("", q.name, BasicProperties(), b"x" * 100))
    collector = stats.Collector()
    agent = node.agent
    assert agent is not None  # build_node sets it
    loop = asyncio.new_event_loop()  # the handlers are coroutines now (they ask the node's agent)

    def exchange_exists(vhost: str, name: str) -> bool:
        v = node.vhosts.get(vhost)
        return v is not None and name in v.exchanges

    collector.tick(loop.run_until_complete(agent.samples()), node.vhosts.keys(), exchange_exists, node.wall_ms(),
                   loop.run_until_complete(system.node_figures(agent, node)))
    admin = Principal("guest", ("administrator",))

    def overview() -> bytes:
        view = stats.StatsView(collector)
        return json.dumps(loop.run_until_complete(system.overview(agent, node, admin, view))).encode()

    def queue_page() -> bytes:
        view = stats.StatsView(collector)
        reply = loop.run_until_complete(topology.queue_list(agent, node, admin, None, {"page": "1"}, view))
        return json.dumps(reply, default=str).encode()

    def metrics() -> bytes:
        info = loop.run_until_complete(system.own_node_info(agent, node, node.wall_ms()))
        return prometheus.render(node, "default", info, loop.run_until_complete(agent.metric_samples())).encode()

    total = 0.0
    print(f"one scrape cycle in process, {queues} queues (CPU time, median of {repeat})")
    for label, fn in (("/api/overview", overview), ("/api/queues?page=1", queue_page), ("/metrics", metrics)):
        fn()  # warm up
        times = []
        for _ in range(repeat):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        median = statistics.median(times)
        total += median
        print(f"{label:>20}: {median * 1000:6.1f} ms")
    print(f"{'cycle':>20}: {total * 1000:6.1f} ms of CPU each second = {total * 100:.1f} % of the event loop")


# -- throughput under load --------------------------------------------------------------------------


class Server:
    """A hutch-server of its own on fixed ports, from `src` (None: this tree as installed)."""

    def __init__(self, amqp_port: int, mgmt_port: int, src: str | None = None) -> None:
        self.amqp_port, self.mgmt_port = amqp_port, mgmt_port
        self.data_dir = tempfile.mkdtemp(prefix="hmgmt-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
        env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
        if src is not None:
            env["PYTHONPATH"] = src
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hutch.cli.server", "--data-dir", self.data_dir, "--amqp-port", str(amqp_port),
             "--management-port", str(mgmt_port), "--log-level", "warning", "--no-cluster"], env=env)
        deadline = time.monotonic() + 20
        while True:
            try:
                get(mgmt_port, "/api/overview")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("hutch-server did not start") from None
                time.sleep(0.1)

    def cpu_s(self) -> float:
        """User + system CPU time of the server process so far (all threads), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def perf(amqp_port: int, seconds: int, server: Server | None = None) -> dict:
    """One hutch-perf run; with `server`, also `cpu_us_per_msg`: the broker's CPU time per message
    received, which other work on a shared machine disturbs much less than the throughput."""
    exe = shutil.which("hutch-perf") or str(Path(sys.executable).with_name("hutch-perf"))
    before = server.cpu_s() if server is not None else 0.0
    out = subprocess.run([exe, "--uri", f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F", *PERF_ARGS,
                          "-z", str(seconds), "--json"], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    if server is not None:
        result["cpu_us_per_msg"] = (server.cpu_s() - before) / max(result["received"], 1) * 1e6
    return result


def scraper(mgmt_port: int, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        for path in SCRAPED:
            elapsed, _ = get(mgmt_port, path)
            latencies.append(elapsed)
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))


def declare_queues(amqp_port: int, queues: int) -> None:
    if not queues:
        return
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    for i in range(queues):
        ch.queue_declare(f"bench-mgmt.{i:06d}")
    conn.close()


def summarise(label: str, results: list[dict]) -> tuple[float, float]:
    """Print and return the median receive rate and the median broker CPU µs per message."""
    rates = [r["receive_rate"] for r in results]
    cpu = [r["cpu_us_per_msg"] for r in results]
    median, cpu_median = statistics.median(rates), statistics.median(cpu)
    print(f"{label}:\n    receive rate median {median:,.0f} msg/s, best {max(rates):,} (runs: "
          f"{', '.join(f'{r:,}' for r in rates)})\n    broker CPU per message median {cpu_median:.2f} µs "
          f"(runs: {', '.join(f'{c:.2f}' for c in cpu)})")
    return median, cpu_median


def verdict(a: tuple[float, float], b: tuple[float, float]) -> None:
    print(f"cost: {(a[0] - b[0]) / a[0] * 100:+.1f} % of throughput (medians), "
          f"{(b[1] - a[1]) / a[1] * 100:+.1f} % broker CPU per message (medians)")


def scrape_cost(runs: int, seconds: int, queues: int, amqp_port: int, mgmt_port: int) -> None:
    server = Server(amqp_port, mgmt_port)
    try:
        declare_queues(amqp_port, queues)
        idle: list[dict] = []
        scraped: list[dict] = []
        latencies: list[float] = []
        for _ in range(runs):
            idle.append(perf(amqp_port, seconds, server))
            stop = threading.Event()
            thread = threading.Thread(target=scraper, args=(mgmt_port, stop, latencies), daemon=True)
            thread.start()
            scraped.append(perf(amqp_port, seconds, server))
            stop.set()
            thread.join()
        print(f"hutch-perf {' '.join(PERF_ARGS)} -z {seconds}; {queues} extra queues; alternating")
        verdict(summarise("management idle (collector sampling every 5 s)", idle),
                summarise(f"scraped every second: {', '.join(SCRAPED)}", scraped))
        print(f"scrape GETs under load: median {statistics.median(latencies) * 1000:.1f} ms, "
              f"max {max(latencies) * 1000:.1f} ms")
    finally:
        server.stop()


def scrape_cpu(seconds: int, queues: int, amqp_port: int, mgmt_port: int) -> None:
    """The broker's CPU time per second with no AMQP load, management idle vs. scraped every second:
    what the scraping itself costs the event loop, including HTTP, authentication and garbage
    collection, measured on the server process and so undisturbed by other work on the machine."""
    server = Server(amqp_port, mgmt_port)
    try:
        declare_queues(amqp_port, queues)
        time.sleep(6)  # one collector sample of the queues
        results = []
        for scraped in (False, True, False, True):
            latencies: list[float] = []
            stop = threading.Event()
            thread = threading.Thread(target=scraper, args=(mgmt_port, stop, latencies), daemon=True)
            before = server.cpu_s()
            if scraped:
                thread.start()
            time.sleep(seconds)
            stop.set()
            if scraped:
                thread.join()
            used = server.cpu_s() - before
            results.append((scraped, used / seconds))
            print(f"{'scraped every second' if scraped else 'idle':>22}: {used / seconds * 1000:6.1f} ms of broker CPU "
                  f"per second" + (f" (GET median {statistics.median(latencies) * 1000:.1f} ms)" if latencies else ""))
        idle = statistics.mean(r for s, r in results if not s)
        busy = statistics.mean(r for s, r in results if s)
        print(f"scraping costs {(busy - idle) * 1000:.1f} ms of CPU per second = {(busy - idle) * 100:.1f} % of the "
              f"broker's one event loop ({queues} extra queues)")
    finally:
        server.stop()


def counter_cost(baseline_src: str, this_src: str | None, runs: int, seconds: int, amqp_port: int,
                 mgmt_port: int) -> None:
    base: list[dict] = []
    this: list[dict] = []
    for _ in range(runs):
        for src, results in ((baseline_src, base), (this_src, this)):
            server = Server(amqp_port, mgmt_port, src)
            try:
                results.append(perf(amqp_port, seconds, server))
            finally:
                server.stop()
    print(f"hutch-perf {' '.join(PERF_ARGS)} -z {seconds}; a fresh server per run, alternating")
    verdict(summarise(f"baseline ({baseline_src})", base),
            summarise(f"this tree ({this_src or 'as installed'})", this))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("listing", "tick", "cycle", "scrape", "scrape-cpu", "counters"))
    parser.add_argument("--amqp-port", type=int, default=5699)
    parser.add_argument("--mgmt-port", type=int, default=15699)
    parser.add_argument("--queues", type=int, default=None, help="queues (listing, tick: 10000; scrape: 0)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=0,
                        help="scrape, counters: limit the publisher to N msg/s (hutch-perf -r): a broker that is "
                             "not saturated makes the same batches in both variants, so CPU per message compares "
                             "code cost")
    parser.add_argument("--baseline-src", help="counters: the src/ directory of the baseline tree")
    parser.add_argument("--this-src", help="counters: the src/ directory of the tree to compare (default: installed)")
    args = parser.parse_args()
    if args.rate:
        PERF_ARGS.extend(["-r", str(args.rate)])
    if args.mode == "listing":
        listing(args.amqp_port, args.mgmt_port, args.queues or 10_000, args.repeat)
    elif args.mode == "tick":
        tick(args.queues or 10_000, max(args.repeat, 2))
    elif args.mode == "cycle":
        cycle(10_000 if args.queues is None else args.queues, max(args.repeat, 1))
    elif args.mode == "scrape-cpu":
        scrape_cpu(args.seconds, 10_000 if args.queues is None else args.queues, args.amqp_port, args.mgmt_port)
    elif args.mode == "scrape":
        scrape_cost(args.runs, args.seconds, args.queues or 0, args.amqp_port, args.mgmt_port)
    else:
        if not args.baseline_src:
            parser.error("counters needs --baseline-src")
        counter_cost(args.baseline_src, args.this_src, args.runs, args.seconds, args.amqp_port, args.mgmt_port)


if __name__ == "__main__":
    main()
