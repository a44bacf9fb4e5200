"""TLS for the node's listeners: SSL contexts built from the Config, the AMQP-over-TLS listener, and
certificate reloading without a restart.

Owns: `NodeTls` (one per node, `node.tls`: builds each section's context on first use, keeps the file
stamps, reloads on SIGHUP and on a periodic check of the files' mtimes). The composition root
(runtime/app.py) starts the `listeners.ssl.default` listener with `server_context("ssl_options")`, gives
the cluster transport `cluster_contexts()`, and starts and stops the reloading; the management layer
takes `server_context("management_ssl")`. docs/security.md describes what each listener enforces.

Rules:
- Sections are the Config's `ssl_options` (AMQP), `management_ssl` (HTTPS) and `cluster_ssl` (between
  nodes). TLS 1.2 is the lowest version ever offered; `versions` narrows it, `ciphers` sets the TLS 1.2
  suites (OpenSSL names; TLS 1.3 suites are OpenSSL's).
- `verify_peer` asks for a client certificate and verifies it against `cacertfile`; with
  `fail_if_no_peer_cert` a client without one is refused. The cluster always requires and verifies
  a certificate on both ends (no host name check: nodes are named by the cluster, and the secret
  handshake still runs inside TLS).
- Reloading builds new contexts from the files, each read once, and swaps them in whole: a listener
  asks `current(section)` at every accept (the cluster transport is handed the new pair through
  `on_reload`), so each new connection uses the new certificate; open connections keep theirs. A bad
  file, a key that does not match, or a file that changes while it is read fails the build: logged at
  ERROR, and the old contexts stay as they were (never half-loaded: issue 21, finding 7). A new
  `cacertfile` replaces the old CAs (one removed from the file is no longer trusted).
- SIGHUP reloads the certificates; on a node without TLS it is logged and ignored (a long-running
  server must not die of a stray SIGHUP).
- A failed TLS handshake (a plain AMQP client on the TLS port, a certificate from another CA) is an
  OSError inside the event loop, logged at DEBUG only: the client sees its socket closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from hutch.config import Config, TlsOptions

log = logging.getLogger("hutch.tls")

SECTIONS = {"ssl_options": "ssl_options.", "management_ssl": "management.ssl.", "cluster_ssl": "cluster.ssl."}
_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """A TLS file cannot be loaded; the text names the key and the file."""


def _load(ctx: ssl.SSLContext, opts: TlsOptions, prefix: str) -> None:
    """Load the section's certificate chain, key and CA file into `ctx`."""
    if opts.certfile:
        try:
            ctx.load_cert_chain(opts.certfile, opts.keyfile or None, opts.password)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load {prefix}certfile {opts.certfile!r} with {prefix}keyfile "
                                 f"{opts.keyfile!r}: {_reason(exc)}") from None
    if opts.cacertfile:
        try:
            ctx.load_verify_locations(cafile=opts.cacertfile)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load {prefix}cacertfile {opts.cacertfile!r}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def build_context(opts: TlsOptions, prefix: str, *, server: bool = True, mutual: bool = False) -> ssl.SSLContext:
    """A context for one section. `mutual` (the cluster): a certificate is required and verified on both
    ends, whatever `verify` says. Raises TlsConfigError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if opts.versions:
        chosen = sorted(_VERSIONS[v] for v in opts.versions)
        ctx.minimum_version, ctx.maximum_version = chosen[0], chosen[-1]
    if opts.ciphers:
        try:
            ctx.set_ciphers(":".join(opts.ciphers))
        except ssl.SSLError:
            raise TlsConfigError(f"{prefix}ciphers: no cipher suite of {', '.join(opts.ciphers)} is "
                                 "known to OpenSSL") from None
    if mutual:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif server and opts.verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if opts.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    elif server:
        ctx.verify_mode = ssl.CERT_NONE
    _load(ctx, opts, prefix)
    return ctx


def _stamp(path: str | None) -> tuple[float, int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime, st.st_size)


@dataclass
class _Section:
    """One section's live contexts and the stamps of the files they were loaded from."""

    name: str
    opts: TlsOptions
    contexts: list[ssl.SSLContext] = field(default_factory=list)
    stamps: tuple[tuple[float, int] | None, ...] = ()

    def current_stamps(self) -> tuple[tuple[float, int] | None, ...]:
        return tuple(_stamp(p) for p in (self.opts.certfile, self.opts.keyfile, self.opts.cacertfile))


