"""hutch-storage check/salvage on a real node's data directory after damage in the middle of a queue index
segment file or of a message store file."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from conftest import start_server
from hutch.storage import records
from hutch.storage.appendfile import FILE_HEADER_BYTES, read_seed, scan_file
from hutch.storage.msg_store import STORE_RECORD_TYPE
from hutch.storage.queue_index import INDEX_RECORD_TYPE

QUEUE = "kept"
SESSIONS = 4
SMALL = 8  # per session: embedded in the queue index
LARGE = 2  # per session: >= 5000 bytes, written to the vhost's message store


def storage_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hutch.cli.storage", *args], capture_output=True, text=True,
                          timeout=60)


def bodies(part: int) -> list[bytes]:
    small = [f"{part}-{i}".encode() * 50 for i in range(SMALL)]
    large = [f"large {part}-{i} ".encode() + bytes([65 + part]) * 5000 for i in range(LARGE)]
    return small + large


PUBLISHED = {body for part in range(SESSIONS) for body in bodies(part)}


def publish_persistent(port: int, messages: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=port))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()  # each publish waits for its confirm: one batch record per message
    for body in messages:
        ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def filled_data_dir(tmp_path: Path) -> Path:
    """A node's data directory with persistent messages, the node killed -9."""
    server = start_server(tmp_path)
    try:
        for part in range(SESSIONS):
            publish_persistent(server.amqp_port, bodies(part))
    finally:
        server.stop(signal.SIGKILL)
    data = tmp_path / "data"
    report = storage_cli("check", str(data))
    assert report.returncode == 0, report.stdout + report.stderr
    assert "DAMAGED" not in report.stdout
    return data


@pytest.fixture(scope="module")
def filled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One filled data directory per module (a node start, 40 confirmed publishes, kill -9, a check)."""
    return filled_data_dir(tmp_path_factory.mktemp("filled"))


@pytest.fixture
def filled(filled_template: Path, tmp_path: Path) -> Path:
    """A test's own copy of the filled data directory, where `restart_and_drain(tmp_path)` starts a node."""
    shutil.copytree(filled_template, tmp_path / "data")
    return tmp_path / "data"


def first_file(directory: Path, pattern: str) -> Path:
    files = sorted(p for p in directory.rglob(pattern) if ".damaged-" not in p.name)
    assert files, f"no {pattern} file under {directory}"
    return files[0]


def flip_middle_record(path: Path, fix_crc: bool = False) -> records.Record:
    """XOR a byte three quarters into the middle record's payload, so valid records follow it (damage, not
    a torn tail). With `fix_crc` the record is re-framed so that only the entry's own crc can tell."""
    data = path.read_bytes()
    rtype = STORE_RECORD_TYPE if path.suffix == ".rdq" else INDEX_RECORD_TYPE
    seed, scanned = scan_file(data, str(path), rtype)  # the records after the file header, with its seed
    found = scanned.records
    assert len(found) >= 3, f"{path} holds {len(found)} records"
    rec = found[len(found) // 2]
    raw = bytearray(data)
    body = rec.offset + records.HEADER_BYTES
    raw[body + len(rec.payload) * 3 // 4] ^= 0xFF
    if fix_crc:
        raw[rec.offset:rec.end] = records.encode(rec.type, bytes(raw[body:rec.end]), seed)
    path.write_bytes(bytes(raw))
    return rec


def refused_start(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hutch.cli.server", "--data-dir", str(data),
                           "--amqp-port", "0", "--management-port", "0",
                           "--log-level", "none", "--no-cluster", "--workers", "1"],
                          capture_output=True, text=True, timeout=30)


def salvage_and_recheck(data: Path, damaged: Path) -> str:
    fixed = storage_cli("salvage", str(data))
    assert fixed.returncode == 0, fixed.stderr
    assert "rebuilt with" in fixed.stdout and "lost bytes" in fixed.stdout
    aside = [p.name for p in damaged.parent.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith(damaged.name + ".damaged-"), "the damaged file is kept aside"
    again = storage_cli("check", str(data))
    assert again.returncode == 0, again.stdout  # the copy moved aside is not read
    assert "1 damaged copy kept aside" in again.stdout
    return fixed.stdout


def restart_and_drain(tmp_path: Path) -> list[bytes]:
    """Start the node on the salvaged directory (the copies moved aside are ignored) and take every message."""
    again = start_server(tmp_path)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=again.amqp_port))
        ch = conn.channel()
        count = ch.queue_declare(QUEUE, durable=True, passive=True).method.message_count
        got = []
        while (msg := ch.basic_get(QUEUE, auto_ack=True))[0] is not None:
            got.append(msg[2])
        conn.close()
        assert len(got) == count
        return got
    finally:
        again.stop()


