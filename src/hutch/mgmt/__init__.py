"""Management: the HTTP API (RabbitMQ-compatible), served next to the AMQP listener.

Layout (see docs/management.md):

* ``http`` - the aiohttp application, authentication, the raw handlers (definitions, /metrics,
  /api/openapi.json) and ``start_management``, the node service plug-in (listener + statistics
  collector);
* ``routes`` - the route table of thin handlers; ``calls`` - ``Call``, ``Status``, ``Route``;
* ``users``, ``topology``, ``messages``, ``clients``, ``policies``, ``health``, ``definitions``,
  ``system`` - the service layer: plain functions over the ``Node`` that do the work of each endpoint
  and raise ``ApiError``;
* ``stats`` (the statistics collector: rates and samples), ``access`` (tags and permissions),
  ``listing`` (sort, filter, paginate, columns), ``formats`` (RabbitMQ's JSON shapes), ``openapi``
  (the OpenAPI document, generated from the route table), ``prometheus`` (/metrics) and ``errors``;
* ``intake`` (browser rules, bounded bodies), ``jsontext`` (JSON with a nesting limit) and ``listener``
  (the connection cap, timeouts and quiet client errors of the socket): docs/security.md.

Dependency rule: the service layer never imports aiohttp; ``http``, ``ui``, ``intake`` and ``listener``
are the only modules that do.
"""

from .http import serve_management_peers, start_management

__all__ = ["serve_management_peers", "start_management"]
