#!/usr/bin/env python3
"""A backlog, side by side: fill a queue with no consumer, restart the broker holding it, drain it.

For each broker, with the same client (hutch-perf) and the same queue settings:

  (a) publish COUNT messages of SIZE bytes (persistent or transient; confirms, window 1000) to a classic
      queue with no consumer (durable when --persistent): the publish (confirm) rate;
  (b) restart the broker holding the backlog (unless --skip-restart), timed until a passive
      queue.declare reports COUNT messages again;
  (c) drain the queue with one consumer (prefetch 1000, multi-ack every 100): the drain rate;
  (d) the broker process's RSS (VmRSS of /proc/<pid>/status, sampled every 0.2 s in a thread): the peak
      over (a)+(c), per phase, and at the end of (a).

Each phase also records the broker's CPU seconds (utime+stime) and how busy the whole machine was
(/proc/stat), so a run disturbed by other load on the machine shows it.

hutch: a node of its own (`hutch-server` on free ports with a temporary data dir, removed at the end;
its log is kept next to it under /tmp and scanned for WARNING/ERROR lines). RabbitMQ: the node already
running on 127.0.0.1:5672 (restarted with `rabbitmqctl stop` / `rabbitmq-server -detached`; its
process is beam.smp).

    .venv/bin/python benchmarks/backlog.py --broker both --count 1000000 --size 16 --persistent \\
        --out benchmarks/results-2026-11-22-backlog.jsonl

One human line per broker on stdout, one JSON line per broker appended to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika

from hutch.portfile import wait_for_ports

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
RABBIT_PORT = 5672
SAMPLE_S = 0.2
MIB = 1024 * 1024


# -- machine and processes ------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"nproc": int(nproc) if nproc.isdigit() else os.cpu_count(), "cpu_model": model,
            "mem_total_gib": round(mem_kb / 1024 / 1024, 1), "kernel": os.uname().release}


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class Phase:
    """CPU accounting of one phase: the broker's CPU seconds and how busy the whole machine was."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.cpu0 = cpu_seconds(pid)
        self.busy0 = machine_busy()
        self.t0 = time.monotonic()

    def figures(self, prefix: str) -> dict[str, Any]:
        busy1 = machine_busy()
        total = busy1[1] - self.busy0[1]
        return {f"{prefix}_broker_cpu_s": round(cpu_seconds(self.pid) - self.cpu0, 2),
                f"{prefix}_machine_busy_pct": round(100 * (busy1[0] - self.busy0[0]) / total, 1) if total else None}


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the broker exited with status {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s:.0f} s")


