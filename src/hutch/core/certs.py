"""X.509 certificates as the broker reads them: the user name of a client certificate (the EXTERNAL
mechanism, as RabbitMQ's `rabbitmq_auth_mechanism_ssl`) and the validity of certificate files (the
certificate-expiration health check).

Owns: `login_from_cert` and `file_expiry`. Pure (bytes in, values out), except `file_expiry`, which
reads the file it is given. Uses `cryptography` to parse certificates: the standard library can only
describe a peer certificate it verified itself, as a dict without the RFC 4514 form RabbitMQ uses.

Rules (RabbitMQ's `ssl_cert_login_from`):
- `distinguished_name` (RabbitMQ's default): the subject in RFC 4514 form, most specific first
  (`CN=alice,O=Example,C=GB`), as `openssl x509 -noout -subject -nameopt RFC2253` prints it.
- `common_name`: the subject's first CN.
- `subject_alternative_name` (or `subject_alt_name`): the `ssl_cert_login_san_index`-th (from 0) SAN
  of type `ssl_cert_login_san_type` (`dns`, `ip`, `email`, `uri`, `other_name`).
A certificate without the asked-for name raises `CertLoginError` (the login is refused).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID

__all__ = ["CertExpiry", "CertLoginError", "file_expiry", "login_from_cert"]

_SAN_TYPES: dict[str, type[x509.GeneralName]] = {
    "dns": x509.DNSName,
    "ip": x509.IPAddress,
    "email": x509.RFC822Name,
    "uri": x509.UniformResourceIdentifier,
    "other_name": x509.OtherName,
}


class CertLoginError(ValueError):
    """The client certificate has no user name of the configured kind."""


def login_from_cert(der: bytes, login_from: str = "distinguished_name", san_type: str = "dns",
                    san_index: int = 0) -> str:
    """The user name a client certificate (DER) logs in as; `CertLoginError` if it has none."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise CertLoginError(f"unreadable client certificate: {exc}") from None
    if login_from == "distinguished_name":
        name = cert.subject.rfc4514_string()
        if not name:
            raise CertLoginError("the client certificate's subject is empty")
        return name
    if login_from == "common_name":
        attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not attrs:
            raise CertLoginError("the client certificate's subject has no CN")
        value = attrs[0].value
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    if login_from in ("subject_alternative_name", "subject_alt_name"):
        return _san_login(cert, san_type, san_index)
    raise ValueError(f"unknown ssl_cert_login_from {login_from!r}")


def _san_login(cert: x509.Certificate, san_type: str, san_index: int) -> str:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertLoginError("the client certificate has no subject alternative name") from None
    names = [n for n in sans if isinstance(n, _SAN_TYPES[san_type])]
    if san_index >= len(names):
        raise CertLoginError(f"the client certificate has {len(names)} subject alternative name(s) of type "
                             f"{san_type}, none at index {san_index}")
    general = names[san_index]
    if isinstance(general, x509.OtherName):
        return _other_name_text(general.value)
    return str(general.value)


def _other_name_text(der: bytes) -> str:
    """An otherName value: the text of a DER UTF8String/IA5String/PrintableString, else hex (as RabbitMQ
    falls back to the raw value)."""
    if len(der) >= 2 and der[0] in (0x0C, 0x16, 0x13) and der[1] < 0x80 and len(der) == 2 + der[1]:
        return der[2:].decode("utf-8", "replace")
    return der.hex()


@dataclass(frozen=True)
class CertExpiry:
    """What one certificate file says about its validity: the notAfter of each certificate in it
    (UTC), or an error text (unreadable file, no PEM certificate, not yet valid)."""

    not_after: tuple[datetime.datetime, ...] = ()
    error: str = ""


def file_expiry(path: str, now: datetime.datetime) -> CertExpiry:
    """The validity of every certificate in the PEM file at `path` (as RabbitMQ's health check reads
    `certfile` and `cacertfile`)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return CertExpiry(error=f"cannot read {path}: {exc.strerror or exc}")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        return CertExpiry(error="The certificate file provided does not contain any PEM entry.")
    if any(c.not_valid_before_utc > now for c in certs):
        return CertExpiry(error="Certificate is not yet valid")
    return CertExpiry(not_after=tuple(c.not_valid_after_utc for c in certs))
