"""AMQP over TLS (`listeners.ssl.default`, `ssl_options.*`) and the EXTERNAL mechanism, with real clients
(pika and aio-pika with SSL contexts) against a real node, and the refusals: a client that does not
trust the node's CA, a client certificate from another CA, plain AMQP on the TLS port."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import uuid
from urllib.parse import quote

import aio_pika
import pika
import pika.credentials
import pika.exceptions
import pytest
import requests
from pamqp import commands, frame
from tests.interop.helpers import raw_session, write_after_close
from tests.mgmt.helpers import run_ctl
from tests.tls.conftest import TlsNode, start_tls_node

from hutch.core.tls_names import tls_fields

pytestmark = pytest.mark.timeout(60)


def params(node: TlsNode, ctx: ssl.SSLContext, **kw: object) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", node.amqps_port, ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     connection_attempts=1, **kw)  # type: ignore[arg-type]


def api(node: TlsNode, method: str, path: str, body: object = None) -> requests.Response:
    return requests.request(method, node.info.mgmt_url + path, json=body, auth=("guest", "guest"), timeout=10)


def cert_user(node: TlsNode, name: str) -> str:
    """A user (no password) for the client certificate CN=<name>, with full rights on /."""
    user = f"CN={name},OU=tls,O=hutch tests"  # the subject's distinguished name, RFC 4514 order
    assert api(node, "PUT", f"/api/users/{quote(user, safe='')}", {"password_hash": "", "tags": ""}).ok
    assert api(node, "PUT", f"/api/permissions/%2F/{quote(user, safe='')}",
               {"configure": ".*", "write": ".*", "read": ".*"}).ok
    return user


def start_mechanisms(node: TlsNode, ctx: ssl.SSLContext | None, port: int | None = None) -> bytes:
    """The mechanisms the node's connection.start offers on this connection."""
    raw = socket.create_connection(("127.0.0.1", port or node.amqps_port), timeout=5)
    sock = ctx.wrap_socket(raw, server_hostname="localhost") if ctx is not None else raw
    with sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while True:
            data += sock.recv(65536)
            try:
                _, _, start = frame.unmarshal(data)
                break
            except Exception:  # not all of the frame yet
                continue
    assert isinstance(start, commands.Connection.Start)
    return start.mechanisms.encode() if isinstance(start.mechanisms, str) else start.mechanisms


def test_pika_publishes_and_consumes_over_tls(tls_node: TlsNode) -> None:
    with pika.BlockingConnection(params(tls_node, tls_node.pki.client_context())) as conn:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"over tls")
        _, _, body = ch.basic_get(q, auto_ack=True)
        assert body == b"over tls"


@pytest.mark.asyncio
async def test_aio_pika_over_tls_with_an_amqps_url(tls_node: TlsNode) -> None:
    ctx = tls_node.pki.client_context()
    ctx.check_hostname = False  # the URL names 127.0.0.1; the certificate names it too, as an IP SAN
    conn = await aio_pika.connect(f"amqps://guest:guest@127.0.0.1:{tls_node.amqps_port}/", ssl_context=ctx)
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue(exclusive=True)
        await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), routing_key=q.name)
        msg = await q.get(timeout=5)
        assert msg.body == b"aio over tls"
        await msg.ack()
        seen = [c for c in api(tls_node, "GET", "/api/connections").json() if c["port"] == tls_node.amqps_port]
        assert seen and all(c["ssl"] is True and c["ssl_protocol"] in ("tlsv1.2", "tlsv1.3") for c in seen)


def test_a_client_that_does_not_trust_the_node_ca_is_refused(tls_node: TlsNode) -> None:
    with pytest.raises(ssl.SSLCertVerificationError) as info:
        pika.BlockingConnection(params(tls_node, tls_node.other.client_context()))
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


def test_a_client_certificate_from_another_ca_is_refused_by_the_node(tls_node: TlsNode) -> None:
    stranger = tls_node.other.issue("mallory")
    ctx = tls_node.pki.client_context()
    ctx.load_cert_chain(*map(str, stranger))
    with pytest.raises(pika.exceptions.AMQPConnectionError), pika.BlockingConnection(params(tls_node, ctx)) as conn:
        conn.channel()


def test_plain_amqp_on_the_tls_port_is_closed_without_a_traceback(tls_node: TlsNode) -> None:
    with socket.create_connection(("127.0.0.1", tls_node.amqps_port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            answer = sock.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"AMQP")  # no AMQP in clear: the node closed the socket
        assert sock.recv(1024) == b""
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_node.amqps_port, connection_attempts=1,
                                                          socket_timeout=5, blocked_connection_timeout=5))
    time.sleep(0.2)
    log = tls_node.info.log()
    assert "Traceback" not in log and "[ERROR]" not in log, log
    with pika.BlockingConnection(params(tls_node, tls_node.pki.client_context())) as conn:  # still serving
        assert conn.is_open


