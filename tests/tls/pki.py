"""Test-time PKI: a CA, server and client certificates written as PEM files (trustme), and the hutch
config lines that use them. Nothing is checked in: every test run makes its own keys."""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass
class Pki:
    """One CA and the files of a server certificate it issued (for 127.0.0.1 and localhost)."""

    directory: Path
    ca: trustme.CA
    cacertfile: Path
    certfile: Path
    keyfile: Path

    def issue(self, name: str, *identities: str, common_name: str | None = None,
              not_after: datetime.datetime | None = None) -> tuple[Path, Path]:
        """A certificate (and key) with subject CN=<common_name or name>, O=hutch tests; files
        <name>.pem and <name>.key."""
        kw = {"not_after": not_after} if not_after is not None else {}
        cert = self.ca.issue_cert(*(identities or (f"{name}.example",)), common_name=common_name or name,
                                  organization_name="hutch tests", organization_unit_name="tls", **kw)
        certfile, keyfile = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(certfile))
        cert.private_key_pem.write_to_path(str(keyfile))
        return certfile, keyfile

    def client_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client context that trusts this CA (and presents `cert`)."""
        ctx = ssl.create_default_context(cafile=str(self.cacertfile))
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

    def section(self, prefix: str, *, verify: bool = True, fail_if_no_peer_cert: bool = False) -> str:
        """Config lines of one TLS section (`ssl_options.`, `management.ssl.`, `cluster.ssl.`)."""
        lines = [f"{prefix}cacertfile = {self.cacertfile}", f"{prefix}certfile = {self.certfile}",
                 f"{prefix}keyfile = {self.keyfile}"]
        if prefix != "cluster.ssl." and verify:
            lines.append(f"{prefix}verify = verify_peer")
            lines.append(f"{prefix}fail_if_no_peer_cert = {str(fail_if_no_peer_cert).lower()}")
        return "\n".join(lines) + "\n"


def make_pki(directory: Path, name: str = "ca", *, server_not_after: datetime.datetime | None = None) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name=f"hutch test {name}")
    cacertfile = directory / f"{name}.pem"
    ca.cert_pem.write_to_path(str(cacertfile))
    pki = Pki(directory, ca, cacertfile, directory / "none", directory / "none")
    pki.certfile, pki.keyfile = pki.issue(f"{name}-server", "127.0.0.1", "localhost", not_after=server_not_after)
    return pki