def test_salvage_lets_a_node_with_a_damaged_queue_index_start(filled: Path, tmp_path: Path) -> None:
    data = filled
    qix = first_file(data / "queues", "*.qix")
    flip_middle_record(qix)

    report = storage_cli("check", str(data))
    assert report.returncode == 1
    assert f"{qix.name}: DAMAGED; bad records at bytes" in report.stdout

    refused = refused_start(data)
    assert refused.returncode == 1
    assert "corrupt record" in refused.stderr and qix.name in refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr

    out = salvage_and_recheck(data, qix)
    assert "a lost queue index record may lose the messages" in out

    got = restart_and_drain(tmp_path)
    assert 0 < len(got) < len(PUBLISHED)  # the readable records came back, the damaged one did not
    assert set(got) <= PUBLISHED and len(set(got)) == len(got)


def test_salvage_lets_a_node_with_a_damaged_store_file_start(filled: Path, tmp_path: Path) -> None:
    data = filled
    rdq = first_file(data / "msg_stores", "*.rdq")
    flip_middle_record(rdq)

    report = storage_cli("check", str(data))
    assert report.returncode == 1
    assert f"{rdq.name}: DAMAGED; bad records at bytes" in report.stdout

    refused = refused_start(data)
    assert refused.returncode == 1
    assert "corrupt record" in refused.stderr and rdq.name in refused.stderr

    out = salvage_and_recheck(data, rdq)
    assert "a lost message store entry loses that message" in out

    got = restart_and_drain(tmp_path)
    assert len(got) == len(PUBLISHED) - 1  # one large message per store record
    assert set(got) <= PUBLISHED


def test_a_store_message_with_a_bad_checksum_is_never_served(filled: Path, tmp_path: Path) -> None:
    data = filled
    rdq = first_file(data / "msg_stores", "*.rdq")
    rec = flip_middle_record(rdq, fix_crc=True)  # the record verifies; the message's own crc does not
    (bad,) = [body for body in PUBLISHED if body in rec.payload.tobytes()]  # one large message per record

    report = storage_cli("check", str(data))
    assert report.returncode == 1
    assert "bad entries at bytes" in report.stdout and "checksum mismatch in message" in report.stdout

    # Unsalvaged (on a copy): the node starts, but drops the message that fails its crc and says so.
    unsalvaged = tmp_path / "unsalvaged"
    shutil.copytree(data, unsalvaged / "data")
    got = restart_and_drain(unsalvaged)
    assert set(got) == PUBLISHED - {bad} and len(got) == len(PUBLISHED) - 1
    log = (unsalvaged / "server.log").read_text()
    assert "cannot be read and is dropped" in log and "checksum mismatch in message" in log

    out = salvage_and_recheck(data, rdq)
    assert "lost messages " in out

    got = restart_and_drain(tmp_path)
    assert set(got) == PUBLISHED - {bad} and len(got) == len(PUBLISHED) - 1


def test_a_store_file_with_a_damaged_header_is_set_aside_and_its_messages_lost(filled: Path, tmp_path: Path) -> None:
    """The header holds the seed of every record's checksum: damaged, nothing in the file can be verified.
    The node refuses to start; salvage keeps the file aside and replaces it with an empty one."""
    data = filled
    rdq = first_file(data / "msg_stores", "*.rdq")
    raw = bytearray(rdq.read_bytes())
    raw[FILE_HEADER_BYTES - 1] ^= 0x01  # a bit of the seed
    rdq.write_bytes(bytes(raw))

    report = storage_cli("check", str(data))
    assert report.returncode == 1
    assert f"{rdq.name}: DAMAGED; bad records at bytes [0:{len(raw)}] (bad file header" in report.stdout

    refused = refused_start(data)
    assert refused.returncode == 1
    assert "corrupt record at offset 0: bad file header" in refused.stderr and rdq.name in refused.stderr

    out = salvage_and_recheck(data, rdq)
    assert f"rebuilt with 0 records (0 messages); lost bytes [0:{len(raw)}]" in out
    fresh = rdq.read_bytes()
    assert len(fresh) == FILE_HEADER_BYTES and read_seed(fresh) is not None

    got = restart_and_drain(tmp_path)
    lost = {body for body in PUBLISHED if body in raw}  # the messages the damaged file held
    assert lost and set(got) == PUBLISHED - lost and len(got) == len(set(got))


def test_bad_usage_is_one_line(tmp_path: Path) -> None:
    missing = storage_cli("check", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0
    wrong = storage_cli("frobnicate", str(tmp_path))
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("hutch-storage: error:") and wrong.stderr.strip().count("\n") == 0