def test_external_is_offered_only_with_a_verified_client_certificate(tls_node: TlsNode) -> None:
    with_cert = tls_node.pki.client_context(tls_node.pki.issue("offer"))
    assert start_mechanisms(tls_node, with_cert).split() == [b"PLAIN", b"AMQPLAIN", b"EXTERNAL"]
    assert start_mechanisms(tls_node, tls_node.pki.client_context()).split() == [b"PLAIN", b"AMQPLAIN"]
    assert start_mechanisms(tls_node, None, tls_node.info.amqp_port).split() == [b"PLAIN", b"AMQPLAIN"]


def test_external_logs_in_as_the_certificate_subject(tls_node: TlsNode) -> None:
    name = f"app-{uuid.uuid4().hex[:8]}"
    user = cert_user(tls_node, name)
    ctx = tls_node.pki.client_context(tls_node.pki.issue(name))
    conn = pika.BlockingConnection(params(tls_node, ctx, credentials=pika.credentials.ExternalCredentials()))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x", pika.BasicProperties(user_id=user))  # user-id must be the login
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"
        mine = [c for c in api(tls_node, "GET", "/api/connections").json() if c["user"] == user]
        assert mine and mine[0]["auth_mechanism"] == "EXTERNAL" and mine[0]["ssl"] is True
    finally:
        conn.close()


def test_the_connection_api_describes_the_client_certificate(tls_node: TlsNode) -> None:
    """RabbitMQ's peer_cert_subject / issuer / validity (the web UI's connection page): the verified
    client certificate's names in RFC 4514 order and its dates; None each for a client without one."""
    name = f"peer-{uuid.uuid4().hex[:8]}"
    with_cert = pika.BlockingConnection(params(tls_node, tls_node.pki.client_context(tls_node.pki.issue(name)),
                                               client_properties={"connection_name": name}))
    without = pika.BlockingConnection(params(tls_node, tls_node.pki.client_context(),
                                             client_properties={"connection_name": name + "-none"}))
    try:
        listed = {c["user_provided_name"]: c for c in api(tls_node, "GET", "/api/connections").json()}
        mine, bare = listed[name], listed[name + "-none"]
        assert mine["peer_cert_subject"] == f"CN={name},OU=tls,O=hutch tests"
        assert re.fullmatch(r"OU=Testing CA #\S+,O=hutch test ca", mine["peer_cert_issuer"]), mine["peer_cert_issuer"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ - \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            mine["peer_cert_validity"]), mine["peer_cert_validity"]
        assert (bare["peer_cert_subject"], bare["peer_cert_issuer"], bare["peer_cert_validity"]) == (None, None, None)
    finally:
        with_cert.close()
        without.close()