class RssSampler(threading.Thread):
    """Samples the broker's VmRSS every SAMPLE_S; the pid and the phase label can change on the way."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.pid: int | None = None
        self.phase = "idle"
        self.peaks: dict[str, int] = {}
        self.samples = 0
        self._halt = threading.Event()

    def sample(self) -> int | None:
        pid = self.pid
        if pid is None:
            return None
        rss = rss_bytes(pid)
        if rss is not None:
            self.samples += 1
            if rss > self.peaks.get(self.phase, 0):
                self.peaks[self.phase] = rss
        return rss

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_S):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)


# -- brokers --------------------------------------------------------------------------------------------

class Broker:
    name = ""
    port = 0
    pid: int | None = None

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def version(self) -> str: return ""
    def log_problems(self) -> dict[str, Any]: return {}

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"


class HutchBroker(Broker):
    name = "hutch"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hutch-backlog-", dir="/tmp"))
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "node.log"
        self.port = 0  # the first start binds any free port (the ports file says which); restarts reuse it
        self.mgmt_port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        log = open(self.log_path, "a")  # noqa: SIM115 - the node writes to it until it stops
        self.starts += 1
        log.write(f"==== backlog.py: start {self.starts} at {datetime.datetime.now().isoformat()}\n")
        log.flush()
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "hutch-server"), "--data-dir", str(self.data_dir), "--amqp-port", str(self.port),
             "--management-port", str(self.mgmt_port), "--no-cluster"],  # as the recorded figures ran
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, "HUTCH_WORKERS": "1"})  # one process (auto, the default, follows the cores)
        log.close()
        self.pid = self.proc.pid
        ports = wait_for_ports(self.data_dir, self.proc, 120, self.log_path)
        self.port, self.mgmt_port = ports["amqp"], ports["management"]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("hutch-server did not stop within 120 s of SIGTERM (killed)") from None
        self.pid = None

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)  # the log stays, with the run's other files

    def version(self) -> str:
        out = subprocess.run([str(VENV_BIN / "hutch-server"), "--version"], capture_output=True, text=True)
        return out.stdout.strip()

    def log_problems(self) -> dict[str, Any]:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        bad = [ln for ln in lines if "[WARNING]" in ln or "[ERROR]" in ln or "[CRITICAL]" in ln
               or "Traceback" in ln]
        return {"log": str(self.log_path), "warnings_errors": len(bad), "first": bad[:20]}


class RabbitBroker(Broker):
    name = "rabbitmq"
    port = RABBIT_PORT

    def __init__(self) -> None:
        if not self.running():
            self.start()
        self.pid = self.beam_pid()

    @staticmethod
    def running() -> bool:
        return subprocess.run(["rabbitmqctl", "status"], capture_output=True).returncode == 0

    def beam_pid(self) -> int | None:
        """The beam.smp that listens on the AMQP port (`pgrep -f beam.smp` also finds rabbitmqctl's)."""
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{self.port}"], capture_output=True, text=True).stdout
        for part in out.split("pid=")[1:]:
            pid = int(part.split(",")[0])
            if "beam.smp" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        pids = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
        return int(pids[0]) if pids else None

    def start(self) -> None:
        subprocess.run(["rabbitmq-server", "-detached"], check=True, capture_output=True)
        wait_port(self.port, 120)
        self.pid = self.beam_pid()

    def stop(self) -> None:
        subprocess.run(["rabbitmqctl", "stop"], check=True, capture_output=True)
        self.pid = None

    def version(self) -> str:
        return "RabbitMQ " + subprocess.run(["rabbitmqctl", "version"], capture_output=True,
                                            text=True).stdout.strip()


# -- AMQP helpers (pika) ---------------------------------------------------------------------------------

def _connection(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30))


def redeclare(port: int, queue: str, durable: bool) -> None:
    conn = _connection(port)
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_declare(queue, durable=durable)
    finally:
        conn.close()


def message_count(port: int, queue: str) -> int | None:
    """Passive declare; None if the broker does not answer or the queue is not there (yet)."""
    try:
        conn = _connection(port)
    except Exception:  # noqa: BLE001 - not up yet: any connection error means "try again"
        return None
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    except Exception:  # noqa: BLE001 - 404 while queues are still being recovered
        return None
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def delete_queue(port: int, queue: str) -> None:
    with contextlib.suppress(Exception):
        conn = _connection(port)
        try:
            conn.channel().queue_delete(queue)
        finally:
            conn.close()


# -- one broker -----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    figures: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def perf(uri: str, args: list[str], timeout_s: float) -> tuple[dict[str, Any] | None, list[str], str]:
    cmd = [str(VENV_BIN / "hutch-perf"), "--uri", uri, "--json", *args]
    shown = " ".join(["hutch-perf", "--uri", uri.replace("guest:guest@", "guest@"), "--json", *args])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, [f"hutch-perf did not finish within {timeout_s + 60:.0f} s"], shown
    lines = proc.stdout.strip().splitlines()
    errors = [] if proc.returncode == 0 else [f"hutch-perf exit {proc.returncode}: {proc.stderr.strip()[-500:]}"]
    try:
        return (json.loads(lines[-1]) if lines else None), errors, shown
    except json.JSONDecodeError:
        return None, errors + [f"hutch-perf printed no JSON: {proc.stdout[-300:]!r}"], shown


