"""A TLS session's protocol and cipher suite under the names RabbitMQ shows them.

Owns: `tls_fields`, the `ssl`, `ssl_protocol`, `ssl_key_exchange`, `ssl_cipher` and `ssl_hash` of a
connection (the management API's connection object and `rabbitmqctl list_connections`' columns), and
`cipher_suite`, which splits an OpenSSL cipher name into Erlang's `selected_cipher_suite` parts. Pure:
strings in, strings out.

Rules (what RabbitMQ's reader shows: Erlang's `ssl:connection_information/1`):
- the protocol is lower case, `tlsv1.3`, `tlsv1.2`;
- a TLS 1.3 suite (OpenSSL's `TLS_AES_256_GCM_SHA384`) has key exchange `any`, cipher
  `aes_256_gcm`, hash `aead`;
- a TLS 1.2 suite (OpenSSL's `ECDHE-RSA-AES256-GCM-SHA384`) has key exchange `ecdhe_rsa`, cipher
  `aes_256_gcm`, hash `aead` (an AEAD cipher has no separate MAC) or, for a CBC cipher, the MAC's hash
  (`sha` for SHA-1, `sha256`, `sha384`);
- a name this module does not know keeps what it can read: the unknown part is OpenSSL's, lower case.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cipher_suite", "tls_fields"]

NO_TLS: dict[str, Any] = {"ssl": False, "ssl_protocol": None, "ssl_key_exchange": None, "ssl_cipher": None,
                          "ssl_hash": None}

# OpenSSL's leading name parts of a TLS 1.2 suite -> Erlang's key exchange; longest first, no prefix: rsa
_KEY_EXCHANGES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("ECDHE", "RSA"), "ecdhe_rsa"), (("ECDHE", "ECDSA"), "ecdhe_ecdsa"), (("ECDHE", "PSK"), "ecdhe_psk"),
    (("DHE", "RSA"), "dhe_rsa"), (("DHE", "DSS"), "dhe_dss"), (("DHE", "PSK"), "dhe_psk"),
    (("EDH", "RSA"), "dhe_rsa"), (("EDH", "DSS"), "dhe_dss"), (("RSA", "PSK"), "rsa_psk"),
    (("SRP", "RSA"), "srp_rsa"), (("SRP", "DSS"), "srp_dss"),
    (("ECDHE",), "ecdhe_rsa"),  # OpenSSL's ECDHE-ARIA…: RSA-signed
    (("ADH",), "dh_anon"), (("AECDH",), "ecdh_anon"), (("PSK",), "psk"), (("SRP",), "srp_anon"),
)
_MACS = {"SHA": "sha", "SHA256": "sha256", "SHA384": "sha384", "MD5": "md5"}
_AEAD_MODES = ("GCM", "CCM", "CCM8", "POLY1305")
# ciphers whose OpenSSL name does not follow <ALGO><BITS>[-<MODE>]
_CIPHERS = {"DES-CBC3": "3des_ede_cbc", "DES-CBC": "des_cbc", "RC4": "rc4_128", "CHACHA20-POLY1305":
            "chacha20_poly1305", "NULL": "null"}


def _tls13(name: str) -> tuple[str, str, str]:
    body = name[len("TLS_"):].rsplit("_", 1)[0]  # AES_256_GCM (the last part is the PRF's hash)
    return "any", body.lower(), "aead"


def _cipher(parts: list[str]) -> str:
    joined = "-".join(parts)
    if joined in _CIPHERS:
        return _CIPHERS[joined]
    if len(parts) > 1 and parts[1].isdigit():  # the PSK and SRP suites spell AES-128 for AES128
        parts = [parts[0] + parts[1], *parts[2:]]
    head, modes = parts[0], parts[1:]
    algo = head.rstrip("0123456789")
    bits = head[len(algo):]
    if modes and modes[0] in ("CBC",):  # the PSK suites spell the mode CBC suites leave out
        modes = modes[1:]
    mode = modes[0] if modes else "CBC"
    mode = {"CCM8": "ccm_8"}.get(mode, mode.lower())
    return "_".join(p for p in (algo.lower(), bits, mode) if p)


def cipher_suite(name: str) -> tuple[str, str, str]:
    """(key exchange, cipher, hash) of an OpenSSL cipher name, in Erlang's spelling."""
    if name.startswith("TLS_"):
        return _tls13(name)
    parts = name.split("-")
    key_exchange = "rsa"
    for prefix, kx in _KEY_EXCHANGES:
        if tuple(parts[:len(prefix)]) == prefix and len(parts) > len(prefix):
            key_exchange, parts = kx, parts[len(prefix):]
            break
    mac = _MACS.get(parts[-1]) if len(parts) > 1 else None
    if mac is not None:
        parts = parts[:-1]
    aead = any(p in _AEAD_MODES for p in parts)
    return key_exchange, _cipher(parts), "aead" if aead else (mac or "null")


def tls_fields(tls: tuple[str, str] | None) -> dict[str, Any]:
    """A connection's `ssl…` fields from its TLS (version, OpenSSL cipher name), None without TLS."""
    if tls is None:
        return NO_TLS
    version, cipher_name = tls
    key_exchange, cipher, hash_ = cipher_suite(cipher_name) if cipher_name else (None, None, None)
    return {"ssl": True, "ssl_protocol": version.lower(), "ssl_key_exchange": key_exchange, "ssl_cipher": cipher,
            "ssl_hash": hash_}