def test_external_refuses_a_certificate_whose_user_does_not_exist(tls_node: TlsNode) -> None:
    ctx = tls_node.pki.client_context(tls_node.pki.issue("nobody-here"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params(tls_node, ctx, credentials=pika.credentials.ExternalCredentials()))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(info.value)
    assert "CN=nobody-here,OU=tls,O=hutch tests' (from the client certificate) does not exist" in \
        tls_node.info.log()


def test_external_without_a_client_certificate_is_not_offered(tls_node: TlsNode) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # pika: no acceptable mechanism
        pika.BlockingConnection(params(tls_node, tls_node.pki.client_context(),
                                       credentials=pika.credentials.ExternalCredentials()))


def test_external_with_the_common_name_and_fail_if_no_peer_cert(tmp_path) -> None:
    node = start_tls_node(tmp_path, "ssl_cert_login_from = common_name\n", fail_if_no_peer_cert=True)
    try:
        assert api(node, "PUT", "/api/users/robot", {"password_hash": "", "tags": ""}).ok
        assert api(node, "PUT", "/api/permissions/%2F/robot", {"configure": ".*", "write": ".*", "read": ".*"}).ok
        ctx = node.pki.client_context(node.pki.issue("robot"))
        with pika.BlockingConnection(params(node, ctx, credentials=pika.credentials.ExternalCredentials())) as conn:
            conn.channel().queue_declare("", exclusive=True)
            assert [c["user"] for c in api(node, "GET", "/api/connections").json()] == ["robot"]
        no_cert = params(node, node.pki.client_context())
        with pytest.raises(pika.exceptions.AMQPConnectionError), pika.BlockingConnection(no_cert) as conn:
            conn.channel()  # no client certificate at all: refused
        cert = node.pki.issue("web-client")
        with pytest.raises(requests.exceptions.ConnectionError):  # HTTPS too (management.ssl.fail_if_no_peer_cert)
            requests.get(node.https_url + "/api/whoami", auth=("guest", "guest"), verify=str(node.pki.cacertfile),
                         timeout=10)
        with_cert = requests.get(node.https_url + "/api/whoami", auth=("guest", "guest"), timeout=10,
                                 verify=str(node.pki.cacertfile), cert=(str(cert[0]), str(cert[1])))
        assert with_cert.status_code == 200
    finally:
        node.info.stop()


def test_writes_after_close_are_read_and_discarded_over_tls(tls_node: TlsNode) -> None:
    """The close handshake on the TLS listener (issue 22): the node keeps reading and discarding after
    close-ok until the client closes (tests/interop/test_close_handshake.py has the plain listener's)."""
    with raw_session(tls_node.amqps_port, ssl_context=tls_node.pki.client_context()) as raw:
        write_after_close(raw)


TLS_COLUMNS = ("ssl", "ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject",
               "peer_cert_issuer", "peer_cert_validity")


def client_tls(conn: pika.BlockingConnection) -> dict[str, object]:
    """What the client's own TLS session negotiated, in rabbitmqctl's spelling."""
    sock = conn._impl._transport._sock  # pika's SSLSocket
    return tls_fields((sock.version(), sock.cipher()[0]))


def listed_by_hutchctl(node: TlsNode, *names: str) -> dict[str, dict[str, object]]:
    """hutchctl list_connections' TLS columns (JSON) of the connections named `names`, and that its table
    prints the same columns, empty where there is nothing."""
    proc = run_ctl(node.info, "list_connections", "--formatter", "json", "user_provided_name", *TLS_COLUMNS)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    rows = {r["user_provided_name"]: r for r in json.loads(proc.stdout) if r["user_provided_name"] in names}
    table = run_ctl(node.info, "list_connections", "-q", "user_provided_name", ",".join(TLS_COLUMNS))
    assert table.returncode == 0 and table.stdout.splitlines()[0].split() == ["user_provided_name", *TLS_COLUMNS]
    return rows


def test_hutchctl_lists_rabbitmqctls_tls_columns(tls_node: TlsNode) -> None:
    """`hutchctl list_connections ssl ssl_protocol ssl_key_exchange ssl_cipher ssl_hash peer_cert_*`, as
    rabbitmqctl names and spells them: the suite the client negotiated (TLS 1.3, and a client capped at
    TLS 1.2), the client certificate's names and dates; `false` and empty for a plain connection."""
    name = f"ctl-{uuid.uuid4().hex[:8]}"
    tls12 = tls_node.pki.client_context()
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    conns = {
        name + "-cert": pika.BlockingConnection(params(tls_node, tls_node.pki.client_context(tls_node.pki.issue(name)),
                                                       client_properties={"connection_name": name + "-cert"})),
        name + "-12": pika.BlockingConnection(params(tls_node, tls12, client_properties={"connection_name": name + "-12"})),
        name + "-plain": pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", tls_node.info.amqp_port, client_properties={"connection_name": name + "-plain"})),
    }
    try:
        rows = listed_by_hutchctl(tls_node, *conns)
        cert, v12, plain = rows[name + "-cert"], rows[name + "-12"], rows[name + "-plain"]
        assert {k: cert[k] for k in TLS_COLUMNS[:5]} == client_tls(conns[name + "-cert"])
        assert cert["ssl_protocol"] == "tlsv1.3" and cert["ssl_key_exchange"] == "any" and cert["ssl_hash"] == "aead"
        assert cert["peer_cert_subject"] == f"CN={name},OU=tls,O=hutch tests"
        assert re.fullmatch(r"OU=Testing CA #\S+,O=hutch test ca", str(cert["peer_cert_issuer"]))
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ - \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            str(cert["peer_cert_validity"]))
        assert {k: v12[k] for k in TLS_COLUMNS[:5]} == client_tls(conns[name + "-12"])
        assert v12["ssl_protocol"] == "tlsv1.2" and v12["ssl_key_exchange"] == "ecdhe_ecdsa"  # the node's EC key
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", str(v12["ssl_cipher"])), v12
        assert (v12["peer_cert_subject"], v12["peer_cert_issuer"], v12["peer_cert_validity"]) == (None, None, None)
        assert plain == {"user_provided_name": name + "-plain", "ssl": False, **dict.fromkeys(TLS_COLUMNS[1:])}
    finally:
        for conn in conns.values():
            conn.close()
