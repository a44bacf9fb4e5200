"""The stream protocol over TLS (`stream.listeners.ssl.default` with the AMQP listener's `ssl_options.*`):
rstream publishes and consumes through it with a context that trusts the node's CA; open advertises the
TLS port; a client that does not trust the CA fails the handshake."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, Producer

from conftest import start_server
from tls.pki import make_pki

pytestmark = pytest.mark.asyncio
AUTH = {"username": "guest", "password": "guest"}


async def test_publish_and_consume_over_tls(tmp_path: Path) -> None:
    pki, other = make_pki(tmp_path / "pki"), make_pki(tmp_path / "other", "other")
    config = pki.section("ssl_options.", verify=False) + "stream.listeners.ssl.default = 0\n"
    info = start_server(tmp_path / "node", config_text=config)
    port = info.ports["stream_tls"]
    try:
        ctx = pki.client_context()
        async with Producer("127.0.0.1", port=port, ssl_context=ctx, **AUTH) as p:
            await p.create_stream("tls-s")
            await p.send_wait("tls-s", AMQPMessage(body=b"secret"))
            client = await p.default_client
            assert client.server_properties["advertised_port"] == str(port)
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(msg: AMQPMessage, ctx_: MessageContext) -> None:
            got.append(bytes(msg))
            done.set()

        async with Consumer("127.0.0.1", port=port, ssl_context=ctx, **AUTH) as c:
            await c.start()
            await c.subscribe("tls-s", on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            await asyncio.wait_for(done.wait(), 30)
        assert got and got[0].endswith(b"secret")
        with pytest.raises(ssl.SSLError):
            async with Producer("127.0.0.1", port=port, ssl_context=other.client_context(), **AUTH):
                pass
        assert "stream protocol over TLS listener started" in info.log()
    finally:
        info.stop()


async def test_external_login_with_a_client_certificate(tmp_path: Path) -> None:
    from rstream.constants import SlasMechanism
    from rstream.exceptions import AuthenticationFailure
    pki = make_pki(tmp_path / "pki")
    config = (pki.section("ssl_options.") + "stream.listeners.ssl.default = 0\n"
              "auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = EXTERNAL\nssl_cert_login_from = common_name\n")
    info = start_server(tmp_path / "node", config_text=config)
    port = info.ports["stream_tls"]
    try:
        guest_cert = pki.issue("guest-client", common_name="guest")
        async with Producer("127.0.0.1", port=port, ssl_context=pki.client_context(guest_cert),
                            username="ignored", password="ignored",
                            sasl_configuration_mechanism=SlasMechanism.MechanismExternal) as p:
            await p.create_stream("tls-ext")
            await p.send_wait("tls-ext", AMQPMessage(body=b"by certificate"))
        nobody = pki.issue("nobody-client", common_name="nobody")
        with pytest.raises(AuthenticationFailure):  # response code AUTHENTICATION_FAILURE (0x08)
            async with Producer("127.0.0.1", port=port, ssl_context=pki.client_context(nobody), username="x",
                                password="x", sasl_configuration_mechanism=SlasMechanism.MechanismExternal):
                pass
        assert "user 'nobody' (from the client certificate) does not exist" in info.log()
    finally:
        info.stop()
