"""A hutch node with every client-facing TLS listener on (AMQP over TLS, HTTPS management, EXTERNAL),
its CA and a second, unrelated CA (`other`) for the refusals."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import ServerInfo, start_server
from tests.tls.pki import Pki, make_pki

MECHANISMS = "auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = AMQPLAIN\nauth_mechanisms.3 = EXTERNAL\n"


@dataclass
class TlsNode:
    info: ServerInfo
    pki: Pki
    other: Pki  # a CA the node does not trust
    amqps_port: int
    https_port: int

    @property
    def https_url(self) -> str:
        return f"https://localhost:{self.https_port}"


def start_tls_node(tmp: Path, extra_config: str = "", *, https: bool = True,
                   fail_if_no_peer_cert: bool = False, pki: Pki | None = None) -> TlsNode:
    pki = pki or make_pki(tmp / "pki")
    other = make_pki(tmp / "other", "other")
    config = pki.section("ssl_options.", fail_if_no_peer_cert=fail_if_no_peer_cert) + MECHANISMS + extra_config
    if https:
        config += "management.ssl.port = 0\n" + pki.section("management.ssl.", fail_if_no_peer_cert=fail_if_no_peer_cert)
    info = start_server(tmp / "node", "--amqps-port", "0", config_text=config)  # the ports file has every port
    return TlsNode(info, pki, other, info.ports["amqps"], info.ports.get("management_ssl", 0))


@pytest.fixture(scope="session")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    node = start_tls_node(tmp_path_factory.mktemp("tls"))
    yield node
    node.info.stop()