class NodeTls:
    """The node's TLS contexts, built on first use, and their reloading (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._sections: dict[str, _Section] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._sighup = False
        self._on_reload: list[Callable[[], None]] = []
        self.reloads = 0  # successful reloads (tests and logs)

    def options(self, section: str) -> TlsOptions:
        opts = getattr(self.config, section)
        assert isinstance(opts, TlsOptions), section
        return opts

    def server_context(self, section: str) -> ssl.SSLContext | None:
        """The listener context of `section`, or None when the section has no certificate."""
        opts = self.options(section)
        if not opts.certfile:
            return None
        entry = self._sections.get(section)
        if entry is None:
            entry = self._sections[section] = _Section(section, opts)
            entry.stamps = entry.current_stamps()
        if not entry.contexts:
            entry.contexts.append(build_context(opts, SECTIONS[section], mutual=section == "cluster_ssl"))
        return entry.contexts[0]

    def current(self, section: str) -> ssl.SSLContext:
        """The live listener context of a section already in use (`server_context` built it)."""
        return self._sections[section].contexts[0]

    def on_reload(self, callback: Callable[[], None]) -> None:
        """Call `callback` after every successful reload (who holds contexts outside `current`)."""
        self._on_reload.append(callback)

    def cluster_contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
        """(acceptor, dialler) contexts for the inter-node transport, or None without `cluster.ssl.*`."""
        server = self.server_context("cluster_ssl")
        if server is None:
            return None
        entry = self._sections["cluster_ssl"]
        if len(entry.contexts) < 2:
            entry.contexts.append(build_context(entry.opts, SECTIONS["cluster_ssl"], server=False, mutual=True))
        return server, entry.contexts[1]

    def sections(self) -> list[tuple[str, TlsOptions]]:
        """The sections in use (their contexts were built)."""
        return [(s.name, s.opts) for s in self._sections.values() if s.contexts]

    # -- reloading -------------------------------------------------------------------------------
    def reload(self, force: bool = False) -> int:
        """Reload the sections whose files changed (all of them with `force`); returns how many were
        reloaded. A section whose new files do not load keeps its old certificate (logged at ERROR)."""
        done = 0
        for entry in self._sections.values():
            stamps = entry.current_stamps()
            if not entry.contexts or (stamps == entry.stamps and not force):
                continue
            prefix = SECTIONS[entry.name]
            mutual = entry.name == "cluster_ssl"
            try:  # whole new contexts: the live ones are never touched, so never half-loaded
                fresh = [build_context(entry.opts, prefix, server=i == 0, mutual=mutual)
                         for i in range(len(entry.contexts))]
            except TlsConfigError as exc:
                log.error("TLS certificate reload failed, the old certificate stays in use: %s", exc)
                entry.stamps = stamps  # not again until the files change again
                continue
            entry.contexts = fresh
            entry.stamps = stamps
            done += 1
            log.info("TLS certificate reloaded for %s* (%s)", prefix, entry.opts.certfile)
        self.reloads += done
        if done:
            for callback in self._on_reload:
                callback()
        return done

    def _sighup_received(self) -> None:
        if not self._sections:
            log.info("SIGHUP received: no TLS certificates to reload; the node keeps running")
            return
        log.info("SIGHUP received: reloading TLS certificates")
        self.reload(True)

    def start(self) -> None:
        """SIGHUP (reload now; logged and ignored without TLS) and the periodic check
        (`ssl_cert_reload_interval`)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._sighup_received)
            self._sighup = True
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (in-process tests)
            log.debug("SIGHUP not available for certificate reloads")
        if not any(self.options(section).certfile for section in SECTIONS):
            return
        interval_ms = self.config.ssl_cert_reload_interval_ms
        if interval_ms > 0:
            self._timer = loop.call_later(interval_ms / 1000, self._tick)

    def _tick(self) -> None:
        try:
            self.reload()
        except Exception:  # a bug here must not stop the checks
            log.exception("TLS certificate check failed")
        self._timer = asyncio.get_running_loop().call_later(self.config.ssl_cert_reload_interval_ms / 1000,
                                                            self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False


__all__ = ["NodeTls", "TlsConfigError", "build_context"]
