"""Service layer: the node's effective configuration, `GET /api/environment` (hutch), what `hutchctl
environment` prints (rabbitmqctl's `environment`: the application environment of the node).

Owns: `effective_settings`, the resolved `Config` (defaults < file < environment < flags) as a JSON
object, one key a setting in name order (as rabbitmqctl sorts an application's keys), a TLS section
(`ssl_options`, `management_ssl`, `cluster_ssl`) an object of its options.

Rules:
- Secrets are left out, as RabbitMQ leaves them out: `rabbit:environment/0` drops `default_pass`, and a
  TLS key's password is a function in RabbitMQ 4.x's listener options, which its management API does not
  report (`rabbit_mgmt_format:format_socket_opts` excludes functions). Here a secret is a field declared
  with `repr=False` (`default_pass`, `cluster_secret`, a TLS section's `password`, and `raw`, the
  configuration file's text, which holds them too), so a secret added later is hidden by its declaration.
- Administrators only (the paths, ports and limits of the node are an operator's business; RabbitMQ's
  `rabbitmqctl environment` needs the Erlang cookie).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hutch.config import Config

from .access import Principal, require_admin


def effective_settings(config: Config) -> dict[str, Any]:
    """Every setting of `config` but its secrets (module docstring), by name."""
    return _settings(config)


def _settings(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(dataclasses.fields(obj), key=lambda f: f.name):
        if not f.repr:  # a secret (module docstring)
            continue
        out[f.name] = _value(getattr(obj, f.name))
    return out


def _value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _settings(value)
    if isinstance(value, tuple | list):
        return [_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def environment(config: Config, p: Principal) -> dict[str, Any]:
    require_admin(p)
    return effective_settings(config)
