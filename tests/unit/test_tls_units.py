"""Pure parts of TLS: the config keys (`listeners.ssl.default`, `ssl_options.*`, `management.ssl.*`,
`cluster.ssl.*`, `auth_mechanisms.N`, `ssl_cert_login_*`), the user name of a client certificate
(`core/certs.py`), and building and reloading contexts (`runtime/tls.py`) on files made here."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hutch.config import Config, ConfigError, TlsOptions, load_config, parse_config_text
from hutch.core.certs import CertLoginError, file_expiry, login_from_cert
from hutch.runtime.tls import NodeTls, TlsConfigError, build_context


def settings(text: str) -> dict:
    return parse_config_text(text)[0]


def test_tls_keys_become_sections_and_lists() -> None:
    got = settings("listeners.ssl.default = 127.0.0.1:5671\n"
                   "ssl_options.cacertfile = /ca.pem\nssl_options.certfile = /s.pem\nssl_options.keyfile = /s.key\n"
                   "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
                   "ssl_options.versions.2 = tlsv1.2\nssl_options.versions.1 = tlsv1.3\n"
                   "ssl_options.ciphers.1 = ECDHE-RSA-AES256-GCM-SHA384\n"
                   "management.ssl.port = 15671\nmanagement.ssl.certfile = /m.pem\n"
                   "cluster.ssl.cacertfile = /c.pem\n"
                   "auth_mechanisms.2 = EXTERNAL\nauth_mechanisms.1 = PLAIN\n"
                   "ssl_cert_login_from = subject_alternative_name\nssl_cert_login_san_type = email\n")
    assert (got["amqps_host"], got["amqps_port"], got["management_ssl_port"]) == ("127.0.0.1", 5671, 15671)
    assert got["ssl_options"] == TlsOptions("/ca.pem", "/s.pem", "/s.key", None, "verify_peer", True,
                                            ("tlsv1.3", "tlsv1.2"), ("ECDHE-RSA-AES256-GCM-SHA384",))
    assert got["management_ssl"] == TlsOptions(certfile="/m.pem")
    assert got["cluster_ssl"] == TlsOptions(cacertfile="/c.pem")
    assert got["auth_mechanisms"] == ("PLAIN", "EXTERNAL")  # by number, not by line
    assert (got["ssl_cert_login_from"], got["ssl_cert_login_san_type"]) == ("subject_alternative_name", "email")


@pytest.mark.parametrize(("text", "message"), [
    ("ssl_options.verify = yes", "expected one of verify_none, verify_peer"),
    ("ssl_options.versions.1 = tlsv1", "one of tlsv1.2, tlsv1.3 (older TLS versions are not offered)"),
    ("ssl_options.depth = 3", "unknown key 'ssl_options.depth' (a TLS section takes"),
    ("cluster.ssl.verify = verify_none", "the cluster always verifies both peers' certificates"),
    ("auth_mechanisms.1 = CRAM-MD5", "one of PLAIN, AMQPLAIN, EXTERNAL"),
    ("ssl_cert_login_from = email", "one of distinguished_name, common_name"),
    ("listeners.ssl.default = :x", "a port (0-65535; 0: any free port) or host:port, e.g. 5671"),
    ("ssl_options.certfle = /x", "unknown key 'ssl_options.certfle'"),
])
def test_bad_tls_keys_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="<config>:1: ") as info:
        parse_config_text(text)
    assert message in str(info.value)


def _load(tmp_path: Path, text: str, **flags: object) -> Config:
    conf = tmp_path / "hutch.conf"
    conf.write_text(text)
    return load_config({"config": str(conf), **flags}, {})


def test_cross_key_rules(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="listeners.ssl.default needs ssl_options.certfile and ssl_options.keyfile"):
        _load(tmp_path, "listeners.ssl.default = 5671\n")
    with pytest.raises(ConfigError, match="ssl_options.verify = verify_peer needs ssl_options.cacertfile"):
        _load(tmp_path, "ssl_options.verify = verify_peer\n")
    with pytest.raises(ConfigError, match="fail_if_no_peer_cert = true needs management.ssl.verify = verify_peer"):
        _load(tmp_path, "management.ssl.fail_if_no_peer_cert = true\n")
    with pytest.raises(ConfigError, match="needs cluster.ssl.cacertfile, cluster.ssl.certfile and cluster.ssl.keyfile"):
        _load(tmp_path, "cluster.ssl.certfile = /c.pem\n")
    with pytest.raises(ConfigError, match="needs ssl_options.certfile"):  # the flag asks for the listener too
        _load(tmp_path, "", amqps_port=5671)


def test_an_https_only_management_listener_turns_plain_http_off(tmp_path: Path) -> None:
    https = "management.ssl.port = 15671\nmanagement.ssl.certfile = /m.pem\nmanagement.ssl.keyfile = /m.key\n"
    assert _load(tmp_path, https).management_tcp is False
    assert _load(tmp_path, https + "management.tcp.port = 15672\n").management_tcp is True
    assert _load(tmp_path, https, management_port=15672).management_tcp is True
    assert _load(tmp_path, "").management_tcp is True


# -- the user name of a client certificate -------------------------------------------------------------


def _cert(subject: list[x509.NameAttribute], sans: list[x509.GeneralName] | None = None) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(subject)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1)))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


SUBJECT = [x509.NameAttribute(NameOID.COUNTRY_NAME, "GB"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Ltd"),
           x509.NameAttribute(NameOID.COMMON_NAME, "app1")]
SANS: list[x509.GeneralName] = [x509.DNSName("a.example"), x509.DNSName("b.example"),
                                x509.RFC822Name("app1@example.com"),
                                x509.UniformResourceIdentifier("spiffe://example/app1"),
                                x509.IPAddress(ipaddress.ip_address("10.0.0.7")),
                                x509.OtherName(x509.ObjectIdentifier("1.3.6.1.4.1.311.20.2.3"), b"\x0c\x04app1")]


@pytest.mark.parametrize(("login_from", "san_type", "index", "expected"), [
    ("distinguished_name", "dns", 0, "CN=app1,O=Acme\\, Ltd,C=GB"),  # RFC 4514: most specific first, escaped
    ("common_name", "dns", 0, "app1"),
    ("subject_alternative_name", "dns", 0, "a.example"),
    ("subject_alt_name", "dns", 1, "b.example"),
    ("subject_alternative_name", "email", 0, "app1@example.com"),
    ("subject_alternative_name", "uri", 0, "spiffe://example/app1"),
    ("subject_alternative_name", "ip", 0, "10.0.0.7"),
    ("subject_alternative_name", "other_name", 0, "app1"),
])
def test_login_from_cert(login_from: str, san_type: str, index: int, expected: str) -> None:
    assert login_from_cert(_cert(SUBJECT, SANS), login_from, san_type, index) == expected


def test_a_certificate_without_the_name_is_refused() -> None:
    bare = _cert([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme")])
    with pytest.raises(CertLoginError, match="has no CN"):
        login_from_cert(bare, "common_name")
    with pytest.raises(CertLoginError, match="has no subject alternative name"):
        login_from_cert(bare, "subject_alternative_name")
    with pytest.raises(CertLoginError, match="2 subject alternative name.s. of type dns, none at index 2"):
        login_from_cert(_cert(SUBJECT, SANS), "subject_alternative_name", "dns", 2)
    with pytest.raises(CertLoginError, match="unreadable client certificate"):
        login_from_cert(b"not der", "common_name")


# -- contexts and reloads ------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> tuple[trustme.CA, TlsOptions]:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "s.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "s.key"))
    return ca, TlsOptions(str(tmp_path / "ca.pem"), str(tmp_path / "s.pem"), str(tmp_path / "s.key"),
                          verify="verify_peer")


def test_build_context_follows_the_options(files: tuple[trustme.CA, TlsOptions]) -> None:
    _, opts = files
    ctx = build_context(opts, "ssl_options.")
    assert ctx.verify_mode == ssl.CERT_OPTIONAL and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    strict = TlsOptions(opts.cacertfile, opts.certfile, opts.keyfile, verify="verify_peer", fail_if_no_peer_cert=True,
                        versions=("tlsv1.3",))
    ctx = build_context(strict, "ssl_options.")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert build_context(opts, "cluster.ssl.", server=False, mutual=True).verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TlsConfigError, match="cannot load ssl_options.certfile '/nope.pem'"):
        build_context(TlsOptions(certfile="/nope.pem", keyfile=opts.keyfile), "ssl_options.")
    with pytest.raises(TlsConfigError, match="ssl_options.ciphers: no cipher suite of NOPE"):
        build_context(TlsOptions(certfile=opts.certfile, keyfile=opts.keyfile, ciphers=("NOPE",)), "ssl_options.")


def test_reload_only_when_files_change_and_never_to_a_bad_file(files: tuple[trustme.CA, TlsOptions],
                                                               tmp_path: Path) -> None:
    ca, opts = files
    tls = NodeTls(Config(ssl_options=opts))
    assert tls.server_context("management_ssl") is None
    assert tls.server_context("ssl_options") is not None
    assert tls.reload() == 0  # nothing changed
    assert tls.reload(force=True) == 1  # SIGHUP
    renewed = ca.issue_cert("localhost", "renewed.example")
    renewed.cert_chain_pems[0].write_to_path(opts.certfile)
    renewed.private_key_pem.write_to_path(opts.keyfile)
    assert tls.reload() == 1
    Path(opts.certfile).write_text("garbage\n")
    assert tls.reload() == 0 and tls.reloads == 2


def test_file_expiry(files: tuple[trustme.CA, TlsOptions], tmp_path: Path) -> None:
    _, opts = files
    now = datetime.datetime.now(datetime.UTC)
    found = file_expiry(opts.certfile or "", now)
    assert len(found.not_after) == 1 and found.not_after[0] > now and not found.error
    (tmp_path / "empty.pem").write_text("nothing\n")
    assert file_expiry(str(tmp_path / "empty.pem"), now).error == \
        "The certificate file provided does not contain any PEM entry."
    assert "cannot read" in file_expiry(str(tmp_path / "missing.pem"), now).error
    long_ago = datetime.datetime(1990, 1, 1, tzinfo=datetime.UTC)  # before trustme's notBefore
    assert file_expiry(opts.certfile or "", long_ago).error == "Certificate is not yet valid"


def _served_certificate(server_ctx: ssl.SSLContext, cafile: str,
                        client_cert: trustme.LeafCert | None = None) -> bytes:
    """An in-memory TLS handshake against `server_ctx` (the client presenting `client_cert`); the
    certificate the server served (DER). ssl.SSLError when the handshake fails."""
    client_ctx = ssl.create_default_context(cafile=cafile)
    if client_cert is not None:
        client_cert.configure_cert(client_ctx)
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for i, side in enumerate((client, server)):
            if not done[i]:
                try:
                    side.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done):
            break
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_key_replaced_during_a_reload_never_breaks_the_live_context(
        files: tuple[trustme.CA, TlsOptions], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21, finding 7: the reload read the files twice (a scratch context, then the live one); a key
    written between the two reads left the live context with the new certificate and no matching key,
    while the log said the old certificate stayed. Now each context is built from one read and swapped
    in whole: the live context always completes a handshake."""
    ca, opts = files
    tls = NodeTls(Config(ssl_options=opts))
    tls.server_context("ssl_options")
    renewed, stray = ca.issue_cert("localhost"), ca.issue_cert("localhost")
    renewed.cert_chain_pems[0].write_to_path(opts.certfile)
    renewed.private_key_pem.write_to_path(opts.keyfile)
    real_load = ssl.SSLContext.load_cert_chain
    reads: list[str] = []

    def racing_load(self: ssl.SSLContext, certfile: str, keyfile: str | None = None,
                    password: object = None) -> None:
        real_load(self, certfile, keyfile, password)  # type: ignore[arg-type]
        reads.append(certfile)
        if len(reads) == 1:  # a renewal caught halfway: the next key lands right after the first read
            stray.private_key_pem.write_to_path(opts.keyfile)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", racing_load)
    tls.reload(force=True)
    monkeypatch.undo()
    served = _served_certificate(tls.server_context("ssl_options"), opts.cacertfile or "")  # type: ignore[arg-type]
    assert served == ssl.PEM_cert_to_DER_cert(renewed.cert_chain_pems[0].bytes().decode())
    assert tls.reload() == 0  # the stray key does not match: refused, and the live context stays whole
    _served_certificate(tls.server_context("ssl_options"), opts.cacertfile or "")  # type: ignore[arg-type]


def test_a_ca_removed_from_cacertfile_is_no_longer_trusted_after_a_reload(
        files: tuple[trustme.CA, TlsOptions], tmp_path: Path) -> None:
    """Contexts are swapped, not loaded into: a new cacertfile replaces the CAs (OpenSSL could only add)."""
    ca, opts = files
    server_ca = tmp_path / "server-ca.pem"  # what the client trusts, whatever the node's cacertfile says
    ca.cert_pem.write_to_path(str(server_ca))
    tls = NodeTls(Config(ssl_options=opts))
    client = ca.issue_cert("client.example")
    _served_certificate(tls.server_context("ssl_options"), str(server_ca), client)  # type: ignore[arg-type]
    trustme.CA().cert_pem.write_to_path(opts.cacertfile or "")  # the node now trusts another CA only
    assert tls.reload(force=True) == 1
    with pytest.raises(ssl.SSLError):
        _served_certificate(tls.server_context("ssl_options"), str(server_ca), client)  # type: ignore[arg-type]
