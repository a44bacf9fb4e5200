"""Ports of the hutch-server processes the benchmarks start (issue 22).

A tree with `hutch/portfile.py` takes port 0 on every listener and writes the ports it bound to
`<data dir>/ports.json`: the benchmark asks for 0 and reads them (`hutch.portfile.wait_for_ports`).
An older tree (the benchmarks also measure past commits with `--hutch-src`/`--src`) takes no port 0, so
for it alone a number is picked beforehand (`legacy_port`), the race issue 22 removed elsewhere: a port
picked by binding port 0 and closing the socket lies in the ephemeral range clients' source ports come
from, and can be taken before the node binds it.
"""

from __future__ import annotations

import socket
from pathlib import Path


def takes_port_zero(src: str | Path) -> bool:
    """Whether the server of the source tree `src` (the directory holding `hutch/`) reports its ports."""
    return (Path(src) / "hutch" / "portfile.py").exists()


def legacy_port() -> int:
    """A port number for a tree older than issue 22 (see the module docstring)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_arg(src: str | Path) -> str:
    """What to pass as a listener's port to the server of `src`: "0", or a number for an older tree."""
    return "0" if takes_port_zero(src) else str(legacy_port())