def measure(broker: Broker, opts: argparse.Namespace) -> Outcome:
    out = Outcome()
    f = out.figures
    sampler = RssSampler()
    sampler.pid = broker.pid
    sampler.start()
    flags = ["-f", "persistent"] if opts.persistent else []
    commands: list[str] = []
    try:
        f["version"] = broker.version()
        redeclare(broker.port, opts.queue, durable=opts.persistent)
        f["rss_idle_mib"] = round((sampler.sample() or 0) / MIB, 1)

        # (a) publish, no consumer
        sampler.phase = "publish"
        t0 = time.monotonic()
        phase = Phase(broker.pid)
        summary, errors, shown = perf(broker.uri, ["-x", "1", "-y", "0", "-s", str(opts.size), "-c", "1000",
                                                   *flags, "-u", opts.queue, "-C", str(opts.count),
                                                   "-z", str(opts.phase_timeout), "--id", f"{broker.name}-publish"],
                                      opts.phase_timeout)
        commands.append(shown)
        out.errors += errors
        f["publish_wall_s"] = round(time.monotonic() - t0, 2)
        f.update(phase.figures("publish"))
        if summary:
            f["publish_rate"] = summary["confirm_rate"]
            f["publish_s"] = summary["duration_s"]
            f["published"] = summary["sent"]
            f["confirmed"] = summary["confirmed"]
            f["nacked"] = summary["nacked"]
        f["rss_end_publish_mib"] = round((sampler.sample() or 0) / MIB, 1)
        f["queue_after_publish"] = message_count(broker.port, opts.queue)
        if f["queue_after_publish"] != opts.count:
            out.errors.append(f"queue holds {f['queue_after_publish']} messages after publishing, not {opts.count}")

        # (b) restart holding the backlog
        if not opts.skip_restart:
            sampler.phase = "stop"
            t0 = time.monotonic()
            broker.stop()
            f["stop_s"] = round(time.monotonic() - t0, 2)
            sampler.pid = None
            sampler.phase = "restart"
            t1 = time.monotonic()
            broker.start()
            sampler.pid = broker.pid
            f["listening_s"] = round(time.monotonic() - t1, 2)
            deadline = t1 + opts.phase_timeout
            count = None
            while time.monotonic() < deadline:
                count = message_count(broker.port, opts.queue)
                if count == opts.count:
                    break
                time.sleep(0.1)
            f["restart_s"] = round(time.monotonic() - t1, 2)
            f["restart_broker_cpu_s"] = round(cpu_seconds(broker.pid), 2)
            f["queue_after_restart"] = count
            if count != opts.count:
                out.errors.append(f"after the restart the queue reports {count} messages, not {opts.count}")

        # (c) drain with one consumer
        sampler.phase = "drain"
        t0 = time.monotonic()
        phase = Phase(broker.pid)
        summary, errors, shown = perf(broker.uri, ["-x", "0", "-y", "1", "-q", "1000", "-A", "100",
                                                   "-u", opts.queue, "-D", str(opts.count),
                                                   "-z", str(opts.phase_timeout), "--id", f"{broker.name}-drain"],
                                      opts.phase_timeout)
        commands.append(shown)
        out.errors += errors
        f["drain_wall_s"] = round(time.monotonic() - t0, 2)
        f.update(phase.figures("drain"))
        if summary:
            f["drain_rate"] = summary["receive_rate"]
            f["drain_s"] = summary["duration_s"]
            f["drained"] = summary["received"]
        sampler.sample()
        sampler.phase = "after"
        f["queue_after_drain"] = message_count(broker.port, opts.queue)
        if f["queue_after_drain"] != 0:
            out.errors.append(f"queue holds {f['queue_after_drain']} messages after the drain")
        delete_queue(broker.port, opts.queue)
    except Exception as exc:  # noqa: BLE001 - reported in the result line, the other broker still runs
        out.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        sampler.stop()
    peaks = sampler.peaks
    f["rss_peak_publish_mib"] = round(peaks.get("publish", 0) / MIB, 1)
    f["rss_peak_drain_mib"] = round(peaks.get("drain", 0) / MIB, 1)
    f["rss_peak_mib"] = round(max(peaks.get("publish", 0), peaks.get("drain", 0)) / MIB, 1)
    if "restart" in peaks:
        f["rss_peak_restart_mib"] = round(peaks["restart"] / MIB, 1)
    f["rss_samples"] = sampler.samples
    f["perf_commands"] = commands
    return out


