"""HTTPS for the management API (`management.ssl.*`) with requests, aiohttp and hutchctl, the
certificate-expiration health check, and certificate reloads (SIGHUP and the periodic check) for
the AMQP and HTTPS listeners."""

from __future__ import annotations

import base64
import datetime
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import aiohttp
import pytest
import requests
from tests.tls.conftest import TlsNode, start_tls_node
from tests.tls.pki import make_pki

pytestmark = pytest.mark.timeout(90)
GUEST = ("guest", "guest")


def served_cert(port: int) -> str:
    """The PEM certificate a TLS listener presents now (no verification)."""
    return ssl.get_server_certificate(("127.0.0.1", port))


def same_cert(pem_a: str, pem_b: str) -> bool:
    return ssl.PEM_cert_to_DER_cert(pem_a) == ssl.PEM_cert_to_DER_cert(pem_b)


def wait_for(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_requests_over_https(tls_node: TlsNode) -> None:
    reply = requests.get(tls_node.https_url + "/api/overview", auth=GUEST, verify=str(tls_node.pki.cacertfile),
                         timeout=10)
    assert reply.status_code == 200 and reply.json()["node"] == "test@localhost"
    listeners = {(x["protocol"], x["port"]) for x in reply.json()["listeners"]}
    assert {("amqp/ssl", tls_node.amqps_port), ("https", tls_node.https_port)} <= listeners
    checks = requests.get(tls_node.https_url + "/api/health/checks/protocol-listener/amqps,https", auth=GUEST,
                          verify=str(tls_node.pki.cacertfile), timeout=10)
    assert checks.status_code == 200, checks.text
    assert "amqp/ssl" in checks.json()["protocols"] and "https" in checks.json()["protocols"]


@pytest.mark.asyncio
async def test_aiohttp_over_https(tls_node: TlsNode) -> None:
    ctx = tls_node.pki.client_context()
    token = base64.b64encode(b"guest:guest").decode()
    async with aiohttp.ClientSession(headers={"Authorization": f"Basic {token}"}) as session, \
            session.get(tls_node.https_url + "/api/whoami", ssl=ctx) as reply:
        assert reply.status == 200
        assert (await reply.json())["name"] == "guest"


def test_https_with_a_wrong_ca_and_plain_http_on_the_https_port_are_refused(tls_node: TlsNode) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(tls_node.https_url + "/api/overview", auth=GUEST, verify=str(tls_node.other.cacertfile),
                     timeout=10)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{tls_node.https_port}/api/overview", auth=GUEST, timeout=10)
    time.sleep(0.2)
    log = tls_node.info.log()
    assert "Traceback" not in log and "[ERROR]" not in log, log


def test_hutchctl_over_https(tls_node: TlsNode) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    base = [sys.executable, "-m", "hutch.cli.ctl", "--host", "localhost", "--port", str(tls_node.https_port)]
    ok = subprocess.run([*base, "--cacert", str(tls_node.pki.cacertfile), "list_users"], capture_output=True,
                        text=True, timeout=30, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "guest" in ok.stdout
    wrong = subprocess.run([*base, "--cacert", str(tls_node.other.cacertfile), "list_users"], capture_output=True,
                           text=True, timeout=30, env=env)
    assert wrong.returncode == 69 and "https://localhost:" in wrong.stderr and "CERTIFICATE_VERIFY_FAILED" in \
        wrong.stderr, wrong.stderr
    queues = subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--host", "localhost", "--port",
                             str(tls_node.https_port), "--ssl", "--cacert", str(tls_node.pki.cacertfile),
                             "quorum_status", "nosuch"], capture_output=True, text=True, timeout=30, env=env)
    assert queues.returncode == 1 and "cannot reach" not in queues.stderr, queues.stderr  # the node answered


