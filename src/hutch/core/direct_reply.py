"""Direct Reply-To addresses (`amq.rabbitmq.reply-to.<token>`) that say where their requester is.

Owns: the token's form. As RabbitMQ encodes the requester's node (and process) in the address, a token
here is `<random>.<node>`: 18 random bytes (base64url) and the requester's node name (base64url, no
padding), so a reply published on any node, or any worker of a node, can be sent to the node whose
channel waits for it. Clients treat the address as opaque. Pure.
"""

from __future__ import annotations

import base64
import binascii
import secrets


def new_token(node: str) -> str:
    """A fresh token of a requester on `node`."""
    return f"{secrets.token_urlsafe(18)}.{base64.urlsafe_b64encode(node.encode()).decode().rstrip('=')}"


def token_node(token: str) -> str | None:
    """The node a token names, or None for a token that names none (or not validly)."""
    _random, dot, encoded = token.rpartition(".")
    if not dot or not encoded or len(encoded) > 1024:
        return None
    try:
        node = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return node or None