def human(name: str, f: dict[str, Any], errors: list[str]) -> str:
    def g(key: str, fmt: str = "{}") -> str:
        return fmt.format(f[key]) if f.get(key) is not None else "-"

    restart = f" | restart {g('restart_s', '{:.1f}')} s (stop {g('stop_s', '{:.1f}')} s)" if "restart_s" in f else ""
    return (f"{name:9s} publish {g('publish_rate', '{:,}')} msg/s ({g('publish_s', '{:.1f}')} s){restart} | "
            f"drain {g('drain_rate', '{:,}')} msg/s ({g('drain_s', '{:.1f}')} s) | RSS end of publish "
            f"{g('rss_end_publish_mib', '{:.0f}')} MiB, peak {g('rss_peak_mib', '{:.0f}')} MiB"
            + (f" | ERRORS: {'; '.join(errors)}" if errors else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", choices=("hutch", "rabbitmq", "both"), default="both")
    p.add_argument("--count", type=int, default=1_000_000, help="messages (default 1,000,000)")
    p.add_argument("--size", type=int, default=16, help="body size in bytes (default 16, min 8)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--persistent", dest="persistent", action="store_true", default=True,
                      help="persistent messages to a durable queue (default)")
    mode.add_argument("--transient", dest="persistent", action="store_false",
                      help="transient messages to a transient queue")
    p.add_argument("--skip-restart", action="store_true", help="no restart between publishing and draining")
    p.add_argument("--queue", default="backlog", help="queue name (default backlog; deleted and redeclared)")
    p.add_argument("--phase-timeout", type=float, default=1800, metavar="S",
                   help="give up a phase (publish, restart, drain) after S seconds (default 1800)")
    p.add_argument("--out", default=None, metavar="FILE", help="append one JSON line per broker to FILE")
    opts = p.parse_args(argv)
    if opts.count < 1 or opts.size < 8:
        p.error("--count must be at least 1 and --size at least 8")

    names = ["hutch", "rabbitmq"] if opts.broker == "both" else [opts.broker]
    status = 0
    host = machine()
    for name in names:
        broker: Broker = HutchBroker() if name == "hutch" else RabbitBroker()
        if isinstance(broker, HutchBroker):
            broker.start()
        load_before = os.getloadavg()
        started = datetime.datetime.now().astimezone()
        try:
            outcome = measure(broker, opts)
        finally:
            broker.close()
        outcome.figures["node_log"] = broker.log_problems() or None
        record = {
            "date": started.isoformat(timespec="seconds"),
            "broker": name,
            "scenario": f"backlog_{opts.count}x{opts.size}B_{'persistent' if opts.persistent else 'transient'}",
            "count": opts.count, "size_bytes": opts.size, "persistent": opts.persistent,
            "durable_queue": opts.persistent, "restart": not opts.skip_restart,
            **outcome.figures,
            "errors": outcome.errors,
            "loadavg_before": [round(x, 2) for x in load_before],
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": host,
        }
        print(human(name, outcome.figures, outcome.errors), flush=True)
        if opts.out:
            with open(opts.out, "a") as fh:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        if outcome.errors:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