def test_certificate_expiration_check(tls_node: TlsNode) -> None:
    def check(within: str, unit: str) -> requests.Response:
        return requests.get(f"{tls_node.info.mgmt_url}/api/health/checks/certificate-expiration/{within}/{unit}",
                            auth=GUEST, timeout=10)

    assert check("1", "days").status_code == 200 and check("1", "days").json() == {"status": "ok"}
    far = check("1000", "years")
    assert far.status_code == 503
    body = far.json()
    assert body["status"] == "failed" and body["reason"] == "Certificates expiring"
    by_protocol = {e["protocol"]: e for e in body["expired"]}
    assert set(by_protocol) == {"amqp/ssl", "https"}
    amqps = by_protocol["amqp/ssl"]
    assert amqps["port"] == tls_node.amqps_port and amqps["node"] == "test@localhost"
    assert amqps["certfile"] == str(tls_node.pki.certfile) and amqps["cacertfile"] == str(tls_node.pki.cacertfile)
    assert len(amqps["certfile_expires_on"]) == 1 and len(amqps["cacertfile_expires_on"]) == 1
    assert check("x", "days").status_code == 400 and check("x", "days").json()["reason"] == "Invalid expiration value."
    assert check("1", "fortnights").status_code == 400


def test_a_certificate_that_expires_soon_fails_the_check(tmp_path) -> None:
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=5)
    node = start_tls_node(tmp_path, https=False, pki=make_pki(tmp_path / "pki", server_not_after=soon))
    try:
        url = f"{node.info.mgmt_url}/api/health/checks/certificate-expiration"
        assert requests.get(f"{url}/4/days", auth=GUEST, timeout=10).status_code == 200
        reply = requests.get(f"{url}/1/weeks", auth=GUEST, timeout=10)
        assert reply.status_code == 503
        [entry] = reply.json()["expired"]
        assert entry["protocol"] == "amqp/ssl" and entry["cacertfile_expires_on"] == []
        assert entry["certfile_expires_on"] == [f"{soon.year}-{soon.month:02d}-{soon.day:02d} {soon.hour}:"
                                                f"{soon.minute:02d}:{soon.second:02d}"]
    finally:
        node.info.stop()


def _replace_server_cert(node: TlsNode, name: str) -> str:
    """Issue a new server certificate from the same CA and write it over the node's files; its PEM."""
    cert, key = node.pki.issue(name, "127.0.0.1", "localhost")
    shutil.copy(key, node.pki.keyfile)
    shutil.copy(cert, node.pki.certfile)
    return cert.read_text()


def test_certificates_are_reloaded_on_sighup(tmp_path) -> None:
    node = start_tls_node(tmp_path, "ssl_cert_reload_interval = 0\n")
    try:
        before = served_cert(node.amqps_port)
        new_pem = _replace_server_cert(node, "renewed")
        time.sleep(0.3)
        assert same_cert(served_cert(node.amqps_port), before)  # no periodic check: nothing yet
        with socket.create_connection(("127.0.0.1", node.amqps_port)) as held:  # an open connection stays
            node.info.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: same_cert(served_cert(node.amqps_port), new_pem))
            assert same_cert(served_cert(node.https_port), new_pem)
            assert held.fileno() >= 0
        assert requests.get(node.https_url + "/api/whoami", auth=GUEST, verify=str(node.pki.cacertfile),
                            timeout=10).status_code == 200
        assert node.info.proc.poll() is None
    finally:
        node.info.stop()


def test_certificates_are_reloaded_when_the_files_change_and_a_bad_file_keeps_the_old(tmp_path) -> None:
    node = start_tls_node(tmp_path, "ssl_cert_reload_interval = 200\n", https=False)
    try:
        new_pem = _replace_server_cert(node, "renewed")
        wait_for(lambda: same_cert(served_cert(node.amqps_port), new_pem))
        node.pki.certfile.write_text("not a certificate\n")
        wait_for(lambda: "TLS certificate reload failed, the old certificate stays in use" in node.info.log())
        assert same_cert(served_cert(node.amqps_port), new_pem)
        assert node.info.proc.poll() is None
    finally:
        node.info.stop()
