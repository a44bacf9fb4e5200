"""core/tls_names.py: OpenSSL's cipher names read as RabbitMQ shows them (Erlang's selected_cipher_suite),
checked against OpenSSL's own description of every suite it knows (`SSLContext.get_ciphers`)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from hutch.core.tls_names import cipher_suite, tls_fields

_KX = {("kx-any", "auth-any"): "any", ("kx-rsa", "auth-rsa"): "rsa", ("kx-ecdhe", "auth-rsa"): "ecdhe_rsa",
       ("kx-ecdhe", "auth-ecdsa"): "ecdhe_ecdsa", ("kx-ecdhe", "auth-null"): "ecdh_anon",
       ("kx-dhe", "auth-rsa"): "dhe_rsa", ("kx-dhe", "auth-dss"): "dhe_dss", ("kx-dhe", "auth-null"): "dh_anon",
       ("kx-psk", "auth-psk"): "psk", ("kx-dhe-psk", "auth-psk"): "dhe_psk", ("kx-rsa-psk", "auth-rsa"): "rsa_psk",
       ("kx-ecdhe-psk", "auth-psk"): "ecdhe_psk", ("kx-srp", "auth-srp"): "srp_anon",
       ("kx-srp", "auth-rsa"): "srp_rsa", ("kx-srp", "auth-dss"): "srp_dss"}


def _openssl_suites() -> list[dict[str, Any]]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    return [d for d in ctx.get_ciphers() if (d["kea"], d["auth"]) in _KX]


def _expected(d: dict[str, Any]) -> tuple[str, str, str]:
    cipher = d["symmetric"].replace("-", "_")
    if "CCM8" in d["name"] or d["name"].endswith("CCM_8_SHA256"):
        cipher += "_8"
    hash_ = "aead" if d["aead"] else {"sha1": "sha"}.get(d["digest"], d["digest"])
    return _KX[(d["kea"], d["auth"])], cipher, hash_


def test_every_suite_openssl_describes_reads_as_its_description() -> None:
    suites = _openssl_suites()
    assert len(suites) > 40  # the oracle covers TLS 1.3 and the TLS 1.2 families
    wrong = {d["name"]: (cipher_suite(d["name"]), _expected(d)) for d in suites
             if cipher_suite(d["name"]) != _expected(d)}
    assert wrong == {}


@pytest.mark.parametrize(("name", "suite"), [
    ("TLS_AES_256_GCM_SHA384", ("any", "aes_256_gcm", "aead")),
    ("TLS_CHACHA20_POLY1305_SHA256", ("any", "chacha20_poly1305", "aead")),
    ("ECDHE-RSA-AES256-GCM-SHA384", ("ecdhe_rsa", "aes_256_gcm", "aead")),
    ("ECDHE-ECDSA-AES128-SHA256", ("ecdhe_ecdsa", "aes_128_cbc", "sha256")),
    ("DHE-RSA-AES256-SHA", ("dhe_rsa", "aes_256_cbc", "sha")),
    ("AES128-SHA", ("rsa", "aes_128_cbc", "sha")),
    ("DES-CBC3-SHA", ("rsa", "3des_ede_cbc", "sha")),
])
def test_rabbitmq_spelling(name: str, suite: tuple[str, str, str]) -> None:
    assert cipher_suite(name) == suite


def test_fields_of_a_connection_with_and_without_tls() -> None:
    assert tls_fields(("TLSv1.3", "TLS_AES_128_GCM_SHA256")) == {
        "ssl": True, "ssl_protocol": "tlsv1.3", "ssl_key_exchange": "any", "ssl_cipher": "aes_128_gcm",
        "ssl_hash": "aead"}
    assert tls_fields(None) == {"ssl": False, "ssl_protocol": None, "ssl_key_exchange": None, "ssl_cipher": None,
                                "ssl_hash": None}
